//! ggml functions resolved from the host process at run time.

use super::abi::*;
use std::ffi::c_void;
use std::sync::OnceLock;

/// A table of ggml functions (`field: "C name" => signature`) and the function that resolves
/// it from the host process.
macro_rules! ggml_fns {
    ($(#[$doc:meta])* $api:ident, $resolve:ident { $($field:ident: $name:literal => $ty:ty,)* }) => {
        $(#[$doc])*
        pub(crate) struct $api {
            $(pub $field: $ty,)*
        }

        fn $resolve() -> Result<$api, String> {
            let this = libloading::os::unix::Library::this();
            Ok($api {
                $($field: {
                    // SAFETY: the symbol is looked up by its exact C name and given the C
                    // signature from ggml-headers/ork_ggml_abi.h, the same in every supported
                    // release (checked against each by tests/abi_drift.rs).
                    let s = unsafe { this.get::<$ty>(concat!($name, "\0").as_bytes()) }.map_err(|e| format!("{}: {e}", $name))?;
                    *s
                },)*
            })
        }
    };
}

ggml_fns!(GgmlApi, resolve {
    buffer_init: "ggml_backend_buffer_init" => unsafe extern "C" fn(ggml_backend_buffer_type_t, ggml_backend_buffer_i, *mut c_void, usize) -> ggml_backend_buffer_t,
    get_type_traits: "ggml_get_type_traits" => unsafe extern "C" fn(ggml_type) -> *const ggml_type_traits,
    nbytes: "ggml_nbytes" => unsafe extern "C" fn(*const ggml_tensor) -> usize,
    row_size: "ggml_row_size" => unsafe extern "C" fn(ggml_type, i64) -> usize,
    is_contiguous: "ggml_is_contiguous" => unsafe extern "C" fn(*const ggml_tensor) -> bool,
    graph_n_nodes: "ggml_graph_n_nodes" => unsafe extern "C" fn(*mut ggml_cgraph) -> i32,
    graph_node: "ggml_graph_node" => unsafe extern "C" fn(*mut ggml_cgraph, i32) -> *mut ggml_tensor,
    buft_is_host: "ggml_backend_buft_is_host" => unsafe extern "C" fn(ggml_backend_buffer_type_t) -> bool,
});

/// The resolved ggml API, or why it could not be resolved (not inside a ggml host process).
pub(crate) fn get() -> Result<&'static GgmlApi, &'static str> {
    static API: OnceLock<Result<GgmlApi, String>> = OnceLock::new();
    API.get_or_init(resolve).as_ref().map_err(|e| e.as_str())
}

ggml_fns!(
    /// The functions whole-graph mode needs to hand non-matmul nodes to ggml's CPU backend
    /// (resolved separately: a host without them still gets the ACCEL device).
    CpuApi, resolve_cpu {
    graph_view: "ggml_graph_view" => unsafe extern "C" fn(*mut ggml_cgraph, i32, i32) -> ggml_cgraph,
    dev_by_type: "ggml_backend_dev_by_type" => unsafe extern "C" fn(ggml_backend_dev_type) -> ggml_backend_dev_t,
    dev_init: "ggml_backend_dev_init" => unsafe extern "C" fn(ggml_backend_dev_t, *const std::ffi::c_char) -> ggml_backend_t,
    dev_backend_reg: "ggml_backend_dev_backend_reg" => unsafe extern "C" fn(ggml_backend_dev_t) -> ggml_backend_reg_t,
    reg_get_proc_address: "ggml_backend_reg_get_proc_address" => unsafe extern "C" fn(ggml_backend_reg_t, *const std::ffi::c_char) -> *mut c_void,
    graph_compute: "ggml_backend_graph_compute" => unsafe extern "C" fn(ggml_backend_t, *mut ggml_cgraph) -> ggml_status,
    backend_free: "ggml_backend_free" => unsafe extern "C" fn(ggml_backend_t),
    buft_name: "ggml_backend_buft_name" => unsafe extern "C" fn(ggml_backend_buffer_type_t) -> *const std::ffi::c_char,
    buft_alloc_buffer: "ggml_backend_buft_alloc_buffer" => unsafe extern "C" fn(ggml_backend_buffer_type_t, usize) -> ggml_backend_buffer_t,
    dev_supports_op: "ggml_backend_dev_supports_op" => unsafe extern "C" fn(ggml_backend_dev_t, *const ggml_tensor) -> bool,
    dev_count: "ggml_backend_dev_count" => unsafe extern "C" fn() -> usize,
    dev_get: "ggml_backend_dev_get" => unsafe extern "C" fn(usize) -> ggml_backend_dev_t,
    dev_type: "ggml_backend_dev_type" => unsafe extern "C" fn(ggml_backend_dev_t) -> ggml_backend_dev_type,
    dev_host_buffer_type: "ggml_backend_dev_host_buffer_type" => unsafe extern "C" fn(ggml_backend_dev_t) -> ggml_backend_buffer_type_t,
});

/// The CPU-backend API, or why it could not be resolved.
pub(crate) fn cpu() -> Result<&'static CpuApi, &'static str> {
    static API: OnceLock<Result<CpuApi, String>> = OnceLock::new();
    API.get_or_init(resolve_cpu).as_ref().map_err(|e| e.as_str())
}
