//! W8A8 quantization: the host-side arithmetic around an int8 NPU matmul.
//!
//! * Weights: any ggml type that ggml can dequantize (`to_float` from the host's type traits) →
//!   f32 row → **per-output-channel symmetric int8**: `scale_n = max(|w[n][·]|, 1e-9) / 127`,
//!   `q = round_half_even(w · 127 / max)`, clamped to [-127, 127] (rknpu-facts §6).
//! * Activations: **per-row symmetric int8**, the same formula per row of `x: [M, K]`.
//! * Output: `y[m][n] = c[m][n] · a_scale[m] · w_scale[n]` with `c` the exact int32 sum.
//!
//! Every row kernel has a scalar definition (`*_scalar`) that the tests treat as the reference.
//! The hot row loops dispatch to SIMD versions in [`simd`] (NEON on aarch64, AVX2 on x86-64 when
//! the CPU has it) that are bit-identical to those references, and rayon spreads rows over cores.

use rayon::prelude::*;

pub mod simd;

/// Floor on a row's absolute maximum, so an all-zero row quantizes to zeros with a finite scale.
pub const ABSMAX_FLOOR: f32 = 1e-9;
/// Largest int8 magnitude used (symmetric: -128 is never produced).
pub const QMAX: f32 = 127.0;

/// Rows at or above this many elements in total are quantized in parallel.
const PAR_MIN_ELEMS: usize = 1 << 15;

/// Quantizes one row. `x: [K] f32` → `q: [K] i8`; returns the dequantization scale.
/// SIMD where the CPU has it, bit-identical to [`quantize_row_scalar`].
#[inline]
pub fn quantize_row(x: &[f32], q: &mut [i8]) -> f32 {
    match simd::quantize_row(x, q) {
        Some(s) => s,
        None => quantize_row_scalar(x, q),
    }
}

/// The reference for [`quantize_row`]: absmax over the row (NaN ignored, floored at
/// [`ABSMAX_FLOOR`]), `q = clamp(round_half_even(v · (127 / amax)), ±127)`, NaN → 0.
pub fn quantize_row_scalar(x: &[f32], q: &mut [i8]) -> f32 {
    assert_eq!(x.len(), q.len());
    let mut amax = 0.0f32;
    for &v in x {
        amax = amax.max(v.abs());
    }
    let amax = amax.max(ABSMAX_FLOOR);
    let inv = QMAX / amax;
    for (d, &v) in q.iter_mut().zip(x) {
        *d = (v * inv).round_ties_even().clamp(-QMAX, QMAX) as i8;
    }
    amax / QMAX
}

/// Quantizes `x: [rows, cols] f32` row-major into `q: [rows, cols] i8` and `scales: [rows]`.
pub fn quantize_rows(x: &[f32], rows: usize, cols: usize, q: &mut [i8], scales: &mut [f32]) {
    assert_eq!(x.len(), rows * cols, "x is not [rows, cols]");
    assert_eq!(q.len(), rows * cols, "q is not [rows, cols]");
    assert_eq!(scales.len(), rows, "scales is not [rows]");
    if cols == 0 {
        scales.iter_mut().for_each(|s| *s = ABSMAX_FLOOR / QMAX);
        return;
    }
    if rows * cols >= PAR_MIN_ELEMS && rows > 1 {
        x.par_chunks(cols)
            .zip(q.par_chunks_mut(cols))
            .zip(scales.par_iter_mut())
            .for_each(|((xr, qr), s)| *s = quantize_row(xr, qr));
    } else {
        for ((xr, qr), s) in x.chunks(cols).zip(q.chunks_mut(cols)).zip(scales.iter_mut()) {
            *s = quantize_row(xr, qr);
        }
    }
}

/// Quantizes a weight `[N, K]` given a row dequantizer: `row(n, out)` fills `out: [K] f32` with
/// row n. Returns `(q: [N, K] i8, scales: [N] f32)`. Runs on all cores.
pub fn quantize_weight<F>(n: usize, k: usize, row: F) -> (Vec<i8>, Vec<f32>)
where
    F: Fn(usize, &mut [f32]) + Sync,
{
    let mut q = vec![0i8; n * k];
    let mut scales = vec![0f32; n];
    if k == 0 {
        return (q, scales);
    }
    // Chunks of rows per task so the f32 scratch is reused.
    const ROWS_PER_TASK: usize = 16;
    q.par_chunks_mut(k * ROWS_PER_TASK)
        .zip(scales.par_chunks_mut(ROWS_PER_TASK))
        .enumerate()
        .for_each(|(t, (qc, sc))| {
            let mut buf = vec![0f32; k];
            for (i, (qr, s)) in qc.chunks_mut(k).zip(sc.iter_mut()).enumerate() {
                row(t * ROWS_PER_TASK + i, &mut buf);
                *s = quantize_row(&buf, qr);
            }
        });
    (q, scales)
}

/// Multi-term activation quantization: `x ≈ Σ_t s_t·q_t` per row, where term t quantizes the
/// residual left by terms `0..t`. Rows `t·M..(t+1)·M` of `q`/`scales` hold term t
/// (`q: [T·M, K] i8`, `scales: [T·M]`), so one NPU matmul of T·M rows against the same resident
/// weight computes every term. Per-row int8 stays exact on the device while outlier-heavy
/// activations (LLM hidden states) get about 7 more bits per extra term.
pub fn quantize_rows_terms(x: &[f32], rows: usize, cols: usize, terms: usize, q: &mut [i8], scales: &mut [f32]) {
    assert!(terms >= 1, "at least one term");
    assert_eq!(q.len(), terms * rows * cols, "q is not [T·M, K]");
    assert_eq!(scales.len(), terms * rows, "scales is not [T·M]");
    let mut r = x.to_vec();
    for t in 0..terms {
        let qt = &mut q[t * rows * cols..(t + 1) * rows * cols];
        let st = &mut scales[t * rows..(t + 1) * rows];
        quantize_rows(&r, rows, cols, qt, st);
        if t + 1 < terms && cols > 0 {
            for ((rr, qr), &sc) in r.chunks_mut(cols).zip(qt.chunks(cols)).zip(st.iter()) {
                for (d, &qv) in rr.iter_mut().zip(qr) {
                    *d -= sc * qv as f32;
                }
            }
        }
    }
}

/// Output of a multi-term matmul: `c: [T·M, N]` (term-major rows) →
/// `dst[m][n] = Σ_t c_t[m][n] · s_t[m] · w_scale[n]`.
pub fn dequantize_output_terms(c: &[i32], a_scale: &[f32], terms: usize, w_scale: &[f32], dst: &mut [f32]) {
    let n = w_scale.len();
    let m = a_scale.len() / terms.max(1);
    assert_eq!(c.len(), terms * m * n, "c is not [T·M, N]");
    assert_eq!(dst.len(), m * n, "dst is not [M, N]");
    if terms == 1 {
        return dequantize_output(c, a_scale, w_scale, dst);
    }
    if n == 0 {
        return;
    }
    let body = |(i, dr): (usize, &mut [f32])| {
        dr.iter_mut().for_each(|d| *d = 0.0);
        for t in 0..terms {
            let sa = a_scale[t * m + i];
            let cr = &c[(t * m + i) * n..(t * m + i + 1) * n];
            dequantize_row_acc(cr, sa, w_scale, dr);
        }
    };
    if m * n >= PAR_MIN_ELEMS && m > 1 {
        dst.par_chunks_mut(n).enumerate().for_each(body);
    } else {
        dst.chunks_mut(n).enumerate().for_each(body);
    }
}

/// Per-input-channel equalisation of a weight `[N, K]`: `col[k] = max_n |W[n][k]|` (1 for an
/// all-zero column). The weight is quantized as `W[n][k] / col[k]` and the activations as
/// `x[k] · col[k]`, which leaves the product unchanged while flattening each weight row's
/// dynamic range, so per-channel int8 keeps resolution in small columns (SmoothQuant with all
/// the difficulty moved to the activations, which the two-term activation quantizer absorbs).
pub fn column_scales<F>(n: usize, k: usize, row: F) -> Vec<f32>
where
    F: Fn(usize, &mut [f32]) + Sync,
{
    const ROWS_PER_TASK: usize = 32;
    let tasks = n.div_ceil(ROWS_PER_TASK);
    let col = (0..tasks)
        .into_par_iter()
        .map(|t| {
            let mut m = vec![0f32; k];
            let mut buf = vec![0f32; k];
            for r in t * ROWS_PER_TASK..((t + 1) * ROWS_PER_TASK).min(n) {
                row(r, &mut buf);
                for (a, &v) in m.iter_mut().zip(&buf) {
                    *a = a.max(v.abs());
                }
            }
            m
        })
        .reduce(|| vec![0f32; k], |mut a, b| {
            for (x, y) in a.iter_mut().zip(b) {
                *x = x.max(y);
            }
            a
        });
    col.into_iter().map(|c| if c > 0.0 && c.is_finite() { c } else { 1.0 }).collect()
}

/// `x[m][k] · col[k]` for `x: [M, K]` (activations entering a column-equalised weight).
pub fn scale_columns(x: &[f32], col: &[f32]) -> Vec<f32> {
    let k = col.len().max(1);
    let mut out = vec![0f32; x.len()];
    for (o, xr) in out.chunks_mut(k).zip(x.chunks(k)) {
        for ((d, &v), &c) in o.iter_mut().zip(xr).zip(col) {
            *d = v * c;
        }
    }
    out
}

/// `dst[m][n] = c[m][n] · a_scale[m] · w_scale[n]`; all row-major, `c, dst: [M, N]`.
pub fn dequantize_output(c: &[i32], a_scale: &[f32], w_scale: &[f32], dst: &mut [f32]) {
    let n = w_scale.len();
    let m = a_scale.len();
    assert_eq!(c.len(), m * n, "c is not [M, N]");
    assert_eq!(dst.len(), m * n, "dst is not [M, N]");
    if n == 0 {
        return;
    }
    let body = |(cr, (dr, &sa)): (&[i32], (&mut [f32], &f32))| dequantize_row(cr, sa, w_scale, dr);
    if m * n >= PAR_MIN_ELEMS && m > 1 {
        c.par_chunks(n).zip(dst.par_chunks_mut(n).zip(a_scale.par_iter())).for_each(body);
    } else {
        c.chunks(n).zip(dst.chunks_mut(n).zip(a_scale.iter())).for_each(body);
    }
}

/// One output row: `d[n] = c[n] · (sa · sw[n])`. SIMD where the CPU has it, bit-identical to
/// [`dequantize_row_scalar`].
#[inline]
pub fn dequantize_row(c: &[i32], sa: f32, sw: &[f32], d: &mut [f32]) {
    if simd::dequantize_row(c, sa, sw, d).is_none() {
        dequantize_row_scalar(c, sa, sw, d);
    }
}

/// The reference for [`dequantize_row`].
pub fn dequantize_row_scalar(c: &[i32], sa: f32, sw: &[f32], d: &mut [f32]) {
    assert!(c.len() == d.len() && sw.len() == d.len());
    for ((d, &v), &sw) in d.iter_mut().zip(c).zip(sw) {
        *d = v as f32 * (sa * sw);
    }
}

/// One term of a multi-term output row: `d[n] += c[n] · (sa · sw[n])`. SIMD where the CPU has
/// it, bit-identical to [`dequantize_row_acc_scalar`].
#[inline]
pub fn dequantize_row_acc(c: &[i32], sa: f32, sw: &[f32], d: &mut [f32]) {
    if simd::dequantize_row_acc(c, sa, sw, d).is_none() {
        dequantize_row_acc_scalar(c, sa, sw, d);
    }
}

/// The reference for [`dequantize_row_acc`] (multiply, then add: never fused).
pub fn dequantize_row_acc_scalar(c: &[i32], sa: f32, sw: &[f32], d: &mut [f32]) {
    assert!(c.len() == d.len() && sw.len() == d.len());
    for ((d, &v), &sw) in d.iter_mut().zip(c).zip(sw) {
        *d += v as f32 * (sa * sw);
    }
}

#[cfg(test)]
mod simd_tests;

#[cfg(test)]
mod tests {
    use super::*;

    /// Independent scalar statement of the formula (f64 max, explicit ties-to-even check).
    fn reference_row(x: &[f32]) -> (Vec<i8>, f32) {
        let amax = x.iter().fold(0f32, |a, v| a.max(v.abs())).max(ABSMAX_FLOOR);
        let inv = 127.0f32 / amax;
        let q = x
            .iter()
            .map(|&v| {
                let t = v * inv;
                let f = t.floor();
                let r = if t - f > 0.5 || (t - f == 0.5 && (f as i64) % 2 != 0) { f + 1.0 } else { f };
                r.clamp(-127.0, 127.0) as i8
            })
            .collect();
        (q, amax / 127.0)
    }

    fn lcg(seed: &mut u64) -> f32 {
        *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    #[test]
    fn rows_match_reference() {
        let mut s = 7u64;
        for &(rows, cols) in &[(1, 1), (1, 32), (3, 33), (17, 100), (64, 1024), (300, 576)] {
            let x: Vec<f32> = (0..rows * cols).map(|i| lcg(&mut s) * (1 + i % 7) as f32).collect();
            let mut q = vec![0i8; rows * cols];
            let mut sc = vec![0f32; rows];
            quantize_rows(&x, rows, cols, &mut q, &mut sc);
            for r in 0..rows {
                let (rq, rs) = reference_row(&x[r * cols..(r + 1) * cols]);
                assert_eq!(&q[r * cols..(r + 1) * cols], &rq[..], "row {r} of {rows}x{cols}");
                assert_eq!(sc[r], rs);
            }
        }
    }

    #[test]
    fn ties_round_to_even_and_clamp() {
        // amax 127 → inv 1: values are rounded as they are.
        let x = [127.0, 0.5, 1.5, 2.5, -0.5, -1.5, -127.0, 3.49];
        let mut q = [0i8; 8];
        let s = quantize_row(&x, &mut q);
        assert_eq!(q, [127, 0, 2, 2, 0, -2, -127, 3]);
        assert_eq!(s, 1.0);
    }

    #[test]
    fn zero_row_is_zero() {
        let mut q = [1i8; 4];
        let s = quantize_row(&[0.0; 4], &mut q);
        assert_eq!(q, [0; 4]);
        assert!(s > 0.0 && s < 1e-10);
    }

    #[test]
    fn weight_and_output_round_trip_error_is_small() {
        let (n, k, m) = (64, 256, 5);
        let mut s = 3u64;
        let w: Vec<f32> = (0..n * k).map(|_| lcg(&mut s)).collect();
        let x: Vec<f32> = (0..m * k).map(|_| lcg(&mut s)).collect();
        let (wq, ws) = quantize_weight(n, k, |r, out| out.copy_from_slice(&w[r * k..(r + 1) * k]));
        let mut xq = vec![0i8; m * k];
        let mut xs = vec![0f32; m];
        quantize_rows(&x, m, k, &mut xq, &mut xs);
        let c: Vec<i32> = (0..m * n)
            .map(|i| {
                let (mm, nn) = (i / n, i % n);
                (0..k).map(|kk| xq[mm * k + kk] as i32 * wq[nn * k + kk] as i32).sum()
            })
            .collect();
        let mut y = vec![0f32; m * n];
        dequantize_output(&c, &xs, &ws, &mut y);
        let (mut err, mut tot) = (0f64, 0f64);
        for mm in 0..m {
            for nn in 0..n {
                let exact: f64 = (0..k).map(|kk| x[mm * k + kk] as f64 * w[nn * k + kk] as f64).sum();
                err += (exact - y[mm * n + nn] as f64).powi(2);
                tot += exact * exact;
            }
        }
        let nmse = err / tot;
        assert!(nmse < 5e-4, "nmse {nmse}");
        assert!(nmse > 0.0, "quantization must change something");
    }
}
