//! Which ggml the plugin is loaded into, decided once at `ggml_backend_init` from what the host
//! process exports, and the objects of that release's layout.
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

use super::abi::*;
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

/// The supported releases in words, for log lines: "b11549 (ggml 0.26.0, API 3), ...".
pub(crate) fn supported_list() -> String {
    supported()
        .iter()
        .map(|m| format!("llama.cpp b{} (ggml {}, backend API {})", m.llama_build, m.ggml_version, m.api_version))
        .collect::<Vec<_>>()
        .join(", ")
}

/// What the host process was seen to export.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct HostFacts {
    /// `ggml_version()`, None when the process exports no such function.
    pub ggml_version: Option<String>,
    pub has_buft_alloc_buffer_n: bool,
    pub has_op_alloc_size_may_expand: bool,
    /// Op and type ids whose `ggml_op_name` / `ggml_type_name` is not what the plugin expects,
    /// as "id: got (want)".
    pub misnamed: Vec<String>,
}

/// The layout of a host with `facts`, or the one line that says why the plugin does not know it.
pub(crate) fn classify(facts: &HostFacts) -> Result<Layout, String> {
    let Some(v) = facts.ggml_version.as_deref() else {
        return Err(format!(
            "this process exports no ggml_version(): not a ggml host this libggml-ork.so knows; it supports {}; \
             ORK registers no device",
            supported_list()
        ));
    };
    let yn = |b: bool| if b { "yes" } else { "no" };
    let host = format!(
        "ggml {v} (ggml_backend_buft_alloc_buffer_n: {}, ggml_op_alloc_size_may_expand: {})",
        yn(facts.has_buft_alloc_buffer_n),
        yn(facts.has_op_alloc_size_may_expand)
    );
    let known = supported().into_iter().find(|m| {
        m.ggml_version == v
            && m.has_buft_alloc_buffer_n == facts.has_buft_alloc_buffer_n
            && m.has_op_alloc_size_may_expand == facts.has_op_alloc_size_may_expand
    });
    match known {
        Some(m) if facts.misnamed.is_empty() => Ok(m.layout),
        Some(m) => Err(format!(
            "the ggml in this process, {host}, looks like llama.cpp b{} but names ops/types differently ({}); \
             this libggml-ork.so supports {}; ORK registers no device",
            m.llama_build,
            facts.misnamed.join(", "),
            supported_list()
        )),
        None => Err(format!(
            "unsupported ggml in this process: {host}; this libggml-ork.so supports {}; ORK registers no device",
            supported_list()
        )),
    }
}

/// The ops and types the plugin names, with their ggml names (the same in every supported release).
const OP_NAMES: &[(ggml_op, &str)] = &[
    (GGML_OP_NONE, "NONE"),
    (GGML_OP_ADD, "ADD"),
    (GGML_OP_MUL, "MUL"),
    (GGML_OP_RMS_NORM, "RMS_NORM"),
    (GGML_OP_MUL_MAT, "MUL_MAT"),
    (GGML_OP_MUL_MAT_ID, "MUL_MAT_ID"),
    (GGML_OP_CPY, "CPY"),
    (GGML_OP_CONT, "CONT"),
    (GGML_OP_RESHAPE, "RESHAPE"),
    (GGML_OP_VIEW, "VIEW"),
    (GGML_OP_PERMUTE, "PERMUTE"),
    (GGML_OP_TRANSPOSE, "TRANSPOSE"),
    (GGML_OP_GET_ROWS, "GET_ROWS"),
];
const TYPE_NAMES: &[(ggml_type, &str)] = &[
    (GGML_TYPE_F32, "f32"),
    (GGML_TYPE_F16, "f16"),
    (GGML_TYPE_Q4_0, "q4_0"),
    (GGML_TYPE_Q4_1, "q4_1"),
    (GGML_TYPE_Q5_0, "q5_0"),
    (GGML_TYPE_Q5_1, "q5_1"),
    (GGML_TYPE_Q8_0, "q8_0"),
    (GGML_TYPE_Q2_K, "q2_K"),
    (GGML_TYPE_Q3_K, "q3_K"),
    (GGML_TYPE_Q4_K, "q4_K"),
    (GGML_TYPE_Q5_K, "q5_K"),
    (GGML_TYPE_Q6_K, "q6_K"),
    (GGML_TYPE_IQ4_NL, "iq4_nl"),
    (GGML_TYPE_BF16, "bf16"),
];

/// Looks at the host process (the global symbol scope, where the tool's libggml-base is).
pub(crate) fn facts() -> HostFacts {
    let this = libloading::os::unix::Library::this();
    let has = |name: &[u8]| {
        // SAFETY: only the symbol's presence is looked at; nothing is called through it.
        unsafe { this.get::<*const c_void>(name) }.is_ok()
    };
    let cstr = |p: *const c_char| {
        // SAFETY: ggml's name functions return NULL or a static NUL-terminated string.
        (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
    };
    // SAFETY: ggml_version has this prototype in every ggml that exports it (drift-checked for the
    // supported releases; it has not changed since it was added).
    let version = unsafe { this.get::<unsafe extern "C" fn() -> *const c_char>(b"ggml_version\0") }
        .ok()
        // SAFETY: as above; no arguments, returns a static string.
        .and_then(|f| cstr(unsafe { f() }));
    let mut misnamed = Vec::new();
    if version.is_some() {
        // SAFETY: both have these prototypes in every supported release (drift-checked); every id
        // asked is below GGML_OP_COUNT / GGML_TYPE_COUNT of all of them.
        let op_name = unsafe { this.get::<unsafe extern "C" fn(ggml_op) -> *const c_char>(b"ggml_op_name\0") };
        // SAFETY: as above.
        let type_name = unsafe { this.get::<unsafe extern "C" fn(ggml_type) -> *const c_char>(b"ggml_type_name\0") };
        match (op_name, type_name) {
            (Ok(op_name), Ok(type_name)) => {
                for &(id, want) in OP_NAMES {
                    // SAFETY: see above.
                    let got = cstr(unsafe { op_name(id) });
                    if got.as_deref() != Some(want) {
                        misnamed.push(format!("op {id}: {got:?} ({want})"));
                    }
                }
                for &(id, want) in TYPE_NAMES {
                    // SAFETY: see above.
                    let got = cstr(unsafe { type_name(id) });
                    if got.as_deref() != Some(want) {
                        misnamed.push(format!("type {id}: {got:?} ({want})"));
                    }
                }
            }
            _ => misnamed.push("ggml_op_name / ggml_type_name not exported".into()),
        }
    }
    HostFacts {
        ggml_version: version,
        has_buft_alloc_buffer_n: has(b"ggml_backend_buft_alloc_buffer_n\0"),
        has_op_alloc_size_may_expand: has(b"ggml_op_alloc_size_may_expand\0"),
        misnamed,
    }
}

/// The callbacks of ORK's buffer type, for [`new_buft`].
pub(crate) struct BuftFns {
    pub get_name: unsafe extern "C" fn(ggml_backend_buffer_type_t) -> *const c_char,
    pub alloc_buffer: unsafe extern "C" fn(ggml_backend_buffer_type_t, usize) -> ggml_backend_buffer_t,
    pub get_alignment: unsafe extern "C" fn(ggml_backend_buffer_type_t) -> usize,
    pub is_host: unsafe extern "C" fn(ggml_backend_buffer_type_t) -> bool,
}

/// ORK's buffer type in the API-2 table of the generated module `$m` (b10809, b10566), leaked.
macro_rules! buft_api2 {
    ($m:ident, $f:expr, $device:expr, $context:expr) => {
        Box::into_raw(Box::new($m::ggml_backend_buffer_type {
            iface: $m::ggml_backend_buffer_type_i {
                get_name: Some($f.get_name),
                alloc_buffer: Some($f.alloc_buffer),
                get_alignment: Some($f.get_alignment),
                get_max_size: None,
                get_alloc_size: None,
                is_host: Some($f.is_host),
            },
            device: $device,
            context: $context,
        })) as ggml_backend_buffer_type_t
    };
}

/// ORK's buffer type in `layout`'s shape, leaked (ggml never frees a buffer type). The pointer
/// is only compared and handed to ggml; Rust never reads it through another layout's type.
pub(crate) fn new_buft(layout: Layout, f: &BuftFns, device: ggml_backend_dev_t) -> ggml_backend_buffer_type_t {
    let context = std::ptr::null_mut();
    match layout {
        Layout::B11549 => Box::into_raw(Box::new(abi::ggml_backend_buffer_type {
            iface: abi::ggml_backend_buffer_type_i {
                get_name: Some(f.get_name),
                alloc_buffer: Some(f.alloc_buffer),
                alloc_buffer_n: None,
                get_alignment: Some(f.get_alignment),
                get_max_size: None,
                get_alloc_size: None,
                get_alloc_size_n: None,
                is_host: Some(f.is_host),
            },
            device,
            context,
        })),
        // The API-2 table (no `alloc_buffer_n` / `get_alloc_size_n`), the same in both releases.
        Layout::B10809 => buft_api2!(abi_b10809, f, device, context),
        Layout::B10566 => buft_api2!(abi_b10566, f, device, context),
    }
}

/// The callbacks of ORK's backend (stream), for [`new_backend`].
pub(crate) struct BackendFns {
    pub get_name: unsafe extern "C" fn(ggml_backend_t) -> *const c_char,
    pub free: unsafe extern "C" fn(ggml_backend_t),
    pub graph_compute: unsafe extern "C" fn(ggml_backend_t, *mut ggml_cgraph) -> ggml_status,
}

macro_rules! backend_in {
    ($m:ident, $f:expr, $guid:expr, $device:expr, $context:expr) => {
        Box::into_raw(Box::new($m::ggml_backend {
            guid: $guid,
            iface: $m::ggml_backend_i {
                get_name: Some($f.get_name),
                free: Some($f.free),
                set_tensor_async: None,
                get_tensor_async: None,
                set_tensor_2d_async: None,
                get_tensor_2d_async: None,
                cpy_tensor_async: None,
                synchronize: None,
                graph_plan_create: None,
                graph_plan_free: None,
                graph_plan_update: None,
                graph_plan_compute: None,
                graph_compute: Some($f.graph_compute),
                event_record: None,
                event_wait: None,
                graph_optimize: None,
            },
            device: $device,
            context: $context,
        })) as ggml_backend_t
    };
}

/// A backend object in `layout`'s shape; free it with [`free_backend`] of the same layout.
pub(crate) fn new_backend(layout: Layout, f: &BackendFns, guid: ggml_guid_t, device: ggml_backend_dev_t, context: *mut c_void) -> ggml_backend_t {
    match layout {
        Layout::B11549 => backend_in!(abi, f, guid, device, context),
        Layout::B10809 => backend_in!(abi_b10809, f, guid, device, context),
        Layout::B10566 => backend_in!(abi_b10566, f, guid, device, context),
    }
}

/// Frees a backend made by [`new_backend`] with the same `layout`; returns its context.
///
/// # Safety
/// `b` came from `new_backend(layout, ..)` and is freed once.
pub(crate) unsafe fn free_backend(layout: Layout, b: ggml_backend_t) -> *mut c_void {
    // SAFETY: `b` is the Box made by new_backend in this layout's type (caller).
    unsafe {
        match layout {
            Layout::B11549 => Box::from_raw(b).context,
            Layout::B10809 => Box::from_raw(b as *mut abi_b10809::ggml_backend).context,
            Layout::B10566 => Box::from_raw(b as *mut abi_b10566::ggml_backend).context,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    fn facts(v: &str, n: bool, x: bool) -> HostFacts {
        HostFacts { ggml_version: Some(v.into()), has_buft_alloc_buffer_n: n, has_op_alloc_size_may_expand: x, misnamed: vec![] }
    }

    #[test]
    fn each_release_is_recognised_by_its_own_marks() {
        assert_eq!(classify(&facts("0.26.0", true, true)), Ok(Layout::B11549));
        assert_eq!(classify(&facts("0.23.0", false, true)), Ok(Layout::B10809));
        assert_eq!(classify(&facts("0.21.0", false, false)), Ok(Layout::B10566));
        for m in supported() {
            assert_eq!(m.layout.marks().llama_build, m.llama_build);
        }
        assert_eq!(Layout::B11549.marks().api_version, 3);
        assert_eq!(Layout::B10809.marks().api_version, 2);
        assert_eq!(Layout::B10566.marks().api_version, 2);
    }

    #[test]
    fn an_unknown_host_gets_one_line_naming_its_version_and_the_supported_ones() {
        for f in [
            facts("0.99.0", true, true),
            facts("0.23.0", true, true),   // b10809's version with API 3 tables
            facts("0.26.0", false, true),  // b11549's version without alloc_buffer_n
            facts("0.21.0", false, true),  // b10566's version with b10809's marks
            HostFacts { ggml_version: None, has_buft_alloc_buffer_n: false, has_op_alloc_size_may_expand: false, misnamed: vec![] },
        ] {
            let line = classify(&f).unwrap_err();
            assert!(!line.contains('\n'), "{line}");
            assert!(line.contains("b11549 (ggml 0.26.0, backend API 3)") && line.contains("b10566 (ggml 0.21.0, backend API 2)"), "{line}");
            if let Some(v) = &f.ggml_version {
                assert!(line.contains(&format!("ggml {v} ")), "{line}");
            }
        }
        let mut f = facts("0.26.0", true, true);
        f.misnamed.push("op 29: Some(\"MUL_MAT_ID\") (MUL_MAT)".into());
        assert!(classify(&f).unwrap_err().contains("names ops/types differently"));
    }

    #[test]
    fn layouts_differ_where_the_headers_say_and_agree_elsewhere() {
        // The buffer-type table: 8 members in API 3, 6 in API 2 (is_host at byte 56 vs 40).
        assert_eq!(size_of::<abi::ggml_backend_buffer_type_i>(), 64);
        assert_eq!(offset_of!(abi::ggml_backend_buffer_type_i, is_host), 56);
        assert_eq!(size_of::<abi_b10809::ggml_backend_buffer_type_i>(), 48);
        assert_eq!(offset_of!(abi_b10809::ggml_backend_buffer_type_i, is_host), 40);
        assert_eq!(size_of::<abi_b10566::ggml_backend_buffer_type_i>(), 48);
        // The backend object: read through `abi::ggml_backend` (guid, context) in every layout.
        for (s, g, c) in [
            (size_of::<abi_b10809::ggml_backend>(), offset_of!(abi_b10809::ggml_backend, guid), offset_of!(abi_b10809::ggml_backend, context)),
            (size_of::<abi_b10566::ggml_backend>(), offset_of!(abi_b10566::ggml_backend, guid), offset_of!(abi_b10566::ggml_backend, context)),
        ] {
            assert_eq!((s, g, c), (size_of::<abi::ggml_backend>(), offset_of!(abi::ggml_backend, guid), offset_of!(abi::ggml_backend, context)));
        }
    }
}
