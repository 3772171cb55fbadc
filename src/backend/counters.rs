//! What ran where and what it cost: the counters ORK books as it works (telemetry: no route or
//! placement reads them), the memory ledger of the packed weights, and the per-`graph_compute`
//! spans. `report` turns them into the exit summary and the `ORK_PROFILE=1` breakdown.

use super::Placement;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

/// Counters for the exit summary and the profile: telemetry only (what the precision plan and the
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
    /// `Device::run_mul_mat_linked`), reused without hashing the activation.
    pub act_vouched: AtomicU64,
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
    /// The full breakdown when the exit summary was last printed: a backend freed after another
    /// with nothing new to report (`llama-completion -dev ORK` frees two) does not print it again.
    pub reported: std::sync::Mutex<String>,
    /// Resident bytes by kind and their peak ([`Stats::memory`]).
    pub mem: Arc<MemLedger>,
    /// ORK's `graph_compute` calls, by class: 0 = batches (some MUL_MAT with M > 1, or none run
    /// by ORK), 1 = single-row graphs (every MUL_MAT ORK ran had M = 1: decode).
    pub graph: [GraphStats; 2],
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

/// The counters [`Stats::record_graph`] differences over one graph_compute call: engine time
/// (NPU runs, GPU batches, ggml-cpu runs), weight preparation, act-quant + dequant, arbiter, NPU
/// matmuls, their rows, GPU matmuls.
#[derive(Clone, Copy)]
pub struct GraphSnap([u64; 7]);

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

impl Stats {
    /// Counters at the start of a graph_compute call.
    pub fn graph_snap(&self) -> GraphSnap {
        let l = |a: &AtomicU64| a.load(Relaxed);
        let engine_ns = l(&self.npu_run_ns) + l(&self.gpu_ns) + l(&self.cpu_ns);
        let qdq_ns = l(&self.quant_ns) + l(&self.dequant_ns);
        GraphSnap([engine_ns, l(&self.pack_ns), qdq_ns, l(&self.arb_ns), l(&self.npu_matmuls), l(&self.npu_rows), l(&self.gpu_matmuls)])
    }

    /// Books one graph_compute call of `wall_ns` that started at `before`.
    pub fn record_graph(&self, before: GraphSnap, wall_ns: u64) {
        let (now, was) = (self.graph_snap().0, before.0);
        let [engine_ns, prep_ns, qdq_ns, arb_ns, mm, rows, gpu] = std::array::from_fn(|i| now[i].saturating_sub(was[i]));
        // GPU runs are decode runs; NPU runs are single-row when rows == runs.
        let single = (gpu > 0 || mm > 0) && rows == mm;
        let g = &self.graph[single as usize];
        let booked = [(&g.calls, 1), (&g.wall_ns, wall_ns), (&g.engine_ns, engine_ns), (&g.prep_ns, prep_ns), (&g.qdq_ns, qdq_ns), (&g.arb_ns, arb_ns)];
        for (counter, v) in booked {
            counter.fetch_add(v, Relaxed);
        }
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
}
