//! GPU decode engine: small-M matmuls (GEMV, M ≤ 4 per dispatch) on the Mali GPU via Vulkan.
//!
//! **What it owns.** The Vulkan loader and instance ([`instance`]), the choice of physical device
//! and the logical device ([`device`]), host-visible buffers ([`buffer`]), the compute pipelines
//! ([`pipeline`], [`shaders`]), resident weight copies ([`VkWeight`]) and the per-call
//! execution state (one command buffer, one fence, one I/O arena) behind a mutex in
//! [`VkEngine`]. The scalar references the tests hold the kernels to are in [`reference`].
//!
//! **Why it exists.** Decode is memory-bound; the NPU is best kept for compute-bound prefill.
//! Running decode matmuls on the Mali GPU lets the two overlap (seed 000: pair opposite
//! bottlenecks; the GPU path is a "don't block the NPU" fallback, not a faster decode).
//!
//! **Decisions.**
//! * `libvulkan` is opened at run time (`ash` `loaded`): no loader, no driver or no suitable
//!   device gives `VkEngine::open(..) == Ok(None)` plus one log line, never a panic or a link
//!   error. Device choice: see [`device`] (`ORK_VK_DEVICE`, default "Mali").
//! * Ownership follows wgpu-hal: [`device::DeviceShared`] (in an `Arc`, holding the instance's
//!   `Arc`) is held by every resource; each resource destroys its own objects in `Drop`, the
//!   device last (after `vkDeviceWaitIdle`), then the instance, then the loader.
//! * Synchronisation: one mutex around the command pool/buffer, the fence and the I/O arena. A
//!   call records all its dispatches into one command buffer, submits once and waits once
//!   (`gemv_batch` keeps per-token synchronisation to one wait). Nothing is in flight between
//!   calls, which is what makes `Drop` and buffer reuse simple.
//! * Memory: weights are copied once at upload into host-visible, coherent memory (UMA on the
//!   board: no staging). `VK_EXT_external_memory_host` import was considered: lavapipe (Mesa
//!   22.3) lists it, but `upload` borrows the caller's bytes only for the call, so importing
//!   them would let the GPU read memory the caller may free; the int8 rows are also padded to
//!   16 bytes. An owning/`'static` upload variant could import later.
//! * Shaders read everything as 32-bit words and unpack bytes and nibbles with shifts and
//!   `bitfieldExtract`: no 8/16-bit storage, no `shaderInt8`, no integer dot product needed
//!   (Debian 12's glslc cannot emit `GL_EXT_integer_dot_product` anyway). Those features are
//!   logged, since they are the levers for a faster Mali kernel. Each subgroup reduces one
//!   weight row with `subgroupAdd` (required: subgroup arithmetic in compute), which on
//!   lavapipe was ~10× faster than a shared-memory tree reduction with barriers.
//! * int8 path: activations are quantized **on the host** (per-row symmetric, scale =
//!   max|x|/127, round-half-even, clamp ±127: the NPU path's formula), K is zero-padded to a
//!   multiple of 16 in both weight rows and activation rows, sums are int32 and the output is
//!   `(a_scale[m] * w_scale[n]) * sum`, bit-exact against the scalar `reference_i8` (`tests/vk_common`). K is
//!   limited to 133 143 so `127·127·K` fits an i32.
//! * 4-bit paths read GGUF Q4_0 / Q4_K blocks as stored (no repacking); f32 activations and
//!   outputs; layouts from the pinned `ggml-common.h` / `ggml-quants.c`.
//! * SPIR-V is committed (`shaders/spv/`) and embedded; see `shaders/README.md`.
//!
//! **Sources.** Vulkan 1.3 specification (memory types, push constants, synchronisation);
//! ggml `ggml-common.h` (`block_q4_0`, `block_q4_K`) and `ggml-quants.c`
//! (`dequantize_row_q4_0`, `dequantize_row_q4_K`, `get_scale_min_k4`) of llama.cpp b11549;
//! wgpu-hal's Vulkan backend for the ownership shape (facts only, no code).
//!
//! `unsafe` (Vulkan calls through `ash`, the mapped host buffers) is allowed in this file and in
//! `buffer`, `device`, `instance` and `pipeline`; the scalar references and the shader table
//! are safe code.
#![allow(unsafe_code)]

pub mod buffer;
pub mod device;
pub mod instance;
pub mod pipeline;
#[deny(unsafe_code)]
pub mod reference;
#[deny(unsafe_code)]
pub mod shaders;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use ash::vk;

use buffer::{BufferUse, HostBuffer};
use device::{DeviceShared, DeviceWanted};
use instance::InstanceShared;
use pipeline::Pipelines;
use reference::{quantize_row_i8, Q4K_BLOCK_BYTES, Q4K_BLOCK_ELEMS, Q4_0_BLOCK_BYTES, Q4_0_BLOCK_ELEMS};
use shaders::{rows_per_workgroup, GemvPush, ShaderId, MAX_M};

/// Longest a single submit may take before the call fails (lavapipe on a loaded host is slow).
const FENCE_TIMEOUT: Duration = Duration::from_secs(60);
/// Largest K of the int8 path: `127 * 127 * K` must fit an i32 accumulator.
pub const I8_MAX_K: usize = (i32::MAX as usize) / (127 * 127);
/// int8 rows (weights and activations) are zero-padded to a multiple of this many bytes, so the
/// shader reads them as `uvec4`.
const I8_ROW_ALIGN_BYTES: usize = 16;
/// Alignment of every region in the I/O arena, in words (16 bytes).
const IO_ALIGN_WORDS: usize = 4;

/// Errors of the Vulkan engine.
#[derive(Debug, thiserror::Error)]
pub enum VkError {
    // ---- Vulkan itself ----
    /// A Vulkan call returned an error code (out of memory, device lost, …).
    #[error("{call} failed: {result}")]
    Call { call: &'static str, result: vk::Result },
    /// No memory type satisfies the buffer.
    #[error("no memory type for {what} (allowed type bits {type_bits:#x})")]
    NoMemoryType { what: &'static str, type_bits: u32 },
    /// Embedded SPIR-V could not be read (misaligned length or bad magic).
    #[error("embedded SPIR-V of {shader} is malformed: {detail}")]
    BadSpirv { shader: &'static str, detail: String },
    /// The fence did not signal in time.
    #[error("{op}: GPU did not finish within {timeout_ms} ms")]
    Timeout { op: &'static str, timeout_ms: u64 },
    // ---- caller errors ----
    /// Shapes or lengths do not agree.
    #[error("{op}: {detail}")]
    Shape { op: &'static str, detail: String },
    /// A buffer would exceed the device's `maxStorageBufferRange`.
    #[error("{op}: {bytes} bytes exceed the device's maxStorageBufferRange ({max} bytes)")]
    TooLarge { op: &'static str, bytes: u64, max: u64 },
    /// The weight was uploaded through a different engine.
    #[error("{op}: weight belongs to another VkEngine")]
    ForeignWeight { op: &'static str },
    /// A previous call panicked while holding the engine's lock.
    #[error("{op}: engine poisoned by an earlier panic")]
    Poisoned { op: &'static str },
}

impl VkError {
    /// For `map_err` after Vulkan call `call`: its error code as [`VkError::Call`].
    fn call(call: &'static str) -> impl Fn(vk::Result) -> VkError {
        move |result| VkError::Call { call, result }
    }
}

/// A weight to upload, borrowed for the duration of [`VkEngine::upload`].
#[derive(Clone, Copy, Debug)]
pub enum VkWeightData<'a> {
    /// `w: [N, K]` row-major i8, `scale: [N]` f32 per output channel.
    I8 { w: &'a [i8], scale: &'a [f32] },
    /// GGUF Q4_0 bytes: `[N, K/32]` blocks of 18 bytes, rows contiguous.
    Q4_0(&'a [u8]),
    /// GGUF Q4_K bytes: `[N, K/256]` super-blocks of 144 bytes, rows contiguous.
    Q4K(&'a [u8]),
}

/// A weight resident in GPU-visible memory, with its descriptor set. Immutable once uploaded.
pub struct VkWeight {
    shader: ShaderId,
    n: usize,
    k: usize,
    /// Row stride of the int8 layout in 32-bit words (0 for the 4-bit formats).
    row_words: usize,
    pool: vk::DescriptorPool,
    set: vk::DescriptorSet,
    _data: HostBuffer,
    _scale: Option<HostBuffer>,
    dev: Arc<DeviceShared>,
}

impl VkWeight {
    /// Output channels.
    pub fn n(&self) -> usize {
        self.n
    }
    /// Reduction length.
    pub fn k(&self) -> usize {
        self.k
    }
}

impl std::fmt::Debug for VkWeight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VkWeight").field("shader", &self.shader).field("n", &self.n).field("k", &self.k).finish()
    }
}

impl Drop for VkWeight {
    fn drop(&mut self) {
        // SAFETY: no submit using the set is pending (every call waits); destroying the pool
        // frees the set; the buffers are dropped after this (field order), the device last.
        unsafe { self.dev.device.destroy_descriptor_pool(self.pool, None) };
    }
}

/// Per-call execution state, guarded by the engine's mutex.
struct Exec {
    cmd_pool: vk::CommandPool,
    cmd: vk::CommandBuffer,
    fence: vk::Fence,
    io_pool: vk::DescriptorPool,
    io_set: vk::DescriptorSet,
    /// The I/O arena (activations, scales, outputs); grown on demand, never shrunk.
    io: Option<HostBuffer>,
    /// Scratch for one quantized activation row.
    xq: Vec<i8>,
    dev: Arc<DeviceShared>,
}

impl Drop for Exec {
    fn drop(&mut self) {
        let d = &self.dev.device;
        // SAFETY: nothing is in flight (every call waits on the fence before unlocking); reverse
        // creation order; null handles are no-ops. The arena buffer drops after this.
        unsafe {
            d.destroy_descriptor_pool(self.io_pool, None);
            d.destroy_fence(self.fence, None);
            d.destroy_command_pool(self.cmd_pool, None);
        }
    }
}

/// Where one job's data sits in the I/O arena (word offsets).
struct JobLayout {
    x_off: usize,
    x_stride: usize,
    xs_off: usize,
    y_off: usize,
}

/// The Vulkan decode engine. `Send + Sync`: calls serialise on an internal mutex.
pub struct VkEngine {
    exec: Mutex<Exec>,
    pipes: Pipelines,
    name: String,
    dev: Arc<DeviceShared>,
}

fn descriptor_pool(dev: &DeviceShared, descriptors: u32) -> Result<vk::DescriptorPool, VkError> {
    let sizes = [vk::DescriptorPoolSize { ty: vk::DescriptorType::STORAGE_BUFFER, descriptor_count: descriptors }];
    let info = vk::DescriptorPoolCreateInfo::default().max_sets(1).pool_sizes(&sizes);
    // SAFETY: valid device and create info.
    unsafe { dev.device.create_descriptor_pool(&info, None) }.map_err(VkError::call("vkCreateDescriptorPool"))
}

fn allocate_set(dev: &DeviceShared, pool: vk::DescriptorPool, layout: vk::DescriptorSetLayout) -> Result<vk::DescriptorSet, VkError> {
    let layouts = [layout];
    let info = vk::DescriptorSetAllocateInfo::default().descriptor_pool(pool).set_layouts(&layouts);
    // SAFETY: pool sized for exactly this one set.
    let sets = unsafe { dev.device.allocate_descriptor_sets(&info) }.map_err(VkError::call("vkAllocateDescriptorSets"))?;
    Ok(sets[0])
}

fn write_set(dev: &DeviceShared, set: vk::DescriptorSet, buffers: &[vk::Buffer]) {
    let infos: Vec<[vk::DescriptorBufferInfo; 1]> = buffers
        .iter()
        .map(|&buffer| [vk::DescriptorBufferInfo { buffer, offset: 0, range: vk::WHOLE_SIZE }])
        .collect();
    let writes: Vec<vk::WriteDescriptorSet> = infos
        .iter()
        .enumerate()
        .map(|(i, info)| {
            vk::WriteDescriptorSet::default()
                .dst_set(set)
                .dst_binding(i as u32)
                .descriptor_type(vk::DescriptorType::STORAGE_BUFFER)
                .buffer_info(info)
        })
        .collect();
    // SAFETY: the set is not in use by any pending command buffer (callers hold the engine lock
    // with nothing in flight, or own a fresh set); the buffers are live.
    unsafe { dev.device.update_descriptor_sets(&writes, &[]) };
}

fn shape_err(op: &'static str, detail: String) -> VkError {
    VkError::Shape { op, detail }
}

impl VkEngine {
    /// Loads Vulkan, picks a device (see [`device`]; `device` is the value of `ORK_VK_DEVICE`, an
    /// index or a name substring, None = the first Mali) and builds the pipelines.
    /// `Ok(None)` (with one log line) when there is no loader, no driver or no suitable device.
    pub fn open(device: Option<&str>) -> Result<Option<Arc<VkEngine>>, VkError> {
        let Some(instance) = InstanceShared::new()? else { return Ok(None) };
        let Some(dev) = DeviceShared::open(Arc::new(instance), &DeviceWanted::from_value(device))? else {
            return Ok(None);
        };
        let pipes = Pipelines::new(&dev)?;
        let exec = Exec::new(&dev, &pipes)?;
        let name = dev.report.name.clone();
        Ok(Some(Arc::new(VkEngine { exec: Mutex::new(exec), pipes, name, dev })))
    }

    /// The Vulkan device name (e.g. "Mali-G610 MC4", "llvmpipe (LLVM 15.0.6, 256 bits)").
    pub fn device_name(&self) -> &str {
        &self.name
    }

    fn max_buffer_bytes(&self) -> u64 {
        self.dev.report.max_storage_buffer_range_bytes
    }

    /// Copies a weight into GPU-visible memory. `n` = output channels, `k` = reduction length.
    /// Layouts: see [`VkWeightData`]. int8: any K in 1..=[`I8_MAX_K`]; Q4_0: K % 32 == 0;
    /// Q4_K: K % 256 == 0.
    pub fn upload(&self, data: VkWeightData<'_>, n: usize, k: usize) -> Result<Arc<VkWeight>, VkError> {
        const OP: &str = "vk upload";
        if n == 0 || k == 0 {
            return Err(shape_err(OP, format!("empty weight [N={n}, K={k}]")));
        }
        let dev = &self.dev;
        let (shader, row_words, data_buf, scale_buf) = match data {
            VkWeightData::I8 { w, scale } => {
                if w.len() != n * k || scale.len() != n {
                    return Err(shape_err(OP, format!("int8 [N={n}, K={k}] got w.len()={} scale.len()={}", w.len(), scale.len())));
                }
                if k > I8_MAX_K {
                    return Err(shape_err(OP, format!("int8 K={k} > {I8_MAX_K} could overflow the i32 sums")));
                }
                let row_bytes = k.next_multiple_of(I8_ROW_ALIGN_BYTES);
                self.check_size(OP, n * row_bytes)?;
                let mut buf = HostBuffer::new(dev, n * row_bytes, BufferUse::Weights)?;
                let dst = buf.as_bytes_mut();
                for (drow, srow) in dst.chunks_exact_mut(row_bytes).zip(w.chunks_exact(k)) {
                    drow[..k].copy_from_slice(bytemuck::cast_slice(srow));
                    drow[k..].fill(0);
                }
                let mut sbuf = HostBuffer::new(dev, n * 4, BufferUse::Weights)?;
                sbuf.as_bytes_mut()[..n * 4].copy_from_slice(bytemuck::cast_slice(scale));
                (ShaderId::GemvI8, row_bytes / 4, buf, Some(sbuf))
            }
            VkWeightData::Q4_0(b) | VkWeightData::Q4K(b) => {
                let (shader, elems, bytes) = match data {
                    VkWeightData::Q4_0(_) => (ShaderId::GemvQ4_0, Q4_0_BLOCK_ELEMS, Q4_0_BLOCK_BYTES),
                    _ => (ShaderId::GemvQ4K, Q4K_BLOCK_ELEMS, Q4K_BLOCK_BYTES),
                };
                if k % elems != 0 {
                    return Err(shape_err(OP, format!("{shader:?}: K={k} is not a multiple of {elems}")));
                }
                let want = n * (k / elems) * bytes;
                if b.len() != want {
                    return Err(shape_err(OP, format!("{shader:?} [N={n}, K={k}] needs {want} bytes, got {}", b.len())));
                }
                // Q4_0 reads a block as five words starting at its 4-byte-aligned floor: one
                // spare word keeps the last block's read inside the buffer.
                let size = b.len().next_multiple_of(4) + 4;
                self.check_size(OP, size)?;
                let mut buf = HostBuffer::new(dev, size, BufferUse::Weights)?;
                let dst = buf.as_bytes_mut();
                dst[..b.len()].copy_from_slice(b);
                dst[b.len()..].fill(0);
                (shader, 0, buf, None)
            }
        };
        let pool = descriptor_pool(dev, 2)?;
        let built = allocate_set(dev, pool, self.pipes.weight_set_layout).inspect_err(|_| {
            // SAFETY: fresh pool, unused.
            unsafe { dev.device.destroy_descriptor_pool(pool, None) }
        })?;
        let scale_vk = scale_buf.as_ref().map_or(data_buf.buffer, |s| s.buffer);
        write_set(dev, built, &[data_buf.buffer, scale_vk]);
        Ok(Arc::new(VkWeight {
            shader,
            n,
            k,
            row_words,
            pool,
            set: built,
            _data: data_buf,
            _scale: scale_buf,
            dev: dev.clone(),
        }))
    }

    fn check_size(&self, op: &'static str, bytes: usize) -> Result<(), VkError> {
        if bytes as u64 > self.max_buffer_bytes() {
            return Err(VkError::TooLarge { op, bytes: bytes as u64, max: self.max_buffer_bytes() });
        }
        Ok(())
    }

    /// One GEMV: `x: [M, K]` row-major f32, `y: [M, N]` row-major f32 (overwritten), with
    /// `y[m][n] = Σ_k x[m][k]·W[n][k]` in the weight's arithmetic (see [`VkWeightData`]).
    /// M ≤ 4 per dispatch; a larger M is split into several dispatches of the same submit.
    /// One submit, one wait.
    pub fn gemv(&self, w: &VkWeight, x: &[f32], m: usize, y: &mut [f32]) -> Result<(), VkError> {
        self.gemv_batch(&mut [(w, x, m, y)])
    }

    /// Several independent GEMVs (same contract as [`gemv`](Self::gemv) each) recorded into one
    /// command buffer: one submit and one wait for all of them.
    pub fn gemv_batch(&self, jobs: &mut [(&VkWeight, &[f32], usize, &mut [f32])]) -> Result<(), VkError> {
        const OP: &str = "vk gemv";
        // 1. Validate and lay out the arena.
        let mut layouts = Vec::with_capacity(jobs.len());
        let mut words = 0usize;
        let mut alloc = |len: usize| {
            let at = words;
            words += len.next_multiple_of(IO_ALIGN_WORDS);
            at
        };
        for (w, x, m, y) in jobs.iter() {
            let (n, k, m) = (w.n, w.k, *m);
            if !Arc::ptr_eq(&w.dev, &self.dev) {
                return Err(VkError::ForeignWeight { op: OP });
            }
            if m == 0 || x.len() != m * k || y.len() != m * n {
                return Err(shape_err(OP, format!("W [N={n}, K={k}], M={m}: x.len()={} (want M*K), y.len()={} (want M*N)", x.len(), y.len())));
            }
            let x_stride = if w.shader == ShaderId::GemvI8 { w.row_words } else { k };
            let x_off = alloc(m * x_stride);
            let xs_off = alloc(m);
            let y_off = alloc(m * n);
            layouts.push(JobLayout { x_off, x_stride, xs_off, y_off });
        }
        if jobs.is_empty() {
            return Ok(());
        }
        self.check_size(OP, words * 4)?;

        let mut exec = self.exec.lock().map_err(|_| VkError::Poisoned { op: OP })?;
        let exec = &mut *exec;
        exec.ensure_io(&self.dev, words * 4)?;

        // 2. Write the inputs.
        {
            let Exec { io, xq, .. } = exec;
            let io = io.as_mut().expect("ensure_io").as_words_mut();
            for ((w, x, m, _), l) in jobs.iter().zip(&layouts) {
                let k = w.k;
                for mi in 0..*m {
                    let xr = &x[mi * k..(mi + 1) * k];
                    let dst = &mut io[l.x_off + mi * l.x_stride..l.x_off + (mi + 1) * l.x_stride];
                    if w.shader == ShaderId::GemvI8 {
                        xq.clear();
                        xq.resize(l.x_stride * 4, 0);
                        let s = quantize_row_i8(xr, &mut xq[..k]);
                        dst.copy_from_slice(bytemuck::cast_slice(&xq[..]));
                        io[l.xs_off + mi] = s.to_bits();
                    } else {
                        dst.copy_from_slice(bytemuck::cast_slice(xr));
                    }
                }
            }
        }

        // 3. Record, submit, wait.
        let d = &self.dev.device;
        let cb = exec.cmd;
        // SAFETY: the command buffer is not pending (previous call waited); recording uses live
        // pipelines, sets and buffers that outlive the wait below.
        unsafe {
            d.reset_command_buffer(cb, vk::CommandBufferResetFlags::empty()).map_err(VkError::call("vkResetCommandBuffer"))?;
            d.begin_command_buffer(cb, &vk::CommandBufferBeginInfo::default().flags(vk::CommandBufferUsageFlags::ONE_TIME_SUBMIT))
                .map_err(VkError::call("vkBeginCommandBuffer"))?;
            for ((w, _, m, _), l) in jobs.iter().zip(&layouts) {
                d.cmd_bind_pipeline(cb, vk::PipelineBindPoint::COMPUTE, self.pipes.get(w.shader));
                d.cmd_bind_descriptor_sets(cb, vk::PipelineBindPoint::COMPUTE, self.pipes.layout, 0, &[w.set, exec.io_set], &[]);
                let rows_per_wg = rows_per_workgroup(self.dev.report.subgroup_size);
                let groups = (w.n as u32).div_ceil(rows_per_wg);
                let gx = groups.min(self.dev.report.max_workgroup_count_x);
                let gy = groups.div_ceil(gx);
                for m0 in (0..*m).step_by(MAX_M) {
                    let mc = (*m - m0).min(MAX_M);
                    let push = GemvPush {
                        n: w.n as u32,
                        k: w.k as u32,
                        row_words: w.row_words as u32,
                        m: mc as u32,
                        x_off: (l.x_off + m0 * l.x_stride) as u32,
                        x_stride: l.x_stride as u32,
                        xs_off: (l.xs_off + m0) as u32,
                        y_off: (l.y_off + m0 * w.n) as u32,
                        rows_per_wg,
                    };
                    d.cmd_push_constants(cb, self.pipes.layout, vk::ShaderStageFlags::COMPUTE, 0, bytemuck::bytes_of(&push));
                    d.cmd_dispatch(cb, gx, gy, 1);
                }
            }
            let barrier = [vk::MemoryBarrier::default().src_access_mask(vk::AccessFlags::SHADER_WRITE).dst_access_mask(vk::AccessFlags::HOST_READ)];
            d.cmd_pipeline_barrier(
                cb,
                vk::PipelineStageFlags::COMPUTE_SHADER,
                vk::PipelineStageFlags::HOST,
                vk::DependencyFlags::empty(),
                &barrier,
                &[],
                &[],
            );
            d.end_command_buffer(cb).map_err(VkError::call("vkEndCommandBuffer"))?;
        }
        exec.submit_and_wait(&self.dev, OP)?;

        // 4. Read the outputs.
        let io = exec.io.as_ref().expect("ensure_io").as_words();
        for ((w, _, m, y), l) in jobs.iter_mut().zip(&layouts) {
            let src = &io[l.y_off..l.y_off + *m * w.n];
            y.copy_from_slice(bytemuck::cast_slice(src));
        }
        Ok(())
    }
}

impl Exec {
    fn new(dev: &Arc<DeviceShared>, pipes: &Pipelines) -> Result<Self, VkError> {
        let d = &dev.device;
        let mut this = Exec {
            cmd_pool: vk::CommandPool::null(),
            cmd: vk::CommandBuffer::null(),
            fence: vk::Fence::null(),
            io_pool: vk::DescriptorPool::null(),
            io_set: vk::DescriptorSet::null(),
            io: None,
            xq: Vec::new(),
            dev: dev.clone(),
        };
        let info = vk::CommandPoolCreateInfo::default()
            .queue_family_index(dev.queue_family)
            .flags(vk::CommandPoolCreateFlags::RESET_COMMAND_BUFFER);
        // SAFETY: valid device/create infos; on error `this` destroys what exists.
        this.cmd_pool = unsafe { d.create_command_pool(&info, None) }.map_err(VkError::call("vkCreateCommandPool"))?;
        let alloc = vk::CommandBufferAllocateInfo::default()
            .command_pool(this.cmd_pool)
            .level(vk::CommandBufferLevel::PRIMARY)
            .command_buffer_count(1);
        // SAFETY: as above.
        this.cmd = unsafe { d.allocate_command_buffers(&alloc) }.map_err(VkError::call("vkAllocateCommandBuffers"))?[0];
        // SAFETY: as above.
        this.fence = unsafe { d.create_fence(&vk::FenceCreateInfo::default(), None) }.map_err(VkError::call("vkCreateFence"))?;
        this.io_pool = descriptor_pool(dev, 1)?;
        this.io_set = allocate_set(dev, this.io_pool, pipes.io_set_layout)?;
        Ok(this)
    }

    /// Makes the arena at least `bytes` long (doubling), re-pointing the I/O descriptor set.
    fn ensure_io(&mut self, dev: &Arc<DeviceShared>, bytes: usize) -> Result<(), VkError> {
        if self.io.as_ref().is_some_and(|b| b.size_bytes() >= bytes) {
            return Ok(());
        }
        let max = dev.report.max_storage_buffer_range_bytes as usize;
        let size = bytes.next_power_of_two().max(64 << 10).min(max).max(bytes);
        self.io = None; // free the old arena first
        let buf = HostBuffer::new(dev, size, BufferUse::Io)?;
        write_set(dev, self.io_set, &[buf.buffer]);
        self.io = Some(buf);
        Ok(())
    }

    fn submit_and_wait(&mut self, dev: &DeviceShared, op: &'static str) -> Result<(), VkError> {
        let d = &dev.device;
        let cbs = [self.cmd];
        let submit = [vk::SubmitInfo::default().command_buffers(&cbs)];
        // SAFETY: the command buffer is fully recorded; the fence is unsignalled (reset after
        // every wait); the queue is used only under the engine mutex we hold.
        unsafe { d.queue_submit(dev.queue, &submit, self.fence) }.map_err(VkError::call("vkQueueSubmit"))?;
        let timeout_ns = FENCE_TIMEOUT.as_nanos() as u64;
        // SAFETY: waiting on our own fence.
        let waited = unsafe { d.wait_for_fences(&[self.fence], true, timeout_ns) };
        match waited {
            Ok(()) => {}
            Err(vk::Result::TIMEOUT) => {
                // The work may still be running; wait it out so buffers stay valid, then report.
                // SAFETY: plain queue wait under our lock.
                let _ = unsafe { d.queue_wait_idle(dev.queue) };
                // SAFETY: the queue is idle, so the fence is no longer in use.
                let _ = unsafe { d.reset_fences(&[self.fence]) };
                return Err(VkError::Timeout { op, timeout_ms: FENCE_TIMEOUT.as_millis() as u64 });
            }
            Err(result) => return Err(VkError::Call { call: "vkWaitForFences", result }),
        }
        // SAFETY: the fence is signalled and no longer used by a pending submit.
        unsafe { d.reset_fences(&[self.fence]) }.map_err(VkError::call("vkResetFences"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn public_types_are_send_sync() {
        assert_send_sync::<VkEngine>();
        assert_send_sync::<VkWeight>();
    }
}
