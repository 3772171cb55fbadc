//! Execution of a plan: pack → regcmd → submit → wait → accumulate, one NPU core at a time.
//!
//! What it owns: the per-core, per-IOMMU-domain scratch buffers (regcmd, task array, activation,
//! output; rknpu-facts §5: each core has its own) and the walk of one core's submits. Every run
//! goes through the kernel interface: the activation blocks are packed into the activation BO,
//! the programs are synthesised into the regcmd BO and PC-chained, the task descriptors written,
//! the buffers synced, the job submitted on `core_mask = 1 << core` in the weight's domain and
//! the output BO synced back. Each submit writes an output BO of its own that goes to the caller
//! with the result: the caller reads the programs' blocks where the NPU wrote them (its output
//! pass takes the cores' column segments, block by block, a K-split's partials added per row)
//! and hands the BOs back for later submits.
//!
//! Decisions:
//! * One stable activation buffer per core and domain (rknpu-facts §2.6: the NPU caches feature
//!   state by address; rotating buffers corrupted results on hardware). Scratch is sized to the
//!   largest submit seen (page-rounded) and grows only when a bigger one comes; it is never
//!   shrunk, so shapes that alternate never re-allocate (a fresh output buffer costs a warm-up
//!   submit on hardware, rknpu-facts §2.6).
//! * Cache maintenance covers the bytes a submit exchanges with the device, not the buffers
//!   (the NPU is not coherent with the CPU caches, peer-facts §6): to the device the packed
//!   activation blocks, the regcmd and task bytes written, and each program's sentinel word;
//!   from the device each program's output block. Ranges are widened to whole cache lines and
//!   merged where they touch. The bytes synced and the bytes exchanged are counted per run
//!   ([`CoreResult::synced_bytes`], [`CoreResult::io_bytes`]). Where the interface syncs only
//!   whole buffers (`KernelInterface::syncs_whole_buffers`, `rocket`) the buffers themselves are
//!   kept small instead: every scratch buffer starts at one page and grows with need, and output
//!   buffers come by size class ([`ScratchSet`]).
//! * Where every core has its own address space (`KernelInterface::per_core_spaces`, `rocket`)
//!   each core's scratch lives in `KernelInterface::space_of(domain, core)` and a weight is one
//!   part per core ([`WeightPart`]); a program's weight offset is moved into its core's part.
//! * The core's mutex is held for the whole run of its share, so concurrent `mm_run`s from
//!   several threads serialise per core and never share scratch.
//! * A failed submit (timeout, reset, refusal) fails the run: no partial result is ever handed
//!   to the caller (it gets the cores' results only after every core succeeded).
//! * A job that reports done is not trusted (peer-facts §4: a submit can return success while
//!   the hardware never starts; completion bookkeeping once read a hole as success). Before
//!   each submit the last output word of every program ([`PlannedProgram::last_out_word`],
//!   written last by the matmul, rknpu-facts §2.5) is set to [`SENTINEL`] and cleaned to
//!   memory with the output buffer; after completion every one must have been overwritten and
//!   the task counter must equal the tasks submitted. Otherwise the job "never ran": it is
//!   counted ([`Health`]), logged once, submitted once more with fresh sentinels, and if it
//!   fails again the run fails with [`NpuError::NeverRan`] (the backend computes that matmul
//!   on the CPU and counts it).
//! * Warm-up submits on a cold output buffer and the ACT_RESET on entering int8 mode
//!   (rknpu-facts §2.6) belong to the kernel interfaces that talk to hardware (`kif::rknpu`,
//!   `kif::rocket`), not to this path.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use crate::npu::domain::DomainSet;
use crate::npu::kif::{job_flags, mem_flags, Bo, DomainId, Iova, KernelInterface, KifError, RknpuTask, SubmitJob, SyncDir};
use crate::npu::layout::{self, WeightGeometry};
use crate::npu::plan::{CorePlan, PlannedProgram, PlannedSubmit, SubmitIovas};
use crate::npu::{regcmd, regs};
use crate::npu::soc::SocDesc;
use crate::npu::NpuError;

/// Default submit timeout in ms (ork's `ORK_MM_TIMEOUT` default, rknpu-facts §9).
pub const DEFAULT_TIMEOUT_MS: u32 = 60_000;
/// What the host writes into each program's last output word before a submit (int32
/// 0x7fffffff, ork's doorbell sentinel, rknpu-facts §2.5). No int8 matmul result can equal it:
/// |Σ| ≤ K·128·128 and K per program is a 16-bit register field (DATAIN_CHANNEL), so
/// |Σ| ≤ 65535·16384 < 2³¹ − 1.
pub const SENTINEL: i32 = i32::MAX;
const _: () = assert!(65_535i64 * 128 * 128 < SENTINEL as i64);

/// Never-ran jobs seen by this `Npu` since it opened (all cores, all runs, failed ones too).
#[derive(Default)]
pub(crate) struct HealthCounters {
    pub never_ran: AtomicU64,
    pub retries: AtomicU64,
    pub gave_up: AtomicU64,
    pub warned: AtomicBool,
}

/// Cache maintenance of this `Npu` since it opened (all cores, the shares that completed):
/// bytes synced, and bytes the submits exchanged with the device (see [`CoreResult`]).
#[derive(Default)]
pub(crate) struct SyncCounters {
    pub synced_bytes: AtomicU64,
    pub io_bytes: AtomicU64,
}

/// A snapshot of [`HealthCounters`]: jobs that reported done but did not write their output
/// (or whose task counter came back short), resubmits, and runs failed after the resubmit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Health {
    pub never_ran: u64,
    pub retries: u64,
    pub gave_up: u64,
}

impl HealthCounters {
    pub(crate) fn snapshot(&self) -> Health {
        Health { never_ran: self.never_ran.load(Relaxed), retries: self.retries.load(Relaxed), gave_up: self.gave_up.load(Relaxed) }
    }
}

/// Initial activation scratch size (grown on demand).
const ACT_SCRATCH_INITIAL_BYTES: usize = 256 << 10;

/// Scratch of one core in one domain.
pub(crate) struct ScratchSet {
    regcmd: Bo,
    task: Bo,
}

impl ScratchSet {
    fn bos(&self) -> impl Iterator<Item = &Bo> {
        [&self.regcmd, &self.task].into_iter()
    }
}

#[derive(Default)]
pub(crate) struct CoreScratch {
    sets: HashMap<u32, ScratchSet>,
}

impl CoreScratch {
    /// Bytes of this core's scratch in every domain (regcmd and task buffers).
    pub(crate) fn bytes(&self) -> u64 {
        self.sets.values().flat_map(|s| s.bos()).map(|b| b.size_bytes as u64).sum::<u64>()
    }
}

/// Result buffers of one core's shares, handed back when the caller has read them (a
/// [`crate::npu::Shares`] dropped), so later runs reuse memory that is already mapped instead
/// of faulting in fresh buffers: the output buffers a share's submits wrote and the caller read
/// in place ([`CoreResult::outs`]). Locked apart from the core's scratch: a pipelined caller
/// hands back one piece's results while the core runs the next.
#[derive(Default)]
pub(crate) struct Spares {
    outs: Vec<Bo>,
}

/// Output buffers kept per core: one piece's submits (two weight terms) held while the next
/// piece's run, whose buffers come from here, writes its own.
const SPARE_OUTS: usize = 8;

impl Spares {
    /// Bytes held.
    pub(crate) fn bytes(&self) -> u64 {
        self.outs.iter().map(|b| b.size_bytes as u64).sum::<u64>()
    }

    /// The smallest spare output buffer of `domain` that holds `need` bytes (`exact`: of exactly
    /// that size, an [`out_class`] where every sync is of the whole buffer).
    fn take_out(&mut self, domain: DomainId, need: usize, exact: bool) -> Option<Bo> {
        let fits = |b: &Bo| b.domain == domain && if exact { b.size_bytes == need } else { b.size_bytes >= need };
        let (i, _) = self.outs.iter().enumerate().filter(|(_, b)| fits(b)).min_by_key(|(_, b)| b.size_bytes)?;
        Some(self.outs.remove(i))
    }

    /// Keeps a share's buffers for later runs of this core: past [`SPARE_OUTS`] output buffers
    /// the one given back longest ago is destroyed through `kif` (the smallest would be the one a
    /// decode run just returned: each new output buffer costs a warm-up job on hardware,
    /// rknpu-facts §2.6).
    pub(crate) fn give_back(&mut self, kif: &dyn KernelInterface, outs: Vec<Bo>) {
        self.outs.extend(outs);
        while self.outs.len() > SPARE_OUTS {
            destroy(kif, self.outs.remove(0), "destroying a spare NPU output buffer");
        }
    }

    /// The output buffers held, for their destruction.
    pub(crate) fn take_outs(&mut self) -> Vec<Bo> {
        std::mem::take(&mut self.outs)
    }
}

/// State shared by an `Npu`, its workers and its resident weights.
pub(crate) struct Shared {
    pub kif: Arc<dyn KernelInterface>,
    pub soc: SocDesc,
    pub cores: Vec<Mutex<CoreScratch>>,
    /// Each core's spare result buffers.
    pub spares: Vec<Mutex<Spares>>,
    /// Activation images ([`ImageLayout`]) by lease slot (the first core of a run's cores), per
    /// domain: one stable buffer each (rknpu-facts §2.6), locked for the whole run.
    pub images: Vec<Mutex<HashMap<u32, Bo>>>,
    pub domains: Mutex<DomainSet>,
    pub timeout_ms: u32,
    pub health: HealthCounters,
    pub synced: SyncCounters,
}

impl Shared {
    /// Keeps a share's buffers for later runs of `core` ([`Spares::give_back`]).
    pub(crate) fn give_back(&self, core: u32, outs: Vec<Bo>) {
        self.spares[core as usize].lock().unwrap_or_else(|p| p.into_inner()).give_back(&*self.kif, outs);
    }

    /// Sends `core`'s result of a run to the run's caller; one nobody receives (the caller is
    /// gone) gives its buffers back.
    pub(crate) fn send_result(&self, core: u32, tx: &std::sync::mpsc::Sender<Result<CoreResult, NpuError>>, r: Result<CoreResult, NpuError>) {
        if let Err(std::sync::mpsc::SendError(Ok(r))) = tx.send(r) {
            self.give_back(core, r.outs);
        }
    }

    /// Frees a stream slot's buffer and its IOVA room in domain `d` (`super::stream`).
    pub(crate) fn free_slot(&self, bo: Bo, d: DomainId) {
        let size = bo.size_bytes as u64;
        destroy(&*self.kif, bo, "freeing a stream slot");
        self.domains().release_unbudgeted(d, size);
    }

    /// The domain set, also after a panic while it was locked. `DomainSet`'s methods do their
    /// checks (indexing, sums) before they change anything, so a panic under the lock leaves the
    /// set consistent, and later uploads go on instead of failing on a poisoned mutex.
    pub(crate) fn domains(&self) -> std::sync::MutexGuard<'_, DomainSet> {
        self.domains.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        for c in &self.cores {
            let sets = std::mem::take(&mut c.lock().unwrap_or_else(|p| p.into_inner()).sets);
            for (_, s) in sets {
                for bo in [s.regcmd, s.task] {
                    destroy(&*self.kif, bo, "destroying NPU scratch");
                }
            }
        }
        for sp in &self.spares {
            for bo in sp.lock().unwrap_or_else(|p| p.into_inner()).take_outs() {
                destroy(&*self.kif, bo, "destroying a spare NPU output buffer");
            }
        }
        for slot in &self.images {
            for (_, bo) in std::mem::take(&mut *slot.lock().unwrap_or_else(|p| p.into_inner())) {
                destroy(&*self.kif, bo, "destroying an NPU activation image");
            }
        }
    }
}

/// One core's part of a weight where every core has its own address space
/// (`KernelInterface::per_core_spaces`): the blob ranges that core reads
/// ([`crate::npu::plan::core_parts`]), packed one after the other into a BO of its space.
pub(crate) struct WeightPart {
    pub bo: Bo,
    /// `(blob offset, len, offset in the part)`, in blob order.
    pub ranges: Vec<(usize, usize, usize)>,
}

impl WeightPart {
    /// The part's IOVA of blob byte `offset` (the start of a program's weights), if it holds it.
    pub fn iova_of(&self, offset: usize) -> Option<Iova> {
        let i = self.ranges.partition_point(|r| r.0 + r.1 <= offset);
        let &(o, l, p) = self.ranges.get(i)?;
        (o <= offset && offset < o + l).then(|| Iova(self.bo.iova.0 + (p + offset - o) as u32))
    }

    /// `sub` with every program's weight offset moved to where this part (of `core`) holds it.
    fn moved(&self, sub: &PlannedSubmit, core: u32) -> Result<PlannedSubmit, KifError> {
        let mut s = sub.clone();
        for prog in &mut s.programs {
            let at = self.iova_of(prog.weight_offset).ok_or_else(|| KifError::Invalid(format!("core {core}'s part does not hold weight byte {}", prog.weight_offset)))?;
            prog.weight_offset = (at.0 - self.bo.iova.0) as usize;
        }
        Ok(s)
    }
}

/// A resident weight: its tiled blob in one BO of one domain, or (per-core address spaces) one
/// part per core in that domain's spaces.
pub(crate) struct WeightInner {
    pub n: usize,
    pub k: usize,
    pub geom: WeightGeometry,
    pub bo: Option<Bo>,
    /// Per core `0..parts.len()` (empty unless the interface has per-core address spaces); the
    /// weight then runs on exactly these cores, `plan_at(.., parts.len(), 0)`.
    pub parts: Vec<Option<WeightPart>>,
    pub domain: DomainId,
    pub reserved_bytes: u64,
    pub shared: Arc<Shared>,
    /// The stream ring whose slot this is (`super::stream`, its free slots `super::slots`): the
    /// buffer goes back to it on drop.
    pub ring: Option<Arc<crate::npu::slots::RingInner>>,
}

impl WeightInner {
    /// Bytes of its buffers (page-rounded).
    pub fn bytes(&self) -> u64 {
        self.bo.iter().chain(self.parts.iter().flatten().map(|p| &p.bo)).map(|b| b.size_bytes as u64).sum()
    }
}

impl Drop for WeightInner {
    fn drop(&mut self) {
        if let Some(ring) = self.ring.take() {
            let slot = crate::npu::slots::Slot { bo: self.bo.take().map(|bo| (bo, self.domain)) };
            if let Some((bo, d)) = ring.give_back(slot).and_then(|s| s.bo) {
                self.shared.free_slot(bo, d);
            }
            return;
        }
        let parts = std::mem::take(&mut self.parts).into_iter().flatten().map(|p| p.bo);
        for bo in self.bo.take().into_iter().chain(parts) {
            if let Err(e) = self.shared.kif.mem_destroy(bo) {
                log::warn!("freeing resident weight N={} K={}: {e}", self.n, self.k);
            }
        }
        self.shared.domains().release(self.domain, self.reserved_bytes);
    }
}

/// Where one program's int32 block is: output buffer `out` of its share, at byte `offset`,
/// rows `m0..m0 + mc` (row stride its column segment's width), and the first K of its K-slice.
#[derive(Clone, Copy, Debug)]
pub(crate) struct OutBlock {
    pub out: usize,
    pub offset: usize,
    pub m0: usize,
    pub mc: usize,
    pub k0: usize,
}

/// What one core's share produced.
#[derive(Default)]
pub(crate) struct CoreResult {
    /// The output buffers the share's submits wrote, kept for the caller to read in place.
    pub outs: Vec<Bo>,
    /// Each column segment's blocks in `outs`, one per M-tile and K-slice.
    pub blocks: Vec<Vec<OutBlock>>,
    /// Wall time of the share's run on its core's thread.
    pub busy_ns: u64,
    /// Of `busy_ns`, the time inside the kernel interface's submits, and of that what went past
    /// the hardware time each submit reported (the kernel's round trip and the wake-up of this
    /// thread on a board; on the timed simulator, its completion past the modelled time).
    pub kif_ns: u64,
    pub late_ns: u64,
    pub submits: u32,
    pub programs: u32,
    pub device_ns: u64,
    /// Submits of this share detected as never ran, and resubmits.
    pub never_ran: u32,
    pub retries: u32,
    /// Bytes of cache maintenance (both directions, whole lines, the interface's own included).
    pub synced_bytes: u64,
    /// Bytes the submits exchanged with the device: activation blocks, regcmd and task bytes
    /// and sentinel words written, output blocks read.
    pub io_bytes: u64,
}

/// The output buffer class for `need` bytes (`ScratchSet::out_classes`): whole pages; up to 4
/// pages exactly, above that rounded up to a quarter of the power of two below it (at most 25 %
/// over the need, four classes per octave).
fn out_class(need: usize) -> usize {
    let page = crate::npu::kif::PAGE_BYTES;
    let p = need.div_ceil(page).max(1);
    if p <= 4 {
        return p * page;
    }
    let step = 1usize << (usize::BITS - 1 - p.leading_zeros() - 2);
    p.div_ceil(step) * step * page
}

/// An output buffer of `core` in `domain` for a submit that writes `out_bytes`: a spare one that
/// holds them, else a new one of their [`out_class`] (where every sync is of the whole buffer, a
/// spare only of exactly that class).
fn out_buffer(shared: &Shared, core: u32, domain: DomainId, out_bytes: usize) -> Result<Bo, KifError> {
    let kif = &*shared.kif;
    let whole = kif.syncs_whole_buffers();
    let need = out_class(out_bytes);
    let spare = shared.spares[core as usize].lock().unwrap_or_else(|p| p.into_inner()).take_out(domain, if whole { need } else { out_bytes }, whole);
    match spare {
        Some(bo) => Ok(bo),
        None => kif.mem_create(need, mem_flags::DATA, domain),
    }
}

/// Destroys `bo` through `kif`; a failure is logged as a warning about `what`.
fn destroy(kif: &dyn KernelInterface, bo: Bo, what: &str) {
    if let Err(e) = kif.mem_destroy(bo) {
        log::warn!("{what}: {e}");
    }
}

/// Makes `bo` hold at least `needed` bytes: a buffer of exactly the page-rounded need when it
/// is smaller, else nothing (never shrunk, so alternating shapes do not re-allocate).
fn grow(kif: &dyn KernelInterface, bo: &mut Bo, needed: usize, domain: DomainId) -> Result<(), KifError> {
    grow_with(kif, bo, needed, domain, mem_flags::DATA)
}

/// [`grow`] with the buffer's memory flags.
fn grow_with(kif: &dyn KernelInterface, bo: &mut Bo, needed: usize, domain: DomainId, flags: u32) -> Result<(), KifError> {
    if bo.size_bytes >= needed {
        return Ok(());
    }
    let fresh = kif.mem_create(crate::npu::kif::page_round(needed), flags, domain)?;
    let old = std::mem::replace(bo, fresh);
    kif.mem_destroy(old)
}

/// A core's scratch in one domain (`domain`: the core's address space). The regcmd and task
/// buffers start at one page and grow with the longest chain, like the activation and output
/// buffers: where the driver syncs only whole buffers (`rocket`), a buffer sized for
/// [`MAX_CHAIN_PROGRAMS`] programs would cost ~900 KiB of cache maintenance per submit.
fn new_set(kif: &dyn KernelInterface, domain: DomainId) -> Result<ScratchSet, KifError> {
    let regcmd = kif.mem_create(crate::npu::kif::PAGE_BYTES, mem_flags::DATA, domain)?;
    let task = kif.mem_create(crate::npu::kif::PAGE_BYTES, mem_flags::TASK, domain)?;
    Ok(ScratchSet { regcmd, task })
}

/// Creates the scratch sets of cores `0..cores` in `domain` if missing (core `c`'s in
/// `KernelInterface::space_of(domain, c)`). Called when a domain receives its first weight, while
/// it still has room (ork pre-allocates scratch the same way).
pub(crate) fn ensure_scratch(shared: &Shared, domain: DomainId, cores: u32) -> Result<(), KifError> {
    for (i, c) in shared.cores[..cores as usize].iter().enumerate() {
        let mut g = c.lock().unwrap_or_else(|p| p.into_inner());
        if let std::collections::hash_map::Entry::Vacant(e) = g.sets.entry(domain.0) {
            e.insert(new_set(&*shared.kif, shared.kif.space_of(domain, i as u32))?);
        }
    }
    // Lease slot 0's activation image in every core's space.
    let mut g = shared.images[0].lock().unwrap_or_else(|p| p.into_inner());
    for c in 0..cores {
        let space = shared.kif.space_of(domain, c);
        if let std::collections::hash_map::Entry::Vacant(e) = g.entry(space.0) {
            e.insert(shared.kif.mem_create(image_initial_bytes(&*shared.kif), mem_flags::DATA, space)?);
        }
    }
    Ok(())
}

/// Runs one core's share of a plan.
///
/// `img`: the run's activation image, packed and synced by the caller ([`fill_image`]); with a
/// `gate` it may still be being written, and the first submit waits for it. Returns the core's
/// int32 result over its column segments (in its output buffers, or `[M][plan.ncols]`).
pub(crate) fn run_core(shared: &Shared, w: &WeightInner, img: &ImageAt, m: usize, plan: &CorePlan, gate: Option<&Gate>) -> Result<CoreResult, NpuError> {
    let mut res = CoreResult::default();
    let t0 = std::time::Instant::now();
    // A panic fails the share like an error (its buffers back to the spares), so no caller
    // unwinds while other cores still read the activation image it holds.
    let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run_core_into(shared, w, img, m, plan, gate, &mut res)));
    let run = run.unwrap_or_else(|_| Err(NpuError::Kif(KifError::Invalid(format!("NPU core {} share panicked", plan.core)))));
    match run {
        Ok(()) => {
            res.busy_ns = t0.elapsed().as_nanos() as u64;
            Ok(res)
        }
        Err(e) => {
            // A failed share's buffers go back to the core's spares (nothing of it is read).
            shared.give_back(plan.core, std::mem::take(&mut res.outs));
            Err(e)
        }
    }
}

/// [`run_core`] into `res`, which holds the buffers taken so far when it fails.
fn run_core_into(shared: &Shared, w: &WeightInner, img: &ImageAt, m: usize, plan: &CorePlan, mut gate: Option<&Gate>, res: &mut CoreResult) -> Result<(), NpuError> {
    let kif = &*shared.kif;
    let (k, n) = (w.k, w.n);
    let core = plan.core;
    // Scratch is kept per (core, domain); its buffers and the job live in the core's space.
    let domain = kif.space_of(w.domain, core);
    let sub_err = |source: KifError| NpuError::Submit { op: "mm_run", m, k, n, core, source };
    let mut guard = shared.cores[core as usize].lock().unwrap_or_else(|p| p.into_inner());
    if let std::collections::hash_map::Entry::Vacant(e) = guard.sets.entry(w.domain.0) {
        e.insert(new_set(kif, domain).map_err(sub_err)?);
    }
    // Every program writes its int32 block (a K-split: its K-slice's partial), which the caller
    // reads where the NPU wrote it (each submit into an output buffer of its own, handed to the
    // caller with the result; the caller adds a K-split's partials).
    let set = guard.sets.get_mut(&w.domain.0).expect("scratch set");
    res.blocks = vec![Vec::new(); plan.segs.len()];
    // The weights' base: the blob's BO, or this core's part, with every program's weight offset
    // moved to where the part holds it.
    let part = if w.parts.is_empty() || plan.submits.is_empty() {
        None
    } else {
        let missing = || sub_err(KifError::Invalid(format!("core {core} holds no part of this weight")));
        Some(w.parts.get(core as usize).and_then(Option::as_ref).ok_or_else(missing)?)
    };
    let w_iova = match (part, &w.bo) {
        (Some(p), _) => p.bo.iova,
        (None, Some(bo)) => bo.iova,
        (None, None) => Iova(0), // a core with nothing to run
    };
    for sub in &plan.submits {
        let moved;
        let sub = match part {
            None => sub,
            Some(p) => {
                moved = p.moved(sub, core).map_err(sub_err)?;
                &moved
            }
        };
        res.outs.push(out_buffer(shared, core, domain, sub.out_bytes).map_err(sub_err)?);
        let out_bo = res.outs.last_mut().expect("just pushed");
        grow(kif, &mut set.regcmd, sub.programs.len() * regcmd::PROGRAM_BYTES, domain).map_err(sub_err)?;
        // Programs, chained, reading their activation blocks in the image (its copy in this
        // core's space), and their task descriptors.
        let at = SubmitIovas { act: img.iova_in(domain), weights: w_iova, out: out_bo.iova, regcmd: set.regcmd.iova };
        let entries = sub.regcmd_at(&at, shared.soc.pc_data_amount_scale, |ab| img.layout.offset(ab))?;
        let nprogs = sub.programs.len();
        if log::log_enabled!(target: "ork::regcmd", log::Level::Trace) {
            log::trace!(target: "ork::regcmd", "core {core} submit of {nprogs} programs:\n{}", crate::npu::regs::decode(&entries));
        }
        let (synced, written) = write_programs(kif, set, &entries, nprogs, domain).map_err(sub_err)?;
        res.synced_bytes += synced;
        res.io_bytes += written;
        let out_io: usize = sub.programs.iter().map(|p| p.mc * p.nc * 4 + 4).sum();
        let job = SubmitJob {
            task_bo: &set.task,
            task_start: 0,
            task_number: nprogs as u32,
            core_mask: 1 << core,
            domain,
            flags: job_flags::PC | job_flags::PINGPONG,
            timeout_ms: shared.timeout_ms,
        };
        if gate.take().is_some_and(|g| !g.wait()) {
            return Err(sub_err(KifError::Invalid("the activation image was not written".into())));
        }
        let mut attempt = 0;
        loop {
            arm_sentinels(out_bo.bytes_mut(), &sub.programs);
            res.synced_bytes +=
                sync_spans(kif, out_bo, SyncDir::ToDevice, sub.programs.iter().map(|p| (p.last_out_word(), 4))).map_err(sub_err)?;
            let ts = std::time::Instant::now();
            let done = kif.submit(&job).map_err(sub_err)?;
            let in_kif = ts.elapsed().as_nanos() as u64;
            res.kif_ns += in_kif;
            res.late_ns += in_kif.saturating_sub(done.hw_elapse_ns);
            res.synced_bytes +=
                sync_spans(kif, out_bo, SyncDir::FromDevice, sub.programs.iter().map(|p| (p.out_offset, p.mc * p.nc * 4))).map_err(sub_err)?;
            res.synced_bytes += done.synced_bytes as u64;
            res.io_bytes += out_io as u64;
            res.device_ns += done.hw_elapse_ns;
            let missing = unlanded(out_bo.bytes(), &sub.programs);
            if done.task_counter == job.task_number && missing == 0 {
                break;
            }
            shared.health.never_ran.fetch_add(1, Relaxed);
            res.never_ran += 1;
            let what = format!(
                "the job reported done but {missing} of {nprogs} programs left their output unwritten (task counter {} of {nprogs})",
                done.task_counter
            );
            if attempt == 1 {
                shared.health.gave_up.fetch_add(1, Relaxed);
                return Err(NpuError::NeverRan { op: "mm_run", m, k, n, core, what });
            }
            if !shared.health.warned.swap(true, Relaxed) {
                log::warn!("NPU core {core}: {what}; resubmitting once (later cases are counted in the exit line, not logged)");
            }
            shared.health.retries.fetch_add(1, Relaxed);
            res.retries += 1;
            attempt += 1;
        }
        let at = res.outs.len() - 1;
        for p in &sub.programs {
            let j = plan.segs.iter().position(|s| s.col0 == p.col0).expect("a program's column segment");
            res.blocks[j].push(OutBlock { out: at, offset: p.out_offset, m0: p.m0, mc: p.mc, k0: p.k0 });
        }
        res.submits += 1;
        res.programs += nprogs as u32;
    }
    shared.synced.synced_bytes.fetch_add(res.synced_bytes, Relaxed);
    shared.synced.io_bytes.fetch_add(res.io_bytes, Relaxed);
    Ok(())
}

/// Writes a submit's `nprogs` chained programs (`entries`, already at the regcmd buffer's
/// address) into the core's regcmd buffer and their task descriptors into its task buffer, and
/// syncs both to the device. Returns the bytes synced and the bytes written.
fn write_programs(kif: &dyn KernelInterface, set: &mut ScratchSet, entries: &[regs::RegCmd], nprogs: usize, domain: DomainId) -> Result<(u64, u64), KifError> {
    let bytes = regcmd::to_bytes(entries);
    set.regcmd.bytes_mut()[..bytes.len()].copy_from_slice(&bytes);
    let tsize = std::mem::size_of::<RknpuTask>();
    grow_with(kif, &mut set.task, nprogs * tsize, domain, mem_flags::TASK)?;
    let regcmd_iova = u64::from(set.regcmd.iova.0);
    let tbytes = set.task.bytes_mut();
    for i in 0..nprogs {
        let t = RknpuTask {
            enable_mask: regcmd::OP_ENABLE_MATMUL,
            int_mask: regcmd::INT_MASK_DPU,
            int_clear: regcmd::INT_CLEAR_ALL,
            regcfg_amount: regcmd::BODY_ENTRIES as u32,
            regcmd_addr: regcmd_iova + (i * regcmd::PROGRAM_BYTES) as u64,
            ..RknpuTask::default()
        };
        tbytes[i * tsize..(i + 1) * tsize].copy_from_slice(bytemuck::bytes_of(&t));
    }
    let synced = sync_spans(kif, &set.regcmd, SyncDir::ToDevice, [(0, bytes.len())].into_iter())?
        + sync_spans(kif, &set.task, SyncDir::ToDevice, [(0, nprogs * tsize)].into_iter())?;
    Ok((synced, (bytes.len() + nprogs * tsize) as u64))
}

/// Where a run's activation blocks sit in its activation image: for every distinct K range
/// `(k0, kp)` the plan's programs read, a region `[M][kp]` row-major int8 (a program's block of
/// rows `m0..m0+mc` is then contiguous, as the flat layout needs, rknpu-facts §3.1); a full-K
/// plan's image is A itself. Packed once per run by the caller and read by every core, instead
/// of each core packing its blocks into a buffer of its own.
pub(crate) struct ImageLayout {
    /// `(k0, kp, base)`, sorted by `k0`.
    regions: Vec<(usize, usize, usize)>,
    m: usize,
    /// Bytes of the image.
    pub bytes: usize,
}

impl ImageLayout {
    /// The layout of `plan`'s activation blocks over `m` rows.
    pub(crate) fn of(plan: &crate::npu::plan::Plan) -> ImageLayout {
        let mut ranges: Vec<(usize, usize)> = plan.cores.iter().flat_map(|c| &c.submits).flat_map(|s| &s.a_blocks).map(|(ab, _)| (ab.k0, ab.kp)).collect();
        ranges.sort_unstable();
        ranges.dedup();
        let mut bytes = 0;
        let regions = ranges
            .into_iter()
            .map(|(k0, kp)| {
                let base = bytes;
                bytes += (plan.m * kp).div_ceil(64) * 64;
                (k0, kp, base)
            })
            .collect();
        ImageLayout { regions, m: plan.m, bytes }
    }

    /// Byte offset of block `ab` in the image.
    pub(crate) fn offset(&self, ab: &layout::ABlock) -> usize {
        let &(_, _, base) = self.regions.iter().find(|r| (r.0, r.1) == (ab.k0, ab.kp)).expect("a planned K range");
        base + ab.m0 * ab.kp
    }

    /// Packs `a: [M, K]` row-major into `dst` (≥ [`ImageLayout::bytes`]).
    pub(crate) fn pack(&self, a: &[i8], k: usize, dst: &mut [u8]) {
        for &(k0, kp, base) in &self.regions {
            layout::pack_a_fast(a, k, &layout::ABlock { m0: 0, mc: self.m, k0, kp }, &mut dst[base..base + self.m * kp]);
        }
    }
}

/// A run's activation image as the cores see it: its layout, and its device address in each
/// core's address space (one image read by every core where they share a space; a copy in each
/// core's space where every core has its own, `rocket`).
pub(crate) struct ImageAt {
    /// `(space, address)` of each copy's buffer.
    pub iovas: Vec<(u32, Iova)>,
    pub layout: ImageLayout,
    /// Where in the buffers this image starts (a piece of a run of pieces, `Npu::mm_run_pieces`:
    /// each piece's rows in a region of one stable buffer).
    pub base: usize,
}

impl ImageAt {
    /// The image's address in address space `space` (a core's, `KernelInterface::space_of`).
    pub(crate) fn iova_in(&self, space: DomainId) -> Iova {
        let at = self.iovas.iter().find(|(s, _)| *s == space.0).expect("an image in every core's space").1;
        Iova(at.0 + self.base as u32)
    }
}

/// The lease slot's images (by address space), locked for a run.
pub(crate) type ImageGuard<'s> = std::sync::MutexGuard<'s, HashMap<u32, Bo>>;

/// An activation image's first size: one page where syncs are of whole buffers (`rocket`).
fn image_initial_bytes(kif: &dyn KernelInterface) -> usize {
    if kif.syncs_whole_buffers() {
        crate::npu::kif::PAGE_BYTES
    } else {
        ACT_SCRATCH_INITIAL_BYTES
    }
}

/// The activation image of a run in lease slot `slot`: its buffer in the address space of each
/// of `cores` (grown to the layout's size, never shrunk), not yet written ([`fill_image`]).
/// Returns the guard holding the slot (the run keeps it until every core is done) and where
/// the images are: the cores can build their submits while the image is filled.
pub(crate) fn image_for<'s>(shared: &'s Shared, slot: u32, domain: DomainId, cores: &[u32], layout: ImageLayout) -> Result<(ImageGuard<'s>, ImageAt), KifError> {
    let (g, iovas) = image_space(shared, slot, domain, cores, layout.bytes)?;
    Ok((g, ImageAt { iovas, layout, base: 0 }))
}

/// The image buffers of lease slot `slot` for `cores` in `domain`, each of at least `bytes`
/// (grown, never shrunk), locked: `(space, address)` of each.
pub(crate) fn image_space<'s>(shared: &'s Shared, slot: u32, domain: DomainId, cores: &[u32], bytes: usize) -> Result<(ImageGuard<'s>, Vec<(u32, Iova)>), KifError> {
    let kif = &*shared.kif;
    let mut g = shared.images[slot as usize].lock().unwrap_or_else(|p| p.into_inner());
    let mut spaces: Vec<u32> = cores.iter().map(|&c| kif.space_of(domain, c).0).collect();
    spaces.sort_unstable();
    spaces.dedup();
    let mut iovas = Vec::with_capacity(spaces.len());
    for space in spaces {
        let d = DomainId(space);
        let bo = match g.entry(space) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => e.insert(kif.mem_create(image_initial_bytes(kif), mem_flags::DATA, d)?),
        };
        grow(kif, bo, bytes, d)?;
        iovas.push((space, bo.iova));
    }
    Ok((g, iovas))
}

/// Packs `a: [M, K]` into the images of [`image_for`] (at the image's `base`) and syncs those
/// bytes to the device. Returns the bytes synced and exchanged.
pub(crate) fn fill_image(shared: &Shared, g: &mut ImageGuard<'_>, at: &ImageAt, a: &[i8], k: usize) -> Result<(u64, u64), KifError> {
    let (mut synced, mut io) = (0u64, 0u64);
    let (base, len) = (at.base, at.layout.bytes);
    for &(space, _) in &at.iovas {
        let bo = g.get_mut(&space).expect("an image of image_for");
        at.layout.pack(a, k, &mut bo.bytes_mut()[base..base + len]);
        synced += sync_spans(&*shared.kif, bo, SyncDir::ToDevice, [(base, len)].into_iter())?;
        io += len as u64;
    }
    Ok((synced, io))
}

/// When a run's activation image is written: the cores started before it wait here before
/// their first submit. Opened once, by [`GateOpener`] (dropped unopened: as failed).
#[derive(Default)]
pub(crate) struct Gate {
    state: Mutex<Option<bool>>,
    cv: std::sync::Condvar,
}

impl Gate {
    /// Whether the image was written (blocks until the gate opens).
    pub(crate) fn wait(&self) -> bool {
        let mut g = self.state.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(ok) = *g {
                return ok;
            }
            g = self.cv.wait(g).unwrap_or_else(|p| p.into_inner());
        }
    }

    fn open(&self, ok: bool) {
        let mut g = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if g.is_none() {
            *g = Some(ok);
            self.cv.notify_all();
        }
    }
}

/// Opens its [`Gate`]: [`GateOpener::open`] with the image's outcome, or as failed when
/// dropped first (a caller unwinding never leaves a core waiting).
pub(crate) struct GateOpener(pub Arc<Gate>);

impl GateOpener {
    pub(crate) fn open(&self, ok: bool) {
        self.0.open(ok);
    }
}

impl Drop for GateOpener {
    fn drop(&mut self) {
        self.0.open(false);
    }
}

/// Syncs the byte spans `(offset, len)` of `bo` in one direction: each widened to whole cache
/// lines, sorted, and merged where lines touch or overlap, one `mem_sync` per merged run.
/// Returns the bytes the interface maintained.
fn sync_spans(kif: &dyn KernelInterface, bo: &Bo, dir: SyncDir, spans: impl Iterator<Item = (usize, usize)>) -> Result<u64, KifError> {
    let mut lines: Vec<(usize, usize)> =
        spans.filter(|&(_, len)| len > 0).map(|(off, len)| crate::npu::kif::line_span(off, len, bo.size_bytes)).collect();
    lines.sort_unstable();
    let mut merged: Vec<(usize, usize)> = Vec::with_capacity(lines.len());
    for (s, e) in lines {
        match merged.last_mut() {
            Some(last) if s <= last.1 => last.1 = last.1.max(e),
            _ => merged.push((s, e)),
        }
    }
    let mut n = 0u64;
    for (s, e) in merged {
        n += kif.mem_sync(bo, dir, s, e - s)? as u64;
    }
    Ok(n)
}

/// Writes [`SENTINEL`] into the last output word of each program.
fn arm_sentinels(out: &mut [u8], programs: &[PlannedProgram]) {
    for p in programs {
        let o = p.last_out_word();
        out[o..o + 4].copy_from_slice(&SENTINEL.to_le_bytes());
    }
}

/// Programs whose last output word still holds [`SENTINEL`]: they never wrote their output.
fn unlanded(out: &[u8], programs: &[PlannedProgram]) -> usize {
    programs.iter().filter(|p| out[p.last_out_word()..p.last_out_word() + 4] == SENTINEL.to_le_bytes()).count()
}

#[cfg(test)]
mod tests {
    use super::{out_class, Gate, GateOpener};
    use std::sync::Arc;
    const P: usize = crate::npu::kif::PAGE_BYTES;

    /// A core waiting for the image goes on when it is written, and fails (never hangs) when
    /// the run that was to write it gave up or unwound first.
    #[test]
    fn a_gate_opens_once_and_a_dropped_opener_fails_the_waiters() {
        for written in [Some(true), Some(false), None] {
            let opener = GateOpener(Arc::new(Gate::default()));
            let waiters: Vec<_> = (0..2)
                .map(|_| {
                    let g = opener.0.clone();
                    std::thread::spawn(move || g.wait())
                })
                .collect();
            std::thread::sleep(std::time::Duration::from_millis(20));
            if let Some(ok) = written {
                opener.open(ok);
                opener.open(!ok); // the first outcome stands
            }
            drop(opener);
            for w in waiters {
                assert_eq!(w.join().unwrap(), written == Some(true), "{written:?}");
            }
        }
    }

    #[test]
    fn output_classes_hold_the_need_within_a_quarter() {
        assert_eq!(out_class(0), P);
        assert_eq!(out_class(3 * P + 1), 4 * P);
        assert_eq!(out_class(5 * P), 5 * P);
        assert_eq!(out_class(9 * P + 1), 10 * P);
        assert_eq!(out_class(1000 * P), 1024 * P);
        for need in (1..20_000).map(|i| i * 997) {
            let c = out_class(need);
            assert!(c >= need && c % P == 0 && (c as f64) <= 1.25 * need.div_ceil(P).max(1) as f64 * P as f64, "{need} -> {c}");
        }
    }
}
