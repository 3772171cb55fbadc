//! Generic DRM core ioctls shared by the vendor [`rknpu`](super::rknpu) and mainline
//! [`rocket`](super::rocket) interfaces, and device-node discovery.
//!
//! Both NPU drivers sit on the DRM core: the vendor driver on a primary node `/dev/dri/card*`,
//! rocket on an accel node `/dev/accel/accel*`. Which driver owns a node is answered by
//! `DRM_IOCTL_VERSION` (the driver's name string, "rknpu" or "rocket"), never by guessing from the
//! node number, because card numbering depends on probe order (the display controller is usually
//! card0, the NPU card1, but not always).
//!
//! What lives here: `DRM_IOCTL_VERSION`, `DRM_IOCTL_GEM_CLOSE` (rocket frees its BOs this way),
//! node listing, and the EINTR/EAGAIN restart loop every DRM ioctl needs (libdrm's `drmIoctl`
//! does the same).
//!
//! Sources: generic Linux uapi `drm.h` (rknpu-facts §1.2, S12): the DRM ioctl type is `'d'`,
//! core ioctls use nr 0x00..0x3f and drivers start at `DRM_COMMAND_BASE` = 0x40.

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use super::KifError;

/// DRM ioctl type byte `'d'` (rknpu-facts §1.2, S1/S12).
pub const DRM_IOCTL_TYPE: u8 = b'd';
/// First driver-private ioctl number (rknpu-facts §1.2, S1/S12).
pub const DRM_COMMAND_BASE: u8 = 0x40;
/// `DRM_IOCTL_VERSION` nr (generic `drm.h`, S12).
pub const DRM_NR_VERSION: u8 = 0x00;
/// `DRM_IOCTL_GEM_CLOSE` nr (generic `drm.h`, S12).
pub const DRM_NR_GEM_CLOSE: u8 = 0x09;
/// `struct drm_version` (generic `drm.h`, S12): three ints, then three (length, user pointer)
/// pairs for name, date and description. 64 bytes on LP64, 36 on ILP32.
#[repr(C)]
#[derive(Debug)]
pub struct DrmVersion {
    pub version_major: i32,
    pub version_minor: i32,
    pub version_patchlevel: i32,
    pub name_len: usize,
    /// `char *` in C; `u8` here so the type is the same on x86_64 (signed char) and aarch64.
    pub name: *mut u8,
    pub date_len: usize,
    pub date: *mut u8,
    pub desc_len: usize,
    pub desc: *mut u8,
}
#[cfg(target_pointer_width = "64")]
const _: () = assert!(std::mem::size_of::<DrmVersion>() == 64);
#[cfg(target_pointer_width = "64")]
const _: () = assert!(std::mem::offset_of!(DrmVersion, name_len) == 16);

/// `struct drm_gem_close` (generic `drm.h`, S12): `handle u32 @0`, `pad u32 @4`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct DrmGemClose {
    pub handle: u32,
    pub pad: u32,
}
const _: () = assert!(std::mem::size_of::<DrmGemClose>() == 8);

/// The raw ioctl wrappers. Each is `unsafe`: the caller passes a pointer to a live, correctly
/// typed argument struct and an open DRM fd.
pub mod sys {
    use super::*;
    nix::ioctl_readwrite!(drm_version, DRM_IOCTL_TYPE, DRM_NR_VERSION, DrmVersion);
    nix::ioctl_write_ptr!(drm_gem_close, DRM_IOCTL_TYPE, DRM_NR_GEM_CLOSE, DrmGemClose);
}

/// Runs an ioctl closure, restarting it on EINTR / EAGAIN (as libdrm's `drmIoctl` does).
pub(crate) fn restart<F>(mut f: F) -> nix::Result<i32>
where
    F: FnMut() -> nix::Result<i32>,
{
    loop {
        match f() {
            Err(nix::errno::Errno::EINTR) | Err(nix::errno::Errno::EAGAIN) => continue,
            other => return other,
        }
    }
}

/// Opens a DRM node read-write, close-on-exec (rknpu-facts §1.1: `O_RDWR`).
pub fn open_node(path: &Path) -> Result<File, KifError> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(nix::fcntl::OFlag::O_CLOEXEC.bits())
        .open(path)
        .map_err(|e| KifError::Sys { op: "open", source: io_to_errno(&e) })
}

/// What `DRM_IOCTL_VERSION` says of a node: the driver's name, its version and description.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DrmIdent {
    /// "rknpu", "rocket", "rockchip-drm", …
    pub name: String,
    /// (major, minor, patchlevel).
    pub version: (u32, u32, u32),
    /// The driver's description ("RKNPU driver"; the mainline ports say what they are here).
    pub desc: String,
}

/// Asks an open node `DRM_IOCTL_VERSION` for its name, version and description.
pub fn ident(fd: &File) -> Result<DrmIdent, KifError> {
    let mut name = [0u8; 64];
    let mut desc = [0u8; 128];
    let mut v = DrmVersion {
        version_major: 0,
        version_minor: 0,
        version_patchlevel: 0,
        name_len: name.len(),
        name: name.as_mut_ptr(),
        date_len: 0,
        date: std::ptr::null_mut(),
        desc_len: desc.len(),
        desc: desc.as_mut_ptr(),
    };
    // SAFETY: `v` is a valid drm_version; the kernel writes at most `name_len` / `desc_len` bytes
    // into `name` / `desc`, which live for the whole call; date has length 0 so its null pointer
    // is not used.
    restart(|| unsafe { sys::drm_version(fd.as_raw_fd(), &mut v) })
        .map_err(|source| KifError::Sys { op: "DRM_IOCTL_VERSION", source })?;
    // The kernel reports the full lengths even when it truncated the copy.
    let text = |b: &[u8], n: usize| String::from_utf8_lossy(&b[..n.min(b.len())]).trim_end_matches('\0').to_string();
    let ver = |x: i32| u32::try_from(x).unwrap_or(0);
    Ok(DrmIdent {
        name: text(&name, v.name_len),
        version: (ver(v.version_major), ver(v.version_minor), ver(v.version_patchlevel)),
        desc: text(&desc, v.desc_len),
    })
}

/// Opens `path` and returns its DRM driver name.
pub fn driver_name_of(path: &Path) -> Result<String, KifError> {
    ident(&open_node(path)?).map(|i| i.name)
}

/// Closes a GEM handle (`DRM_IOCTL_GEM_CLOSE`).
pub fn gem_close(fd: &File, handle: u32) -> Result<(), KifError> {
    let arg = DrmGemClose { handle, pad: 0 };
    // SAFETY: `arg` is a valid drm_gem_close that outlives the call; `fd` is an open DRM fd.
    restart(|| unsafe { sys::drm_gem_close(fd.as_raw_fd(), &arg) })
        .map(|_| ())
        .map_err(|source| KifError::Sys { op: "DRM_IOCTL_GEM_CLOSE", source })
}

/// Nodes `<dir>/<prefix><n>` sorted by `n` (e.g. `/dev/dri`, `card` → card0, card1, …).
/// A missing directory yields an empty list.
pub fn list_nodes(dir: &Path, prefix: &str) -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut nodes: Vec<(u32, PathBuf)> = rd
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name();
            let n = name.to_str()?.strip_prefix(prefix)?.parse::<u32>().ok()?;
            Some((n, e.path()))
        })
        .collect();
    nodes.sort();
    nodes.into_iter().map(|(_, p)| p).collect()
}

/// Converts an `io::Error` from std (open, mmap) into the `nix::Error` that `KifError::Sys` holds.
pub(crate) fn io_to_errno(e: &std::io::Error) -> nix::Error {
    nix::errno::Errno::from_raw(e.raw_os_error().unwrap_or(nix::libc::EIO))
}

/// The first `<dir>/<prefix>*` node whose DRM driver name is `driver`. The error lists what was
/// looked at (node = driver name, or why it could not be asked).
pub fn find_by_driver(dir: &Path, prefix: &str, driver: &str) -> Result<PathBuf, KifError> {
    let nodes = list_nodes(dir, prefix);
    if nodes.is_empty() {
        return Err(KifError::NoDevice(format!("no {}/{prefix}* nodes", dir.display())));
    }
    let mut seen = Vec::new();
    for n in &nodes {
        match driver_name_of(n) {
            Ok(name) if name == driver => return Ok(n.clone()),
            Ok(name) => seen.push(format!("{}={name}", n.display())),
            Err(e) => seen.push(format!("{}: {e}", n.display())),
        }
    }
    Err(KifError::NoDevice(format!("no {}/{prefix}* with DRM driver \"{driver}\" ({})", dir.display(), seen.join(", "))))
}
