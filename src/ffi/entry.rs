//! The entry point `ggml_backend_init` and the registry, device, buffer-type, buffer and backend
//! interface tables.

use super::abi::*;
use super::{api, guard};
use crate::backend::{self, Device, MatMulShape, WeightSource, WeightStore};
use crate::config::{Config, NpuSelect};
use crate::npu::{self, Npu, NpuConfig, NpuKind};
use std::ffi::{c_char, c_void, CStr, CString};
use std::ptr::{null, null_mut};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::OnceLock;

/// Everything the plugin registers; leaked once, so every pointer handed to ggml stays valid for
/// the life of the process (ggml never unregisters a backend).
struct Registry {
    reg: *mut ggml_backend_reg,
    dev: *mut ggml_backend_device,
    buft: *mut ggml_backend_buffer_type,
    device: Option<&'static Device>,
    name: CString,
    description: CString,
}
// SAFETY: the raw pointers point to leaked, never-freed structs that ggml reads from any thread;
// the Rust side only reads them after initialisation.
unsafe impl Send for Registry {}
// SAFETY: as above; all mutation happens inside `OnceLock::get_or_init`.
unsafe impl Sync for Registry {}

static REGISTRY: OnceLock<Registry> = OnceLock::new();
static GUID: ggml_guid = *b"ggml-ork-npu\0\0\0\x01";

fn registry() -> &'static Registry {
    REGISTRY.get_or_init(build_registry)
}

fn open_device(cfg: &'static Config) -> Result<&'static Device, String> {
    if cfg.off {
        return Err("ORK_OFF=1: no ORK device; everything runs on the CPU".into());
    }
    api::get().map_err(|e| format!("ggml symbols not found in the host process ({e})"))?;
    let kind = match cfg.npu {
        NpuSelect::Auto => NpuKind::Auto,
        NpuSelect::Sim => NpuKind::Sim,
        NpuSelect::Rknpu => NpuKind::Rknpu,
        NpuSelect::Rocket => NpuKind::Rocket,
    };
    let soc = match &cfg.soc {
        None => None,
        Some(s) => Some(npu::soc::SocId::parse(s).ok_or_else(|| format!("ORK_SOC={s:?} is not rk3588 or rk3576"))?),
    };
    let ncfg = NpuConfig {
        kind,
        soc,
        card: cfg.npu_card.as_ref().map(Into::into),
        max_cores: cfg.max_cores,
        pin_cpus: npu::hostcpu::big_cores_for_pinning(cfg.no_affinity),
        wcache_budget_bytes: cfg.wcache_budget_mb.map(|mb| mb << 20),
        timeout_ms: cfg.mm_timeout_ms,
        sim_fault: cfg.sim_fault.clone(),
    };
    let npu = Npu::open(&ncfg).map_err(|e| match cfg.npu {
        NpuSelect::Auto => format!("no ORK device: {e} (set ORK_NPU=sim for the simulator)"),
        _ => format!("no ORK device: {e}"),
    })?;
    let vk = if cfg.decode == crate::config::DecodeSelect::Gpu {
        match crate::vk::VkEngine::open(cfg.vk_device.as_deref()) {
            Ok(Some(e)) => {
                log::info!("GPU decode on {}", e.device_name());
                Some(e)
            }
            Ok(None) => {
                log::warn!("ORK_DECODE=gpu but no suitable Vulkan device; decode stays on the CPU");
                None
            }
            Err(e) => {
                log::warn!("ORK_DECODE=gpu but Vulkan failed ({e}); decode stays on the CPU");
                None
            }
        }
    } else {
        None
    };
    Ok(Box::leak(Box::new(Device { npu, vk, cfg, stats: Default::default(), cache: crate::cache::PackCache::from_config(cfg) })))
}

fn build_registry() -> Registry {
    let cfg = Config::get();
    let device = match open_device(cfg) {
        Ok(d) => {
            log::info!("{}", d.npu.describe());
            Some(d)
        }
        Err(why) => {
            log::info!("{why}");
            None
        }
    };
    let description = CString::new(device.map(|d| d.npu.describe()).unwrap_or_default()).unwrap_or_default();
    let reg = Box::leak(Box::new(ggml_backend_reg {
        api_version: GGML_BACKEND_API_VERSION as i32,
        iface: ggml_backend_reg_i {
            get_name: Some(reg_get_name),
            get_device_count: Some(reg_get_device_count),
            get_device: Some(reg_get_device),
            get_proc_address: Some(reg_get_proc_address),
        },
        context: null_mut(),
    }));
    let dev = Box::leak(Box::new(ggml_backend_device {
        iface: ggml_backend_device_i {
            get_name: Some(dev_get_name),
            get_description: Some(dev_get_description),
            get_memory: Some(dev_get_memory),
            get_type: Some(dev_get_type),
            get_props: Some(dev_get_props),
            init_backend: Some(dev_init_backend),
            get_buffer_type: Some(dev_get_buffer_type),
            get_host_buffer_type: None,
            buffer_from_host_ptr: None,
            supports_op: Some(dev_supports_op),
            supports_buft: Some(dev_supports_buft),
            offload_op: None,
            event_new: None,
            event_free: None,
            event_synchronize: None,
        },
        reg,
        context: null_mut(),
    }));
    let buft = Box::leak(Box::new(ggml_backend_buffer_type {
        iface: ggml_backend_buffer_type_i {
            get_name: Some(buft_get_name),
            alloc_buffer: Some(buft_alloc_buffer),
            alloc_buffer_n: None,
            get_alignment: Some(buft_get_alignment),
            get_max_size: None,
            get_alloc_size: None,
            get_alloc_size_n: None,
            is_host: Some(buft_is_host),
        },
        device: dev,
        context: null_mut(),
    }));
    Registry { reg, dev, buft, device, name: c"ORK".into(), description }
}

/// The dynamic-backend entry point: returns the "ORK" registry (zero or one device).
#[no_mangle]
pub extern "C" fn ggml_backend_init() -> ggml_backend_reg_t {
    guard("ggml_backend_init", null_mut(), || registry().reg)
}

fn device() -> Option<&'static Device> {
    REGISTRY.get().and_then(|r| r.device)
}

// ---------------------------------------------------------------- registry

unsafe extern "C" fn reg_get_name(_reg: ggml_backend_reg_t) -> *const c_char {
    guard("reg_get_name", null(), || registry().name.as_ptr())
}

unsafe extern "C" fn reg_get_device_count(_reg: ggml_backend_reg_t) -> usize {
    guard("reg_get_device_count", 0, || registry().device.is_some() as usize)
}

unsafe extern "C" fn reg_get_device(_reg: ggml_backend_reg_t, index: usize) -> ggml_backend_dev_t {
    guard("reg_get_device", null_mut(), || {
        let r = registry();
        if index == 0 && r.device.is_some() {
            r.dev
        } else {
            null_mut()
        }
    })
}

unsafe extern "C" fn reg_get_proc_address(_reg: ggml_backend_reg_t, name: *const c_char) -> *mut c_void {
    guard("reg_get_proc_address", null_mut(), || {
        if name.is_null() {
            return null_mut();
        }
        // SAFETY: ggml passes a NUL-terminated name.
        match unsafe { CStr::from_ptr(name) }.to_bytes() {
            b"ggml_backend_set_n_threads" => {
                let f: ggml_backend_set_n_threads_t = Some(backend_set_n_threads);
                // SAFETY: a function pointer to an extern "C" fn with the signature ggml expects.
                unsafe { std::mem::transmute::<ggml_backend_set_n_threads_t, *mut c_void>(f) }
            }
            _ => null_mut(),
        }
    })
}

/// Per backend instance (stream) state: the CPU backend whole-graph mode hands non-matmul nodes
/// to, created on first need, and the thread count for it.
struct BackendCtx {
    cpu: std::sync::Mutex<Option<CpuBackend>>,
    n_threads: std::sync::atomic::AtomicI32,
    logged_whole_graph: std::sync::atomic::AtomicBool,
    logged_npu_graph: std::sync::atomic::AtomicBool,
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

unsafe fn backend_ctx<'a>(b: ggml_backend_t) -> &'a BackendCtx {
    // SAFETY: only called on backends made by dev_init_backend, whose context is a BackendCtx.
    unsafe { &*((*b).context as *const BackendCtx) }
}

unsafe extern "C" fn backend_set_n_threads(b: ggml_backend_t, n: i32) -> bool {
    guard("backend_set_n_threads", false, || {
        // SAFETY: the proc is handed out by our reg, so ggml calls it with our backends; check the
        // guid anyway before touching the context.
        if b.is_null() || unsafe { (*b).guid } != &GUID as *const ggml_guid as *mut ggml_guid {
            return false;
        }
        // SAFETY: our backend.
        let ctx = unsafe { backend_ctx(b) };
        ctx.n_threads.store(n.max(1), Relaxed);
        true
    })
}

/// Runs nodes `[i0, i1)` of `g` on ggml's CPU backend (whole-graph mode).
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
        // SAFETY: the CPU backend's set_n_threads has exactly this signature (ggml-backend.h).
        let set_threads: ggml_backend_set_n_threads_t = unsafe { std::mem::transmute::<*mut c_void, ggml_backend_set_n_threads_t>(p) };
        *guard = Some(CpuBackend { backend, set_threads, threads: 0 });
    }
    let cpu = guard.as_mut().expect("CPU backend");
    let want = match ctx.n_threads.load(Relaxed) {
        0 => std::thread::available_parallelism().map_or(4, |n| n.get() as i32),
        n => n,
    };
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

// ---------------------------------------------------------------- device

unsafe extern "C" fn dev_get_name(_dev: ggml_backend_dev_t) -> *const c_char {
    guard("dev_get_name", null(), || registry().name.as_ptr())
}

unsafe extern "C" fn dev_get_description(_dev: ggml_backend_dev_t) -> *const c_char {
    guard("dev_get_description", null(), || registry().description.as_ptr())
}

/// Free and total system RAM in bytes (the NPU shares it; resident weights come out of it).
fn meminfo() -> (usize, usize) {
    let text = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let field = |name: &str| -> usize {
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<usize>().ok())
            .unwrap_or(0)
            * 1024
    };
    (field("MemAvailable:"), field("MemTotal:"))
}

unsafe extern "C" fn dev_get_memory(_dev: ggml_backend_dev_t, free: *mut usize, total: *mut usize) {
    guard("dev_get_memory", (), || {
        let (f, t) = meminfo();
        // SAFETY: ggml passes valid out-pointers (or NULL, which we skip).
        unsafe {
            if !free.is_null() {
                *free = f;
            }
            if !total.is_null() {
                *total = t;
            }
        }
    })
}

unsafe extern "C" fn dev_get_type(_dev: ggml_backend_dev_t) -> ggml_backend_dev_type {
    GGML_BACKEND_DEVICE_TYPE_ACCEL
}

unsafe extern "C" fn dev_get_props(dev: ggml_backend_dev_t, props: *mut ggml_backend_dev_props) {
    guard("dev_get_props", (), || {
        if props.is_null() {
            return;
        }
        let r = registry();
        let (f, t) = meminfo();
        // SAFETY: `props` is a valid out-pointer from ggml (zeroed by its wrapper).
        let p = unsafe { &mut *props };
        p.name = r.name.as_ptr();
        p.description = r.description.as_ptr();
        p.memory_free = f;
        p.memory_total = t;
        // SAFETY: `dev` is our device; the call only reads our own table.
        p.type_ = unsafe { dev_get_type(dev) };
        p.device_id = null();
        p.caps = ggml_backend_dev_caps {
            async_: false,
            host_buffer: false,
            buffer_from_host_ptr: false,
            events: false,
            mmap_support: true,
        };
    })
}

unsafe extern "C" fn dev_get_buffer_type(_dev: ggml_backend_dev_t) -> ggml_backend_buffer_type_t {
    guard("dev_get_buffer_type", null_mut(), || registry().buft)
}

unsafe extern "C" fn dev_supports_buft(_dev: ggml_backend_dev_t, buft: ggml_backend_buffer_type_t) -> bool {
    guard("dev_supports_buft", false, || {
        // Our own buffers, and any host buffer (activations live in the CPU's compute buffers).
        // SAFETY: ggml passes a live buffer type.
        buft == registry().buft || unsafe { buft_is_host_any(buft) }
    })
}

/// `ggml_backend_buft_is_host` without linking it: reads the buffer type's own `is_host`.
unsafe fn buft_is_host_any(buft: ggml_backend_buffer_type_t) -> bool {
    if buft.is_null() {
        return false;
    }
    // SAFETY: `buft` is a live ggml buffer type; its iface is readable.
    match unsafe { (*buft).iface.is_host } {
        // SAFETY: calling the buffer type's own callback with itself, as ggml does.
        Some(f) => unsafe { f(buft) },
        None => false,
    }
}

/// The tensor that owns `t`'s memory: `t` itself, or the tensor it is a view of.
unsafe fn base_of(t: &ggml_tensor) -> &ggml_tensor {
    if t.view_src.is_null() {
        t
    } else {
        // SAFETY: view_src is a live tensor when non-NULL.
        unsafe { &*t.view_src }
    }
}

/// Whether `t` lives in an ORK buffer (directly or as a view).
unsafe fn in_ork_buffer(t: &ggml_tensor) -> bool {
    // SAFETY: a live tensor.
    let base = unsafe { base_of(t) };
    // SAFETY: a non-NULL buffer pointer of a live tensor is a live buffer.
    !base.buffer.is_null() && unsafe { (*base.buffer).buft } == registry().buft
}

unsafe fn to_float_of(ty: ggml_type) -> Option<unsafe extern "C" fn(*const c_void, *mut f32, i64)> {
    let api = api::get().ok()?;
    // SAFETY: `ggml_get_type_traits` returns a pointer into a static table for valid ids.
    let tr = unsafe { (api.get_type_traits)(ty) };
    if tr.is_null() {
        return None;
    }
    // SAFETY: points into ggml's static type-traits table.
    unsafe { (*tr).to_float }
}

/// Reads a MUL_MAT node into a [`MatMulShape`].
unsafe fn mul_mat_shape(op: &ggml_tensor) -> Option<MatMulShape> {
    let api = api::get().ok()?;
    if op.src[0].is_null() || op.src[1].is_null() {
        return None;
    }
    // SAFETY: non-NULL sources of a live node are live tensors.
    let (w, x) = unsafe { (&*op.src[0], &*op.src[1]) };
    let m = (x.ne[1] * x.ne[2] * x.ne[3]).max(0) as usize;
    Some(MatMulShape {
        weight_type: w.type_ as u32,
        k: w.ne[0].max(0) as usize,
        n: w.ne[1].max(0) as usize,
        weight_is_2d: w.ne[2] == 1 && w.ne[3] == 1,
        // SAFETY: ggml helper on a live tensor.
        weight_contiguous: unsafe { (api.is_contiguous)(w) },
        // SAFETY: see `in_ork_buffer`. A leaf not yet allocated (test-backend-ops asks before
        // allocating) will be placed in the tested backend's own buffer type.
        weight_in_ork_buffer: unsafe { in_ork_buffer(w) }
            || (w.buffer.is_null() && w.view_src.is_null() && w.op == GGML_OP_NONE && (w.flags as u32) & GGML_TENSOR_FLAG_INPUT == 0),
        // SAFETY: type id read from a live tensor.
        weight_has_to_float: unsafe { to_float_of(w.type_) }.is_some(),
        act_is_f32: x.type_ == GGML_TYPE_F32,
        // SAFETY: ggml helper on live tensors.
        act_contiguous: unsafe { (api.is_contiguous)(x) },
        m,
        dst_is_f32: op.type_ == GGML_TYPE_F32,
        // SAFETY: ggml helper on a live tensor.
        dst_contiguous: unsafe { (api.is_contiguous)(op) },
        hadamard_hint: op.op_params[1] == 1,
        act_min_prec: op.op_params[3],
    })
}

/// The resident weight of an accepted MUL_MAT, made resident first if it is not yet; None when it
/// cannot be (one warning per weight; the weight is remembered as not resident).
unsafe fn npu_weight(dev: &Device, node: &ggml_tensor) -> Option<std::sync::Arc<backend::PackedWeight>> {
    // SAFETY: a live MUL_MAT node whose weight is in an ORK buffer (mul_mat_unsupported held).
    let w = unsafe { &*node.src[0] };
    // SAFETY: a live weight tensor.
    let base = unsafe { base_of(w) };
    // SAFETY: our buffer (in_ork_buffer held).
    let c = unsafe { ctx(base.buffer) };
    if let Some(pw) = c.weights.packed(w.data as usize, w.ne[1] as usize, w.ne[0] as usize, w.type_ as u32) {
        return Some(pw);
    }
    if c.weights.is_failed(w.data as usize) {
        return None;
    }
    // SAFETY: a live weight in our buffer.
    match unsafe { packed_weight(c, dev, w) } {
        Ok(pw) => Some(pw),
        Err(e) => {
            dev.stats.not_resident.fetch_add(1, Relaxed);
            log::warn!("MUL_MAT {} runs on the CPU: weight {} not resident on the NPU ({e})", tensor_name(node), tensor_name(w));
            None
        }
    }
}

/// Whether the weight of MUL_MAT `op` is known not to fit on the NPU (it then stays on the CPU).
unsafe fn weight_not_resident(op: &ggml_tensor) -> bool {
    if op.src[0].is_null() {
        return false;
    }
    // SAFETY: a live source tensor.
    let w = unsafe { &*op.src[0] };
    // SAFETY: a live weight tensor.
    let base = unsafe { base_of(w) };
    // SAFETY: `in_ork_buffer` says the buffer is ours; llama's weight-placement probe attaches a
    // zero-size buffer of our type with no context, which is skipped.
    unsafe { in_ork_buffer(w) && !(*base.buffer).context.is_null() && ctx(base.buffer).weights.is_failed(w.data as usize) }
}

/// The engine for an accepted MUL_MAT shape (`crate::route`). At graph-split time a busy NPU may
/// send decode to the CPU (cost policy); at compute time the arbiter handles a busy NPU instead.
/// Cost decisions run the NPU planner, so they are remembered per thread by shape and
/// availability (the configuration is fixed for the process): the scheduler and graph_compute
/// ask again for every node of every token.
fn engine_for(dev: &Device, s: &MatMulShape, at_split: bool) -> crate::route::Engine {
    use crate::route::{Availability, Engine, MatMul};
    type Key = (usize, usize, usize, u32, bool, bool);
    thread_local! {
        static ROUTES: std::cell::RefCell<std::collections::HashMap<Key, Engine>> = Default::default();
    }
    match dev.cfg.route {
        crate::config::RoutePolicy::Threshold => crate::route::choose(dev.cfg, s.m, dev.gpu_ready()).unwrap_or(Engine::Cpu),
        crate::config::RoutePolicy::Cost => {
            let av = Availability { gpu: dev.gpu_ready(), npu_busy: at_split && dev.arbiter().busy() };
            let key = (s.m, s.k, s.n, s.weight_type, av.gpu, av.npu_busy);
            if let Some(e) = ROUTES.with(|r| r.borrow().get(&key).copied()) {
                return e;
            }
            let mm = MatMul { m: s.m, k: s.k, n: s.n, ggml_type: s.weight_type };
            let d = crate::route::decide(dev.cfg, &mm, av);
            log::trace!("MUL_MAT {}x{}x{}: {} ({})", s.m, s.k, s.n, d.engine.name(), d.why());
            ROUTES.with(|r| {
                let mut r = r.borrow_mut();
                // Prefill brings many M values; a bounded memo is enough for the repeats.
                if r.len() >= 4096 {
                    r.clear();
                }
                r.insert(key, d.engine);
            });
            d.engine
        }
    }
}

unsafe extern "C" fn dev_supports_op(_dev: ggml_backend_dev_t, op: *const ggml_tensor) -> bool {
    guard("dev_supports_op", false, || {
        let Some(dev) = device() else { return false };
        if op.is_null() {
            return false;
        }
        // SAFETY: ggml passes a live tensor.
        let op = unsafe { &*op };
        match op.op {
            GGML_OP_NONE | GGML_OP_RESHAPE | GGML_OP_VIEW | GGML_OP_PERMUTE | GGML_OP_TRANSPOSE => true,
            GGML_OP_MUL_MAT => {
                // SAFETY: a live MUL_MAT node.
                let Some(s) = (unsafe { mul_mat_shape(op) }) else { return false };
                // SAFETY: a live MUL_MAT node.
                if unsafe { weight_not_resident(op) } {
                    log::trace!("MUL_MAT {}x{}x{} declined: weight not resident on the NPU", s.m, s.k, s.n);
                    return false;
                }
                if let Some(why) = backend::mul_mat_unsupported(dev, &s) {
                    log::trace!("MUL_MAT {}x{}x{} declined: {why}", s.m, s.k, s.n);
                    return false;
                }
                match engine_for(dev, &s, true) {
                    crate::route::Engine::Npu | crate::route::Engine::Gpu => true,
                    crate::route::Engine::Cpu => {
                        dev.stats.declined_small_m.fetch_add(1, Relaxed);
                        false
                    }
                }
            }
            _ => false,
        }
    })
}

unsafe extern "C" fn dev_init_backend(dev: ggml_backend_dev_t, _params: *const c_char) -> ggml_backend_t {
    guard("dev_init_backend", null_mut(), || {
        if device().is_none() {
            return null_mut();
        }
        let b = Box::new(ggml_backend {
            guid: &GUID as *const ggml_guid as *mut ggml_guid,
            iface: ggml_backend_i {
                get_name: Some(backend_get_name),
                free: Some(backend_free),
                set_tensor_async: None,
                get_tensor_async: None,
                set_tensor_2d_async: None,
                get_tensor_2d_async: None,
                cpy_tensor_async: None,
                synchronize: None,
                graph_plan_create: None,
                graph_plan_free: None,
                graph_plan_update: None,
                graph_plan_compute: None,
                graph_compute: Some(backend_graph_compute),
                event_record: None,
                event_wait: None,
                graph_optimize: None,
            },
            device: dev,
            context: Box::into_raw(Box::new(BackendCtx {
                cpu: std::sync::Mutex::new(None),
                n_threads: std::sync::atomic::AtomicI32::new(0),
                logged_whole_graph: std::sync::atomic::AtomicBool::new(false),
                logged_npu_graph: std::sync::atomic::AtomicBool::new(false),
            })) as *mut c_void,
        });
        Box::into_raw(b)
    })
}

// ---------------------------------------------------------------- buffer type and buffers

/// Alignment of tensors in ORK buffers (bytes); ggml needs ≥ 32 for host buffers.
const TENSOR_ALIGN: usize = 64;
/// Alignment of the buffer base (a page, so packed views and mappings line up).
const BASE_ALIGN: usize = 4096;

unsafe extern "C" fn buft_get_name(_buft: ggml_backend_buffer_type_t) -> *const c_char {
    guard("buft_get_name", null(), || registry().name.as_ptr())
}

unsafe extern "C" fn buft_get_alignment(_buft: ggml_backend_buffer_type_t) -> usize {
    TENSOR_ALIGN
}

unsafe extern "C" fn buft_is_host(_buft: ggml_backend_buffer_type_t) -> bool {
    true
}

/// Host memory of one ORK buffer plus the packed weights of the tensors in it.
struct BufferCtx {
    base: *mut u8,
    layout: std::alloc::Layout,
    weights: WeightStore,
    /// This buffer's share of `Stats::expected_term_bytes`.
    expected_term_bytes: std::sync::atomic::AtomicU64,
}

unsafe extern "C" fn buft_alloc_buffer(buft: ggml_backend_buffer_type_t, size: usize) -> ggml_backend_buffer_t {
    guard("buft_alloc_buffer", null_mut(), || {
        let Ok(api) = api::get() else { return null_mut() };
        let Ok(layout) = std::alloc::Layout::from_size_align(size.max(1), BASE_ALIGN) else { return null_mut() };
        // SAFETY: non-zero size, valid alignment.
        let base = unsafe { std::alloc::alloc(layout) };
        if base.is_null() {
            log::error!("cannot allocate a {size}-byte ORK buffer");
            return null_mut();
        }
        if let Some(dev) = device() {
            dev.host_buffers_changed(layout.size() as i64);
        }
        let ctx = Box::new(BufferCtx { base, layout, weights: WeightStore::default(), expected_term_bytes: Default::default() });
        let iface = ggml_backend_buffer_i {
            free_buffer: Some(buf_free),
            get_base: Some(buf_get_base),
            init_tensor: Some(buf_init_tensor),
            memset_tensor: Some(buf_memset_tensor),
            set_tensor: Some(buf_set_tensor),
            get_tensor: Some(buf_get_tensor),
            set_tensor_2d: None,
            get_tensor_2d: None,
            cpy_tensor: Some(buf_cpy_tensor),
            clear: Some(buf_clear),
            reset: None,
        };
        // SAFETY: ggml takes ownership of `ctx` until `free_buffer`.
        let b = unsafe { (api.buffer_init)(buft, iface, Box::into_raw(ctx) as *mut c_void, size) };
        b
    })
}

/// The context of one of our buffers.
unsafe fn ctx<'a>(buffer: ggml_backend_buffer_t) -> &'a BufferCtx {
    // SAFETY: only called on buffers created by `buft_alloc_buffer`, whose context is a BufferCtx.
    unsafe { &*((*buffer).context as *const BufferCtx) }
}

unsafe extern "C" fn buf_free(buffer: ggml_backend_buffer_t) {
    guard("buf_free", (), || {
        // SAFETY: ggml calls this once per buffer; we reclaim the Box made in alloc_buffer.
        let c = unsafe { Box::from_raw((*buffer).context as *mut BufferCtx) };
        c.weights.clear();
        // SAFETY: allocated with this layout in alloc_buffer.
        unsafe { std::alloc::dealloc(c.base, c.layout) };
        if let Some(dev) = device() {
            dev.host_buffers_changed(-(c.layout.size() as i64));
            dev.stats.expected_term_bytes.fetch_sub(c.expected_term_bytes.load(Relaxed), Relaxed);
        }
    })
}

/// ggml initialises every tensor placed in the buffer before loading any: a tensor that looks
/// like a MUL_MAT weight ORK can hold (named `*.weight`, not a view, `holdable_weight_shape`)
/// adds one int8 term's resident bytes to `Stats::expected_term_bytes`, which the second-term
/// rule of the residency budget reads.
unsafe extern "C" fn buf_init_tensor(buffer: ggml_backend_buffer_t, t: *mut ggml_tensor) -> ggml_status {
    guard("buf_init_tensor", GGML_STATUS_SUCCESS, || {
        let Some(dev) = device() else { return GGML_STATUS_SUCCESS };
        // SAFETY: ggml passes a live tensor of this buffer.
        let t = unsafe { &*t };
        // Graph tensors of compute buffers come here too, at every graph allocation: the name
        // test first, without allocating.
        // SAFETY: ggml keeps `name` NUL-terminated within GGML_MAX_NAME.
        let named_weight = unsafe { CStr::from_ptr(t.name.as_ptr()) }.to_bytes().ends_with(b".weight");
        if !named_weight || !t.view_src.is_null() {
            return GGML_STATUS_SUCCESS;
        }
        // SAFETY: a live tensor.
        if let Some((n, k)) = unsafe { holdable_weight_shape(dev, t) } {
            let bytes = dev.npu.term_bytes(n, k);
            // SAFETY: our buffer.
            unsafe { ctx(buffer) }.expected_term_bytes.fetch_add(bytes, Relaxed);
            dev.stats.expected_term_bytes.fetch_add(bytes, Relaxed);
        }
        GGML_STATUS_SUCCESS
    })
}

unsafe extern "C" fn buf_get_base(buffer: ggml_backend_buffer_t) -> *mut c_void {
    // SAFETY: our buffer.
    guard("buf_get_base", null_mut(), || unsafe { ctx(buffer) }.base as *mut c_void)
}

unsafe extern "C" fn buf_memset_tensor(buffer: ggml_backend_buffer_t, t: *mut ggml_tensor, value: u8, offset: usize, size: usize) {
    guard("buf_memset_tensor", (), || {
        // SAFETY: `t` lives in this buffer; ggml checked offset + size against its size.
        unsafe {
            let p = ((*t).data as *mut u8).add(offset);
            std::ptr::write_bytes(p, value, size);
            ctx(buffer).weights.invalidate(p as usize, p as usize + size);
        }
    })
}

unsafe extern "C" fn buf_set_tensor(buffer: ggml_backend_buffer_t, t: *mut ggml_tensor, data: *const c_void, offset: usize, size: usize) {
    guard("buf_set_tensor", (), || {
        // SAFETY: as in memset; `data` has `size` readable bytes.
        unsafe {
            let p = ((*t).data as *mut u8).add(offset);
            std::ptr::copy_nonoverlapping(data as *const u8, p, size);
            let c = ctx(buffer);
            c.weights.invalidate(p as usize, p as usize + size);
            // A weight written whole at load time is packed right away.
            if offset == 0 && (*buffer).usage == GGML_BACKEND_BUFFER_USAGE_WEIGHTS {
                prepack(c, &*t);
            }
        }
    })
}

/// Packs a weight that was just written, if it looks like a MUL_MAT weight ORK can run.
unsafe fn prepack(c: &BufferCtx, t: &ggml_tensor) {
    let Some(dev) = device() else { return };
    // SAFETY: a live tensor.
    if unsafe { holdable_weight_shape(dev, t) }.is_none() {
        return;
    }
    // SAFETY: a live weight tensor in our buffer.
    if let Err(e) = unsafe { packed_weight(c, dev, t) } {
        // One warning; the rest at debug level and counted in the summary line.
        crate::logging::warn_first(
            dev.stats.not_resident_weights.fetch_add(1, Relaxed) == 0,
            &format!("weight {} stays on the CPU: {e}", tensor_name(t)),
            " (further weights that stay on the CPU: debug log, count at exit)",
        );
    }
}

/// `(N, K)` of `t` when it looks like a MUL_MAT weight ORK can hold: 2-D with at least two
/// rows, contiguous, of a type ORK packs, of a shape the NPU takes. The test of `prepack` and of
/// the weight count in `buf_init_tensor`.
unsafe fn holdable_weight_shape(dev: &Device, t: &ggml_tensor) -> Option<(usize, usize)> {
    let api = api::get().ok()?;
    // SAFETY: ggml helper on a live tensor (forwarded contract).
    if t.ne[2] != 1 || t.ne[3] != 1 || t.ne[1] < 2 || !unsafe { (api.is_contiguous)(t) } {
        return None;
    }
    let (k, n) = (t.ne[0] as usize, t.ne[1] as usize);
    let packs = crate::quant::types::weight_type(t.type_ as u32).is_some();
    (packs && dev.npu.check_shape(n, k).is_ok()).then_some((n, k))
}

fn tensor_name(t: &ggml_tensor) -> String {
    // SAFETY: ggml keeps `name` NUL-terminated within GGML_MAX_NAME.
    unsafe { CStr::from_ptr(t.name.as_ptr()) }.to_string_lossy().into_owned()
}

/// Calls `f` with the weight `w`'s GGUF bytes and ggml's row dequantizer for its type.
unsafe fn with_weight_source<R>(w: &ggml_tensor, f: impl FnOnce(&WeightSource<'_>) -> R) -> Result<R, String> {
    // SAFETY: forwarded contract.
    unsafe { with_weight_source_named(w, true, f) }
}

/// [`with_weight_source`]; `named == false` leaves the source's name empty (the per-matmul path,
/// where only the CPU fallback reads the source, and never its name: no strlen + UTF-8 check).
unsafe fn with_weight_source_named<R>(w: &ggml_tensor, named: bool, f: impl FnOnce(&WeightSource<'_>) -> R) -> Result<R, String> {
    let api = api::get().map_err(|e| e.to_string())?;
    let k = w.ne[0];
    // SAFETY: ggml helpers on a live tensor.
    let (row_bytes, nbytes) = unsafe { ((api.row_size)(w.type_, k), (api.nbytes)(w)) };
    // SAFETY: the weight's bytes live in its buffer for the buffer's whole life.
    let bytes = unsafe { std::slice::from_raw_parts(w.data as *const u8, nbytes) };
    // SAFETY: type id of a live tensor.
    let tf = unsafe { to_float_of(w.type_) }.ok_or_else(|| format!("no to_float for ggml type {}", w.type_))?;
    let to_float = move |row: &[u8], out: &mut [f32]| {
        // SAFETY: `row` holds one row (K elements) of this type; `out` has K floats.
        unsafe { tf(row.as_ptr() as *const c_void, out.as_mut_ptr(), out.len() as i64) }
    };
    // SAFETY: ggml keeps `name` NUL-terminated within GGML_MAX_NAME; borrowed when valid UTF-8
    // (no allocation on the per-matmul path).
    let name = if named { unsafe { CStr::from_ptr(w.name.as_ptr()) }.to_string_lossy() } else { "".into() };
    Ok(f(&WeightSource { name: &name, ggml_type: w.type_ as u32, bytes, row_bytes, to_float: &to_float }))
}

/// The packed form of weight `w` (packing it now if needed). Only weights of buffers ggml marks
/// as a model's weights use the `.orkpack` cache (test-backend-ops' random weights would fill it
/// with entries that never hit).
unsafe fn packed_weight(c: &BufferCtx, dev: &Device, w: &ggml_tensor) -> Result<std::sync::Arc<backend::PackedWeight>, crate::npu::NpuError> {
    let (k, n) = (w.ne[0] as usize, w.ne[1] as usize);
    // SAFETY: a live tensor's buffer pointer (checked for NULL) points to a live buffer.
    let model_weight = !w.buffer.is_null() && unsafe { (*w.buffer).usage } == GGML_BACKEND_BUFFER_USAGE_WEIGHTS;
    // SAFETY: a live weight tensor.
    unsafe { with_weight_source(w, |src| c.weights.get_or_pack(dev, w.data as usize, src, n, k, model_weight)) }
        .map_err(|why| crate::npu::NpuError::BadArg { op: "pack", m: 0, k, n, why })?
}

unsafe extern "C" fn buf_get_tensor(_buffer: ggml_backend_buffer_t, t: *const ggml_tensor, data: *mut c_void, offset: usize, size: usize) {
    guard("buf_get_tensor", (), || {
        // SAFETY: `t` lives in this buffer; `data` has room for `size` bytes.
        unsafe { std::ptr::copy_nonoverlapping(((*t).data as *const u8).add(offset), data as *mut u8, size) }
    })
}

unsafe extern "C" fn buf_cpy_tensor(buffer: ggml_backend_buffer_t, src: *const ggml_tensor, dst: *mut ggml_tensor) -> bool {
    guard("buf_cpy_tensor", false, || {
        // SAFETY: live tensors; a host source buffer is plain memory of ggml_nbytes(src) bytes.
        unsafe {
            let api = match api::get() { Ok(a) => a, Err(_) => return false };
            if (*src).buffer.is_null() || !buft_is_host_any((*(*src).buffer).buft) {
                return false;
            }
            let n = (api.nbytes)(src);
            std::ptr::copy_nonoverlapping((*src).data as *const u8, (*dst).data as *mut u8, n);
            let p = (*dst).data as usize;
            ctx(buffer).weights.invalidate(p, p + n);
            true
        }
    })
}

unsafe extern "C" fn buf_clear(buffer: ggml_backend_buffer_t, value: u8) {
    guard("buf_clear", (), || {
        // SAFETY: our buffer of `size` bytes.
        unsafe {
            let c = ctx(buffer);
            std::ptr::write_bytes(c.base, value, (*buffer).size);
            c.weights.clear();
        }
    })
}

// ---------------------------------------------------------------- backend (stream)

unsafe extern "C" fn backend_get_name(_b: ggml_backend_t) -> *const c_char {
    guard("backend_get_name", null(), || registry().name.as_ptr())
}

unsafe extern "C" fn backend_free(b: ggml_backend_t) {
    guard("backend_free", (), || {
        if let Some(dev) = device() {
            let s = &dev.stats;
            // Whenever there is something to report: NPU work, or weights prepared (packed,
            // loaded from the cache, or left on the CPU) even if no ubatch reached ORK_MINM.
            let weights = s.packed.load(Relaxed) + s.cache_hits.load(Relaxed) + s.not_resident_weights.load(Relaxed);
            if s.npu_matmuls.load(Relaxed) > 0 || dev.cfg.profile || weights > 0 {
                log::info!("{}", dev.stats.summary());
            }
            if dev.cfg.profile {
                log::info!("{}", dev.stats.profile(Some(dev.arbiter())));
            }
        }
        // SAFETY: made by Box::into_raw in dev_init_backend; ggml frees each backend once.
        let b = unsafe { Box::from_raw(b) };
        if !b.context.is_null() {
            // SAFETY: the BackendCtx boxed in dev_init_backend.
            drop(unsafe { Box::from_raw(b.context as *mut BackendCtx) });
        }
    })
}

unsafe extern "C" fn backend_graph_compute(b: ggml_backend_t, g: *mut ggml_cgraph) -> ggml_status {
    // Wall time of the whole call and the counters around it, for the profile's host-time
    // lines (`Stats::record_graph`).
    let t_graph = std::time::Instant::now();
    let before = device().map(|d| d.stats.graph_snap());
    let st = guard("backend_graph_compute", GGML_STATUS_FAILED, || {
        let (Some(dev), Ok(api)) = (device(), api::get()) else { return GGML_STATUS_FAILED };
        // GPU decode matmuls are batched into one submit until a node needs one of their results.
        let mut pending: Vec<backend::gpu::GpuJob<'static>> = Vec::new();
        let mut pending_dst: Vec<*const ggml_tensor> = Vec::new();
        let flush = |pending: &mut Vec<backend::gpu::GpuJob<'static>>, pending_dst: &mut Vec<*const ggml_tensor>| {
            if pending.is_empty() {
                return Ok(());
            }
            let t0 = std::time::Instant::now();
            let r = backend::gpu::run_batch(dev, pending);
            dev.stats.gpu_ns.fetch_add(t0.elapsed().as_nanos() as u64, Relaxed);
            dev.stats.gpu_submits.fetch_add(1, Relaxed);
            dev.stats.gpu_matmuls.fetch_add(pending.len() as u64, Relaxed);
            for j in pending.iter() {
                let ph = crate::route::Phase::of(dev.cfg, j.m);
                dev.stats.gpu_phase[(ph == crate::route::Phase::Decode) as usize].fetch_add(1, Relaxed);
            }
            pending.clear();
            pending_dst.clear();
            r.map_err(|e| e.to_string())
        };
        // SAFETY: our backend (made by dev_init_backend).
        let bctx = unsafe { backend_ctx(b) };
        // Whole-graph mode (ggml-rpc-server sends whole splits with no CPU fallback): nodes ORK
        // does not run itself are collected into runs and handed to ggml's CPU backend.
        let npu_before = dev.stats.npu_matmuls.load(Relaxed);
        let mut cpu_from: Option<i32> = None;
        let mut cpu_nodes = 0u64;
        // The cross-process NPU lock is kept between the NPU matmuls of this call (one flock +
        // unlock per call, not per matmul) and let go before ggml-cpu runs and on return; taking
        // and letting it go is arbiter time, as inside `run_mul_mat`.
        let mut hold: Option<crate::route::arbiter::Hold<'static>> = None;
        let release = |hold: &mut Option<crate::route::arbiter::Hold<'static>>| {
            if let Some(h) = hold.take() {
                let t0 = std::time::Instant::now();
                drop(h);
                dev.stats.arb_ns.fetch_add(t0.elapsed().as_nanos() as u64, Relaxed);
            }
        };
        let run_cpu = |from: &mut Option<i32>,
                       to: i32,
                       cpu_nodes: &mut u64,
                       pending: &mut Vec<backend::gpu::GpuJob<'static>>,
                       pending_dst: &mut Vec<*const ggml_tensor>,
                       hold: &mut Option<crate::route::arbiter::Hold<'static>>|
         -> Result<(), String> {
            let Some(i0) = from.take() else { return Ok(()) };
            if *cpu_nodes == 0 {
                return Ok(());
            }
            release(hold);
            flush(pending, pending_dst)?;
            if !bctx.logged_whole_graph.swap(true, Relaxed) {
                log::info!("whole-graph mode (e.g. ggml-rpc-server -d ORK): ORK runs the ops it does not accelerate on ggml's CPU backend");
            }
            let t0 = std::time::Instant::now();
            // SAFETY: a live graph; [i0, to) within its nodes.
            unsafe { run_on_cpu(bctx, g, i0, to) }?;
            dev.stats.cpu_ops.fetch_add(*cpu_nodes, Relaxed);
            dev.stats.cpu_ns.fetch_add(t0.elapsed().as_nanos() as u64, Relaxed);
            *cpu_nodes = 0;
            Ok(())
        };
        // SAFETY: a live graph from the scheduler.
        let n = unsafe { (api.graph_n_nodes)(g) };
        for i in 0..n {
            // SAFETY: index within n_nodes.
            let node = unsafe { &*(api.graph_node)(g, i) };
            // Shape, route and resident weight are worked out once per node, here.
            let ours = match node.op {
                GGML_OP_NONE | GGML_OP_RESHAPE | GGML_OP_VIEW | GGML_OP_PERMUTE | GGML_OP_TRANSPOSE => continue,
                // SAFETY: a live MUL_MAT node.
                GGML_OP_MUL_MAT => match unsafe { mul_mat_shape(node) } {
                    Some(s) if backend::mul_mat_unsupported(dev, &s).is_none() => match engine_for(dev, &s, false) {
                        crate::route::Engine::Cpu => Err(s.m),
                        // A weight that cannot be made resident (budget, IOMMU) runs on ggml's CPU
                        // backend, in place, like any op ORK does not accelerate.
                        // SAFETY: a live MUL_MAT node ORK accepts.
                        crate::route::Engine::Npu => match unsafe { npu_weight(dev, node) } {
                            Some(pw) => Ok((s, Some(pw))),
                            None => Err(s.m),
                        },
                        crate::route::Engine::Gpu => Ok((s, None)),
                    },
                    Some(s) => Err(s.m),
                    None => Err(1),
                },
                _ => Err(0),
            };
            let (s, npu_w) = match ours {
                Err(m) => {
                    if node.op == GGML_OP_MUL_MAT {
                        let ph = crate::route::Phase::of(dev.cfg, m);
                        dev.stats.cpu_mm[(ph == crate::route::Phase::Decode) as usize].fetch_add(1, Relaxed);
                    }
                    cpu_from.get_or_insert(i);
                    cpu_nodes += 1;
                    continue;
                }
                Ok(v) => {
                    if let Err(e) = run_cpu(&mut cpu_from, i, &mut cpu_nodes, &mut pending, &mut pending_dst, &mut hold) {
                        log::error!("{e}");
                        return GGML_STATUS_FAILED;
                    }
                    v
                }
            };
            // SAFETY: index within n_nodes.
            let node = unsafe { &mut *(api.graph_node)(g, i) };
            let reads_pending = node.src.iter().any(|&s| {
                // SAFETY: non-NULL sources are live tensors.
                !s.is_null() && pending_dst.iter().any(|&d| d == s as *const _ || unsafe { (*s).view_src } as *const _ == d)
            });
            if reads_pending {
                if let Err(e) = flush(&mut pending, &mut pending_dst) {
                    log::error!("GPU decode batch failed: {e}");
                    return GGML_STATUS_FAILED;
                }
            }
            if npu_w.is_some() && hold.is_none() {
                hold = Some(dev.arbiter().hold());
            }
            // SAFETY: a MUL_MAT node ORK accepts, with its shape and (NPU) resident weight.
            let r = unsafe { compute_mul_mat(dev, node, &s, npu_w) };
            match r {
                Ok(None) => {}
                Ok(Some(job)) => {
                    pending.push(job);
                    pending_dst.push(node as *const _);
                }
                Err(e) => {
                    log::error!("MUL_MAT {}: {e}", tensor_name(node));
                    return GGML_STATUS_FAILED;
                }
            }
        }
        release(&mut hold);
        let ran_cpu = cpu_nodes > 0 || bctx.logged_whole_graph.load(Relaxed);
        if let Err(e) = run_cpu(&mut cpu_from, n, &mut cpu_nodes, &mut pending, &mut pending_dst, &mut hold) {
            log::error!("{e}");
            return GGML_STATUS_FAILED;
        }
        let npu_now = dev.stats.npu_matmuls.load(Relaxed);
        if ran_cpu && npu_now > npu_before && !bctx.logged_npu_graph.swap(true, Relaxed) {
            log::info!(
                "whole-graph mode: a graph of {n} nodes ran {} MUL_MAT on the NPU, the rest on ggml-cpu",
                npu_now - npu_before
            );
        }
        if let Err(e) = flush(&mut pending, &mut pending_dst) {
            log::error!("GPU decode batch failed: {e}");
            return GGML_STATUS_FAILED;
        }
        GGML_STATUS_SUCCESS
    });
    if let (Some(dev), Some(before)) = (device(), before) {
        dev.stats.record_graph(before, t_graph.elapsed().as_nanos() as u64);
    }
    st
}

/// Runs one MUL_MAT on the NPU now (`npu_w`: its resident weight), or returns it as a GPU job
/// to batch (decode routed to the GPU, `npu_w` None). `s` is the node's shape, which the caller
/// checked ORK accepts. The job borrows the node's activation and output memory, which ggml keeps
/// alive for the whole graph computation.
unsafe fn compute_mul_mat(
    dev: &Device,
    node: &mut ggml_tensor,
    s: &MatMulShape,
    npu_w: Option<std::sync::Arc<backend::PackedWeight>>,
) -> Result<Option<backend::gpu::GpuJob<'static>>, String> {
    // SAFETY: live source tensors of the node.
    let (w, x) = unsafe { (&*node.src[0], &*node.src[1]) };
    // SAFETY: contiguous f32 tensors of M·K and M·N elements (checked by mul_mat_shape); the graph
    // keeps them alive until graph_compute returns, which outlives the job.
    let (xs, ds): (&'static [f32], &'static mut [f32]) = unsafe {
        (
            std::slice::from_raw_parts(x.data as *const f32, s.m * s.k),
            std::slice::from_raw_parts_mut(node.data as *mut f32, s.m * s.n),
        )
    };
    // SAFETY: a live weight in our buffer.
    unsafe {
        with_weight_source_named(w, npu_w.is_none(), |src| {
            let Some(pw) = &npu_w else {
                // SAFETY: `in_ork_buffer` held for the weight, so its buffer is ours.
                let c = ctx(base_of(w).buffer);
                let gw = c.weights.get_or_upload_gpu(dev, w.data as usize, src, s.n, s.k).map_err(|e| e.to_string())?;
                return Ok(Some(backend::gpu::GpuJob { w: gw, x: xs, m: s.m, dst: ds }));
            };
            dev.run_mul_mat(pw, src, xs, s.m, ds);
            Ok(None)
        })
    }?
}
