//! Routing policy: which engine runs a MUL_MAT, and the cost model behind it.
//!
//! A transformer step has two phases with opposite bottlenecks (seed 000, "pair opposite
//! bottlenecks"): *prefill* multiplies each weight by M ≫ 1 activation rows and is compute-bound,
//! so it belongs on the NPU's int8 MACs; *decode* (M = 1 per sequence, a handful of rows in a
//! server batch) reads every weight once per token and is bound by the one LPDDR controller the
//! NPU, the Mali GPU and the CPU share. The phase is visible to the backend only as M, the rows of
//! the ubatch, so M is the phase signal; K, N and the weight type give the work and the bytes.
//!
//! Two policies, picked by `ORK_ROUTE`:
//! * `threshold` (default, the measured policy of seeds 000/001): M ≥ `ORK_MINM` (32) → NPU;
//!   below it `ORK_DECODE` decides (`auto` = CPU: ggml-cpu reads the GGUF bytes in place). Both
//!   variables keep the meaning and defaults they had before the cost model existed.
//! * `cost`: [`CostModel`] predicts every available engine's time for this MUL_MAT (NPU: submit
//!   floor vs. MAC and weight-feed time; CPU: compute or bandwidth; GPU: bandwidth), adds the
//!   graph-split overhead an ACCEL engine pays inside llama.cpp, and takes the fastest. `ORK_MINM`
//!   stays the floor below which the NPU is used only for decode-by-cost. A busy NPU (another
//!   context holds all its cores, or another process holds its lock) sends decode to the CPU.
//!
//! [`decide`] returns the engine with the predicted times, which `ork-route` prints per tensor
//! with the reason.
//!
//! **Calibration and sources** (RK3588; RK3576 scaled where noted):
//! * per-submit floor 167 µs — rknpu-facts §4 "submit floor" `[ork src/npu/internal.h
//!   ORK_SUBMIT_FLOOR_US]`. A submit costs max(floor, its work): seed 001 measures a 2048² M = 1
//!   decode matmul at 176 µs on 3 cores, i.e. the floor, not floor + feed.
//! * int8 GEMM 1.4 TOPS measured (3 cores) — figure given in the issue text; cross-check: seed 001
//!   measures 512×2048×2048 on 3 cores at 4439 µs = 0.97 TOPS *including* host copy/accumulate.
//! * NPU weight feed 28.5 GB/s — figure given in the issue text (consistent with the seed 000 /
//!   facts "~20–30 GB/s aggregate" LPDDR controller).
//! * CPU: 1.0e11 int8 ops/s and 17.2 GB/s — derived from seed 001's CPU arm on Qwen3-1.7B w8a8
//!   (`ORK_OFF=1`, 4 big cores): pp512 35.5 tok/s × 2.82 GFLOP/token, tg128 9.43 tok/s × 1.83 GB
//!   of Q8_0 weights read per token.
//! * Mali-G610 decode 10 GB/s — **assumption** (no published figure in the shared sources; seed
//!   000 only says "NPU int8 decode ≫ Mali decode"). Used only with `ORK_DECODE=gpu|auto` in
//!   `cost` mode.
//! * ACCEL split overhead 0.87 ms per MUL_MAT run off the CPU during decode — derived from seed
//!   001: all-NPU decode inside llama.cpp ran at 4.2 tok/s where the matmuls alone predict ~15
//!   (197 MUL_MAT per token). Prefill amortises it over M rows.
//! * The host's work around each NPU run: [`HostCost`], frozen at one measurement on this
//!   machine (the comments of `HostCost::MEASURED`), × [`A76_OVER_HERE`] (an assumption).

pub mod activation;
pub mod arbiter;
pub mod precision;

use crate::config::{Config, DecodeSelect, RoutePolicy};
use crate::npu::soc::SocDesc;
use crate::quant::types::bytes_per_weight;

/// Where one MUL_MAT runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Engine {
    Npu,
    Gpu,
    /// Declined: ggml's CPU backend runs it.
    Cpu,
}

impl Engine {
    pub fn name(self) -> &'static str {
        match self {
            Engine::Npu => "npu",
            Engine::Gpu => "gpu",
            Engine::Cpu => "cpu",
        }
    }
}

/// The phase a MUL_MAT belongs to, read from M.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    Prefill,
    Decode,
}

impl Phase {
    pub fn of(cfg: &Config, m: usize) -> Phase {
        if m >= cfg.min_m {
            Phase::Prefill
        } else {
            Phase::Decode
        }
    }
}

/// Engines available for this decision.
#[derive(Clone, Copy, Debug, Default)]
pub struct Availability {
    /// A GPU decode engine is open.
    pub gpu: bool,
    /// The NPU is busy elsewhere (another process holds its lock, or no core is free here).
    pub npu_busy: bool,
}

/// The host's work around one NPU MUL_MAT, per unit of work, in seconds on **this machine's**
/// cores (a shared 2-core x86 builder), scaled to an RK3588 big core by [`A76_OVER_HERE`];
/// frozen at one measurement each ([`HostCost::MEASURED`]; docs/benchmarks.md, "Where the
/// prefill host time goes").
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HostCost {
    /// The activation pass (reuse key, rotation, int8 terms, the correction's dots) per
    /// activation row × K of the MUL_MATs that quantize their activation (K, V and up read the
    /// one Q and gate quantized, no pass of their own).
    pub act_quant_s: f64,
    /// The output pass (int32 → f32 with the scales, second term, correction) per output row × N.
    pub output_s: f64,
    /// The reuse check of a MUL_MAT reading the held activation (the activation's hash, before
    /// its NPU runs; cut into pieces, the graph vouches for the activation and none runs) per
    /// activation row × K of those MUL_MATs.
    pub check_s: f64,
    /// The host part of the NPU runs (register commands, syncs, output buffers on each core's
    /// thread, the hand-offs to those threads) per row × (K + N) of the NPU runs. It runs
    /// between one core's submits, so it never overlaps that core's NPU time.
    pub npu_io_s: f64,
    /// Per MUL_MAT: the arbiter's lease and its release.
    pub matmul_s: f64,
    /// Whether the activation and output passes of a MUL_MAT cut into pieces
    /// (`npu::plan::pipeline_bounds`, short ends included: each one more feed of the weight)
    /// overlap the NPU's run of the neighbouring pieces, as the backend does
    /// (`Device::run_mul_mat`): then only the first piece's activation pass and the last one's
    /// output pass, and whatever of the rest the NPU's time does not cover, add to it.
    pub pipelined: bool,
}

// The host coefficients below (and `StreamCost`'s) are FROZEN: each is one named measurement
// (its command, the machine, the commit of the tree it measured), not fitted to a target. A
// board's measurement (the on-board kit's host table) settles them; until then they stay, and
// no refit on this machine to clear a figure `ork-route` prints. The machine of every one: the
// shared 2-core x86-64 builder this project is developed on (timed NPU: `ORK_NPU=sim
// ORK_SIM_TIMING=board`). The host table's command, with the tree's µs per prompt token of each
// step divided by the work per token `ork-route`'s `model::prefill_work` prints at M = 512:
// `P=512 UB="512 128" R=1 bash bench-scripts/prefill_host_table.sh $ORK_ENV/synth/synth-qwen3-1.7b-Q8_0.gguf`
// (synthetic Qwen3-1.7B shape, Q8_0, OMP_WAIT_POLICY=passive, load average 1.3–1.6).

/// **Assumption**, not a measurement (aa659b1, frozen likewise): an RK3588 A76 core (2.3–2.4 GHz,
/// rknpu-facts §8) takes 2.5× this machine's x86 core time for the host's passes (the issue's
/// "2–3× slower"; neither the shared references nor the seeds give a measured per-core ratio for
/// this kind of work).
pub const A76_OVER_HERE: f64 = 2.5;

impl HostCost {
    /// Measured on this machine (frozen: each coefficient's comment names its measurement).
    pub const MEASURED: HostCost = HostCost {
        // The host table at c016b5d: act-quant 201 µs per token less its reuse check (17), /
        // 344064 row·K per token quantized: Σ K of the layer's MUL_MATs that quantize their
        // activation (Q, attention output, gate, down; K, V and up read the held one) × 28.
        act_quant_s: 0.535e-9,
        // The host table at c016b5d: dequant 260 µs per token / 573440 row·N per token (Σ N × 28).
        output_s: 0.453e-9,
        // The host table at c016b5d: the reuse check 17 µs per token / 172032 row·K per token of
        // K, V and up.
        check_s: 0.099e-9,
        // The host table at c016b5d: the cores' threads' host work 17 µs per token (register
        // commands, task descriptors, syncs, output buffers: each core's wall time less its time
        // inside the kernel interface's submits, the longest core per run) / (516096 + 573440)
        // row·(K + N) per token. Not counted: the submits' time past the hardware time they
        // reported (52), which here is the timed simulator's threads waiting for one of this
        // machine's two CPUs; on a board the hardware time is the NPU's own, and the kernel's
        // round trip is taken as inside the submit floor (an **assumption**: the on-board kit's
        // per-submit modelled vs measured line measures it).
        npu_io_s: 0.0156e-9,
        // The host table at a37edc1 (`UB=512`): arbiter 1 µs per token × 512 / 196 MUL_MATs (a
        // private lock directory: no other process).
        matmul_s: 2.6e-6,
        pipelined: true,
    };

    /// Host seconds on the board for one MUL_MAT of `m` rows, `k`, `n`, with `terms`: the part
    /// that always adds to the NPU's time (the NPU runs' host part, the arbiter) and the
    /// activation and output passes (where it reads the held activation, `held`, the reuse check
    /// in place of the activation pass).
    pub fn host_parts(&self, m: usize, k: usize, n: usize, terms: precision::Terms, held: bool) -> (f64, (f64, f64)) {
        let serial = self.npu_io_s * (terms.rows() * m * (k + n)) as f64 + self.matmul_s;
        let act = if held { self.check_s * (m * k) as f64 } else { self.act_quant_s * (terms.act * m * k) as f64 };
        let out = self.output_s * (terms.rows() * m * n) as f64;
        (A76_OVER_HERE * serial, (A76_OVER_HERE * act, A76_OVER_HERE * out))
    }

    /// The MUL_MAT's time from the NPU's (`npu_s`), the host's serial part and its passes
    /// (activation, output), cut into pieces: one after the other, or, pipelined, the first
    /// piece's activation pass (`first`: its share of the rows) and the last piece's output pass
    /// (`last`) plus whatever of the others' the NPU's time does not cover.
    pub fn combine(&self, npu_s: f64, serial_s: f64, passes_s: (f64, f64), pieces: usize, first: f64, last: f64) -> f64 {
        let (act, out) = passes_s;
        if self.pipelined && pieces > 1 {
            let ends = act * first + out * last;
            npu_s + serial_s + ends + (act + out - ends - npu_s).max(0.0)
        } else {
            npu_s + serial_s + act + out
        }
    }
}

/// What it costs to bring a weight that is not resident to the NPU for one MUL_MAT (streamed
/// prefill, `backend::stream`): its tiles copied from the `.orkpack` mapping into a ring slot,
/// or, where the cache has no entry, packed from the GGUF bytes again. Rates measured on this
/// machine, scaled to an A76 core by [`A76_OVER_HERE`]; the one place these figures live
/// (`ork-route`'s board plan reads them too).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StreamCost {
    /// Seconds per tile byte copied from the cache mapping into a slot (page cache warm).
    pub copy_s_per_byte: f64,
    /// Seconds per weight parameter packed from the GGUF bytes (dequantize, rotate, int8, tile).
    pub pack_s_per_param: f64,
}

impl StreamCost {
    pub const MEASURED: StreamCost = StreamCost {
        // Frozen (see above): `bash bench-scripts/stream_pp512.sh` at 90e352c (synthetic
        // Qwen3-1.7B Q8_0, budget 410 MiB): the streamed rows' exit line, 1796 MiB filled from
        // the cache mappings in 292–318 ms of the fill worker's time (memcpy into the slots +
        // their cache clean, page cache warm), 5.9–6.4 GB/s, load average 5–7 on 2 cores.
        copy_s_per_byte: 1.0 / 6.0e9,
        // Frozen (see above): the same model packed cold, `ORK_CACHE_DIR=$(mktemp -d) ORK_NPU=sim
        // ORK_SIM_TIMING=board llama-bench -m synth-qwen3-1.7b-Q8_0.gguf -p 512 -ub 512 -n 0 -t 2
        // -r 1` at 90e352c: exit line "packing 2426 ms" for 193 weights, int8 tiles 1308 MiB (one
        // term, one byte per parameter): 565 Mparam/s on ORK's host threads (rotation, int8 rows,
        // tiles), load average 7–8.
        pack_s_per_param: 1.0 / 565.0e6,
    };

    /// Board seconds to fill a slot with one weight: `tile_bytes` from the cache, or the `params`
    /// of its `[N, K]` packed again (no cache entry).
    pub fn fill_s(&self, tile_bytes: u64, params: u64, from_cache: bool) -> f64 {
        A76_OVER_HERE * if from_cache { self.copy_s_per_byte * tile_bytes as f64 } else { self.pack_s_per_param * params as f64 }
    }
}

/// Whether a MUL_MAT of a streamed weight (`fill_s` to fill its slots, [`StreamCost::fill_s`])
/// runs on the NPU rather than the CPU. `overlapped`: the fill runs ahead on the fill worker
/// while the NPU runs the weight before (prefetch: fills from the cache), so the NPU side costs
/// the larger of the two; otherwise (packing from the GGUF bytes, done when the weight is
/// reached) their sum.
pub fn stream_pays(cfg: &Config, soc: &SocDesc, mm: &MatMul, terms: precision::Terms, fill_s: f64, overlapped: bool) -> bool {
    if mm.m < cfg.min_m {
        return false;
    }
    let model = CostModel::for_device(soc.clone());
    let cores = cfg.max_cores.unwrap_or(model.soc.cores);
    let t_npu = model.npu_host(mm.m, mm.k, mm.n, terms, cores, activation::Chain::default()).0;
    let t = if overlapped { t_npu.max(fill_s) } else { t_npu + fill_s };
    t < model.cpu_s(mm.m, mm.k, mm.n, mm.ggml_type)
}

/// Published-figure cost model for one SoC, with the host's measured work around each NPU run.
/// Times in seconds.
#[derive(Clone, Debug)]
pub struct CostModel {
    pub soc: SocDesc,
    pub submit_floor_s: f64,
    /// int8 MAC rate of all cores together (ops/s, 2 ops per MAC).
    pub npu_ops: f64,
    pub npu_feed_bps: f64,
    pub cpu_ops: f64,
    pub cpu_bps: f64,
    pub gpu_bps: f64,
    /// Per MUL_MAT run off the CPU inside llama.cpp (graph split, thread wake-ups).
    pub split_s: f64,
    /// The host's work around each NPU run (None: the NPU-only figure, `ork-route`'s).
    pub host: Option<HostCost>,
}

impl CostModel {
    /// The model for an opened NPU's description (`Npu::soc`): the cores its kernel lets jobs run
    /// on and the int8 rate at the clock its driver reports (`Npu::with_kif`): RK3588 figures as
    /// cited in the module docs; RK3576 scaled by its core count (2 vs 3) for MACs, same floor
    /// and bus.
    pub fn for_device(soc: SocDesc) -> CostModel {
        let t = soc.timing;
        CostModel {
            submit_floor_s: t.submit_floor_ns as f64 * 1e-9,
            npu_ops: t.core_ops as f64 * soc.cores as f64,
            npu_feed_bps: t.feed_bps as f64,
            cpu_ops: 1.0e11,
            cpu_bps: 17.2e9,
            gpu_bps: 10e9,
            split_s: 0.87e-3,
            host: Some(HostCost::MEASURED),
            soc,
        }
    }

    /// The NPU planner's plan for `[M,K]×[N,K]ᵀ` on `cores` cores; None when the NPU layout
    /// cannot hold it.
    fn npu_plan(&self, m: usize, k: usize, n: usize, cores: u32) -> Option<crate::npu::plan::Plan> {
        if k == 0 || n == 0 || k % self.soc.k_align as usize != 0 || n % self.soc.n_align as usize != 0 {
            return None;
        }
        let geom = crate::npu::layout::WeightGeometry::new(&self.soc, n, k);
        Some(crate::npu::plan::plan(&self.soc, &geom, m.max(1), cores))
    }

    /// Submits on the busiest core of the NPU runs of one MUL_MAT with `terms` (both weight
    /// terms' runs), None when the NPU layout cannot hold it.
    pub fn npu_submits(&self, m: usize, k: usize, n: usize, terms: precision::Terms, cores: u32) -> Option<usize> {
        let busiest = |rows: usize| self.npu_plan(rows, k, n, cores).map(|p| p.cores.iter().map(|c| c.submits.len()).max().unwrap_or(1));
        let lo = if terms.weight > 1 { busiest(precision::LO_ACT_TERMS.min(terms.act) * m)? } else { 0 };
        Some(busiest(terms.act * m)? + lo)
    }

    /// One NPU MUL_MAT with the host's work around it ([`HostCost::combine`] of [`Self::npu_s`]
    /// and [`HostCost::host_parts`], in the pieces the backend cuts it into: one activation term
    /// and `npu::plan::pipeline_bounds`), and which ends of it `pipeline_bounds` cuts short: of
    /// the cuts the backend may make (the first piece short only where its activation is
    /// quantized, not `held`), the one this model gives the least time. A short end takes its
    /// piece's pass off the critical path and costs the NPU one more feed of the weight; the
    /// cheaper the host's passes against that feed, the fewer ends pay. The calibrated
    /// correction is not in it (`mean_correct_s`). `chain`: where it stands among the MUL_MATs
    /// reading its activation ([`activation::Chain`]) — held: it reads the activation the
    /// MUL_MAT before quantized, no activation pass, and the first piece is not cut short.
    pub fn npu_host(&self, m: usize, k: usize, n: usize, terms: precision::Terms, cores: u32, chain: activation::Chain) -> (f64, crate::npu::plan::Ends) {
        use crate::npu::plan::Ends;
        let held = chain.held;
        let plain = Ends { first: !held, last: true };
        let npu = self.npu_s(m, k, n, terms, cores);
        let Some(host) = self.host.filter(|_| npu.is_finite() && m > 0) else { return (npu, plain) };
        let (serial, passes) = host.host_parts(m, k, n, terms, held);
        if terms != precision::Terms::PLAIN || !host.pipelined {
            return (host.combine(npu, serial, passes, 1, 1.0, 1.0), plain);
        }
        let geom = crate::npu::layout::WeightGeometry::new(&self.soc, n, k);
        let share = |b: (usize, usize)| (b.1 - b.0) as f64 / m as f64;
        let firsts: &[bool] = if held { &[false] } else { &[false, true] };
        let mut best = (f64::INFINITY, plain);
        for &first in firsts {
            for last in [false, true] {
                let ends = Ends { first, last };
                let bounds = crate::npu::plan::pipeline_bounds(&self.soc, &geom, m, cores, ends);
                // A piece that splits an M-tile runs one more program: its weight fed once more
                let refeed = crate::npu::plan::extra_m_tiles(&self.soc, &geom, &bounds) as f64 * (k * n) as f64 / self.npu_feed_bps;
                // Held on the graph's word: the walk vouches for the activation, so its pass (the
                // reuse check, run only where nothing vouches) does not run.
                let (passes, first_share) = if held && bounds.len() > 1 { ((0.0, passes.1), 0.0) } else { (passes, share(bounds[0])) };
                let last_share = share(bounds[bounds.len() - 1]);
                let t = host.combine(npu + refeed, serial, passes, bounds.len(), first_share, last_share);
                if t < best.0 {
                    best = (t, ends);
                }
            }
        }
        best
    }

    /// NPU time of one MUL_MAT: max(submits × floor, MACs + weight feed) with `terms` int8 terms:
    /// the activation terms against the first weight term, and `precision::LO_ACT_TERMS` of them
    /// against the second (a second run: its own submits, its own weight feed). The MACs are the
    /// busiest core's: the run ends with it (N = 2048 on three cores: 704, 672 and 672 columns).
    pub fn npu_s(&self, m: usize, k: usize, n: usize, terms: precision::Terms, cores: u32) -> f64 {
        let (Some(submits), Some(plan)) = (self.npu_submits(m, k, n, terms, cores), self.npu_plan(m, k, n, cores)) else { return f64::INFINITY };
        let n_max = plan.cores.iter().map(|c| c.ncols).max().unwrap_or(n);
        let macs = 2.0 * (terms.rows() * m) as f64 * k as f64 * n_max as f64 / (self.npu_ops / self.soc.cores as f64);
        let feed = (terms.weight * k * n) as f64 / self.npu_feed_bps;
        (submits as f64 * self.submit_floor_s).max(macs + feed)
    }

    /// Host time of the calibrated correction (`quant::mean::correct_along`): per row a K-dot
    /// and N multiply-adds, after the NPU run (at ggml-cpu's int8 rate: not measured).
    pub fn mean_correct_s(&self, m: usize, k: usize, n: usize) -> f64 {
        2.0 * m as f64 * (k + n) as f64 / self.cpu_ops
    }

    /// CPU time: compute-bound or bandwidth-bound, whichever is slower.
    pub fn cpu_s(&self, m: usize, k: usize, n: usize, ggml_type: u32) -> f64 {
        let ops = 2.0 * m as f64 * k as f64 * n as f64 / self.cpu_ops;
        let bytes = k as f64 * n as f64 * bytes_per_weight(ggml_type) / self.cpu_bps;
        ops.max(bytes)
    }

    /// GPU (Mali) decode time: bandwidth-bound.
    pub fn gpu_s(&self, m: usize, k: usize, n: usize, ggml_type: u32) -> f64 {
        let bytes = k as f64 * n as f64 * bytes_per_weight(ggml_type) / self.gpu_bps;
        bytes * m.max(1) as f64
    }
}

/// One MUL_MAT to route.
#[derive(Clone, Copy, Debug)]
pub struct MatMul {
    pub m: usize,
    pub k: usize,
    pub n: usize,
    pub ggml_type: u32,
}

/// A routing decision: the engine, and the predicted seconds on (npu, cpu, gpu) with the split
/// overhead included (the GPU's infinite where none is open).
#[derive(Clone, Debug)]
pub struct Decision {
    pub engine: Engine,
    pub predicted: (f64, f64, f64),
}

/// The ends of a pipelined MUL_MAT the backend cuts short ([`CostModel::npu_host`] of the
/// configured SoC's model), where it stands among the MUL_MATs reading its activation (`chain`).
pub fn pipeline_ends(soc: &SocDesc, m: usize, k: usize, n: usize, terms: precision::Terms, cores: u32, chain: activation::Chain) -> crate::npu::plan::Ends {
    CostModel::for_device(soc.clone()).npu_host(m, k, n, terms, cores, chain).1
}

/// Decides the engine for one MUL_MAT (see the module docs for both policies), for a weight of
/// the common role (`precision::Role::Other`, which the budget never gives extra terms, so no
/// model's work is needed) reading an activation of its own.
pub fn decide(cfg: &Config, soc: &SocDesc, mm: &MatMul, av: Availability) -> Decision {
    let p = precision::decide(cfg, precision::Role::Other, crate::quant::types::is_float(mm.ggml_type), &[0; precision::ROLES], mm.k);
    decide_precision(cfg, &CostModel::for_device(soc.clone()), mm, p, activation::Chain::default(), av)
}

/// [`decide`] with the cost model `model` (`ork-route`'s) for a weight of precision `p`
/// (`precision::decide`), standing as `chain` among the MUL_MATs that read its activation.
pub fn decide_precision(cfg: &Config, model: &CostModel, mm: &MatMul, p: precision::Precision, chain: activation::Chain, av: Availability) -> Decision {
    let phase = Phase::of(cfg, mm.m);
    let cores = cfg.max_cores.unwrap_or(model.soc.cores);
    let split = |s: f64| s + if phase == Phase::Decode { model.split_s } else { 0.0 };
    // The calibrated correction's host work follows the NPU run (none in the NPU-only figure).
    let host = if p.mean_correct && model.host.is_some() { model.mean_correct_s(mm.m, mm.k, mm.n) } else { 0.0 };
    let t_npu = split(model.npu_host(mm.m, mm.k, mm.n, p.terms, cores, chain).0 + host);
    let t_cpu = model.cpu_s(mm.m, mm.k, mm.n, mm.ggml_type);
    let t_gpu = if av.gpu { split(model.gpu_s(mm.m, mm.k, mm.n, mm.ggml_type)) } else { f64::INFINITY };
    let engine = match cfg.route {
        RoutePolicy::Threshold => choose(cfg, mm.m, av.gpu),
        RoutePolicy::Cost => {
            let time = |e: &Engine| match e { Engine::Npu => t_npu, Engine::Gpu => t_gpu, Engine::Cpu => t_cpu };
            // The first of equal times wins.
            candidates(cfg, phase, av).min_by(|a, b| time(a).total_cmp(&time(b))).unwrap_or(Engine::Cpu)
        }
    };
    Decision { engine, predicted: (t_npu, t_cpu, t_gpu) }
}

/// The engines the cost policy weighs for a MUL_MAT of `phase`, in its order: the CPU; the NPU
/// unless decode is kept off it (`ORK_DECODE=cpu|gpu`, or the NPU busy: decode never waits for
/// it); for decode, the GPU where one is open and `ORK_DECODE=auto|gpu`.
pub fn candidates(cfg: &Config, phase: Phase, av: Availability) -> impl Iterator<Item = Engine> {
    let decode = phase == Phase::Decode;
    let npu = !decode || (matches!(cfg.decode, DecodeSelect::Auto | DecodeSelect::Npu) && !av.npu_busy);
    let gpu = decode && av.gpu && matches!(cfg.decode, DecodeSelect::Auto | DecodeSelect::Gpu);
    [(Engine::Cpu, true), (Engine::Npu, npu), (Engine::Gpu, gpu)].into_iter().filter(|e| e.1).map(|e| e.0)
}

/// The threshold policy: the NPU from `ORK_MINM` rows, below it what `ORK_DECODE` names (the
/// GPU only where `gpu_ready`), else the CPU.
pub fn choose(cfg: &Config, m: usize, gpu_ready: bool) -> Engine {
    match cfg.decode {
        _ if m >= cfg.min_m => Engine::Npu,
        DecodeSelect::Npu => Engine::Npu,
        DecodeSelect::Gpu if gpu_ready => Engine::Gpu,
        DecodeSelect::Gpu | DecodeSelect::Cpu | DecodeSelect::Auto => Engine::Cpu,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::npu::soc::SocId;

    fn cfg(pairs: &[(&str, &str)]) -> Config {
        let m: std::collections::HashMap<_, _> = pairs.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect();
        Config::from_lookup(|k| m.get(k).cloned()).0
    }

    /// Streaming a Qwen3-1.7B FFN weight (2048 × 6144, one term) pays at pp512 from the cache
    /// (its ~5 ms fill hides under the ~9 ms NPU run) and packed again (sum ~65 ms against the
    /// CPU's ~130 ms); not below ORK_MINM, and not where the fill outweighs the CPU (M = 32
    /// packed again).
    #[test]
    fn streaming_pays_where_the_fill_beats_the_cpu() {
        let c = cfg(&[]);
        let (k, n) = (2048, 6144);
        let terms = precision::Terms { weight: 1, act: 1 };
        let s = StreamCost::MEASURED;
        let cached = s.fill_s((k * n) as u64, (k * n) as u64, true);
        let packed = s.fill_s((k * n) as u64, (k * n) as u64, false);
        assert!((cached - 2.5 * 12_582_912.0 / 6.0e9).abs() < 1e-9, "{cached}");
        assert!(packed > 10.0 * cached);
        let mm = |m| MatMul { m, k, n, ggml_type: crate::quant::types::Q8_0 };
        assert!(stream_pays(&c, &SocDesc::get(SocId::Rk3588), &mm(512), terms, cached, true));
        assert!(stream_pays(&c, &SocDesc::get(SocId::Rk3588), &mm(512), terms, packed, false));
        assert!(!stream_pays(&c, &SocDesc::get(SocId::Rk3588), &mm(16), terms, cached, true), "decode: M < ORK_MINM");
        assert!(!stream_pays(&c, &SocDesc::get(SocId::Rk3588), &mm(32), terms, packed, false), "the pack costs more than the CPU's run");
        // Overlap matters: the same fill, not run ahead, costs the sum.
        let model = CostModel::for_device(SocDesc::get(SocId::Rk3588));
        let npu = model.npu_host(512, k, n, terms, 3, activation::Chain::default()).0;
        let cpu = model.cpu_s(512, k, n, crate::quant::types::Q8_0);
        let fill = cpu - npu / 2.0;
        assert!(stream_pays(&c, &SocDesc::get(SocId::Rk3588), &mm(512), terms, fill, true) && !stream_pays(&c, &SocDesc::get(SocId::Rk3588), &mm(512), terms, fill, false));
    }

    #[test]
    fn threshold_and_overrides() {
        let c = cfg(&[]);
        assert_eq!(choose(&c, 32, false), Engine::Npu);
        assert_eq!(choose(&c, 31, false), Engine::Cpu);
        let c = cfg(&[("ORK_MINM", "1")]);
        assert_eq!(choose(&c, 1, false), Engine::Npu);
        let c = cfg(&[("ORK_DECODE", "npu")]);
        assert_eq!(choose(&c, 1, false), Engine::Npu);
        let c = cfg(&[("ORK_DECODE", "gpu")]);
        assert_eq!(choose(&c, 1, true), Engine::Gpu);
        assert_eq!(choose(&c, 1, false), Engine::Cpu);
    }

    #[test]
    fn cost_model_matches_published_kernel_figures() {
        let m = CostModel::for_device(SocDesc::get(SocId::Rk3588));
        // seed 001: 2048² M=1 decode on 3 cores: 176 µs measured (the submit floor dominates).
        let dec = m.npu_s(1, 2048, 2048, precision::Terms::PLAIN, 3);
        assert!((150e-6..=260e-6).contains(&dec), "decode 2048² = {dec}");
        // seed 001: 512×2048×2048 on 3 cores: 4439 µs measured with host work; MACs alone less.
        let pre = m.npu_s(512, 2048, 2048, precision::Terms::PLAIN, 3);
        assert!((2.5e-3..=4.5e-3).contains(&pre), "prefill 512×2048² = {pre}");
        // CPU decode of a Q8_0 2048² weight is bandwidth-bound: 4.46 MB / 17.2 GB/s.
        let cpu = m.cpu_s(1, 2048, 2048, 8);
        assert!((cpu - 2048.0 * 2048.0 * 34.0 / 32.0 / 17.2e9).abs() < 1e-9);
    }

    #[test]
    fn cost_policy_is_phase_aware() {
        let c = cfg(&[("ORK_ROUTE", "cost")]);
        let big = |m| MatMul { m, k: 2048, n: 6144, ggml_type: 8 };
        let av = Availability::default();
        assert_eq!(decide(&c, &SocDesc::get(SocId::Rk3588), &big(512), av).engine, Engine::Npu, "prefill is compute-bound");
        assert_eq!(decide(&c, &SocDesc::get(SocId::Rk3588), &big(1), av).engine, Engine::Cpu, "decode pays the split overhead");
        // A tiny weight: the submit floor makes the CPU faster even at M = 32.
        let tiny = MatMul { m: 32, k: 64, n: 64, ggml_type: 8 };
        assert_eq!(decide(&c, &SocDesc::get(SocId::Rk3588), &tiny, av).engine, Engine::Cpu);
        // NPU busy: decode never waits for it.
        let c = cfg(&[("ORK_ROUTE", "cost"), ("ORK_DECODE", "npu")]);
        let busy = Availability { gpu: false, npu_busy: true };
        assert_eq!(decide(&c, &SocDesc::get(SocId::Rk3588), &big(1), busy).engine, Engine::Cpu);
    }

    #[test]
    fn the_opened_devices_cores_and_clock_price_the_npu() {
        let nominal = SocDesc::get(SocId::Rk3588);
        let mut port = nominal.clone();
        port.cores = 1;
        port.timing = port.timing.at_clock(200_000_000);
        let (a, b) = (CostModel::for_device(nominal), CostModel::for_device(port));
        assert!((b.npu_ops * 15.0 / a.npu_ops - 1.0).abs() < 1e-9, "a fifth of the clock on a third of the cores");
        assert_eq!(b.npu_feed_bps, a.npu_feed_bps);
        let (t, chain) = (precision::Terms::PLAIN, activation::Chain::default());
        let (fast, slow) = (a.npu_host(512, 2048, 2048, t, 3, chain).0, b.npu_host(512, 2048, 2048, t, 1, chain).0);
        assert!(slow > 5.0 * fast, "a compute-bound prefill MUL_MAT: {slow} s vs {fast} s");
    }

}
