//! The `.orkpack` file format: one header page, then the pre-tiled int8 weight and its channel
//! scales. `FORMAT.md` beside this file is the byte-level description; this module is the only
//! code that reads or writes those bytes, and its parser is total (every input, however damaged,
//! gives `Ok` or a [`FormatError`], never a panic — a proptest in this file feeds it random and
//! mutated pages).
//!
//! All integers are little-endian. The header is exactly [`HEADER_BYTES`] (one 4 KiB page) so the
//! tiles that follow start page-aligned in the mapped file and can be imported by the kernel
//! without another copy (rknpu-facts §7.3 does the same with its one-page per-weight header).

use rayon::prelude::*;
use std::hash::Hasher as _;
use twox_hash::{XxHash3_128, XxHash3_64};

/// XXH3-64 of `b` (seed 0, default secret).
fn xxh3_64(b: &[u8]) -> u64 {
    XxHash3_64::oneshot(b)
}

/// XXH3-128 of `b` (seed 0, default secret).
fn xxh3_128(b: &[u8]) -> u128 {
    XxHash3_128::oneshot(b)
}

/// `b"ORKPACK\0"` at offset 0.
pub const MAGIC: [u8; 8] = *b"ORKPACK\0";
/// Version of this container layout (the header fields and their offsets). Bump when they change.
/// Changes of the *contents* (tiling, quantization) are caught by the fingerprints instead.
pub const CONTAINER_VERSION: u32 = 1;
/// Header size and the offset of the tiles (one page).
pub const HEADER_BYTES: usize = 4096;
/// Alignment of the scales section after the tiles.
pub const SCALES_ALIGN_BYTES: usize = 64;
/// Longest tensor name kept (ggml's `GGML_MAX_NAME`).
pub const NAME_MAX_BYTES: usize = 64;
/// Sanity bounds that keep the offset arithmetic far from overflow (1 TiB of tiles, 2³² rows).
const MAX_TILES_BYTES: usize = 1 << 40;
const MAX_N: usize = 1 << 32;
/// Longest SoC name kept ("rk3588").
pub const SOC_NAME_BYTES: usize = 16;

// Field offsets (FORMAT.md has the table).
const OFF_MAGIC: usize = 0;
const OFF_CONTAINER_VERSION: usize = 8;
const OFF_HEADER_BYTES: usize = 12;
const OFF_LAYOUT_FP: usize = 16;
const OFF_QUANT_FP: usize = 24;
const OFF_SOC: usize = 32;
const OFF_SRC_HASH: usize = 48;
const OFF_GGML_TYPE: usize = 64;
const OFF_WEIGHT_TERMS: usize = 68;
const OFF_N: usize = 72;
const OFF_K: usize = 80;
const OFF_ROW_BYTES: usize = 88;
const OFF_SRC_BYTES: usize = 96;
const OFF_NAME_LEN: usize = 104;
const OFF_NAME: usize = 106;
/// End of the identity fields (the bytes that [`Identity`] encodes): 106 + 64 = 170.
const IDENTITY_END: usize = OFF_NAME + NAME_MAX_BYTES;
const OFF_QMAX: usize = 176;
const OFF_ABSMAX_FLOOR: usize = 180;
const OFF_TILES_OFF: usize = 184;
const OFF_TILES_BYTES: usize = 192;
const OFF_SCALES_OFF: usize = 200;
const OFF_SCALES_BYTES: usize = 208;
const OFF_FILE_BYTES: usize = 216;
const OFF_PAYLOAD_XXH3: usize = 224;
const OFF_HEADER_XXH3: usize = 240;

/// Why bytes are not a valid `.orkpack` header (or file). Every one of these is a cache miss.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FormatError {
    #[error("orkpack parse: {got} bytes is shorter than the {HEADER_BYTES}-byte header")]
    Short { got: usize },
    #[error("orkpack parse: bad magic")]
    Magic,
    #[error("orkpack parse: header checksum mismatch")]
    HeaderChecksum,
    #[error("orkpack parse: container version {got}, expected {CONTAINER_VERSION}")]
    Version { got: u32 },
    #[error("orkpack parse: inconsistent field {field}")]
    Field { field: &'static str },
    #[error("orkpack verify: file is {got} bytes, header says {expected}")]
    Length { got: usize, expected: u64 },
    #[error("orkpack verify: payload checksum mismatch")]
    PayloadChecksum,
}

/// Everything that determines the packed bytes: the cache key. Two weights with equal
/// identities produce byte-identical packs.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Identity {
    /// Fingerprint of the NPU tile layout for this SoC (see `cache::layout_fingerprint`).
    pub layout_fp: u64,
    /// Fingerprint of the weight quantization rule (see `cache::quant_fingerprint`).
    pub quant_fp: u64,
    /// SoC name, e.g. "rk3588" (≤ 16 bytes).
    pub soc: String,
    /// [`par_hash`] of the tensor's source (GGUF) bytes.
    pub src_hash: u128,
    pub ggml_type: u32,
    /// int8 terms per weight (1, or 2 for float sources): the payload holds that many tile sets.
    pub weight_terms: u32,
    /// Weight shape `[N, K]`: N output channels of K elements.
    pub n: u64,
    pub k: u64,
    pub row_bytes: u64,
    pub src_bytes: u64,
    /// Tensor name (truncated to 64 bytes).
    pub name: String,
}

/// Quantization parameters recorded for inspection (the fingerprint is what is compared).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct QuantParams {
    pub qmax: f32,
    pub absmax_floor: f32,
}

/// A parsed header.
#[derive(Clone, Debug, PartialEq)]
pub struct Header {
    pub id: Identity,
    pub quant: QuantParams,
    pub tiles_off: u64,
    pub tiles_bytes: u64,
    pub scales_off: u64,
    pub scales_bytes: u64,
    pub file_bytes: u64,
    /// [`par_hash`] of the file from offset `HEADER_BYTES` to its end.
    pub payload_hash: u128,
}

fn put(buf: &mut [u8], off: usize, bytes: &[u8]) {
    buf[off..off + bytes.len()].copy_from_slice(bytes);
}

fn get_u16(b: &[u8], off: usize) -> u16 {
    u16::from_le_bytes([b[off], b[off + 1]])
}
fn get_u32(b: &[u8], off: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[off..off + 4]);
    u32::from_le_bytes(a)
}
fn get_u64(b: &[u8], off: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[off..off + 8]);
    u64::from_le_bytes(a)
}
fn get_u128(b: &[u8], off: usize) -> u128 {
    let mut a = [0u8; 16];
    a.copy_from_slice(&b[off..off + 16]);
    u128::from_le_bytes(a)
}

/// Truncates `s` to at most `max` bytes on a char boundary.
fn clip(s: &str, max: usize) -> &str {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// A NUL-padded string field: bytes up to the first NUL must be UTF-8, the rest all NUL.
fn get_str(b: &[u8], field: &'static str) -> Result<String, FormatError> {
    let len = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    if b[len..].iter().any(|&c| c != 0) {
        return Err(FormatError::Field { field });
    }
    std::str::from_utf8(&b[..len]).map(str::to_owned).map_err(|_| FormatError::Field { field })
}

impl Identity {
    /// The identity's canonical bytes (header offsets 0..170 with the payload-independent fields
    /// filled in): hashed into the file name, and compared field by field on load.
    pub fn encode(&self) -> [u8; IDENTITY_END] {
        let mut b = [0u8; IDENTITY_END];
        put(&mut b, OFF_MAGIC, &MAGIC);
        put(&mut b, OFF_CONTAINER_VERSION, &CONTAINER_VERSION.to_le_bytes());
        put(&mut b, OFF_HEADER_BYTES, &(HEADER_BYTES as u32).to_le_bytes());
        put(&mut b, OFF_LAYOUT_FP, &self.layout_fp.to_le_bytes());
        put(&mut b, OFF_QUANT_FP, &self.quant_fp.to_le_bytes());
        put(&mut b, OFF_SOC, clip(&self.soc, SOC_NAME_BYTES).as_bytes());
        put(&mut b, OFF_SRC_HASH, &self.src_hash.to_le_bytes());
        put(&mut b, OFF_GGML_TYPE, &self.ggml_type.to_le_bytes());
        put(&mut b, OFF_WEIGHT_TERMS, &self.weight_terms.to_le_bytes());
        put(&mut b, OFF_N, &self.n.to_le_bytes());
        put(&mut b, OFF_K, &self.k.to_le_bytes());
        put(&mut b, OFF_ROW_BYTES, &self.row_bytes.to_le_bytes());
        put(&mut b, OFF_SRC_BYTES, &self.src_bytes.to_le_bytes());
        let name = clip(&self.name, NAME_MAX_BYTES);
        put(&mut b, OFF_NAME_LEN, &(name.len() as u16).to_le_bytes());
        put(&mut b, OFF_NAME, name.as_bytes());
        b
    }

    /// The identity as it will read back from a file (names and SoC clipped to their fields).
    pub fn normalized(&self) -> Identity {
        Identity {
            soc: clip(&self.soc, SOC_NAME_BYTES).to_owned(),
            name: clip(&self.name, NAME_MAX_BYTES).to_owned(),
            ..self.clone()
        }
    }
}

/// Chunk size of [`par_hash`].
pub const HASH_CHUNK_BYTES: usize = 1 << 20;

/// xxh3-64 of each `HASH_CHUNK_BYTES` chunk of `bytes` (the last one may be short), on all cores.
fn chunk_digests(bytes: &[u8]) -> Vec<u64> {
    bytes.par_chunks(HASH_CHUNK_BYTES).map(xxh3_64).collect()
}

fn combine(len: usize, digests: &[u64]) -> u128 {
    let mut b = Vec::with_capacity(8 + 8 * digests.len());
    b.extend_from_slice(&(len as u64).to_le_bytes());
    for d in digests {
        b.extend_from_slice(&d.to_le_bytes());
    }
    xxh3_128(&b)
}

/// The hash used for source bytes and payloads: xxh3-128 over (byte length as u64 LE, then the
/// xxh3-64 of every 1 MiB chunk as u64 LE). Chunking lets every core hash at once; xxh3 runs
/// near memory bandwidth (SIMD chosen at run time: AVX2/SSE2 on x86-64, NEON on aarch64).
pub fn par_hash(bytes: &[u8]) -> u128 {
    combine(bytes.len(), &chunk_digests(bytes))
}

/// [`par_hash`] computed incrementally over bytes that arrive in order, in pieces of any size:
/// `update(a); update(b); finish()` equals `par_hash(a ++ b)`. The cache's hit path feeds it
/// each piece of the payload right after the piece was copied into device memory, so the
/// checksum reads the copy while it is still in the CPU cache instead of making a second pass
/// over the mapped file.
#[derive(Clone)]
pub struct StreamHash {
    chunk: XxHash3_64,
    in_chunk: usize,
    len: usize,
    digests: Vec<u64>,
}

impl StreamHash {
    pub fn new() -> StreamHash {
        StreamHash { chunk: XxHash3_64::new(), in_chunk: 0, len: 0, digests: Vec::new() }
    }

    pub fn update(&mut self, mut bytes: &[u8]) {
        self.len += bytes.len();
        while !bytes.is_empty() {
            let take = bytes.len().min(HASH_CHUNK_BYTES - self.in_chunk);
            // A whole chunk in one piece: the one-shot hash (same value, no streaming state).
            if take == HASH_CHUNK_BYTES {
                self.digests.push(xxh3_64(&bytes[..take]));
            } else {
                self.chunk.write(&bytes[..take]);
                self.in_chunk += take;
                if self.in_chunk == HASH_CHUNK_BYTES {
                    self.digests.push(self.chunk.finish());
                    self.chunk = XxHash3_64::new();
                    self.in_chunk = 0;
                }
            }
            bytes = &bytes[take..];
        }
    }

    /// Bytes hashed so far.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Appends `other`, the hash of the bytes that follow: `a.update(x); b.update(y);
    /// a.append(b)` equals `a.update(x ++ y)`. `self` must end on a chunk boundary (its length a
    /// multiple of [`HASH_CHUNK_BYTES`]), so that `other`'s chunks are the concatenation's.
    pub fn append(&mut self, other: StreamHash) {
        assert_eq!(self.in_chunk, 0, "StreamHash::append: the first part must end on a chunk boundary");
        self.digests.extend(other.digests);
        self.len += other.len;
        self.chunk = other.chunk;
        self.in_chunk = other.in_chunk;
    }

    pub fn finish(mut self) -> u128 {
        if self.in_chunk > 0 {
            self.digests.push(self.chunk.finish());
        }
        combine(self.len, &self.digests)
    }
}

impl Default for StreamHash {
    fn default() -> Self {
        StreamHash::new()
    }
}

/// [`par_hash`] of the concatenation `a ++ b` without building it (`a` is usually large).
fn par_hash2(a: &[u8], b: &[u8]) -> u128 {
    let full = a.len() / HASH_CHUNK_BYTES * HASH_CHUNK_BYTES;
    let mut digests = chunk_digests(&a[..full]);
    let mut tail = a[full..].to_vec();
    tail.extend_from_slice(b);
    digests.extend(chunk_digests(&tail));
    combine(a.len() + b.len(), &digests)
}

/// Checksum of a header page: xxh3-64 of the page with its checksum field read as zero.
fn header_checksum(page: &[u8]) -> u64 {
    let mut tmp = [0u8; HEADER_BYTES];
    tmp.copy_from_slice(&page[..HEADER_BYTES]);
    tmp[OFF_HEADER_XXH3..OFF_HEADER_XXH3 + 8].fill(0);
    xxh3_64(&tmp)
}

/// Number of f32 values in the scales section: row scales `[N]`, column scales `[K]`, and one
/// more `[N]` of row scales per extra weight term.
pub fn scale_count(n: usize, k: usize, weight_terms: u32) -> usize {
    n + k + (weight_terms.max(1) as usize - 1) * n
}

/// Where the sections of a file with `tiles_bytes` of tiles and N scales go:
/// `(scales_off, file_bytes)`.
pub fn layout(tiles_bytes: usize, n: usize) -> (usize, usize) {
    let scales_off = (HEADER_BYTES + tiles_bytes).div_ceil(SCALES_ALIGN_BYTES) * SCALES_ALIGN_BYTES;
    (scales_off, scales_off + 4 * n)
}

/// The header page of a file holding `tiles` and `scales` (`[N] f32`), plus the scales as
/// little-endian bytes: what [`write_file`] streams out. The payload checksum is computed here.
pub fn encode_header(id: &Identity, quant: QuantParams, tiles: &[u8], scales: &[f32]) -> (Box<[u8; HEADER_BYTES]>, Vec<u8>) {
    let after = after_tiles(tiles.len(), scales);
    let payload_hash = par_hash2(tiles, &after);
    let h = header_with_hash(id, quant, tiles.len(), scales.len(), payload_hash);
    let gap = after.len() - 4 * scales.len();
    (h, after[gap..].to_vec())
}

/// The payload after the tiles: the zero gap up to the scales' alignment, then the scales
/// (little-endian f32).
pub fn after_tiles(tiles_bytes: usize, scales: &[f32]) -> Vec<u8> {
    let (scales_off, _) = layout(tiles_bytes, scales.len());
    let mut after = vec![0u8; scales_off - HEADER_BYTES - tiles_bytes];
    after.extend(scales.iter().flat_map(|s| s.to_le_bytes()));
    after
}

/// The header page of a file of `tiles_bytes` of tiles and `scale_count` scales whose payload
/// (tiles ++ [`after_tiles`]) hashes to `payload_hash` ([`par_hash`], or [`StreamHash`] over
/// the same bytes in order): a writer that hashes while it writes the payload writes this last.
pub fn header_with_hash(id: &Identity, quant: QuantParams, tiles_bytes: usize, scale_count: usize, payload_hash: u128) -> Box<[u8; HEADER_BYTES]> {
    let (scales_off, file_bytes) = layout(tiles_bytes, scale_count);
    let mut h = Box::new([0u8; HEADER_BYTES]);
    put(&mut h[..], 0, &id.encode());
    put(&mut h[..], OFF_QMAX, &quant.qmax.to_bits().to_le_bytes());
    put(&mut h[..], OFF_ABSMAX_FLOOR, &quant.absmax_floor.to_bits().to_le_bytes());
    put(&mut h[..], OFF_TILES_OFF, &(HEADER_BYTES as u64).to_le_bytes());
    put(&mut h[..], OFF_TILES_BYTES, &(tiles_bytes as u64).to_le_bytes());
    put(&mut h[..], OFF_SCALES_OFF, &(scales_off as u64).to_le_bytes());
    put(&mut h[..], OFF_SCALES_BYTES, &(4 * scale_count as u64).to_le_bytes());
    put(&mut h[..], OFF_FILE_BYTES, &(file_bytes as u64).to_le_bytes());
    put(&mut h[..], OFF_PAYLOAD_XXH3, &payload_hash.to_le_bytes());
    let ck = header_checksum(&h[..]);
    put(&mut h[..], OFF_HEADER_XXH3, &ck.to_le_bytes());
    h
}

/// Streams a whole file (header page, tiles, zero gap, scales) into `w`.
pub fn write_file(w: &mut impl std::io::Write, id: &Identity, quant: QuantParams, tiles: &[u8], scales: &[f32]) -> std::io::Result<()> {
    let (h, scale_bytes) = encode_header(id, quant, tiles, scales);
    let (scales_off, _) = layout(tiles.len(), scales.len());
    w.write_all(&h[..])?;
    w.write_all(tiles)?;
    w.write_all(&[0u8; SCALES_ALIGN_BYTES][..scales_off - HEADER_BYTES - tiles.len()])?;
    w.write_all(&scale_bytes)
}

/// Parses and checks a header page (the first [`HEADER_BYTES`] of `bytes`; more may follow).
/// Checks magic, checksum, container version, and that every offset and length is consistent.
/// Does not look at the payload ([`check_length`], then the payload hash).
pub fn parse_header(bytes: &[u8]) -> Result<Header, FormatError> {
    if bytes.len() < HEADER_BYTES {
        return Err(FormatError::Short { got: bytes.len() });
    }
    let h = &bytes[..HEADER_BYTES];
    if h[..8] != MAGIC {
        return Err(FormatError::Magic);
    }
    if get_u64(h, OFF_HEADER_XXH3) != header_checksum(h) {
        return Err(FormatError::HeaderChecksum);
    }
    let version = get_u32(h, OFF_CONTAINER_VERSION);
    if version != CONTAINER_VERSION {
        return Err(FormatError::Version { got: version });
    }
    let bad = |field| Err(FormatError::Field { field });
    if get_u32(h, OFF_HEADER_BYTES) as usize != HEADER_BYTES {
        return bad("header_bytes");
    }
    if !matches!(get_u32(h, OFF_WEIGHT_TERMS), 1 | 2) {
        return bad("weight_terms");
    }
    if h[IDENTITY_END..OFF_QMAX].iter().any(|&c| c != 0) {
        return bad("reserved");
    }
    if h[OFF_HEADER_XXH3 + 8..].iter().any(|&c| c != 0) {
        return bad("padding");
    }
    let name_len = get_u16(h, OFF_NAME_LEN) as usize;
    if name_len > NAME_MAX_BYTES {
        return bad("name_len");
    }
    let name_field = &h[OFF_NAME..OFF_NAME + NAME_MAX_BYTES];
    if name_field[name_len..].iter().any(|&c| c != 0) {
        return bad("name");
    }
    let name = std::str::from_utf8(&name_field[..name_len]).map_err(|_| FormatError::Field { field: "name" })?.to_owned();
    let id = Identity {
        layout_fp: get_u64(h, OFF_LAYOUT_FP),
        quant_fp: get_u64(h, OFF_QUANT_FP),
        soc: get_str(&h[OFF_SOC..OFF_SOC + SOC_NAME_BYTES], "soc")?,
        src_hash: get_u128(h, OFF_SRC_HASH),
        ggml_type: get_u32(h, OFF_GGML_TYPE),
        weight_terms: get_u32(h, OFF_WEIGHT_TERMS),
        n: get_u64(h, OFF_N),
        k: get_u64(h, OFF_K),
        row_bytes: get_u64(h, OFF_ROW_BYTES),
        src_bytes: get_u64(h, OFF_SRC_BYTES),
        name,
    };
    let hd = Header {
        id,
        quant: QuantParams {
            qmax: f32::from_bits(get_u32(h, OFF_QMAX)),
            absmax_floor: f32::from_bits(get_u32(h, OFF_ABSMAX_FLOOR)),
        },
        tiles_off: get_u64(h, OFF_TILES_OFF),
        tiles_bytes: get_u64(h, OFF_TILES_BYTES),
        scales_off: get_u64(h, OFF_SCALES_OFF),
        scales_bytes: get_u64(h, OFF_SCALES_BYTES),
        file_bytes: get_u64(h, OFF_FILE_BYTES),
        payload_hash: get_u128(h, OFF_PAYLOAD_XXH3),
    };
    if hd.tiles_off != HEADER_BYTES as u64 {
        return bad("tiles_off");
    }
    // Sizes that do not fit this address space cannot be a file we wrote.
    let (Ok(tiles_bytes), Ok(n), Ok(k)) = (usize::try_from(hd.tiles_bytes), usize::try_from(hd.id.n), usize::try_from(hd.id.k)) else {
        return bad("tiles_bytes");
    };
    if tiles_bytes > MAX_TILES_BYTES || n > MAX_N || k > MAX_N {
        return bad("tiles_bytes");
    }
    let floats = scale_count(n, k, hd.id.weight_terms);
    if floats.checked_mul(4).map(|b| b as u64) != Some(hd.scales_bytes) {
        return bad("scales_bytes");
    }
    let (scales_off, file_bytes) = layout(tiles_bytes, floats);
    if hd.scales_off != scales_off as u64 {
        return bad("scales_off");
    }
    if hd.file_bytes != file_bytes as u64 {
        return bad("file_bytes");
    }
    Ok(hd)
}

/// Checks that `file` is exactly as long as its header says.
pub fn check_length(hd: &Header, file: &[u8]) -> Result<(), FormatError> {
    if file.len() as u64 != hd.file_bytes {
        return Err(FormatError::Length { got: file.len(), expected: hd.file_bytes });
    }
    Ok(())
}

/// The tiles of a verified file.
pub fn tiles<'a>(hd: &Header, file: &'a [u8]) -> &'a [u8] {
    &file[hd.tiles_off as usize..(hd.tiles_off + hd.tiles_bytes) as usize]
}

/// The scales (`[N] f32`) of a verified file.
pub fn scales(hd: &Header, file: &[u8]) -> Vec<f32> {
    file[hd.scales_off as usize..(hd.scales_off + hd.scales_bytes) as usize]
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Recomputes the header checksum of `page` (the first [`HEADER_BYTES`] of a file) after an
    /// edit: for tools and tests that build well-formed files with chosen field values.
    fn reseal_header(page: &mut [u8]) {
        let ck = header_checksum(&page[..HEADER_BYTES]);
        put(page, OFF_HEADER_XXH3, &ck.to_le_bytes());
    }

    /// The whole file image in memory (tests, tools).
    fn encode_file(id: &Identity, quant: QuantParams, tiles: &[u8], scales: &[f32]) -> Vec<u8> {
        let mut f = Vec::with_capacity(layout(tiles.len(), scales.len()).1);
        write_file(&mut f, id, quant, tiles, scales).expect("writing to a Vec cannot fail");
        f
    }

    /// Checks a whole file image against its parsed header: exact length and payload checksum.
    fn verify_payload(hd: &Header, file: &[u8]) -> Result<(), FormatError> {
        check_length(hd, file)?;
        if par_hash(&file[HEADER_BYTES..]) != hd.payload_hash {
            return Err(FormatError::PayloadChecksum);
        }
        Ok(())
    }
    use proptest::prelude::*;

    #[test]
    fn stream_hash_equals_par_hash_for_any_split() {
        let bytes: Vec<u8> = (0..3 * HASH_CHUNK_BYTES + 12345).map(|i| (i as u32).wrapping_mul(2_654_435_761) as u8).collect();
        for len in [0, 1, HASH_CHUNK_BYTES - 1, HASH_CHUNK_BYTES, HASH_CHUNK_BYTES + 1, bytes.len()] {
            let b = &bytes[..len];
            for piece in [1usize << 20, 4096, 333_333, 1 << 22, 7] {
                if piece < 4096 && len > 2 * HASH_CHUNK_BYTES {
                    continue; // keeps the test quick
                }
                let mut h = StreamHash::new();
                for p in b.chunks(piece) {
                    h.update(p);
                }
                assert_eq!(h.finish(), par_hash(b), "len {len}, pieces of {piece}");
            }
        }
        for cut in [HASH_CHUNK_BYTES, 2 * HASH_CHUNK_BYTES] {
            let (mut a, mut b) = (StreamHash::new(), StreamHash::new());
            a.update(&bytes[..cut]);
            b.update(&bytes[cut..]);
            a.append(b);
            assert_eq!(a.finish(), par_hash(&bytes), "append at {cut}");
        }
        let mut h = StreamHash::new();
        h.update(&bytes[..5]);
        h.update(&[]);
        h.update(&bytes[5..HASH_CHUNK_BYTES + 9]);
        assert_eq!(h.finish(), par_hash(&bytes[..HASH_CHUNK_BYTES + 9]));
    }

    /// The cache's hashes are XXH3 exactly (caches written by any build stay valid, whichever
    /// XXH3 implementation or SIMD kernel computes them): the published empty-input vectors,
    /// and `par_hash` / `StreamHash` of a 2.5 MiB input (the SIMD long-input path, three chunks)
    /// pinned to the value another XXH3 implementation gives.
    #[test]
    fn hashes_are_xxh3_with_pinned_values() {
        assert_eq!(xxh3_64(b""), 0x2d06_8005_38d3_94c2);
        assert_eq!(xxh3_128(b""), 0x99aa_06d3_0147_98d8_6001_c324_468d_497f);
        let p: Vec<u8> = (0..(5usize << 19) + 17).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        const WANT: u128 = 0x8aba_2746_a145_1a45_3a60_bcec_5a79_80fd;
        assert_eq!(par_hash(&p), WANT);
        let mut s = StreamHash::new();
        for piece in p.chunks(300_007) {
            s.update(piece);
        }
        assert_eq!(s.finish(), WANT);
    }

    fn sample_id() -> Identity {
        Identity {
            layout_fp: 0x1122_3344_5566_7788,
            quant_fp: 0x99aa_bbcc_ddee_ff00,
            soc: "rk3588".into(),
            src_hash: 0x0123_4567_89ab_cdef_fedc_ba98_7654_3210,
            ggml_type: 8,
            weight_terms: 1,
            n: 64,
            k: 32,
            row_bytes: 34,
            src_bytes: 64 * 34,
            name: "blk.0.attn_q.weight".into(),
        }
    }

    fn sample_file() -> Vec<u8> {
        let tiles: Vec<u8> = (0..64 * 32).map(|i| (i * 7 % 251) as u8).collect();
        let scales: Vec<f32> = (0..64 + 32).map(|i| 0.01 * (i as f32 + 1.0)).collect();
        encode_file(&sample_id(), QuantParams { qmax: 127.0, absmax_floor: 1e-9 }, &tiles, &scales)
    }

    #[test]
    fn round_trip() {
        let f = sample_file();
        let hd = parse_header(&f).unwrap();
        assert_eq!(hd.id, sample_id());
        verify_payload(&hd, &f).unwrap();
        assert_eq!(tiles(&hd, &f).len(), 64 * 32);
        assert_eq!(tiles(&hd, &f)[5], 35);
        assert_eq!(scales(&hd, &f)[3], 0.04);
        assert_eq!(hd.quant.qmax, 127.0);
        assert_eq!(f.len() % 4, 0);
        assert_eq!(hd.tiles_off as usize % 4096, 0);
    }

    #[test]
    fn long_names_are_clipped_on_a_char_boundary() {
        let mut id = sample_id();
        id.name = "é".repeat(40); // 80 bytes
        let f = encode_file(&id, QuantParams { qmax: 127.0, absmax_floor: 1e-9 }, &[0; 2048], &[1.0; 64 + 32]);
        let hd = parse_header(&f).unwrap();
        assert_eq!(hd.id.name.len(), 64);
        assert_eq!(hd.id, id.normalized());
    }

    #[test]
    fn every_single_byte_change_of_the_header_is_rejected() {
        let f = sample_file();
        for pos in 0..HEADER_BYTES {
            let mut g = f.clone();
            g[pos] ^= 0x20;
            assert!(parse_header(&g).is_err(), "flip at {pos} accepted");
        }
    }

    #[test]
    fn payload_damage_and_truncation_are_rejected() {
        let f = sample_file();
        let hd = parse_header(&f).unwrap();
        for pos in [HEADER_BYTES, HEADER_BYTES + 1000, f.len() - 1] {
            let mut g = f.clone();
            g[pos] ^= 1;
            assert_eq!(verify_payload(&hd, &g), Err(FormatError::PayloadChecksum));
        }
        assert!(matches!(verify_payload(&hd, &f[..f.len() - 1]), Err(FormatError::Length { .. })));
        assert!(matches!(parse_header(&f[..100]), Err(FormatError::Short { got: 100 })));
    }

    fn reseal(f: &mut [u8]) {
        reseal_header(f)
    }

    #[test]
    fn well_sealed_but_inconsistent_headers_are_rejected() {
        let f = sample_file();
        let cases: &[(usize, &[u8], &str)] = &[
            (OFF_CONTAINER_VERSION, &2u32.to_le_bytes(), "version"),
            (OFF_TILES_BYTES, &(u64::MAX).to_le_bytes(), "tiles_bytes"),
            (OFF_N, &(u64::MAX / 2).to_le_bytes(), "n"),
            (OFF_NAME_LEN, &200u16.to_le_bytes(), "name_len"),
            (OFF_SCALES_OFF, &4096u64.to_le_bytes(), "scales_off"),
            (OFF_FILE_BYTES, &1u64.to_le_bytes(), "file_bytes"),
            (OFF_SOC + 7, b"x", "soc padding"),
            (1000, b"x", "padding"),
        ];
        for &(off, bytes, what) in cases {
            let mut g = f.clone();
            put(&mut g, off, bytes);
            reseal(&mut g);
            assert!(parse_header(&g).is_err(), "{what} accepted");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 10_000, max_shrink_time: 10_000, ..ProptestConfig::default() })]

        /// Fuzz: random pages never panic, and essentially never parse.
        #[test]
        fn fuzz_random_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..HEADER_BYTES + 64)) {
            prop_assert!(parse_header(&bytes).is_err());
        }

        /// Fuzz: a valid file with random bytes overwritten, sealed again or not, never panics;
        /// unsealed damage to the header is always rejected, and whatever parses is self-consistent.
        #[test]
        fn fuzz_mutated_headers(
            edits in proptest::collection::vec((0usize..HEADER_BYTES, any::<u8>()), 1..8),
            reseal_after in any::<bool>(),
            cut in proptest::option::of(0usize..HEADER_BYTES * 2),
        ) {
            let f = sample_file();
            let mut g = f.clone();
            for &(pos, v) in &edits { g[pos] = v; }
            if reseal_after { reseal(&mut g); }
            if let Some(c) = cut { g.truncate(c.min(g.len())); }
            if let Ok(hd) = parse_header(&g) {
                if !reseal_after && g[..HEADER_BYTES] != f[..HEADER_BYTES] {
                    prop_assert!(false, "damaged unsealed header accepted");
                }
                // Offsets from a parsed header are always in bounds for a file of that size.
                let (so, fb) = layout(hd.tiles_bytes as usize, scale_count(hd.id.n as usize, hd.id.k as usize, hd.id.weight_terms));
                prop_assert_eq!(hd.file_bytes as usize, fb);
                prop_assert!(so as u64 + hd.scales_bytes <= hd.file_bytes);
                let _ = verify_payload(&hd, &g);
            }
        }
    }
}
