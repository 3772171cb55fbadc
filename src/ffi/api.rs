//! ggml functions resolved from the host process at run time.

use super::abi::*;
use std::ffi::c_void;
use std::sync::OnceLock;

pub(crate) struct GgmlApi {
    pub buffer_init: unsafe extern "C" fn(
        ggml_backend_buffer_type_t,
        ggml_backend_buffer_i,
        *mut c_void,
        usize,
    ) -> ggml_backend_buffer_t,
    pub get_type_traits: unsafe extern "C" fn(ggml_type) -> *const ggml_type_traits,
    pub nbytes: unsafe extern "C" fn(*const ggml_tensor) -> usize,
    pub row_size: unsafe extern "C" fn(ggml_type, i64) -> usize,
    pub is_contiguous: unsafe extern "C" fn(*const ggml_tensor) -> bool,
    pub graph_n_nodes: unsafe extern "C" fn(*mut ggml_cgraph) -> i32,
    pub graph_node: unsafe extern "C" fn(*mut ggml_cgraph, i32) -> *mut ggml_tensor,
    pub buft_is_host: unsafe extern "C" fn(ggml_backend_buffer_type_t) -> bool,
}

fn resolve() -> Result<GgmlApi, String> {
    let this = libloading::os::unix::Library::this();
    macro_rules! sym {
        ($name:literal) => {{
            // SAFETY: the symbol is looked up by its exact C name and given the C signature from
            // ggml-headers/ork_ggml_abi.h, the same in every supported release (checked against
            // each by tests/abi_drift.rs).
            let s = unsafe { this.get(concat!($name, "\0").as_bytes()) }
                .map_err(|e| format!("{}: {e}", $name))?;
            *s
        }};
    }
    Ok(GgmlApi {
        buffer_init: sym!("ggml_backend_buffer_init"),
        get_type_traits: sym!("ggml_get_type_traits"),
        nbytes: sym!("ggml_nbytes"),
        row_size: sym!("ggml_row_size"),
        is_contiguous: sym!("ggml_is_contiguous"),
        graph_n_nodes: sym!("ggml_graph_n_nodes"),
        graph_node: sym!("ggml_graph_node"),
        buft_is_host: sym!("ggml_backend_buft_is_host"),
    })
}

/// The resolved ggml API, or why it could not be resolved (not inside a ggml host process).
pub(crate) fn get() -> Result<&'static GgmlApi, &'static str> {
    static API: OnceLock<Result<GgmlApi, String>> = OnceLock::new();
    API.get_or_init(resolve).as_ref().map_err(|e| e.as_str())
}

/// The functions whole-graph mode needs to hand non-matmul nodes to ggml's CPU backend (resolved
/// separately: a host without them still gets the ACCEL device).
pub(crate) struct CpuApi {
    pub graph_view: unsafe extern "C" fn(*mut ggml_cgraph, i32, i32) -> ggml_cgraph,
    pub dev_by_type: unsafe extern "C" fn(ggml_backend_dev_type) -> ggml_backend_dev_t,
    pub dev_init: unsafe extern "C" fn(ggml_backend_dev_t, *const std::ffi::c_char) -> ggml_backend_t,
    pub dev_backend_reg: unsafe extern "C" fn(ggml_backend_dev_t) -> ggml_backend_reg_t,
    pub reg_get_proc_address: unsafe extern "C" fn(ggml_backend_reg_t, *const std::ffi::c_char) -> *mut c_void,
    pub graph_compute: unsafe extern "C" fn(ggml_backend_t, *mut ggml_cgraph) -> ggml_status,
    pub backend_free: unsafe extern "C" fn(ggml_backend_t),
    pub buft_name: unsafe extern "C" fn(ggml_backend_buffer_type_t) -> *const std::ffi::c_char,
    pub buft_alloc_buffer: unsafe extern "C" fn(ggml_backend_buffer_type_t, usize) -> ggml_backend_buffer_t,
    pub dev_supports_op: unsafe extern "C" fn(ggml_backend_dev_t, *const ggml_tensor) -> bool,
    pub dev_count: unsafe extern "C" fn() -> usize,
    pub dev_get: unsafe extern "C" fn(usize) -> ggml_backend_dev_t,
    pub dev_type: unsafe extern "C" fn(ggml_backend_dev_t) -> ggml_backend_dev_type,
    pub dev_host_buffer_type: unsafe extern "C" fn(ggml_backend_dev_t) -> ggml_backend_buffer_type_t,
}

fn resolve_cpu() -> Result<CpuApi, String> {
    let this = libloading::os::unix::Library::this();
    macro_rules! sym {
        ($name:literal) => {{
            // SAFETY: looked up by exact C name with the signature declared in
            // ggml-headers/ork_ggml_abi.h, the same in every supported release (checked against
            // each by tests/abi_drift.rs).
            let s = unsafe { this.get(concat!($name, "\0").as_bytes()) }
                .map_err(|e| format!("{}: {e}", $name))?;
            *s
        }};
    }
    Ok(CpuApi {
        graph_view: sym!("ggml_graph_view"),
        dev_by_type: sym!("ggml_backend_dev_by_type"),
        dev_init: sym!("ggml_backend_dev_init"),
        dev_backend_reg: sym!("ggml_backend_dev_backend_reg"),
        reg_get_proc_address: sym!("ggml_backend_reg_get_proc_address"),
        graph_compute: sym!("ggml_backend_graph_compute"),
        backend_free: sym!("ggml_backend_free"),
        buft_name: sym!("ggml_backend_buft_name"),
        buft_alloc_buffer: sym!("ggml_backend_buft_alloc_buffer"),
        dev_supports_op: sym!("ggml_backend_dev_supports_op"),
        dev_count: sym!("ggml_backend_dev_count"),
        dev_get: sym!("ggml_backend_dev_get"),
        dev_type: sym!("ggml_backend_dev_type"),
        dev_host_buffer_type: sym!("ggml_backend_dev_host_buffer_type"),
    })
}

/// The CPU-backend API, or why it could not be resolved.
pub(crate) fn cpu() -> Result<&'static CpuApi, &'static str> {
    static API: OnceLock<Result<CpuApi, String>> = OnceLock::new();
    API.get_or_init(resolve_cpu).as_ref().map_err(|e| e.as_str())
}
