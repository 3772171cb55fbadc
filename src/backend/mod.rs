//! The ggml device "ORK" in safe Rust: how it opens, which MUL_MATs it accepts, how a weight
//! becomes a resident NPU weight, how one MUL_MAT executes and how a graph is walked.
//! `crate::ffi` turns ggml's raw structs into the plain values and slices used here and makes
//! no decision of its own.
//!
//! **What kind of ggml device ORK is.** ORK registers as an ACCEL device beside the CPU (like
//! ggml-blas), with its own *host* weight buffer type: weights keep their GGUF bytes in ordinary
//! memory (so ggml-cpu can still read them in place for decode) and additionally get a packed,
//! resident int8 copy on the NPU, keyed by the tensor's data address (past the residency budget
//! a weight is streamed instead: its tiles copied into a ring of NPU buffers for each prefill
//! MUL_MAT, `stream`). The scheduler gives ORK the
//! MUL_MATs it accepts and the CPU everything else, with no copies (both sides read host
//! memory). README "Design: ORK as an ACCEL device" gives the measured argument.
//!
//! W8A8 flow of one MUL_MAT (`dst = src0 · src1ᵀ` in ggml's terms, `C = A · Wᵀ` here):
//! `x: [M, K] f32` → per-row int8 (`quant`) → `npu::Npu::mm_run` (pack → plan → regcmd → submit →
//! wait) → `c: [M, N] i32` → `dst: [M, N] f32 = c · a_scale[m] · w_scale[n]`.

pub mod buffer;
mod device;
mod pool;
pub mod gpu;
pub mod graph;
mod npu_mm;
pub mod packed;
pub mod stream;
pub mod weights;

use crate::cache::PackCache;
use crate::config::Config;
use crate::npu::{Npu, NpuError};
use crate::quant;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

/// The value for `key` in this thread's memo `memo`, made by `make` the first time it is asked
/// for. For decisions the configuration fixes for the process but that cost a planner run (the
/// engine per shape, the cut of a pipelined MUL_MAT): ggml asks again for every node of every
/// token. Bounded: a prefill brings many M values, and a memo of the repeats is enough.
fn remembered<K: std::hash::Hash + Eq, V: Copy>(memo: &'static std::thread::LocalKey<std::cell::RefCell<std::collections::HashMap<K, V>>>, key: K, make: impl FnOnce() -> V) -> V {
    if let Some(v) = memo.with(|r| r.borrow().get(&key).copied()) {
        return v;
    }
    let v = make();
    memo.with(|r| {
        let mut r = r.borrow_mut();
        if r.len() >= 4096 {
            r.clear();
        }
        r.insert(key, v);
    });
    v
}
pub use crate::pack::WeightSource;
pub use packed::PackedWeight;
pub use weights::WeightStore;


/// Counters for the profile / summary line: telemetry only (what the precision plan and the
/// residency rule read is in [`Placement`], the stream ring and worker in `Device::stream`).
///
/// A MUL_MAT ORK takes counts in exactly one of: `npu_matmuls` (every NPU run of it succeeded),
/// `npu_fallbacks` (an NPU run failed: computed on the CPU, the failed runs in `npu_errors`),
/// the phases' `fallback` (another process held the NPU: computed on the CPU without trying),
/// or `gpu_matmuls`.
#[derive(Default)]
pub struct Stats {
    /// MUL_MATs whose NPU runs all succeeded (their results came from the NPU).
    pub npu_matmuls: AtomicU64,
    pub gpu_matmuls: AtomicU64,
    pub gpu_submits: AtomicU64,
    pub gpu_ns: AtomicU64,
    /// Input rows of the NPU matmuls (tokens × matmuls): the rows plain W8A8 would send.
    pub npu_rows: AtomicU64,
    /// Rows sent to the NPU: every int8 activation term of every weight term's run.
    pub npu_rows_sent: AtomicU64,
    /// MUL_MATs computed on the CPU because an NPU run of theirs failed.
    pub npu_fallbacks: AtomicU64,
    /// NPU runs that failed (a MUL_MAT with two weight terms runs twice).
    pub npu_errors: AtomicU64,
    /// Time spent computing those MUL_MATs' failed runs on the CPU.
    pub fallback_ns: AtomicU64,
    /// NPU errors seen so far (the first three are logged).
    pub errors_logged: AtomicU64,
    /// NPU jobs that reported done but did not run (output sentinel or task counter), and
    /// resubmits: the NPU core's counts (`Npu::health`), copied in before they are reported.
    pub npu_never_ran: AtomicU64,
    pub npu_retries: AtomicU64,
    /// NPU matmuls whose rotated activation's int8 terms were those of the matmul before (one
    /// activation read by several weights: Q/K/V, gate/up), not rotated and quantized again.
    pub act_reused: AtomicU64,
    /// Of those, the ones the graph walk vouched for (the same tensor, nothing run in between:
    /// `Device::run_mul_mat_after`), reused without hashing the activation.
    pub act_vouched: AtomicU64,
    /// Cut MUL_MATs whose last output pass was left for the next MUL_MAT, which reads the same
    /// activation (`backend::graph`); of those, the passes run beside that MUL_MAT's first piece
    /// on the NPU, and those run apart (before ggml-cpu, a GPU batch or another MUL_MAT, or at
    /// the end of the call: on the critical path).
    pub outputs_deferred: AtomicU64,
    pub outputs_beside: AtomicU64,
    pub outputs_apart: AtomicU64,
    /// MUL_MATs sent to the CPU because their weight could not be made resident.
    pub not_resident: AtomicU64,
    pub declined_small_m: AtomicU64,
    /// ggml's scheduler asking ORK whether it takes a node (`supports_op`, at every graph split):
    /// the calls and the time ORK took to answer them.
    pub split_calls: AtomicU64,
    pub split_ns: AtomicU64,
    /// Weights packed from their source (cold), and weights loaded from the `.orkpack` cache.
    pub packed: AtomicU64,
    pub cache_hits: AtomicU64,
    /// Cache entries written.
    pub cache_writes: AtomicU64,
    /// Weight preparation time (packing or cache loading, hashing included).
    pub pack_ns: AtomicU64,
    /// Parts of `pack_ns` on the cache path: hashing the source bytes (the cache key), opening
    /// entries (stat, open, map, header, identity, length), importing the tiles into device
    /// memory with the payload checksum fused in (hits only).
    pub cache_hash_ns: AtomicU64,
    pub cache_read_ns: AtomicU64,
    pub cache_import_ns: AtomicU64,
    /// Parts of `pack_ns` on the cold path (packs only): dequantize + quantize + tile
    /// (`pack::pack_source`), the upload of the tiles into device memory (`Npu::upload`: page
    /// allocation + one copy, the same work a hit's import does), and writing the cache entry.
    pub cold_pack_ns: AtomicU64,
    pub cold_upload_ns: AtomicU64,
    pub cache_store_ns: AtomicU64,
    pub quant_ns: AtomicU64,
    pub npu_ns: AtomicU64,
    pub dequant_ns: AtomicU64,
    /// MUL_MATs whose rows were corrected along their weight's calibrated direction, and the host
    /// time of the correction's dots taken apart from the activation pass (an activation reused
    /// by a weight whose direction differs from the one its dots were taken with). The rest of
    /// the correction is inside the two host passes: each row's K-dot in act-quant, its N adds
    /// in dequant.
    pub mean_corrected: AtomicU64,
    pub mean_ns: AtomicU64,
    pub submits: AtomicU64,
    /// Per phase (0 = prefill, 1 = decode): NPU runs and their time split.
    pub phase: [PhaseStats; 2],
    /// MUL_MAT nodes run on ggml's CPU backend inside ORK's own graph_compute (whole-graph mode,
    /// e.g. under ggml-rpc-server), per phase; and the other ops run there.
    pub cpu_mm: [AtomicU64; 2],
    pub cpu_ops: AtomicU64,
    pub cpu_ns: AtomicU64,
    /// Weights kept to one int8 term, and weights left on the CPU, for want of resident budget.
    pub one_term_for_budget: AtomicU64,
    pub not_resident_weights: AtomicU64,
    /// GPU decode runs per phase.
    pub gpu_phase: [AtomicU64; 2],
    /// Wall time of the NPU runs inside `run_mul_mat` (arbiter, submit, device; both weight
    /// terms): with `gpu_ns` and `cpu_ns`, the engine time taken out of a graph_compute's wall
    /// time to get ORK's own host time (see [`GraphStats`]).
    pub npu_run_ns: AtomicU64,
    /// Arbiter time of the NPU runs: lease acquire (incl. the cross-process flock, and waiting
    /// while another process holds the NPU) and release. Host work, not engine time.
    pub arb_ns: AtomicU64,
    /// The exit line last printed: a backend freed after another with nothing new to report
    /// (`llama-completion -dev ORK` frees two) does not print it again.
    pub reported: std::sync::Mutex<String>,
    /// Resident bytes by kind and their peak ([`Stats::memory`]).
    pub mem: Arc<MemLedger>,
    /// ORK's `graph_compute` calls, by class: 0 = batches (some MUL_MAT with M > 1, or none run
    /// by ORK), 1 = single-row graphs (every MUL_MAT ORK ran had M = 1: decode).
    pub graph: [GraphStats; 2],
}

/// What the precision plan and the residency rule read, apart from the counters ([`Stats`],
/// telemetry only): the work ORK's live buffers announced per precision role, their host bytes,
/// and the weights placed so far.
#[derive(Default)]
pub struct Placement {
    /// Work per precision role (`route::precision::RoleWork`: Σ K·N of its weights) in ORK's
    /// live buffers, counted as ggml initialises their tensors: the precision plan's view of the
    /// model.
    pub announced: [AtomicU64; crate::route::precision::ROLES],
    /// Host bytes of ORK's live buffers (the GGUF weights the CPU also reads live there); the
    /// default residency budget is lowered by them (see [`Device::host_buffers_changed`]).
    pub host_buffer_bytes: AtomicU64,
    /// The part of `host_buffer_bytes` in buffers ggml wrote model weights into (the GGUF copy;
    /// the rest are ORK's compute buffers).
    pub weight_buffer_bytes: AtomicU64,
    /// The part of `host_buffer_bytes` in buffers over llama.cpp's mapping of the model file
    /// (`buffer_from_host_ptr`): file-backed GGUF bytes read in place, not ORK's memory.
    pub mapped_buffer_bytes: AtomicU64,
    /// Source bytes of the weights `weights::pack` was called for: with `host_buffer_bytes`,
    /// an estimate of what is still to be placed (see `weights::second_term_fits`).
    pub placed_src_bytes: AtomicU64,
    /// One int8 term's resident bytes of those weights (their tiled size).
    pub placed_term_bytes: AtomicU64,
    /// One int8 term's resident bytes of every weight in ORK's live buffers, summed as ggml
    /// initialises their tensors (before any is loaded); 0 when unknown.
    pub expected_term_bytes: AtomicU64,
}

/// What ORK holds in memory besides the process's own: the packed weights' int8 tiles per term
/// and their scales (booked when a weight becomes resident, unbooked when its [`Held`] drops),
/// the NPU scratch and the copies the kernel interface keeps (copied in from the `Npu` by
/// [`Device::note_memory`]), and the peak of the total.
#[derive(Default)]
pub struct MemLedger {
    /// Tiles of the first and second int8 term (page-rounded, one copy).
    pub tiles: [AtomicU64; 2],
    /// Row scales, column scales and second-term row scales (f32), and the calibrated
    /// correction directions.
    pub scales: AtomicU64,
    /// NPU scratch (`Npu::scratch_bytes`), and the interface's copies of it.
    pub scratch: AtomicU64,
    pub scratch_copies: AtomicU64,
    /// Copies of each weight the interface holds (`Npu::weight_copies`; 0 = not known yet: 1).
    pub weight_copies: AtomicU64,
    /// Largest total seen (sampled at every weight placement, buffer change and report).
    pub peak: AtomicU64,
}

/// A packed weight's share of the [`MemLedger`], given back when the weight is dropped.
pub struct Held {
    ledger: Arc<MemLedger>,
    tiles: [u64; 2],
    scales: AtomicU64,
}

impl Held {
    /// Books `tiles` (per term) and `scales` bytes in `ledger`.
    pub fn new(ledger: &Arc<MemLedger>, tiles: [u64; 2], scales: u64) -> Held {
        for (t, b) in ledger.tiles.iter().zip(tiles) {
            t.fetch_add(b, Relaxed);
        }
        ledger.scales.fetch_add(scales, Relaxed);
        Held { ledger: ledger.clone(), tiles, scales: AtomicU64::new(scales) }
    }

    /// Books `bytes` more of scales (the weight's correction direction, made at its first run).
    pub fn add_scales(&self, bytes: u64) {
        self.scales.fetch_add(bytes, Relaxed);
        self.ledger.scales.fetch_add(bytes, Relaxed);
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        for (t, b) in self.ledger.tiles.iter().zip(self.tiles) {
            t.fetch_sub(b, Relaxed);
        }
        self.ledger.scales.fetch_sub(self.scales.load(Relaxed), Relaxed);
    }
}

/// Resident bytes by kind ([`Stats::memory`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Memory {
    /// ORK's buffers that hold model weights (`Stats::weight_buffer_bytes`): the GGUF copy.
    pub gguf: u64,
    /// ORK's other host buffers (ggml's compute buffers of ORK's graph splits).
    pub buffers: u64,
    /// ORK's buffers over llama.cpp's mapping of the model file (`Stats::mapped_buffer_bytes`):
    /// the GGUF bytes read in place, file-backed; not ORK's memory, not in `total`.
    pub gguf_mapped: u64,
    /// Int8 tiles of the first and second weight term, one copy each.
    pub tiles: [u64; 2],
    pub scales: u64,
    pub scratch: u64,
    /// What the kernel interface holds besides one copy: weight tiles × (copies − 1) and the
    /// scratch copies (`Npu::scratch_bytes`; 0 on every interface today, `rocket` included).
    pub copies: u64,
    pub total: u64,
    pub peak: u64,
}

impl Memory {
    /// "resident 12.3 MiB (GGUF copy …, compute buffers …, int8 tiles … + … (terms 1 + 2),
    /// scales …, NPU scratch …, per-core copies …), peak … MiB; GGUF file-backed … MiB (…)".
    pub fn line(&self) -> String {
        let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
        format!(
            "resident {:.1} MiB (GGUF copy {:.1}, compute buffers {:.1}, int8 tiles {:.1} + {:.1} (terms 1 + 2), scales {:.1}, NPU scratch {:.1}, per-core copies {:.1}), peak {:.1} MiB; \
             GGUF file-backed {:.1} MiB (read in place from llama.cpp's mapping of the model file, not in the total)",
            mib(self.total),
            mib(self.gguf),
            mib(self.buffers),
            mib(self.tiles[0]),
            mib(self.tiles[1]),
            mib(self.scales),
            mib(self.scratch),
            mib(self.copies),
            mib(self.peak),
            mib(self.gguf_mapped),
        )
    }
}

/// Where the wall time of a class of `graph_compute` calls went. `host = wall − engines −
/// weight preparation` is ORK's own host time: act-quant (with the column equalisation) +
/// dequant (`qdq_ns`) + NPU arbiter (`arb_ns`) + bookkeeping (graph walk, routing, weight
/// lookup, GPU job batching).
/// Deltas of the process-wide counters over each call: concurrent graph_compute calls on
/// several threads (serving) can attribute one's work to another's span.
#[derive(Default)]
pub struct GraphStats {
    pub calls: AtomicU64,
    pub wall_ns: AtomicU64,
    /// NPU runs + GPU batches + ggml-cpu runs inside the calls.
    pub engine_ns: AtomicU64,
    /// First-use weight packing / cache loads inside the calls (one-time work).
    pub prep_ns: AtomicU64,
    pub qdq_ns: AtomicU64,
    pub arb_ns: AtomicU64,
}

/// The counters [`Stats::record_graph`] differences over one graph_compute call.
#[derive(Clone, Copy, Default)]
pub struct GraphSnap {
    engine_ns: u64,
    prep_ns: u64,
    qdq_ns: u64,
    arb_ns: u64,
    npu_matmuls: u64,
    npu_rows: u64,
    gpu_matmuls: u64,
}

/// NPU runs of one phase and where their time went.
#[derive(Default)]
pub struct PhaseStats {
    pub runs: AtomicU64,
    pub rows: AtomicU64,
    /// Rows sent to the NPU, int8 terms included (`rows` is what plain W8A8 sends).
    pub rows_sent: AtomicU64,
    pub quant_ns: AtomicU64,
    /// Of `quant_ns`, the reuse check: whether an activation at the held one's address is the
    /// held one (its hash; `backend::npu_mm`), before any of its pieces can run.
    pub check_ns: AtomicU64,
    /// The NPU runs' wall time that their device time (`wait_ns`) does not cover: the cores'
    /// host work (`core_host_ns`), their submits' time past the hardware time (`late_ns`), and
    /// the rest (hand-offs to the cores' threads, and the cores' host work and lateness where
    /// another core's were the longest).
    pub submit_ns: AtomicU64,
    /// The NPU runs' host work on their cores' threads (register commands, syncs, buffers):
    /// per run (piece) the longest core's, summed.
    pub core_host_ns: AtomicU64,
    /// The NPU runs' time inside the kernel interface's submits past the hardware time they
    /// reported (a board: the kernel's round trip and the thread's wake-up; the timed
    /// simulator: its completion past the modelled time, a thread of this machine's CPUs):
    /// per run the longest core's, summed.
    pub late_ns: AtomicU64,
    /// The NPU runs' device time: per run the busiest core's hardware time (the interface's
    /// measured busy time), summed.
    pub wait_ns: AtomicU64,
    /// Wall time of the NPU MUL_MATs that the NPU's busy time did not cover (arbiter waits
    /// aside): the host's time on the critical path. With the pieces pipelined, the activation
    /// and output passes of the inner pieces overlap the NPU and are not in it.
    pub critical_ns: AtomicU64,
    /// Pieces the NPU MUL_MATs were cut into (`Npu::pipeline_bounds`; one per uncut MUL_MAT).
    pub pieces: AtomicU64,
    pub dequant_ns: AtomicU64,
    /// Time spent waiting for the arbiter (cores held by another context, or another process).
    pub arb_ns: AtomicU64,
    /// Runs computed on the CPU because another process held the NPU.
    pub fallback: AtomicU64,
    /// Runs computed on the CPU because an NPU run failed.
    pub npu_failed: AtomicU64,
    /// Bytes of cache maintenance of the NPU runs, and bytes their submits read and wrote
    /// (`npu::RunStats`).
    pub synced_bytes: AtomicU64,
    pub io_bytes: AtomicU64,
}

impl PhaseStats {
    /// "synced N MiB (X× the bytes the submits read and write)".
    pub fn synced_words(&self) -> String {
        let (s, io) = (self.synced_bytes.load(Relaxed), self.io_bytes.load(Relaxed));
        format!("synced {:.1} MiB ({:.2}× the bytes the submits read and write)", s as f64 / (1u64 << 20) as f64, s as f64 / io.max(1) as f64)
    }
}

impl Stats {
    /// Counters at the start of a graph_compute call.
    pub fn graph_snap(&self) -> GraphSnap {
        let l = |a: &AtomicU64| a.load(Relaxed);
        GraphSnap {
            engine_ns: l(&self.npu_run_ns) + l(&self.gpu_ns) + l(&self.cpu_ns),
            prep_ns: l(&self.pack_ns),
            qdq_ns: l(&self.quant_ns) + l(&self.dequant_ns),
            arb_ns: l(&self.arb_ns),
            npu_matmuls: l(&self.npu_matmuls),
            npu_rows: l(&self.npu_rows),
            gpu_matmuls: l(&self.gpu_matmuls),
        }
    }

    /// Books one graph_compute call of `wall_ns` that started at `before`.
    pub fn record_graph(&self, before: GraphSnap, wall_ns: u64) {
        let now = self.graph_snap();
        let d = |a: u64, b: u64| a.saturating_sub(b);
        let (mm, rows) = (d(now.npu_matmuls, before.npu_matmuls), d(now.npu_rows, before.npu_rows));
        let gpu = d(now.gpu_matmuls, before.gpu_matmuls);
        // GPU runs are decode runs; NPU runs are single-row when rows == runs.
        let single = (gpu > 0 || mm > 0) && rows == mm;
        let g = &self.graph[single as usize];
        g.calls.fetch_add(1, Relaxed);
        g.wall_ns.fetch_add(wall_ns, Relaxed);
        g.engine_ns.fetch_add(d(now.engine_ns, before.engine_ns), Relaxed);
        g.prep_ns.fetch_add(d(now.prep_ns, before.prep_ns), Relaxed);
        g.qdq_ns.fetch_add(d(now.qdq_ns, before.qdq_ns), Relaxed);
        g.arb_ns.fetch_add(d(now.arb_ns, before.arb_ns), Relaxed);
    }

    /// Resident bytes by kind now, and the peak so far (this reading included).
    pub fn memory(&self, p: &Placement) -> Memory {
        let l = &self.mem;
        let tiles = [l.tiles[0].load(Relaxed), l.tiles[1].load(Relaxed)];
        let copies = l.weight_copies.load(Relaxed).max(1);
        let mapped = p.mapped_buffer_bytes.load(Relaxed);
        let host = p.host_buffer_bytes.load(Relaxed).saturating_sub(mapped);
        let gguf = p.weight_buffer_bytes.load(Relaxed).min(host);
        let mut m = Memory {
            gguf,
            gguf_mapped: mapped,
            buffers: host - gguf,
            tiles,
            scales: l.scales.load(Relaxed),
            scratch: l.scratch.load(Relaxed),
            copies: (tiles[0] + tiles[1]) * (copies - 1) + l.scratch_copies.load(Relaxed),
            ..Memory::default()
        };
        m.total = host + tiles[0] + tiles[1] + m.scales + m.scratch + m.copies;
        m.peak = l.peak.fetch_max(m.total, Relaxed).max(m.total);
        m
    }

    /// MUL_MATs computed on the CPU because another process held the NPU (both phases).
    pub fn busy_fallbacks(&self) -> u64 {
        self.phase.iter().map(|p| p.fallback.load(Relaxed)).sum()
    }

    /// Copies the NPU core's never-ran / resubmit counts in (before a report).
    pub fn absorb_health(&self, h: crate::npu::Health) {
        self.npu_never_ran.store(h.never_ran, Relaxed);
        self.npu_retries.store(h.retries, Relaxed);
    }

    /// The exit line. "ORK ran N MUL_MAT on the NPU" counts only MUL_MATs whose results came
    /// from the NPU; the ones computed on the CPU instead are counted after it, by cause.
    pub fn summary(&self, p: &Placement, stream: &stream::Streamer) -> String {
        let ms = |a: &AtomicU64| a.load(Relaxed) as f64 / 1e6;
        format!(
            "ORK ran {} MUL_MAT on the NPU ({} rows sent = {:.2}x plain W8A8, {} submits) and {} on the GPU ({} submits, {:.1} ms); {} MUL_MAT graph nodes were left to the CPU \
             (M < ORK_MINM) at graph split; {} MUL_MAT fell back to the CPU after NPU errors ({} failed NPU runs, {:.1} ms on the CPU) \
             and {} while another process held the NPU; NPU jobs that reported done but never ran: {} detected, {} resubmitted; weights: {} cache hits, {} packs \
             ({} cache writes), prepared in {:.0} ms (source hash {:.0} ms, cache open {:.0} ms, import + verify {:.0} ms; \
             packing {:.0} ms, upload {:.0} ms, cache write {:.0} ms){}; time: act-quant {:.1} ms, npu {:.1} ms, dequant {:.1} ms, \
             correction {:.1} ms on the host for {} MUL_MAT (each row along its weight's calibrated direction; its dots and adds \
             otherwise inside act-quant and dequant); \
             prefill MUL_MAT: host {:.1} ms on the critical path, NPU device {:.1} ms ({:.1} ms of host work: act-quant, submit, dequant, arbiter; \
             {} MUL_MAT in {} pieces, pipelined where cut), {}; decode MUL_MAT: {}; {}",
            self.npu_matmuls.load(Relaxed),
            self.npu_rows_sent.load(Relaxed),
            self.npu_rows_sent.load(Relaxed) as f64 / self.npu_rows.load(Relaxed).max(1) as f64,
            self.submits.load(Relaxed),
            self.gpu_matmuls.load(Relaxed),
            self.gpu_submits.load(Relaxed),
            ms(&self.gpu_ns),
            self.declined_small_m.load(Relaxed),
            self.npu_fallbacks.load(Relaxed),
            self.npu_errors.load(Relaxed),
            ms(&self.fallback_ns),
            self.busy_fallbacks(),
            self.npu_never_ran.load(Relaxed),
            self.npu_retries.load(Relaxed),
            self.cache_hits.load(Relaxed),
            self.packed.load(Relaxed),
            self.cache_writes.load(Relaxed),
            ms(&self.pack_ns),
            ms(&self.cache_hash_ns),
            ms(&self.cache_read_ns),
            ms(&self.cache_import_ns),
            ms(&self.cold_pack_ns),
            ms(&self.cold_upload_ns),
            ms(&self.cache_store_ns),
            match (self.one_term_for_budget.load(Relaxed), self.not_resident_weights.load(Relaxed)) {
                (0, 0) => String::new(),
                (one, cpu) => format!(
                    "; {one} weights kept one int8 term for want of resident budget and {cpu} were not made resident (their MUL_MATs run on the CPU; \
                     budget: ORK_WCACHE_BUDGET_MB, default RAM - 1 GiB - ORK buffers)"
                ),
            } + &stream.line(),
            ms(&self.quant_ns),
            ms(&self.npu_ns),
            ms(&self.dequant_ns),
            ms(&self.mean_ns),
            self.mean_corrected.load(Relaxed),
            ms(&self.phase[0].critical_ns),
            ms(&self.phase[0].wait_ns),
            {
                let p = &self.phase[0];
                ms(&p.quant_ns) + ms(&p.submit_ns) + ms(&p.dequant_ns) + ms(&p.arb_ns)
            },
            self.phase[0].runs.load(Relaxed),
            self.phase[0].pieces.load(Relaxed),
            self.phase[0].synced_words(),
            self.phase[1].synced_words(),
            self.memory(p).line(),
        )
    }

    /// The `ORK_PROFILE=1` table: per op kind (prefill / decode MUL_MAT), which engine ran it, how
    /// many times, and the time split.
    pub fn profile(&self, p: &Placement, arb: Option<&crate::route::arbiter::Arbiter>) -> String {
        let ms = |a: &AtomicU64| a.load(Relaxed) as f64 / 1e6;
        let mut out = format!("ORK profile (per op kind; {}):", self.memory(p).line());
        for (i, name) in ["prefill", "decode"].iter().enumerate() {
            let p = &self.phase[i];
            out += &format!(
                "\n  {name:7} MUL_MAT: npu {} runs ({} rows sent = {:.2}x plain W8A8; act-quant {:.1} ms (the reuse check {:.1} ms), submit {:.1} ms (the cores' host work {:.1} ms, past the hardware time {:.1} ms), wait {:.1} ms, dequant {:.1} ms, arbiter {:.1} ms; \
                 host on the critical path {:.1} ms, {} pieces), \
                 {} fell back to the CPU after NPU errors, {} on the CPU while another process held the NPU, gpu {} runs, cpu {} runs in ORK's graph",
                p.runs.load(Relaxed),
                p.rows_sent.load(Relaxed),
                p.rows_sent.load(Relaxed) as f64 / p.rows.load(Relaxed).max(1) as f64,
                ms(&p.quant_ns),
                ms(&p.check_ns),
                ms(&p.submit_ns),
                ms(&p.core_host_ns),
                ms(&p.late_ns),
                ms(&p.wait_ns),
                ms(&p.dequant_ns),
                ms(&p.arb_ns),
                ms(&p.critical_ns),
                p.pieces.load(Relaxed),
                p.npu_failed.load(Relaxed),
                p.fallback.load(Relaxed),
                self.gpu_phase[i].load(Relaxed),
                self.cpu_mm[i].load(Relaxed),
            );
        }
        out += &format!(
            "\n  NPU failures: {} failed NPU runs ({:.1} ms on the CPU instead); {} jobs reported done but never ran, {} resubmitted",
            self.npu_errors.load(Relaxed),
            ms(&self.fallback_ns),
            self.npu_never_ran.load(Relaxed),
            self.npu_retries.load(Relaxed),
        );
        out += &format!(
            "\n  rotated activations quantized once for several weights: {} of {} NPU runs reused the previous run's int8 terms ({} vouched for by the graph walk, the rest by the activation's hash)",
            self.act_reused.load(Relaxed),
            self.npu_matmuls.load(Relaxed) + self.npu_fallbacks.load(Relaxed) + self.busy_fallbacks(),
            self.act_vouched.load(Relaxed)
        );
        out += &format!(
            "\n  decode  MUL_MAT left to ggml-cpu at graph split: {} nodes; other ops run by ORK on ggml-cpu: {} ({:.1} ms)",
            self.declined_small_m.load(Relaxed),
            self.cpu_ops.load(Relaxed),
            ms(&self.cpu_ns)
        );
        out += &format!(
            "\n  graph split: ORK answered the scheduler's supports_op {} times in {:.3} ms",
            self.split_calls.load(Relaxed),
            ms(&self.split_ns)
        );
        for (i, name) in ["batches", "single-row"].iter().enumerate() {
            let g = &self.graph[i];
            let (wall, eng, prep, qdq, arb) = (ms(&g.wall_ns), ms(&g.engine_ns), ms(&g.prep_ns), ms(&g.qdq_ns), ms(&g.arb_ns));
            let host = (wall - eng - prep).max(0.0);
            out += &format!(
                "\n  graph_compute {name}: {} calls, wall {wall:.2} ms; engines {eng:.2} ms; weight preparation {prep:.2} ms; \
                 host {host:.3} ms = act-quant + dequant {qdq:.3} ms + arbiter {arb:.3} ms + bookkeeping {:.3} ms",
                g.calls.load(Relaxed),
                (host - qdq - arb).max(0.0),
            );
        }
        if let Some(a) = arb {
            out += &format!("\n  {}", a.summary());
        }
        out
    }
}

/// The ORK device: the NPU plus policy inputs. One per process.
pub struct Device {
    pub npu: Arc<Npu>,
    /// The GPU decode engine, opened when `ORK_DECODE=gpu` and a suitable device exists.
    pub vk: Option<Arc<crate::vk::VkEngine>>,
    pub cfg: &'static Config,
    /// Counters: what ran where, what it cost (telemetry only).
    pub stats: Stats,
    /// The precision plan's and the residency rule's inputs.
    pub placement: Placement,
    /// Streamed prefill: the ring, the fill worker and their counters (`stream`; off until the
    /// device enables it).
    pub stream: stream::Streamer,
    /// The `.orkpack` cache (None when `ORK_CACHE=0` or no directory resolves).
    pub cache: Option<PackCache>,
    /// The calibration file the correction reads or `ORK_CALIBRATE` records into
    /// (`cache::calib::Store::from_config`).
    pub calib: Option<crate::cache::calib::Store>,
}

/// A MUL_MAT as ggml describes it, reduced to what decides acceptance.
#[derive(Clone, Copy, Debug)]
pub struct MatMulShape {
    pub weight_type: u32,
    /// K = `src0.ne[0]`, N = `src0.ne[1]`; src0 must be 2-D.
    pub k: usize,
    pub n: usize,
    pub weight_is_2d: bool,
    pub weight_contiguous: bool,
    /// The weight's memory is in an ORK buffer (directly or as a view).
    pub weight_in_ork_buffer: bool,
    /// The weight is a leaf not allocated yet: no buffer, not a view, no op, not an input
    /// (test-backend-ops asks before allocating).
    pub weight_unallocated_leaf: bool,
    /// llama.cpp asks where to place the weight (it sits in ORK's zero-size placement buffer)
    /// and ggml-cpu's `CPU_REPACK` type is the first of ggml-cpu's own that would take it.
    pub weight_cpu_repacks: bool,
    pub weight_has_to_float: bool,
    /// src1 (activations): f32, contiguous; M = all its rows.
    pub act_is_f32: bool,
    pub act_contiguous: bool,
    pub m: usize,
    pub dst_is_f32: bool,
    pub dst_contiguous: bool,
    /// `op_params[1] == 1`: src0 is a Hadamard rotation, not a weight.
    pub hadamard_hint: bool,
    /// `op_params[3]`: lowest representation src1 may be converted to (10/15/20 forbid int8).
    pub act_min_prec: i32,
}

/// Why ORK declines an op (debug log only).
pub fn mul_mat_unsupported(dev: &Device, s: &MatMulShape) -> Option<String> {
    // A leaf not allocated yet will be placed in the tested backend's own buffer type.
    if !s.weight_in_ork_buffer && !s.weight_unallocated_leaf {
        return Some("weight not in an ORK buffer".into());
    }
    // ggml-cpu keeps its repacked layout for decode: llama.cpp then places the weight in
    // CPU_REPACK, where ORK packs its tiles as it is loaded (`Device::keeps_cpu_repack`).
    if s.weight_cpu_repacks && dev.keeps_cpu_repack() {
        return Some("ggml-cpu repacks this weight: it goes to CPU_REPACK, where ORK packs it as it is loaded".into());
    }
    if quant::types::weight_type(s.weight_type).is_none() || !s.weight_has_to_float {
        return Some(format!("weight type {} not supported", s.weight_type));
    }
    if !s.weight_is_2d || !s.weight_contiguous {
        return Some("weight is not a contiguous 2-D matrix".into());
    }
    if !s.act_is_f32 || !s.act_contiguous || !s.dst_is_f32 || !s.dst_contiguous {
        return Some("activations/output are not contiguous f32".into());
    }
    if s.hadamard_hint {
        return Some("Hadamard rotation matmul".into());
    }
    if matches!(s.act_min_prec, 10 | 15 | 20) {
        return Some("activation precision pinned to float".into());
    }
    if let Err(e) = dev.npu.check_shape(s.n, s.k) {
        return Some(e.to_string());
    }
    None
}

impl Device {
    /// ORK's buffers grew (`delta > 0`) or shrank by `|delta|` host bytes. Unless
    /// `ORK_WCACHE_BUDGET_MB` sets the residency budget, it becomes RAM − 1 GiB − those bytes:
    /// on the board's unified memory the packed copy and the GGUF weights (kept for the CPU's
    /// decode and fallbacks) share the same RAM, and a budget of RAM − 1 GiB alone would let the
    /// packed copy of a large model push the process into the OOM killer. Weights past the
    /// budget keep one term or stay on the CPU (one warning each kind).
    pub fn host_buffers_changed(&self, delta: i64) {
        let now = if delta >= 0 {
            self.placement.host_buffer_bytes.fetch_add(delta as u64, Relaxed) + delta as u64
        } else {
            let d = delta.unsigned_abs();
            self.placement.host_buffer_bytes.fetch_sub(d, Relaxed).saturating_sub(d)
        };
        self.note_memory();
        if self.cfg.wcache_budget_mb.is_some() {
            return;
        }
        let budget = crate::npu::domain::default_budget_bytes().saturating_sub(now);
        self.npu.set_residency_budget(budget);
        log::debug!("resident weight budget {} MiB (RAM - 1 GiB - {} MiB of ORK buffers)", budget >> 20, now >> 20);
    }

    /// Copies the NPU's scratch bytes (with the stream ring's) and weight copies into the
    /// [`MemLedger`] and samples the
    /// peak (after a weight placement, a buffer change, and before a report).
    pub fn note_memory(&self) {
        let (scratch, scratch_copies) = self.npu.scratch_bytes();
        let l = &self.stats.mem;
        // The stream ring's slots are NPU buffers beside the scratch (`stream`).
        l.scratch.store(scratch + self.stream.ring_bytes(), Relaxed);
        l.scratch_copies.store(scratch_copies, Relaxed);
        l.weight_copies.store(u64::from(self.npu.weight_copies()), Relaxed);
        self.memory();
    }

    /// Resident bytes by kind now, and the peak so far ([`Stats::memory`]).
    pub fn memory(&self) -> Memory {
        self.stats.memory(&self.placement)
    }

    /// The exit line ([`Stats::summary`]).
    pub fn summary(&self) -> String {
        self.stats.summary(&self.placement, &self.stream)
    }

    /// The `ORK_PROFILE=1` table ([`Stats::profile`]).
    pub fn profile(&self) -> String {
        self.stats.profile(&self.placement, Some(self.arbiter()))
    }

    /// Whether decode matmuls can go to the GPU.
    pub fn gpu_ready(&self) -> bool {
        self.vk.is_some()
    }

    /// Whether weights ggml-cpu repacks stay in its `CPU_REPACK` buffers, ORK packing its tiles
    /// from their bytes as they are loaded (docs/design.md): wherever the CPU decodes, that is
    /// whenever the GPU decode engine is not open (then ORK's buffer holds them, as the GPU copy
    /// is made from the GGUF bytes at the first decode).
    pub fn keeps_cpu_repack(&self) -> bool {
        !self.gpu_ready()
    }

    /// The process's NPU arbiter (one per process, created on first use).
    pub fn arbiter(&self) -> &'static crate::route::arbiter::Arbiter {
        static ARB: std::sync::OnceLock<crate::route::arbiter::Arbiter> = std::sync::OnceLock::new();
        ARB.get_or_init(|| {
            let d = self.npu.describe();
            let kif = d.split('(').nth(1).and_then(|s| s.split(')').next()).unwrap_or("npu");
            let name: String = format!("{}-{kif}", self.npu.soc().id.name())
                .chars()
                .map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' })
                .collect();
            crate::route::arbiter::Arbiter::new(self.cfg, self.npu.cores(), &name)
        })
    }

    /// Logs an NPU run's error (the first three; all are counted in the exit line).
    fn note_npu_error(&self, e: &NpuError) {
        if self.stats.errors_logged.fetch_add(1, Relaxed) < 3 {
            log::warn!("NPU matmul failed ({e}); computed on the CPU instead");
        }
    }
}

#[cfg(test)]
mod stats_tests {
    use super::*;

    /// `remembered` makes a key's value once, keeps each key apart, and is bounded (a full memo
    /// starts over, making values again).
    #[test]
    fn remembered_makes_each_value_once_and_stays_bounded() {
        thread_local! {
            static MEMO: std::cell::RefCell<std::collections::HashMap<(usize, bool), usize>> = Default::default();
        }
        let made = std::cell::Cell::new(0);
        let get = |key: (usize, bool)| {
            remembered(&MEMO, key, || {
                made.set(made.get() + 1);
                key.0 * 2 + usize::from(key.1)
            })
        };
        assert_eq!((get((5, false)), get((5, false)), get((5, true))), (10, 10, 11));
        assert_eq!(made.get(), 2, "one make per key");
        for i in 0..5000 {
            get((100 + i, false));
        }
        assert!(MEMO.with(|m| m.borrow().len()) <= 4096, "bounded");
        let before = made.get();
        get((5, false));
        assert_eq!(made.get(), before + 1, "made again once forgotten");
    }

    #[test]
    fn profile_reports_graph_host_time_without_engine_time() {
        let s = Stats::default();
        let ms = |v: u64| v * 1_000_000;
        let add = |a: &AtomicU64, v: u64| a.fetch_add(v, Relaxed);
        // a single-row graph: 2 NPU runs of M = 1, 20 ms wall, 12 ms NPU, 3 ms ggml-cpu,
        // 1 ms act-quant + 0.5 ms dequant, 2 ms first-use packing
        let b = s.graph_snap();
        add(&s.npu_matmuls, 2);
        add(&s.npu_rows, 2);
        add(&s.npu_run_ns, ms(12));
        add(&s.cpu_ns, ms(3));
        add(&s.quant_ns, ms(1));
        add(&s.dequant_ns, 500_000);
        add(&s.pack_ns, ms(2));
        add(&s.arb_ns, 250_000);
        s.record_graph(b, ms(20));
        // a batch graph: one NPU run of M = 5, 10 ms wall, 8 ms NPU
        let b = s.graph_snap();
        add(&s.npu_matmuls, 1);
        add(&s.npu_rows, 5);
        add(&s.npu_run_ns, ms(8));
        s.record_graph(b, ms(10));
        let p = s.profile(&Placement::default(), None);
        let line = |k: &str| p.lines().find(|l| l.contains(k)).expect(k).trim().to_string();
        assert_eq!(
            line("graph_compute single-row:"),
            "graph_compute single-row: 1 calls, wall 20.00 ms; engines 15.00 ms; weight preparation 2.00 ms; \
             host 3.000 ms = act-quant + dequant 1.500 ms + arbiter 0.250 ms + bookkeeping 1.250 ms"
        );
        assert_eq!(
            line("graph_compute batches:"),
            "graph_compute batches: 1 calls, wall 10.00 ms; engines 8.00 ms; weight preparation 0.00 ms; \
             host 2.000 ms = act-quant + dequant 0.000 ms + arbiter 0.000 ms + bookkeeping 2.000 ms"
        );
    }
}
