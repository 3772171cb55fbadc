//! ABI drift check: each of our layout declarations (`ggml-headers/ork_ggml_b<N>.h`, which include
//! the shared `ork_ggml_abi.h`) against the headers of llama.cpp release b<N> itself, by the checks
//! of `build-support/abi_check.rs` (the same ones `build.rs` runs on `ORK_LLAMA_SRC`):
//!
//! 1. `tests/abi_probe.c` is compiled against ours and against upstream's and run; sizes, field
//!    offsets and enum values must agree line for line.
//! 2. A generated C file puts upstream's headers and ours side by side (`ORK_ABI_CHECK`, our
//!    interface tables renamed by `ORK_TAG`): every member of every interface table must have the
//!    same type as upstream's, and every function we declare must exist upstream with the same
//!    prototype, or it does not compile.
//! 3. How the plugin recognises the release at load (`src/ffi/release.rs`) is checked against the
//!    tree: `ORK_GGML_VERSION` against `ggml/CMakeLists.txt`, `ORK_HAS_*` against whether the
//!    release declares `ggml_backend_buft_alloc_buffer_n` / `ggml_op_alloc_size_may_expand`, and
//!    `ORK_OP_NAMES` / `ORK_TYPE_NAMES` against its `ggml.c` and `ggml.h`.
//!
//! And the build-against-your-own-llama.cpp path (`ORK_LLAMA_SRC`, `abi_check::match_tree`): the
//! pinned tree matches b11549 alone, the b10809 (b10566) tree b10809 (b10566) alone, and a copy of the pinned tree
//! whose buffer-type table has two members swapped matches none, in one line naming the member.
//!
//! Needs each release's llama.cpp source: the pinned one at `LLAMA_SRC`, the others at
//! `$ORK_RELEASES/b<N>/llama.cpp` (both set by the test scripts after `tests/setup-env.sh`).
//! Without them the test fails, unless `ORK_ABI_OPTIONAL=1` says this run has no llama.cpp tree.

#[path = "../build-support/abi_check.rs"]
mod abi_check;

use std::path::{Path, PathBuf};

const PINNED: u32 = 11549;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn cc() -> std::ffi::OsString {
    std::env::var_os("CC").unwrap_or_else(|| "cc".into())
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

fn check_release(build: u32) {
    let Some(src) = tree(build) else { return };
    let work = std::env::temp_dir().join(format!("ork-abi-{}-b{build}", std::process::id()));
    let diffs = abi_check::differences(&root(), &cc(), &work, build, &src, true);
    assert!(diffs.is_empty(), "ABI drift against b{build}:\n{}", diffs.join("\n"));
}

/// `match_tree` on `src`, its work files under a fresh directory.
fn match_tree(src: &Path) -> Result<u32, String> {
    let work = tempfile::tempdir().unwrap();
    abi_check::match_tree(&root(), &cc(), work.path(), src)
}

#[test]
fn every_layout_has_a_test() {
    assert_eq!(abi_check::layouts(&root()), vec![11549, 10809, 10566], "a layout header without its drift test below (or the reverse)");
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

#[test]
fn own_tree_the_pinned_release_matches_b11549() {
    let Some(src) = tree(PINNED) else { return };
    assert_eq!(match_tree(&src), Ok(PINNED));
}

#[test]
fn own_tree_b10809_matches_b10809() {
    let Some(src) = tree(10809) else { return };
    assert_eq!(match_tree(&src), Ok(10809));
}

#[test]
fn own_tree_b10566_matches_b10566() {
    let Some(src) = tree(10566) else { return };
    assert_eq!(match_tree(&src), Ok(10566));
}

/// A copy of the pinned tree's ggml headers (and `ggml.c`, `ggml/CMakeLists.txt`) with
/// `get_alignment` and `get_max_size` of `struct ggml_backend_buffer_type_i` swapped: same types,
/// so only their offsets tell, and the one line names the first.
#[test]
fn own_tree_with_an_edited_interface_table_fails_in_one_line() {
    let Some(src) = tree(PINNED) else { return };
    let copy = tempfile::tempdir().unwrap();
    let dst = copy.path();
    for dir in ["ggml/include", "ggml/src"] {
        std::fs::create_dir_all(dst.join(dir)).unwrap();
        for e in std::fs::read_dir(src.join(dir)).unwrap() {
            let e = e.unwrap();
            if e.file_type().unwrap().is_file() {
                std::fs::copy(e.path(), dst.join(dir).join(e.file_name())).unwrap();
            }
        }
    }
    std::fs::copy(src.join("ggml/CMakeLists.txt"), dst.join("ggml/CMakeLists.txt")).unwrap();
    let impl_h = dst.join("ggml/src/ggml-backend-impl.h");
    let text = std::fs::read_to_string(&impl_h).unwrap();
    let table = text.find("struct ggml_backend_buffer_type_i {").expect("the buffer-type table");
    let line = |m: &str| {
        let i = table + text[table..].find(m).unwrap_or_else(|| panic!("{m} in the buffer-type table"));
        let s = text[..i].rfind('\n').unwrap() + 1;
        s..s + text[s..].find('\n').unwrap() + 1
    };
    let (a, b) = (line("(*get_alignment)"), line("(*get_max_size)"));
    assert!(a.end <= b.start, "get_alignment before get_max_size");
    let edited =
        format!("{}{}{}{}{}", &text[..a.start], &text[b.clone()], &text[a.end..b.start], &text[a.clone()], &text[b.end..]);
    std::fs::write(&impl_h, edited).unwrap();
    let err = match_tree(dst).expect_err("a swapped table matches no layout");
    eprintln!("{err}");
    assert!(!err.contains('\n'), "one line: {err}");
    assert!(err.starts_with(&format!("{}: the tree's ggml ABI matches no layout", dst.display())), "{err}");
    assert!(
        err.contains("closest b11549: struct ggml_backend_buffer_type_i member get_alignment at offset 32, ours 24"),
        "{err}"
    );
}
