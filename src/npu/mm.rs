//! Execution of a plan: pack → regcmd → submit → wait → accumulate, one NPU core at a time.
//!
//! What it owns: the per-core, per-IOMMU-domain scratch buffers (regcmd, task array, activation,
//! output; rknpu-facts §5: each core has its own) and the walk of one core's submits. Every run
//! goes through the kernel interface: the activation blocks are packed into the activation BO,
//! the programs are synthesised into the regcmd BO and PC-chained, the task descriptors written,
//! the buffers synced, the job submitted on `core_mask = 1 << core` in the weight's domain, the
//! output BO synced back and every program's int32 block added into the core's local result.
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
//!   ([`CoreResult::synced_bytes`], [`CoreResult::io_bytes`]).
//! * The core's mutex is held for the whole run of its share, so concurrent `mm_run`s from
//!   several threads serialise per core and never share scratch.
//! * A failed submit (timeout, reset, refusal) fails the run: no partial result is ever
//!   accumulated into the caller's C (the caller merges only after every core succeeded).
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
use crate::npu::plan::{CorePlan, PlannedProgram, SubmitIovas, MAX_CHAIN_PROGRAMS};
use crate::npu::regcmd;
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

/// Initial activation / output scratch sizes (grown on demand).
const ACT_SCRATCH_INITIAL_BYTES: usize = 256 << 10;
const OUT_SCRATCH_INITIAL_BYTES: usize = 1 << 20;

/// Scratch of one core in one domain.
pub(crate) struct ScratchSet {
    regcmd: Bo,
    task: Bo,
    act: Bo,
    out: Bo,
}

#[derive(Default)]
pub(crate) struct CoreScratch {
    sets: HashMap<u32, ScratchSet>,
    /// The host-side int32 result of the core's last share ([`CoreResult::local`]), handed back
    /// after the caller copied it out ([`CoreScratch::give_back`]) so the next run writes into
    /// memory that is already mapped instead of faulting in a fresh buffer.
    local: Vec<i32>,
}

impl CoreScratch {
    /// Bytes of this core's scratch in every domain (regcmd, task, activation, output buffers)
    /// and its host-side result buffer.
    pub(crate) fn bytes(&self) -> u64 {
        self.sets.values().flat_map(|s| [&s.regcmd, &s.task, &s.act, &s.out]).map(|b| b.size_bytes as u64).sum::<u64>()
            + (self.local.capacity() * 4) as u64
    }

    /// Keeps `local` (a share's result, copied out) for the next run of this core.
    pub(crate) fn give_back(&mut self, local: Vec<i32>) {
        if local.capacity() > self.local.capacity() {
            self.local = local;
        }
    }
}

/// State shared by an `Npu`, its workers and its resident weights.
pub(crate) struct Shared {
    pub kif: Arc<dyn KernelInterface>,
    pub soc: SocDesc,
    pub cores: Vec<Mutex<CoreScratch>>,
    pub domains: Mutex<DomainSet>,
    pub timeout_ms: u32,
    pub health: HealthCounters,
    pub synced: SyncCounters,
}

impl Shared {
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
                for bo in [s.regcmd, s.task, s.act, s.out] {
                    if let Err(e) = self.kif.mem_destroy(bo) {
                        log::warn!("destroying NPU scratch: {e}");
                    }
                }
            }
        }
    }
}

/// A resident weight: its tiled blob in one BO of one domain.
pub(crate) struct WeightInner {
    pub n: usize,
    pub k: usize,
    pub geom: WeightGeometry,
    pub bo: Option<Bo>,
    pub domain: DomainId,
    pub reserved_bytes: u64,
    pub shared: Arc<Shared>,
    /// The stream ring whose slot this is (`super::stream`): the buffer goes back to it on drop.
    pub ring: Option<Arc<crate::npu::stream::RingInner>>,
}

impl WeightInner {
    pub fn iova(&self) -> Iova {
        self.bo.as_ref().expect("live weight").iova
    }
}

impl Drop for WeightInner {
    fn drop(&mut self) {
        if let Some(ring) = self.ring.take() {
            let slot = crate::npu::stream::Slot { bo: self.bo.take().map(|bo| (bo, self.domain)) };
            if let Some((bo, d)) = ring.give_back(slot).and_then(|s| s.bo) {
                let size = bo.size_bytes as u64;
                if let Err(e) = self.shared.kif.mem_destroy(bo) {
                    log::warn!("freeing a stream slot: {e}");
                }
                self.shared.domains().release_unbudgeted(d, size);
            }
            return;
        }
        if let Some(bo) = self.bo.take() {
            if let Err(e) = self.shared.kif.mem_destroy(bo) {
                log::warn!("freeing resident weight N={} K={}: {e}", self.n, self.k);
            }
        }
        self.shared.domains().release(self.domain, self.reserved_bytes);
    }
}

/// What one core's share produced.
pub(crate) struct CoreResult {
    /// `[M][ncols]` row-major i32 over the core's column segments.
    pub local: Vec<i32>,
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

/// Makes `bo` hold at least `needed` bytes: a buffer of exactly the page-rounded need when it
/// is smaller, else nothing (never shrunk, so alternating shapes do not re-allocate).
fn grow(kif: &dyn KernelInterface, bo: &mut Bo, needed: usize, domain: DomainId) -> Result<(), KifError> {
    if bo.size_bytes >= needed {
        return Ok(());
    }
    let fresh = kif.mem_create(crate::npu::kif::page_round(needed), mem_flags::DATA, domain)?;
    let old = std::mem::replace(bo, fresh);
    kif.mem_destroy(old)
}

fn new_set(kif: &dyn KernelInterface, domain: DomainId) -> Result<ScratchSet, KifError> {
    let regcmd = kif.mem_create(MAX_CHAIN_PROGRAMS * regcmd::PROGRAM_BYTES, mem_flags::DATA, domain)?;
    let task = kif.mem_create(MAX_CHAIN_PROGRAMS * std::mem::size_of::<RknpuTask>(), mem_flags::TASK, domain)?;
    let act = kif.mem_create(ACT_SCRATCH_INITIAL_BYTES, mem_flags::DATA, domain)?;
    let out = kif.mem_create(OUT_SCRATCH_INITIAL_BYTES, mem_flags::DATA, domain)?;
    Ok(ScratchSet { regcmd, task, act, out })
}

/// Creates the scratch sets of cores `0..cores` in `domain` if missing. Called when a domain
/// receives its first weight, while it still has room (ork pre-allocates scratch the same way).
pub(crate) fn ensure_scratch(shared: &Shared, domain: DomainId, cores: u32) -> Result<(), KifError> {
    for c in &shared.cores[..cores as usize] {
        let mut g = c.lock().unwrap_or_else(|p| p.into_inner());
        if let std::collections::hash_map::Entry::Vacant(e) = g.sets.entry(domain.0) {
            e.insert(new_set(&*shared.kif, domain)?);
        }
    }
    Ok(())
}

/// Runs one core's share of a plan.
///
/// `a`: `[M, K]` row-major i8 (the caller's whole activation matrix). Returns the core's
/// `[M][plan.ncols]` int32 result over its column segments.
pub(crate) fn run_core(shared: &Shared, w: &WeightInner, a: &[i8], m: usize, plan: &CorePlan) -> Result<CoreResult, NpuError> {
    let kif = &*shared.kif;
    let (k, n) = (w.k, w.n);
    let core = plan.core;
    let domain = w.domain;
    let sub_err = |source: KifError| NpuError::Submit { op: "mm_run", m, k, n, core, source };
    let mut guard = shared.cores[core as usize].lock().unwrap_or_else(|p| p.into_inner());
    if let std::collections::hash_map::Entry::Vacant(e) = guard.sets.entry(domain.0) {
        e.insert(new_set(kif, domain).map_err(sub_err)?);
    }
    // Every output word of the share is written by a program; a K-split share adds its K-slices'
    // partials, so it starts from zeros, and every other share copies each block in.
    let ksplit = plan.submits.iter().flat_map(|s| &s.programs).any(|p| p.k0 != 0);
    let mut local = std::mem::take(&mut guard.local);
    local.resize(m * plan.ncols, 0);
    if ksplit {
        local.fill(0);
    }
    let set = guard.sets.get_mut(&domain.0).expect("scratch set");
    let mut res = CoreResult {
        local,
        submits: 0,
        programs: 0,
        device_ns: 0,
        never_ran: 0,
        retries: 0,
        synced_bytes: 0,
        io_bytes: 0,
    };
    let w_iova = w.iova();
    for sub in &plan.submits {
        grow(kif, &mut set.act, sub.act_bytes, domain).map_err(sub_err)?;
        grow(kif, &mut set.out, sub.out_bytes, domain).map_err(sub_err)?;
        // Activations.
        let act = set.act.bytes_mut();
        for (ab, off) in &sub.a_blocks {
            layout::pack_a_fast(a, k, ab, &mut act[*off..*off + ab.bytes()]);
        }
        // Programs, chained, and their task descriptors.
        let at = SubmitIovas { act: set.act.iova, weights: w_iova, out: set.out.iova, regcmd: set.regcmd.iova };
        let entries = sub.regcmd(&at, shared.soc.pc_data_amount_scale)?;
        let nprogs = sub.programs.len();
        let bytes = regcmd::to_bytes(&entries);
        set.regcmd.bytes_mut()[..bytes.len()].copy_from_slice(&bytes);
        let tsize = std::mem::size_of::<RknpuTask>();
        let tbytes = set.task.bytes_mut();
        for i in 0..nprogs {
            let t = RknpuTask {
                enable_mask: regcmd::OP_ENABLE_MATMUL,
                int_mask: regcmd::INT_MASK_DPU,
                int_clear: regcmd::INT_CLEAR_ALL,
                regcfg_amount: regcmd::BODY_ENTRIES as u32,
                regcmd_addr: u64::from(at.regcmd.0) + (i * regcmd::PROGRAM_BYTES) as u64,
                ..RknpuTask::default()
            };
            tbytes[i * tsize..(i + 1) * tsize].copy_from_slice(bytemuck::bytes_of(&t));
        }
        if log::log_enabled!(target: "ork::regcmd", log::Level::Trace) {
            log::trace!(target: "ork::regcmd", "core {core} submit of {nprogs} programs:\n{}", crate::npu::regs::decode(&entries));
        }
        let act_io: usize = sub.a_blocks.iter().map(|(ab, _)| ab.bytes()).sum();
        res.synced_bytes += sync_spans(kif, &set.act, SyncDir::ToDevice, sub.a_blocks.iter().map(|(ab, off)| (*off, ab.bytes()))).map_err(sub_err)?;
        res.synced_bytes += sync_spans(kif, &set.regcmd, SyncDir::ToDevice, [(0, bytes.len())].into_iter()).map_err(sub_err)?;
        res.synced_bytes += sync_spans(kif, &set.task, SyncDir::ToDevice, [(0, nprogs * tsize)].into_iter()).map_err(sub_err)?;
        res.io_bytes += (act_io + bytes.len() + nprogs * tsize) as u64;
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
        let mut attempt = 0;
        loop {
            arm_sentinels(set.out.bytes_mut(), &sub.programs);
            res.synced_bytes +=
                sync_spans(kif, &set.out, SyncDir::ToDevice, sub.programs.iter().map(|p| (p.last_out_word(), 4))).map_err(sub_err)?;
            let done = kif.submit(&job).map_err(sub_err)?;
            res.synced_bytes +=
                sync_spans(kif, &set.out, SyncDir::FromDevice, sub.programs.iter().map(|p| (p.out_offset, p.mc * p.nc * 4))).map_err(sub_err)?;
            res.synced_bytes += done.synced_bytes as u64;
            res.io_bytes += out_io as u64;
            res.device_ns += done.hw_elapse_ns;
            let missing = unlanded(set.out.bytes(), &sub.programs);
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
        let out = set.out.bytes();
        for p in &sub.programs {
            let block = if ksplit { layout::add_c_block } else { layout::copy_c_block };
            block(&out[p.out_offset..], p.mc, p.nc, p.nc, &mut res.local, plan.ncols, p.m0, p.col0);
        }
        res.submits += 1;
        res.programs += nprogs as u32;
    }
    shared.synced.synced_bytes.fetch_add(res.synced_bytes, Relaxed);
    shared.synced.io_bytes.fetch_add(res.io_bytes, Relaxed);
    Ok(res)
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
