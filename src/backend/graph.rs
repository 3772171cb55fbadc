//! Which ops ORK takes, and the graph walk of one `graph_compute` call, on plain values.
//!
//! `crate::ffi` turns each node of a ggml graph into a [`Node`] (op kind, MUL_MAT shape, weight
//! handle, source addresses) and implements [`Graph`] over the live graph: the node values, a
//! weight's bytes, a MUL_MAT's activation and output slices, and running a range of nodes on
//! ggml's CPU backend. Everything decided per node — the engine (`crate::route`, remembered per
//! shape), the NPU weight lookup, batching GPU decode jobs and writing them out before a node
//! reads one of their outputs, holding the NPU arbiter across NPU matmuls, handing the rest to
//! ggml-cpu in runs, the counters and the whole-graph log lines — is decided here.

use super::buffer::{packed_weight, Tensor};
use super::gpu::{self, GpuJob};
use super::stream::StreamSrc;
use super::weights::Placed;
use super::{mul_mat_unsupported, Device, MatMulShape, PackedWeight, WeightStore};
use crate::config::RoutePolicy;
use crate::route::arbiter::Hold;
use crate::route::activation::{self, Act, Link, Step};
use crate::route::{Availability, Engine, MatMul, Phase};
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Instant;

pub use super::buffer::{Name, WeightData};

/// Sources per node (ggml's `GGML_MAX_SRC`).
pub const MAX_SRC: usize = 10;

/// One graph node as the walk sees it. (A graph call's nodes are read once into the walk's
/// view: a few hundred bytes a node, made only for graphs ORK computes.)
#[derive(Clone, Copy)]
#[allow(clippy::large_enum_variant)]
pub enum Node<'g> {
    /// An op that only reinterprets memory (NONE, RESHAPE, VIEW, PERMUTE, TRANSPOSE): no work.
    View,
    MulMat(MulMatNode<'g>),
    /// Any other op: ggml's CPU backend runs it. It writes the memory of the tensor at this
    /// address (the node itself, or the tensor it is a view of).
    Other(usize),
}

impl Node<'_> {
    /// The node as the activation rule reads it (`route::activation`).
    pub fn step(&self) -> Step {
        match self {
            Node::View => Step::View,
            Node::Other(writes) => Step::Work { writes: *writes, act: None },
            Node::MulMat(mm) => {
                let (x, view_of) = mm.srcs[1];
                let act = (x != 0).then_some(Act { tensor: x, base: if view_of != 0 { view_of } else { x } });
                Step::Work { writes: mm.addr, act }
            }
        }
    }
}

/// A MUL_MAT node.
#[derive(Clone, Copy)]
pub struct MulMatNode<'g> {
    /// The node's address: how later nodes name its output as a source.
    pub addr: usize,
    pub name: Name<'g>,
    /// None when a source is missing.
    pub shape: Option<MatMulShape>,
    /// Its weight (src0), when present.
    pub weight: Option<Weight<'g>>,
    /// Every source as `(address, address of the tensor it is a view of)`, 0 for none.
    pub srcs: [(usize, usize); MAX_SRC],
}

/// The weight of a MUL_MAT: the tensor, and where its packed copies live.
#[derive(Clone, Copy)]
pub struct Weight<'g> {
    pub tensor: Tensor<'g>,
    /// The weight store of the ORK buffer holding it (None: not in a live ORK buffer).
    pub store: Option<&'g WeightStore>,
    /// Its buffer holds a model's weights (the `.orkpack` cache is used for it).
    pub model_weight: bool,
    /// Its bytes are ggml-cpu's repacked layout (a `CPU_REPACK` buffer ORK watches): ORK runs it
    /// only from the tiles it packed while the weight was loaded, and never reads the bytes.
    pub repacked: bool,
}

/// A live ggml graph as the walk needs it; implemented by `crate::ffi` over the raw graph.
pub trait Graph<'g> {
    /// Number of nodes.
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Node `i` as plain values.
    fn node(&self, i: usize) -> Node<'g>;
    /// The bytes and dequantizer of the weight of MUL_MAT node `i` (None: no weight data).
    fn weight_data(&self, i: usize) -> Option<WeightData<'_>>;
    /// The activations `[M, K]` and output `[M, N]` of MUL_MAT node `i` (None unless both are
    /// contiguous f32). The walk asks once per MUL_MAT it runs, after writing every pending
    /// output the node reads; ggml keeps both alive for the whole call.
    fn mul_mat_io(&mut self, i: usize) -> Option<(&'g [f32], &'g mut [f32])>;
    /// Runs nodes `nodes` on ggml's CPU backend.
    fn run_cpu(&mut self, nodes: Range<usize>) -> Result<(), String>;
}

/// Per backend instance (stream): the one-time whole-graph log lines.
#[derive(Default)]
pub struct Stream {
    logged_whole_graph: AtomicBool,
    logged_npu_graph: AtomicBool,
}

/// The engine for an accepted MUL_MAT shape (`crate::route`). At graph-split time a busy NPU may
/// send decode to the CPU (cost policy); at compute time the arbiter handles a busy NPU instead.
/// Cost decisions run the NPU planner, so they are remembered per thread by shape and
/// availability (the configuration is fixed for the process): the scheduler and graph_compute
/// ask again for every node of every token.
pub fn engine_for(dev: &Device, s: &MatMulShape, at_split: bool) -> Engine {
    type Key = (usize, usize, usize, u32, bool, bool);
    thread_local! {
        static ROUTES: std::cell::RefCell<std::collections::HashMap<Key, Engine>> = Default::default();
    }
    match dev.cfg.route {
        RoutePolicy::Threshold => crate::route::choose(dev.cfg, s.m, dev.gpu_ready()),
        RoutePolicy::Cost => {
            let av = Availability { gpu: dev.gpu_ready(), npu_busy: at_split && dev.arbiter().busy() };
            let key = (s.m, s.k, s.n, s.weight_type, av.gpu, av.npu_busy);
            super::remembered(&ROUTES, key, || {
                let mm = MatMul { m: s.m, k: s.k, n: s.n, ggml_type: s.weight_type };
                let d = crate::route::decide(dev.cfg, dev.npu.soc(), &mm, av);
                log::trace!("MUL_MAT {}x{}x{}: {} (predicted s on npu, cpu, gpu: {:?})", s.m, s.k, s.n, d.engine.name(), d.predicted);
                d.engine
            })
        }
    }
}

/// Whether ORK takes `node` at graph-split time (ggml's `supports_op`).
pub fn supports(dev: &Device, node: &Node<'_>) -> bool {
    let mm = match node {
        Node::View => return true,
        Node::Other(_) => return false,
        Node::MulMat(mm) => mm,
    };
    let Some(s) = &mm.shape else { return false };
    // Weights known not to fit on the NPU stay on the CPU, and so do ggml-cpu's repacked weights
    // ORK holds no tiles of (their bytes are not the GGUF's any more).
    if mm.weight.is_some_and(|w| w.store.is_some_and(|st| st.is_failed(w.tensor.addr) || (w.repacked && placed_of(&w).is_none()))) {
        log::trace!("MUL_MAT {}x{}x{} declined: weight not resident on the NPU", s.m, s.k, s.n);
        return false;
    }
    // A streamed weight goes to the NPU only where its M makes streaming pay.
    if let Some(Placed::Streamed(ss)) = mm.weight.and_then(|w| placed_of(&w)) {
        if !ss.pays(dev, s.m) {
            log::trace!("MUL_MAT {}x{}x{} declined: streamed weight, the CPU is faster at this M", s.m, s.k, s.n);
            return false;
        }
    }
    if let Some(why) = mul_mat_unsupported(dev, s) {
        log::trace!("MUL_MAT {}x{}x{} declined: {why}", s.m, s.k, s.n);
        return false;
    }
    match engine_for(dev, s, true) {
        Engine::Npu | Engine::Gpu => true,
        Engine::Cpu => {
            dev.stats.declined_small_m.fetch_add(1, Relaxed);
            false
        }
    }
}

/// How the walk runs one MUL_MAT node, decided by [`prepare`] before the walk.
enum Take {
    /// On ggml's CPU backend, with the ops around it.
    Cpu,
    /// On the NPU, with its resident weight.
    Npu(Arc<PackedWeight>),
    /// On the NPU, with its weight filled into stream ring slots when the walk reaches it.
    Streamed(Arc<StreamSrc>),
    /// Batched with the GPU decode jobs.
    Gpu,
}

/// How the walk runs MUL_MAT node `i` (`mm`): on ggml's CPU backend where ORK does not take it
/// (no shape, one `mul_mat_unsupported` refuses, routed to the CPU by [`engine_for`], a weight
/// that cannot be resident: one warning per weight, remembered as not resident; a streamed
/// weight at an M where streaming does not pay), else on the GPU, or on the NPU with its weight,
/// made resident here where it is not yet. A model's weights over the file's mapping are packed
/// at their first graph call, here, before the walk holds the NPU arbiter: no other process
/// waits on the packing.
fn prepare(dev: &Device, graph: &dyn Graph<'_>, i: usize, mm: &MulMatNode<'_>) -> Take {
    let Some(s) = mm.shape.filter(|s| mul_mat_unsupported(dev, s).is_none()) else { return Take::Cpu };
    match engine_for(dev, &s, false) {
        Engine::Cpu => return Take::Cpu,
        Engine::Gpu => return Take::Gpu,
        Engine::Npu => {}
    }
    let Some((w, store)) = mm.weight.as_ref().and_then(|w| Some((w, w.store?))) else { return Take::Cpu };
    let t = &w.tensor;
    let placed = match placed_of(w) {
        Some(placed) => placed,
        None if store.is_failed(t.addr) => return Take::Cpu,
        None => {
            let packed = match graph.weight_data(i) {
                Some(data) => packed_weight(dev, store, t, &data, w.model_weight),
                None => Err(crate::npu::NpuError::NoDevice("no weight data".into())),
            };
            match packed {
                Ok(placed) => placed,
                Err(e) => {
                    dev.stats.not_resident.fetch_add(1, Relaxed);
                    if w.model_weight {
                        // A model's weight packed at first use (read in place from the model
                        // file's mapping, or loaded with --no-mmap): reported like one packed at
                        // load.
                        super::buffer::not_resident(dev, t, &e);
                    } else {
                        log::warn!("MUL_MAT {} runs on the CPU: weight {} not resident on the NPU ({e})", mm.name, t.name);
                    }
                    return Take::Cpu;
                }
            }
        }
    };
    match placed {
        Placed::Resident(pw) => Take::Npu(pw),
        Placed::Streamed(ss) if ss.pays(dev, s.m) => Take::Streamed(ss),
        Placed::Streamed(_) => {
            dev.stream.declined.fetch_add(1, Relaxed);
            Take::Cpu
        }
    }
}

/// Weight `w`'s NPU copy in its store (resident, or streamed past the residency budget), if it
/// has one: one lookup of its slot.
fn placed_of(w: &Weight<'_>) -> Option<Placed> {
    let t = &w.tensor;
    w.store?.placed(t.addr, t.ne[1] as usize, t.ne[0] as usize, t.ggml_type)
}

/// Whether a node with sources `srcs` reads one of the outputs at `pending` (a source is one of
/// them, or a view of one).
pub fn reads_pending(srcs: &[(usize, usize)], pending: &[usize]) -> bool {
    srcs.iter().any(|&(s, view_of)| s != 0 && pending.iter().any(|&d| d == s || d == view_of))
}

/// Books the call's wall time and counter deltas when dropped (`Stats::record_graph`), also when
/// the walk unwinds.
struct Record<'d> {
    dev: &'d Device,
    before: super::GraphSnap,
    t0: Instant,
}

impl Drop for Record<'_> {
    fn drop(&mut self) {
        self.dev.stats.record_graph(self.before, self.t0.elapsed().as_nanos() as u64);
    }
}

/// The state of one walk.
struct Walk<'d, 'g> {
    dev: &'d Device,
    stream: &'d Stream,
    /// The graph's nodes, read through the skin once before the walk, and how each MUL_MAT runs.
    nodes: Vec<Node<'g>>,
    takes: Vec<Take>,
    /// The streamed MUL_MATs: node, weight address, source (the prefetch's list).
    streamed: Vec<(usize, usize, Arc<StreamSrc>)>,
    /// GPU decode matmuls are batched into one submit until a node needs one of their results.
    pending: Vec<GpuJob<'g>>,
    /// The addresses of the pending jobs' nodes.
    pending_dst: Vec<usize>,
    /// Nodes waiting for ggml's CPU backend: from the first one not run yet, and how many of
    /// those are ops (view ops inside the run are passed along but not counted).
    cpu_from: Option<usize>,
    cpu_ops: u64,
    /// The activation (address, length) of the MUL_MAT just run, where it ran on the NPU: the
    /// next MUL_MAT reads the int8 terms it left where the graph shows it reads the same
    /// activation, nothing writing it between (`route::activation`), without hashing it.
    last_act: Option<(usize, usize)>,
    /// The cross-process NPU lock is kept between the NPU matmuls of this call (one flock +
    /// unlock per call, not per matmul) and let go before ggml-cpu runs and on return; taking
    /// and letting it go is arbiter time, as inside `run_mul_mat`.
    hold: Option<Hold<'static>>,
}

/// Runs one `graph_compute` call: ORK's MUL_MATs on the NPU or GPU, the rest on ggml's CPU
/// backend (whole-graph mode). Err: the error line to log; the call failed.
pub fn compute<'g>(dev: &Device, stream: &Stream, graph: &mut dyn Graph<'g>) -> Result<(), String> {
    // Wall time of the whole call and the counters around it, for the profile's host-time lines.
    let _record = Record { dev, before: dev.stats.graph_snap(), t0: Instant::now() };
    // The graph read through the skin once; how each MUL_MAT runs, its weight prepared.
    let nodes: Vec<Node<'g>> = (0..graph.len()).map(|i| graph.node(i)).collect();
    let takes: Vec<Take> = nodes.iter().enumerate().map(|(i, n)| if let Node::MulMat(mm) = n { prepare(dev, &*graph, i, mm) } else { Take::Cpu }).collect();
    let streamed = (nodes.iter().zip(&takes).enumerate())
        .filter_map(|(i, (n, t))| match (n, t) {
            (Node::MulMat(mm), Take::Streamed(ss)) => Some((i, mm.weight.map_or(0, |w| w.tensor.addr), ss.clone())),
            _ => None,
        })
        .collect();
    let mut w = Walk { dev, stream, nodes, takes, streamed, pending: Vec::new(), pending_dst: Vec::new(), cpu_from: None, cpu_ops: 0, last_act: None, hold: None };
    w.walk(graph)
}

impl<'g> Walk<'_, 'g> {
    fn walk(&mut self, graph: &mut dyn Graph<'g>) -> Result<(), String> {
        let dev = self.dev;
        // Whole-graph mode (ggml-rpc-server sends whole splits with no CPU fallback): nodes ORK
        // does not run itself are collected into runs and handed to ggml's CPU backend.
        let npu_before = dev.stats.npu_matmuls.load(Relaxed);
        let n = self.nodes.len();
        // What the graph proves of each MUL_MAT's activation.
        let links = activation::links(&self.nodes.iter().map(Node::step).collect::<Vec<_>>());
        // The first streamed weight's fill starts before the walk reaches it.
        self.prefetch_from(0);
        for (i, &link) in links.iter().enumerate() {
            let mm = match self.nodes[i] {
                Node::View => continue,
                Node::Other(_) => {
                    self.wait_for_cpu(i);
                    continue;
                }
                Node::MulMat(mm) => mm,
            };
            // The NPU's weight (a streamed one filled now; None: the GPU's MUL_MAT), else the
            // MUL_MAT runs on ggml's CPU backend, in place, like any op ORK does not accelerate.
            let npu_w = match &self.takes[i] {
                Take::Cpu => None,
                Take::Npu(pw) => Some(Some(pw.clone())),
                Take::Streamed(ss) => self.fill(&*graph, i, &mm, ss).map(Some),
                Take::Gpu => Some(None),
            };
            let Some(npu_w) = npu_w else {
                // The MUL_MAT after this one holds no terms of its activation; it is counted at
                // its M (1 when it has no shape).
                self.last_act = None;
                let ph = Phase::of(dev.cfg, mm.shape.map_or(1, |s| s.m));
                dev.stats.cpu_mm[(ph == Phase::Decode) as usize].fetch_add(1, Relaxed);
                self.wait_for_cpu(i);
                continue;
            };
            self.run_cpu(graph, i)?;
            if reads_pending(&mm.srcs, &self.pending_dst) {
                self.flush().map_err(|e| format!("GPU decode batch failed: {e}"))?;
            }
            if npu_w.is_some() && self.hold.is_none() {
                self.hold = Some(dev.arbiter().hold());
            }
            let r = self.mul_mat(graph, i, &mm, npu_w.clone(), link);
            // A streamed weight's calibrated direction, computed at its first corrected run, is
            // kept with its source for the next fill.
            if let (Take::Streamed(ss), Some(f)) = (&self.takes[i], npu_w.as_ref().and_then(|pw| pw.fix.get())) {
                let _ = ss.fix.set(f.clone());
            }
            match r {
                Ok(None) => {}
                Ok(Some(job)) => {
                    self.pending.push(job);
                    self.pending_dst.push(mm.addr);
                }
                Err(e) => return Err(format!("MUL_MAT {}: {e}", mm.name)),
            }
        }
        self.release();
        let ran_cpu = self.cpu_ops > 0 || self.stream.logged_whole_graph.load(Relaxed);
        self.run_cpu(graph, n)?;
        let npu_now = dev.stats.npu_matmuls.load(Relaxed);
        if ran_cpu && npu_now > npu_before && !self.stream.logged_npu_graph.swap(true, Relaxed) {
            log::info!(
                "whole-graph mode: a graph of {n} nodes ran {} MUL_MAT on the NPU, the rest on ggml-cpu",
                npu_now - npu_before
            );
        }
        self.flush().map_err(|e| format!("GPU decode batch failed: {e}"))
    }

    /// The weight of streamed MUL_MAT node `i` filled into stream ring slots: the fill that ran
    /// ahead if it was for it, else a fill now; then the fill of the next streamed MUL_MAT (of
    /// this graph, else the weight that followed this one last time) is handed to the worker.
    /// None (the MUL_MAT runs on the CPU): the fill failed (counted).
    fn fill(&self, graph: &dyn Graph<'g>, i: usize, mm: &MulMatNode<'_>, ss: &Arc<StreamSrc>) -> Option<Arc<PackedWeight>> {
        let (dev, w) = (self.dev, mm.weight.as_ref()?);
        let name = w.tensor.name.to_str();
        let data = graph.weight_data(i);
        let src = data.as_ref().and_then(|d| d.source(&w.tensor, &name).ok());
        let r = dev.stream.take(dev, w.tensor.addr, ss, src.as_ref());
        // The next streamed weight of this graph, else the one that came next last time.
        self.prefetch_from(i + 1);
        dev.stream.prefetch_successor(dev, w.tensor.addr);
        r.ok()
    }

    /// Hands the fill of the first streamed MUL_MAT at or after node `from` to the stream worker,
    /// unless a fill runs ahead already.
    fn prefetch_from(&self, from: usize) {
        let dev = self.dev;
        let next = &self.streamed[self.streamed.partition_point(|s| s.0 < from)..];
        if let Some((_, addr, ss)) = next.first().filter(|_| !dev.stream.has_pending()) {
            dev.stream.prefetch(dev, *addr, ss.clone());
        }
    }

    /// Runs one MUL_MAT on the NPU now (`npu_w`: its resident weight), or returns it as a GPU
    /// job to batch (decode routed to the GPU, `npu_w` None). Its shape is one ORK accepts
    /// ([`prepare`]).
    fn mul_mat(&mut self, graph: &mut dyn Graph<'g>, i: usize, mm: &MulMatNode<'_>, npu_w: Option<Arc<PackedWeight>>, link: Link) -> Result<Option<GpuJob<'g>>, String> {
        let s = mm.shape.ok_or("no shape")?;
        let io = graph.mul_mat_io(i);
        let act = io.as_ref().map(|(x, _)| (x.as_ptr() as usize, x.len()));
        // The same activation as the MUL_MAT before (the graph's word), which ran on the NPU
        // with it (the walk's): its int8 terms are this one's.
        let last = self.last_act.take();
        let same = link.held && act.is_some() && last == act;
        let link = Link { held: same, ..link };
        let (x, dst) = io.ok_or("activations/output are not contiguous f32")?;
        let w = mm.weight.as_ref().ok_or("no weight")?;
        // ggml-cpu's repacked weights have no GGUF bytes to read: the NPU runs them from their
        // tiles alone.
        let data = if w.repacked { None } else { Some(graph.weight_data(i).ok_or("no weight data")?) };
        // The per-matmul NPU path leaves the source's name empty: only the CPU fallback reads
        // the source there, and never its name.
        let name = if npu_w.is_none() { w.tensor.name.to_str() } else { "".into() };
        let src = data.as_ref().map(|d| d.source(&w.tensor, &name)).transpose()?;
        let Some(pw) = &npu_w else {
            let store = w.store.ok_or("weight not in an ORK buffer")?;
            let src = src.as_ref().ok_or("a repacked weight has no GPU copy")?;
            let gw = store.get_or_upload_gpu(self.dev, w.tensor.addr, src, s.n, s.k).map_err(|e| e.to_string())?;
            return Ok(Some(GpuJob { w: gw, x, m: s.m, dst }));
        };
        if self.dev.run_mul_mat_linked(pw, src.as_ref(), x, s.m, dst, link) {
            // A run failed and its rows cannot be computed again from the GGUF bytes: ggml-cpu
            // computes the whole MUL_MAT from its repacked weight (counted as fallen back).
            let t0 = Instant::now();
            graph.run_cpu(i..i + 1)?;
            self.dev.stats.cpu_ops.fetch_add(1, Relaxed);
            self.dev.stats.fallback_ns.fetch_add(t0.elapsed().as_nanos() as u64, Relaxed);
            return Ok(None);
        }
        self.last_act = act;
        Ok(None)
    }

    /// Runs the pending GPU jobs in one submit.
    fn flush(&mut self) -> Result<(), String> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let dev = self.dev;
        let t0 = Instant::now();
        let r = gpu::run_batch(dev, &mut self.pending);
        dev.stats.gpu_ns.fetch_add(t0.elapsed().as_nanos() as u64, Relaxed);
        dev.stats.gpu_submits.fetch_add(1, Relaxed);
        dev.stats.gpu_matmuls.fetch_add(self.pending.len() as u64, Relaxed);
        for j in self.pending.iter() {
            let ph = Phase::of(dev.cfg, j.m);
            dev.stats.gpu_phase[(ph == Phase::Decode) as usize].fetch_add(1, Relaxed);
        }
        self.pending.clear();
        self.pending_dst.clear();
        r.map_err(|e| e.to_string())
    }

    /// Lets the NPU arbiter go, if held.
    fn release(&mut self) {
        if let Some(h) = self.hold.take() {
            let t0 = Instant::now();
            drop(h);
            self.dev.stats.arb_ns.fetch_add(t0.elapsed().as_nanos() as u64, Relaxed);
        }
    }

    /// Node `i` joins the nodes waiting for ggml's CPU backend.
    fn wait_for_cpu(&mut self, i: usize) {
        self.cpu_from.get_or_insert(i);
        self.cpu_ops += 1;
    }

    /// Runs the nodes waiting for the CPU, up to node `to` (exclusive), on ggml's CPU backend.
    fn run_cpu(&mut self, graph: &mut dyn Graph<'g>, to: usize) -> Result<(), String> {
        let Some(from) = self.cpu_from.take() else { return Ok(()) };
        let ops = std::mem::take(&mut self.cpu_ops);
        self.release();
        self.flush()?;
        if !self.stream.logged_whole_graph.swap(true, Relaxed) {
            log::info!("whole-graph mode (e.g. ggml-rpc-server -d ORK): ORK runs the ops it does not accelerate on ggml's CPU backend");
        }
        let t0 = Instant::now();
        graph.run_cpu(from..to)?;
        self.dev.stats.cpu_ops.fetch_add(ops, Relaxed);
        self.dev.stats.cpu_ns.fetch_add(t0.elapsed().as_nanos() as u64, Relaxed);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::buffer::ToFloat;
    use super::*;
    use crate::config::Config;
    use crate::npu::soc::SocId;
    use crate::npu::{Npu, NpuConfig, NpuKind};

    const K: usize = 64;
    const N: usize = 64;

    /// A device on the simulator, no cache, no cross-process lock.
    fn sim_device() -> Device {
        sim_device_with(None)
    }

    /// [`sim_device`] with the simulator's fault injection (`ORK_SIM_FAULT` syntax).
    fn sim_device_with(fault: Option<&str>) -> Device {
        let (cfg, bad) = Config::from_lookup(|k| match k {
            "ORK_NPU" => Some("sim".into()),
            "ORK_NPU_LOCK" => Some("off".into()),
            "ORK_CACHE" => Some("0".into()),
            // The unrotated multi-term scheme: its near-exact results let the walk's test check
            // the NPU output to 1 %; the rotated default's accuracy has its own tests
            // (tests/precision.rs).
            "ORK_ROTATE" => Some("0".into()),
            _ => None,
        });
        assert!(bad.is_empty(), "{bad:?}");
        let npu = Npu::open(&NpuConfig {
            kind: NpuKind::Sim,
            soc: Some(SocId::Rk3588),
            max_cores: None,
            pin_cpus: vec![],
            wcache_budget_bytes: Some(256 << 20),
            sim_fault: fault.map(str::to_string),
            ..NpuConfig::default()
        })
            .expect("simulator opens");
        Device { npu, vk: None, cfg: Box::leak(Box::new(cfg)), stats: Default::default(), placement: Default::default(), stream: Default::default(), cache: None, calib: None }
    }

    /// A device on the simulator with the default precision (rotated, one int8 term), no cache,
    /// no cross-process lock, and the calibration store `calib`.
    fn rotated_sim_device(calib: Option<crate::cache::calib::Store>) -> Device {
        let (cfg, bad) = Config::from_lookup(|k| match k {
            "ORK_NPU" => Some("sim".into()),
            "ORK_NPU_LOCK" => Some("off".into()),
            "ORK_CACHE" => Some("0".into()),
            _ => None,
        });
        assert!(bad.is_empty(), "{bad:?}");
        let npu = Npu::open(&NpuConfig { kind: NpuKind::Sim, soc: Some(SocId::Rk3588), pin_cpus: vec![], ..NpuConfig::default() }).expect("simulator opens");
        Device { npu, vk: None, cfg: Box::leak(Box::new(cfg)), stats: Default::default(), placement: Default::default(), stream: Default::default(), cache: None, calib }
    }

    fn f32_row(row: &[u8], out: &mut [f32]) {
        for (o, b) in out.iter_mut().zip(row.chunks_exact(4)) {
            *o = f32::from_le_bytes(b.try_into().unwrap());
        }
    }
    const F32_ROW: ToFloat = &f32_row;

    /// A MUL_MAT node `[M, K] · [N, K]ᵀ` at address `addr`, reading `srcs`.
    fn mul_mat<'g>(addr: usize, m: usize, w: Option<Weight<'g>>, srcs: &[usize]) -> Node<'g> {
        let shape = MatMulShape {
            weight_type: crate::quant::types::F32,
            k: K,
            n: N,
            weight_is_2d: true,
            weight_contiguous: true,
            weight_in_ork_buffer: true,
            weight_unallocated_leaf: false,
            weight_cpu_repacks: false,
            weight_has_to_float: true,
            act_is_f32: true,
            act_contiguous: true,
            m,
            dst_is_f32: true,
            dst_contiguous: true,
            hadamard_hint: false,
            act_min_prec: 0,
        };
        let mut s = [(0, 0); MAX_SRC];
        for (d, &a) in s.iter_mut().zip(srcs) {
            *d = (a, 0);
        }
        Node::MulMat(MulMatNode { addr, name: Name(b"ffn_up-0\0"), shape: Some(shape), weight: w, srcs: s })
    }

    /// A graph of plain nodes: weight bytes, MUL_MAT activations/outputs, and the CPU runs asked for.
    struct Fake<'g> {
        nodes: Vec<Node<'g>>,
        weight: &'g [u8],
        io: Vec<Option<(&'g [f32], &'g mut [f32])>>,
        cpu_runs: Vec<Range<usize>>,
        cpu_fails: bool,
    }

    impl<'g> Graph<'g> for Fake<'g> {
        fn len(&self) -> usize {
            self.nodes.len()
        }
        fn node(&self, i: usize) -> Node<'g> {
            self.nodes[i]
        }
        fn weight_data(&self, _i: usize) -> Option<WeightData<'_>> {
            // No bytes: a repacked weight's (ggml-cpu's layout, never read).
            (!self.weight.is_empty()).then_some(WeightData { bytes: self.weight, row_bytes: 4 * K, to_float: Some(F32_ROW) })
        }
        fn mul_mat_io(&mut self, i: usize) -> Option<(&'g [f32], &'g mut [f32])> {
            self.io[i].take()
        }
        fn run_cpu(&mut self, nodes: Range<usize>) -> Result<(), String> {
            if self.cpu_fails {
                return Err(format!("ggml-cpu returned status -1 for nodes {}..{}", nodes.start, nodes.end));
            }
            self.cpu_runs.push(nodes);
            Ok(())
        }
    }

    fn weight_f32() -> Vec<f32> {
        (0..N * K).map(|i| ((i * 29 % 67) as f32 - 33.0) / 41.0).collect()
    }

    #[test]
    fn a_walk_groups_cpu_runs_around_the_npu_matmul() {
        let dev = sim_device();
        let stream = Stream::default();
        // other, view, NPU MUL_MAT (M = ORK_MINM), other, decode MUL_MAT (M = 1: the CPU)
        let (dst, cpu_runs) = walk(&dev, &stream, |npu, weight| {
            (vec![Node::Other(0x900), Node::View, npu, Node::Other(0x901), mul_mat(0x300, 1, Some(weight), &[0x100])], 2)
        });
        assert_eq!(cpu_runs, vec![0..2, 3..5], "the view stays inside the first run; the decode MUL_MAT joins the second");
        let (m, w) = (M_NPU, weight_f32());
        let x = input(m);
        let s = &dev.stats;
        assert_eq!(s.npu_matmuls.load(Relaxed), 1);
        assert_eq!(s.packed.load(Relaxed), 1, "packed at its first MUL_MAT");
        assert_eq!(s.cpu_ops.load(Relaxed), 3, "two ops and the decode MUL_MAT; not the view");
        assert_eq!([s.cpu_mm[0].load(Relaxed), s.cpu_mm[1].load(Relaxed)], [0, 1]);
        assert_eq!(s.graph[0].calls.load(Relaxed), 1, "the call is booked");
        assert!(stream.logged_whole_graph.load(Relaxed) && stream.logged_npu_graph.load(Relaxed));
        // The NPU result is x · Wᵀ to int8 precision.
        let mut worst = 0f32;
        let mut top = 0f32;
        for r in 0..m {
            for c in 0..N {
                let want: f32 = (0..K).map(|i| x[r * K + i] * w[c * K + i]).sum();
                worst = worst.max((dst[r * N + c] - want).abs());
                top = top.max(want.abs());
            }
        }
        assert!(worst <= 1e-2 * top, "worst error {worst} of {top}");
    }

    /// Rows of the NPU MUL_MAT in [`walk`]'s graphs (ORK_MINM).
    const M_NPU: usize = 32;

    /// The activation `[m, K]` of [`walk`]'s NPU MUL_MAT.
    fn input(m: usize) -> Vec<f32> {
        (0..m * K).map(|i| ((i * 37 % 101) as f32 - 50.0) / 17.0).collect()
    }

    /// Runs on `dev` the graph `nodes(npu, weight)` makes around `npu`, an NPU MUL_MAT
    /// (M = [`M_NPU`], at address 0x100) of the test weight: the nodes and the index `npu` sits at.
    /// Returns that MUL_MAT's output and the CPU runs of the walk.
    fn walk(dev: &Device, stream: &Stream, nodes: impl for<'g> FnOnce(Node<'g>, Weight<'g>) -> (Vec<Node<'g>>, usize)) -> (Vec<f32>, Vec<Range<usize>>) {
        let store = WeightStore::default();
        let wb: Vec<u8> = weight_f32().iter().flat_map(|v| v.to_le_bytes()).collect();
        let tensor = Tensor { addr: wb.as_ptr() as usize, ggml_type: crate::quant::types::F32, ne: [K as i64, N as i64, 1, 1], contiguous: true, is_view: false, name: Name(b"blk.0.ffn_up.weight") };
        let weight = Weight { tensor, store: Some(&store), model_weight: false, repacked: false };
        let x = input(M_NPU);
        let mut dst = vec![0f32; M_NPU * N];
        let (nodes, at) = nodes(mul_mat(0x100, M_NPU, Some(weight), &[]), weight);
        let mut io: Vec<Option<(&[f32], &mut [f32])>> = (0..nodes.len()).map(|_| None).collect();
        io[at] = Some((&x, &mut dst));
        let mut g = Fake { nodes, weight: &wb, io, cpu_runs: vec![], cpu_fails: false };
        compute(dev, stream, &mut g).expect("the walk runs");
        let cpu_runs = std::mem::take(&mut g.cpu_runs);
        drop(g);
        (dst, cpu_runs)
    }

    /// One graph with one NPU MUL_MAT (M = 32) on `dev`: its output.
    fn one_npu_matmul(dev: &Device) -> Vec<f32> {
        walk(dev, &Stream::default(), |npu, _| (vec![npu], 0)).0
    }

    /// Three NPU MUL_MATs of one call reading the same activation, whatever their names and
    /// order: the second and third reuse the first's int8 terms on the graph's word, without
    /// hashing it, also across a node between that writes another tensor. A node between that
    /// writes the activation leaves the MUL_MAT after it to the hash: after the first, the hash
    /// finds nothing held (the first took no key: the graph showed its activation written before
    /// anyone read it again) and the third reuses the second's terms; after the second, the hash
    /// finds the same values (the test's node writes nothing). Every output is the same bits.
    #[test]
    fn the_activation_rule_follows_the_graph() {
        const ACT: usize = 0x50;
        // (a weight name, a node between the first and second MUL_MAT and one between the second
        // and third: the tensor each writes, reused, of those on the graph's word)
        let cases = [
            ("attn_k", [None, None], 2, 2),
            ("mystery", [Some(0x9000), Some(ACT + 1)], 2, 2),
            ("ffn_down", [Some(ACT), None], 1, 1),
            ("attn_v", [None, Some(ACT)], 2, 1),
        ];
        for (name, between, reused, vouched) in cases {
            // Each case on a thread of its own: the held activation lives in the thread's
            // scratch, and this case's input may land where the last case's was (same bytes,
            // same hash: a reuse the case does not count on).
            std::thread::scope(|s| {
                s.spawn(|| {
                    let dev = rotated_sim_device(None);
                    let store = WeightStore::default();
                    let wb: Vec<u8> = weight_f32().iter().flat_map(|v| v.to_le_bytes()).collect();
                    let full = format!("blk.0.{name}.weight");
                    let tensor = Tensor { addr: wb.as_ptr() as usize, ggml_type: crate::quant::types::F32, ne: [K as i64, N as i64, 1, 1], contiguous: true, is_view: false, name: Name(full.as_bytes()) };
                    let weight = Weight { tensor, store: Some(&store), model_weight: false, repacked: false };
                    let x = input(M_NPU);
                    let mut d: Vec<Vec<f32>> = (0..3).map(|_| vec![0f32; M_NPU * N]).collect();
                    let mut nodes = vec![mul_mat(0x100, M_NPU, Some(weight), &[tensor.addr, ACT])];
                    nodes.extend(between[0].map(Node::Other));
                    nodes.push(Node::View);
                    nodes.push(mul_mat(0x200, M_NPU, Some(weight), &[tensor.addr, ACT]));
                    nodes.extend(between[1].map(Node::Other));
                    nodes.push(mul_mat(0x300, M_NPU, Some(weight), &[tensor.addr, ACT]));
                    let mut io: Vec<Option<(&[f32], &mut [f32])>> = (0..nodes.len()).map(|_| None).collect();
                    let at: Vec<usize> = (0..nodes.len()).filter(|&i| matches!(nodes[i], Node::MulMat(_))).collect();
                    for (&i, d) in at.iter().zip(d.iter_mut()) {
                        io[i] = Some((&x, d));
                    }
                    let mut g = Fake { nodes, weight: &wb, io, cpu_runs: vec![], cpu_fails: false };
                    compute(&dev, &Stream::default(), &mut g).expect("the walk runs");
                    drop(g);
                    let s = &dev.stats;
                    assert_eq!(s.npu_matmuls.load(Relaxed), 3);
                    assert_eq!(s.act_reused.load(Relaxed), reused, "MUL_MATs reusing the int8 terms ({name}, between: {between:?})");
                    assert_eq!(s.act_vouched.load(Relaxed), vouched, "reused on the graph's word ({name}, between: {between:?})");
                    assert!(d.iter().all(|o| o.iter().zip(&d[0]).all(|(a, b)| a.to_bits() == b.to_bits())), "the same bits");
                })
                .join()
                .expect("the case runs");
            });
        }
    }

    /// gate and up (`[512, 2048] · [1024, 2048]ᵀ`, rotated, one int8 term, corrected along a
    /// calibrated direction: cut into pieces) reading one activation, as a walk runs them — `between`: a
    /// CPU node between them; `up_on_cpu`: up routed to the NPU but its weight not in an ORK
    /// buffer (ggml-cpu runs it) — against each alone: the bits are each one's alone.
    fn gate_then_up(between: bool, up_on_cpu: bool) {
        const M2: usize = 512;
        const K2: usize = 2048;
        const N2: usize = 1024;
        let dir = std::env::temp_dir().join(format!("ork-graph-chain-{}-{between}-{up_on_cpu}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let cal = dir.join("c.orkcal");
        let dev_with = |record: bool| rotated_sim_device(Some(crate::cache::calib::Store::open(&cal, record)));
        let weights: Vec<Vec<u8>> = (0..2u64)
            .map(|w| (0..N2 * K2).flat_map(|i| ((((i as u64 * 29 + w * 7) % 67) as f32 - 33.0) / 41.0).to_le_bytes()).collect())
            .collect();
        let names = [&b"blk.0.ffn_gate.weight"[..], &b"blk.0.ffn_up.weight"[..]];
        let rows = |seed: usize| -> Vec<f32> { (0..M2 * K2).map(|i| (((i * 37 + seed) % 101) as f32 - 50.0) / 17.0 + (i % K2 == 5) as u8 as f32 * 9.0).collect() };
        let source = |w: usize, name: &'static str| crate::pack::WeightSource { name, ggml_type: crate::quant::types::Q8_0, bytes: &weights[w], row_bytes: 4 * K2, to_float: &f32_row };
        let srcs = [source(0, "blk.0.ffn_gate.weight"), source(1, "blk.0.ffn_up.weight")];
        // Calibration from other rows; then each MUL_MAT alone.
        let rec = dev_with(true);
        for src in &srcs {
            let pw = crate::backend::weights::pack(&rec, src, N2, K2).expect("packs");
            rec.run_mul_mat(&pw, src, &rows(3), M2, &mut vec![0f32; M2 * N2]);
        }
        assert_eq!(rec.calib.as_ref().unwrap().flush().unwrap(), 2);
        let x = rows(11);
        let alone: Vec<Vec<f32>> = srcs
            .iter()
            .map(|src| {
                let dev = dev_with(false);
                let pw = crate::backend::weights::pack(&dev, src, N2, K2).expect("packs");
                let mut y = vec![0f32; M2 * N2];
                dev.run_mul_mat(&pw, src, &x, M2, &mut y);
                assert_eq!(dev.stats.mean_corrected.load(Relaxed), 1, "corrected");
                y
            })
            .collect();
        // The walk.
        let dev = dev_with(false);
        let store = WeightStore::default();
        let node = |w: usize, addr: usize| {
            let tensor = Tensor { addr: weights[w].as_ptr() as usize, ggml_type: crate::quant::types::Q8_0, ne: [K2 as i64, N2 as i64, 1, 1], contiguous: true, is_view: false, name: Name(names[w]) };
            let store = (w == 0 || !up_on_cpu).then_some(&store);
            let Node::MulMat(mut mm) = mul_mat(addr, M2, Some(Weight { tensor, store, model_weight: false, repacked: false }), &[tensor.addr, x.as_ptr() as usize]) else { unreachable!() };
            // A quantized type (F32 bytes read through the row dequantizer): one weight term.
            let sh = mm.shape.as_mut().unwrap();
            (sh.k, sh.n, sh.weight_type) = (K2, N2, crate::quant::types::Q8_0);
            Node::MulMat(mm)
        };
        let mut nodes = vec![node(0, 0x100), Node::View];
        if between {
            nodes.push(Node::Other(x.as_ptr() as usize));
        }
        nodes.push(node(1, 0x200));
        let last = nodes.len() - 1;
        let (mut d1, mut d2) = (vec![0f32; M2 * N2], vec![0f32; M2 * N2]);
        let mut io: Vec<Option<(&[f32], &mut [f32])>> = (0..nodes.len()).map(|_| None).collect();
        io[0] = Some((&x, &mut d1));
        io[last] = Some((&x, &mut d2));
        let data = |w: usize| WeightData { bytes: &weights[w], row_bytes: 4 * K2, to_float: Some(F32_ROW) };
        let mut g = Chain { nodes, data: [data(0), data(1)], io, cpu_runs: vec![] };
        compute(&dev, &Stream::default(), &mut g).expect("the walk runs");
        let cpu_runs = std::mem::take(&mut g.cpu_runs);
        drop(g);
        let _ = std::fs::remove_dir_all(&dir);
        let s = &dev.stats;
        assert_eq!(s.npu_fallbacks.load(Relaxed), 0, "nothing fell back");
        assert!(s.phase[0].pieces.load(Relaxed) >= 2 * s.npu_matmuls.load(Relaxed), "cut into pieces");
        let same = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same(&d1, &alone[0]), "gate: the bits it has alone (between: {between}, up on the CPU: {up_on_cpu})");
        if up_on_cpu {
            assert_eq!((s.npu_matmuls.load(Relaxed), cpu_runs.len()), (1, 1), "up ran on ggml-cpu");
        } else {
            assert_eq!(s.npu_matmuls.load(Relaxed), 2);
            assert!(same(&d2, &alone[1]), "up: the bits it has alone (between: {between})");
        }
    }

    /// A graph of two MUL_MATs of their own weights ([`gate_then_up`]).
    struct Chain<'g> {
        nodes: Vec<Node<'g>>,
        data: [WeightData<'g>; 2],
        io: Vec<Option<(&'g [f32], &'g mut [f32])>>,
        cpu_runs: Vec<Range<usize>>,
    }

    impl<'g> Graph<'g> for Chain<'g> {
        fn len(&self) -> usize {
            self.nodes.len()
        }
        fn node(&self, i: usize) -> Node<'g> {
            self.nodes[i]
        }
        fn weight_data(&self, i: usize) -> Option<WeightData<'_>> {
            Some(self.data[usize::from(i > 0)])
        }
        fn mul_mat_io(&mut self, i: usize) -> Option<(&'g [f32], &'g mut [f32])> {
            self.io[i].take()
        }
        fn run_cpu(&mut self, nodes: Range<usize>) -> Result<(), String> {
            self.cpu_runs.push(nodes);
            Ok(())
        }
    }

    /// gate then up in a walk, up right after gate, after a CPU node, or on ggml-cpu: the bits
    /// are each MUL_MAT's alone in every case.
    #[test]
    fn gate_then_up_in_a_walk_gives_each_ones_bits() {
        gate_then_up(false, false);
        gate_then_up(true, false);
        gate_then_up(false, true);
    }

    /// A weight ggml-cpu repacked (`CPU_REPACK`): ORK packed its tiles from the GGUF bytes as they
    /// were loaded and never reads its bytes again. The NPU runs it from the tiles, to the bit what
    /// it computes for the same weight in ORK's own buffer; without tiles ORK declines it; where
    /// an NPU run fails, ggml-cpu computes the whole MUL_MAT (one CPU run of that node, counted
    /// as fallen back), as no int8 terms can be made again without the GGUF bytes.
    #[test]
    fn a_repacked_weight_runs_from_its_tiles_alone() {
        let run = |dev: &Device, packed: bool| {
            let store = WeightStore::resident_only();
            let wb: Vec<u8> = weight_f32().iter().flat_map(|v| v.to_le_bytes()).collect();
            let tensor = Tensor { addr: wb.as_ptr() as usize, ggml_type: crate::quant::types::F32, ne: [K as i64, N as i64, 1, 1], contiguous: true, is_view: false, name: Name(b"blk.0.ffn_up.weight") };
            if packed {
                // What the CPU_REPACK buffer's set_tensor does with the bytes it is handed.
                let data = WeightData { bytes: &wb, row_bytes: 4 * K, to_float: Some(F32_ROW) };
                assert!(super::super::buffer::packed_weight(dev, &store, &tensor, &data, false).is_ok());
            }
            let weight = Weight { tensor, store: Some(&store), model_weight: false, repacked: true };
            let node = mul_mat(0x100, M_NPU, Some(weight), &[]);
            let took = supports(dev, &node);
            let x = input(M_NPU);
            let mut dst = vec![0f32; M_NPU * N];
            let mut g = Fake { nodes: vec![node], weight: &[], io: vec![Some((&x, &mut dst))], cpu_runs: vec![], cpu_fails: false };
            if took {
                compute(dev, &Stream::default(), &mut g).expect("the walk runs");
            }
            let cpu_runs = std::mem::take(&mut g.cpu_runs);
            drop(g);
            (took, dst, cpu_runs)
        };
        let clean = sim_device();
        let want = one_npu_matmul(&clean);
        let (took, dst, cpu_runs) = run(&clean, true);
        assert!(took && cpu_runs.is_empty());
        assert_eq!(dst, want, "the tiles give the bits the weight gives from ORK's own buffer");
        assert_eq!(clean.stats.npu_matmuls.load(Relaxed), 2);
        assert!(!run(&sim_device(), false).0, "no tiles: ggml-cpu runs it from its own layout");
        let dead = sim_device_with(Some("timeout_every:1"));
        let (took, _, cpu_runs) = run(&dead, true);
        assert!(took);
        assert_eq!(cpu_runs, vec![0..1], "the failed MUL_MAT is ggml-cpu's to compute");
        let s = &dead.stats;
        assert_eq!((s.npu_matmuls.load(Relaxed), s.npu_fallbacks.load(Relaxed), s.cpu_ops.load(Relaxed)), (0, 1, 1));
    }

    #[test]
    fn npu_failures_are_counted_apart_from_npu_runs() {
        let clean = sim_device();
        let want = one_npu_matmul(&clean);
        assert_eq!(clean.stats.npu_matmuls.load(Relaxed), 1);
        // The unrotated scheme runs an F32 weight as two weight terms: two NPU runs per MUL_MAT.
        assert_eq!(clean.npu.health(), crate::npu::Health::default(), "nothing failed on a clean simulator");

        // Every submit fails: the MUL_MAT is computed on the CPU (the same int8 arithmetic, the
        // same floats) and counted as a fallback, not as an NPU run.
        let dead = sim_device_with(Some("timeout_every:1"));
        assert_eq!(one_npu_matmul(&dead), want, "the CPU fallback computes what the NPU would");
        let s = &dead.stats;
        assert_eq!(s.npu_matmuls.load(Relaxed), 0);
        assert_eq!(s.npu_fallbacks.load(Relaxed), 1);
        assert_eq!(s.npu_errors.load(Relaxed), 2, "both weight terms' runs failed");
        assert_eq!(s.phase[0].runs.load(Relaxed), 0);
        assert_eq!(s.phase[0].npu_failed.load(Relaxed), 1);
        assert_eq!(s.submits.load(Relaxed), 0);
        let line = dead.breakdown();
        assert!(line.starts_with("ORK ran 0 MUL_MAT on the NPU (0 rows sent = 0.00x plain W8A8, 0 submits)"), "{line}");
        assert!(line.contains("; 1 MUL_MAT fell back to the CPU after NPU errors (2 failed NPU runs, "), "{line}");
        assert!(dead.profile().contains("prefill MUL_MAT: npu 0 runs"), "{}", dead.profile());

        // The second submit reports done without running: detected, resubmitted, exact, and the
        // MUL_MAT counts as an NPU run with one never-ran job and one resubmit.
        let flaky = sim_device_with(Some("never_run_every:2"));
        assert_eq!(one_npu_matmul(&flaky), want, "the resubmit's result, not the stale output");
        let s = &flaky.stats;
        s.absorb_health(flaky.npu.health());
        assert_eq!((s.npu_matmuls.load(Relaxed), s.npu_fallbacks.load(Relaxed)), (1, 0));
        assert_eq!((s.npu_never_ran.load(Relaxed), s.npu_retries.load(Relaxed)), (1, 1));
        assert!(flaky.breakdown().contains("NPU jobs that reported done but never ran: 1 detected, 1 resubmitted;"), "{}", flaky.breakdown());
        assert_eq!(flaky.npu.fault_report().as_deref().map(|l| l.contains(": 1 submits never ran,")), Some(true));

        // Every submit reports done without running: after the resubmit the run gives up and
        // the CPU computes the MUL_MAT; both never-ran detections of each run are counted.
        let liar = sim_device_with(Some("never_run_every:1"));
        assert_eq!(one_npu_matmul(&liar), want);
        let s = &liar.stats;
        s.absorb_health(liar.npu.health());
        assert_eq!((s.npu_matmuls.load(Relaxed), s.npu_fallbacks.load(Relaxed), s.npu_errors.load(Relaxed)), (0, 1, 2));
        assert_eq!(liar.npu.health(), crate::npu::Health { never_ran: 4, retries: 2, gave_up: 2 });
    }

    #[test]
    fn weights_that_cannot_be_resident_and_cpu_failures() {
        let dev = sim_device();
        let stream = Stream::default();
        let store = WeightStore::default();
        let wb = vec![0u8; 4 * N * K];
        let tensor = Tensor { addr: wb.as_ptr() as usize, ggml_type: crate::quant::types::F32, ne: [K as i64, N as i64, 1, 1], contiguous: true, is_view: false, name: Name(b"w") };
        // A weight outside any live ORK buffer runs on the CPU with the ops around it.
        let loose = Weight { tensor, store: None, model_weight: false, repacked: false };
        let nodes = vec![mul_mat(0x100, 32, Some(loose), &[]), Node::Other(0x900)];
        let mut g = Fake { nodes, weight: &wb, io: vec![None, None], cpu_runs: vec![], cpu_fails: false };
        compute(&dev, &stream, &mut g).unwrap();
        assert_eq!(g.cpu_runs, vec![0..2]);
        assert_eq!(dev.stats.npu_matmuls.load(Relaxed), 0);
        // A failed CPU run fails the call with ggml-cpu's line.
        let nodes = vec![Node::Other(0x900), mul_mat(0x100, 32, Some(Weight { store: Some(&store), ..loose }), &[])];
        let mut g = Fake { nodes, weight: &wb, io: vec![None, None], cpu_runs: vec![], cpu_fails: true };
        assert_eq!(compute(&dev, &stream, &mut g), Err("ggml-cpu returned status -1 for nodes 0..1".to_string()));
        // A MUL_MAT ORK takes without its activations fails the call naming the node.
        let nodes = vec![mul_mat(0x100, 32, Some(Weight { store: Some(&store), ..loose }), &[])];
        let mut g = Fake { nodes, weight: &wb, io: vec![None], cpu_runs: vec![], cpu_fails: false };
        assert_eq!(compute(&dev, &stream, &mut g), Err("MUL_MAT ffn_up-0: activations/output are not contiguous f32".to_string()));
        assert_eq!(dev.stats.graph[0].calls.load(Relaxed), 3, "failed calls are booked too");
    }

    /// A model's weight packed at its first MUL_MAT (read in place from the model file's mapping,
    /// so never written through `set_tensor`) that cannot be resident is reported like one packed
    /// at load: counted in the exit line's "were not made resident", and declined afterwards.
    #[test]
    fn a_model_weight_not_resident_at_first_use_is_counted_like_one_at_load() {
        let dev = sim_device();
        dev.npu.set_residency_budget(0);
        let stream = Stream::default();
        let store = WeightStore::default();
        let wb: Vec<u8> = weight_f32().iter().flat_map(|v| v.to_le_bytes()).collect();
        let tensor = Tensor { addr: wb.as_ptr() as usize, ggml_type: crate::quant::types::F32, ne: [K as i64, N as i64, 1, 1], contiguous: true, is_view: false, name: Name(b"blk.0.ffn_up.weight") };
        for (model_weight, counted) in [(false, 0), (true, 1)] {
            let w = Weight { tensor, store: Some(&store), model_weight, repacked: false };
            store.clear();
            let nodes = vec![mul_mat(0x100, M_NPU, Some(w), &[])];
            let mut g = Fake { nodes, weight: &wb, io: vec![None], cpu_runs: vec![], cpu_fails: false };
            compute(&dev, &stream, &mut g).expect("the walk runs");
            assert_eq!(g.cpu_runs, vec![0..1], "the MUL_MAT runs on the CPU");
            assert_eq!(dev.stats.not_resident_weights.load(Relaxed), counted, "model weight: {model_weight}");
            assert!(store.is_failed(tensor.addr));
            assert!(!supports(&dev, &mul_mat(0x100, M_NPU, Some(w), &[])), "declined once known not resident");
        }
        assert_eq!(dev.stats.not_resident.load(Relaxed), 2);
        assert!(dev.breakdown().contains("; 0 weights kept one int8 term for want of resident budget and 1 were not made resident"), "{}", dev.breakdown());
    }

    /// A weight is packed at its first MUL_MAT by the pre-pass (`prepare`), before the walk
    /// holds the NPU arbiter (no other process waits on the packing); afterwards it is found
    /// resident.
    #[test]
    fn a_first_use_pack_happens_before_the_walk() {
        let dev = sim_device();
        let store = WeightStore::default();
        let wb: Vec<u8> = weight_f32().iter().flat_map(|v| v.to_le_bytes()).collect();
        let tensor = Tensor { addr: wb.as_ptr() as usize, ggml_type: crate::quant::types::F32, ne: [K as i64, N as i64, 1, 1], contiguous: true, is_view: false, name: Name(b"blk.0.ffn_up.weight") };
        let w = Weight { tensor, store: Some(&store), model_weight: true, repacked: false };
        let g = Fake { nodes: vec![mul_mat(0x100, M_NPU, Some(w), &[])], weight: &wb, io: vec![None], cpu_runs: vec![], cpu_fails: false };
        let Node::MulMat(mm) = g.nodes[0] else { unreachable!() };
        assert!(matches!(prepare(&dev, &g, 0, &mm), Take::Npu(_)), "packed");
        assert!(matches!(prepare(&dev, &g, 0, &mm), Take::Npu(_)), "resident");
        assert_eq!(dev.stats.packed.load(Relaxed), 1, "packed once");
    }

    #[test]
    fn supports_takes_views_and_routable_matmuls() {
        let dev = sim_device();
        let store = WeightStore::default();
        let tensor = Tensor { addr: 0x1000, ggml_type: crate::quant::types::F32, ne: [K as i64, N as i64, 1, 1], contiguous: true, is_view: false, name: Name(b"w") };
        let w = Weight { tensor, store: Some(&store), model_weight: false, repacked: false };
        assert!(supports(&dev, &Node::View));
        assert!(!supports(&dev, &Node::Other(0x900)));
        assert!(supports(&dev, &mul_mat(1, 32, Some(w), &[])));
        assert!(!supports(&dev, &mul_mat(1, 1, Some(w), &[])), "decode stays on the CPU (ORK_DECODE=auto)");
        assert_eq!(dev.stats.declined_small_m.load(Relaxed), 1);
        let Node::MulMat(mut mm) = mul_mat(1, 32, Some(w), &[]) else { unreachable!() };
        mm.shape.as_mut().unwrap().hadamard_hint = true;
        assert!(!supports(&dev, &Node::MulMat(mm)), "declined by mul_mat_unsupported");
        mm.shape = None;
        assert!(!supports(&dev, &Node::MulMat(mm)), "a source missing");
    }

    #[test]
    fn a_node_reading_a_pending_output_or_a_view_of_one_flushes() {
        let pending = [0x100, 0x200];
        let srcs = |s: &[(usize, usize)]| {
            let mut a = [(0, 0); MAX_SRC];
            a[..s.len()].copy_from_slice(s);
            a
        };
        assert!(reads_pending(&srcs(&[(0x500, 0), (0x200, 0)]), &pending), "a source is a pending output");
        assert!(reads_pending(&srcs(&[(0x600, 0x100)]), &pending), "a source views a pending output");
        assert!(!reads_pending(&srcs(&[(0x500, 0x700)]), &pending));
        assert!(!reads_pending(&srcs(&[]), &pending), "no sources");
        assert!(!reads_pending(&srcs(&[(0x100, 0)]), &[]), "nothing pending");
    }
}
