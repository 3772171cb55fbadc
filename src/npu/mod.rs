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
pub mod kif;
pub mod layout;
pub mod mm;
pub mod plan;
pub mod pool;
pub mod regcmd;
pub mod regs;
mod slots;
pub mod soc;
pub mod stream;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use kif::{KernelInterface, KifError};
use layout::WeightGeometry;
pub use layout::reference_mm;
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
    /// CPUs to pin the per-core workers to (empty = no pinning; see `os::hostcpu`).
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
    /// The longest of the cores' host work (each core's wall time less its time inside the
    /// kernel interface's submits: register commands, syncs, buffers), and the longest of the
    /// cores' time inside its submits past the hardware time they reported (`mm::CoreResult`).
    pub core_host_ns: u64,
    pub late_ns: u64,
    /// The longest of the cores' hardware time (`device_ns` sums every core's): the run's device
    /// time.
    pub device_max_ns: u64,
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

/// One core's part of an NPU matmul's int32 result, over its column segments `(n0, nc, col0)`
/// (global columns `n0..n0+nc` at the share's column `col0`): in the output buffers the core's
/// submits wrote, read in place (each segment a block per M-tile and K-slice, rows of the
/// segment's width; a K-split's partials add up to the result).
pub struct CoreShare {
    core: u32,
    pub segs: Vec<(usize, usize, usize)>,
    outs: Vec<kif::Bo>,
    /// Per segment, its blocks by first row, then first K.
    blocks: Vec<Vec<mm::OutBlock>>,
}

impl CoreShare {
    /// Segment `j` ([`CoreShare::segs`]) of the share's `m` rows, as the output pass reads it.
    fn seg_part(&self, j: usize, m: usize) -> crate::quant::CPart<'_> {
        let (n0, nc, _) = self.segs[j];
        let bl = &self.blocks[j];
        let rows = bl.first().map_or(1, |b| b.mc).max(1);
        let parts = bl.iter().take_while(|b| b.m0 == bl[0].m0).count().max(1);
        debug_assert!(tiles_evenly(bl, m), "checked when the result was assembled");
        let blocks = bl.iter().map(|b| bytemuck::cast_slice::<u8, i32>(&self.outs[b.out].bytes()[b.offset..b.offset + b.mc * nc * 4])).collect();
        crate::quant::CPart { n0, nc, total: m, rows, parts, stride: nc, at: 0, blocks }
    }
}

/// The int32 result `[M, N]` of an NPU matmul, left in the cores' buffers
/// ([`Npu::mm_run_shares`]); every column is in exactly one segment of one core. Dropped, its
/// buffers go back to their cores for later runs.
pub struct Shares {
    pub m: usize,
    pub n: usize,
    pub cores: Vec<CoreShare>,
    home: Arc<Shared>,
}

impl Shares {
    /// Every core's column segments, as the output pass reads them (`quant::CRows::Parts`).
    pub fn parts(&self) -> Vec<crate::quant::CPart<'_>> {
        self.cores.iter().flat_map(|s| (0..s.segs.len()).map(move |j| s.seg_part(j, self.m))).collect()
    }

    /// Assembles the result into `c: [M, N]` row-major.
    pub fn copy_to(&self, c: &mut [i32]) {
        assert_eq!(c.len(), self.m * self.n, "c is not [M, N]");
        let parts = self.parts();
        let rows = crate::quant::CRows::Parts(&parts);
        let segs = rows.segments(self.n);
        let mut buf = Vec::new();
        for ((n0, nc), at) in segs.iter().zip(rows.locate(&segs, self.n)) {
            for row in 0..self.m {
                at.sum_row(row, &mut buf);
                c[row * self.n + n0..row * self.n + n0 + nc].copy_from_slice(&buf);
            }
        }
    }
}

impl Drop for Shares {
    fn drop(&mut self) {
        for s in self.cores.drain(..) {
            self.home.give_back(s.core, s.outs);
        }
    }
}

/// Whether one segment's output blocks, sorted by (first row, first K), tile `m` rows in equal
/// M-tiles (the last one may be shorter), each in the same number of K-slices.
fn tiles_evenly(bl: &[mm::OutBlock], m: usize) -> bool {
    let Some(first) = bl.first() else { return m == 0 };
    let (rows, parts) = (first.mc.max(1), bl.iter().take_while(|b| b.m0 == first.m0).count());
    let tiles = m.div_ceil(rows);
    bl.len() == tiles * parts && bl.iter().enumerate().all(|(i, b)| b.m0 == (i / parts) * rows && b.mc == rows.min(m - b.m0))
}

/// A run of pieces ([`Npu::mm_run_pieces`]): fill the pieces in order, take their results in
/// order. Each fill queues the piece on every core's worker (behind whatever that core runs
/// already: no worker ever waits for this thread). Dropped, it waits until every queued piece
/// has run (after which no core reads its image) and gives their buffers back.
pub struct PieceRun<'a> {
    npu: &'a Npu,
    image: mm::ImageGuard<'a>,
    weight: Arc<mm::WeightInner>,
    k: usize,
    cores: Vec<u32>,
    pieces: Arc<Vec<(plan::Plan, mm::ImageAt)>>,
    tx: Vec<std::sync::mpsc::Sender<Result<mm::CoreResult, NpuError>>>,
    rx: Vec<std::sync::mpsc::Receiver<Result<mm::CoreResult, NpuError>>>,
    /// Per piece filled so far: its fill's outcome (the image bytes synced and exchanged, or
    /// why its rows could not be written; then no core runs it).
    filled: Vec<Result<(u64, u64), Option<NpuError>>>,
    taken: usize,
}

impl PieceRun<'_> {
    /// Writes piece `i`'s int8 rows (`a`: its rows × K) into the image and queues the piece on
    /// every core. Pieces are filled in order. Err: the rows could not be written (the piece's
    /// [`PieceRun::take`] fails too) or `i` is not the next piece.
    pub fn fill(&mut self, i: usize, a: &[i8]) -> Result<(), NpuError> {
        let (plan, img) = &self.pieces[i.min(self.pieces.len() - 1)];
        let (m, k, n) = (plan.m, self.k, plan.n);
        let bad = |why: String| NpuError::BadArg { op: "mm_run_pieces", m, k, n, why };
        if i != self.filled.len() {
            return Err(bad(format!("piece {i} filled out of order (next: {})", self.filled.len())));
        }
        if a.len() != m * k {
            self.filled.push(Err(None));
            return Err(bad(format!("piece {i} has {} elements, not rows·K", a.len())));
        }
        match mm::fill_image(&self.npu.shared, &mut self.image, img, a, k) {
            Ok(bytes) => self.filled.push(Ok(bytes)),
            Err(source) => {
                self.filled.push(Err(None));
                return Err(NpuError::Submit { op: "mm_run_pieces", m, k, n, core: self.cores[0], source });
            }
        }
        for (ci, (&core, tx)) in self.cores.iter().zip(&self.tx).enumerate() {
            let (shared, weight, pieces, tx) = (self.npu.shared.clone(), self.weight.clone(), self.pieces.clone(), tx.clone());
            self.npu.pool.run_on(
                core,
                Box::new(move || {
                    let (plan, img) = &pieces[i];
                    shared.send_result(core, &tx, mm::run_core(&shared, &weight, img, plan.m, &plan.cores[ci], None));
                }),
            );
        }
        Ok(())
    }

    /// Piece `i`'s result once every core has run it. Pieces are taken in order, each after its
    /// fill. Its `host_ns` is the longest of the cores' runs of it.
    pub fn take(&mut self, i: usize) -> Result<(Shares, RunStats), NpuError> {
        let (plan, _) = &self.pieces[i.min(self.pieces.len() - 1)];
        let (m, k, n) = (plan.m, self.k, plan.n);
        if i != self.taken || i >= self.filled.len() {
            return Err(NpuError::BadArg { op: "mm_run_pieces", m, k, n, why: format!("piece {i} taken out of order or before its fill") });
        }
        self.taken += 1;
        let (synced, io) = match &mut self.filled[i] {
            Ok(bytes) => *bytes,
            Err(e) => {
                return Err(e.take().unwrap_or_else(|| NpuError::BadArg { op: "mm_run_pieces", m, k, n, why: format!("piece {i}'s rows were not written") }))
            }
        };
        let vanished = || NpuError::Kif(KifError::Invalid("NPU worker vanished".into()));
        let results: Vec<Result<mm::CoreResult, NpuError>> = self.rx.iter().map(|rx| rx.recv().unwrap_or_else(|_| Err(vanished()))).collect();
        let busy = results.iter().filter_map(|r| r.as_ref().ok()).map(|r| r.busy_ns).max().unwrap_or(0);
        let (shares, mut stats) = self.npu.assemble(&self.pieces[i].0, results, synced, io)?;
        stats.host_ns = busy;
        Ok((shares, stats))
    }
}

impl Drop for PieceRun<'_> {
    fn drop(&mut self) {
        // The pieces queued and not taken: every core's result of each comes back (its buffers
        // to the spares) before the image is let go.
        let queued = self.filled.iter().skip(self.taken).filter(|f| f.is_ok()).count();
        for (rx, &core) in self.rx.iter().zip(&self.cores) {
            for _ in 0..queued {
                if let Ok(Ok(r)) = rx.recv() {
                    self.npu.shared.give_back(core, r.outs);
                }
            }
        }
    }
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
        self.inner.bytes()
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

/// Opens a real NPU: the named interface, or (Auto) whichever node `detect` finds; `card` replaces
/// the scan for the vendor driver's node. The only place that names the hardware back-ends.
fn open_hw(kind: NpuKind, card: Option<&Path>) -> Result<Box<dyn KernelInterface>, NpuError> {
    let kind = match kind {
        NpuKind::Auto => detect::find_npu_node(card).map_err(|e| NpuError::NoDevice(e.to_string()))?.kind,
        NpuKind::Rocket => detect::KifKind::Rocket,
        _ => detect::KifKind::Rknpu,
    };
    match kind {
        detect::KifKind::Rocket => Ok(kif::rocket::open()?),
        detect::KifKind::Rknpu => Ok(kif::rknpu::open(card)?),
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
        // A device tree that gives the driver fewer cores than the SoC has (a core-0-only tree)
        // and a clock other than the nominal one are the kernel interface's to say.
        if let Some(c) = kif.cores() {
            soc.cores = soc.cores.min(c).max(1);
        }
        if let Some(hz) = kif.clock_hz() {
            soc.timing = soc.timing.at_clock(hz);
        }
        let cores = soc.cores;
        let max_cores = cfg.max_cores.unwrap_or(cores).clamp(1, cores);
        let budget = cfg.wcache_budget_bytes.unwrap_or_else(domain::default_budget_bytes);
        let timeout_ms = cfg.timeout_ms.unwrap_or(mm::DEFAULT_TIMEOUT_MS);
        // With an address space per core a domain is one window per core, each holding its
        // cores' parts of the weights: the cap (per window) counts once per core. A split that
        // leaves one window fuller meets the kernel's EFAULT, the safety net below.
        let per_core = kif.per_core_spaces();
        let cap = if per_core { soc.domain_cap_bytes * u64::from(max_cores) } else { soc.domain_cap_bytes };
        let mut domains = domain::DomainSet::new(cap, budget, kif.max_domains());
        domains.set_copies(kif.weight_copies(max_cores));
        let shared = Arc::new(Shared {
            kif,
            domains: Mutex::new(domains),
            cores: (0..cores).map(|_| Mutex::new(mm::CoreScratch::default())).collect(),
            images: (0..cores).map(|_| Mutex::new(std::collections::HashMap::new())).collect(),
            spares: (0..cores).map(|_| Mutex::new(mm::Spares::default())).collect(),
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
    /// cores this `Npu` runs on): 1 on every interface today.
    pub fn weight_copies(&self) -> u32 {
        self.shared.domains().copies()
    }

    /// Bytes of the NPU scratch buffers (each core's regcmd, task and output buffers, the
    /// activation images, every domain and address space; and the cores' spare host-side result
    /// buffers), and of the copies of them the interface keeps besides (where
    /// [`Npu::weight_copies`] > 1, every core but the first's; 0 on every interface today: on
    /// `rocket` each core's scratch and image copy live in that core's own address space). Waits for
    /// running jobs' cores.
    pub fn scratch_bytes(&self) -> (u64, u64) {
        let per_core: Vec<(u64, u64)> = self
            .shared
            .cores
            .iter()
            .zip(&self.shared.spares)
            .map(|(c, s)| (c.lock().unwrap_or_else(|p| p.into_inner()).bytes(), s.lock().unwrap_or_else(|p| p.into_inner()).bytes()))
            .collect();
        let images: u64 = self.shared.images.iter().map(|i| i.lock().unwrap_or_else(|p| p.into_inner()).values().map(|b| b.size_bytes as u64).sum::<u64>()).sum();
        let copies = u64::from(self.weight_copies().saturating_sub(1));
        let mirrored = if copies > 0 { per_core.iter().skip(1).map(|b| b.0).sum::<u64>() + copies * images } else { 0 };
        (per_core.iter().map(|b| b.0 + b.1).sum::<u64>() + images, mirrored)
    }

    /// Sets the residency budget (policy: the backend lowers it by the host memory its weight
    /// buffers take). Resident weights stay; later uploads past it fail with `NoRoom`.
    pub fn set_residency_budget(&self, bytes: u64) {
        self.shared.domains().set_budget(bytes);
    }

    /// Uploads pre-tiled bytes holding the tile sets `sets` through
    /// `KernelInterface::mem_import_observed` (the size is validated against the geometry):
    /// `observe(offset, device_copy)` sees every piece of `bytes`, in order, right after it was
    /// written into device memory. If an attempt fails after observing (the IOVA window filled
    /// up and another domain is tried) the pieces are observed again from offset 0, so an
    /// observer that checksums them restarts when it sees offset 0.
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
        if self.shared.kif.per_core_spaces() {
            return self.place_parts(op, n, k, geom, bytes, observe);
        }
        let size = reserved_bytes(&geom);
        let kif = &*self.shared.kif;
        loop {
            let d = self.shared.domains().reserve(size).map_err(|e| NpuError::NoRoom { op, n, k, bytes: size, why: format!("{e:?}") })?;
            let made = mm::ensure_scratch(&self.shared, d, self.max_cores).and_then(|_| kif.mem_import_observed(bytes, d, observe));
            match made {
                Ok(bo) => {
                    let inner = WeightInner { n, k, geom, bo: Some(bo), parts: Vec::new(), domain: d, reserved_bytes: size, shared: self.shared.clone(), ring: None };
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

    /// [`Npu::place`] where every core has its own address space: the weight is split into one
    /// part per core of its plans ([`plan::core_parts`]: the N-blocks that core computes), each
    /// in the core's space of the reserved domain, so it is held once and runs on those cores.
    /// `observe` sees `bytes` (the host copy) in order once every part landed.
    fn place_parts(&self, op: &'static str, n: usize, k: usize, geom: WeightGeometry, bytes: &[u8], observe: &mut Observer<'_>) -> Result<Arc<ResidentWeight>, NpuError> {
        let ncores = plan::core_count(&self.shared.soc, n, self.max_cores) as usize;
        let ranges = plan::core_parts(&geom, ncores);
        let lens: Vec<usize> = ranges.iter().map(|r| r.iter().map(|x| x.1).sum()).collect();
        let size: u64 = lens.iter().map(|&l| kif::page_round(l) as u64).sum();
        let kif = &*self.shared.kif;
        loop {
            let d = self.shared.domains().reserve(size).map_err(|e| NpuError::NoRoom { op, n, k, bytes: size, why: format!("{e:?}") })?;
            let mut parts: Vec<Option<mm::WeightPart>> = Vec::with_capacity(ncores);
            let mut made = mm::ensure_scratch(&self.shared, d, self.max_cores);
            for (c, (rs, &len)) in ranges.iter().zip(&lens).enumerate() {
                if made.is_err() || len == 0 {
                    parts.push(None);
                    continue;
                }
                made = kif.mem_create(len, kif::mem_flags::DATA, kif.space_of(d, c as u32)).and_then(|mut bo| {
                    let mut at = 0;
                    let mut map = Vec::with_capacity(rs.len());
                    for &(off, l) in rs {
                        bo.bytes_mut()[at..at + l].copy_from_slice(&bytes[off..off + l]);
                        map.push((off, l, at));
                        at += l;
                    }
                    match kif.mem_sync_all(&bo, kif::SyncDir::ToDevice) {
                        Ok(_) => {
                            parts.push(Some(mm::WeightPart { bo, ranges: map }));
                            Ok(())
                        }
                        Err(e) => {
                            let _ = kif.mem_destroy(bo);
                            Err(e)
                        }
                    }
                });
            }
            if let Err(e) = made {
                for p in parts.into_iter().flatten() {
                    let _ = kif.mem_destroy(p.bo);
                }
                match e {
                    KifError::Fault { .. } => {
                        if !self.shared.domains().fault(d, size) {
                            return Err(NpuError::NoRoom { op, n, k, bytes: size, why: "EFAULT in an empty IOMMU domain: the weight does not fit one".into() });
                        }
                        continue;
                    }
                    e => {
                        self.shared.domains().release(d, size);
                        return Err(NpuError::Kif(e));
                    }
                }
            }
            for (i, piece) in bytes.chunks(kif::IMPORT_PIECE_BYTES).enumerate() {
                observe(i * kif::IMPORT_PIECE_BYTES, piece);
            }
            let inner = WeightInner { n, k, geom, bo: None, parts, domain: d, reserved_bytes: size, shared: self.shared.clone(), ring: None };
            return Ok(Arc::new(ResidentWeight { inner: Arc::new(inner) }));
        }
    }

    /// `C = A · Wᵀ`, exact int32. `a`: `[M, K]` row-major i8; `c`: `[M, N]` row-major i32
    /// (fully overwritten on success, zeroed on error: no partial result leaves a failed run). Uses at most `budget.max_cores` cores.
    pub fn mm_run(&self, w: &ResidentWeight, a: &[i8], m: usize, c: &mut [i32], budget: Budget) -> Result<RunStats, NpuError> {
        self.mm_run_at(w, a, m, c, budget, 0)
    }

    /// [`Npu::mm_run`] on the cores `first_core..first_core + budget.max_cores` (a lease from the
    /// backend's arbiter, so concurrent matmuls use disjoint cores). The range is clamped to the
    /// cores this `Npu` runs workers for.
    pub fn mm_run_at(&self, w: &ResidentWeight, a: &[i8], m: usize, c: &mut [i32], budget: Budget, first_core: u32) -> Result<RunStats, NpuError> {
        let n = w.n();
        if c.len() != m * n {
            return Err(NpuError::BadArg { op: "mm_run", m, k: w.k(), n, why: format!("c has {} elements, not M·N", c.len()) });
        }
        let (shares, stats) = self.mm_run_shares(w, a, m, budget, first_core)?;
        shares.copy_to(c);
        self.give_back(shares);
        Ok(stats)
    }

    /// [`Npu::mm_run_at`] that leaves the result where the cores put it: each core's column
    /// segments in a buffer of its own ([`Shares`]), for a caller whose next pass reads them in
    /// place (the backend's output pass) instead of assembling `C`. Hand them back with
    /// [`Npu::give_back`] once read.
    pub fn mm_run_shares(&self, w: &ResidentWeight, a: &[i8], m: usize, budget: Budget, first_core: u32) -> Result<(Shares, RunStats), NpuError> {
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
        if !Arc::ptr_eq(&w.inner.shared, &self.shared) {
            return Err(bad("weight was uploaded to another Npu".into()));
        }
        let plan = self.plan_for(w, m, budget, first_core);
        log::debug!(
            "mm_run M={m} K={k} N={n}: {:?}, {} cores, {} submits, {} programs",
            plan.path,
            plan.cores.len(),
            plan.submits(),
            plan.programs()
        );
        // A packed once into the activation image of this lease, which every core reads; the
        // image stays locked until every core is done.
        let cores: Vec<u32> = plan.cores.iter().map(|c| c.core).collect();
        // The other cores start first and build their submits while this thread packs the
        // image (a core thread's wake-up is about as long as the packing here); their first
        // submit waits for it. This thread then runs the first core's share itself.
        let sub_err = |source: KifError| NpuError::Submit { op: "mm_run", m, k, n, core: first_core, source };
        let (mut image, img) = mm::image_for(&self.shared, first_core, w.inner.domain, &cores, mm::ImageLayout::of(&plan)).map_err(sub_err)?;
        let img = Arc::new(img);
        let gate = mm::GateOpener(Arc::new(mm::Gate::default()));
        let mut receivers = Vec::new();
        for cp in plan.cores.iter().skip(1) {
            let (tx, rx) = std::sync::mpsc::channel();
            let (shared, weight, img, cp, gate) = (self.shared.clone(), w.inner.clone(), img.clone(), cp.clone(), gate.0.clone());
            self.pool.run_on(
                cp.core,
                Box::new(move || {
                    shared.send_result(cp.core, &tx, mm::run_core(&shared, &weight, &img, m, &cp, Some(&gate)));
                }),
            );
            receivers.push(rx);
        }
        let filled = mm::fill_image(&self.shared, &mut image, &img, a, k);
        gate.open(filled.is_ok());
        let mut results = Vec::with_capacity(plan.cores.len());
        let (img_synced, img_io) = match filled {
            Ok(v) => {
                results.push(mm::run_core(&self.shared, &w.inner, &img, m, &plan.cores[0], None));
                v
            }
            Err(source) => {
                results.push(Err(sub_err(source)));
                (0, 0)
            }
        };
        for rx in receivers {
            results.push(rx.recv().unwrap_or_else(|_| Err(NpuError::Kif(KifError::Invalid("NPU worker vanished".into())))));
        }
        drop(image);
        let (shares, mut stats) = self.assemble(&plan, results, img_synced, img_io)?;
        stats.host_ns = t0.elapsed().as_nanos() as u64;
        Ok((shares, stats))
    }

    /// The cores' results of `plan` (in its core order) as one result and its counters; the
    /// first error if a core failed (the others' buffers go back). `img_synced` / `img_io`: the
    /// activation image's bytes, counted with the run's (the cores counted their own).
    fn assemble(&self, plan: &plan::Plan, results: Vec<Result<mm::CoreResult, NpuError>>, img_synced: u64, img_io: u64) -> Result<(Shares, RunStats), NpuError> {
        let mut stats = RunStats { cores: plan.cores.len() as u32, synced_bytes: img_synced, io_bytes: img_io, ..RunStats::default() };
        let mut shares = Shares { m: plan.m, n: plan.n, cores: Vec::with_capacity(results.len()), home: self.shared.clone() };
        let mut failed = None;
        for (cp, r) in plan.cores.iter().zip(results) {
            match r {
                Ok(r) => {
                    stats.submits += r.submits;
                    stats.programs += r.programs;
                    stats.device_ns += r.device_ns;
                    stats.core_host_ns = stats.core_host_ns.max(r.busy_ns.saturating_sub(r.kif_ns));
                    stats.device_max_ns = stats.device_max_ns.max(r.device_ns);
                    stats.late_ns = stats.late_ns.max(r.late_ns);
                    stats.never_ran += r.never_ran;
                    stats.retries += r.retries;
                    stats.synced_bytes += r.synced_bytes;
                    stats.io_bytes += r.io_bytes;
                    let mut blocks = r.blocks;
                    for b in &mut blocks {
                        b.sort_unstable_by_key(|x| (x.m0, x.k0));
                    }
                    // The output pass finds a row's block by arithmetic: every segment's blocks
                    // must tile its rows in equal M-tiles (the last one shorter), each M-tile in
                    // as many K-slices. A plan that breaks this fails the run, never a wrong row.
                    if !blocks.iter().all(|b| tiles_evenly(b, plan.m)) {
                        shares.cores.push(CoreShare { core: cp.core, segs: Vec::new(), outs: r.outs, blocks: Vec::new() });
                        failed = failed.or(Some(NpuError::Kif(KifError::Invalid(format!("core {}'s output blocks do not tile M = {} evenly", cp.core, plan.m)))));
                        continue;
                    }
                    shares.cores.push(CoreShare {
                        core: cp.core,
                        segs: cp.segs.iter().map(|s| (s.n0, s.nc, s.col0)).collect(),
                        outs: r.outs,
                        blocks,
                    });
                }
                Err(e) => failed = failed.or(Some(e)),
            }
        }
        if let Some(e) = failed {
            self.give_back(shares);
            return Err(e);
        }
        self.shared.synced.synced_bytes.fetch_add(img_synced, std::sync::atomic::Ordering::Relaxed);
        self.shared.synced.io_bytes.fetch_add(img_io, std::sync::atomic::Ordering::Relaxed);
        Ok((shares, stats))
    }

    /// [`Npu::mm_run_shares`] of an activation that comes in pieces, rows `bounds[i]` of
    /// piece `i`, for a caller that computes each piece's rows while the NPU runs the ones
    /// before. Every core runs the pieces one after the other on its worker thread, each as soon
    /// as its rows are written ([`PieceRun::fill`] queues it) and the core is done with the piece
    /// before, without waiting for the other cores; [`PieceRun::take`] gives a piece's result
    /// once every core has run it. The pieces' rows sit one after the other in the lease slot's activation
    /// buffer, one stable buffer for the whole run (rknpu-facts §2.6: rotating activation
    /// buffers corrupted results; row ranges of one buffer are what every multi-M-tile run reads).
    pub fn mm_run_pieces(&self, w: &ResidentWeight, bounds: &[(usize, usize)], budget: Budget, first_core: u32) -> Result<PieceRun<'_>, NpuError> {
        let first_core = first_core.min(self.max_cores - 1);
        let budget = Budget { max_cores: budget.max_cores.min(self.max_cores - first_core) };
        let (k, n) = (w.k(), w.n());
        let m = bounds.last().map_or(0, |b| b.1);
        let bad = |why: String| NpuError::BadArg { op: "mm_run_pieces", m, k, n, why };
        if bounds.is_empty() || bounds.iter().any(|&(r0, r1)| r1 <= r0) || bounds.windows(2).any(|b| b[0].1 != b[1].0) {
            return Err(bad(format!("pieces {bounds:?} are not consecutive non-empty row ranges")));
        }
        if !Arc::ptr_eq(&w.inner.shared, &self.shared) {
            return Err(bad("weight was uploaded to another Npu".into()));
        }
        let plans: Vec<plan::Plan> = bounds.iter().map(|&(r0, r1)| self.plan_for(w, r1 - r0, budget, first_core)).collect();
        let cores: Vec<u32> = plans[0].cores.iter().map(|c| c.core).collect();
        if plans.iter().any(|p| p.cores.iter().map(|c| c.core).ne(cores.iter().copied())) {
            return Err(bad("the pieces' plans use different cores".into()));
        }
        // Each piece's image at a 64-byte boundary after the one before (no cache line shared).
        let layouts: Vec<mm::ImageLayout> = plans.iter().map(mm::ImageLayout::of).collect();
        let mut bases = Vec::with_capacity(layouts.len());
        let mut total = 0;
        for l in &layouts {
            bases.push(total);
            total += l.bytes.div_ceil(64) * 64;
        }
        let sub_err = |source: KifError| NpuError::Submit { op: "mm_run_pieces", m, k, n, core: first_core, source };
        let (image, iovas) = mm::image_space(&self.shared, first_core, w.inner.domain, &cores, total).map_err(sub_err)?;
        let pieces: Arc<Vec<(plan::Plan, mm::ImageAt)>> =
            Arc::new(plans.into_iter().zip(layouts).zip(bases).map(|((plan, layout), base)| (plan, mm::ImageAt { iovas: iovas.clone(), layout, base })).collect());
        let (tx, rx) = cores.iter().map(|_| std::sync::mpsc::channel()).unzip();
        Ok(PieceRun { npu: self, image, weight: w.inner.clone(), k, cores, pieces, tx, rx, filled: Vec::with_capacity(bounds.len()), taken: 0 })
    }

    /// The plan of an `m`-row run of `w` on the lease's cores. A weight split into per-core
    /// parts runs on the cores that hold them, whatever the lease (the per-core locks still
    /// serialise matmuls that meet on a core).
    fn plan_for(&self, w: &ResidentWeight, m: usize, budget: Budget, first_core: u32) -> plan::Plan {
        if w.inner.parts.is_empty() {
            plan::plan_at(&self.shared.soc, &w.inner.geom, m, budget.max_cores.min(self.max_cores), first_core)
        } else {
            plan::plan_at(&self.shared.soc, &w.inner.geom, m, w.inner.parts.len() as u32, 0)
        }
    }

    /// Keeps the result buffers of `shares` for later runs of their cores (as dropping them does).
    pub fn give_back(&self, shares: Shares) {
        drop(shares);
    }

    /// The row ranges a caller that pipelines its host work around an `m`-row matmul of `w` on
    /// at most `budget.max_cores` cores cuts it into ([`plan::pipeline_bounds`]: whole M-tiles,
    /// each piece long enough on the NPU not to run at its submit floor, the `ends` cut short);
    /// one range when it should not be cut.
    pub fn pipeline_bounds(&self, w: &ResidentWeight, m: usize, budget: Budget, ends: plan::Ends) -> Vec<(usize, usize)> {
        plan::pipeline_bounds(&self.shared.soc, &w.inner.geom, m, budget.max_cores.min(self.max_cores), ends)
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

