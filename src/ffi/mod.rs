//! The C ABI skin: every `extern "C"` entry point the ggml loader and scheduler call.
//!
//! Each callback converts raw pointers into plain values and slices, calls a safe method in
//! `crate::backend`, and maps the outcome to ggml's return convention. A panic never crosses the
//! ABI: every callback runs inside [`guard`], which logs it and returns the callback's failure
//! value (NULL, false, 0 or `GGML_STATUS_FAILED`).
//!
//! The ggml functions the plugin calls (`ggml_backend_buffer_init`, `ggml_get_type_traits`, …)
//! are resolved at run time from the host process (`dlsym` in the global scope, where the tool's
//! own `libggml-base.so.0` already is), so the crate links without llama.cpp and its tests run
//! without it. Types come from `ggml-headers/ork_ggml_abi.h` through bindgen.
#![allow(non_camel_case_types, non_upper_case_globals, non_snake_case, dead_code, clippy::all)]
#![allow(unsafe_code)]

pub mod abi {
    include!(concat!(env!("OUT_DIR"), "/ggml_abi.rs"));
}

mod api;
mod entry;

use std::panic::{catch_unwind, AssertUnwindSafe};

/// Runs `f`, turning a panic into `fail` plus one error line naming the callback.
pub(crate) fn guard<R>(name: &str, fail: R, f: impl FnOnce() -> R) -> R {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(p) => {
            let msg = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            log::error!("{name}: internal error ({msg}); returning failure to ggml");
            fail
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guard_catches_panics() {
        let prev = std::panic::take_hook();
        std::panic::set_hook(Box::new(|_| {}));
        let r = guard("test", -1, || -> i32 { panic!("boom") });
        std::panic::set_hook(prev);
        assert_eq!(r, -1);
        assert_eq!(guard("test", -1, || 7), 7);
    }

    #[test]
    fn abi_sizes_match_the_facts() {
        use abi::*;
        use std::mem::{offset_of, size_of};
        assert_eq!(size_of::<ggml_tensor>(), 336);
        assert_eq!(offset_of!(ggml_tensor, data), 248);
        assert_eq!(size_of::<ggml_backend_buffer_type_i>(), 64);
        assert_eq!(size_of::<ggml_backend_buffer_i>(), 88);
        assert_eq!(size_of::<ggml_backend_i>(), 128);
        assert_eq!(size_of::<ggml_backend_device_i>(), 120);
        assert_eq!(size_of::<ggml_backend_reg_i>(), 32);
        assert_eq!(size_of::<ggml_backend_buffer>(), 120);
        assert_eq!(size_of::<ggml_backend>(), 152);
        assert_eq!(size_of::<ggml_backend_dev_props>(), 56);
        assert_eq!(size_of::<ggml_type_traits>(), 56);
        assert_eq!(GGML_BACKEND_API_VERSION, 3);
        assert_eq!(GGML_OP_MUL_MAT, 29);
        assert_eq!(GGML_OP_COUNT, 101);
        assert_eq!(GGML_TYPE_COUNT, 43);
    }

    #[test]
    fn weight_type_table_matches_ggml_enum() {
        use crate::quant::types::*;
        let pairs: &[(u32, abi::ggml_type)] = &[
            (F32, abi::GGML_TYPE_F32),
            (F16, abi::GGML_TYPE_F16),
            (Q4_0, abi::GGML_TYPE_Q4_0),
            (Q4_1, abi::GGML_TYPE_Q4_1),
            (Q5_0, abi::GGML_TYPE_Q5_0),
            (Q5_1, abi::GGML_TYPE_Q5_1),
            (Q8_0, abi::GGML_TYPE_Q8_0),
            (Q2_K, abi::GGML_TYPE_Q2_K),
            (Q3_K, abi::GGML_TYPE_Q3_K),
            (Q4_K, abi::GGML_TYPE_Q4_K),
            (Q5_K, abi::GGML_TYPE_Q5_K),
            (Q6_K, abi::GGML_TYPE_Q6_K),
            (IQ4_NL, abi::GGML_TYPE_IQ4_NL),
            (BF16, abi::GGML_TYPE_BF16),
        ];
        assert_eq!(pairs.len(), WEIGHT_TYPES.len());
        for &(ours, theirs) in pairs {
            assert_eq!(ours, theirs as u32);
            assert!(weight_type(ours).is_some());
        }
    }
}
