//! The backend (stream) callbacks (`backend_*`): graph compute hands the live graph to
//! `crate::backend::graph::compute` as a [`Graph`], with ggml's CPU backend for the nodes ORK
//! does not run itself.

use super::abi::*;
use super::host::{self, BackendFns};
use super::registry::{device, layout, registry, GUID};
use super::{api, guard, node, tensor, Poison};
use crate::backend::graph::{self, Graph, Node, Stream, WeightData};
use crate::backend::report;
use std::ffi::{c_char, c_void};
use std::marker::PhantomData;
use std::ops::Range;
use std::ptr::null;
use std::sync::atomic::{AtomicI32, Ordering::Relaxed};
use std::sync::Mutex;

/// Per backend instance (stream) state: the walk's per-stream state, the CPU backend whole-graph
/// mode hands non-matmul nodes to (created on first need) and the thread count for it.
struct BackendCtx {
    stream: Stream,
    cpu: Mutex<Option<CpuBackend>>,
    n_threads: AtomicI32,
    poison: Poison,
}

struct CpuBackend {
    backend: ggml_backend_t,
    set_threads: ggml_backend_set_n_threads_t,
    threads: i32,
}

// SAFETY: the CPU backend pointer is used only under the Mutex, from one graph_compute at a time.
unsafe impl Send for CpuBackend {}

impl Drop for CpuBackend {
    fn drop(&mut self) {
        if let Ok(c) = api::cpu() {
            // SAFETY: created by ggml_backend_dev_init and freed once, here.
            unsafe { (c.backend_free)(self.backend) };
        }
    }
}

impl BackendCtx {
    /// The context of `b` if it is one of ORK's backends (pointer reads only).
    ///
    /// # Safety
    /// `b` is NULL or a live ggml backend.
    unsafe fn of<'a>(b: ggml_backend_t) -> Option<&'a BackendCtx> {
        // SAFETY: a live backend (caller). Its guid and context sit at the same offsets in every
        // supported layout (host.rs test `layouts_differ_where_the_headers_say_and_agree_elsewhere`).
        let b = unsafe { b.as_ref() }?;
        // SAFETY: backends with ORK's guid were made by `new`, whose context is a BackendCtx
        // that lives until `backend_free`.
        (std::ptr::eq(b.guid, &GUID) && !b.context.is_null()).then(|| unsafe { &*(b.context as *const BackendCtx) })
    }
}

/// Runs backend callback `name` on backend context `c` (from [`BackendCtx::of`]), behind the
/// backend's poisoned flag; `fail` when there is none.
fn with_backend<R>(name: &str, c: Option<&BackendCtx>, fail: R, f: impl FnOnce(&BackendCtx) -> R) -> R {
    match c {
        Some(c) => c.poison.guard(name, fail, || f(c)),
        None => {
            log::error!("{name}: not an ORK backend; returning failure to ggml");
            fail
        }
    }
}

/// The backend's callbacks; `host::new_backend` lays them out in the host's table shape.
const BACKEND_FNS: BackendFns = BackendFns { get_name: backend_get_name, free: backend_free, graph_compute: backend_graph_compute };

/// A new backend (stream) on device `dev`, in the host's layout (NULL before the registry knows it).
pub(super) fn new(dev: ggml_backend_dev_t) -> ggml_backend_t {
    let Some(l) = layout() else { return std::ptr::null_mut() };
    let ctx = Box::new(BackendCtx {
        stream: Stream::default(),
        cpu: Mutex::new(None),
        n_threads: AtomicI32::new(0),
        poison: Poison::new("backend"),
    });
    host::new_backend(l, &BACKEND_FNS, &GUID as *const ggml_guid as *mut ggml_guid, dev, Box::into_raw(ctx) as *mut c_void)
}

/// llama.cpp makes a context (and ORK's backend) once a model's weights are loaded. Packing a
/// weight (as it loads, `repack`, or at its first MUL_MAT) allocates and frees a few MiB per
/// weight; glibc keeps such freed blocks in its heaps, where they would count in the process's
/// memory for good. They are handed back to the system once per context, and after a graph that
/// packed weights.
pub(super) fn give_back_load_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: glibc's malloc_trim only releases free memory of its own heaps.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// The `ggml_backend_set_n_threads` proc ORK's registry hands out.
pub(super) unsafe extern "C" fn backend_set_n_threads(b: ggml_backend_t, n: i32) -> bool {
    // SAFETY: the proc is handed out by our reg, so ggml calls it with a live backend; `of`
    // checks the guid before touching the context.
    let c = unsafe { BackendCtx::of(b) };
    if c.is_none() {
        return false;
    }
    with_backend("backend_set_n_threads", c, false, |c| {
        c.n_threads.store(n.max(1), Relaxed);
        crate::os::team::set_openmp_threads(n.max(1) as usize);
        true
    })
}

unsafe extern "C" fn backend_get_name(_b: ggml_backend_t) -> *const c_char {
    guard("backend_get_name", null(), || registry().name.as_ptr())
}

/// Frees the backend whatever state it is in (also when poisoned).
unsafe extern "C" fn backend_free(b: ggml_backend_t) {
    guard("backend_free", (), || {
        if let Some(dev) = device() {
            report::finish(dev);
        }
        // SAFETY: ggml calls this with one of its live backends; `of` checks it is ORK's.
        if unsafe { BackendCtx::of(b) }.is_none() {
            return;
        }
        let Some(l) = layout() else { return };
        // SAFETY: an ORK backend, made by `new` in the registry's layout; ggml frees each once.
        let context = unsafe { host::free_backend(l, b) };
        if !context.is_null() {
            // SAFETY: the BackendCtx boxed in `new`.
            drop(unsafe { Box::from_raw(context as *mut BackendCtx) });
        }
    })
}

unsafe extern "C" fn backend_graph_compute(b: ggml_backend_t, g: *mut ggml_cgraph) -> ggml_status {
    // SAFETY: ggml calls a backend's callbacks with that live backend.
    let c = unsafe { BackendCtx::of(b) };
    with_backend("backend_graph_compute", c, GGML_STATUS_FAILED, |ctx| {
        let (Some(dev), Ok(api), false) = (device(), api::get(), g.is_null()) else { return GGML_STATUS_FAILED };
        // SAFETY: a live graph from the scheduler.
        let n = unsafe { (api.graph_n_nodes)(g) }.max(0) as usize;
        let mut graph = GgmlGraph { g, n, api, ctx, _graph: PhantomData };
        let packs = dev.stats.packed.load(std::sync::atomic::Ordering::Relaxed);
        let r = graph::compute(dev, &ctx.stream, &mut graph);
        // Weights packed at their first MUL_MAT (over the model file's mapping): their transient
        // memory goes back to the system, as after a load (`give_back_load_memory`).
        if dev.stats.packed.load(std::sync::atomic::Ordering::Relaxed) != packs {
            give_back_load_memory();
        }
        match r {
            Ok(()) => GGML_STATUS_SUCCESS,
            Err(e) => {
                log::error!("{e}");
                GGML_STATUS_FAILED
            }
        }
    })
}

/// A live ggml graph during one `graph_compute` call (`'g`).
struct GgmlGraph<'g> {
    g: *mut ggml_cgraph,
    n: usize,
    api: &'static api::GgmlApi,
    ctx: &'g BackendCtx,
    _graph: PhantomData<&'g ggml_cgraph>,
}

impl<'g> GgmlGraph<'g> {
    /// Node `i` (below `n`).
    fn tensor(&self, i: usize) -> &'g ggml_tensor {
        assert!(i < self.n, "node {i} of {}", self.n);
        // SAFETY: an index within n_nodes of the live graph, whose nodes live for the call.
        unsafe { &*(self.api.graph_node)(self.g, i as i32) }
    }
}

impl<'g> Graph<'g> for GgmlGraph<'g> {
    fn len(&self) -> usize {
        self.n
    }

    fn node(&self, i: usize) -> Node<'g> {
        // SAFETY: a live node whose sources are live or NULL.
        unsafe { node::node(self.tensor(i)) }
    }

    fn weight_data(&self, i: usize) -> Option<WeightData<'_>> {
        // SAFETY: a non-NULL source of a live node is a live tensor; the result borrows the
        // graph, so it is gone before `run_cpu` lets ggml-cpu write any memory.
        unsafe { self.tensor(i).src[0].as_ref().and_then(|w| node::weight_data(w)) }
    }

    fn mul_mat_io(&mut self, i: usize) -> Option<(&'g [f32], &'g mut [f32])> {
        if self.tensor(i).op != GGML_OP_MUL_MAT {
            return None;
        }
        // SAFETY: an index within n_nodes of the live graph.
        let t = unsafe { (self.api.graph_node)(self.g, i as i32) };
        // SAFETY: a live MUL_MAT node, alive for the call; the walk asks once per node, after
        // writing out every pending output the node reads, and writes out its GPU jobs before
        // ggml-cpu runs any node.
        unsafe { tensor::mul_mat_io(t) }
    }

    fn run_cpu(&mut self, nodes: Range<usize>) -> Result<(), String> {
        assert!(nodes.start <= nodes.end && nodes.end <= self.n, "nodes {nodes:?} of {}", self.n);
        // SAFETY: a live graph; the range is within its nodes.
        unsafe { run_on_cpu(self.ctx, self.g, nodes.start as i32, nodes.end as i32) }
    }
}

/// Runs nodes `[i0, i1)` of `g` on ggml's CPU backend (whole-graph mode).
///
/// # Safety
/// `g` is a live graph and `[i0, i1)` within its nodes.
unsafe fn run_on_cpu(ctx: &BackendCtx, g: *mut ggml_cgraph, i0: i32, i1: i32) -> Result<(), String> {
    let c = api::cpu().map_err(|e| format!("ggml CPU backend functions not found ({e})"))?;
    let mut guard = ctx.cpu.lock().unwrap_or_else(|p| p.into_inner());
    if guard.is_none() {
        // SAFETY: ggml registry functions of the host process.
        let dev = unsafe { (c.dev_by_type)(GGML_BACKEND_DEVICE_TYPE_CPU) };
        if dev.is_null() {
            return Err("no CPU device registered".into());
        }
        // SAFETY: a live device; NULL params as llama.cpp passes.
        let backend = unsafe { (c.dev_init)(dev, null()) };
        if backend.is_null() {
            return Err("ggml_backend_dev_init(CPU) failed".into());
        }
        // SAFETY: the CPU reg of a live device; a NULL result means no such proc.
        let p = unsafe { (c.reg_get_proc_address)((c.dev_backend_reg)(dev), c"ggml_backend_set_n_threads".as_ptr()) };
        // SAFETY: the CPU backend's set_n_threads has exactly this signature (ggml-backend.h);
        // NULL becomes None.
        let set_threads = unsafe { std::mem::transmute::<*mut c_void, ggml_backend_set_n_threads_t>(p) };
        *guard = Some(CpuBackend { backend, set_threads, threads: 0 });
    }
    let Some(cpu) = guard.as_mut() else { return Err("no CPU backend".into()) };
    let want = match ctx.n_threads.load(Relaxed) {
        0 => std::thread::available_parallelism().map_or(4, |n| n.get() as i32),
        n => n,
    };
    crate::os::team::set_openmp_threads(want as usize);
    if cpu.threads != want {
        if let Some(f) = cpu.set_threads {
            // SAFETY: the CPU backend's own proc on the CPU backend.
            unsafe { f(cpu.backend, want) };
        }
        cpu.threads = want;
    }
    // SAFETY: a view of nodes [i0, i1) of a live graph; the CPU backend computes it in place.
    let mut view = unsafe { (c.graph_view)(g, i0, i1) };
    // SAFETY: as above.
    let st = unsafe { (c.graph_compute)(cpu.backend, &mut view) };
    if st != GGML_STATUS_SUCCESS {
        return Err(format!("ggml-cpu returned status {st} for nodes {i0}..{i1}"));
    }
    Ok(())
}
