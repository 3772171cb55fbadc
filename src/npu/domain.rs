//! IOMMU domains: where resident weights go.
//!
//! The rk_iommu window is 32-bit (~4 GiB) per IOMMU domain (rknpu-facts §4, S5), so a model larger
//! than one window resides across several domains and every submit runs in its weight's domain
//! (seed 002). This module owns the placement bookkeeping:
//!
//! * weights fill domain 0, then 1, …; the cursor advances **before** a domain would exceed
//!   `SocDesc::domain_cap_bytes` (3.0 GiB, below the ~4.16 GiB EFAULT point: filling a domain to
//!   EFAULT soft-resets the NPU and corrupts the IOMMU, seed 002). Accounting is in bytes, so
//!   domains end up byte-balanced at the cap; only as many domains as needed are opened, at most
//!   [`MAX_DOMAINS`] (16, the stock driver's limit; conflict 4);
//! * an EFAULT from the kernel interface anyway is a safety net: the domain is closed for
//!   weights and the cursor moves on (done by the caller via [`DomainSet::fault`]);
//! * a residency budget caps the total (RAM − 1 GiB by default, `ORK_WCACHE_BUDGET_MB`
//!   overrides, seed 002; the backend lowers the default by its own host buffers through
//!   `Npu::set_residency_budget`); a weight that does not fit is refused so the backend keeps it
//!   on the CPU.
//!
//! * the budget counts every copy of a weight the kernel interface keeps
//!   (`KernelInterface::weight_copies`, 1 on every interface today): [`DomainSet::resident_bytes`]
//!   is the domain bytes times the copies, while a domain's own fill (`used`) counts one copy;
//! * where every core has its own address space (`rocket`, `KernelInterface::per_core_spaces`) a
//!   domain is one window per core, each holding its core's parts of the domain's weights: the
//!   `Npu` sets the cap to the per-window cap times the cores.
//!
//! Scratch buffers (regcmd, tasks, activations, outputs) live in each domain outside the cap's
//! accounting: the cap leaves about 1 GiB of the window for them.

use crate::npu::kif::{DomainId, MAX_DOMAINS};

/// One GiB, the headroom the default residency budget leaves to the rest of the process (seed 002).
pub const BUDGET_HEADROOM_BYTES: u64 = 1 << 30;

/// Placement state of all domains.
#[derive(Debug)]
pub struct DomainSet {
    cap_bytes: u64,
    budget_bytes: u64,
    max_domains: usize,
    /// Weight bytes per opened domain.
    used: Vec<u64>,
    /// Domains closed for weights after an EFAULT.
    closed: Vec<bool>,
    cursor: usize,
    /// Weight bytes held in memory, every copy counted (what the budget bounds).
    resident: u64,
    /// Copies of each weight in memory (`KernelInterface::weight_copies`), ≥ 1.
    copies: u64,
}

/// Why a placement failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlaceError {
    /// The residency budget would be exceeded.
    Budget { resident: u64, budget: u64 },
    /// All domains are full.
    Domains { max: usize },
}

impl DomainSet {
    pub fn new(cap_bytes: u64, budget_bytes: u64, max_domains: u32) -> DomainSet {
        let max_domains = (max_domains.min(MAX_DOMAINS) as usize).max(1);
        DomainSet { cap_bytes, budget_bytes, max_domains, used: vec![0], closed: vec![false], cursor: 0, resident: 0, copies: 1 }
    }

    /// Sets the copies each weight is held in (`KernelInterface::weight_copies`); call before
    /// the first reservation.
    pub fn set_copies(&mut self, copies: u32) {
        self.copies = u64::from(copies.max(1));
    }

    /// Copies each weight is held in.
    pub fn copies(&self) -> u32 {
        self.copies as u32
    }

    /// Reserves `bytes` (one copy) for a weight and returns its domain; the budget is charged
    /// `bytes` times the copies.
    pub fn reserve(&mut self, bytes: u64) -> Result<DomainId, PlaceError> {
        let held = bytes * self.copies;
        if self.resident + held > self.budget_bytes {
            return Err(PlaceError::Budget { resident: self.resident, budget: self.budget_bytes });
        }
        loop {
            let d = self.cursor;
            // Advance before the cap; an empty domain takes any single weight.
            if !self.closed[d] && (self.used[d] == 0 || self.used[d] + bytes <= self.cap_bytes) {
                self.used[d] += bytes;
                self.resident += held;
                return Ok(DomainId(d as u32));
            }
            if d + 1 >= self.max_domains {
                return Err(PlaceError::Domains { max: self.max_domains });
            }
            self.cursor += 1;
            if self.used.len() <= self.cursor {
                self.used.push(0);
                self.closed.push(false);
                log::info!("IOMMU domain {} opened for weights ({} MiB in domain {d})", self.cursor, self.used[d] >> 20);
            }
        }
    }

    /// Reserves `bytes` of IOVA room for a buffer that is not a resident weight (a stream ring
    /// slot, `npu::stream`): charged to a domain's window like a weight, not to the budget.
    pub fn reserve_unbudgeted(&mut self, bytes: u64) -> Result<DomainId, PlaceError> {
        let (resident, budget) = (self.resident, self.budget_bytes);
        self.budget_bytes = u64::MAX;
        // `reserve` charges `resident`; undo that part.
        let r = self.reserve(bytes);
        self.budget_bytes = budget;
        self.resident = resident;
        r
    }

    /// Undoes [`reserve_unbudgeted`](Self::reserve_unbudgeted).
    pub fn release_unbudgeted(&mut self, d: DomainId, bytes: u64) {
        let i = d.0 as usize;
        self.used[i] = self.used[i].saturating_sub(bytes);
    }

    /// The residency budget in bytes.
    pub fn budget_bytes(&self) -> u64 {
        self.budget_bytes
    }

    /// Sets the residency budget. Weights already resident stay (a lower budget only refuses
    /// later reservations).
    pub fn set_budget(&mut self, bytes: u64) {
        self.budget_bytes = bytes;
    }

    /// Undoes a reservation (the allocation failed or the weight was freed).
    pub fn release(&mut self, d: DomainId, bytes: u64) {
        let i = d.0 as usize;
        self.used[i] = self.used[i].saturating_sub(bytes);
        self.resident = self.resident.saturating_sub(bytes * self.copies);
    }

    /// The kernel interface returned EFAULT in `d` for a reservation of `bytes`: release it and
    /// close `d` for further weights. Returns false (and keeps `d` open) when `d` held no weight:
    /// then the weight itself does not fit a domain, and closing domains would only burn them.
    pub fn fault(&mut self, d: DomainId, bytes: u64) -> bool {
        self.release(d, bytes);
        let i = d.0 as usize;
        if self.used[i] == 0 {
            log::warn!("EFAULT in empty IOMMU domain {i} for a {} MiB weight: it does not fit a domain", bytes >> 20);
            return false;
        }
        self.closed[i] = true;
        log::warn!("EFAULT in IOMMU domain {i} after {} MiB; advancing", self.used[i] >> 20);
        true
    }

    /// Weight bytes per opened domain.
    pub fn used(&self) -> &[u64] {
        &self.used
    }

    /// Weight bytes held, every copy counted (what the budget bounds).
    pub fn resident_bytes(&self) -> u64 {
        self.resident
    }
}

/// The default residency budget: RAM − 1 GiB (MemTotal of /proc/meminfo), else unlimited.
/// `ORK_WCACHE_BUDGET_MB` replaces it where the NPU is opened (`NpuConfig::wcache_budget_bytes`).
pub fn default_budget_bytes() -> u64 {
    match crate::os::meminfo::read().total_bytes {
        Some(total) => total.saturating_sub(BUDGET_HEADROOM_BYTES),
        None => u64::MAX,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lowered_budget_refuses_later_weights_only() {
        let mut s = DomainSet::new(1000, 100, 16);
        s.reserve(60).unwrap();
        s.set_budget(80);
        assert_eq!(s.reserve(30), Err(PlaceError::Budget { resident: 60, budget: 80 }));
        assert_eq!(s.reserve(20), Ok(DomainId(0)));
        assert_eq!((s.resident_bytes(), s.budget_bytes()), (80, 80));
        s.set_budget(200);
        assert_eq!(s.reserve(30), Ok(DomainId(0)));
    }

    #[test]
    fn the_budget_counts_every_copy_and_the_domains_one() {
        // rocket on three cores: each weight is held three times.
        let mut s = DomainSet::new(100, 300, 16);
        s.set_copies(3);
        assert_eq!(s.reserve(40), Ok(DomainId(0)));
        assert_eq!((s.resident_bytes(), s.used()), (120, &[40][..]));
        assert_eq!(s.reserve(60), Ok(DomainId(0)), "the domain holds one copy: 100 of its 100");
        assert_eq!(s.reserve(1), Err(PlaceError::Budget { resident: 300, budget: 300 }));
        s.release(DomainId(0), 60);
        assert_eq!((s.resident_bytes(), s.used()), (120, &[40][..]));
        assert!(s.fault(DomainId(0), 40) || s.used() == [0]);
        assert_eq!(s.resident_bytes(), 0);
    }

    #[test]
    fn advances_at_cap_and_balances() {
        let mut s = DomainSet::new(100, 1000, 16);
        let ds: Vec<u32> = (0..7).map(|_| s.reserve(40).unwrap().0).collect();
        assert_eq!(ds, vec![0, 0, 1, 1, 2, 2, 3]);
        assert_eq!(s.used(), &[80, 80, 80, 40]);
    }

    #[test]
    fn budget_and_domain_limits() {
        let mut s = DomainSet::new(100, 150, 16);
        s.reserve(100).unwrap();
        assert!(matches!(s.reserve(60), Err(PlaceError::Budget { .. })));
        let mut s = DomainSet::new(100, 10_000, 2);
        s.reserve(100).unwrap();
        s.reserve(100).unwrap();
        assert_eq!(s.reserve(1), Err(PlaceError::Domains { max: 2 }));
    }

    #[test]
    fn fault_closes_domain() {
        let mut s = DomainSet::new(100, 1000, 16);
        s.reserve(10).unwrap();
        let d = s.reserve(10).unwrap();
        assert!(s.fault(d, 10));
        assert_eq!(s.reserve(10).unwrap(), DomainId(1));
    }

    #[test]
    fn fault_in_an_empty_domain_keeps_it_open() {
        let mut s = DomainSet::new(100, 1000, 16);
        let d = s.reserve(90).unwrap();
        assert!(!s.fault(d, 90), "the weight itself does not fit: no domain is burnt");
        assert_eq!(s.reserve(10).unwrap(), DomainId(0));
        assert_eq!(s.used(), &[10]);
    }
}
