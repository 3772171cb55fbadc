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
