//! The crate's layering, checked: each top-level module of `src/` may name (`crate::X`) only
//! modules of a lower layer. Bottom to top:
//!
//! | layer | modules | role |
//! |---|---|---|
//! | 0 | `logging` | the `log` facade's sink |
//! | 1 | `config`, `os` | every `ORK_*` variable parsed once; OS file and shared mappings, host CPU topology |
//! | 2 | `quant` | int8 quantizers and the ggml weight-type table |
//! | 3 | `npu`, `vk` | the two engines' mechanism: NPU core and kernel interfaces; Mali via Vulkan |
//! | 4 | `pack` | GGUF bytes → int8 terms, scales, NPU tiles |
//! | 5 | `cache` | `.orkpack` on disk |
//! | 6 | `route` | policy: engine per MUL_MAT, cost model, NPU arbitration |
//! | 7 | `backend` | the safe ggml device: buffers, weight store, graph compute |
//! | 8 | `ffi` | the C ABI skin |
//!
//! Modules of one layer do not name each other. `bin/` tools use the library from outside.

use std::collections::BTreeSet;
use std::path::Path;

const LAYERS: &[&[&str]] = &[
    &["logging"],
    &["config", "os"],
    &["quant"],
    &["npu", "vk"],
    &["pack"],
    &["cache"],
    &["route"],
    &["backend"],
    &["ffi"],
];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&module))
}

/// The text of a Rust file without comments (line, doc and block comments) and string literals,
/// so that prose naming `crate::x` does not count as a dependency.
fn code_only(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    while i < b.len() {
        if b[i..].starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i..].starts_with(b"/*") {
            let mut depth = 0;
            while i < b.len() {
                if b[i..].starts_with(b"/*") {
                    depth += 1;
                    i += 2;
                } else if b[i..].starts_with(b"*/") {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if b[i] == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
        } else {
            out.push(b[i] as char);
            i += 1;
        }
    }
    out
}

/// The top-level modules a file's code names as `crate::X`.
fn named_modules(src: &str) -> BTreeSet<String> {
    let code = code_only(src);
    let mut found = BTreeSet::new();
    let mut rest = code.as_str();
    while let Some(p) = rest.find("crate::") {
        let before_ok = p == 0 || !rest.as_bytes()[p - 1].is_ascii_alphanumeric() && rest.as_bytes()[p - 1] != b'_';
        let after = &rest[p + "crate::".len()..];
        let name: String = after.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
        if before_ok && !name.is_empty() {
            found.insert(name);
        }
        rest = after;
    }
    found
}

/// Every edge against the layering in one file of top-level module `me`: `(me, named)`.
fn violations_in(me: &str, src: &str) -> Vec<(String, String)> {
    let Some(mine) = layer_of(me) else {
        return vec![(me.to_string(), "(module missing from LAYERS)".to_string())];
    };
    named_modules(src)
        .into_iter()
        .filter(|t| t != me)
        .filter(|t| layer_of(t).is_none_or(|l| l >= mine))
        .map(|t| (me.to_string(), t))
        .collect()
}

fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn every_module_names_only_lower_layers() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut bad = Vec::new();
    let mut seen = BTreeSet::new();
    for f in &files {
        let rel = f.strip_prefix(&src).unwrap();
        let top = rel.components().next().unwrap().as_os_str().to_string_lossy().trim_end_matches(".rs").to_string();
        if matches!(top.as_str(), "lib" | "bin") {
            continue;
        }
        seen.insert(top.clone());
        for (a, b) in violations_in(&top, &std::fs::read_to_string(f).unwrap()) {
            bad.push(format!("{}: {a} -> {b}", rel.display()));
        }
    }
    assert!(bad.is_empty(), "edges against the layering (bottom to top {LAYERS:?}):\n{}", bad.join("\n"));
    let listed: BTreeSet<String> = LAYERS.iter().flat_map(|l| l.iter().map(|s| s.to_string())).collect();
    assert_eq!(seen, listed, "LAYERS lists exactly the top-level modules of src/");
}

#[test]
fn an_upward_or_sideways_import_is_caught() {
    assert_eq!(violations_in("npu", "use crate::backend::Device;"), vec![("npu".into(), "backend".into())]);
    assert_eq!(violations_in("npu", "fn f() { crate::vk::x() }"), vec![("npu".into(), "vk".into())]);
    assert_eq!(violations_in("cache", "let d = crate::config::DEFAULT_CACHE_MAX_MB;"), vec![]);
    // prose and strings do not count
    assert_eq!(violations_in("npu", "/// see crate::backend\n// crate::ffi\nlet s = \"crate::route\";"), vec![]);
    assert_eq!(violations_in("quant", "use crate::quant::simd; use crate::logging;"), vec![]);
}
