//! A 32-bit counter in a shared mapping of a small file, for signals between the processes that
//! share an NPU lock file (the arbiter's "someone is waiting" counter, `crate::route::arbiter`).
//!
//! The first `SharedCounter::LEN` bytes of the file are mapped `MAP_SHARED`; every process that
//! maps the same file sees the same page (page cache), so an atomic on it is an atomic between
//! processes, with no syscall. The file is grown to `LEN` bytes if shorter and never shrunk;
//! nothing else is stored in it (the lock itself is `flock` on the same file).

use std::fs::File;
use std::sync::atomic::AtomicU32;

/// A `u32` at offset 0 of a shared file mapping.
pub struct SharedCounter {
    map: memmap2::MmapMut,
}

impl SharedCounter {
    /// Bytes mapped (and the file's minimum length).
    pub const LEN: u64 = 64;

    /// Maps the counter of `file` (opened read + write), growing the file to [`Self::LEN`] first.
    ///
    /// Errors: the file cannot be grown or mapped (e.g. a filesystem without shared mappings);
    /// the caller then works without the counter.
    pub fn open(file: &File) -> std::io::Result<SharedCounter> {
        if file.metadata()?.len() < Self::LEN {
            // Concurrent growers write the same length; a longer file is left as it is.
            file.set_len(Self::LEN)?;
        }
        // SAFETY: a shared mapping of the first LEN bytes of a file that is at least LEN bytes
        // long and is never shrunk by ork; its bytes are only ever accessed through the atomic
        // returned by `get`, in this and in other processes.
        let map = unsafe { memmap2::MmapOptions::new().len(Self::LEN as usize).map_mut(file)? };
        Ok(SharedCounter { map })
    }

    /// The shared counter.
    pub fn get(&self) -> &AtomicU32 {
        // SAFETY: the mapping is page-aligned (so 4-aligned), at least 4 bytes long and lives as
        // long as `self`; every access to these bytes anywhere is atomic (see `open`).
        unsafe { &*(self.map.as_ptr() as *const AtomicU32) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering::SeqCst;

    #[test]
    fn two_mappings_of_one_file_share_the_counter() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("l");
        let open = || std::fs::OpenOptions::new().create(true).truncate(false).read(true).write(true).open(&p).unwrap();
        let (a, b) = (SharedCounter::open(&open()).unwrap(), SharedCounter::open(&open()).unwrap());
        assert_eq!(a.get().load(SeqCst), 0);
        b.get().fetch_add(3, SeqCst);
        assert_eq!(a.get().load(SeqCst), 3);
        assert_eq!(std::fs::metadata(&p).unwrap().len(), SharedCounter::LEN);
    }
}
