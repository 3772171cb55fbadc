//! The compiled compute shaders and the Rust mirror of their interface.
//!
//! The SPIR-V is committed under `shaders/spv/` and embedded with `include_bytes!`, so a build
//! (on the board included) needs no shader compiler; `shaders/check.sh`, run by
//! `tests/vk_spirv_fresh.rs`, recompiles the GLSL and fails on drift. See `shaders/README.md`.
//!
//! Everything here mirrors `shaders/common/gemv_head.glsl`; change both together. Work split:
//! a workgroup owns `rows_per_wg` weight rows, each subgroup reduces one row at a time over K
//! with `subgroupAdd` (no shared memory, no barriers).

/// Invocations per workgroup (`WG` in the GLSL).
pub const WG_SIZE: u32 = 64;
/// Activation rows handled by one dispatch (`MAX_M`); larger M is split into dispatches.
pub const MAX_M: usize = 4;

/// One compute pipeline per weight format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ShaderId {
    /// `gemv_i8.comp`: per-channel int8 weights × per-row int8 activations, int32 sums.
    GemvI8,
    /// `gemv_q4_0.comp`: GGUF Q4_0 blocks × f32 activations.
    GemvQ4_0,
    /// `gemv_q4_k.comp`: GGUF Q4_K super-blocks × f32 activations.
    GemvQ4K,
}

impl ShaderId {
    /// Every shader, in pipeline-array order (`self as usize` indexes it).
    pub const ALL: [ShaderId; 3] = [ShaderId::GemvI8, ShaderId::GemvQ4_0, ShaderId::GemvQ4K];

    /// File stem under `shaders/` and `shaders/spv/`.
    pub fn name(self) -> &'static str {
        match self {
            ShaderId::GemvI8 => "gemv_i8",
            ShaderId::GemvQ4_0 => "gemv_q4_0",
            ShaderId::GemvQ4K => "gemv_q4_k",
        }
    }

    /// The committed SPIR-V (bytes; not necessarily 4-byte aligned, use `ash::util::read_spv`).
    pub fn spirv(self) -> &'static [u8] {
        match self {
            ShaderId::GemvI8 => include_bytes!("../../shaders/spv/gemv_i8.spv"),
            ShaderId::GemvQ4_0 => include_bytes!("../../shaders/spv/gemv_q4_0.spv"),
            ShaderId::GemvQ4K => include_bytes!("../../shaders/spv/gemv_q4_k.spv"),
        }
    }
}

/// Push constants of the GEMV family; field names equal the GLSL `Push` block members.
/// All offsets and strides are in 32-bit words of the I/O arena (descriptor set 1).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct GemvPush {
    /// Weight rows = output channels.
    pub n: u32,
    /// Reduction length in elements.
    pub k: u32,
    /// Weight row stride in 32-bit words (int8: padded K / 4; unused by the 4-bit kernels).
    pub row_words: u32,
    /// Activation rows in this dispatch, 1..=MAX_M.
    pub m: u32,
    /// Word offset of `x[0][0]`.
    pub x_off: u32,
    /// Words between consecutive activation rows.
    pub x_stride: u32,
    /// Word offset of the per-row activation scales (int8 kernel only).
    pub xs_off: u32,
    /// Word offset of `y[0][0]`; `y` is `[m, n]` row-major f32.
    pub y_off: u32,
    /// Weight rows owned by one workgroup (see [`rows_per_workgroup`]).
    pub rows_per_wg: u32,
}

/// Rows per workgroup for a device whose subgroups have `subgroup_size` lanes: one row per
/// subgroup at a time. The shader's row loop is correct for any actual subgroup size; this
/// only sets how much work one workgroup gets.
pub fn rows_per_workgroup(subgroup_size: u32) -> u32 {
    (WG_SIZE / subgroup_size.max(1)).max(1)
}

/// Bytes of [`GemvPush`]; Vulkan guarantees at least 128 bytes of push constants.
pub const GEMV_PUSH_BYTES: u32 = 36;
const _: () = assert!(std::mem::size_of::<GemvPush>() == GEMV_PUSH_BYTES as usize);
