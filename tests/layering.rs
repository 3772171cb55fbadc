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
//!
//! And inside one folder, its files name each other in one direction only: no loop of `super::x` /
//! `crate::folder::x` between them (`the_files_of_a_folder_name_each_other_in_one_direction`).

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

// Inside one folder: the files of a module (`src/npu/*.rs` beside `src/npu/mod.rs`) name each
// other in one direction only, so that each can be read with only what lies below it. `mod.rs`,
// the folder's own module whose items its files share, is the ground they stand on and is left
// out; so are inline modules (`mod tests { .. }`), whose `super` is their file.

/// `code` (from [`code_only`]) without its inline module blocks (`mod name { .. }`).
fn outside_inline_modules(code: &str) -> String {
    let b = code.as_bytes();
    let ident = |i: usize| b.get(i).is_some_and(|c| c.is_ascii_alphanumeric() || *c == b'_');
    let mut out = String::with_capacity(code.len());
    let mut i = 0;
    while i < b.len() {
        if b[i..].starts_with(b"mod ") && (i == 0 || !ident(i - 1)) {
            let mut j = i + 4;
            while j < b.len() && (ident(j) || b[j].is_ascii_whitespace()) {
                j += 1;
            }
            if b.get(j) == Some(&b'{') {
                let mut depth = 0;
                while j < b.len() {
                    match b[j] {
                        b'{' => depth += 1,
                        b'}' => depth -= 1,
                        _ => {}
                    }
                    j += 1;
                    if depth == 0 {
                        break;
                    }
                }
                i = j;
                continue;
            }
        }
        out.push(b[i] as char);
        i += 1;
    }
    out
}

/// The first name of each path a `use` tree starts with at `rest`: `x` of `x::y`, or each
/// element's first name of a group `{x, y::z, w::{..}}`.
fn heads(rest: &str) -> Vec<String> {
    let word = |s: &str| -> String { s.trim_start().chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect() };
    let Some(group) = rest.trim_start().strip_prefix('{') else { return vec![word(rest)] };
    let (mut names, mut depth, mut start) = (Vec::new(), 0, 0);
    for (i, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => {
                names.push(word(&group[start..i]));
                break;
            }
            '}' => depth -= 1,
            ',' if depth == 0 => {
                names.push(word(&group[start..i]));
                start = i + 1;
            }
            _ => {}
        }
    }
    names
}

/// The files of its folder that a file's own module names: `super::x` (not `super::super::x`)
/// and `crate::<folder>::x`, with `folder` as a path (`npu::kif`) and `siblings` the stems of
/// the folder's other files.
fn sibling_edges(src: &str, folder: &str, siblings: &BTreeSet<String>) -> BTreeSet<String> {
    let code = outside_inline_modules(&code_only(src));
    let mut found = BTreeSet::new();
    for prefix in ["super::".to_string(), format!("crate::{folder}::")] {
        let mut from = 0;
        while let Some(p) = code[from..].find(&prefix) {
            let at = from + p;
            from = at + prefix.len();
            let before = &code[..at];
            let bounded = !before.ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':');
            if bounded {
                found.extend(heads(&code[from..]).into_iter().filter(|n| siblings.contains(n)));
            }
        }
    }
    found
}

/// The groups of files that name each other in a loop, each sorted, from `edges` (file → the
/// files it names).
fn circles(edges: &std::collections::BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    let reach = |from: &String| {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from.clone()];
        while let Some(f) = todo.pop() {
            for t in edges.get(&f).into_iter().flatten() {
                if seen.insert(t.clone()) {
                    todo.push(t.clone());
                }
            }
        }
        seen
    };
    let reached: std::collections::BTreeMap<&String, BTreeSet<String>> = edges.keys().map(|f| (f, reach(f))).collect();
    let mut out: Vec<Vec<String>> = Vec::new();
    for (f, r) in &reached {
        if !r.contains(*f) {
            continue;
        }
        let circle: Vec<String> = r.iter().filter(|g| reached.get(g).is_some_and(|rg| rg.contains(*f))).cloned().collect();
        if !out.contains(&circle) {
            out.push(circle);
        }
    }
    out
}

#[test]
fn the_files_of_a_folder_name_each_other_in_one_direction() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut folders: std::collections::BTreeMap<std::path::PathBuf, Vec<std::path::PathBuf>> = Default::default();
    for f in files {
        let rel = f.strip_prefix(&src).unwrap().to_path_buf();
        if rel.starts_with("bin") || rel.parent().is_none_or(|p| p.as_os_str().is_empty()) || rel.file_name().is_some_and(|n| n == "mod.rs") {
            continue;
        }
        folders.entry(rel.parent().unwrap().to_path_buf()).or_default().push(f);
    }
    let mut bad = Vec::new();
    for (folder, files) in &folders {
        let stem = |f: &std::path::PathBuf| f.file_stem().unwrap().to_string_lossy().to_string();
        let siblings: BTreeSet<String> = files.iter().map(stem).collect();
        let module = folder.components().map(|c| c.as_os_str().to_string_lossy().to_string()).collect::<Vec<_>>().join("::");
        let edges = files
            .iter()
            .map(|f| {
                let named = sibling_edges(&std::fs::read_to_string(f).unwrap(), &module, &siblings);
                (stem(f), named.into_iter().filter(|n| *n != stem(f)).collect())
            })
            .collect();
        for c in circles(&edges) {
            bad.push(format!("src/{}/: {}", folder.display(), c.join(", ")));
        }
    }
    assert!(bad.is_empty(), "files of one folder that name each other in a loop:\n{}", bad.join("\n"));
}

#[test]
fn a_loop_between_the_files_of_a_folder_is_caught() {
    let sib: BTreeSet<String> = ["mm", "stream", "slots", "layout"].iter().map(|s| s.to_string()).collect();
    let e = |src: &str| sibling_edges(src, "npu", &sib).into_iter().collect::<Vec<_>>();
    assert_eq!(e("use super::mm::{Shared, WeightInner};\nuse super::{layout, Npu};"), ["layout", "mm"]);
    assert_eq!(e("let r: Option<Arc<crate::npu::stream::RingInner>> = None;"), ["stream"]);
    assert_eq!(e("use super::{layout::{self, WeightGeometry}, slots::Slot};"), ["layout", "slots"]);
    // A test module's `super` is its file; a grandparent's `super::super::x` and prose do not count.
    assert_eq!(e("mod tests {\n    use super::stream;\n}\nfn f() { super::super::mm::x() }\n// super::mm"), Vec::<String>::new());
    let edges = [("mm", vec!["stream", "slots"]), ("stream", vec!["mm"]), ("slots", vec![]), ("layout", vec!["slots"])]
        .into_iter()
        .map(|(f, t)| (f.to_string(), t.into_iter().map(String::from).collect()))
        .collect();
    assert_eq!(circles(&edges), [vec!["mm".to_string(), "stream".to_string()]]);
}
