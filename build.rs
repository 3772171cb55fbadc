//! Build script: bindgen over the project's own ggml ABI declarations (`ggml-headers/`).
//!
//! `ggml_abi.rs` is everything in the pinned release's layout (`ork_ggml_b11549.h`, which includes
//! the shared `ork_ggml_abi.h`); `ggml_abi_b<N>.rs` is, for each other supported release, only
//! what its layout declares differently (the interface tables and objects that differ, the API
//! version and the marks the plugin recognises the release by), naming the shared types
//! unqualified (the including module imports them). Each declaration is checked against its
//! release's headers by `tests/abi_drift.rs`; this script only turns them into Rust types. No
//! llama.cpp tree is needed to build the crate.
//!
//! With `ORK_LLAMA_SRC=/path/to/llama.cpp` (a user following llama.cpp HEAD) the script also
//! checks that tree against every layout by the drift test's own checks
//! (`build-support/abi_check.rs`, less the exact version), generates the tree's own bindings of
//! the interface tables (bindgen over its `ggml-backend-impl.h`, `$OUT_DIR/ggml_tree.rs`) and
//! proves them equal to the matched layout's; exactly one layout must match, or the build fails
//! in one line naming the closest layout's first differing member. The match is handed to the
//! crate as `ORK_BUILT_AGAINST` ("<layout build> <tree's ggml version> <tree's llama.cpp build,
//! 0 if unknown>"; empty without `ORK_LLAMA_SRC`).
#[path = "build-support/abi_check.rs"]
mod abi_check;

use std::env;
use std::path::{Path, PathBuf};

/// The interface tables the plugin fills or calls through: the tree's bindings of these must be
/// the matched layout's.
const TABLES: [&str; 5] =
    ["ggml_backend_buffer_type_i", "ggml_backend_buffer_i", "ggml_backend_i", "ggml_backend_device_i", "ggml_backend_reg_i"];

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
            .header(header)
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
    let pinned = builder("ggml-headers/ork_ggml_b11549.h")
        .allowlist_type("ggml_.*")
        .allowlist_var("GGML_.*|ORK_.*")
        .allowlist_function("ggml_.*");
    pinned.generate().expect("bindgen over ggml-headers/ork_ggml_b11549.h").write_to_file(out.join("ggml_abi.rs")).expect("write bindings");
    for build in ["10809", "10566"] {
        let header = format!("ork_ggml_b{build}.h");
        builder(&format!("ggml-headers/{header}"))
            .allowlist_type("ggml_backend_buffer_type_i|ggml_backend_buffer_type|ggml_backend_i|ggml_backend")
            .allowlist_var("GGML_BACKEND_API_VERSION|ORK_.*")
            .allowlist_recursively(false)
            .generate()
            .unwrap_or_else(|e| panic!("bindgen over ggml-headers/{header}: {e}"))
            .write_to_file(out.join(format!("ggml_abi_b{build}.rs")))
            .expect("write bindings");
    }
    println!("cargo:rerun-if-env-changed=ORK_LLAMA_SRC");
    let built_against = match env::var_os("ORK_LLAMA_SRC").filter(|s| !s.is_empty()) {
        Some(src) => own_tree(Path::new(&src), &out, builder),
        None => String::new(),
    };
    println!("cargo:rustc-env=ORK_BUILT_AGAINST={built_against}");
}

/// `ORK_LLAMA_SRC`: the one layout the tree at `src` matches, as `ORK_BUILT_AGAINST`'s value; any
/// other outcome fails the build with one line.
fn own_tree(src: &Path, out: &Path, builder: impl Fn(&str) -> bindgen::Builder) -> String {
    let root = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    println!("cargo:rerun-if-changed=tests/abi_probe.c");
    for f in abi_check::TREE_FILES {
        println!("cargo:rerun-if-changed={}", src.join(f).display());
    }
    // The probe runs here, so it is built by the host's compiler (the layouts are LP64 alike).
    let cc = env::var_os("HOST_CC").unwrap_or_else(|| "cc".into());
    let fail = |what: String| -> ! { panic!("ORK_LLAMA_SRC={what}") };
    let layout = abi_check::match_tree(&root, &cc, &out.join("own-tree"), src).unwrap_or_else(|e| fail(e));
    // The tree's own bindings of the interface tables, and the matched layout's.
    let bind = |b: bindgen::Builder| {
        let tables = TABLES.join("|");
        b.allowlist_type(tables).allowlist_recursively(false).generate().map(|g| g.to_string())
    };
    let inc = abi_check::tree_includes(src).map(|i| format!("-I{}", i.display()));
    let impl_h = src.join("ggml/src/ggml-backend-impl.h");
    let theirs = bind(builder(&impl_h.display().to_string()).clang_args(inc))
        .unwrap_or_else(|e| fail(format!("{}: bindgen over ggml/src/ggml-backend-impl.h: {e}", src.display())));
    std::fs::write(out.join("ggml_tree.rs"), &theirs).expect("write the tree's bindings");
    let ours = bind(builder(&format!("ggml-headers/ork_ggml_b{layout}.h"))).expect("bindgen over our layout");
    if let Some(d) = TABLES.iter().find_map(|t| bindings_difference(t, &theirs, &ours)) {
        fail(format!("{}: the tree's bindings differ from layout b{layout}'s although its C checks passed: {d}", src.display()));
    }
    let version = abi_check::ggml_version(src).unwrap_or_else(|e| fail(format!("{}: {e}", src.display())));
    let build = abi_check::llama_build(src);
    let known = if build == 0 { "not a git checkout".to_string() } else { format!("llama.cpp build {build}") };
    println!(
        "cargo:warning=ORK_LLAMA_SRC={}: ggml {version} ({known}) matches layout b{layout}; its bindings of the {} \
         interface tables equal that layout's",
        src.display(),
        TABLES.len()
    );
    format!("{layout} {version} {build}")
}

/// The first difference of struct `name` between two bindgen outputs: its fields in order (name
/// and type, parameter names aside) and its layout tests (size, alignment, every offset).
fn bindings_difference(name: &str, theirs: &str, ours: &str) -> Option<String> {
    let (t, o) = (struct_items(name, theirs), struct_items(name, ours));
    if t.is_empty() || o.is_empty() {
        return Some(format!("struct {name} missing from the bindings"));
    }
    if let Some((a, b)) = t.iter().zip(&o).find(|(a, b)| a != b) {
        return Some(format!("struct {name}: `{a}` in the tree, ours `{b}`"));
    }
    (t.len() != o.len()).then(|| format!("struct {name}: {} items in the tree, ours {}", t.len(), o.len()))
}

/// Struct `name` of a bindgen output as items: each field (`name:type`), then each layout test
/// (`["Offset of field: T::m"][... - 8usize]`), without whitespace and parameter names.
fn struct_items(name: &str, bindings: &str) -> Vec<String> {
    let text: String = bindings.chars().filter(|c| !c.is_whitespace()).collect();
    let block = |head: &str, end: &str| {
        let i = text.find(head)? + head.len();
        Some(&text[i..i + text[i..].find(end)?])
    };
    let mut items = Vec::new();
    if let Some(body) = block(&format!("pubstruct{name}{{"), "}") {
        // fields end at commas outside the parentheses and angle brackets of their types
        let (mut depth, mut field) = (0i32, String::new());
        for c in body.chars() {
            match c {
                '(' | '<' => depth += 1,
                ')' | '>' if !field.ends_with('-') => depth -= 1,
                ',' if depth == 0 => {
                    items.push(without_params(&field));
                    field.clear();
                    continue;
                }
                _ => {}
            }
            field.push(c);
        }
        if !field.is_empty() {
            items.push(without_params(&field));
        }
    }
    if let Some(tests) = block(&format!("const_:()={{[\"Sizeof{name}\"]"), "};") {
        items.extend(tests.split(';').filter(|t| !t.is_empty()).map(|t| t.to_string()));
    }
    items
}

/// A field `pubname:type` with the parameter names of its function types (and trailing commas)
/// dropped.
fn without_params(field: &str) -> String {
    let field = field.strip_prefix("pub").unwrap_or(field);
    let (name, ty) = field.split_once(':').unwrap_or(("", field));
    let mut out = format!("{name}:");
    let mut rest = ty;
    while let Some(i) = rest.find(['(', ',']) {
        out += &rest[..=i];
        rest = &rest[i + 1..];
        let ident = rest.find(|c: char| !(c.is_alphanumeric() || c == '_')).unwrap_or(rest.len());
        // `name:` before a type, also one that starts with `::` (`n:::std::os::raw::c_int`)
        let after = &rest[ident..];
        if ident > 0 && after.starts_with(':') && (!after.starts_with("::") || after.starts_with(":::")) {
            rest = &rest[ident + 1..];
        }
    }
    // rustfmt's trailing commas depend on the line's length, so on the parameter names
    (out + rest).replace(",)", ")").replace(",>", ">")
}
