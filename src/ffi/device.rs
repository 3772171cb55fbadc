//! The device callbacks (`dev_*`).

use super::abi::*;
use super::registry::{device, registry, DEVICE};
use super::{backend, buffer, guard, node};
use crate::backend::Device;
use std::ffi::c_char;
use std::ptr::{null, null_mut};

/// The device's interface table.
pub(super) const IFACE: ggml_backend_device_i = ggml_backend_device_i {
    get_name: Some(dev_get_name),
    get_description: Some(dev_get_description),
    get_memory: Some(dev_get_memory),
    get_type: Some(dev_get_type),
    get_props: Some(dev_get_props),
    init_backend: Some(dev_init_backend),
    get_buffer_type: Some(dev_get_buffer_type),
    get_host_buffer_type: None,
    buffer_from_host_ptr: Some(buffer::dev_buffer_from_host_ptr),
    supports_op: Some(dev_supports_op),
    supports_buft: Some(dev_supports_buft),
    offload_op: None,
    event_new: None,
    event_free: None,
    event_synchronize: None,
};

unsafe extern "C" fn dev_get_name(_dev: ggml_backend_dev_t) -> *const c_char {
    guard("dev_get_name", null(), || registry().name.as_ptr())
}

unsafe extern "C" fn dev_get_description(_dev: ggml_backend_dev_t) -> *const c_char {
    guard("dev_get_description", null(), || registry().description.as_ptr())
}

unsafe extern "C" fn dev_get_memory(_dev: ggml_backend_dev_t, free: *mut usize, total: *mut usize) {
    guard("dev_get_memory", (), || {
        let (f, t) = Device::system_memory();
        // SAFETY: ggml passes valid out-pointers (or NULL, which we skip).
        unsafe {
            if !free.is_null() {
                *free = f;
            }
            if !total.is_null() {
                *total = t;
            }
        }
    })
}

/// A fixed answer, which is also its failure value.
unsafe extern "C" fn dev_get_type(_dev: ggml_backend_dev_t) -> ggml_backend_dev_type {
    guard("dev_get_type", GGML_BACKEND_DEVICE_TYPE_ACCEL, || GGML_BACKEND_DEVICE_TYPE_ACCEL)
}

unsafe extern "C" fn dev_get_props(dev: ggml_backend_dev_t, props: *mut ggml_backend_dev_props) {
    guard("dev_get_props", (), || {
        if props.is_null() {
            return;
        }
        let r = registry();
        let (f, t) = Device::system_memory();
        // SAFETY: `props` is a valid out-pointer from ggml (zeroed by its wrapper).
        let p = unsafe { &mut *props };
        p.name = r.name.as_ptr();
        p.description = r.description.as_ptr();
        p.memory_free = f;
        p.memory_total = t;
        // SAFETY: `dev` is our device; the call only reads our own table.
        p.type_ = unsafe { dev_get_type(dev) };
        p.device_id = null();
        p.caps = ggml_backend_dev_caps {
            async_: false,
            host_buffer: false,
            // llama.cpp then lays ORK's weight buffers over its mapping of the model file.
            buffer_from_host_ptr: device().is_some_and(|d| d.cfg.map_weights),
            events: false,
            mmap_support: true,
        };
    })
}

unsafe extern "C" fn dev_get_buffer_type(_dev: ggml_backend_dev_t) -> ggml_backend_buffer_type_t {
    guard("dev_get_buffer_type", null_mut(), || registry().buft)
}

unsafe extern "C" fn dev_supports_buft(_dev: ggml_backend_dev_t, buft: ggml_backend_buffer_type_t) -> bool {
    guard("dev_supports_buft", false, || {
        // Our own buffers, any host buffer (activations live in the CPU's compute buffers), and
        // ggml-cpu's CPU_REPACK weights ORK packed as they were loaded (`repack`).
        // SAFETY: ggml passes a live buffer type.
        buft == registry().buft || unsafe { buffer::buft_is_host_any(buft) } || super::repack::is_watched_type(buft)
    })
}

unsafe extern "C" fn dev_supports_op(_dev: ggml_backend_dev_t, op: *const ggml_tensor) -> bool {
    DEVICE.guard("dev_supports_op", false, || {
        let Some(dev) = device() else { return false };
        if op.is_null() {
            return false;
        }
        let t0 = std::time::Instant::now();
        // SAFETY: ggml passes a live tensor whose sources are live or NULL.
        let node = unsafe { node::node(&*op) };
        let yes = crate::backend::graph::supports(dev, &node);
        dev.stats.split_calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        dev.stats.split_ns.fetch_add(t0.elapsed().as_nanos() as u64, std::sync::atomic::Ordering::Relaxed);
        yes
    })
}

unsafe extern "C" fn dev_init_backend(dev: ggml_backend_dev_t, _params: *const c_char) -> ggml_backend_t {
    DEVICE.guard("dev_init_backend", null_mut(), || {
        if device().is_none() {
            return null_mut();
        }
        backend::give_back_load_memory();
        backend::new(dev)
    })
}
