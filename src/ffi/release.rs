//! Which ggml the plugin is loaded into, decided once at `ggml_backend_init` from what the host
//! process exports (the objects of that release's layout are `host.rs`'s).
//!
//! ggml has no stable backend ABI: the loader only compares `reg->api_version` with its own
//! `GGML_BACKEND_API_VERSION` and then reads positional tables. The loader passes the plugin
//! nothing, so the plugin asks the process: `ggml_version()` (libggml-base), whether
//! `ggml_backend_buft_alloc_buffer_n` and `ggml_op_alloc_size_may_expand` are exported (they
//! arrived with the buffer-type and `graph_optimize` changes), and `ggml_op_name` /
//! `ggml_type_name` of every op and type id the plugin names. Only a host that matches one
//! supported layout in all of these gets a registry; any other gets none (the loader then
//! registers nothing) and one line naming its version and the supported ones. The marks of each
//! layout come from its header in `ggml-headers/`, which `tests/abi_drift.rs` checks against
//! that release's tree.

use super::{abi, abi_b10566, abi_b10809};
use std::ffi::{c_char, c_void, CStr};

/// A supported ggml layout, named by the llama.cpp release whose headers declare it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Layout {
    /// llama.cpp b11549, ggml 0.26.0, backend API 3 (the pinned release).
    B11549,
    /// llama.cpp b10809, ggml 0.23.0, backend API 2: 6-member buffer-type table.
    B10809,
    /// llama.cpp b10566, ggml 0.21.0, backend API 2: as b10809, and `graph_optimize` without params.
    B10566,
}

/// What identifies a layout in a host process.
pub(crate) struct Marks {
    pub layout: Layout,
    pub llama_build: u32,
    pub ggml_version: &'static str,
    pub api_version: i32,
    pub has_buft_alloc_buffer_n: bool,
    pub has_op_alloc_size_may_expand: bool,
}

fn text(b: &'static [u8]) -> &'static str {
    CStr::from_bytes_with_nul(b).ok().and_then(|c| c.to_str().ok()).unwrap_or("?")
}

/// The marks of one layout from its generated module (`ggml-headers/ork_ggml_b<N>.h`).
macro_rules! marks {
    ($layout:expr, $m:ident) => {
        Marks {
            layout: $layout,
            llama_build: $m::ORK_LLAMA_BUILD,
            ggml_version: text($m::ORK_GGML_VERSION),
            api_version: $m::GGML_BACKEND_API_VERSION as i32,
            has_buft_alloc_buffer_n: $m::ORK_HAS_BUFT_ALLOC_BUFFER_N != 0,
            has_op_alloc_size_may_expand: $m::ORK_HAS_OP_ALLOC_SIZE_MAY_EXPAND != 0,
        }
    };
}

/// The supported layouts, newest first, with their marks from `ggml-headers/ork_ggml_b<N>.h`.
pub(crate) fn supported() -> [Marks; 3] {
    [marks!(Layout::B11549, abi), marks!(Layout::B10809, abi_b10809), marks!(Layout::B10566, abi_b10566)]
}

impl Layout {
    pub(crate) fn marks(self) -> Marks {
        supported().into_iter().find(|m| m.layout == self).expect("every layout has marks")
    }
}

/// The llama.cpp releases verified with this libggml-ork.so, per layout: the oldest and newest
/// at the ends of its range, newest layout first. A host whose marks match a layout and whose
/// `ggml_version()` lies within that layout's range registers; the releases inside it were run
/// by `tests/e2e_wheels.py` (MUL_MAT graphs through the scheduler against each release's own CPU
/// backend) and the three built ones by `tests/e2e_releases.py` (docs/releases.md).
pub(crate) const VERIFIED: [Range; 3] = [
    Range { layout: Layout::B11549, first: (11352, "0.25.3"), last: (11739, "0.27.0") },
    Range { layout: Layout::B10809, first: (10809, "0.23.0"), last: (11327, "0.25.3") },
    Range { layout: Layout::B10566, first: (10566, "0.21.0"), last: (10603, "0.21.0") },
];

/// A layout's verified range: (llama.cpp build, ggml version) of the releases at its ends.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Range {
    pub layout: Layout,
    pub first: (u32, &'static str),
    pub last: (u32, &'static str),
}

pub(crate) use crate::config::UnverifiedGgml as Unverified;

/// The tree this libggml-ork.so was built against (`ORK_LLAMA_SRC` at build time, checked by
/// build.rs to match a layout): (layout, its ggml version, its llama.cpp build or 0). A host with
/// that version and layout is verified too.
pub(crate) fn built_against() -> Option<(Layout, String, u32)> {
    parse_built_against(option_env!("ORK_BUILT_AGAINST").unwrap_or(""))
}

/// `"<layout build> <ggml version> <llama.cpp build>"` (build.rs's `ORK_BUILT_AGAINST`).
fn parse_built_against(s: &str) -> Option<(Layout, String, u32)> {
    let mut it = s.split_whitespace();
    let layout: u32 = it.next()?.parse().ok()?;
    let layout = supported().into_iter().find(|m| m.llama_build == layout)?.layout;
    let v = it.next()?.to_string();
    Some((layout, v, it.next().and_then(|b| b.parse().ok()).unwrap_or(0)))
}

/// A version `a.b.c` as numbers (a missing part is 0; None when it is not numeric).
fn version(v: &str) -> Option<(u32, u32, u32)> {
    let mut it = v.trim().split('.').map(|p| p.parse::<u32>().ok());
    let a = it.next()??;
    let b = it.next().unwrap_or(Some(0))?;
    let c = it.next().unwrap_or(Some(0))?;
    it.next().is_none().then_some((a, b, c))
}

/// The ops and types of every supported layout, in id order (`ORK_OP_NAMES` / `ORK_TYPE_NAMES`
/// of `ggml-headers/ork_ggml_abi.h`, drift-checked against each release's ggml.c).
pub(crate) fn op_names() -> Vec<&'static str> {
    text(abi::ORK_OP_NAMES).split('|').collect()
}

/// See [`op_names`].
pub(crate) fn type_names() -> Vec<&'static str> {
    text(abi::ORK_TYPE_NAMES).split('|').collect()
}

/// What the host process was seen to export.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct HostFacts {
    /// `ggml_version()`, None when the process exports no such function.
    pub ggml_version: Option<String>,
    pub has_buft_alloc_buffer_n: bool,
    pub has_op_alloc_size_may_expand: bool,
    /// `ggml_op_name(id)` for every id the layouts list (None: NULL, or not a string of the
    /// library that exports the function); empty when the host exports no `ggml_op_name`.
    pub ops: Vec<Option<String>>,
    /// `ggml_type_name(id)` likewise.
    pub types: Vec<Option<String>>,
}

/// A recognised host: its layout, and the one warning line when it is outside every verified
/// range but registers all the same (`ORK_UNVERIFIED_GGML`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Recognised {
    pub layout: Layout,
    pub warning: Option<String>,
}

/// The first id whose host name differs from `want`, in words: "op 29 is \"X\" (MUL_MAT)".
fn first_difference(kind: &str, got: &[Option<String>], want: &[&str]) -> Option<String> {
    if got.is_empty() {
        return Some(format!("ggml_{kind}_name is not exported"));
    }
    let differ: Vec<usize> = (0..want.len()).filter(|&i| got.get(i).and_then(|g| g.as_deref()) != Some(want[i])).collect();
    let &i = differ.first()?;
    Some(format!(
        "{kind} {i} is {:?} where the layouts have {:?} ({} of {} {kind} names differ)",
        got.get(i).cloned().flatten().unwrap_or_else(|| "(none)".into()),
        want[i],
        differ.len(),
        want.len()
    ))
}

/// The verified releases in words, for log lines: "b11549 (ggml 0.26.0, API 3), ...".
pub(crate) fn verified_list() -> String {
    VERIFIED
        .iter()
        .map(|r| {
            let m = r.layout.marks();
            if r.first == r.last {
                format!("llama.cpp b{} (ggml {}, backend API {})", r.first.0, r.first.1, m.api_version)
            } else {
                format!("llama.cpp b{}..b{} (ggml {}..{}, backend API {})", r.first.0, r.last.0, r.first.1, r.last.1, m.api_version)
            }
        })
        .chain(built_against().map(|(l, v, b)| {
            let tree = if b > 0 { format!("llama.cpp b{b}") } else { "a llama.cpp tree".into() };
            format!("ggml {v} ({tree} this file was built against, backend API {})", l.marks().api_version)
        }))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The layout of a host with `facts`, or the one line that says why the plugin does not register
/// in it. The layout is decided by what makes the ABI — the exported symbols that arrived with
/// the table changes, and every name of the op and type enums — and the version only decides
/// whether the host lies within a verified range (`unverified` says what happens outside).
pub(crate) fn classify(facts: &HostFacts, unverified: Unverified) -> Result<Recognised, String> {
    let Some(v) = facts.ggml_version.as_deref() else {
        return Err(format!(
            "this process exports no ggml_version(): not a ggml host this libggml-ork.so knows; verified: {}; \
             ORK registers no device",
            verified_list()
        ));
    };
    let yn = |b: bool| if b { "yes" } else { "no" };
    let host = format!(
        "ggml {v} (ggml_backend_buft_alloc_buffer_n: {}, ggml_op_alloc_size_may_expand: {})",
        yn(facts.has_buft_alloc_buffer_n),
        yn(facts.has_op_alloc_size_may_expand)
    );
    let Some(m) = supported()
        .into_iter()
        .find(|m| m.has_buft_alloc_buffer_n == facts.has_buft_alloc_buffer_n && m.has_op_alloc_size_may_expand == facts.has_op_alloc_size_may_expand)
    else {
        return Err(format!(
            "unsupported ggml in this process: {host}: its exported symbols match no layout this libggml-ork.so knows; \
             verified: {}; ORK registers no device",
            verified_list()
        ));
    };
    let differ = first_difference("op", &facts.ops, &op_names()).or_else(|| first_difference("type", &facts.types, &type_names()));
    if let Some(d) = differ {
        return Err(format!(
            "unsupported ggml in this process: {host}: its symbols are the b{} layout's but its enums are not: {d}; \
             verified: {}; ORK registers no device",
            m.llama_build,
            verified_list()
        ));
    }
    let layout = m.layout;
    let range = VERIFIED.iter().find(|r| r.layout == layout).expect("every layout has a verified range");
    let hv = version(v);
    let built = built_against().is_some_and(|(l, bv, _)| l == layout && version(&bv).is_some() && version(&bv) == hv);
    let within = built || matches!((hv, version(range.first.1), version(range.last.1)), (Some(h), Some(a), Some(b)) if a <= h && h <= b);
    if within {
        return Ok(Recognised { layout, warning: None });
    }
    let newest = VERIFIED.iter().max_by_key(|r| version(r.last.1)).expect("a verified release");
    let newer = matches!((hv, version(newest.last.1)), (Some(h), Some(n)) if h > n) && newest.layout == layout;
    let what = if newer {
        format!("{host} is newer than the newest llama.cpp release verified with this libggml-ork.so (b{}, ggml {})", newest.last.0, newest.last.1)
    } else {
        format!("{host} lies outside the releases verified with this libggml-ork.so ({})", verified_list())
    };
    let matches = format!("its symbols and its {} ops and {} types match the b{} layout (backend API {})", op_names().len(), type_names().len(), m.llama_build, m.api_version);
    let register = match unverified {
        Unverified::Register => true,
        Unverified::Refuse => false,
        Unverified::Newer => newer,
    };
    if register {
        let other = if newer { "ORK_UNVERIFIED_GGML=refuse refuses it" } else { "ORK_UNVERIFIED_GGML=newer or refuse refuses it" };
        Ok(Recognised { layout, warning: Some(format!("{what}; {matches}: registering with that layout ({other})")) })
    } else {
        Err(format!("{what}; {matches}, but ORK registers no device outside the verified releases (ORK_UNVERIFIED_GGML=register registers it)"))
    }
}

/// `name(id)` of ggml for `id` in `0..n`, each read only when it points into the library that
/// exports `name` (the name functions do not check their argument, so an id past the host's own
/// count reads past its table: such a value is compared by address, never followed elsewhere).
fn names(this: &libloading::os::unix::Library, name: &[u8], n: usize) -> Vec<Option<String>> {
    // SAFETY: ggml_op_name and ggml_type_name have this prototype (an enum is a C int) in every
    // ggml that exports them; only the symbol's address is taken here.
    let Ok(f) = (unsafe { this.get::<unsafe extern "C" fn(i32) -> *const c_char>(name) }) else { return Vec::new() };
    let base = |p: *const c_void| {
        let mut info = nix::libc::Dl_info {
            dli_fname: std::ptr::null(),
            dli_fbase: std::ptr::null_mut(),
            dli_sname: std::ptr::null(),
            dli_saddr: std::ptr::null_mut(),
        };
        // SAFETY: dladdr only looks the address up in the loader's tables; `info` is a valid out-pointer.
        let found = unsafe { nix::libc::dladdr(p, &mut info) } != 0;
        found.then_some(info.dli_fbase as usize)
    };
    let home = base(*f as *const c_void);
    (0..n)
        .map(|id| {
            // SAFETY: the function indexes a static table of pointers by `id`; for an id within
            // the host's count that is its name, past it the next object of the same data
            // section (at most the layouts' count, a few hundred bytes past the table's end).
            let p = unsafe { f(id as i32) };
            if p.is_null() || home.is_none() || base(p as *const c_void) != home {
                return None;
            }
            // SAFETY: a pointer into the mapped image of the library that returned it, at a
            // NUL-terminated string for every id within the host's count.
            Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
        })
        .collect()
}

/// Looks at the host process (the global symbol scope, where the tool's libggml-base is).
pub(crate) fn facts() -> HostFacts {
    let this = libloading::os::unix::Library::this();
    let has = |name: &[u8]| {
        // SAFETY: only the symbol's presence is looked at; nothing is called through it.
        unsafe { this.get::<*const c_void>(name) }.is_ok()
    };
    let cstr = |p: *const c_char| {
        // SAFETY: ggml_version returns NULL or a static NUL-terminated string.
        (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
    };
    // SAFETY: ggml_version has this prototype in every ggml that exports it (drift-checked for the
    // supported releases; it has not changed since it was added).
    let version = unsafe { this.get::<unsafe extern "C" fn() -> *const c_char>(b"ggml_version\0") }
        .ok()
        // SAFETY: as above; no arguments, returns a static string.
        .and_then(|f| cstr(unsafe { f() }));
    let (ops, types) = if version.is_some() {
        (names(&this, b"ggml_op_name\0", op_names().len()), names(&this, b"ggml_type_name\0", type_names().len()))
    } else {
        (Vec::new(), Vec::new())
    };
    HostFacts {
        ggml_version: version,
        has_buft_alloc_buffer_n: has(b"ggml_backend_buft_alloc_buffer_n\0"),
        has_op_alloc_size_may_expand: has(b"ggml_op_alloc_size_may_expand\0"),
        ops,
        types,
    }
}

#[cfg(test)]
mod tests {
    use super::abi::*;
    use super::*;

    fn facts(v: &str, n: bool, x: bool) -> HostFacts {
        let own = |l: Vec<&str>| l.into_iter().map(|s| Some(s.to_string())).collect();
        HostFacts {
            ggml_version: Some(v.into()),
            has_buft_alloc_buffer_n: n,
            has_op_alloc_size_may_expand: x,
            ops: own(op_names()),
            types: own(type_names()),
        }
    }

    fn layout(f: &HostFacts, u: Unverified) -> Result<Layout, String> {
        classify(f, u).map(|r| r.layout)
    }

    #[test]
    fn the_enums_are_whole_and_name_the_ids_the_plugin_uses() {
        let (ops, types) = (op_names(), type_names());
        assert_eq!((ops.len(), types.len()), (abi::ORK_OP_COUNT as usize, abi::ORK_TYPE_COUNT as usize));
        for (id, name) in [(GGML_OP_NONE, "NONE"), (GGML_OP_ADD, "ADD"), (GGML_OP_MUL, "MUL"), (GGML_OP_RMS_NORM, "RMS_NORM"),
            (GGML_OP_MUL_MAT, "MUL_MAT"), (GGML_OP_MUL_MAT_ID, "MUL_MAT_ID"), (GGML_OP_CPY, "CPY"), (GGML_OP_CONT, "CONT"),
            (GGML_OP_RESHAPE, "RESHAPE"), (GGML_OP_VIEW, "VIEW"), (GGML_OP_PERMUTE, "PERMUTE"), (GGML_OP_TRANSPOSE, "TRANSPOSE"),
            (GGML_OP_GET_ROWS, "GET_ROWS")]
        {
            assert_eq!(ops[id as usize], name);
        }
        for (id, name) in [(GGML_TYPE_F32, "f32"), (GGML_TYPE_F16, "f16"), (GGML_TYPE_Q4_0, "q4_0"), (GGML_TYPE_Q8_0, "q8_0"),
            (GGML_TYPE_Q4_K, "q4_K"), (GGML_TYPE_Q6_K, "q6_K"), (GGML_TYPE_IQ4_NL, "iq4_nl"), (GGML_TYPE_BF16, "bf16")]
        {
            assert_eq!(types[id as usize], name);
        }
    }

    #[test]
    fn a_layout_is_recognised_by_its_marks_and_enums_in_its_whole_verified_range() {
        for r in VERIFIED {
            let m = r.layout.marks();
            for v in [r.first.1, r.last.1] {
                let f = facts(v, m.has_buft_alloc_buffer_n, m.has_op_alloc_size_may_expand);
                for u in [Unverified::Newer, Unverified::Register, Unverified::Refuse] {
                    assert_eq!(classify(&f, u), Ok(Recognised { layout: r.layout, warning: None }), "{v}");
                }
            }
        }
        assert_eq!(Layout::B11549.marks().api_version, 3);
        assert_eq!(Layout::B10809.marks().api_version, 2);
        assert_eq!(Layout::B10566.marks().api_version, 2);
    }

    #[test]
    fn a_newer_ggml_registers_with_one_line_unless_told_to_refuse() {
        let newest = VERIFIED.iter().max_by_key(|r| version(r.last.1)).unwrap();
        let (a, b, c) = version(newest.last.1).unwrap();
        let m = newest.layout.marks();
        for v in [format!("{a}.{b}.{}", c + 1), format!("{a}.{}.0", b + 1), format!("{}.0.0", a + 1)] {
            let f = facts(&v, m.has_buft_alloc_buffer_n, m.has_op_alloc_size_may_expand);
            let r = classify(&f, Unverified::Newer).unwrap();
            assert_eq!(r.layout, newest.layout);
            let w = r.warning.unwrap();
            assert!(w.contains(&format!("ggml {v} ")) && w.contains(&format!("b{}", newest.last.0)) && w.contains("ORK_UNVERIFIED_GGML=refuse"), "{w}");
            assert!(!w.contains('\n'));
            assert!(classify(&f, Unverified::Register).unwrap().warning.is_some());
            let e = classify(&f, Unverified::Refuse).unwrap_err();
            assert!(e.contains("ORK registers no device") && e.contains("ORK_UNVERIFIED_GGML=register"), "{e}");
        }
        // Newer, but with an older layout's marks: refused unless told to register.
        let f = facts("9.0.0", false, true);
        assert!(classify(&f, Unverified::Newer).is_err());
        assert_eq!(layout(&f, Unverified::Register), Ok(Layout::B10809));
    }

    #[test]
    fn an_unverified_ggml_outside_the_newest_end_is_refused_by_default() {
        for f in [
            facts("0.26.0", false, true),  // b11549's version with the API-2 symbols
            facts("0.21.0", false, true),  // b10566's version with b10809's marks
            facts("0.20.0", false, false), // older than every verified release
            facts("0.26.x", true, true),   // not a version
        ] {
            let e = classify(&f, Unverified::Newer).unwrap_err();
            assert!(!e.contains('\n') && e.contains("ORK registers no device"), "{e}");
            assert!(e.contains(&format!("ggml {} ", f.ggml_version.as_deref().unwrap())), "{e}");
            assert!(classify(&f, Unverified::Register).is_ok());
        }
    }

    #[test]
    fn an_unknown_host_gets_one_line_naming_its_version_and_the_verified_ones() {
        let mut renamed = facts("0.26.0", true, true);
        renamed.ops[GGML_OP_MUL_MAT as usize] = Some("MUL_MAT_ID".into());
        let mut shifted = facts("0.26.0", true, true);
        shifted.ops.insert(5, Some("NEW_OP".into()));
        shifted.ops.pop();
        let mut short = facts("0.23.0", false, true);
        short.types.truncate(40);
        short.types.extend([None, None, None]);
        let mut no_names = facts("0.21.0", false, false);
        no_names.ops.clear();
        for (f, why) in [
            (facts("0.26.0", true, false), "symbols match no layout"),
            (renamed, "op 29 is \"MUL_MAT_ID\" where the layouts have \"MUL_MAT\" (1 of 101 op names differ)"),
            (shifted, "op 5 is \"NEW_OP\" where the layouts have \"ACC\" (96 of 101 op names differ)"),
            (short, "type 40 is \"(none)\" where the layouts have \"nvfp4\" (3 of 43 type names differ)"),
            (no_names, "ggml_op_name is not exported"),
            (HostFacts { ggml_version: None, has_buft_alloc_buffer_n: false, has_op_alloc_size_may_expand: false, ops: vec![], types: vec![] },
             "exports no ggml_version()"),
        ] {
            for u in [Unverified::Newer, Unverified::Register, Unverified::Refuse] {
                let line = classify(&f, u).unwrap_err();
                assert!(!line.contains('\n'), "{line}");
                assert!(line.contains(why), "{why}: {line}");
                assert!(line.contains("b11352..b11739 (ggml 0.25.3..0.27.0, backend API 3)") && line.contains("b10566"), "{line}");
                if let Some(v) = &f.ggml_version {
                    assert!(line.contains(&format!("ggml {v} ")), "{line}");
                }
            }
        }
    }

    #[test]
    fn the_tree_built_against_is_read_from_the_build() {
        assert_eq!(parse_built_against("11549 0.27.1 12429"), Some((Layout::B11549, "0.27.1".into(), 12429)));
        assert_eq!(parse_built_against("10809 0.24.0"), Some((Layout::B10809, "0.24.0".into(), 0)));
        assert_eq!(parse_built_against(""), None);
        assert_eq!(parse_built_against("999 0.1.0 1"), None);
    }
}
