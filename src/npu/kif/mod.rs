//! Kernel interfaces: the one trait the NPU core talks to, and its three implementations.
//!
//! * [`rknpu`] — the vendor `rknpu` DRM driver (`/dev/dri/card*`, driver ≥ 0.9.6), through `nix`
//!   ioctls and `memmap2` mappings. Facts: shared reference `rknpu-facts.md` §1.
//! * [`rocket`] — the mainline `rocket` accel driver (`/dev/accel/accel*`, Linux ≥ 6.18).
//! * [`sim`] — the in-process simulator: same buffer and submit semantics over an arena with a
//!   4 GiB IOVA window per IOMMU domain; a submit is executed by decoding the regcmd stream.
//!
//! The trait is shaped after the vendor driver, the richest of the three: buffer objects live in
//! an IOMMU domain and have a 32-bit IOVA; a job is an array of [`RknpuTask`] descriptors in a
//! task buffer, a core mask and a domain. The rocket implementation translates (it reads the task
//! descriptors back from the mapped task buffer and submits them as rocket tasks).
//!
//! Unsafe code is allowed in this module tree (and, outside `npu`, in `vk`, `quant::simd`, `os`
//! and `ffi`): raw mappings of device memory are turned into slices here, each with a
//! `// SAFETY:` line.
#![allow(unsafe_code)]

pub mod sim;
pub mod port;
pub mod rknpu;
pub mod rocket;
/// Generic DRM core ioctls and node discovery shared by `rknpu` and `rocket`.
pub mod drm;

use std::fmt;

/// A 32-bit NPU virtual address inside one IOMMU domain's window.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Iova(pub u32);

/// IOMMU domain id. Stock vendor drivers 0.9.6–0.9.8 accept 0..=15 (`RKNPU_MAX_IOMMU_DOMAIN_NUM`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct DomainId(pub u32);

/// Page size of buffer objects. Every interface hands out whole pages: the vendor kernel
/// page-aligns MEM_CREATE (rknpu-facts §1.3/§1.6, S4), rocket's drm_gem_shmem rounds to pages,
/// and the simulator's IOVA allocator works in pages.
pub const PAGE_BYTES: usize = 4096;

/// Data cache line of the CPUs that share memory with the NPU (Cortex-A76 and A55: 64 bytes).
/// Cache maintenance works on whole lines: a sync of any byte of a line cleans or invalidates all
/// of it.
pub const CACHE_LINE_BYTES: usize = 64;

/// The whole cache lines that cover `offset..offset + len`, clamped to `size_bytes` (a buffer is
/// whole pages, so the clamp only matters for a range already at its end): `(start, end)`.
pub fn line_span(offset: usize, len: usize, size_bytes: usize) -> (usize, usize) {
    let start = offset / CACHE_LINE_BYTES * CACHE_LINE_BYTES;
    let end = (offset + len).div_ceil(CACHE_LINE_BYTES) * CACHE_LINE_BYTES;
    (start.min(size_bytes), end.min(size_bytes))
}

/// Checks that `offset..offset + len` is a non-empty range inside `bo` (what the vendor kernel's
/// MEM_SYNC checks, S4), naming `op` in the error.
pub fn check_sync_range(op: &str, bo: &Bo, offset: usize, len: usize) -> Result<(), KifError> {
    if len == 0 || offset.checked_add(len).is_none_or(|end| end > bo.size_bytes) {
        return Err(KifError::Invalid(format!("{op}: range {offset}+{len} is empty or outside handle {}'s {} bytes", bo.handle, bo.size_bytes)));
    }
    Ok(())
}

/// Rounds a byte count up to whole pages.
pub fn page_round(size_bytes: usize) -> usize {
    size_bytes.div_ceil(PAGE_BYTES) * PAGE_BYTES
}

/// Maximum number of IOMMU domains (stock vendor driver limit; rknpu-facts §4, conflict 4).
pub const MAX_DOMAINS: u32 = 16;

/// `rknpu_mem_create.flags` bits (rknpu-facts §1.4, source S1).
pub mod mem_flags {
    pub const NON_CONTIGUOUS: u32 = 1 << 0;
    pub const CACHEABLE: u32 = 1 << 1;
    pub const KERNEL_MAPPING: u32 = 1 << 3;
    pub const ZEROING: u32 = 1 << 5;
    pub const IOMMU_LIMIT_IOVA_ALIGNMENT: u32 = 1 << 10;
    /// Data, weight and regcmd buffers (ork's 0x403).
    pub const DATA: u32 = NON_CONTIGUOUS | CACHEABLE | IOMMU_LIMIT_IOVA_ALIGNMENT;
    /// Task-descriptor buffers: the kernel reads them through a kernel mapping (ork's 0x40b).
    pub const TASK: u32 = DATA | KERNEL_MAPPING;
}

/// `rknpu_submit.flags` job-mode bits (rknpu-facts §1.3, source S1).
pub mod job_flags {
    pub const PC: u32 = 1 << 0;
    pub const NONBLOCK: u32 = 1 << 1;
    pub const PINGPONG: u32 = 1 << 2;
}

/// Direction of a cache-maintenance operation (`rknpu_mem_sync.flags`: 1 = to device, 2 = from).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyncDir {
    ToDevice,
    FromDevice,
}

/// One task descriptor, `struct rknpu_task` (packed, 40 bytes; rknpu-facts §1.3, source S1).
/// An array of these lives in a task buffer (created with [`mem_flags::TASK`]).
#[repr(C, packed)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct RknpuTask {
    pub flags: u32,
    pub op_idx: u32,
    /// Mesa's GLOBAL OPERATION_ENABLE bits: 0x0d = CNA + CORE + DPU. Not read by the kernel.
    pub enable_mask: u32,
    /// 0x300 = DPU group 0 and 1 done (pair-complete, the IRQ handler folds status pairwise).
    pub int_mask: u32,
    pub int_clear: u32,
    /// Written back by the kernel (blocking path only).
    pub int_status: u32,
    /// Body entries of the program, trailer (4 entries) excluded: 108 for the int8 matmul.
    pub regcfg_amount: u32,
    pub regcfg_offset: u32,
    /// IOVA of this program's regcmd, 16-byte aligned.
    pub regcmd_addr: u64,
}
const _: () = assert!(std::mem::size_of::<RknpuTask>() == 40);

/// Errors of a kernel interface. `Fault` is EFAULT-like (the domain's IOVA window is full or an
/// address is not mapped); `Timeout` means the job did not finish (the device was reset).
#[derive(Debug, thiserror::Error)]
pub enum KifError {
    #[error("{op}: {source}")]
    Sys { op: &'static str, source: nix::Error },
    #[error("{op}: IOVA window of domain {domain} exhausted or address unmapped (EFAULT)")]
    Fault { op: &'static str, domain: u32 },
    #[error("submit timed out after {timeout_ms} ms; the NPU was soft-reset")]
    Timeout { timeout_ms: u32 },
    #[error("the NPU was reset while the job ran")]
    Reset,
    #[error("{0}")]
    Invalid(String),
    #[error("not supported by the {driver} interface: {what}")]
    Unsupported { driver: &'static str, what: &'static str },
    #[error("no NPU device: {0}")]
    NoDevice(String),
}

/// A buffer object: kernel handle, IOVA in its domain, and the CPU mapping.
///
/// The mapping is shared with the device; the caller syncs with [`KernelInterface::mem_sync`]
/// around device access. A `Bo` is destroyed by [`KernelInterface::mem_destroy`] (or by the
/// interface's own drop of everything still alive).
pub struct Bo {
    pub handle: u32,
    /// Opaque kernel object cookie (`obj_addr`), needed by SYNC/DESTROY/SUBMIT on rknpu.
    pub obj_addr: u64,
    pub iova: Iova,
    pub size_bytes: usize,
    pub domain: DomainId,
    map_ptr: *mut u8,
    /// Keeps the mapping alive (a `memmap2::MmapRaw`, or the simulator's arena block).
    _keep: Box<dyn std::any::Any + Send + Sync>,
}

// SAFETY: the mapping is plain memory owned by `_keep`; concurrent access is the caller's
// responsibility exactly as with any device buffer (the NPU core gives each worker its own BOs).
unsafe impl Send for Bo {}
// SAFETY: shared access only hands out `&[u8]`; mutation goes through `&mut Bo`.
unsafe impl Sync for Bo {}

impl Bo {
    /// Wraps a mapping. `map_ptr` must point to `size_bytes` bytes kept alive by `keep`.
    ///
    /// # Safety
    /// `map_ptr..map_ptr+size_bytes` must be valid, writable memory for as long as `keep` lives.
    pub unsafe fn from_raw(handle: u32, obj_addr: u64, iova: Iova, size_bytes: usize, domain: DomainId, map_ptr: *mut u8, keep: Box<dyn std::any::Any + Send + Sync>) -> Bo {
        Bo { handle, obj_addr, iova, size_bytes, domain, map_ptr, _keep: keep }
    }

    pub fn bytes(&self) -> &[u8] {
        // SAFETY: `from_raw`'s contract: the mapping is valid for `size_bytes` while `_keep` lives.
        unsafe { std::slice::from_raw_parts(self.map_ptr, self.size_bytes) }
    }

    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`, and `&mut self` gives exclusive CPU access.
        unsafe { std::slice::from_raw_parts_mut(self.map_ptr, self.size_bytes) }
    }
}

impl fmt::Debug for Bo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Bo")
            .field("handle", &self.handle)
            .field("iova", &format_args!("{:#010x}", self.iova.0))
            .field("size_bytes", &self.size_bytes)
            .field("domain", &self.domain.0)
            .finish()
    }
}

/// One submit: `task_number` descriptors starting at `task_start` in `task_bo`, run on the cores
/// of `core_mask` (1 << core; 0 = let the kernel pick), every buffer in `domain`.
pub struct SubmitJob<'a> {
    pub task_bo: &'a Bo,
    pub task_start: u32,
    pub task_number: u32,
    pub core_mask: u32,
    pub domain: DomainId,
    /// [`job_flags`] bits; blocking submits use `PC | PINGPONG` (0x5).
    pub flags: u32,
    pub timeout_ms: u32,
}

/// What a finished submit reports.
#[derive(Clone, Copy, Debug, Default)]
pub struct SubmitDone {
    /// Kernel-measured busy time in nanoseconds (0 when the interface does not measure it).
    pub hw_elapse_ns: u64,
    /// Tasks the hardware completed.
    pub task_counter: u32,
    /// Bytes of cache maintenance the interface did on its own for this job (rocket's copies
    /// of buffers into other cores' address spaces), beyond the caller's
    /// [`KernelInterface::mem_sync`] calls.
    pub synced_bytes: usize,
}

/// The kernel-side interface of an NPU: buffers, cache maintenance, submit, reset.
pub trait KernelInterface: Send + Sync {
    /// Short name for logs: "rknpu", "rocket", "sim".
    fn name(&self) -> &'static str;
    /// Driver identification for logs, e.g. "rknpu 0.9.8".
    fn describe(&self) -> String;
    /// Allocates `size_bytes` (rounded up to 4 KiB) mapped into `domain`.
    fn mem_create(&self, size_bytes: usize, flags: u32, domain: DomainId) -> Result<Bo, KifError>;
    /// Cache maintenance on `len` bytes of `bo` from `offset`: `ToDevice` cleans the CPU's
    /// writes to memory, where the NPU reads them; `FromDevice` invalidates the CPU's copy, so
    /// that it reads what the NPU wrote (and drops CPU writes not cleaned first). The range must
    /// be non-empty and inside the buffer. An interface may widen it (whole cache lines; the
    /// whole buffer where the driver has no ranged sync); it returns the bytes it maintained.
    fn mem_sync(&self, bo: &Bo, dir: SyncDir, offset: usize, len: usize) -> Result<usize, KifError>;
    /// [`mem_sync`](Self::mem_sync) of the whole buffer.
    fn mem_sync_all(&self, bo: &Bo, dir: SyncDir) -> Result<usize, KifError> {
        self.mem_sync(bo, dir, 0, bo.size_bytes)
    }
    /// Unmaps and frees a buffer.
    fn mem_destroy(&self, bo: Bo) -> Result<(), KifError>;
    /// Runs a job to completion (blocking).
    fn submit(&self, job: &SubmitJob<'_>) -> Result<SubmitDone, KifError>;
    /// Soft-resets the NPU (every core).
    fn reset(&self) -> Result<(), KifError>;
    /// One line on the faults this interface injected on purpose (the simulator under
    /// `ORK_SIM_FAULT`), for the exit log; None for a real device or when nothing is injected.
    fn fault_report(&self) -> Option<String> {
        None
    }
    /// Copies of each weight the interface keeps in memory when `cores` cores run jobs on it.
    /// 1 on every interface here: the vendor driver and the simulator let every core read the
    /// one buffer, and on `rocket` each core holds only its own part of a weight
    /// ([`per_core_spaces`](Self::per_core_spaces)). The residency budget and the memory report
    /// count weights by it (`npu::domain`).
    fn weight_copies(&self, cores: u32) -> u32 {
        let _ = cores;
        1
    }
    /// Whether every cache maintenance covers the whole buffer whatever range is asked
    /// (`rocket`: PREP_BO/FINI_BO take no range). The NPU core then keeps its per-submit
    /// buffers small (`npu::mm`).
    fn syncs_whole_buffers(&self) -> bool {
        false
    }
    /// IOMMU domains weights may be placed in (logical ids `0..max_domains()`): [`MAX_DOMAINS`]
    /// where the driver keeps 16 windows; 1 on the ports with one window or one pool
    /// ([`port`]).
    fn max_domains(&self) -> u32 {
        MAX_DOMAINS
    }
    /// NPU cores the kernel lets jobs run on, where it says (a device tree that gives the driver
    /// fewer cores than the SoC has); None = the SoC's.
    fn cores(&self) -> Option<u32> {
        None
    }
    /// The NPU clock the driver reports (devfreq or the driver's own answer); None = unknown, the
    /// timing model's nominal clock.
    fn clock_hz(&self) -> Option<u64> {
        None
    }
    /// Whether every core has an address space of its own: a buffer created in
    /// [`space_of`](Self::space_of)`(d, c)` is addressable by jobs on core `c` only. False where
    /// the cores share the domain's address space (the vendor driver, the simulator). Where
    /// true, the NPU core splits each weight into per-core parts, each holding the N-blocks its
    /// core computes (`npu::mm`), and runs a job of core `c` in `space_of(d, c)`.
    fn per_core_spaces(&self) -> bool {
        false
    }
    /// The address space jobs of `core` use for the buffers of domain `domain`: `domain` itself
    /// where the cores share it; on `rocket` the file descriptor of that core in that domain's
    /// group (see `rocket`).
    fn space_of(&self, domain: DomainId, core: u32) -> DomainId {
        let _ = core;
        domain
    }
    /// Imports existing host bytes (e.g. an mmapped `.orkpack` payload) as a device buffer,
    /// calling `observe(offset, device_copy)` for each piece right after the piece was written,
    /// in order, covering all of `bytes` (pieces of [`IMPORT_PIECE_BYTES`]). No interface here
    /// can map a file's pages into the device without a copy (see `rknpu`'s "Import" note: a
    /// dma-heap/PRIME import still needs the bytes copied into the dma-buf), so every one copies
    /// once into a new buffer. A caller checksums what landed in device memory in the same pass
    /// that copies it, reading each piece while it is still in the CPU cache. On `Err` the
    /// buffer is gone and anything observed must be discarded.
    fn mem_import_observed(&self, bytes: &[u8], domain: DomainId, observe: &mut dyn FnMut(usize, &[u8])) -> Result<Bo, KifError> {
        let mut bo = self.mem_create(bytes.len(), mem_flags::DATA, domain)?;
        for (i, piece) in bytes.chunks(IMPORT_PIECE_BYTES).enumerate() {
            let dst = &mut bo.bytes_mut()[i * IMPORT_PIECE_BYTES..i * IMPORT_PIECE_BYTES + piece.len()];
            dst.copy_from_slice(piece);
            observe(i * IMPORT_PIECE_BYTES, dst);
        }
        if let Err(e) = self.mem_sync_all(&bo, SyncDir::ToDevice) {
            let _ = self.mem_destroy(bo);
            return Err(e);
        }
        Ok(bo)
    }
}

/// The cold-output-buffer defence (rknpu-facts §2.6): on the board the first submit into a
/// freshly allocated output buffer returns stale data, so ork runs one throw-away warm-up submit
/// per fresh output buffer and again after every reset. Both hardware interfaces keep the set of
/// output buffers (by GEM handle) that a submit has written since they were created or since the
/// last reset; a job whose outputs are not all warm is submitted twice, the first result
/// discarded.
#[derive(Default)]
pub(crate) struct Warmth {
    warm: std::sync::Mutex<std::collections::HashSet<u32>>,
    /// Warm-up submits issued (for logs and tests).
    pub warmups: std::sync::atomic::AtomicU64,
}

impl Warmth {
    fn set(&self) -> std::sync::MutexGuard<'_, std::collections::HashSet<u32>> {
        self.warm.lock().unwrap_or_else(|p| p.into_inner())
    }
    /// The handles of `outs` that no submit has written yet.
    pub fn cold(&self, outs: &[u32]) -> Vec<u32> {
        let w = self.set();
        outs.iter().copied().filter(|h| !w.contains(h)).collect()
    }
    pub fn mark(&self, outs: &[u32]) {
        self.set().extend(outs.iter().copied());
    }
    /// A destroyed buffer's handle may be reused by a new, cold buffer.
    pub fn forget(&self, handle: u32) {
        self.set().remove(&handle);
    }
    /// After a reset every buffer is cold again.
    pub fn clear(&self) {
        self.set().clear();
    }
}

/// Reads `task_number` descriptors starting at `task_start` from a task buffer's bytes.
pub fn read_tasks(task_bytes: &[u8], task_start: u32, task_number: u32) -> Result<Vec<RknpuTask>, KifError> {
    let sz = std::mem::size_of::<RknpuTask>();
    let start = task_start as usize * sz;
    let end = start + task_number as usize * sz;
    if task_number == 0 || end > task_bytes.len() {
        return Err(KifError::Invalid(format!("tasks {task_start}..+{task_number} do not fit the {}-byte task buffer", task_bytes.len())));
    }
    Ok(task_bytes[start..end].chunks_exact(sz).map(bytemuck::pod_read_unaligned::<RknpuTask>).collect())
}

/// Registers whose value is an IOVA in the matmul program: activation base, weight base, output
/// base, and the PC chain link (rknpu-facts §2.2 rows 25/34/61, §2.4).
pub(crate) fn is_address_reg(e: &crate::npu::regs::RegCmd) -> bool {
    use crate::npu::regs::{CNA_DCOMP_ADDR0, CNA_FEATURE_DATA_ADDR, DPU_DST_BASE_ADDR, PC_BASE_ADDRESS};
    e.writes(&CNA_FEATURE_DATA_ADDR::REG) || e.writes(&CNA_DCOMP_ADDR0::REG) || e.writes(&DPU_DST_BASE_ADDR::REG) || e.writes(&PC_BASE_ADDRESS::REG)
}

/// The DPU destination addresses (`DST_BASE_ADDR`) a regcmd stream writes to.
pub(crate) fn output_addrs(entries: &[crate::npu::regs::RegCmd]) -> Vec<u32> {
    use crate::npu::regs::DPU_DST_BASE_ADDR;
    entries.iter().filter(|e| e.writes(&DPU_DST_BASE_ADDR::REG)).map(|e| e.value()).collect()
}

/// Piece size of [`KernelInterface::mem_import_observed`]: small enough that a piece just
/// copied is still in the L2 cache of the cores this targets (Cortex-A76: 512 KiB) when it is
/// observed.
pub const IMPORT_PIECE_BYTES: usize = 256 << 10;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_rounding() {
        assert_eq!(page_round(1), 4096);
        assert_eq!(page_round(4096), 4096);
        assert_eq!(page_round(4097), 8192);
    }

    #[test]
    fn sync_spans_are_whole_lines() {
        assert_eq!(line_span(0, 1, 4096), (0, 64));
        assert_eq!(line_span(60, 8, 4096), (0, 128));
        assert_eq!(line_span(64, 64, 4096), (64, 128));
        assert_eq!(line_span(4092, 4, 4096), (4032, 4096));
    }
}
