//! Packing: a GGUF weight's bytes → int8 terms, scales and NPU tiles. Pure functions of the
//! source bytes and the SoC's layout, with no device, cache or configuration in them: the cache
//! (`crate::cache`) persists what they make and fingerprints them, the backend places the tiles
//! on the device.
//!
//! A weight `W: [N, K]` becomes `W[n][k] ≈ (q[n][k] · s[n] + q_lo[n][k] · s_lo[n]) · col[k]`:
//! each column divided by its maximum (`col`, which the activations are multiplied by instead),
//! then one per-output-channel int8 term `(q, s)` and, optionally, a second term `(q_lo, s_lo)`
//! quantizing the residual of the first.
//!
//! With a rotation `R` of K (`quant::rotate`, the default) the rows are rotated first, `W·R`, and
//! there is no column equalisation (`col` is all ones): the rotation already spreads every
//! column's outliers over all K, and measured on SmolLM2 the equalisation on top of it costs
//! accuracy (KLD 0.0079 with it, 0.0064 without, one term each). Activation rows are then rotated
//! by the same `R` (`x·Wᵀ = (x·R)·(W·R)ᵀ`), once per activation, whichever weight reads it.
//! docs/precision.md gives the measured reasons.

use crate::npu::layout;
use crate::npu::soc::SocDesc;
use crate::npu::{check_shape_soc, NpuError, TiledWeight};
use crate::quant;
use crate::quant::rotate::Rotation;

/// The GGUF bytes of a weight `[N, K]` and a row dequantizer (ggml's `to_float` for its type).
pub struct WeightSource<'a> {
    /// The tensor's name (part of the cache key; may be empty).
    pub name: &'a str,
    pub ggml_type: u32,
    /// All N rows, `row_bytes` each.
    pub bytes: &'a [u8],
    pub row_bytes: usize,
    /// Dequantizes one row's bytes into `[K] f32`.
    pub to_float: &'a (dyn Fn(&[u8], &mut [f32]) + Sync),
}

impl WeightSource<'_> {
    /// Row `r`'s source bytes (`row_bytes` of them).
    pub fn row(&self, r: usize) -> &[u8] {
        &self.bytes[r * self.row_bytes..(r + 1) * self.row_bytes]
    }

    /// Dequantizes row `r` into `out: [K] f32`.
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        (self.to_float)(self.row(r), out)
    }
}

/// Runs `f` with `src` seen through the rotation `rot` (`None`: `src` itself): every dequantized
/// row `w` becomes `w·R`.
fn with_rotation<R>(src: &WeightSource<'_>, rot: Option<&Rotation>, f: impl FnOnce(&WeightSource<'_>) -> R) -> R {
    let Some(rot) = rot else { return f(src) };
    let to_float = |b: &[u8], out: &mut [f32]| {
        (src.to_float)(b, out);
        rot.apply_row(out);
    };
    f(&WeightSource { name: src.name, ggml_type: src.ggml_type, bytes: src.bytes, row_bytes: src.row_bytes, to_float: &to_float })
}

/// The column equalisation `[K]` of a (possibly rotated) source: each column's absolute maximum;
/// all ones with a rotation (see the module docs), which makes equalising an exact no-op.
fn column_equalisation(src: &WeightSource<'_>, n: usize, k: usize, rotated: bool) -> Vec<f32> {
    if rotated {
        vec![1.0; k]
    } else {
        quant::column_scales(n, k, |r, out| src.dequantize_row(r, out))
    }
}

/// `1 / col[k]`: the column equalisation as the factors the weight rows are multiplied by.
fn reciprocals(col: &[f32]) -> Vec<f32> {
    col.iter().map(|&c| 1.0 / c).collect()
}

/// Column-equalised per-output-channel int8 of a source weight (see `quant::column_scales`),
/// rotated by `rot` first when given: `(q: [N, K] i8, row_scales: [N] f32, col_scale: [K] f32)`
/// with `(W·R)[n][k] ≈ q[n][k] · row_scales[n] · col_scale[k]` (`R` = identity without `rot`).
pub fn quantize_source(src: &WeightSource<'_>, n: usize, k: usize, rot: Option<&Rotation>) -> (Vec<i8>, Vec<f32>, Vec<f32>) {
    with_rotation(src, rot, |src| {
        let col = column_equalisation(src, n, k, rot.is_some());
        let inv = reciprocals(&col);
        let (q, rs) = quant::quantize_weight(n, k, |r, out| {
            src.dequantize_row(r, out);
            equalise_row(out, &inv);
        });
        (q, rs, col)
    })
}

/// `y = W·x` for the source weight `W: [N, K]` as ggml dequantizes it (`to_float`, unrotated) and
/// `x: [K]`: the host's exact product on one row (the calibrated correction's `d·Wᵀ`, `quant::mean`). f32
/// products summed in eight f32 lanes per row (no f64: K·N of them per matmul), rows spread over
/// rayon's threads in blocks of 64.
pub fn source_matvec(src: &WeightSource<'_>, n: usize, k: usize, x: &[f32]) -> Vec<f32> {
    use rayon::prelude::*;
    assert_eq!(x.len(), k, "x is not [K]");
    let mut y = vec![0f32; n];
    y.par_chunks_mut(64).enumerate().for_each_init(
        || vec![0f32; k],
        |row, (b, ys)| {
            for (i, yv) in ys.iter_mut().enumerate() {
                src.dequantize_row(b * 64 + i, row);
                *yv = dot8(row, x);
            }
        },
    );
    y
}

/// `y = d·Q(W)ᵀ` in f64 for the int8 terms packing gives `src` (the first term, and the residual
/// term too when `two_terms`), rotated by `rot` as packing does: the product the NPU's held weight
/// makes with a row `d` that is not rounded (the calibrated correction's `e`, `quant::mean`).
/// Quantizes the whole weight again, exactly as [`pack_source`] does.
pub fn held_matvec(src: &WeightSource<'_>, n: usize, k: usize, rot: Option<&Rotation>, two_terms: bool, d: &[f32]) -> Vec<f64> {
    assert_eq!(d.len(), k, "d is not [K]");
    let mut dr = d.to_vec();
    if let Some(r) = rot {
        r.apply_row(&mut dr);
    }
    let (q, s, col) = quantize_source(src, n, k, rot);
    let x: Vec<f64> = dr.iter().zip(&col).map(|(&v, &c)| v as f64 * c as f64).collect();
    let term = |q: &[i8], s: &[f32]| -> Vec<f64> { q.chunks_exact(k).zip(s).map(|(row, &sc)| row.iter().zip(&x).map(|(&a, &b)| a as f64 * b).sum::<f64>() * sc as f64).collect() };
    let mut y = term(&q, &s);
    if two_terms {
        let (ql, sl) = quantize_residual(src, n, k, rot, &col, &q, &s);
        y.iter_mut().zip(term(&ql, &sl)).for_each(|(a, b)| *a += b);
    }
    y
}

/// `Σ a·b` in eight f32 lanes (each lane's products summed in order, then the lanes pairwise):
/// the compiler turns it into SIMD multiplies and adds.
fn dot8(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for l in 0..8 {
            acc[l] += x[l] * y[l];
        }
    }
    let tail: f32 = ra.iter().zip(rb).map(|(&x, &y)| x * y).sum();
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail
}

/// `v[j] ← v[j] · inv[j]`: a dequantized weight row divided by the column equalisation (as its
/// reciprocal). The first step of both weight terms, in every packing path.
fn equalise_row(v: &mut [f32], inv: &[f32]) {
    for (v, &i) in v.iter_mut().zip(inv) {
        *v *= i;
    }
}

/// `v[j] ← v[j] − s · q[j]` (multiply, then subtract; never fused): what the first int8 term
/// `(q, s)` leaves of an equalised row, which the second term quantizes.
fn residual_row(v: &mut [f32], s: f32, q: &[i8]) {
    for (v, &qv) in v.iter_mut().zip(q) {
        *v -= s * qv as f32;
    }
}

/// A source weight packed for the NPU: `terms` tiled blobs (the first term, then the residual
/// term), the first term's row scales `[N]`, the column equalisation `[K]`, and the second
/// term's row scales `[N]` (empty for one term).
pub struct PackedSource {
    pub tiles: Vec<TiledWeight>,
    pub scales: Vec<f32>,
    pub col_scale: Vec<f32>,
    pub lo_scales: Vec<f32>,
}

/// [`quantize_source`] (and, for `terms == 2`, [`quantize_residual`]) followed by
/// `npu::layout::tile_weight` of each term, fused: the column scales in a first pass over the source,
/// then each 32-row block is dequantized, equalised, quantized (both terms) and tiled while its
/// rows are in the CPU cache (`npu::layout::tile_weight_with`). One dequantization pass fewer than the
/// separate steps for two terms, and no untiled `[N, K]` int8 copy. Bit-identical to them
/// (tested). `terms`: 1 or 2 (anything else is `NpuError::BadArg`).
pub fn pack_source(soc: &SocDesc, src: &WeightSource<'_>, n: usize, k: usize, terms: usize, rot: Option<&Rotation>) -> Result<PackedSource, NpuError> {
    pack_source_sets(soc, src, n, k, layout::TileSets::Both, terms, rot)
}

/// [`pack_source`] into blobs holding the tile sets `sets` (`npu::plan::tile_sets`).
pub fn pack_source_sets(soc: &SocDesc, src: &WeightSource<'_>, n: usize, k: usize, sets: layout::TileSets, terms: usize, rot: Option<&Rotation>) -> Result<PackedSource, NpuError> {
    with_rotation(src, rot, |src| pack_rows(soc, src, n, k, sets, terms, rot.is_some()))
}

/// [`pack_source_sets`] of an already rotated (or unrotated) source.
fn pack_rows(soc: &SocDesc, src: &WeightSource<'_>, n: usize, k: usize, sets: layout::TileSets, terms: usize, rotated: bool) -> Result<PackedSource, NpuError> {
    if !(1..=2).contains(&terms) {
        return Err(NpuError::BadArg { op: "pack_source", m: 0, k, n, why: format!("{terms} weight terms (1 or 2)") });
    }
    // A shape the NPU cannot hold fails before any pass over the source.
    check_shape_soc(soc, n, k)?;
    let col_scale = column_equalisation(src, n, k, rotated);
    let inv = reciprocals(&col_scale);
    let block = layout::BLOCK;
    let (tiles, per_block) = layout::tile_weight_sets_with(soc, n, k, sets, terms, |b, rows| {
        let mut buf = vec![0f32; k];
        let mut s = [[0f32; layout::BLOCK]; 2];
        let (hi, lo) = rows.split_at_mut(block * k);
        for nl in 0..block {
            // quantize_source's steps, then quantize_residual's, on the same row
            src.dequantize_row(b * block + nl, &mut buf);
            equalise_row(&mut buf, &inv);
            let q = &mut hi[nl * k..(nl + 1) * k];
            s[0][nl] = quant::quantize_row(&buf, q);
            if terms == 2 {
                residual_row(&mut buf, s[0][nl], q);
                s[1][nl] = quant::quantize_row(&buf, &mut lo[nl * k..(nl + 1) * k]);
            }
        }
        s
    })?;
    let scales = per_block.iter().flat_map(|s| s[0]).collect();
    let lo_scales = if terms == 2 { per_block.iter().flat_map(|s| s[1]).collect() } else { Vec::new() };
    Ok(PackedSource { tiles, scales, col_scale, lo_scales })
}

/// The second weight term: per-channel int8 of `W·R/col − q·s` (`q, s, col` the first term from
/// [`quantize_source`] with the same `rot`). Returns `(q_lo: [N, K] i8, s_lo: [N] f32)`.
#[allow(clippy::too_many_arguments)] // the first term's three parts, as quantize_source returns them
pub fn quantize_residual(src: &WeightSource<'_>, n: usize, k: usize, rot: Option<&Rotation>, col: &[f32], q: &[i8], s: &[f32]) -> (Vec<i8>, Vec<f32>) {
    with_rotation(src, rot, |src| {
        let inv = reciprocals(col);
        quant::quantize_weight(n, k, |r, out| {
            src.dequantize_row(r, out);
            equalise_row(out, &inv);
            residual_row(out, s[r], &q[r * k..(r + 1) * k]);
        })
    })
}

