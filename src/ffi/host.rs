//! ORK's objects in the layout of the ggml release the plugin is loaded into (`release.rs`
//! recognises it): the buffer type and the backend (stream), whose tables differ between
//! releases. ggml has no stable backend ABI: the loader reads positional tables, so each object
//! is laid out in the host's own shape and read back only through the same layout.

use super::abi::*;
use super::release::Layout;
use super::{abi, abi_b10566, abi_b10809};
use std::ffi::{c_char, c_void};

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
                get_alignment: Some(f.get_alignment),
                is_host: Some(f.is_host),
                // No `alloc_buffer_n`, `get_max_size`, `get_alloc_size`, `get_alloc_size_n`.
                ..Default::default()
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
            // Every other entry is None (bindgen's Default): no async copies, plans or events.
            iface: $m::ggml_backend_i { get_name: Some($f.get_name), free: Some($f.free), graph_compute: Some($f.graph_compute), ..Default::default() },
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
