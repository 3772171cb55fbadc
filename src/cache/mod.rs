//! `.orkpack`: packed weights persisted on disk and mapped back.
//!
//! **What it owns.** The on-disk cache of packed weights: one file per weight holding the
//! pre-tiled int8 bytes exactly as `npu::layout::tile_weight` produced them and the per-channel scales,
//! behind a one-page header ([`format`], byte layout in `FORMAT.md`). A cold start packs
//! (dequantize → int8 → tile) and writes the file; a warm start maps the file (`mmap`, through
//! `os::filemap`), checks header and identity ([`PackCache::open`]) and imports the tiles
//! through `Npu::upload_bytes_observed` / `KernelInterface::mem_import_observed`, which copies
//! them once into device memory (no kernel interface here can map file pages into the NPU; see
//! `kif::rknpu`'s "Import" note) and hands each piece of the device copy to the payload checksum
//! right after copying it; the entry counts only if the checksum matches ([`Unverified::accept`]),
//! otherwise the imported buffers are freed and the weight is repacked. The payload is read once.
//!
//! **Discipline: Mesa's `disk_cache`** (house style §6, design.md):
//! * The key hashes everything that changes the bytes ([`Identity`]): the source bytes
//!   themselves (chunked xxh3-128), ggml type, shape, row size, tensor name, the SoC, and two
//!   fingerprints of the code that makes the bytes. The C predecessor keyed by name and shape
//!   only, so two models with equal shapes silently shared packed weights; here a different
//!   source is a different file, and the header repeats the whole identity so a file found
//!   under a key is checked field by field, not trusted for its name.
//! * **Version by fingerprint.** A stale cache must never survive a change of tiling or
//!   quantization. Besides the container version ([`format::CONTAINER_VERSION`]), the header
//!   carries [`layout_fingerprint`] (a hash of `npu::layout::tile_weight`'s output on fixed probe
//!   weights that cross the K-slice and N-slice boundaries; it runs the same block tiler that
//!   the packer uses) and [`quant_fingerprint`] (the same for the weight quantization rule —
//!   `pack::quantize_source` and `quantize_residual`, plus `QMAX` / `ABSMAX_FLOOR` — with
//!   the fused packer `pack::pack_source` checked against it on the probe: should the two
//!   ever differ, the fused output joins the hash). They are derived from the code
//!   at run time, so nobody has to remember to bump a constant (the reference implementation's
//!   `ORK_PACK_FORMAT_VERSION`, rknpu-facts §7.2, relied on that). Cost: ~0.5 ms once per SoC.
//! * Files are written to a temporary name in the same directory and published with
//!   `rename(2)`: readers see a whole file or none, and two processes writing the same entry both
//!   publish a complete, identical file (last rename wins). No fsync: a file torn by a power cut
//!   fails its checksum and is a miss.
//! * **Any failure is a miss**: a missing, short, damaged, foreign or stale file makes
//!   [`PackCache::load`] return an error that the caller logs at debug level and then repacks
//!   (and rewrites). Nothing here panics on file contents (the parser is fuzzed), and writing
//!   errors never fail a load.
//! * **Size limit, LRU.** A hit sets the file's mtime to now (atime is unreliable under
//!   `noatime`/`relatime`); when a store would take the directory past the limit
//!   (`ORK_CACHE_MAX_MB`) or leave less than [`DISK_RESERVE_BYTES`] free on its filesystem, the
//!   oldest-mtime files are removed (for the limit until it is at 90 % of it) — but never
//!   entries in use (mtime since shortly before this process opened the cache), and nothing at
//!   all when that would not be enough: then the entry is not written ([`CacheError::Full`],
//!   [`CacheError::DiskFull`]), nor any later one of this process, so a model larger than the
//!   room keeps a stable cached prefix (in load order) instead of evicting its own first
//!   weights at every start. The directory size is scanned once per process and then tracked;
//!   other processes' writes are seen at the next scan. Removing a file another process has
//!   mapped is safe (unlink keeps the mapping valid).
//!
//! **Hash choice: XXH3 (`twox-hash`).** The source hash reads every weight byte at load
//! (hundreds of MB), so it must run near memory bandwidth: XXH3 does, and `twox-hash` picks its
//! SIMD kernel at run time (NEON on aarch64, AVX2 or SSE2 on x86-64; a crate that picks it at
//! build time runs the SSE2 kernel in a generic x86-64 build: 24 against 34–36 GB/s on a 256 KiB
//! piece in cache here, 5.2–6.0 against 7.3–7.5 GB/s from memory). It is pure Rust with no
//! build script, and hashing 1 MiB chunks on all cores and combining their digests keeps a warm
//! load short. A cryptographic hash (BLAKE3) would buy collision resistance
//! against an attacker who can write the cache directory — who could equally replace the plugin
//! — at several times the cost on the board's CPUs. 128 bits make accidental collisions moot.
//!
//! **Location**: `ORK_CACHE_DIR`, else `$XDG_CACHE_HOME/ggml-ork`, else `$HOME/.cache/ggml-ork`;
//! entries fan out as `<dir>/<2 hex>/<30 hex>.orkpack` like Mesa's. `ORK_CACHE=0` disables.

pub mod calib;
pub mod format;

use crate::config::Config;
use crate::npu::soc::{SocDesc, SocId};
use format::{FormatError, Header, QuantParams};
pub use format::Identity;
use std::fs::{self, File};
use std::hash::Hasher as _;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering::Relaxed};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime};

/// File name extension of cache entries.
pub const EXT: &str = "orkpack";
/// Default `ORK_CACHE_MAX_MB`.
/// Temporary files older than this are leftovers of a crashed writer and are removed by eviction.
const STALE_TMP: Duration = Duration::from_secs(3600);
/// Eviction brings the directory down to this fraction of the limit (hysteresis).
const EVICT_TARGET_PERCENT: u64 = 90;
/// Entries touched since this long before a cache was opened count as in use and are never
/// evicted by its stores (covers filesystems whose timestamps are coarse, e.g. FAT's 2 s, and
/// the kernel's coarse clock lagging `SystemTime::now`).
const IN_USE_MARGIN: Duration = Duration::from_secs(2);
/// A store never leaves less free space than this on the cache's filesystem.
pub const DISK_RESERVE_BYTES: u64 = 1 << 30;
/// `PackCache::refusal` values.
const REFUSED_FULL: u8 = 1;
const REFUSED_DISK: u8 = 2;

/// Bytes available to this user on the filesystem of `dir` (None when it cannot say).
fn disk_available(dir: &Path) -> Option<u64> {
    let st = nix::sys::statvfs::statvfs(dir).ok()?;
    // fsblkcnt_t / c_ulong: u64 on the 64-bit targets, narrower elsewhere.
    #[allow(clippy::unnecessary_cast)]
    Some((st.blocks_available() as u64).saturating_mul(st.fragment_size() as u64))
}

/// Why a cache operation did not produce a file. On load every one of these is a miss.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    #[error("orkpack load: no entry")]
    Absent,
    #[error("orkpack {op} {path}: {source}")]
    Io { op: &'static str, path: PathBuf, source: io::Error },
    #[error("orkpack load {path}: {source}")]
    Format { path: PathBuf, source: FormatError },
    #[error("orkpack load {path}: {field} differs from the weight being loaded")]
    Mismatch { path: PathBuf, field: &'static str },
    #[error("orkpack store: {bytes} bytes exceed the cache limit of {limit} bytes")]
    TooBig { bytes: u64, limit: u64 },
    /// The entry would fit the limit only by evicting entries in use (touched by this process,
    /// or by another one since shortly before this cache was opened): not written, so a model
    /// larger than the limit keeps a stable cached part instead of evicting its own first
    /// weights at every start.
    #[error("orkpack store: cache full ({used} of {limit} bytes hold entries in use; {bytes} more do not fit)")]
    Full { bytes: u64, used: u64, limit: u64 },
    /// Writing the entry would leave less than [`DISK_RESERVE_BYTES`] free on the filesystem.
    #[error("orkpack store: {avail} bytes free on the cache's filesystem; writing {bytes} would leave less than {reserve}")]
    DiskFull { bytes: u64, avail: u64, reserve: u64 },
}

fn io_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> CacheError + 'a {
    move |source| CacheError::Io { op, path: path.to_owned(), source }
}

/// The cache directory from the environment values: `ORK_CACHE_DIR`, else
/// `$XDG_CACHE_HOME/ggml-ork`, else `$HOME/.cache/ggml-ork`. Empty or relative XDG values are
/// ignored (XDG base-directory spec).
pub fn resolve_dir(cache_dir: Option<&str>, xdg_cache_home: Option<&str>, home: Option<&str>) -> Option<PathBuf> {
    if let Some(d) = cache_dir.filter(|d| !d.trim().is_empty()) {
        return Some(PathBuf::from(d));
    }
    if let Some(x) = xdg_cache_home.filter(|x| Path::new(x).is_absolute()) {
        return Some(Path::new(x).join("ggml-ork"));
    }
    home.filter(|h| !h.is_empty()).map(|h| Path::new(h).join(".cache").join("ggml-ork"))
}

/// Fingerprint of the NPU tile layout on `soc`: xxh3 of `npu::layout::tile_weight` applied to fixed
/// probe weights (one crossing the K-slice boundary with a full-K companion, one crossing the
/// N-slice boundary), together with their shapes. Any change of tiling changes it.
pub fn layout_fingerprint(soc: &SocDesc) -> u64 {
    static FP: [OnceLock<u64>; 2] = [OnceLock::new(), OnceLock::new()];
    let slot = match soc.id {
        SocId::Rk3588 => 0,
        SocId::Rk3576 => 1,
    };
    // Only SocDesc::get(id) descriptors are used in practice; a hand-edited descriptor with the
    // same id would share the slot, so compute uncached for anything that differs from it.
    if *soc != SocDesc::get(soc.id) {
        return compute_layout_fingerprint(soc);
    }
    *FP[slot].get_or_init(|| compute_layout_fingerprint(soc))
}

fn probe_i8(len: usize, seed: u32) -> Vec<i8> {
    let mut x = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            (x >> 24) as u8 as i8
        })
        .collect()
}

fn compute_layout_fingerprint(soc: &SocDesc) -> u64 {
    let k_slice = soc.k_slice.max(32) as usize;
    let n_max = soc.n_max_per_program.max(32) as usize;
    let probes = [(64usize, 2 * k_slice + 32), (n_max + 32, 32usize)];
    let mut h = twox_hash::XxHash3_64::new();
    h.write(soc.id.name().as_bytes());
    for (i, &(n, k)) in probes.iter().enumerate() {
        h.write(&(n as u64).to_le_bytes());
        h.write(&(k as u64).to_le_bytes());
        match crate::npu::layout::tile_weight(soc, &probe_i8(n * k, i as u32 + 1), n, k) {
            Ok(t) => {
                h.write(&(t.bytes.len() as u64).to_le_bytes());
                h.write(&t.bytes);
            }
            Err(e) => h.write(e.to_string().as_bytes()),
        }
    }
    h.finish()
}

/// [`layout_fingerprint`] of blobs holding only the tile sets `sets`: the same value for
/// `TileSets::Both` (entries of weights with both sets keep their identity), else a hash of it
/// with the probe tiled that way, so an entry holds one layout only.
pub fn layout_fingerprint_sets(soc: &SocDesc, sets: crate::npu::layout::TileSets) -> u64 {
    use crate::npu::layout::TileSets;
    let base = layout_fingerprint(soc);
    if sets == TileSets::Both {
        return base;
    }
    let (n, k) = (64usize, 2 * soc.k_slice.max(32) as usize + 32);
    let mut h = twox_hash::XxHash3_64::new();
    h.write(&base.to_le_bytes());
    h.write(format!("{sets:?}").as_bytes());
    match crate::npu::layout::tile_weight_sets(soc, &probe_i8(n * k, 7), n, k, sets) {
        Ok(t) => h.write(&t.bytes),
        Err(e) => h.write(e.to_string().as_bytes()),
    }
    h.finish()
}

/// Fingerprint of the weight quantization rule: xxh3 of what `pack::quantize_source` and
/// `quantize_residual` give on fixed probe rows (ties, zeros, outliers, tiny values) and of the
/// quantizer's constants; the fused packer is checked against them on the same rows (see
/// [`fused_probe_difference`]).
pub fn quant_fingerprint() -> u64 {
    static FP: OnceLock<u64> = OnceLock::new();
    *FP.get_or_init(|| {
        const N: usize = 8;
        const K: usize = 64;
        let rows: Vec<f32> = (0..N * K)
            .map(|i| {
                let (r, c) = (i / K, i % K);
                match r {
                    0 => 0.0,
                    1 => (c as f32 - 32.0) * 0.5, // exact .5 ties after scaling
                    2 => if c == 7 { 1000.0 } else { (c as f32).sin() },
                    3 => 1e-12 * c as f32,
                    _ => ((c * 31 + r * 17) % 97) as f32 / 13.0 - 3.5,
                }
            })
            .collect();
        // The whole weight pipeline: column equalisation, per-channel int8, and the residual term.
        let bytes: &[u8] = bytemuck::cast_slice(&rows);
        let to_float = |b: &[u8], out: &mut [f32]| {
            for (o, c) in out.iter_mut().zip(b.chunks_exact(4)) {
                *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        };
        let src = crate::pack::WeightSource { name: "", ggml_type: 0, bytes, row_bytes: K * 4, to_float: &to_float };
        let (q, s, col) = crate::pack::quantize_source(&src, N, K, None);
        let (ql, sl) = crate::pack::quantize_residual(&src, N, K, None, &col, &q, &s);
        let mut h = twox_hash::XxHash3_64::new();
        h.write(bytemuck::cast_slice(&ql));
        for v in col.iter().chain(sl.iter()) {
            h.write(&v.to_bits().to_le_bytes());
        }
        h.write(&crate::quant::QMAX.to_bits().to_le_bytes());
        h.write(&crate::quant::ABSMAX_FLOOR.to_bits().to_le_bytes());
        h.write(bytemuck::cast_slice(&q));
        for v in &s {
            h.write(&v.to_bits().to_le_bytes());
        }
        // The backend writes entries through the fused packer (`pack::pack_source`), which
        // must give exactly these bytes (tested). Should it ever differ, its output joins the
        // hash, so that entries made by one rule are never taken for the other's; while they
        // agree, nothing is added and existing caches keep their fingerprint.
        if let Some(fused) = fused_probe_difference(&src, N, K) {
            h.write(&fused);
        }
        h.finish()
    })
}

/// The quantization rule's fingerprint for weights packed through the rotation `rot`
/// (`quant_fingerprint` itself without one): it adds the rotation (its construction, and its
/// output bits on a fixed probe row of length K, so a changed kernel or construction never takes
/// another's entries) and the rotated rule's tag (no column equalisation).
pub fn quant_fingerprint_for(rot: Option<&crate::quant::rotate::Rotation>) -> u64 {
    let Some(rot) = rot else { return quant_fingerprint() };
    static FP: Mutex<Vec<(usize, u64)>> = Mutex::new(Vec::new());
    let mut memo = FP.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(&(_, fp)) = memo.iter().find(|(k, _)| *k == rot.k()) {
        return fp;
    }
    let mut probe: Vec<f32> = (0..rot.k()).map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0).collect();
    probe[rot.k() / 3] = 1000.0;
    rot.apply_row(&mut probe);
    let mut h = twox_hash::XxHash3_64::new();
    h.write(&quant_fingerprint().to_le_bytes());
    h.write(b"rotated, no column equalisation");
    h.write(rot.describe().as_bytes());
    for v in &probe {
        h.write(&v.to_bits().to_le_bytes());
    }
    let fp = h.finish();
    memo.push((rot.k(), fp));
    fp
}

/// The fused packer's result on the quantization probe (its `n` rows repeated to one 32-row
/// block, on the RK3588 layout) when it differs from the reference steps on the same block
/// (`quantize_source`, `quantize_residual`, each term tiled by `npu::layout::tile_weight`); `None` when
/// they agree.
fn fused_probe_difference(src: &crate::pack::WeightSource<'_>, n: usize, k: usize) -> Option<Vec<u8>> {
    use crate::pack::{pack_source, quantize_residual, quantize_source};
    const ROWS: usize = crate::npu::layout::BLOCK;
    let soc = SocDesc::get(SocId::Rk3588);
    let bytes: Vec<u8> = (0..ROWS).flat_map(|r| src.row(r % n).iter().copied()).collect();
    let block = crate::pack::WeightSource { bytes: &bytes, ..*src };
    let f32s = |v: &[f32]| v.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect::<Vec<u8>>();
    let p = match pack_source(&soc, &block, ROWS, k, 2, None) {
        Ok(p) => p,
        Err(e) => return Some(e.to_string().into_bytes()),
    };
    let (q, s, col) = quantize_source(&block, ROWS, k, None);
    let (ql, sl) = quantize_residual(&block, ROWS, k, None, &col, &q, &s);
    let tiled = |q: &[i8]| crate::npu::layout::tile_weight(&soc, q, ROWS, k).map(|t| t.bytes).unwrap_or_default();
    let same = p.tiles.len() == 2
        && p.tiles[0].bytes == tiled(&q)
        && p.tiles[1].bytes == tiled(&ql)
        && f32s(&p.scales) == f32s(&s)
        && f32s(&p.col_scale) == f32s(&col)
        && f32s(&p.lo_scales) == f32s(&sl);
    if same {
        return None;
    }
    let mut out: Vec<u8> = p.tiles.iter().flat_map(|t| t.bytes.iter().copied()).collect();
    for v in [&p.scales, &p.col_scale, &p.lo_scales] {
        out.extend(f32s(v));
    }
    Some(out)
}

/// The quantization parameters recorded in headers.
pub fn quant_params() -> QuantParams {
    QuantParams { qmax: crate::quant::QMAX, absmax_floor: crate::quant::ABSMAX_FLOOR }
}

/// The identity (cache key) of weight `[N, K]` of ggml type `ggml_type` with source bytes
/// `src_bytes` (`row_bytes` per row), named `name`, packed for `soc`. Hashes `src_bytes` on all
/// cores.
/// `weight_terms`: int8 terms per weight (1, or 2 for float sources); it changes the payload.
#[allow(clippy::too_many_arguments)]
pub fn identity(
    soc: &SocDesc,
    ggml_type: u32,
    src_bytes: &[u8],
    row_bytes: usize,
    name: &str,
    n: usize,
    k: usize,
    weight_terms: u32,
    rot: Option<&crate::quant::rotate::Rotation>,
) -> Identity {
    Identity {
        layout_fp: layout_fingerprint(soc),
        quant_fp: quant_fingerprint_for(rot),
        weight_terms,
        soc: soc.id.name().to_owned(),
        src_hash: format::par_hash(src_bytes),
        ggml_type,
        n: n as u64,
        k: k as u64,
        row_bytes: row_bytes as u64,
        src_bytes: src_bytes.len() as u64,
        name: name.to_owned(),
    }
    .normalized()
}

/// A validated, mapped cache entry.
pub struct Loaded {
    map: memmap2::Mmap,
    header: Header,
    path: PathBuf,
}

impl Loaded {
    /// The pre-tiled weight bytes, as `npu::layout::tile_weight` made them.
    pub fn tiles(&self) -> &[u8] {
        format::tiles(&self.header, &self.map)
    }
    /// The per-output-channel scales, `[N] f32`.
    pub fn scales(&self) -> Vec<f32> {
        format::scales(&self.header, &self.map)
    }
    pub fn header(&self) -> &Header {
        &self.header
    }
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// A mapped entry whose header, identity and length are checked but whose payload checksum is
/// not yet: only [`Unverified::verify`] or [`Unverified::accept`] turn it into a [`Loaded`].
///
/// `accept` exists for the fused hit path: the caller imports the tiles into device memory,
/// hashes each piece of the device copy as it lands ([`format::StreamHash`]: tiles, then
/// [`Unverified::tail`]), and hands the hash over; the entry counts only if it equals the
/// header's, and the caller frees what it imported otherwise. The payload is then read once
/// instead of twice (verify, then copy).
pub struct Unverified {
    loaded: Loaded,
    file: File,
}

impl Unverified {
    /// The tiles, unverified.
    pub fn tiles(&self) -> &[u8] {
        self.loaded.tiles()
    }
    /// The payload after the tiles (padding, then the scales), unverified.
    pub fn tail(&self) -> &[u8] {
        let h = &self.loaded.header;
        &self.loaded.map[(h.tiles_off + h.tiles_bytes) as usize..h.file_bytes as usize]
    }
    pub fn header(&self) -> &Header {
        &self.loaded.header
    }
    pub fn path(&self) -> &Path {
        &self.loaded.path
    }

    /// Verifies the payload checksum over the mapped file (all cores).
    pub fn verify(self) -> Result<Loaded, CacheError> {
        let hash = format::par_hash(&self.loaded.map[format::HEADER_BYTES..]);
        self.accept(hash)
    }

    /// Accepts the entry if `payload_hash` — [`format::par_hash`] of the payload (tiles, then
    /// [`Unverified::tail`]) as the caller read it — equals the header's. On success the file's
    /// mtime is set to now (LRU).
    pub fn accept(self, payload_hash: u128) -> Result<Loaded, CacheError> {
        if payload_hash != self.loaded.header.payload_hash {
            return Err(CacheError::Format { path: self.loaded.path, source: FormatError::PayloadChecksum });
        }
        // UTIME_NOW needs write permission only (an explicit time needs ownership), so hits in
        // a cache directory shared by several users also mark their entries in use.
        use std::os::fd::AsRawFd;
        let (omit, now) = (nix::sys::time::TimeSpec::UTIME_OMIT, nix::sys::time::TimeSpec::UTIME_NOW);
        if let Err(e) = nix::sys::stat::futimens(self.file.as_raw_fd(), &omit, &now) {
            log::trace!("orkpack: cannot update mtime of {}: {e}", self.loaded.path.display());
        }
        Ok(self.loaded)
    }
}

/// Which identity field differs (for the debug line), if any.
fn first_difference(a: &Identity, b: &Identity) -> Option<&'static str> {
    [
        (a.layout_fp != b.layout_fp, "layout fingerprint"),
        (a.quant_fp != b.quant_fp, "quantization fingerprint"),
        (a.soc != b.soc, "SoC"),
        (a.src_hash != b.src_hash, "source hash"),
        (a.ggml_type != b.ggml_type, "ggml type"),
        (a.n != b.n || a.k != b.k, "shape"),
        (a.row_bytes != b.row_bytes || a.src_bytes != b.src_bytes, "source size"),
        (a.name != b.name, "tensor name"),
    ]
    .into_iter()
    .find_map(|(differs, what)| differs.then_some(what))
}

/// A cache directory with a size limit.
pub struct PackCache {
    dir: PathBuf,
    max_bytes: u64,
    /// Bytes in the directory as last scanned plus what this process stored since (None until
    /// the first store).
    size_bytes: Mutex<Option<u64>>,
    /// Entries with an mtime from here on are in use (see [`CacheError::Full`]).
    in_use_since: SystemTime,
    /// Why stores are refused from now on (0 = they are not; see [`PackCache::make_room`]).
    refusal: AtomicU8,
    /// Whether the one warning about a full cache, disk or I/O error was printed, and the one
    /// about entries larger than the whole limit.
    warned_full: AtomicBool,
    warned_too_big: AtomicBool,
    /// Write entries with `O_DIRECT` where the filesystem takes it ([`write_direct`];
    /// `ORK_CACHE_DIRECT`, default on).
    direct: bool,
    /// Free bytes a store leaves on the filesystem ([`DISK_RESERVE_BYTES`] unless a test says).
    reserve: u64,
}

/// Distinguishes temporary files of threads in one process.
static TMP_SEQ: AtomicU64 = AtomicU64::new(0);

/// Pieces of an entry written with `O_DIRECT` ([`write_direct`]), and their alignment (file
/// offsets, lengths and the buffer's address: the logical block size of every common device
/// divides it). 16 MiB writes: `dd oflag=direct` of 1 GiB on the shared builder ran at 666,
/// 757 and 932 MB/s with 1, 4 and 16 MiB blocks. Copied and hashed [`DIRECT_HASH_PIECE`] at a
/// time, so the hash reads each piece while it is still in the CPU cache.
const DIRECT_CHUNK_BYTES: usize = 16 << 20;
const DIRECT_HASH_PIECE: usize = 256 << 10;
const DIRECT_ALIGN: usize = 4096;

thread_local! {
    /// Each writing thread's bounce buffer for [`write_direct`], allocated once.
    static DIRECT_BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Writes an entry to `tmp` with `O_DIRECT`, the payload hashed in the same pass: each piece of
/// the tiles and of what follows them is copied into an aligned bounce buffer (it stays in the
/// CPU cache), hashed there, and written from it straight to the device; the header page, which
/// holds the hash, is written last at offset 0, and the file cut to its length. Nothing goes
/// through the page cache: no page-cache pages allocated and filled per written byte (on the
/// shared builder a buffered write ran at 274 MB/s where `O_DIRECT` ran at 1.4 GB/s, `dd` of
/// 1 GiB), and on a board the first run's hundreds of MB to GB of tiles do not push the model's
/// own mapped pages out of RAM. `Ok(false)` when the filesystem refuses `O_DIRECT` (tmpfs,
/// EINVAL) or an alignment: the caller writes the file buffered instead.
#[cfg(target_os = "linux")]
fn write_direct(tmp: &Path, id: &Identity, tiles: &[u8], scales: &[f32]) -> io::Result<bool> {
    use std::os::unix::fs::{FileExt, OpenOptionsExt};
    let einval = |e: &io::Error| e.raw_os_error() == Some(nix::libc::EINVAL);
    let f = match fs::OpenOptions::new().write(true).create(true).truncate(true).custom_flags(nix::libc::O_DIRECT).open(tmp) {
        Ok(f) => f,
        Err(e) if einval(&e) => return Ok(false),
        Err(e) => return Err(e),
    };
    let after = format::after_tiles(tiles.len(), scales);
    let (_, file_bytes) = format::layout(tiles.len(), scales.len());
    DIRECT_BUF.with(|cell| {
        let mut v = cell.borrow_mut();
        if v.len() < DIRECT_CHUNK_BYTES + DIRECT_ALIGN {
            *v = vec![0u8; DIRECT_CHUNK_BYTES + DIRECT_ALIGN];
        }
        let start = v.as_ptr().align_offset(DIRECT_ALIGN);
        let buf = &mut v[start..start + DIRECT_CHUNK_BYTES];
        let put = |buf: &[u8], off: usize| match f.write_all_at(buf, off as u64) {
            Ok(()) => Ok(true),
            Err(e) if einval(&e) => Ok(false),
            Err(e) => Err(e),
        };
        let mut hash = format::StreamHash::new();
        let (mut off, mut fill) = (format::HEADER_BYTES, 0);
        for mut src in [tiles, &after[..]] {
            while !src.is_empty() {
                let take = (DIRECT_CHUNK_BYTES - fill).min(src.len()).min(DIRECT_HASH_PIECE);
                buf[fill..fill + take].copy_from_slice(&src[..take]);
                hash.update(&buf[fill..fill + take]);
                (fill, src) = (fill + take, &src[take..]);
                if fill == DIRECT_CHUNK_BYTES {
                    if !put(buf, off)? {
                        return Ok(false);
                    }
                    (off, fill) = (off + fill, 0);
                }
            }
        }
        if fill > 0 {
            let end = fill.next_multiple_of(DIRECT_ALIGN);
            buf[fill..end].fill(0);
            if !put(&buf[..end], off)? {
                return Ok(false);
            }
        }
        let h = format::header_with_hash(id, quant_params(), tiles.len(), scales.len(), hash.finish());
        buf[..format::HEADER_BYTES].copy_from_slice(&h[..]);
        if !put(&buf[..format::HEADER_BYTES], 0)? {
            return Ok(false);
        }
        f.set_len(file_bytes as u64)?;
        Ok(true)
    })
}

impl PackCache {
    /// This cache writing its entries with `O_DIRECT` (`true`, the default) or buffered.
    pub fn with_direct(self, direct: bool) -> PackCache {
        PackCache { direct, ..self }
    }

    /// This cache leaving `bytes` free on its filesystem instead of [`DISK_RESERVE_BYTES`]
    /// (tests: a store checked on a nearly full disk, or a refusal made certain).
    pub fn with_disk_reserve(self, bytes: u64) -> PackCache {
        PackCache { reserve: bytes, ..self }
    }

    pub fn new(dir: impl Into<PathBuf>, max_bytes: u64) -> PackCache {
        let now = SystemTime::now();
        PackCache {
            dir: dir.into(),
            max_bytes,
            size_bytes: Mutex::new(None),
            in_use_since: now.checked_sub(IN_USE_MARGIN).unwrap_or(now),
            refusal: AtomicU8::new(0),
            warned_full: AtomicBool::new(false),
            warned_too_big: AtomicBool::new(false),
            direct: true,
            reserve: DISK_RESERVE_BYTES,
        }
    }

    /// The cache the configuration asks for: None when `ORK_CACHE=0` or no directory resolves.
    pub fn from_config(cfg: &Config) -> Option<PackCache> {
        if !cfg.cache_enabled {
            return None;
        }
        let Some(dir) = resolve_dir(cfg.cache_dir.as_deref(), cfg.xdg_cache_home.as_deref(), cfg.home.as_deref()) else {
            log::debug!("orkpack cache off: no ORK_CACHE_DIR, XDG_CACHE_HOME or HOME");
            return None;
        };
        Some(PackCache::new(dir, cfg.cache_max_mb.saturating_mul(1 << 20)).with_direct(cfg.cache_direct))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn max_bytes(&self) -> u64 {
        self.max_bytes
    }

    /// Where the entry for `id` lives: `<dir>/<2 hex>/<30 hex>.orkpack`, from xxh3-128 of the
    /// identity's canonical bytes.
    pub fn path_for(&self, id: &Identity) -> PathBuf {
        let hex = format!("{:032x}", twox_hash::XxHash3_128::oneshot(&id.encode()));
        self.dir.join(&hex[..2]).join(format!("{}.{EXT}", &hex[2..]))
    }

    /// Maps and validates the entry for `id`: header, identity (field by field), length and
    /// payload checksum. On success the file's mtime is set to now (LRU).
    pub fn load(&self, id: &Identity) -> Result<Loaded, CacheError> {
        self.open(id)?.verify()
    }

    /// Maps the entry for `id` and checks everything but the payload checksum: header, identity
    /// (field by field) and file length. See [`Unverified`].
    pub fn open(&self, id: &Identity) -> Result<Unverified, CacheError> {
        let path = self.path_for(id);
        // Only a regular file (or a link to one) is an entry: opening a FIFO or a device would
        // block or read forever.
        match std::fs::metadata(&path) {
            Ok(m) if m.is_file() => {}
            Ok(_) => return Err(CacheError::Io { op: "open", path, source: io::Error::new(io::ErrorKind::InvalidInput, "not a regular file") }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(CacheError::Absent),
            Err(e) => return Err(io_err("stat", &path)(e)),
        }
        let file = match File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(CacheError::Absent),
            Err(e) => return Err(io_err("open", &path)(e)),
        };
        let map = crate::os::filemap::map_file_readonly(&file).map_err(io_err("mmap", &path))?;
        let header = format::parse_header(&map).map_err(|source| CacheError::Format { path: path.clone(), source })?;
        if let Some(field) = first_difference(&header.id, &id.normalized()) {
            return Err(CacheError::Mismatch { path, field });
        }
        format::check_length(&header, &map).map_err(|source| CacheError::Format { path: path.clone(), source })?;
        Ok(Unverified { loaded: Loaded { map, header, path }, file })
    }

    /// Writes the entry for `id` (temporary file, then rename) after making room for it: when
    /// the directory would go past the limit, least-recently-used entries not in use are
    /// evicted first; if that is not enough the entry is not written ([`CacheError::Full`]),
    /// nor when the filesystem would be left with less than [`DISK_RESERVE_BYTES`] free
    /// ([`CacheError::DiskFull`]). Returns the entry's path.
    pub fn store(&self, id: &Identity, tiles: &[u8], scales: &[f32]) -> Result<PathBuf, CacheError> {
        let path = self.path_for(id);
        let want = format::scale_count(id.n as usize, id.k as usize, id.weight_terms);
        if scales.len() != want {
            return Err(CacheError::Io {
                op: "store",
                path,
                source: std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("{} scale values, the format needs {want}", scales.len())),
            });
        }
        let bytes = format::layout(tiles.len(), scales.len()).1 as u64;
        if bytes > self.max_bytes {
            let e = CacheError::TooBig { bytes, limit: self.max_bytes };
            self.warn_once(&self.warned_too_big, &format!("{e} (ORK_CACHE_MAX_MB): weights this large are not cached and are packed again at every start"));
            return Err(e);
        }
        let parent = path.parent().expect("entry paths have a fan-out directory");
        let r = fs::create_dir_all(parent).map_err(io_err("mkdir", parent)).and_then(|_| self.make_room(parent, bytes));
        r.and_then(|_| self.write_entry(id, &path, parent, bytes, tiles, scales)).inspect_err(|e| {
            // An unwritable directory or a failing disk: one warning (room refusals warn in make_room).
            if let CacheError::Io { .. } = e {
                self.warn_once(&self.warned_full, &format!("orkpack cache not written: {e}; weights not cached are packed again at the next start"));
            }
        })
    }

    /// Writes a temporary file in `parent` and renames it to `path` (room already made).
    fn write_entry(&self, id: &Identity, path: &Path, parent: &Path, bytes: u64, tiles: &[u8], scales: &[f32]) -> Result<PathBuf, CacheError> {
        // Same directory as the target, so rename(2) is atomic; unique per process and thread.
        let tmp = parent.join(format!(
            ".{}.tmp.{}.{}",
            path.file_name().and_then(|f| f.to_str()).unwrap_or("entry"),
            std::process::id(),
            TMP_SEQ.fetch_add(1, Relaxed)
        ));
        let write = || -> io::Result<()> {
            #[cfg(target_os = "linux")]
            if self.direct && write_direct(&tmp, &id.normalized(), tiles, scales)? {
                return Ok(());
            }
            let mut w = BufWriter::with_capacity(1 << 20, File::create(&tmp)?);
            format::write_file(&mut w, &id.normalized(), quant_params(), tiles, scales)?;
            w.flush()
        };
        if let Err(e) = write() {
            let _ = fs::remove_file(&tmp);
            return Err(io_err("write", &tmp)(e));
        }
        if let Err(e) = fs::rename(&tmp, path) {
            let _ = fs::remove_file(&tmp);
            return Err(io_err("rename", path)(e));
        }
        if let Some(s) = self.size_bytes.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
            *s += bytes;
        }
        Ok(path.to_owned())
    }

    /// Room for `bytes` more: under the limit, and leaving [`DISK_RESERVE_BYTES`] free on the
    /// filesystem. When either needs it, least-recently-used entries not in use are evicted
    /// (for the limit down to 90 % of it: hysteresis) — but only when evicting them all would
    /// be enough; otherwise nothing is removed and the store is refused (`Full` / `DiskFull`).
    /// A refusal is final for this process: every later store is refused too, so the cached
    /// part of a model larger than the room stays a prefix in load order, which the next start
    /// hits (touching it into use) before it stores anything — no churn from start to start.
    fn make_room(&self, dir: &Path, bytes: u64) -> Result<(), CacheError> {
        let mut size = self.size_bytes.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = self.refused(bytes, *size) {
            return Err(e);
        }
        let total = *size.get_or_insert_with(|| self.scan().iter().map(|e| e.bytes).sum());
        let over = (total + bytes).saturating_sub(self.max_bytes);
        let avail = disk_available(dir);
        let disk_short = avail.map_or(0, |a| bytes.saturating_add(self.reserve).saturating_sub(a));
        if over == 0 && disk_short == 0 {
            return Ok(());
        }
        let (total, candidates) = self.eviction_candidates(self.in_use_since);
        let evictable: u64 = candidates.iter().map(|e| e.bytes).sum();
        if evictable < over.max(disk_short) {
            *size = Some(total);
            let e = if over > 0 {
                CacheError::Full { bytes, used: total, limit: self.max_bytes }
            } else {
                CacheError::DiskFull { bytes, avail: avail.unwrap_or(0), reserve: self.reserve }
            };
            self.refuse(&e);
            return Err(e);
        }
        let mut target = total - disk_short;
        if over > 0 {
            target = target.min((self.max_bytes / 100 * EVICT_TARGET_PERCENT).saturating_sub(bytes));
        }
        *size = Some(self.remove_until(total, candidates, target));
        Ok(())
    }

    /// The error of an earlier refusal in this process, if any (see [`Self::make_room`]).
    fn refused(&self, bytes: u64, size: Option<u64>) -> Option<CacheError> {
        match self.refusal.load(Relaxed) {
            REFUSED_FULL => Some(CacheError::Full { bytes, used: size.unwrap_or(0), limit: self.max_bytes }),
            REFUSED_DISK => Some(CacheError::DiskFull { bytes, avail: disk_available(&self.dir).unwrap_or(0), reserve: self.reserve }),
            _ => None,
        }
    }

    /// Records a refusal and prints the one warning about it.
    fn refuse(&self, e: &CacheError) {
        let msg = match e {
            CacheError::Full { used, limit, .. } => {
                self.refusal.store(REFUSED_FULL, Relaxed);
                format!(
                    "orkpack cache full: {} MB of ORK_CACHE_MAX_MB={} hold weights in use; weights packed from now on are not cached \
                     and are packed again at the next start (the packed model needs about 2 bytes per weight: raise ORK_CACHE_MAX_MB)",
                    used >> 20,
                    limit >> 20
                )
            }
            _ => {
                self.refusal.store(REFUSED_DISK, Relaxed);
                format!(
                    "orkpack cache not written: {e}; weights packed from now on are not cached and are packed again at the next \
                     start (free space, set ORK_CACHE_DIR elsewhere, or ORK_CACHE=0)"
                )
            }
        };
        self.warn_once(&self.warned_full, &msg);
    }

    /// One warning per process and kind (`flag`) about entries not written; debug lines after.
    fn warn_once(&self, flag: &AtomicBool, msg: &str) {
        crate::logging::warn_first(!flag.swap(true, Relaxed), msg, "");
    }

    /// Every entry and temporary file in the directory.
    fn scan(&self) -> Vec<DirEntryInfo> {
        let mut out = Vec::new();
        let Ok(top) = fs::read_dir(&self.dir) else { return out };
        for sub in top.flatten() {
            let sub_path = sub.path();
            let is_fanout = sub.file_name().to_str().is_some_and(|s| s.len() == 2 && s.bytes().all(|b| b.is_ascii_hexdigit()));
            if !is_fanout || !sub_path.is_dir() {
                continue;
            }
            let Ok(files) = fs::read_dir(&sub_path) else { continue };
            for f in files.flatten() {
                let name = f.file_name();
                let Some(name) = name.to_str() else { continue };
                let tmp = name.starts_with('.') && name.contains(".tmp.");
                if !tmp && !name.ends_with(EXT) {
                    continue;
                }
                let Ok(md) = f.metadata() else { continue };
                out.push(DirEntryInfo {
                    path: f.path(),
                    bytes: md.len(),
                    mtime: md.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                    tmp,
                });
            }
        }
        out
    }

    /// Removes temporary files abandoned for over an hour; returns the bytes of everything left
    /// and the entries that may be evicted (mtime before `keep_since`), oldest first.
    fn eviction_candidates(&self, keep_since: SystemTime) -> (u64, Vec<DirEntryInfo>) {
        let now = SystemTime::now();
        let mut entries = self.scan();
        entries.retain(|e| {
            let stale = e.tmp && now.duration_since(e.mtime).is_ok_and(|age| age > STALE_TMP);
            if stale {
                let _ = fs::remove_file(&e.path);
            }
            !stale
        });
        let total: u64 = entries.iter().map(|e| e.bytes).sum();
        entries.retain(|e| !e.tmp && e.mtime < keep_since);
        entries.sort_by_key(|e| e.mtime);
        (total, entries)
    }

    /// Removes `candidates` in order until `total` is at most `target_bytes`; returns the new total.
    fn remove_until(&self, mut total: u64, candidates: Vec<DirEntryInfo>, target_bytes: u64) -> u64 {
        let mut removed = 0usize;
        for e in candidates {
            if total <= target_bytes {
                break;
            }
            match fs::remove_file(&e.path) {
                Ok(()) => {
                    total -= e.bytes;
                    removed += 1;
                }
                Err(err) if err.kind() == io::ErrorKind::NotFound => total -= e.bytes,
                Err(err) => log::debug!("orkpack evict {}: {err}", e.path.display()),
            }
        }
        if removed > 0 {
            log::debug!("orkpack: evicted {removed} entries, {} MB left in {}", total >> 20, self.dir.display());
        }
        total
    }

    /// Total bytes of entries and temporary files in the directory (a fresh scan).
    pub fn disk_bytes(&self) -> u64 {
        self.scan().iter().map(|e| e.bytes).sum()
    }
}

struct DirEntryInfo {
    path: PathBuf,
    bytes: u64,
    mtime: SystemTime,
    tmp: bool,
}

/// Progress of cold packing on stderr: a line every [`PROGRESS_EVERY_BYTES`] of source packed,
/// at most one per second, so small models print nothing.
pub struct Progress {
    start: OnceLock<Instant>,
    done_bytes: AtomicU64,
    last_line: Mutex<(u64, Option<Instant>)>,
}

/// Source bytes between progress lines.
pub const PROGRESS_EVERY_BYTES: u64 = 256 << 20;

impl Progress {
    pub const fn new() -> Progress {
        Progress { start: OnceLock::new(), done_bytes: AtomicU64::new(0), last_line: Mutex::new((0, None)) }
    }

    /// Records `bytes` more source bytes packed; returns the line printed, if any.
    /// `cached`: whether the weight's entry was written (the line says later runs load them).
    pub fn packed(&self, bytes: u64, cached: bool) -> Option<String> {
        let start = *self.start.get_or_init(Instant::now);
        let done = self.done_bytes.fetch_add(bytes, Relaxed) + bytes;
        let mut last = self.last_line.lock().unwrap_or_else(|p| p.into_inner());
        let due = done >= last.0 + PROGRESS_EVERY_BYTES && last.1.is_none_or(|t| t.elapsed() >= Duration::from_secs(1));
        if !due {
            return None;
        }
        *last = (done, Some(Instant::now()));
        let secs = start.elapsed().as_secs_f64();
        let later = if cached { "; later runs load them from the .orkpack cache" } else { "" };
        let line = format!("packing weights for the NPU: {} MB done in {secs:.1} s ({:.0} MB/s){later}", done >> 20, (done >> 20) as f64 / secs.max(1e-3));
        log::info!("{line}");
        Some(line)
    }
}

impl Default for Progress {
    fn default() -> Self {
        Progress::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dir_resolution_order() {
        assert_eq!(resolve_dir(Some("/a"), Some("/x"), Some("/h")), Some(PathBuf::from("/a")));
        assert_eq!(resolve_dir(Some(" "), Some("/x"), Some("/h")), Some(PathBuf::from("/x/ggml-ork")));
        assert_eq!(resolve_dir(None, Some("rel"), Some("/h")), Some(PathBuf::from("/h/.cache/ggml-ork")));
        assert_eq!(resolve_dir(None, None, None), None);
    }

    #[test]
    fn fingerprints_are_stable_and_soc_specific() {
        let a = SocDesc::get(SocId::Rk3588);
        let b = SocDesc::get(SocId::Rk3576);
        assert_eq!(layout_fingerprint(&a), compute_layout_fingerprint(&a));
        assert_ne!(layout_fingerprint(&a), layout_fingerprint(&b));
        let mut c = a.clone();
        c.k_slice /= 2;
        assert_ne!(layout_fingerprint(&c), layout_fingerprint(&a), "a K-slice change must change the layout fingerprint");
        assert_eq!(quant_fingerprint(), quant_fingerprint());
    }

    /// The fingerprints' values, pinned: a change of tiling or of the weight quantization rule
    /// (in the reference steps or in the fused packer, which joins the hash when it differs from
    /// them) changes them and makes every existing cache entry a miss. When this fails on
    /// purpose, update the values and say in the change that caches will be repacked once.
    #[test]
    fn fingerprints_are_pinned() {
        assert_eq!(layout_fingerprint(&SocDesc::get(SocId::Rk3588)), 0x5d00_2399_2bb3_79e2);
        assert_eq!(layout_fingerprint(&SocDesc::get(SocId::Rk3576)), 0xece6_d8b7_ed81_8f98);
        assert_eq!(quant_fingerprint(), 0xb2bb_9853_9898_0c71);
    }

    #[test]
    fn rotated_fingerprints_differ_from_unrotated_and_by_width() {
        use crate::quant::rotate::Rotation;
        let (r576, r1536) = (Rotation::new(576).unwrap(), Rotation::new(1536).unwrap());
        let a = quant_fingerprint_for(Some(&r576));
        assert_eq!(quant_fingerprint_for(None), quant_fingerprint());
        assert_ne!(a, quant_fingerprint());
        assert_ne!(a, quant_fingerprint_for(Some(&r1536)));
        assert_eq!(a, quant_fingerprint_for(Some(&Rotation::new(576).unwrap())), "memoised per K, same value");
    }

    #[test]
    fn progress_prints_only_for_large_totals() {
        let p = Progress::new();
        assert!(p.packed(100 << 20, true).is_none());
        assert!(p.packed(100 << 20, true).is_none());
        let line = p.packed(100 << 20, false).expect("300 MB packed should print a line");
        assert!(!line.contains("later runs"), "{line}");
        assert!(p.packed(300 << 20, true).is_none(), "at most one line per second");
    }
}
