//! Read-only file mappings for weight blobs persisted on disk (the `.orkpack` cache).
//!
//! The one `unsafe` call of the cache lives here, beside the other raw mappings of this module
//! tree: `memmap2::Mmap::map` is unsafe because the bytes of a mapped file can change (or vanish:
//! SIGBUS) under the mapping if another process writes or truncates the file.

use std::fs::File;

/// Maps the whole of `file` read-only (`MAP_SHARED | PROT_READ`), pre-faulted (`MAP_POPULATE`)
/// so the caller's first pass over the bytes does not take one page fault per 4 KiB page.
///
/// The caller must only map files that nobody rewrites in place: the `.orkpack` cache publishes
/// every file whole with `rename(2)` and removes files only with `unlink(2)`, so a mapped file is
/// never modified or truncated by this project (an unlinked file stays valid while mapped).
pub fn map_file_readonly(file: &File) -> std::io::Result<memmap2::Mmap> {
    // SAFETY: see above — cache files are immutable once published (temp file + rename) and are
    // only ever unlinked, never truncated or written in place, by any ggml-ork process. A foreign
    // process truncating a file in the cache directory is outside the cache's contract (the same
    // contract as Mesa's disk cache, which also mmaps its entries).
    unsafe { memmap2::MmapOptions::new().populate().map(file) }
}
