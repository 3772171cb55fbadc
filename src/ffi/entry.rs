//! The entry point `ggml_backend_init`, which builds the registry (`registry.rs`) in the layout of
//! the ggml the plugin finds itself in (`release.rs`, `host.rs`), and the registry's callbacks
//! (`reg_*`).

use super::abi::*;
use super::registry::{get_or_build, Registry};
use super::{api, backend, buffer, device, guard, host, release};
use crate::backend::Device;
use crate::config::Config;
use std::ffi::{c_char, c_void, CStr, CString};
use std::ptr::{null, null_mut};

/// The registry, built on first use.
fn registry() -> &'static Registry {
    get_or_build(build_registry)
}

fn build_registry() -> Registry {
    let cfg = Config::get();
    let layout = match release::classify(&release::facts(), cfg.unverified_ggml) {
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
