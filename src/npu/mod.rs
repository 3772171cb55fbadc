//! NPU core (mechanism): dense int8 matmuls (W8A8, exact int32 results) on the Rockchip
//! RK3588 / RK3576 NPU, behind one small API.
//!
//! The backend calls [`npu::layout::tile_weight`] / [`Npu::upload`] once per weight and
//! [`Npu::mm_run`] per matmul with a [`Budget`] (max cores) — the only knob it sets. Everything
//! that depends on the hardware is decided here (design §2 "mechanism vs policy"): the planner
//! ([`plan`]) picks full-K vs K-split, M-tiles within the CBUF caps, N-tiling and the number of
//! cores; [`regcmd`] synthesises the register programs from the one register table ([`regs`]);
//! [`layout`] packs the bytes; [`mm`] walks the plan through the kernel interface ([`kif`]) on one
//! host worker per NPU core ([`pool`]); [`domain`] places weights across IOMMU domains.
//!
//! Every matmul goes pack → plan → regcmd → submit → wait through a [`kif::KernelInterface`];
//! with [`NpuKind::Sim`] that interface is the in-process simulator ([`kif::sim`]), which decodes
//! the register stream it is handed and computes exactly what it describes.
//!
//! Sources: shared reference `rknpu-facts.md` (§2 regcmd, §3 layouts, §4 limits, §5 multi-core),
//! seeds 001 (big-core pinning) and 002 (multi-domain residence).

pub mod detect;
pub mod domain;
pub mod hostcpu;
pub mod kif;
pub mod layout;
pub mod mm;
pub mod plan;
pub mod pool;
pub mod regcmd;
pub mod regs;
pub mod soc;
pub mod stream;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use kif::{KernelInterface, KifError};
use layout::WeightGeometry;
pub use mm::Health;
use mm::{Shared, WeightInner};

/// Which kernel interface to open.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum NpuKind {
    /// The vendor driver, then mainline rocket; `NoDevice` if neither is present.
    Auto,
    /// The in-process simulator.
    #[default]
    Sim,
    /// The vendor `rknpu` DRM driver.
    Rknpu,
    /// The mainline `rocket` accel driver.
    Rocket,
}

/// How to open the NPU. The NPU core reads no environment: whoever builds this passes the
/// configured values (`crate::config::Config`; the comments name the variables).
#[derive(Clone, Debug, Default)]
pub struct NpuConfig {
    pub kind: NpuKind,
    /// SoC (`ORK_SOC`; default: the device tree, RK3588 for the simulator).
    pub soc: Option<soc::SocId>,
    /// The rknpu node to open instead of scanning `/dev/dri/card*` (`ORK_NPU_CARD`).
    pub card: Option<PathBuf>,
    /// Cap on NPU cores for every run (`ORK_NPU_MC`; default: all).
    pub max_cores: Option<u32>,
    /// CPUs to pin the per-core workers to (empty = no pinning; see `hostcpu`).
    pub pin_cpus: Vec<usize>,
    /// Residency budget for weights (`ORK_WCACHE_BUDGET_MB`; default: RAM − 1 GiB,
    /// [`domain::default_budget_bytes`]).
    pub wcache_budget_bytes: Option<u64>,
    /// Submit timeout in ms (`ORK_MM_TIMEOUT`; default [`mm::DEFAULT_TIMEOUT_MS`]).
    pub timeout_ms: Option<u32>,
    /// Weight bytes per IOMMU domain (`ORK_DOMAIN_CAP_MB`; default the SoC's
    /// `domain_cap_bytes`). Must stay below the kernel's per-domain window minus scratch.
    pub domain_cap_bytes: Option<u64>,
    /// The simulator's fault injection (`ORK_SIM_FAULT`, [`kif::sim::SimFaults::parse`]); a bad
    /// spec makes [`Npu::open`] fail.
    pub sim_fault: Option<String>,
    /// The simulator's board timing (`ORK_SIM_TIMING=board`, [`kif::sim::SimKif::set_board_timing`]).
    pub sim_board_timing: bool,
    /// The smallest M the caller runs matmuls with on the NPU (`ORK_MINM`, or 1 where decode
    /// goes to the NPU); 0 = unknown, treated as 1. [`Npu::tile_sets`] keeps only the tile sets
    /// the plans of M ≥ it read.
    pub smallest_m: usize,
}

/// Errors of the NPU core; each carries the op name and shapes.
#[derive(Debug, thiserror::Error)]
pub enum NpuError {
    #[error("no NPU device: {0}")]
    NoDevice(String),
    #[error("{op}: unsupported shape M={m} K={k} N={n}: {why}")]
    Unsupported { op: &'static str, m: usize, k: usize, n: usize, why: String },
    #[error("{op}: bad argument (M={m} K={k} N={n}): {why}")]
    BadArg { op: &'static str, m: usize, k: usize, n: usize, why: String },
    #[error("{op}: no room for weight N={n} K={k} ({bytes} bytes): {why}")]
    NoRoom { op: &'static str, n: usize, k: usize, bytes: u64, why: String },
    #[error("{op}: tiled blob for N={n} K={k} is {got} bytes, expected {expected}")]
    BadBlob { op: &'static str, n: usize, k: usize, got: usize, expected: usize },
    #[error("{op} M={m} K={k} N={n} on NPU core {core}: {source}")]
    Submit { op: &'static str, m: usize, k: usize, n: usize, core: u32, #[source] source: KifError },
    /// A job reported done but did not run (output sentinel or task counter), twice: the first
    /// time it was resubmitted (see `mm`).
    #[error("{op} M={m} K={k} N={n} on NPU core {core}: {what}, again after one resubmit")]
    NeverRan { op: &'static str, m: usize, k: usize, n: usize, core: u32, what: String },
    #[error(transparent)]
    Regcmd(#[from] regcmd::RegcmdError),
    #[error(transparent)]
    Kif(#[from] KifError),
}

/// The only knob callers set per run.
#[derive(Clone, Copy, Debug)]
pub struct Budget {
    pub max_cores: u32,
}

impl Default for Budget {
    fn default() -> Self {
        Budget { max_cores: u32::MAX }
    }
}

/// What a run did.
#[derive(Clone, Copy, Debug, Default)]
pub struct RunStats {
    pub submits: u32,
    pub programs: u32,
    pub cores: u32,
    /// Sum over submits of the interface's measured busy time.
    pub device_ns: u64,
    /// Wall time of the whole run.
    pub host_ns: u64,
    /// Submits detected as never ran (reported done, output not written) and resubmitted; a
    /// run that succeeds had every one of them succeed on the resubmit.
    pub never_ran: u32,
    pub retries: u32,
    /// Bytes of cache maintenance the run did (whole cache lines, both directions), and the
    /// bytes its submits exchanged with the device (activation blocks, regcmd, task
    /// descriptors and sentinel words written; output blocks read): see `mm`.
    pub synced_bytes: u64,
    pub io_bytes: u64,
}

/// A deterministic, self-contained tiled weight blob (what a disk cache stores): the K-slice
/// tiles then the optional full-K companion, layout of [`layout`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TiledWeight {
    pub n: usize,
    pub k: usize,
    pub bytes: Vec<u8>,
    /// The tile sets `bytes` holds.
    pub sets: layout::TileSets,
}

/// A weight resident in NPU memory (one IOMMU domain).
pub struct ResidentWeight {
    inner: Arc<WeightInner>,
}

impl ResidentWeight {
    pub fn n(&self) -> usize {
        self.inner.n
    }
    pub fn k(&self) -> usize {
        self.inner.k
    }
    /// Bytes it occupies in its domain's IOVA window (page-rounded).
    pub fn resident_bytes(&self) -> u64 {
        self.inner.bo.as_ref().map_or(0, |b| b.size_bytes as u64)
    }
    /// The IOMMU domain it lives in.
    pub fn domain(&self) -> u32 {
        self.inner.domain.0
    }
    /// Whether it is a slot of a stream ring (`stream`), not a resident weight.
    pub fn is_streamed(&self) -> bool {
        self.inner.ring.is_some()
    }
    fn from_inner(inner: WeightInner) -> Arc<ResidentWeight> {
        Arc::new(ResidentWeight { inner: Arc::new(inner) })
    }
}

/// An opened NPU. `Send + Sync`; `mm_run` may be called from several threads at once.
pub struct Npu {
    shared: Arc<Shared>,
    pool: pool::Pool,
    cores: u32,
    max_cores: u32,
    /// `NpuConfig::smallest_m` (≥ 1).
    smallest_m: usize,
}

/// Opens a hardware kernel interface. The only place that names the hardware back-ends.
/// Opens a real NPU: the named interface, or (Auto) whichever node `detect` finds; `card` replaces
/// the scan for the vendor driver's node.
fn open_hw(kind: NpuKind, card: Option<&Path>) -> Result<Box<dyn KernelInterface>, NpuError> {
    let kind = match kind {
        NpuKind::Auto => match detect::find_npu_node(card) {
            Ok(node) => match node.kind {
                detect::KifKind::Rknpu => NpuKind::Rknpu,
                detect::KifKind::Rocket => NpuKind::Rocket,
            },
            Err(e) => return Err(NpuError::NoDevice(e.to_string())),
        },
        k => k,
    };
    match kind {
        NpuKind::Rocket => Ok(kif::rocket::open()?),
        _ => Ok(kif::rknpu::open(card)?),
    }
}

/// What an observed import calls per piece: `(offset, device copy)`.
type Observer<'a> = dyn FnMut(usize, &[u8]) + 'a;

impl Npu {
    /// Opens the NPU described by `cfg`.
    pub fn open(cfg: &NpuConfig) -> Result<Arc<Npu>, NpuError> {
        let kif: Arc<dyn KernelInterface>;
        let soc = match cfg.kind {
            NpuKind::Sim => {
                let soc = soc::SocDesc::get(cfg.soc.unwrap_or(soc::SocId::Rk3588));
                let sim = kif::sim::SimKif::new(soc.clone(), cfg.sim_fault.as_deref())?;
                sim.set_board_timing(cfg.sim_board_timing);
                kif = Arc::new(sim);
                soc
            }
            other => {
                kif = Arc::from(open_hw(other, cfg.card.as_deref())?);
                let id = match cfg.soc {
                    Some(id) => id,
                    None => detect::detect_soc(None).map_err(|e| NpuError::NoDevice(e.to_string()))?,
                };
                soc::SocDesc::get(id)
            }
        };
        Npu::with_kif(kif, soc, cfg)
    }

    /// Builds an `Npu` over an already opened kernel interface (tests use it to keep a handle on
    /// the simulator, e.g. for fault injection or a SoC description with a small IOVA window).
    pub fn with_kif(kif: Arc<dyn KernelInterface>, soc: soc::SocDesc, cfg: &NpuConfig) -> Result<Arc<Npu>, NpuError> {
        let mut soc = soc;
        if let Some(cap) = cfg.domain_cap_bytes {
            soc.domain_cap_bytes = cap;
        }
        let cores = soc.cores;
        let max_cores = cfg.max_cores.unwrap_or(cores).clamp(1, cores);
        let budget = cfg.wcache_budget_bytes.unwrap_or_else(domain::default_budget_bytes);
        let timeout_ms = cfg.timeout_ms.unwrap_or(mm::DEFAULT_TIMEOUT_MS);
        let mut domains = domain::DomainSet::new(soc.domain_cap_bytes, budget, kif::MAX_DOMAINS);
        domains.set_copies(kif.weight_copies(max_cores));
        let shared = Arc::new(Shared {
            kif,
            domains: Mutex::new(domains),
            cores: (0..cores).map(|_| Mutex::new(mm::CoreScratch::default())).collect(),
            soc,
            timeout_ms,
            health: mm::HealthCounters::default(),
            synced: mm::SyncCounters::default(),
        });
        let pool = pool::Pool::new(max_cores, &cfg.pin_cpus);
        log::info!("{}", shared.kif.describe());
        Ok(Arc::new(Npu { shared, pool, cores, max_cores, smallest_m: cfg.smallest_m.max(1) }))
    }

    pub fn soc(&self) -> &soc::SocDesc {
        &self.shared.soc
    }

    /// "ORK NPU rk3588 (sim), 3 cores".
    pub fn describe(&self) -> String {
        format!("ORK NPU {} ({}), {} cores", self.shared.soc.id.name(), self.shared.kif.name(), self.max_cores)
    }

    /// Jobs detected as never ran, resubmits and runs given up since this `Npu` opened.
    pub fn health(&self) -> Health {
        self.shared.health.snapshot()
    }

    /// Since this `Npu` opened, over every core's completed shares: bytes of cache
    /// maintenance, and bytes the submits exchanged with the device.
    pub fn synced(&self) -> (u64, u64) {
        use std::sync::atomic::Ordering::Relaxed;
        (self.shared.synced.synced_bytes.load(Relaxed), self.shared.synced.io_bytes.load(Relaxed))
    }

    /// The kernel interface's line on faults it injected on purpose (the simulator under
    /// `ORK_SIM_FAULT`); None on a real device.
    pub fn fault_report(&self) -> Option<String> {
        self.shared.kif.fault_report()
    }

    /// Bytes of weights resident per IOMMU domain (opened domains only).
    pub fn domain_usage(&self) -> Vec<u64> {
        self.shared.domains().used().to_vec()
    }

    /// Whether an `[N, K]` weight can run here: K % 32, N % 32, non-empty, fits a domain window.
    pub fn check_shape(&self, n: usize, k: usize) -> Result<(), NpuError> {
        check_shape_soc(&self.shared.soc, n, k)
    }

    /// Uploads a tiled weight into the next IOMMU domain with room.
    pub fn upload(&self, tw: &TiledWeight) -> Result<Arc<ResidentWeight>, NpuError> {
        self.place("upload", tw.n, tw.k, tw.sets, &tw.bytes, &mut |_, _| {})
    }

    /// The tile sets an `[N, K]` weight is packed with here: those the plans of every M this
    /// `Npu` runs (≥ `NpuConfig::smallest_m`) read ([`plan::tile_sets`]).
    pub fn tile_sets(&self, n: usize, k: usize) -> layout::TileSets {
        plan::tile_sets(&self.shared.soc, n, k, self.smallest_m)
    }

    /// The residency budget for weights in bytes (see [`domain`]).
    pub fn residency_budget(&self) -> u64 {
        self.shared.domains().budget_bytes()
    }

    /// Bytes one int8 term of an `[N, K]` weight costs against the residency budget: its tiled
    /// layout with the tile sets [`Npu::tile_sets`] keeps, page-rounded, times
    /// [`Npu::weight_copies`].
    pub fn term_bytes(&self, n: usize, k: usize) -> u64 {
        reserved_bytes(&WeightGeometry::with_sets(&self.shared.soc, n, k, self.tile_sets(n, k))) * u64::from(self.weight_copies())
    }

    /// Weight bytes held now (page-rounded, all domains, every copy counted: what the residency
    /// budget bounds).
    pub fn resident_bytes(&self) -> u64 {
        self.shared.domains().resident_bytes()
    }

    /// Copies of each weight the kernel interface holds (`KernelInterface::weight_copies` for the
    /// cores this `Npu` runs on): 1, or the cores `rocket` mirrors every weight onto.
    pub fn weight_copies(&self) -> u32 {
        self.shared.domains().copies()
    }

    /// Bytes of the NPU scratch buffers (regcmd, task, activation, output; every core and
    /// domain), and of the copies of them the interface keeps besides (`rocket`: core `c ≥ 1`'s
    /// scratch mirrored onto its own file descriptor). Waits for running jobs' cores.
    pub fn scratch_bytes(&self) -> (u64, u64) {
        let per_core: Vec<u64> = self.shared.cores.iter().map(|c| c.lock().unwrap_or_else(|p| p.into_inner()).bytes()).collect();
        let mirrored = if self.weight_copies() > 1 { per_core.iter().skip(1).sum() } else { 0 };
        (per_core.iter().sum(), mirrored)
    }

    /// Sets the residency budget (policy: the backend lowers it by the host memory its weight
    /// buffers take). Resident weights stay; later uploads past it fail with `NoRoom`.
    pub fn set_residency_budget(&self, bytes: u64) {
        self.shared.domains().set_budget(bytes);
    }

    /// Uploads pre-tiled bytes (both tile sets) via `KernelInterface::mem_import`; the size is
    /// validated against the geometry.
    pub fn upload_bytes(&self, n: usize, k: usize, bytes: &[u8]) -> Result<Arc<ResidentWeight>, NpuError> {
        self.place("upload_bytes", n, k, layout::TileSets::Both, bytes, &mut |_, _| {})
    }

    /// [`upload_bytes`](Self::upload_bytes) through `KernelInterface::mem_import_observed`:
    /// `observe(offset, device_copy)` sees every piece of `bytes`, in order, right after it was
    /// written into device memory. If an attempt fails after observing (the IOVA window filled
    /// up and another domain is tried) the pieces are observed again from offset 0, so an
    /// observer that checksums them restarts when it sees offset 0.
    /// `bytes` hold the tile sets `sets`.
    pub fn upload_bytes_observed(&self, n: usize, k: usize, sets: layout::TileSets, bytes: &[u8], observe: &mut dyn FnMut(usize, &[u8])) -> Result<Arc<ResidentWeight>, NpuError> {
        self.place("upload_bytes", n, k, sets, bytes, observe)
    }

    /// Both upload paths: reserve room in a domain, then `KernelInterface::mem_import_observed`
    /// (create, copy, sync; the buffer is freed if the sync fails), moving on to the next domain
    /// on EFAULT.
    fn place(&self, op: &'static str, n: usize, k: usize, sets: layout::TileSets, bytes: &[u8], observe: &mut Observer<'_>) -> Result<Arc<ResidentWeight>, NpuError> {
        self.check_shape(n, k)?;
        let geom = WeightGeometry::with_sets(&self.shared.soc, n, k, sets);
        if bytes.len() != geom.total_bytes {
            return Err(NpuError::BadBlob { op, n, k, got: bytes.len(), expected: geom.total_bytes });
        }
        let size = reserved_bytes(&geom);
        let kif = &*self.shared.kif;
        loop {
            let d = self.shared.domains().reserve(size).map_err(|e| NpuError::NoRoom {
                op,
                n,
                k,
                bytes: size,
                why: format!("{e:?}"),
            })?;
            let made = mm::ensure_scratch(&self.shared, d, self.max_cores).and_then(|_| kif.mem_import_observed(bytes, d, observe));
            match made {
                Ok(bo) => {
                    let inner = WeightInner { n, k, geom, bo: Some(bo), domain: d, reserved_bytes: size, shared: self.shared.clone(), ring: None };
                    return Ok(Arc::new(ResidentWeight { inner: Arc::new(inner) }));
                }
                Err(KifError::Fault { .. }) => {
                    // Safety net (seed 002): the domain is fuller than our accounting knows.
                    if !self.shared.domains().fault(d, size) {
                        return Err(NpuError::NoRoom { op, n, k, bytes: size, why: "EFAULT in an empty IOMMU domain: the weight does not fit one".into() });
                    }
                }
                Err(e) => {
                    self.shared.domains().release(d, size);
                    return Err(NpuError::Kif(e));
                }
            }
        }
    }

    /// `C = A · Wᵀ`, exact int32. `a`: `[M, K]` row-major i8; `c`: `[M, N]` row-major i32
    /// (fully overwritten on success, untouched on error). Uses at most `budget.max_cores` cores.
    pub fn mm_run(&self, w: &ResidentWeight, a: &[i8], m: usize, c: &mut [i32], budget: Budget) -> Result<RunStats, NpuError> {
        self.mm_run_at(w, a, m, c, budget, 0)
    }

    /// [`Npu::mm_run`] on the cores `first_core..first_core + budget.max_cores` (a lease from the
    /// backend's arbiter, so concurrent matmuls use disjoint cores). The range is clamped to the
    /// cores this `Npu` runs workers for.
    pub fn mm_run_at(&self, w: &ResidentWeight, a: &[i8], m: usize, c: &mut [i32], budget: Budget, first_core: u32) -> Result<RunStats, NpuError> {
        let first_core = first_core.min(self.max_cores - 1);
        let budget = Budget { max_cores: budget.max_cores.min(self.max_cores - first_core) };
        let t0 = Instant::now();
        let (k, n) = (w.k(), w.n());
        let bad = |why: String| NpuError::BadArg { op: "mm_run", m, k, n, why };
        if m == 0 {
            return Err(bad("M = 0".into()));
        }
        if a.len() != m * k {
            return Err(bad(format!("a has {} elements, not M·K", a.len())));
        }
        if c.len() != m * n {
            return Err(bad(format!("c has {} elements, not M·N", c.len())));
        }
        if !Arc::ptr_eq(&w.inner.shared, &self.shared) {
            return Err(bad("weight was uploaded to another Npu".into()));
        }
        let plan = plan::plan_at(&self.shared.soc, &w.inner.geom, m, budget.max_cores.min(self.max_cores), first_core);
        log::debug!(
            "mm_run M={m} K={k} N={n}: {:?}, {} cores, {} submits, {} programs",
            plan.path,
            plan.cores.len(),
            plan.submits(),
            plan.programs()
        );
        let a_shared: Option<Arc<Vec<i8>>> = (plan.cores.len() > 1).then(|| Arc::new(a.to_vec()));
        let mut receivers = Vec::new();
        for cp in plan.cores.iter().skip(1) {
            let (tx, rx) = std::sync::mpsc::channel();
            let (shared, weight, a_arc, cp) = (self.shared.clone(), w.inner.clone(), a_shared.clone().unwrap(), cp.clone());
            self.pool.run_on(
                cp.core,
                Box::new(move || {
                    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| mm::run_core(&shared, &weight, &a_arc, m, &cp)));
                    let _ = tx.send(r.unwrap_or_else(|_| {
                        Err(NpuError::Kif(KifError::Invalid(format!("NPU worker {} panicked", cp.core))))
                    }));
                }),
            );
            receivers.push(rx);
        }
        let first = mm::run_core(&self.shared, &w.inner, a, m, &plan.cores[0]);
        let mut results = vec![first];
        for rx in receivers {
            results.push(rx.recv().unwrap_or_else(|_| Err(NpuError::Kif(KifError::Invalid("NPU worker vanished".into())))));
        }
        let mut stats = RunStats { cores: plan.cores.len() as u32, ..RunStats::default() };
        let mut done = Vec::with_capacity(results.len());
        for r in results {
            done.push(r?);
        }
        for (cp, r) in plan.cores.iter().zip(done) {
            for seg in &cp.segs {
                for row in 0..m {
                    let src = &r.local[row * cp.ncols + seg.col0..row * cp.ncols + seg.col0 + seg.nc];
                    c[row * n + seg.n0..row * n + seg.n0 + seg.nc].copy_from_slice(src);
                }
            }
            stats.submits += r.submits;
            stats.programs += r.programs;
            stats.device_ns += r.device_ns;
            stats.never_ran += r.never_ran;
            stats.retries += r.retries;
            stats.synced_bytes += r.synced_bytes;
            stats.io_bytes += r.io_bytes;
            self.shared.cores[cp.core as usize].lock().unwrap_or_else(|p| p.into_inner()).give_back(r.local);
        }
        stats.host_ns = t0.elapsed().as_nanos() as u64;
        Ok(stats)
    }

    /// Rows per piece when the caller pipelines its host work around an `m`-row matmul of `w`
    /// on at most `budget.max_cores` cores ([`plan::pipeline_rows`]: whole M-tiles, each piece
    /// long enough on the NPU not to run at its submit floor); `m` when it should not be cut.
    pub fn pipeline_rows(&self, w: &ResidentWeight, m: usize, budget: Budget) -> usize {
        plan::pipeline_rows(&self.shared.soc, &w.inner.geom, m, budget.max_cores.min(self.max_cores))
    }

    /// Number of NPU cores of the SoC.
    pub fn cores(&self) -> u32 {
        self.cores
    }
}

/// What a weight of `geom` reserves in its domain: its tiled bytes, page-rounded.
fn reserved_bytes(geom: &WeightGeometry) -> u64 {
    kif::page_round(geom.total_bytes) as u64
}

pub(crate) fn check_shape_soc(soc: &soc::SocDesc, n: usize, k: usize) -> Result<(), NpuError> {
    let uns = |why: String| Err(NpuError::Unsupported { op: "check_shape", m: 0, k, n, why });
    if n == 0 || k == 0 {
        return uns("empty weight".into());
    }
    if k % soc.k_align as usize != 0 || n % soc.n_align as usize != 0 {
        return uns(format!("K must be a multiple of {} and N of {}", soc.k_align, soc.n_align));
    }
    // The tile layout works in 32×32 blocks: every shape and slice is a whole number of them.
    let b = layout::BLOCK;
    if k % b != 0 || n % b != 0 || soc.k_slice as usize % b != 0 || soc.n_max_per_program as usize % b != 0 || soc.k_slice == 0 {
        return uns(format!("K, N and the SoC's K/N slices must be non-zero multiples of {b}"));
    }
    let bytes = WeightGeometry::new(soc, n, k).total_bytes as u64;
    if bytes > soc.domain_cap_bytes.max(1) && bytes > soc.iova_window_bytes / 2 {
        return uns(format!("the tiled weight ({bytes} bytes) does not fit one IOMMU domain"));
    }
    Ok(())
}

/// Scalar reference: `C[m][n] = Σ_k A[m][k] · W[n][k]` exact int32.
/// `a`: `[M, K]` row-major i8, `w`: `[N, K]` row-major i8; returns `[M, N]` row-major i32.
pub fn reference_mm(a: &[i8], w: &[i8], m: usize, k: usize, n: usize) -> Vec<i32> {
    layout::reference_mm(a, w, m, k, n)
}
