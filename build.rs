//! Build script: bindgen over the project's own ggml ABI declaration (`ggml-headers/`).
//!
//! The declaration is checked against the pinned upstream headers by `tests/abi_drift.rs`;
//! this script only turns it into Rust types. No llama.cpp tree is needed to build the crate.
use std::env;
use std::path::PathBuf;

fn main() {
    // AVX-512 intrinsics are stable from Rust 1.89 (MSRV is 1.85): `cfg(ork_avx512)` gates the
    // AVX-512 quantizer kernels in src/quant/simd.rs.
    autocfg::emit_possibility("ork_avx512");
    if autocfg::new().probe_rustc_version(1, 89) {
        autocfg::emit("ork_avx512");
    }
    let header = "ggml-headers/ork_ggml_abi.h";
    println!("cargo:rerun-if-changed={header}");
    println!("cargo:rerun-if-changed=build.rs");
    let target = env::var("TARGET").unwrap();
    let host = env::var("HOST").unwrap();
    let mut b = bindgen::Builder::default()
        .header(header)
        .allowlist_type("ggml_.*")
        .allowlist_var("GGML_.*")
        .allowlist_function("ggml_.*")
        .default_enum_style(bindgen::EnumVariation::Consts)
        .prepend_enum_name(false)
        .derive_default(true)
        .layout_tests(true)
        .generate_comments(false);
    if target != host {
        b = b.clang_arg(format!("--target={target}"));
        if target.starts_with("aarch64") {
            b = b.clang_arg("--sysroot=/usr/aarch64-linux-gnu");
        }
    }
    let bindings = b.generate().expect("bindgen over ggml-headers/ork_ggml_abi.h");
    let out = PathBuf::from(env::var("OUT_DIR").unwrap()).join("ggml_abi.rs");
    bindings.write_to_file(out).expect("write bindings");
}
