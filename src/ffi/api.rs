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
    pub op_name: unsafe extern "C" fn(ggml_op) -> *const std::ffi::c_char,
}

fn resolve() -> Result<GgmlApi, String> {
    let this = libloading::os::unix::Library::this();
    macro_rules! sym {
        ($name:literal) => {{
            // SAFETY: the symbol is looked up by its exact C name and given the C signature from
            // the pinned ggml headers (checked by tests/abi_drift.rs).
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
        op_name: sym!("ggml_op_name"),
    })
}

/// The resolved ggml API, or why it could not be resolved (not inside a ggml host process).
pub(crate) fn get() -> Result<&'static GgmlApi, &'static str> {
    static API: OnceLock<Result<GgmlApi, String>> = OnceLock::new();
    API.get_or_init(resolve).as_ref().map_err(|e| e.as_str())
}
