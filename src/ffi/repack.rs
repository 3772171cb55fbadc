//! ggml-cpu's `CPU_REPACK` weights, watched (docs/design.md, "Weights ggml-cpu repacks").
//!
//! ggml-cpu re-lays the weights of the types its SIMD kernels prefer out in its `CPU_REPACK`
//! buffer type, and llama.cpp puts a weight there only when no buffer type before it in its list
//! takes it — ORK's comes first. So ORK declines those weights at llama.cpp's placement probe
//! (`node::mul_mat`: [`first_taker_is_repack`]) and ggml-cpu keeps its layout for decode; ORK
//! still runs their prefill MUL_MATs, from tiles packed while the weights are loaded:
//!
//! - the CPU_REPACK type's `alloc_buffer` is wrapped (the type's table is one process-wide,
//!   writable struct in ggml-cpu, reached through the CPU reg's `ggml_backend_dev_get_extra_bufts`);
//! - in each buffer it allocates, `init_tensor`, `set_tensor`, `memset_tensor`, `clear` and
//!   `free_buffer` are wrapped: each runs ORK's part (a `backend::buffer::Buffer` made with
//!   [`Buffer::repacked`]) and then ggml-cpu's own, whatever ORK's part did;
//! - in `set_tensor`, ggml-cpu is handed the GGUF bytes of the whole weight: ORK packs its tiles
//!   from them (or finds them in the `.orkpack` cache) before ggml-cpu re-lays them out; after
//!   that ORK never reads the buffer.
//!
//! Nothing is wrapped without an ORK device, where the GPU decode engine is open
//! (`Device::keeps_cpu_repack`), where ggml-cpu has no CPU_REPACK type, or where a GPU device has
//! a host buffer type (llama.cpp lists it before ggml-cpu's extra types: a declined weight would
//! land there, where ggml-cpu does not repack it either).

use super::abi::*;
use super::registry::device;
use super::{api, guard, tensor};
use crate::backend::buffer::Buffer;
use std::collections::HashMap;
use std::ffi::{c_void, CStr};
use std::sync::{OnceLock, RwLock};

type AllocFn = unsafe extern "C" fn(ggml_backend_buffer_type_t, usize) -> ggml_backend_buffer_t;
type FreeFn = unsafe extern "C" fn(ggml_backend_buffer_t);
type InitFn = unsafe extern "C" fn(ggml_backend_buffer_t, *mut ggml_tensor) -> ggml_status;
type MemsetFn = unsafe extern "C" fn(ggml_backend_buffer_t, *mut ggml_tensor, u8, usize, usize);
type SetFn = unsafe extern "C" fn(ggml_backend_buffer_t, *mut ggml_tensor, *const c_void, usize, usize);
type ClearFn = unsafe extern "C" fn(ggml_backend_buffer_t, u8);

// The buffer-type table's `alloc_buffer` is its second member in every supported release (API 2
// and 3 differ after it), and the buffer's layout is the same in all of them.
const _: () = assert!(std::mem::offset_of!(ggml_backend_buffer_type_i, alloc_buffer) == 8);
const _: () = assert!(std::mem::offset_of!(super::abi_b10809::ggml_backend_buffer_type_i, alloc_buffer) == 8);
const _: () = assert!(std::mem::offset_of!(super::abi_b10566::ggml_backend_buffer_type_i, alloc_buffer) == 8);

/// ggml-cpu's extra buffer types and the CPU_REPACK one among them, once watched.
struct Watch {
    /// CPU_REPACK (its address).
    repack: usize,
    /// ggml-cpu's extra types in llama.cpp's order, each with a zero-size buffer of its type for
    /// placement questions: `(type, buffer)`.
    extras: Vec<(usize, usize)>,
    /// The CPU device (its address).
    cpu_dev: usize,
}

/// ggml-cpu's own callbacks of a CPU_REPACK buffer (the same in every one).
#[derive(Clone, Copy)]
struct Own {
    free: Option<FreeFn>,
    init: Option<InitFn>,
    memset: Option<MemsetFn>,
    set: Option<SetFn>,
    clear: Option<ClearFn>,
}

static WATCH: OnceLock<Option<Watch>> = OnceLock::new();
/// CPU_REPACK's own `alloc_buffer` (also in [`Watch`]), set before the wrapper is installed.
static OWN_ALLOC: OnceLock<AllocFn> = OnceLock::new();
static OWN: OnceLock<Own> = OnceLock::new();
/// ORK's part of each live CPU_REPACK buffer, by the buffer's address. Boxed: a reference to one
/// stays valid until `free_buffer` takes it out (ggml frees no weight buffer while a graph that
/// reads it runs).
static BUFFERS: std::sync::LazyLock<RwLock<HashMap<usize, Box<Buffer>>>> = std::sync::LazyLock::new(Default::default);

/// The watch, started at the first call (llama.cpp's first placement probe comes before any
/// CPU_REPACK buffer is allocated). None: nothing is watched (one debug line says why).
fn watch() -> Option<&'static Watch> {
    WATCH
        .get_or_init(|| {
            let dev = device()?;
            if !dev.keeps_cpu_repack() {
                log::debug!("CPU_REPACK not watched: the GPU decode engine is open, ORK's buffer holds the weights");
                return None;
            }
            // SAFETY: resolving and wrapping go through ggml's own accessors (see `start`).
            match unsafe { start() } {
                Ok(w) => Some(w),
                Err(why) => {
                    log::debug!("CPU_REPACK not watched: {why}");
                    None
                }
            }
        })
        .as_ref()
}

/// Finds ggml-cpu's extra buffer types and wraps CPU_REPACK's `alloc_buffer`.
///
/// # Safety
/// Called once (behind `WATCH`), while no CPU_REPACK buffer is being allocated.
unsafe fn start() -> Result<Watch, String> {
    let cpu = api::cpu()?;
    // llama.cpp's list puts a GPU device's host buffer type between ORK's and ggml-cpu's extra
    // types: there, a weight ORK declined would land in that host buffer, repacked by nobody.
    // SAFETY: ggml's registry accessors; devices live for the process.
    let gpu_host = unsafe {
        (0..(cpu.dev_count)()).map(|i| (cpu.dev_get)(i)).find(|&d| {
            !d.is_null()
                && matches!((cpu.dev_type)(d), GGML_BACKEND_DEVICE_TYPE_GPU | GGML_BACKEND_DEVICE_TYPE_IGPU)
                && !(cpu.dev_host_buffer_type)(d).is_null()
        })
    };
    if gpu_host.is_some() {
        return Err("a GPU device's host buffer type comes before ggml-cpu's in llama.cpp's weight list (ggml-cpu does not repack there either); ORK's buffer holds the weights".into());
    }
    // SAFETY: ggml's registry accessors; the CPU device and its reg live for the process.
    let (cpu_dev, extra) = unsafe {
        let cpu_dev = (cpu.dev_by_type)(GGML_BACKEND_DEVICE_TYPE_CPU);
        if cpu_dev.is_null() {
            return Err("no CPU device".into());
        }
        let reg = (cpu.dev_backend_reg)(cpu_dev);
        let p = (cpu.reg_get_proc_address)(reg, c"ggml_backend_dev_get_extra_bufts".as_ptr());
        if p.is_null() {
            return Err("the CPU reg lists no extra buffer types".into());
        }
        (cpu_dev, std::mem::transmute::<*mut c_void, unsafe extern "C" fn(ggml_backend_dev_t) -> *mut ggml_backend_buffer_type_t>(p))
    };
    let mut extras = Vec::new();
    let mut repack = None;
    // SAFETY: the proc returns a NULL-terminated array of live buffer types.
    unsafe {
        let mut p = extra(cpu_dev);
        while !p.is_null() && !(*p).is_null() {
            let buft = *p;
            let name = CStr::from_ptr((cpu.buft_name)(buft)).to_string_lossy();
            let probe = (cpu.buft_alloc_buffer)(buft, 0);
            if !probe.is_null() {
                extras.push((buft as usize, probe as usize));
            }
            if name == "CPU_REPACK" {
                repack = Some(buft);
            }
            p = p.add(1);
        }
    }
    let buft = repack.ok_or("ggml-cpu has no CPU_REPACK buffer type")?;
    // SAFETY: CPU_REPACK's type is a static, writable struct of ggml-cpu's; its second member is
    // `alloc_buffer` in every supported release (asserted above); nothing allocates from it now.
    unsafe {
        let slot = std::ptr::addr_of_mut!((*buft).iface.alloc_buffer);
        let own = (*slot).ok_or("CPU_REPACK has no alloc_buffer")?;
        // Known before the wrapper can be called.
        let _ = OWN_ALLOC.set(own);
        *slot = Some(alloc_buffer);
    }
    log::debug!("CPU_REPACK watched: ORK packs the weights ggml-cpu repacks as they are loaded");
    Ok(Watch { repack: buft as usize, extras, cpu_dev: cpu_dev as usize })
}

/// Whether ggml-cpu's first extra buffer type that takes MUL_MAT `op` (its weight placed in a
/// zero-size buffer of each in turn, as llama.cpp asks) is CPU_REPACK, CPU_REPACK being watched.
///
/// # Safety
/// `op` is a live MUL_MAT node with a live weight (`src[0]`).
pub(super) unsafe fn first_taker_is_repack(op: &ggml_tensor) -> bool {
    let (Some(w), Ok(cpu)) = (watch(), api::cpu()) else { return false };
    // SAFETY: a live weight (caller); copies of the two structs, so llama.cpp's are not touched.
    let mut weight = unsafe { *op.src[0] };
    let wp: *mut ggml_tensor = &mut weight;
    let mut probe = *op;
    probe.src[0] = wp;
    for &(buft, buffer) in &w.extras {
        // SAFETY: `wp` points to the local copy, alive for the loop; ggml reads it through
        // `probe` during the call only.
        let yes = unsafe {
            (*wp).buffer = buffer as ggml_backend_buffer_t;
            (*wp).data = std::ptr::null_mut();
            (cpu.dev_supports_op)(w.cpu_dev as ggml_backend_dev_t, &probe)
        };
        if yes {
            return buft == w.repack;
        }
    }
    false
}

/// Whether `buft` is the watched CPU_REPACK type (then ORK runs MUL_MATs of its weights).
pub(super) fn is_watched_type(buft: ggml_backend_buffer_type_t) -> bool {
    WATCH.get().and_then(Option::as_ref).is_some_and(|w| w.repack == buft as usize)
}

/// ORK's part of CPU_REPACK buffer `buffer`, if it is a live watched one.
pub(super) fn watched<'a>(buffer: ggml_backend_buffer_t) -> Option<&'a Buffer> {
    let m = BUFFERS.read().unwrap_or_else(|p| p.into_inner());
    // SAFETY: the Box lives until `free_buffer` removes it, after every use of the buffer (the
    // caller's borrow ends with its callback or graph computation).
    m.get(&(buffer as usize)).map(|b| unsafe { &*(b.as_ref() as *const Buffer) })
}

unsafe extern "C" fn alloc_buffer(buft: ggml_backend_buffer_type_t, size: usize) -> ggml_backend_buffer_t {
    let Some(alloc) = OWN_ALLOC.get() else { return std::ptr::null_mut() };
    // SAFETY: ggml-cpu's own callback, with ggml's arguments.
    let buffer = unsafe { alloc(buft, size) };
    if buffer.is_null() {
        return buffer;
    }
    guard("CPU_REPACK alloc_buffer", (), || {
        // SAFETY: a buffer ggml-cpu just made and nobody else holds yet.
        let b = unsafe { &mut *buffer };
        let i = &mut b.iface;
        let own = *OWN.get_or_init(|| Own { free: i.free_buffer, init: i.init_tensor, memset: i.memset_tensor, set: i.set_tensor, clear: i.clear });
        i.free_buffer = Some(free_buffer);
        i.init_tensor = Some(init_tensor);
        i.set_tensor = Some(set_tensor);
        i.memset_tensor = own.memset.map(|_| memset_tensor as MemsetFn);
        i.clear = own.clear.map(|_| clear as ClearFn);
        BUFFERS.write().unwrap_or_else(|p| p.into_inner()).insert(buffer as usize, Box::new(Buffer::repacked(device(), size)));
    });
    buffer
}

/// ggml-cpu's own callbacks (taken before any buffer's are wrapped; all None before that).
fn own() -> Own {
    OWN.get().copied().unwrap_or(Own { free: None, init: None, memset: None, set: None, clear: None })
}

unsafe extern "C" fn free_buffer(buffer: ggml_backend_buffer_t) {
    guard("CPU_REPACK free_buffer", (), || drop(BUFFERS.write().unwrap_or_else(|p| p.into_inner()).remove(&(buffer as usize))));
    if let Some(f) = own().free {
        // SAFETY: ggml-cpu's own callback, with ggml's arguments.
        unsafe { f(buffer) }
    }
}

unsafe extern "C" fn init_tensor(buffer: ggml_backend_buffer_t, t: *mut ggml_tensor) -> ggml_status {
    let status = match own().init {
        // SAFETY: ggml-cpu's own callback, with ggml's arguments.
        Some(f) => unsafe { f(buffer, t) },
        None => GGML_STATUS_SUCCESS,
    };
    guard("CPU_REPACK init_tensor", (), || {
        if let Some(b) = watched(buffer) {
            // SAFETY: ggml passes a live tensor of this buffer.
            b.init_tensor(&unsafe { tensor::tensor(&*t) });
        }
    });
    status
}

unsafe extern "C" fn set_tensor(buffer: ggml_backend_buffer_t, t: *mut ggml_tensor, data: *const c_void, offset: usize, size: usize) {
    guard("CPU_REPACK set_tensor", (), || {
        let Some(b) = watched(buffer) else { return };
        // SAFETY: a live buffer and tensor of it; `data` holds `size` readable bytes for the
        // call, and ggml checked offset + size against the tensor.
        unsafe {
            let tv = tensor::tensor(&*t);
            let whole = offset == 0 && size == (api::get().map_or(0, |a| (a.nbytes)(t)));
            let bytes = whole.then(|| tensor::weight_data_at(&*t, data as *const u8)).flatten();
            let p = (*t).data as usize + offset;
            b.tensor_set(&tv, bytes.as_ref(), offset, p..p + size, (*buffer).usage == GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
        }
    });
    if let Some(f) = own().set {
        // SAFETY: ggml-cpu's own callback, with ggml's arguments.
        unsafe { f(buffer, t, data, offset, size) }
    }
}

unsafe extern "C" fn memset_tensor(buffer: ggml_backend_buffer_t, t: *mut ggml_tensor, value: u8, offset: usize, size: usize) {
    guard("CPU_REPACK memset_tensor", (), || {
        if let Some(b) = watched(buffer) {
            // SAFETY: a live tensor of this buffer.
            let p = unsafe { (*t).data as usize } + offset;
            b.written(p..p + size);
        }
    });
    if let Some(f) = own().memset {
        // SAFETY: ggml-cpu's own callback, with ggml's arguments.
        unsafe { f(buffer, t, value, offset, size) }
    }
}

unsafe extern "C" fn clear(buffer: ggml_backend_buffer_t, value: u8) {
    guard("CPU_REPACK clear", (), || {
        if let Some(b) = watched(buffer) {
            b.cleared();
        }
    });
    if let Some(f) = own().clear {
        // SAFETY: ggml-cpu's own callback, with ggml's arguments.
        unsafe { f(buffer, value) }
    }
}

/// A model weight in a plain host buffer whose MUL_MAT ggml-cpu's CPU_REPACK would have taken
/// first: ORK declined it at placement for CPU_REPACK, and llama.cpp put it elsewhere (its `-nr` /
/// `--no-repack` leaves ggml-cpu's extra types out; `-ot` overrides), so neither repacks nor ORK
/// runs it. One warning per process; each weight shape is asked once.
///
/// # Safety
/// As [`first_taker_is_repack`].
pub(super) unsafe fn note_left_unrepacked(op: &ggml_tensor) {
    static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    static ASKED: std::sync::Mutex<Vec<(u32, [i64; 4])>> = std::sync::Mutex::new(Vec::new());
    if SAID.load(std::sync::atomic::Ordering::Relaxed) || WATCH.get().and_then(Option::as_ref).is_none() {
        return;
    }
    // SAFETY: a live weight (caller).
    let w = unsafe { &*op.src[0] };
    // A zero-size buffer holds no weight: llama.cpp's no-alloc pass that fits the model to memory.
    // SAFETY: a live weight's non-NULL buffer is a live buffer.
    if unsafe { w.buffer.as_ref() }.is_none_or(|b| b.size == 0) {
        return;
    }
    {
        let mut asked = ASKED.lock().unwrap_or_else(|p| p.into_inner());
        if asked.contains(&(w.type_, w.ne)) {
            return;
        }
        asked.push((w.type_, w.ne));
    }
    // SAFETY: forwarded contract.
    if unsafe { first_taker_is_repack(op) } && !SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
        log::warn!(
            "weight {} is in a plain host buffer, not CPU_REPACK (llama.cpp's -nr / --no-repack, or a buffer-type override?): ORK declined it for CPU_REPACK, so its MUL_MATs run on the CPU unrepacked; without -nr its prefill runs on the NPU and its decode in ggml-cpu's repacked kernels",
            tensor::name(w)
        );
    }
}
