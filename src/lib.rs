//! ggml-ork: a ggml dynamic backend that runs dense matrix multiplications on the Rockchip
//! RK3588 / RK3576 NPU (W8A8, weights packed once and resident), with the rest of the graph left
//! to ggml's CPU backend.
//!
//! Layout (mechanism vs policy, see docs/design.md):
//! * [`npu`] — mechanism: SoC table, register table, regcmd synthesis, tiled layouts, planner,
//!   multi-core pool, IOMMU domains, and the kernel interfaces (vendor rknpu, mainline rocket,
//!   simulator).
//! * [`quant`] — ggml weight types → per-output-channel int8; activations → per-row int8;
//!   int32 → f32.
//! * [`route`] — policy: which engine runs each MUL_MAT.
//! * [`backend`] — the ggml device, buffer type and graph execution, in safe Rust.
//! * [`ffi`] — the C ABI skin: every `extern "C"` entry point, panic-proof.
//! * [`vk`] — the Mali decode path: ash device, SPIR-V GEMV on int8 and native 4-bit weights.
//! * [`cache`] — `.orkpack`: packed weights persisted on disk and mapped back.
//! * [`config`] — every `ORK_*` variable, parsed once.
//!
//! `unsafe` is denied crate-wide and allowed only where raw memory or foreign calls live:
//! `npu::kif` (device mappings and ioctls), `vk` (Vulkan calls; not `vk::reference` or
//! `vk::shaders`), `quant::simd` (SIMD intrinsics), `os` (file and shared mappings; not
//! `os::meminfo` or `os::hostcpu`) and `ffi` (the C ABI).
#![deny(unsafe_code)]
#![deny(unsafe_op_in_unsafe_fn)]

// The NPU's buffers (int32 results, register commands, tiles) are little-endian and read in
// place, as are the cache files. Every host ORK serves is little-endian: RK3588 (4 Cortex-A76 +
// 4 Cortex-A55) and RK3576 (4 Cortex-A72 + 4 Cortex-A53) run AArch64 Linux, whose ABI is
// little-endian (`aarch64-unknown-linux-gnu`; big-endian AArch64 is the separate `aarch64_be`
// target, which no board image ships).
#[cfg(target_endian = "big")]
compile_error!("ggml-ork builds for little-endian hosts only (RK3588 / RK3576 run little-endian AArch64 Linux)");

pub mod logging;
pub mod config;
pub mod os;
pub mod quant;
pub mod npu;
pub mod vk;
pub mod pack;
pub mod cache;
pub mod route;
pub mod backend;
pub mod ffi;
