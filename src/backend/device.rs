//! Opening the ORK device from the configuration: which NPU kernel interface, which SoC, the
//! core budget and pinning, the residency budget, the GPU decode engine, the `.orkpack` cache.

use super::Device;
use crate::config::{Config, DecodeSelect, NpuSelect};
use crate::npu::{self, Npu, NpuConfig, NpuKind};

impl Device {
    /// Opens the device `cfg` describes. `host`: whether the host process provides the ggml
    /// functions the plugin calls (Err: why not). Err: why there is no ORK device (one info line
    /// for the caller to log; everything then runs on the CPU).
    pub fn open(cfg: &'static Config, host: Result<(), &str>) -> Result<Device, String> {
        if cfg.off {
            return Err("ORK_OFF=1: no ORK device; everything runs on the CPU".into());
        }
        host.map_err(|e| format!("ggml symbols not found in the host process ({e})"))?;
        let kind = match cfg.npu {
            NpuSelect::Auto => NpuKind::Auto,
            NpuSelect::Sim => NpuKind::Sim,
            NpuSelect::Rknpu => NpuKind::Rknpu,
            NpuSelect::Rocket => NpuKind::Rocket,
        };
        let soc = match &cfg.soc {
            None => None,
            Some(s) => Some(npu::soc::SocId::parse(s).ok_or_else(|| format!("ORK_SOC={s:?} is not rk3588 or rk3576"))?),
        };
        let ncfg = NpuConfig {
            kind,
            soc,
            card: cfg.npu_card.as_ref().map(Into::into),
            max_cores: cfg.max_cores,
            pin_cpus: npu::hostcpu::big_cores_for_pinning(cfg.no_affinity),
            wcache_budget_bytes: cfg.wcache_budget_mb.map(|mb| mb << 20),
            timeout_ms: cfg.mm_timeout_ms,
            domain_cap_bytes: cfg.domain_cap_mb.map(|mb| mb << 20),
            sim_fault: cfg.sim_fault.clone(),
            sim_board_timing: cfg.sim_board_timing,
            // M = 1 reaches the NPU where decode is sent there (ORK_DECODE=npu, or the cost
            // policy's auto choice); otherwise nothing below ORK_MINM does.
            smallest_m: match (cfg.decode, cfg.route) {
                (crate::config::DecodeSelect::Npu, _) | (crate::config::DecodeSelect::Auto, crate::config::RoutePolicy::Cost) => 1,
                _ => cfg.min_m,
            },
        };
        let npu = Npu::open(&ncfg).map_err(|e| match cfg.npu {
            NpuSelect::Auto => format!("no ORK device: {e} (set ORK_NPU=sim for the simulator)"),
            _ => format!("no ORK device: {e}"),
        })?;
        let vk = if cfg.decode == DecodeSelect::Gpu {
            match crate::vk::VkEngine::open(cfg.vk_device.as_deref()) {
                Ok(Some(e)) => {
                    log::info!("GPU decode on {}", e.device_name());
                    Some(e)
                }
                Ok(None) => {
                    log::warn!("ORK_DECODE=gpu but no suitable Vulkan device; decode stays on the CPU");
                    None
                }
                Err(e) => {
                    log::warn!("ORK_DECODE=gpu but Vulkan failed ({e}); decode stays on the CPU");
                    None
                }
            }
        } else {
            None
        };
        Ok(Device { npu, vk, cfg, stats: Default::default(), cache: crate::cache::PackCache::from_config(cfg), calib: crate::cache::calib::Store::from_config(cfg) })
    }

    /// Free and total system RAM in bytes (the NPU shares it; resident weights come out of it).
    pub fn system_memory() -> (usize, usize) {
        let m = crate::os::meminfo::read();
        (m.available_bytes.unwrap_or(0) as usize, m.total_bytes.unwrap_or(0) as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn off_and_a_missing_host_give_no_device() {
        let (off, _) = Config::from_lookup(|k| (k == "ORK_OFF").then(|| "1".into()));
        let e = Device::open(Box::leak(Box::new(off)), Ok(())).err().expect("ORK_OFF=1: no device");
        assert!(e.starts_with("ORK_OFF=1"), "{e}");
        let (sim, _) = Config::from_lookup(|k| (k == "ORK_NPU").then(|| "sim".into()));
        let e = Device::open(Box::leak(Box::new(sim)), Err("ggml_nbytes: undefined symbol")).err().expect("no host: no device");
        assert_eq!(e, "ggml symbols not found in the host process (ggml_nbytes: undefined symbol)");
    }
}
