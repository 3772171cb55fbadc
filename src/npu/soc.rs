//! SoC descriptions: everything per-part that the NPU core needs, in one table.
//!
//! Sources (shared reference `rknpu-facts.md`): cores and kernel config §8 (vendor `rknpu_drv.c`
//! tables, S3); CBUF 12 banks × 32 KiB §4 (Mesa `rkt_ml.h` S7, mtx512 S9); the 10752 full-K
//! single-submit ceiling §4 (ork probe, reason uncertain); N per program ≤ 8192 §4 (ork RE);
//! int8 K-slice 1024 §3.2; 4 GiB IOVA window per domain §4 (S5).
//! RK3576 register-level facts are inherited from RK3588 (no public source; marked unvalidated).

/// Which SoC.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SocId {
    Rk3588,
    Rk3576,
}

impl SocId {
    pub fn name(self) -> &'static str {
        match self {
            SocId::Rk3588 => "rk3588",
            SocId::Rk3576 => "rk3576",
        }
    }

    /// Parses "rk3588" / "rk3576" (case-insensitive), as in `ORK_SOC`.
    pub fn parse(s: &str) -> Option<SocId> {
        match s.trim().to_ascii_lowercase().as_str() {
            "rk3588" => Some(SocId::Rk3588),
            "rk3576" => Some(SocId::Rk3576),
            _ => None,
        }
    }
}

/// Per-SoC constants of the NPU. Callers of the NPU core never read these to compute slicing;
/// the planner does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SocDesc {
    pub id: SocId,
    /// NPU cores (RK3588: 3, RK3576: 2).
    pub cores: u32,
    /// CBUF banks per core and bytes per bank (12 × 32 KiB = 384 KiB).
    pub cbuf_banks: u32,
    pub cbuf_bank_bytes: u32,
    /// Largest K a single full-K program may contract (ork probe: over it the submit wedges).
    pub fullk_ceiling: u32,
    /// Largest N (output channels) one program writes (N = 16384 was silently wrong).
    pub n_max_per_program: u32,
    /// int8 K-slice for the K-split path.
    pub k_slice: u32,
    /// K and N alignment of the int8 path (elements).
    pub k_align: u32,
    pub n_align: u32,
    /// IOVA window per IOMMU domain in bytes.
    pub iova_window_bytes: u64,
    /// Proactive per-domain fill cap (seed 002: advance before the EFAULT at ~4.16 GiB).
    pub domain_cap_bytes: u64,
    /// PC TASK_NUMBER field width (12 on RK3588, 16 on RK3576) and max tasks per sub-submit.
    pub pc_task_number_bits: u32,
    pub max_submit_tasks: u32,
    /// PC data amount scale (`pc_data_amount_scale`, 2 on both).
    pub pc_data_amount_scale: u32,
    /// Whether the register-level facts were validated on hardware.
    pub validated: bool,
    /// What a submit costs the hardware: the timed simulator's device model
    /// (`ORK_SIM_TIMING=board`) and the cost model's NPU terms.
    pub timing: NpuTiming,
}

/// The NPU's hardware time per submit, modelled: a job on one core takes
/// `max(submit_floor, Σ over its programs of MACs / core rate + bytes / per-core feed)`.
/// Figures (RK3588): per-submit floor 167 µs (rknpu-facts §4 "submit floor"; seed 001 measures a
/// 2048² M = 1 decode matmul at 176 µs on 3 cores, the floor, not floor + feed); int8 GEMM
/// 1.4 TOPS on 3 cores (seed 001 cross-check: 512×2048×2048 on 3 cores in 4439 µs = 0.97 TOPS
/// including the host's copies); weight feed 28.5 GB/s over the shared DDR bus (seed 000),
/// split evenly between the cores that run at once. RK3576: the same per core (not validated).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NpuTiming {
    pub submit_floor_ns: u64,
    /// int8 ops per second of one core (2 ops per MAC).
    pub core_ops: u64,
    /// Bytes per second the cores read and write together.
    pub feed_bps: u64,
}

impl NpuTiming {
    /// Modelled hardware time of one program of `mc` rows, K = `k`, N = `n` on one of `cores`
    /// cores running at once: its MACs at the core's rate plus its A, B and C bytes at its share
    /// of the feed.
    pub fn program_ns(&self, mc: u64, k: u64, n: u64, cores: u32) -> f64 {
        let ops = 2.0 * (mc * k * n) as f64 / self.core_ops as f64;
        let bytes = (mc * k + k * n + 4 * mc * n) as f64 / (self.feed_bps as f64 / cores.max(1) as f64);
        (ops + bytes) * 1e9
    }

    /// The clock the rates are stated at: 1 GHz, the vendor kernels' top devfreq step.
    pub const NOMINAL_CLOCK_HZ: u64 = 1_000_000_000;

    /// The same NPU at another clock: the cores' int8 rate scales with it (the rates are stated
    /// at [`NOMINAL_CLOCK_HZ`](Self::NOMINAL_CLOCK_HZ)); the memory feed and the per-submit
    /// floor stay.
    pub fn at_clock(self, hz: u64) -> NpuTiming {
        let core_ops = u128::from(self.core_ops) * u128::from(hz.max(1)) / u128::from(Self::NOMINAL_CLOCK_HZ);
        NpuTiming { core_ops: core_ops as u64, ..self }
    }

    /// A submit's modelled hardware time from its programs' total: never under the floor.
    pub fn submit_ns(&self, programs_ns: f64) -> u64 {
        (programs_ns.ceil() as u64).max(self.submit_floor_ns)
    }
}

const GIB: u64 = 1 << 30;

impl SocDesc {
    pub fn get(id: SocId) -> SocDesc {
        let rk3588 = SocDesc {
            id,
            cores: 3,
            cbuf_banks: 12,
            cbuf_bank_bytes: 32 * 1024,
            fullk_ceiling: 10752,
            n_max_per_program: 8192,
            k_slice: 1024,
            k_align: 32,
            n_align: 32,
            iova_window_bytes: 4 * GIB,
            domain_cap_bytes: 3 * GIB,
            pc_task_number_bits: 12,
            max_submit_tasks: (1 << 12) - 1,
            pc_data_amount_scale: 2,
            validated: true,
            timing: NpuTiming { submit_floor_ns: 167_000, core_ops: 1_400_000_000_000 / 3, feed_bps: 28_500_000_000 },
        };
        match id {
            SocId::Rk3588 => rk3588,
            SocId::Rk3576 => SocDesc {
                cores: 2,
                pc_task_number_bits: 16,
                max_submit_tasks: (1 << 16) - 1,
                validated: false,
                ..rk3588
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slower_clock_slows_the_macs_not_the_feed() {
        let t = SocDesc::get(SocId::Rk3588).timing;
        assert_eq!(t.at_clock(NpuTiming::NOMINAL_CLOCK_HZ), t, "the rates are stated at 1 GHz");
        let slow = t.at_clock(200_000_000);
        assert_eq!(slow.core_ops, t.core_ops / 5);
        assert_eq!((slow.feed_bps, slow.submit_floor_ns), (t.feed_bps, t.submit_floor_ns));
        // A compute-bound program takes close to 5x as long; a feed-bound one (M = 1) far less.
        let (mac, feed) = (t.program_ns(512, 4096, 4096, 3), t.program_ns(1, 4096, 4096, 3));
        assert!(slow.program_ns(512, 4096, 4096, 3) > 4.0 * mac);
        assert!(slow.program_ns(1, 4096, 4096, 3) < 1.25 * feed);
    }
}
