//! The registry ("ORK", zero or one device) as every callback reads it: what the plugin
//! registered in the layout of the ggml it finds itself in (`release.rs`), built once by the entry
//! point (`entry.rs`, `ggml_backend_init`); none in a ggml it does not know.

use super::abi::*;
use super::release::Layout;
use super::Poison;
use crate::backend::Device;
use std::ffi::CString;
use std::sync::OnceLock;

/// Everything the plugin registers; leaked once, so every pointer handed to ggml stays valid for
/// the life of the process (ggml never unregisters a backend). In a host whose ggml the plugin
/// does not know, `reg`, `dev` and `buft` are NULL and there is no device.
pub(super) struct Registry {
    pub(super) reg: *mut ggml_backend_reg,
    pub(super) dev: *mut ggml_backend_device,
    /// In the host's layout (`host::new_buft`): compared and handed to ggml, never read here.
    pub(super) buft: ggml_backend_buffer_type_t,
    /// The host's layout (None: unknown host, nothing registered).
    pub(super) layout: Option<Layout>,
    pub(super) device: Option<&'static Device>,
    pub(super) name: CString,
    pub(super) description: CString,
}
// SAFETY: the raw pointers point to leaked, never-freed structs that ggml reads from any thread;
// the Rust side only reads them after initialisation.
unsafe impl Send for Registry {}
// SAFETY: as above; all mutation happens inside `OnceLock::get_or_init`.
unsafe impl Sync for Registry {}

static REGISTRY: OnceLock<Registry> = OnceLock::new();
/// The guid of ORK's backends.
pub(super) static GUID: ggml_guid = *b"ggml-ork-npu\0\0\0\x01";
/// The device's poisoned flag (callbacks that act on it: `dev_supports_op`, `dev_init_backend`,
/// `buft_alloc_buffer`).
pub(super) static DEVICE: Poison = Poison::new("device");

/// The registry, built by `build` if it is not yet (the entry point's and the registry's own
/// callbacks: `entry.rs`).
pub(super) fn get_or_build(build: fn() -> Registry) -> &'static Registry {
    REGISTRY.get_or_init(build)
}

/// The registry, for the callbacks of the objects it registered: ggml reaches them only through
/// the registry `ggml_backend_init` built (a panic here, caught by the callback's guard, would
/// mean a callback ran before it).
pub(super) fn registry() -> &'static Registry {
    REGISTRY.get().expect("the registry is built before ggml can reach its objects")
}

/// The registry if it was built (no work, no panic: for looking up ggml objects).
pub(super) fn built() -> Option<&'static Registry> {
    REGISTRY.get()
}

/// The ORK device, if there is one.
pub(super) fn device() -> Option<&'static Device> {
    REGISTRY.get().and_then(|r| r.device)
}

/// The host's layout (None before `ggml_backend_init` or in an unknown host).
pub(super) fn layout() -> Option<Layout> {
    REGISTRY.get().and_then(|r| r.layout)
}
