//! Build script: bindgen over the project's own ggml ABI declarations (`ggml-headers/`).
//!
//! `ggml_abi.rs` is everything in the pinned release's layout (`ork_ggml_b11549.h`, which includes
//! the shared `ork_ggml_abi.h`); `ggml_abi_b<N>.rs` is, for each other supported release, only
//! what its layout declares differently (the interface tables and objects that differ, the API
//! version and the marks the plugin recognises the release by), naming the shared types
//! unqualified (the including module imports them). Each declaration is checked against its
//! release's headers by `tests/abi_drift.rs`; this script only turns them into Rust types. No
//! llama.cpp tree is needed to build the crate.
use std::env;
use std::path::PathBuf;

fn main() {
    // AVX-512 intrinsics are stable from Rust 1.89 (MSRV is 1.85): `cfg(ork_avx512)` gates the
    // AVX-512 quantizer kernels in src/quant/simd.rs.
    autocfg::emit_possibility("ork_avx512");
    if autocfg::new().probe_rustc_version(1, 89) {
        autocfg::emit("ork_avx512");
    }
    // Never unloaded (RTLD_NODELETE): ggml's loader dlcloses a plugin whose ggml_backend_init
    // returned NULL (a ggml it does not know), and some tools then load all backends again; kept
    // mapped, the plugin's statics persist, so the second load finds the same (empty) answer
    // without a second "unsupported ggml" line.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,nodelete");
    println!("cargo:rerun-if-changed=ggml-headers");
    println!("cargo:rerun-if-changed=build.rs");
    let target = env::var("TARGET").unwrap();
    let host = env::var("HOST").unwrap();
    let out = PathBuf::from(env::var("OUT_DIR").unwrap());
    let builder = |header: &str| {
        let mut b = bindgen::Builder::default()
            .header(format!("ggml-headers/{header}"))
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
        b
    };
    let pinned = builder("ork_ggml_b11549.h")
        .allowlist_type("ggml_.*")
        .allowlist_var("GGML_.*|ORK_.*")
        .allowlist_function("ggml_.*");
    pinned.generate().expect("bindgen over ggml-headers/ork_ggml_b11549.h").write_to_file(out.join("ggml_abi.rs")).expect("write bindings");
    for build in ["10809", "10566"] {
        let header = format!("ork_ggml_b{build}.h");
        builder(&header)
            .allowlist_type("ggml_backend_buffer_type_i|ggml_backend_buffer_type|ggml_backend_i|ggml_backend")
            .allowlist_var("GGML_BACKEND_API_VERSION|ORK_.*")
            .allowlist_recursively(false)
            .generate()
            .unwrap_or_else(|e| panic!("bindgen over ggml-headers/{header}: {e}"))
            .write_to_file(out.join(format!("ggml_abi_b{build}.rs")))
            .expect("write bindings");
    }
}
