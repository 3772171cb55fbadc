//! Memory layouts: the tiled weight blob, activation sub-blocks, and int32 output blocks.
//!
//! What it owns: the byte layout the NPU reads and writes, and the geometry of a weight's tiles.
//!
//! * **Weights** arrive as ggml stores them: `w: [N, K]` row-major i8 (row n = output channel n)
//!   and the product is `C = A · Wᵀ`. On the device a tile covering K-range `[k0, k0+Kp)` and
//!   N-range `[n0, n0+Nc)` is `[Nc/32][Kp/32][32][32]`: byte `nt·KT·1024 + kt·1024 + nl·32 + kk`
//!   (KT = Kp/32) holds `W[n0 + nt·32 + nl][k0 + kt·32 + kk]` (rknpu-facts §3.2; facts state it for
//!   `B[K][N]`, here B = Wᵀ). Because an N-block of 32 channels is `Kp·32` contiguous bytes, the
//!   blocks `[t0, t1)` of a tile are themselves a valid weight — that is how cores split N
//!   without repacking (§3.2, §5).
//! * **Slicing** (§3.2): K-slices of `soc.k_slice` (1024) and N-slices of
//!   `soc.n_max_per_program` (8192); tile (ns, ks) is stored at position `ns·Sk + ks` (N outer,
//!   K inner), each padded with zeros to a multiple of 4096 bytes.
//! * **Full-K companion** (§3.2): when there is more than one K-slice and K ≤ the SoC's
//!   single-program ceiling (10752), one full-K tile per N-slice follows the K-slice tiles in
//!   the same blob, so M = 1 (and small-M) programs can contract all of K at once. With a single
//!   K-slice the K-slice tiles already are full-K and no companion is stored.
//! * **Tile sets** ([`TileSets`]): a blob may hold only one of the two sets where the plans of
//!   every M the weight runs with read only that one (`npu::plan::tile_sets` decides): the
//!   K-slice tiles alone (the full-K companion is left out; M = 1 then runs K-split), or the
//!   full-K tiles alone (no K-slice tiles; every M runs full-K). [`WeightGeometry::new`] is
//!   both sets, the layout above.
//! * The blob is a pure function of (W, N, K, SoC constants): what a disk cache stores.
//! * **Activations** are flat row-major `[mc][Kp]` i8 blocks (§3.1), copied from the caller's
//!   `[M, K]` matrix. **Outputs** are dense `[mc][s]` int32 blocks (§3.3).
//!
//! Every packer has a scalar reference in the tests (`tests/common`), which check them byte
//! for byte. The fast weight tiler works one 32-row N-block at a time ([`split_blocks`] hands each
//! block its regions of the blob, [`tile_block`] fills them with 32-byte moves), which lets
//! `npu::layout::tile_weight_with` tile a block's rows right after they were quantized, while they are in
//! the CPU cache; `npu::layout::tile_weight` is that tiler over a whole matrix.

use crate::npu::soc::SocDesc;
use crate::npu::{check_shape_soc, NpuError, TiledWeight};

/// Tiles are padded to a multiple of this (rknpu-facts §3.2: page alignment for zero-copy import).
pub const TILE_ALIGN_BYTES: usize = 4096;
/// Channels and K values per weight block (the 32×32 block of rknpu-facts §3.2).
pub const BLOCK: usize = 32;
/// Bytes of one 32×32 int8 block.
pub const BLOCK_BYTES: usize = BLOCK * BLOCK;

/// One tile of a weight blob.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tile {
    /// N-slice index and its column range.
    pub ns: usize,
    pub n0: usize,
    pub nc: usize,
    /// K range (`kp == k` for full-K tiles).
    pub k0: usize,
    pub kp: usize,
    /// Byte offset in the blob and padded size.
    pub offset: usize,
    pub padded_bytes: usize,
}

impl Tile {
    /// Byte offset (in the blob) of N-block `t` of this tile (t counts from the tile's n0).
    pub fn block_offset(&self, t: usize) -> usize {
        self.offset + t * self.kp * BLOCK
    }
}

/// Which tile sets a weight blob holds (see the module notes). With one K-slice, or K above
/// the full-K ceiling, there is one set whatever this says.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum TileSets {
    /// K-slice tiles and the full-K companion.
    #[default]
    Both,
    /// K-slice tiles only.
    KSplit,
    /// Full-K tiles only.
    FullK,
}

/// Geometry of a weight blob: K-slice tiles, then the optional full-K companion.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WeightGeometry {
    pub n: usize,
    pub k: usize,
    pub k_slice: usize,
    pub n_slice: usize,
    /// Number of K-slices and N-slices.
    pub sk: usize,
    pub sn: usize,
    /// K-slice tiles, index `ns·sk + ks`.
    pub tiles: Vec<Tile>,
    /// Full-K tiles, one per N-slice (empty when absent).
    pub fullk: Vec<Tile>,
    pub total_bytes: usize,
    /// The tile sets asked for (`tiles` is empty when only the full-K set is kept and K has
    /// several K-slices; `fullk` is empty when only the K-slice set is kept).
    pub sets: TileSets,
}

fn round_up(x: usize, a: usize) -> usize {
    x.div_ceil(a) * a
}

impl WeightGeometry {
    /// Geometry for `[N, K]` on `soc` with both tile sets. K and N must already be multiples of 32.
    pub fn new(soc: &SocDesc, n: usize, k: usize) -> WeightGeometry {
        WeightGeometry::with_sets(soc, n, k, TileSets::Both)
    }

    /// Geometry for `[N, K]` on `soc` holding `sets`.
    pub fn with_sets(soc: &SocDesc, n: usize, k: usize, sets: TileSets) -> WeightGeometry {
        let k_slice = soc.k_slice as usize;
        let n_slice = soc.n_max_per_program as usize;
        let sk = k.div_ceil(k_slice).max(1);
        let sn = n.div_ceil(n_slice).max(1);
        let companion = sk > 1 && k <= soc.fullk_ceiling as usize;
        let keep_ksplit = !(companion && sets == TileSets::FullK);
        let keep_fullk = companion && sets != TileSets::KSplit;
        let mut off = 0;
        let mut tiles = Vec::with_capacity(sk * sn);
        for ns in (0..sn).filter(|_| keep_ksplit) {
            let n0 = ns * n_slice;
            let nc = n_slice.min(n - n0);
            for ks in 0..sk {
                let k0 = ks * k_slice;
                let kp = k_slice.min(k - k0);
                let padded_bytes = round_up(kp * nc, TILE_ALIGN_BYTES);
                tiles.push(Tile { ns, n0, nc, k0, kp, offset: off, padded_bytes });
                off += padded_bytes;
            }
        }
        let mut fullk = Vec::new();
        if keep_fullk {
            for ns in 0..sn {
                let n0 = ns * n_slice;
                let nc = n_slice.min(n - n0);
                let padded_bytes = round_up(k * nc, TILE_ALIGN_BYTES);
                fullk.push(Tile { ns, n0, nc, k0: 0, kp: k, offset: off, padded_bytes });
                off += padded_bytes;
            }
        }
        WeightGeometry { n, k, k_slice, n_slice, sk, sn, tiles, fullk, total_bytes: off, sets }
    }

    /// The full-K tile of N-slice `ns`, if the blob has one (the K-slice tile when Sk = 1).
    pub fn fullk_tile(&self, ns: usize) -> Option<&Tile> {
        if self.sk == 1 {
            Some(&self.tiles[ns])
        } else {
            self.fullk.get(ns)
        }
    }

    /// Whether the blob holds the K-slice tiles (every plan path can run on them).
    pub fn has_ksplit(&self) -> bool {
        !self.tiles.is_empty()
    }

    /// K-slice tile (ns, ks).
    pub fn tile(&self, ns: usize, ks: usize) -> &Tile {
        &self.tiles[ns * self.sk + ks]
    }

    fn all_tiles(&self) -> impl Iterator<Item = &Tile> {
        self.tiles.iter().chain(self.fullk.iter())
    }
}

/// The regions of a blob that N-block `b` (weight rows `[32·b, 32·b + 32)`) owns: one per tile
/// of its N-slice (K-slice tiles, then the full-K tile), `kp/32 · BLOCK_BYTES` bytes each, with
/// the tile. Blocks own disjoint regions, so they can be filled in parallel.
pub type BlockRegions<'a> = Vec<(&'a Tile, &'a mut [u8])>;

/// Splits `blob` (`geom.total_bytes`) into every N-block's [`BlockRegions`], in block order.
/// Tile padding belongs to no block.
pub fn split_blocks<'a>(geom: &'a WeightGeometry, blob: &'a mut [u8]) -> Vec<BlockRegions<'a>> {
    let mut blocks: Vec<BlockRegions<'a>> = (0..geom.n / BLOCK).map(|_| Vec::new()).collect();
    let mut rest: &mut [u8] = blob;
    for t in geom.all_tiles() {
        let (head, tail) = std::mem::take(&mut rest).split_at_mut(t.padded_bytes);
        rest = tail;
        let kt_n = t.kp / BLOCK;
        for (nt, region) in head[..t.nc * t.kp].chunks_mut(kt_n * BLOCK_BYTES).enumerate() {
            blocks[t.n0 / BLOCK + nt].push((t, region));
        }
    }
    blocks
}

/// Tiles one N-block: `rows: [32, K]` row-major i8 (the block's weight rows) into its regions.
/// Together over all blocks: the same bytes as the scalar reference tiler of the tests
/// (`tests/common`) over all tiles.
pub fn tile_block(rows: &[i8], k: usize, regions: &mut [(&Tile, &mut [u8])]) {
    let rb: &[u8] = bytemuck::cast_slice(rows);
    for (t, region) in regions.iter_mut() {
        for nl in 0..BLOCK {
            let src = rb[nl * k + t.k0..nl * k + t.k0 + t.kp].chunks_exact(BLOCK);
            for (d, s) in region.chunks_exact_mut(BLOCK_BYTES).zip(src) {
                let d: &mut [u8; BLOCK] = (&mut d[nl * BLOCK..(nl + 1) * BLOCK]).try_into().expect("32-byte block");
                *d = s.try_into().expect("32-byte block");
            }
        }
    }
}

/// An activation sub-block: rows `[m0, m0+mc)`, columns `[k0, k0+kp)` of `A: [M, K]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ABlock {
    pub m0: usize,
    pub mc: usize,
    pub k0: usize,
    pub kp: usize,
}

impl ABlock {
    pub fn bytes(&self) -> usize {
        self.mc * self.kp
    }
}

/// Copies block `b` of `a: [M, K]` row-major i8 into `out: [mc][kp]` row-major: one copy when the block spans whole rows of `a` (full-K), else a
/// copy per row. Serial: it runs on the NPU core's own host thread, beside the other cores'
/// threads, and a hand-off to a pool costs more than a memcpy of the block.
pub fn pack_a_fast(a: &[i8], k: usize, b: &ABlock, out: &mut [u8]) {
    let ab: &[u8] = bytemuck::cast_slice(a);
    if b.k0 == 0 && b.kp == k {
        out[..b.bytes()].copy_from_slice(&ab[b.m0 * k..(b.m0 + b.mc) * k]);
        return;
    }
    for (r, dst) in out[..b.bytes()].chunks_exact_mut(b.kp).enumerate() {
        let s = (b.m0 + r) * k + b.k0;
        dst.copy_from_slice(&ab[s..s + b.kp]);
    }
}

/// Scalar reference GEMM: `C[m][n] = Σ_k A[m][k] · W[n][k]` exact int32.
/// `a: [M, K]` row-major i8, `w: [N, K]` row-major i8; returns `[M, N]` row-major i32.
pub fn reference_mm(a: &[i8], w: &[i8], m: usize, k: usize, n: usize) -> Vec<i32> {
    assert_eq!(a.len(), m * k, "reference_mm: a is not [M, K]");
    assert_eq!(w.len(), n * k, "reference_mm: w is not [N, K]");
    let mut c = vec![0i32; m * n];
    for i in 0..m {
        for j in 0..n {
            let mut s = 0i32;
            for x in 0..k {
                s += i32::from(a[i * k + x]) * i32::from(w[j * k + x]);
            }
            c[i * n + j] = s;
        }
    }
    c
}

/// Tiles `w: [N, K]` row-major i8 (row n = output channel n) into the device layout (both tile sets).
pub fn tile_weight(soc: &SocDesc, w: &[i8], n: usize, k: usize) -> Result<TiledWeight, NpuError> {
    tile_weight_sets(soc, w, n, k, TileSets::Both)
}

/// [`tile_weight`] into a blob holding `sets`.
pub fn tile_weight_sets(soc: &SocDesc, w: &[i8], n: usize, k: usize, sets: TileSets) -> Result<TiledWeight, NpuError> {
    check_shape_soc(soc, n, k)?;
    if w.len() != n * k {
        return Err(NpuError::BadArg { op: "tile_weight", m: 0, k, n, why: format!("w has {} elements, not N·K", w.len()) });
    }
    let rows = BLOCK * k;
    let (mut t, _) = tile_weight_sets_with(soc, n, k, sets, 1, |b, out| out.copy_from_slice(&w[b * rows..(b + 1) * rows]))?;
    Ok(t.remove(0))
}

/// Builds `terms` tiled blobs of `[N, K]` together, one 32-row N-block at a time (on all
/// cores): `fill(b, rows)` writes the int8 rows `[32·b, 32·b + 32)` of every term into
/// `rows: [terms, 32, K]` (term-major) and returns what the caller keeps for the block
/// (e.g. its row scales); the rows are tiled while they are still in the CPU cache. No
/// untiled `[N, K]` copy is ever made. Returns the blobs (term order) and `fill`'s results
/// in block order. Same bytes as [`tile_weight`] of each term's whole matrix.
pub fn tile_weight_with<R: Send>(soc: &SocDesc, n: usize, k: usize, terms: usize, fill: impl Fn(usize, &mut [i8]) -> R + Sync) -> Result<(Vec<TiledWeight>, Vec<R>), NpuError> {
    tile_weight_sets_with(soc, n, k, TileSets::Both, terms, fill)
}

/// [`tile_weight_with`] into blobs holding `sets` ([`WeightGeometry::with_sets`]).
pub fn tile_weight_sets_with<R: Send>(
    soc: &SocDesc,
    n: usize,
    k: usize,
    sets: TileSets,
    terms: usize,
    fill: impl Fn(usize, &mut [i8]) -> R + Sync,
) -> Result<(Vec<TiledWeight>, Vec<R>), NpuError> {
    check_shape_soc(soc, n, k)?;
    let geom = WeightGeometry::with_sets(soc, n, k, sets);
    let mut blobs: Vec<Vec<u8>> = (0..terms).map(|_| crate::quant::par_zeroed::<u8>(geom.total_bytes)).collect();
    let mut split: Vec<_> = blobs.iter_mut().map(|b| split_blocks(&geom, b).into_iter()).collect();
    // Per block: every term's regions.
    let blocks: Vec<Vec<BlockRegions<'_>>> =
        (0..n / BLOCK).map(|_| split.iter_mut().map(|it| it.next().expect("one region set per block")).collect()).collect();
    let block_rows = BLOCK * k;
    use rayon::prelude::*;
    let results = blocks
        .into_par_iter()
        .enumerate()
        .map_init(
            || vec![0i8; terms * block_rows],
            |rows, (b, mut regions)| {
                let r = fill(b, rows);
                for (t, reg) in regions.iter_mut().enumerate() {
                    tile_block(&rows[t * block_rows..(t + 1) * block_rows], k, reg);
                }
                r
            },
        )
        .collect();
    Ok((blobs.into_iter().map(|bytes| TiledWeight { n, k, bytes, sets }).collect(), results))
}
