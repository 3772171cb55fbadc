//! The buffer type (`buft_*`) and buffer (`buf_*`) callbacks. ORK buffers are host memory; what
//! their tensors mean to ORK is `crate::backend::buffer::Buffer`'s business.
//!
//! Two kinds of buffer share the type and the callbacks: one ORK allocated (`buft_alloc_buffer`,
//! ggml copies the GGUF bytes in), and one over memory ggml lent it (`buffer_from_host_ptr`:
//! llama.cpp's read-only mapping of the model file, whose weights ggml places at their offsets
//! in the file). A lent buffer never writes into or frees that memory: its write callbacks
//! (`set_tensor`, `memset_tensor`, `cpy_tensor`, `clear`) refuse with one error line each and
//! change nothing, and freeing it frees only ORK's context.

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
    /// The allocation ORK owns at `base`; None: memory ggml lent (`buffer_from_host_ptr`),
    /// read-only to ORK, never freed by it.
    owned: Option<Layout>,
    /// Bytes at `base` (ggml's buffer size).
    size: usize,
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

    /// Whether callback `name` may write into the buffer's memory: not into lent memory (one
    /// error line; the caller then changes nothing).
    fn writable(&self, name: &str) -> bool {
        if self.owned.is_none() {
            log::error!("{name}: refused: this ORK buffer lies over memory ggml lent it (the model file's mapping), which ORK never writes");
        }
        self.owned.is_some()
    }
}

impl Drop for BufferCtx {
    fn drop(&mut self) {
        if let Some(layout) = self.owned {
            // SAFETY: allocated with this layout in `buft_alloc_buffer`, freed once, here.
            unsafe { std::alloc::dealloc(self.base, layout) };
        }
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
        let ctx = Box::new(BufferCtx { base, owned: Some(layout), size, buf: Buffer::new(device(), layout.size()), poison: Poison::new("buffer") });
        // SAFETY: ggml takes ownership of `ctx` until `free_buffer`.
        unsafe { (api.buffer_init)(buft, BUF_IFACE, Box::into_raw(ctx) as *mut c_void, size) }
    })
}

/// The device's `buffer_from_host_ptr`: an ORK buffer of ORK's type over `size` bytes at `ptr`
/// that ggml lends (llama.cpp's mapping of the model file, when it maps it and ORK's type is
/// the device's default, which it is). The memory stays ggml's: nothing is copied, written or
/// freed; ggml places the weights at their addresses in it and ggml-cpu reads them in place.
/// NULL (llama.cpp then fails the load with its own line) for a NULL pointer, and when
/// `ORK_MAP_WEIGHTS=0` (the device then does not offer it).
pub(super) unsafe extern "C" fn dev_buffer_from_host_ptr(_dev: ggml_backend_dev_t, ptr: *mut c_void, size: usize, _max_tensor_size: usize) -> ggml_backend_buffer_t {
    DEVICE.guard("dev_buffer_from_host_ptr", null_mut(), || {
        let Some(dev) = device() else { return null_mut() };
        if !dev.cfg.map_weights || ptr.is_null() {
            log::error!("buffer_from_host_ptr: refused ({})", if ptr.is_null() { "NULL pointer" } else { "ORK_MAP_WEIGHTS=0" });
            return null_mut();
        }
        let Ok(api) = api::get() else { return null_mut() };
        log::debug!("weight buffer over the model file's mapping: {size} bytes at {ptr:p}");
        let ctx = Box::new(BufferCtx { base: ptr as *mut u8, owned: None, size, buf: Buffer::mapped(Some(dev), size), poison: Poison::new("buffer") });
        // SAFETY: ggml takes ownership of `ctx` until `free_buffer`; the buffer's type is ORK's own
        // (host memory, so the scheduler and ggml-cpu read the weights in place).
        unsafe { (api.buffer_init)(registry().buft, BUF_IFACE, Box::into_raw(ctx) as *mut c_void, size) }
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
    // SAFETY: ggml passes a live tensor of this buffer and checked offset + size against it.
    with_buffer("buf_memset_tensor", c, (), |c| unsafe { c.memset_tensor(t, value, offset, size) })
}

unsafe extern "C" fn buf_set_tensor(buffer: ggml_backend_buffer_t, t: *mut ggml_tensor, data: *const c_void, offset: usize, size: usize) {
    // SAFETY: ggml calls a buffer's callbacks with that live buffer.
    let c = unsafe { BufferCtx::of(buffer) };
    with_buffer("buf_set_tensor", c, (), |c| {
        // SAFETY: a live buffer (its usage is readable), a live tensor of it, `data` has `size`
        // readable bytes and ggml checked offset + size against the tensor.
        unsafe { c.set_tensor(t, data, offset, size, (*buffer).usage == GGML_BACKEND_BUFFER_USAGE_WEIGHTS) }
    })
}

impl BufferCtx {
    /// `memset_tensor`: `size` bytes of `t` from `offset` set to `value` (refused on lent memory).
    ///
    /// # Safety
    /// `t` is a live tensor of this buffer with `offset + size` bytes.
    unsafe fn memset_tensor(&self, t: *mut ggml_tensor, value: u8, offset: usize, size: usize) {
        if !self.writable("buf_memset_tensor") {
            return;
        }
        // SAFETY: `t` lives in this buffer's own memory (writable); the range is inside it (caller).
        let p = unsafe {
            let p = ((*t).data as *mut u8).add(offset);
            std::ptr::write_bytes(p, value, size);
            p as usize
        };
        self.buf.written(p..p + size);
    }

    /// `set_tensor`: `size` bytes of `data` into `t` from `offset` (refused on lent memory);
    /// `model_weights`: the buffer holds a model's weights.
    ///
    /// # Safety
    /// `t` is a live tensor of this buffer with `offset + size` bytes; `data` has `size`
    /// readable bytes.
    unsafe fn set_tensor(&self, t: *mut ggml_tensor, data: *const c_void, offset: usize, size: usize, model_weights: bool) {
        if !self.writable("buf_set_tensor") {
            return;
        }
        // SAFETY: as in memset; `data` has `size` readable bytes (caller).
        let p = unsafe {
            let p = ((*t).data as *mut u8).add(offset);
            std::ptr::copy_nonoverlapping(data as *const u8, p, size);
            p as usize
        };
        // SAFETY: a live tensor of this buffer (ORK's own bytes, as ggml lays them out), just
        // written, with its data allocated.
        let (tv, data) = unsafe { (tensor::tensor(&*t), tensor::weight_data_at(&*t, (*t).data as *const u8)) };
        self.buf.tensor_set(&tv, data.as_ref(), offset, p..p + size, model_weights);
    }

    /// `clear`: the whole buffer set to `value` (refused on lent memory).
    fn clear(&self, value: u8) {
        if !self.writable("buf_clear") {
            return;
        }
        // SAFETY: ORK's own allocation of `size` bytes (writable).
        unsafe { std::ptr::write_bytes(self.base, value, self.size) };
        self.buf.cleared();
    }
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
        if !c.writable("buf_cpy_tensor") {
            return false;
        }
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
    with_buffer("buf_clear", c, (), |c| c.clear(value))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tensor whose data is at `data` (the rest zero: no name, no view, no buffer).
    fn tensor_at(data: *mut u8) -> ggml_tensor {
        // SAFETY: ggml_tensor is a plain C struct for which all-zero bytes are a valid value
        // (NULL pointers, zero counts).
        let mut t: ggml_tensor = unsafe { std::mem::zeroed() };
        t.data = data as *mut c_void;
        t
    }

    /// A buffer over lent memory — here, as in llama.cpp, a read-only mapping of a file — never
    /// writes into it (a write would fault: the test process dies) and never frees it; ORK's own
    /// buffers take the same writes.
    #[test]
    fn a_buffer_over_lent_memory_never_writes_or_frees_it() {
        let path = std::env::temp_dir().join(format!("ork-lent-{}.bin", std::process::id()));
        let bytes: Vec<u8> = (0..8192u32).map(|i| (i * 7 % 251) as u8).collect();
        std::fs::write(&path, &bytes).unwrap();
        let map = crate::os::filemap::map_file_readonly(&std::fs::File::open(&path).unwrap()).unwrap();
        std::fs::remove_file(&path).unwrap();
        let base = map.as_ptr() as *mut u8;
        let lent = BufferCtx { base, owned: None, size: map.len(), buf: Buffer::mapped(None, map.len()), poison: Poison::new("buffer") };
        assert!(lent.buf.is_mapped());
        // SAFETY: a tensor 64 bytes into the mapping.
        let mut t = tensor_at(unsafe { base.add(64) });
        let src = [0xAAu8; 32];
        // SAFETY: `t` lies inside the lent memory with 32 bytes from offset 0; `src` has 32 bytes.
        unsafe {
            lent.memset_tensor(&mut t, 0x55, 0, 32);
            lent.set_tensor(&mut t, src.as_ptr() as *const c_void, 0, 32, true);
        }
        lent.clear(0);
        assert_eq!(&map[..], &bytes[..], "the lent memory is unchanged");
        drop(lent);
        assert_eq!(&map[..], &bytes[..], "still mapped and readable after the buffer is freed");

        // ORK's own memory takes the same calls.
        let layout = Layout::from_size_align(4096, BASE_ALIGN).unwrap();
        // SAFETY: non-zero size, valid alignment; freed by the context's drop.
        let base = unsafe { std::alloc::alloc_zeroed(layout) };
        let own = BufferCtx { base, owned: Some(layout), size: 4096, buf: Buffer::new(None, 4096), poison: Poison::new("buffer") };
        // SAFETY: as above, inside ORK's allocation.
        let mut t = tensor_at(unsafe { base.add(64) });
        // SAFETY: 16 bytes of `t` from offset 8, inside the allocation.
        unsafe { own.memset_tensor(&mut t, 0x55, 8, 16) };
        // SAFETY: the allocation's first 96 bytes.
        let head = unsafe { std::slice::from_raw_parts(base, 96) };
        assert!(head[72..88].iter().all(|&b| b == 0x55) && head[..72].iter().all(|&b| b == 0) && head[88..].iter().all(|&b| b == 0));
        own.clear(7);
        // SAFETY: the whole allocation.
        assert!(unsafe { std::slice::from_raw_parts(base, 4096) }.iter().all(|&b| b == 7));
    }
}
