//! The ggml ABI check of a llama.cpp tree against one of our layout declarations
//! (`ggml-headers/ork_ggml_b<N>.h` over the shared `ork_ggml_abi.h`). One copy, used by
//! `tests/abi_drift.rs` (each supported release's own tree, exactly) and by `build.rs`
//! (`ORK_LLAMA_SRC`: a user's tree, which must match one layout):
//!
//! 1. `tests/abi_probe.c` is compiled against ours and against the tree's headers (both with
//!    `ORK_BUILD=<N>`) and run; sizes, field offsets and enum values must agree line for line.
//! 2. A generated C file puts the tree's headers and ours side by side (`ORK_ABI_CHECK`, our
//!    interface tables renamed by `ORK_TAG`): every member of every interface table must have the
//!    same type as the tree's, and every function we declare must exist in the tree with the same
//!    prototype, or it does not compile.
//! 3. How the plugin recognises the release at load (`src/ffi/release.rs`): `ORK_HAS_*` against
//!    whether the tree declares `ggml_backend_buft_alloc_buffer_n` / `ggml_op_alloc_size_may_expand`,
//!    and the op and type names (`ORK_OP_NAMES`, `ORK_TYPE_NAMES`) against the tree's `ggml.c` and
//!    `ggml.h`. Only for a release's own tree (`exact`): `ORK_GGML_VERSION` against
//!    `ggml/CMakeLists.txt` and `ORK_LLAMA_BUILD` against the layout's number.
//!
//! Each difference is one line naming what differs, the tree's first; a layout matches a tree
//! when there are none.
// Each includer uses part of it (the build script the tree's identity, the test the exact checks).
#![allow(dead_code)]

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The layouts declared in `root/ggml-headers/`: their llama.cpp build numbers, newest first.
pub fn layouts(root: &Path) -> Vec<u32> {
    let mut v: Vec<u32> = std::fs::read_dir(root.join("ggml-headers"))
        .expect("read ggml-headers/")
        .filter_map(|e| {
            let n = e.ok()?.file_name().into_string().ok()?;
            n.strip_prefix("ork_ggml_b")?.strip_suffix(".h")?.parse().ok()
        })
        .collect();
    v.sort_unstable_by(|a, b| b.cmp(a));
    v
}

/// The files of a llama.cpp tree the check reads (a build script reruns when one changes).
pub const TREE_FILES: [&str; 5] = [
    "ggml/include/ggml.h",
    "ggml/include/ggml-backend.h",
    "ggml/src/ggml-backend-impl.h",
    "ggml/src/ggml.c",
    "ggml/CMakeLists.txt",
];

/// The include directories of a llama.cpp tree's ggml headers.
pub fn tree_includes(src: &Path) -> [PathBuf; 2] {
    [src.join("ggml/include"), src.join("ggml/src")]
}

/// The tree's ggml version, `MAJOR.MINOR.PATCH` from `ggml/CMakeLists.txt`.
pub fn ggml_version(src: &Path) -> Result<String, String> {
    let cm = std::fs::read_to_string(src.join("ggml/CMakeLists.txt")).map_err(|e| format!("ggml/CMakeLists.txt: {e}"))?;
    let part = |k: &str| define_cmake(&cm, k).ok_or_else(|| format!("set({k} ...) missing in ggml/CMakeLists.txt"));
    Ok(format!("{}.{}.{}", part("GGML_VERSION_MAJOR")?, part("GGML_VERSION_MINOR")?, part("GGML_VERSION_PATCH")?))
}

/// The tree's llama.cpp build number as its own build counts it (`cmake/build-info.cmake`: the
/// commits of a git checkout), or 0 where it is not a git checkout (a PyPI sdist's tree).
pub fn llama_build(src: &Path) -> u32 {
    if !src.join(".git").exists() {
        return 0; // not its own checkout (git would count the commits of a repository around it)
    }
    Command::new("git")
        .arg("-C")
        .arg(src)
        .args(["rev-list", "--count", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok()?.trim().parse().ok())
        .unwrap_or(0)
}

/// The one layout of `root/ggml-headers/` the tree at `src` matches, or one line: the tree, and
/// the closest layout's (fewest differences) first difference. `work` holds the compiler's files.
pub fn match_tree(root: &Path, cc: &OsStr, work: &Path, src: &Path) -> Result<u32, String> {
    if !src.join("ggml/include/ggml.h").exists() {
        return Err(format!("{}: not a llama.cpp tree (no ggml/include/ggml.h)", src.display()));
    }
    let found: Vec<(u32, Vec<String>)> =
        layouts(root).into_iter().map(|b| (b, differences(root, cc, &work.join(format!("b{b}")), b, src, false))).collect();
    let matched: Vec<u32> = found.iter().filter(|(_, d)| d.is_empty()).map(|(b, _)| *b).collect();
    match matched[..] {
        [one] => Ok(one),
        [] => {
            let (b, d) = found.iter().min_by_key(|(_, d)| d.len()).expect("at least one layout");
            let more = match d.len() - 1 {
                0 => String::new(),
                1 => " (then 1 more difference)".into(),
                n => format!(" (then {n} more differences)"),
            };
            Err(format!(
                "{}: the tree's ggml ABI matches no layout this ggml-ork knows; closest b{b}: {}{more}",
                src.display(),
                d[0]
            ))
        }
        _ => Err(format!("{}: the tree's ggml ABI matches several layouts ({matched:?}); their headers overlap", src.display())),
    }
}

/// Every difference of the tree at `src` from layout `build`, the probe's first. `exact`: the
/// tree is release b`build` itself, so its ggml version and build number are checked too.
pub fn differences(root: &Path, cc: &OsStr, work: &Path, build: u32, src: &Path, exact: bool) -> Vec<String> {
    let hdrs = root.join("ggml-headers");
    let layout_h = format!("ork_ggml_b{build}.h");
    let shared = std::fs::read_to_string(hdrs.join("ork_ggml_abi.h")).expect("read ork_ggml_abi.h");
    let layout = std::fs::read_to_string(hdrs.join(&layout_h)).unwrap_or_else(|e| panic!("read {layout_h}: {e}"));
    let up_inc = tree_includes(src);
    std::fs::create_dir_all(work).expect("create the check's work directory");
    let mut diffs = Vec::new();

    // 1. sizes, offsets, values
    let b = format!("ORK_BUILD={build}");
    let probe_root = root.join("tests/abi_probe.c");
    let ours = probe(cc, &probe_root, &work.join("ours"), &[b.clone(), format!("ORK_LAYOUT_H=\"{layout_h}\"")], std::slice::from_ref(&hdrs))
        .unwrap_or_else(|e| panic!("abi_probe.c against our {layout_h}: {}", e.join("; ")));
    assert!(ours.lines().count() > 150, "the probe checks too little");
    match probe(cc, &probe_root, &work.join("theirs"), &[b, "UPSTREAM".into()], &up_inc) {
        Ok(theirs) => {
            for (a, t) in ours.lines().zip(theirs.lines()) {
                if a != t {
                    diffs.push(probe_difference(t, a));
                }
            }
            assert_eq!(ours.lines().count(), theirs.lines().count(), "the probe printed other lines against the tree");
        }
        Err(errors) => diffs.extend(errors.into_iter().map(|e| format!("abi_probe.c (ORK_BUILD={build}) against the tree: {e}"))),
    }

    // 2. member types of every interface table, and every function's prototype
    let tables: Vec<_> = vtables(&shared).into_iter().chain(vtables(&layout)).collect();
    let fns = functions(&shared);
    assert!(tables.len() == 5 && fns.len() > 15, "parsed {} tables, {} functions", tables.len(), fns.len());
    let mut c = String::from(
        "#include \"ggml.h\"\n#include \"ggml-backend.h\"\n#include \"ggml-backend-impl.h\"\n#include \"ggml-impl.h\"\n",
    );
    // Every function exists in the tree (taking the address of an undeclared name does not compile)...
    c += "void * const ork_fns[] = {\n";
    for f in &fns {
        c += &format!("    (void *) {f},\n");
    }
    c += "};\n#define ORK_ABI_CHECK 1\n#define ORK_TAG(tag) ork_##tag\n";
    // ...with our prototype (a conflicting redeclaration does not compile).
    c += &format!("#include \"{layout_h}\"\n");
    c += "#define SAME(S, M) _Static_assert(__builtin_types_compatible_p(__typeof__(((struct S *)0)->M), \
          __typeof__(((struct ork_##S *)0)->M)), \"struct \" #S \" member \" #M \" has another type in the tree\")\n";
    let mut n = 0;
    for (t, members) in &tables {
        for m in members {
            c += &format!("SAME({t}, {m});\n");
            n += 1;
        }
        c += &format!("_Static_assert(sizeof(struct {t}) == sizeof(struct ork_{t}), \"struct {t} has another size in the tree\");\n");
    }
    assert!(n > 50, "only {n} interface members compared");
    let cfile = work.join("check.c");
    std::fs::write(&cfile, c).expect("write check.c");
    let o = Command::new(cc)
        .env("LC_ALL", "C") // plain quotes in the messages
        .args(["-std=c11", "-c", "-Werror", "-o"])
        .arg(work.join("check.o"))
        .arg(&cfile)
        .args(up_inc.iter().flat_map(|i| ["-I".as_ref(), i.as_os_str()]))
        .arg("-I")
        .arg(&hdrs)
        .output()
        .expect("run the C compiler");
    if !o.status.success() {
        diffs.extend(compile_errors(&o.stderr));
    }

    // 3. what the plugin recognises the release by
    let declares = |file: &str, f: &str| {
        let t = std::fs::read_to_string(src.join(file)).unwrap_or_default();
        t.match_indices(f).any(|(i, _)| t[i + f.len()..].trim_start().starts_with('('))
    };
    for (file, f, mark) in [
        ("ggml/include/ggml-backend.h", "ggml_backend_buft_alloc_buffer_n", "ORK_HAS_BUFT_ALLOC_BUFFER_N"),
        ("ggml/src/ggml-backend-impl.h", "ggml_op_alloc_size_may_expand", "ORK_HAS_OP_ALLOC_SIZE_MAY_EXPAND"),
    ] {
        let has = declares(file, f);
        if define(&layout, mark) != if has { "1" } else { "0" } {
            let (tree, ours) = if has { ("declares", "does not") } else { ("does not declare", "does") };
            diffs.push(format!("the tree {tree} {f} ({file}), ours {ours} ({mark} {})", define(&layout, mark)));
        }
    }
    // ...and every name of its op and type enums, in id order, with their counts.
    match enums(src) {
        Ok((ops, types)) => {
            let listed = |name: &str| define(&shared, name).trim_matches('"').split('|').map(String::from).collect::<Vec<_>>();
            diffs.extend(list_difference("op", "GGML_OP_NAME in ggml.c", &ops, &listed("ORK_OP_NAMES")));
            diffs.extend(list_difference("type", "type_traits' type_name in ggml.c", &types, &listed("ORK_TYPE_NAMES")));
            for (count, n) in [("ORK_OP_COUNT", ops.len()), ("ORK_TYPE_COUNT", types.len())] {
                if define(&shared, count) != n.to_string() {
                    diffs.push(format!("the tree has {n} ({count}), ours {}", define(&shared, count)));
                }
            }
        }
        Err(e) => diffs.push(format!("the op and type names of the tree could not be read: {e}")),
    }
    if exact {
        match ggml_version(src) {
            Ok(v) if format!("\"{v}\"") == define(&layout, "ORK_GGML_VERSION") => {}
            Ok(v) => diffs.push(format!("ggml version {v}, ours {} (ORK_GGML_VERSION)", define(&layout, "ORK_GGML_VERSION"))),
            Err(e) => diffs.push(e),
        }
        if define(&layout, "ORK_LLAMA_BUILD") != build.to_string() {
            diffs.push(format!("{layout_h} says ORK_LLAMA_BUILD {}", define(&layout, "ORK_LLAMA_BUILD")));
        }
    }
    let _ = std::fs::remove_dir_all(work);
    diffs
}

/// Compiles and runs `tests/abi_probe.c`: its output, or the compiler's errors.
fn probe(cc: &OsStr, source: &Path, out: &Path, defs: &[String], includes: &[PathBuf]) -> Result<String, Vec<String>> {
    let mut c = Command::new(cc);
    c.env("LC_ALL", "C").arg("-std=c11").arg("-o").arg(out).arg(source);
    for d in defs {
        c.arg(format!("-D{d}"));
    }
    for i in includes {
        c.arg("-I").arg(i);
    }
    let o = c.output().expect("run the C compiler");
    if !o.status.success() {
        return Err(compile_errors(&o.stderr));
    }
    let o = Command::new(out).output().expect("run abi_probe");
    assert!(o.status.success(), "abi_probe failed");
    Ok(String::from_utf8(o.stdout).expect("abi_probe prints text"))
}

/// One line per error of a failed compile: the message, a static assertion's by its text.
fn compile_errors(stderr: &[u8]) -> Vec<String> {
    let text = String::from_utf8_lossy(stderr);
    let mut v: Vec<String> = text
        .lines()
        .filter_map(|l| {
            let e = l.split_once("error: ")?.1;
            Some(e.strip_prefix("static assertion failed: ").map_or(e, |s| s.trim_matches('"')).to_string())
        })
        .collect();
    if v.is_empty() {
        v.push(format!("the compiler failed: {}", text.lines().next().unwrap_or("")));
    }
    v
}

/// A line of the probe, the tree's and ours (`offsetof struct T.M 8`, `sizeof struct T 64`,
/// `value NAME 3`), as one sentence.
fn probe_difference(tree: &str, ours: &str) -> String {
    let split = |l: &str| {
        let (what, v) = l.rsplit_once(' ').unwrap_or((l, ""));
        let (kind, name) = what.split_once(' ').unwrap_or(("", what));
        (kind.to_string(), name.to_string(), v.to_string())
    };
    let ((kind, name, theirs), (_, _, ours)) = (split(tree), split(ours));
    match kind.as_str() {
        "offsetof" => {
            let (t, m) = name.rsplit_once('.').unwrap_or((&name, ""));
            format!("{t} member {m} at offset {theirs}, ours {ours}")
        }
        "sizeof" => format!("sizeof({name}) is {theirs}, ours {ours}"),
        _ => format!("{name} is {theirs}, ours {ours}"),
    }
}

/// The first difference of the tree's `what` names from ours, if any.
fn list_difference(what: &str, source: &str, tree: &[String], ours: &[String]) -> Option<String> {
    if let Some(i) = (0..tree.len().min(ours.len())).find(|&i| tree[i] != ours[i]) {
        return Some(format!("{what} id {i} is \"{}\" in the tree ({source}), ours \"{}\"", tree[i], ours[i]));
    }
    (tree.len() != ours.len()).then(|| format!("the tree has {} {what}s ({source}), ours {}", tree.len(), ours.len()))
}

/// `#define NAME value` in `text`.
pub fn define<'a>(text: &'a str, name: &str) -> &'a str {
    text.lines()
        .find_map(|l| l.strip_prefix("#define ")?.strip_prefix(name)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("#define {name} missing"))
        .trim()
}

/// `set(NAME value)` in a CMakeLists.txt.
fn define_cmake<'a>(text: &'a str, name: &str) -> Option<&'a str> {
    text.lines().find_map(|l| l.trim().strip_prefix("set(")?.strip_prefix(name)?.strip_suffix(')')).map(str::trim)
}

/// The members that are function pointers of each `struct ORK_TAG(name) { ... };` in `text`.
fn vtables(text: &str) -> Vec<(String, Vec<String>)> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("struct ORK_TAG(") {
        let after = &rest[i + "struct ORK_TAG(".len()..];
        let close = after.find(')').unwrap();
        let name = after[..close].to_string();
        rest = &after[close..];
        if !rest.starts_with(") {") {
            continue; // a member of that type, not the table's definition
        }
        let body = &rest[..rest.find("};").unwrap()];
        let members = body
            .lines()
            .filter_map(|l| {
                let s = l.find("(*")? + 2;
                Some(l[s..s + l[s..].find(')')?].to_string())
            })
            .collect();
        out.push((name, members));
    }
    out
}

/// The names of the functions the shared header declares (its last section).
fn functions(text: &str) -> Vec<String> {
    let sec = &text[text.find("/* ---- functions exported").expect("functions section")..];
    let sec = &sec[..sec.find("#ifdef __cplusplus").unwrap()];
    sec.lines()
        .filter(|l| l.trim_end().ends_with(");") && !l.starts_with(' '))
        .map(|l| {
            let head = &l[..l.find('(').unwrap()];
            head.rsplit([' ', '*']).next().unwrap().to_string()
        })
        .collect()
}

/// `text` without `// ...` comments.
fn uncomment(text: &str) -> String {
    text.lines().map(|l| l.split("//").next().unwrap()).collect::<Vec<_>>().join("\n")
}

/// The string literals of `text`, in order.
fn literals(text: &str) -> Vec<String> {
    text.split('"').skip(1).step_by(2).map(String::from).collect()
}

/// A release's op names (`GGML_OP_NAME`, one per id below `GGML_OP_COUNT`) and type names (the
/// `type_name` of `type_traits[id]` for every id below `GGML_TYPE_COUNT`, ids from `ggml.h`'s
/// `enum ggml_type`), read from its `ggml.c` and `ggml.h`.
pub fn enums(src: &Path) -> Result<(Vec<String>, Vec<String>), String> {
    let read = |f: &str| std::fs::read_to_string(src.join(f)).map_err(|e| format!("{f}: {e}"));
    let c = read("ggml/src/ggml.c")?;
    let h = uncomment(&read("ggml/include/ggml.h")?);
    let block = |text: &str, head: &str| {
        let i = text.find(head).ok_or_else(|| format!("{head} missing"))? + head.len();
        let end = text[i..].find("};").ok_or_else(|| format!("{head} has no end"))?;
        Ok::<_, String>(text[i..i + end].to_string())
    };
    let ops = literals(&uncomment(&block(&c, "GGML_OP_NAME[GGML_OP_COUNT] = {")?));
    let mut ids = std::collections::HashMap::new();
    for part in block(&h, "enum ggml_type {")?.split(',') {
        if let Some((name, v)) = part.split_once('=') {
            ids.insert(name.trim().to_string(), v.trim().parse::<usize>().map_err(|e| format!("enum ggml_type {name}: {e}"))?);
        }
    }
    let count = *ids.get("GGML_TYPE_COUNT").ok_or("GGML_TYPE_COUNT has no value")?;
    let mut types = vec![String::new(); count];
    let traits = block(&c, "type_traits[GGML_TYPE_COUNT] = {")?;
    for entry in traits.split("\n    [").skip(1) {
        let idx = &entry[..entry.find(']').ok_or("type_traits: an entry without ]")?];
        let id = idx.parse::<usize>().ok().or_else(|| ids.get(idx).copied()).ok_or_else(|| format!("type_traits: unknown id {idx}"))?;
        let name = entry.split(".type_name").nth(1).map(literals).and_then(|l| l.into_iter().next());
        *types.get_mut(id).ok_or_else(|| format!("type_traits: id {idx} beyond GGML_TYPE_COUNT"))? =
            name.ok_or_else(|| format!("type_traits[{idx}] has no type_name"))?;
    }
    if types.iter().any(String::is_empty) {
        return Err(format!("a type id without type_traits: {types:?}"));
    }
    Ok((ops, types))
}
