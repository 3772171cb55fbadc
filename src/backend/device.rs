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
            pin_cpus: crate::os::hostcpu::big_cores_for_pinning(cfg.no_affinity),
            wcache_budget_bytes: cfg.wcache_budget_mb.map(|mb| mb << 20),
            timeout_ms: cfg.mm_timeout_ms,
            domain_cap_bytes: cfg.domain_cap_mb.map(|mb| mb << 20),
            sim_fault: cfg.sim_fault.clone(),
            sim_board_timing: cfg.sim_board_timing,
            smallest_m: smallest_npu_m(cfg),
        };
        let npu = Npu::open(&ncfg).map_err(|e| match cfg.npu {
            NpuSelect::Auto => format!("no ORK device: {e} (set ORK_NPU=sim for the simulator)"),
            _ => format!("no ORK device: {e}"),
        })?;
        let vk = match (cfg.decode == DecodeSelect::Gpu).then(|| crate::vk::VkEngine::open(cfg.vk_device.as_deref())) {
            None => None,
            Some(Ok(Some(e))) => {
                log::info!("GPU decode on {}", e.device_name());
                Some(e)
            }
            Some(Ok(None)) => {
                log::warn!("ORK_DECODE=gpu but no suitable Vulkan device; decode stays on the CPU");
                None
            }
            Some(Err(e)) => {
                log::warn!("ORK_DECODE=gpu but Vulkan failed ({e}); decode stays on the CPU");
                None
            }
        };
        let dev = Device { npu, vk, cfg, stats: Default::default(), placement: Default::default(), stream: Default::default(), cache: crate::cache::PackCache::from_config(cfg), calib: crate::cache::calib::Store::from_config(cfg) };
        dev.stream.enable(cfg.stream);
        Ok(dev)
    }

    /// Free and total system RAM in bytes (the NPU shares it; resident weights come out of it).
    pub fn system_memory() -> (usize, usize) {
        let m = crate::os::meminfo::read();
        (m.available_bytes.unwrap_or(0) as usize, m.total_bytes.unwrap_or(0) as usize)
    }
}

/// The smallest M a MUL_MAT can have when it runs on the NPU (`NpuConfig::smallest_m`, which
/// decides the tile sets each weight keeps): 1 where decode can go there (`ORK_DECODE=npu`, or
/// `ORK_ROUTE=cost` with decode `auto`, whose cost model may pick the NPU), else `ORK_MINM`.
pub fn smallest_npu_m(cfg: &Config) -> usize {
    match (cfg.decode, cfg.route) {
        (DecodeSelect::Npu, _) | (DecodeSelect::Auto, crate::config::RoutePolicy::Cost) => 1,
        _ => cfg.min_m,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_smallest_npu_m_follows_the_routing() {
        let m = |vars: &[(&str, &str)]| {
            let (c, bad) = Config::from_lookup(|k| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string()));
            assert!(bad.is_empty(), "{bad:?}");
            smallest_npu_m(&c)
        };
        assert_eq!(m(&[]), 32, "default: ORK_MINM, decode on the CPU");
        assert_eq!(m(&[("ORK_MINM", "8")]), 8);
        assert_eq!(m(&[("ORK_MINM", "1")]), 1);
        assert_eq!(m(&[("ORK_DECODE", "npu")]), 1);
        assert_eq!(m(&[("ORK_DECODE", "gpu")]), 32);
        assert_eq!(m(&[("ORK_ROUTE", "cost")]), 1, "the cost model may put decode on the NPU");
        assert_eq!(m(&[("ORK_ROUTE", "cost"), ("ORK_DECODE", "cpu")]), 32);
    }

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
