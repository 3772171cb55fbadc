//! ABI drift check: each of our layout declarations (`ggml-headers/ork_ggml_b<N>.h`, which include
//! the shared `ork_ggml_abi.h`) against the headers of llama.cpp release b<N> itself:
//!
//! 1. `tests/abi_probe.c` is compiled against ours and against upstream's and run; sizes, field
//!    offsets and enum values must agree line for line.
//! 2. A generated C file puts upstream's headers and ours side by side (`ORK_ABI_CHECK`, our
//!    interface tables renamed by `ORK_TAG`): every member of every interface table must have the
//!    same type as upstream's, and every function we declare must exist upstream with the same
//!    prototype, or it does not compile.
//! 3. How the plugin recognises the release at load (`src/ffi/host.rs`) is checked against the
//!    tree: `ORK_GGML_VERSION` against `ggml/CMakeLists.txt`, and `ORK_HAS_*` against whether the
//!    release declares `ggml_backend_buft_alloc_buffer_n` / `ggml_op_alloc_size_may_expand`.
//!
//! Needs each release's llama.cpp source: the pinned one at `LLAMA_SRC`, the others at
//! `$ORK_RELEASES/b<N>/llama.cpp` (both set by the test scripts after `tests/setup-env.sh`).
//! Without them the test fails, unless `ORK_ABI_OPTIONAL=1` says this run has no llama.cpp tree.

use std::path::{Path, PathBuf};
use std::process::Command;

const PINNED: u32 = 11549;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn cc() -> Command {
    Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
}

fn probe(out: &Path, defs: &[String], includes: &[PathBuf]) -> String {
    let mut cc = cc();
    cc.arg("-std=c11").arg("-o").arg(out).arg(root().join("tests/abi_probe.c"));
    for d in defs {
        cc.arg(format!("-D{d}"));
    }
    for i in includes {
        cc.arg("-I").arg(i);
    }
    let st = cc.status().expect("run the C compiler");
    assert!(st.success(), "compiling abi_probe.c with {defs:?} failed");
    let o = Command::new(out).output().expect("run abi_probe");
    assert!(o.status.success());
    String::from_utf8(o.stdout).unwrap()
}

/// The layouts declared in ggml-headers/: their llama.cpp build numbers.
fn layouts() -> Vec<u32> {
    let mut v: Vec<u32> = std::fs::read_dir(root().join("ggml-headers"))
        .unwrap()
        .filter_map(|e| {
            let n = e.ok()?.file_name().into_string().ok()?;
            n.strip_prefix("ork_ggml_b")?.strip_suffix(".h")?.parse().ok()
        })
        .collect();
    v.sort_unstable_by(|a, b| b.cmp(a));
    v
}

/// The llama.cpp tree of release `build`, or None when this run has none (ORK_ABI_OPTIONAL=1).
fn tree(build: u32) -> Option<PathBuf> {
    let p = if build == PINNED {
        std::env::var_os("LLAMA_SRC").map(PathBuf::from)
    } else {
        std::env::var_os("ORK_RELEASES").map(|r| PathBuf::from(r).join(format!("b{build}/llama.cpp")))
    };
    match p {
        Some(p) if p.join("ggml/include/ggml.h").exists() => Some(p),
        _ if std::env::var("ORK_ABI_OPTIONAL").as_deref() == Ok("1") => {
            eprintln!("no llama.cpp b{build} tree and ORK_ABI_OPTIONAL=1: drift check of b{build} not run");
            None
        }
        other => panic!(
            "no llama.cpp b{build} tree ({other:?}; LLAMA_SRC / ORK_RELEASES unset or not set up): run tests \
             through tests/run-all.sh (or set ORK_ABI_OPTIONAL=1)"
        ),
    }
}

/// `#define NAME value` in `text`.
fn define<'a>(text: &'a str, name: &str) -> &'a str {
    text.lines()
        .find_map(|l| l.strip_prefix("#define ")?.strip_prefix(name)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("#define {name} missing"))
        .trim()
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

fn check_release(build: u32) {
    let Some(src) = tree(build) else { return };
    let hdrs = root().join("ggml-headers");
    let layout_h = format!("ork_ggml_b{build}.h");
    let shared = std::fs::read_to_string(hdrs.join("ork_ggml_abi.h")).unwrap();
    let layout = std::fs::read_to_string(hdrs.join(&layout_h)).unwrap();
    let up_inc = [src.join("ggml/include"), src.join("ggml/src")];
    let dir = std::env::temp_dir().join(format!("ork-abi-{}-b{build}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();

    // 1. sizes, offsets, values
    let b = format!("ORK_BUILD={build}");
    let ours = probe(&dir.join("ours"), &[b.clone(), format!("ORK_LAYOUT_H=\"{layout_h}\"")], std::slice::from_ref(&hdrs));
    let theirs = probe(&dir.join("theirs"), &[b, "UPSTREAM".into()], &up_inc);
    let mut diffs = Vec::new();
    for (a, b) in ours.lines().zip(theirs.lines()) {
        if a != b {
            diffs.push(format!("ours: {a}   upstream: {b}"));
        }
    }
    assert_eq!(ours.lines().count(), theirs.lines().count());
    assert!(diffs.is_empty(), "ABI drift against b{build}:\n{}", diffs.join("\n"));
    assert!(ours.lines().count() > 150, "the probe checks too little");

    // 2. member types of every interface table, and every function's prototype
    let tables: Vec<_> = vtables(&shared).into_iter().chain(vtables(&layout)).collect();
    let fns = functions(&shared);
    assert!(tables.len() == 5 && fns.len() > 15, "parsed {} tables, {} functions", tables.len(), fns.len());
    let mut c = String::from(
        "#include \"ggml.h\"\n#include \"ggml-backend.h\"\n#include \"ggml-backend-impl.h\"\n#include \"ggml-impl.h\"\n",
    );
    // Every function exists upstream (taking the address of an undeclared name does not compile)...
    c += "void * const ork_fns[] = {\n";
    for f in &fns {
        c += &format!("    (void *) {f},\n");
    }
    c += "};\n#define ORK_ABI_CHECK 1\n#define ORK_TAG(tag) ork_##tag\n";
    // ...with our prototype (a conflicting redeclaration does not compile).
    c += &format!("#include \"{layout_h}\"\n");
    c += &format!(
        "#define SAME(S, M) _Static_assert(__builtin_types_compatible_p(__typeof__(((struct S *)0)->M), \
         __typeof__(((struct ork_##S *)0)->M)), \"b{build}: \" #S \".\" #M \" has another type upstream\")\n"
    );
    let mut n = 0;
    for (t, members) in &tables {
        for m in members {
            c += &format!("SAME({t}, {m});\n");
            n += 1;
        }
        c += &format!(
            "_Static_assert(sizeof(struct {t}) == sizeof(struct ork_{t}), \"b{build}: {t} has another size upstream\");\n"
        );
    }
    assert!(n > 50, "only {n} interface members compared");
    let cfile = dir.join("check.c");
    std::fs::write(&cfile, c).unwrap();
    let o = cc()
        .args(["-std=c11", "-c", "-Werror", "-o"])
        .arg(dir.join("check.o"))
        .arg(&cfile)
        .args(up_inc.iter().flat_map(|i| ["-I".as_ref(), i.as_os_str()]))
        .arg("-I")
        .arg(&hdrs)
        .output()
        .expect("run the C compiler");
    assert!(
        o.status.success(),
        "b{build}: interface tables or function prototypes differ from upstream's:\n{}",
        String::from_utf8_lossy(&o.stderr)
    );

    // 3. what the plugin recognises the release by
    let cm = std::fs::read_to_string(src.join("ggml/CMakeLists.txt")).unwrap();
    let part = |k: &str| define_cmake(&cm, k);
    let version = format!("\"{}.{}.{}\"", part("GGML_VERSION_MAJOR"), part("GGML_VERSION_MINOR"), part("GGML_VERSION_PATCH"));
    assert_eq!(define(&layout, "ORK_GGML_VERSION"), version, "b{build}: ggml version");
    let declares = |file: &str, f: &str| {
        let t = std::fs::read_to_string(src.join(file)).unwrap();
        t.match_indices(f).any(|(i, _)| t[i + f.len()..].trim_start().starts_with('('))
    };
    let has_n = declares("ggml/include/ggml-backend.h", "ggml_backend_buft_alloc_buffer_n");
    assert_eq!(define(&layout, "ORK_HAS_BUFT_ALLOC_BUFFER_N"), if has_n { "1" } else { "0" }, "b{build}");
    let has_x = declares("ggml/src/ggml-backend-impl.h", "ggml_op_alloc_size_may_expand");
    assert_eq!(define(&layout, "ORK_HAS_OP_ALLOC_SIZE_MAY_EXPAND"), if has_x { "1" } else { "0" }, "b{build}");
    assert_eq!(define(&layout, "ORK_LLAMA_BUILD"), build.to_string());
    let _ = std::fs::remove_dir_all(&dir);
}

/// `set(NAME value)` in a CMakeLists.txt.
fn define_cmake<'a>(text: &'a str, name: &str) -> &'a str {
    text.lines()
        .find_map(|l| l.trim().strip_prefix("set(")?.strip_prefix(name)?.strip_suffix(')'))
        .unwrap_or_else(|| panic!("set({name} ...) missing"))
        .trim()
}

#[test]
fn every_layout_has_a_test() {
    assert_eq!(layouts(), vec![11549, 10809, 10566], "a layout header without its drift test below (or the reverse)");
}

#[test]
fn b11549_declaration_matches_its_headers() {
    check_release(11549);
}

#[test]
fn b10809_declaration_matches_its_headers() {
    check_release(10809);
}

#[test]
fn b10566_declaration_matches_its_headers() {
    check_release(10566);
}
