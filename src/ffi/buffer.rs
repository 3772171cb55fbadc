//! The buffer type (`buft_*`) and buffer (`buf_*`) callbacks. ORK buffers are host memory; what
//! their tensors mean to ORK is `crate::backend::buffer::Buffer`'s business.

use super::abi::*;
use super::host::BuftFns;
use super::registry::{built, device, registry, DEVICE};
use super::{api, guard, tensor, Poison};
use crate::backend::buffer::Buffer;
use std::alloc::Layout;
use std::ffi::{c_char, c_void};
use std::ptr::{null, null_mut};

/// Alignment of tensors in ORK buffers (bytes); ggml needs ≥ 32 for host buffers.
const TENSOR_ALIGN: usize = 64;
/// Alignment of the buffer base (a page, so packed views and mappings line up).
const BASE_ALIGN: usize = 4096;

/// The buffer type's callbacks; `host::new_buft` lays them out in the host's table shape.
pub(super) const BUFT_FNS: BuftFns =
    BuftFns { get_name: buft_get_name, alloc_buffer: buft_alloc_buffer, get_alignment: buft_get_alignment, is_host: buft_is_host };

/// A buffer's interface table.
const BUF_IFACE: ggml_backend_buffer_i = ggml_backend_buffer_i {
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

unsafe extern "C" fn buft_get_name(_buft: ggml_backend_buffer_type_t) -> *const c_char {
    guard("buft_get_name", null(), || registry().name.as_ptr())
}

/// A fixed answer, which is also its failure value.
unsafe extern "C" fn buft_get_alignment(_buft: ggml_backend_buffer_type_t) -> usize {
    guard("buft_get_alignment", TENSOR_ALIGN, || TENSOR_ALIGN)
}

/// A fixed answer, which is also its failure value.
unsafe extern "C" fn buft_is_host(_buft: ggml_backend_buffer_type_t) -> bool {
    guard("buft_is_host", true, || true)
}

/// Whether any buffer type is host memory: the host's own `ggml_backend_buft_is_host` (resolved
/// at run time), which reads the table in the host's layout (`is_host` sits at byte 56 in API 3,
/// at 40 in API 2, so the plugin must not read it itself).
///
/// # Safety
/// `buft` is NULL or a live ggml buffer type.
pub(super) unsafe fn buft_is_host_any(buft: ggml_backend_buffer_type_t) -> bool {
    if buft.is_null() {
        return false;
    }
    match api::get() {
        // SAFETY: a live buffer type of this process's ggml, passed to its own accessor.
        Ok(api) => unsafe { (api.buft_is_host)(buft) },
        Err(_) => false,
    }
}

/// Host memory of one ORK buffer, the buffer's state, and its poisoned flag.
pub(super) struct BufferCtx {
    base: *mut u8,
    layout: Layout,
    pub(super) buf: Buffer,
    poison: Poison,
}

impl BufferCtx {
    /// The context of `buffer` if it is a live ORK buffer with one (pointer reads only).
    ///
    /// # Safety
    /// `buffer` is NULL or a live ggml buffer.
    pub(super) unsafe fn of<'a>(buffer: ggml_backend_buffer_t) -> Option<&'a BufferCtx> {
        let ours = built()?.buft;
        // SAFETY: a live buffer (caller); its type and context fields are readable.
        let b = unsafe { buffer.as_ref() }?;
        // SAFETY: buffers of ORK's type with a context were made by `buft_alloc_buffer`, whose
        // context is a BufferCtx that lives until `buf_free`.
        (b.buft == ours && !b.context.is_null()).then(|| unsafe { &*(b.context as *const BufferCtx) })
    }
}

impl Drop for BufferCtx {
    fn drop(&mut self) {
        // SAFETY: allocated with this layout in `buft_alloc_buffer`, freed once, here.
        unsafe { std::alloc::dealloc(self.base, self.layout) };
    }
}

/// Runs buffer callback `name` on buffer context `c` (from [`BufferCtx::of`]), behind the
/// buffer's poisoned flag; `fail` when there is none (not a live ORK buffer).
fn with_buffer<R>(name: &str, c: Option<&BufferCtx>, fail: R, f: impl FnOnce(&BufferCtx) -> R) -> R {
    match c {
        Some(c) => c.poison.guard(name, fail, || f(c)),
        None => {
            log::error!("{name}: not an ORK buffer; returning failure to ggml");
            fail
        }
    }
}

unsafe extern "C" fn buft_alloc_buffer(buft: ggml_backend_buffer_type_t, size: usize) -> ggml_backend_buffer_t {
    DEVICE.guard("buft_alloc_buffer", null_mut(), || {
        let Ok(api) = api::get() else { return null_mut() };
        let Ok(layout) = Layout::from_size_align(size.max(1), BASE_ALIGN) else { return null_mut() };
        // SAFETY: non-zero size, valid alignment.
        let base = unsafe { std::alloc::alloc(layout) };
        if base.is_null() {
            log::error!("cannot allocate a {size}-byte ORK buffer");
            return null_mut();
        }
        let ctx = Box::new(BufferCtx { base, layout, buf: Buffer::new(device(), layout.size()), poison: Poison::new("buffer") });
        // SAFETY: ggml takes ownership of `ctx` until `free_buffer`.
        unsafe { (api.buffer_init)(buft, BUF_IFACE, Box::into_raw(ctx) as *mut c_void, size) }
    })
}

/// Frees the buffer whatever state it is in (also when poisoned).
unsafe extern "C" fn buf_free(buffer: ggml_backend_buffer_t) {
    guard("buf_free", (), || {
        // SAFETY: ggml passes one of its live buffers, and frees each once.
        if unsafe { BufferCtx::of(buffer) }.is_some() {
            // SAFETY: we reclaim the Box made in `buft_alloc_buffer` (`of` checked it is ours).
            drop(unsafe { Box::from_raw((*buffer).context as *mut BufferCtx) });
        }
    })
}

unsafe extern "C" fn buf_get_base(buffer: ggml_backend_buffer_t) -> *mut c_void {
    // SAFETY: ggml calls a buffer's callbacks with that live buffer.
    let c = unsafe { BufferCtx::of(buffer) };
    with_buffer("buf_get_base", c, null_mut(), |c| c.base as *mut c_void)
}

unsafe extern "C" fn buf_init_tensor(buffer: ggml_backend_buffer_t, t: *mut ggml_tensor) -> ggml_status {
    // SAFETY: ggml calls a buffer's callbacks with that live buffer.
    let c = unsafe { BufferCtx::of(buffer) };
    with_buffer("buf_init_tensor", c, GGML_STATUS_FAILED, |c| {
        // SAFETY: ggml passes a live tensor of this buffer.
        c.buf.init_tensor(&unsafe { tensor::tensor(&*t) });
        GGML_STATUS_SUCCESS
    })
}

unsafe extern "C" fn buf_memset_tensor(buffer: ggml_backend_buffer_t, t: *mut ggml_tensor, value: u8, offset: usize, size: usize) {
    // SAFETY: ggml calls a buffer's callbacks with that live buffer.
    let c = unsafe { BufferCtx::of(buffer) };
    with_buffer("buf_memset_tensor", c, (), |c| {
        // SAFETY: `t` lives in this buffer; ggml checked offset + size against its size.
        let p = unsafe {
            let p = ((*t).data as *mut u8).add(offset);
            std::ptr::write_bytes(p, value, size);
            p as usize
        };
        c.buf.written(p..p + size);
    })
}

unsafe extern "C" fn buf_set_tensor(buffer: ggml_backend_buffer_t, t: *mut ggml_tensor, data: *const c_void, offset: usize, size: usize) {
    // SAFETY: ggml calls a buffer's callbacks with that live buffer.
    let c = unsafe { BufferCtx::of(buffer) };
    with_buffer("buf_set_tensor", c, (), |c| {
        // SAFETY: as in memset; `data` has `size` readable bytes.
        let p = unsafe {
            let p = ((*t).data as *mut u8).add(offset);
            std::ptr::copy_nonoverlapping(data as *const u8, p, size);
            p as usize
        };
        // SAFETY: a live tensor of this buffer, just written; the buffer is live.
        let (t, usage) = unsafe { (&*t, (*buffer).usage) };
        // SAFETY: a live tensor with its data allocated.
        let (tv, data) = unsafe { (tensor::tensor(t), tensor::weight_data(t)) };
        c.buf.tensor_set(&tv, data.as_ref(), offset, p..p + size, usage == GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
    })
}

unsafe extern "C" fn buf_get_tensor(buffer: ggml_backend_buffer_t, t: *const ggml_tensor, data: *mut c_void, offset: usize, size: usize) {
    // SAFETY: ggml calls a buffer's callbacks with that live buffer.
    let c = unsafe { BufferCtx::of(buffer) };
    with_buffer("buf_get_tensor", c, (), |_| {
        // SAFETY: `t` lives in this buffer; `data` has room for `size` bytes.
        unsafe { std::ptr::copy_nonoverlapping(((*t).data as *const u8).add(offset), data as *mut u8, size) }
    })
}

unsafe extern "C" fn buf_cpy_tensor(buffer: ggml_backend_buffer_t, src: *const ggml_tensor, dst: *mut ggml_tensor) -> bool {
    // SAFETY: ggml calls a buffer's callbacks with that live buffer.
    let c = unsafe { BufferCtx::of(buffer) };
    with_buffer("buf_cpy_tensor", c, false, |c| {
        let Ok(api) = api::get() else { return false };
        // SAFETY: live tensors; a host source buffer is plain memory of ggml_nbytes(src) bytes.
        let p = unsafe {
            if (*src).buffer.is_null() || !buft_is_host_any((*(*src).buffer).buft) {
                return false;
            }
            let n = (api.nbytes)(src);
            std::ptr::copy_nonoverlapping((*src).data as *const u8, (*dst).data as *mut u8, n);
            let p = (*dst).data as usize;
            p..p + n
        };
        c.buf.written(p);
        true
    })
}

unsafe extern "C" fn buf_clear(buffer: ggml_backend_buffer_t, value: u8) {
    // SAFETY: ggml calls a buffer's callbacks with that live buffer.
    let c = unsafe { BufferCtx::of(buffer) };
    with_buffer("buf_clear", c, (), |c| {
        // SAFETY: our buffer of `size` bytes.
        unsafe { std::ptr::write_bytes(c.base, value, (*buffer).size) };
        c.buf.cleared();
    })
}
