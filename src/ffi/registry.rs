//! The entry point `ggml_backend_init` and the registry ("ORK", zero or one device), in the
//! layout of the ggml the plugin finds itself in (`host.rs`); none in a ggml it does not know.

use super::abi::*;
use super::host::{self, Layout};
use super::{api, backend, buffer, device, guard, Poison};
use crate::backend::Device;
use crate::config::Config;
use std::ffi::{c_char, c_void, CStr, CString};
use std::ptr::{null, null_mut};
use std::sync::OnceLock;

/// Everything the plugin registers; leaked once, so every pointer handed to ggml stays valid for
/// the life of the process (ggml never unregisters a backend). In a host whose ggml the plugin
/// does not know, `reg`, `dev` and `buft` are NULL and there is no device.
pub(super) struct Registry {
    reg: *mut ggml_backend_reg,
    dev: *mut ggml_backend_device,
    /// In the host's layout (`host::new_buft`): compared and handed to ggml, never read here.
    pub(super) buft: ggml_backend_buffer_type_t,
    /// The host's layout (None: unknown host, nothing registered).
    pub(super) layout: Option<Layout>,
    device: Option<&'static Device>,
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

/// The registry, built on first use.
pub(super) fn registry() -> &'static Registry {
    REGISTRY.get_or_init(build_registry)
}

/// The registry if it was built (no work, no panic: for looking up ggml objects).
pub(super) fn built() -> Option<&'static Registry> {
    REGISTRY.get()
}

/// The ORK device, if there is one.
pub(super) fn device() -> Option<&'static Device> {
    REGISTRY.get().and_then(|r| r.device)
}

fn build_registry() -> Registry {
    let cfg = Config::get();
    let layout = match host::classify(&host::facts(), cfg.unverified_ggml) {
        Ok(r) => {
            if let Some(w) = r.warning {
                log::warn!("{w}");
            }
            r.layout
        }
        Err(line) => {
            log::warn!("{line}");
            return Registry {
                reg: null_mut(),
                dev: null_mut(),
                buft: null_mut(),
                layout: None,
                device: None,
                name: c"ORK".into(),
                description: CString::default(),
            };
        }
    };
    let marks = layout.marks();
    log::debug!("host: llama.cpp b{} layout (ggml {}, backend API {})", marks.llama_build, marks.ggml_version, marks.api_version);
    let device = match Device::open(cfg, api::get().map(|_| ())) {
        Ok(d) => {
            let d: &'static Device = Box::leak(Box::new(d));
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
        api_version: marks.api_version,
        iface: ggml_backend_reg_i {
            get_name: Some(reg_get_name),
            get_device_count: Some(reg_get_device_count),
            get_device: Some(reg_get_device),
            get_proc_address: Some(reg_get_proc_address),
        },
        context: null_mut(),
    }));
    let dev = Box::leak(Box::new(ggml_backend_device { iface: device::IFACE, reg, context: null_mut() }));
    let buft = host::new_buft(layout, &buffer::BUFT_FNS, dev);
    Registry { reg, dev, buft, layout: Some(layout), device, name: c"ORK".into(), description }
}

/// The dynamic-backend entry point: returns the "ORK" registry with its device in the host's
/// layout, or NULL — after one line saying why — in a ggml the plugin does not know, without an
/// NPU, or with `ORK_OFF=1`: no registry at all then, so no tool lists an "ORK" backend that has
/// no device (llama-bench names every registry in its backend column). ggml adds its own line
/// that the init returned NULL.
#[no_mangle]
pub extern "C" fn ggml_backend_init() -> ggml_backend_reg_t {
    guard("ggml_backend_init", null_mut(), || {
        let r = registry();
        if r.device.is_some() {
            r.reg
        } else {
            null_mut()
        }
    })
}

unsafe extern "C" fn reg_get_name(_reg: ggml_backend_reg_t) -> *const c_char {
    guard("reg_get_name", null(), || registry().name.as_ptr())
}

/// The host's layout (None before `ggml_backend_init` or in an unknown host).
pub(super) fn layout() -> Option<Layout> {
    REGISTRY.get().and_then(|r| r.layout)
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
                let f: unsafe extern "C" fn(ggml_backend_t, i32) -> bool = backend::backend_set_n_threads;
                f as *mut c_void
            }
            _ => null_mut(),
        }
    })
}
