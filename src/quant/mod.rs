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

pub mod mean;
pub mod rotate;
pub mod simd;
pub mod types;

/// Floor on a row's absolute maximum, so an all-zero row quantizes to zeros with a finite scale.
pub const ABSMAX_FLOOR: f32 = 1e-9;
/// Largest int8 magnitude used (symmetric: -128 is never produced).
pub const QMAX: f32 = 127.0;

/// Rows at or above this many elements in total are quantized in parallel.
const PAR_MIN_ELEMS: usize = 1 << 15;

/// Quantizes one row. `x: [K] f32` → `q: [K] i8`; returns the dequantization scale.
/// SIMD where the CPU has it, bit-identical to [`quantize_row_scalar`].
///
/// A finite row (the usual case) takes the two-pass fast path: [`simd::absmax_bits`], then
/// [`simd::quantize_row_finite`] without clamp or NaN handling; a row with a NaN or ±inf goes to
/// the general kernel.
#[inline]
pub fn quantize_row(x: &[f32], q: &mut [i8]) -> f32 {
    if let Some(a) = simd::absmax_bits(x) {
        if a <= simd::FINITE_MAX_BITS {
            let amax = f32::from_bits(a).max(ABSMAX_FLOOR);
            if simd::quantize_row_finite(x, QMAX / amax, q).is_some() {
                return amax / QMAX;
            }
        }
    }
    match simd::quantize_row(x, q) {
        Some(s) => s,
        None => quantize_row_scalar(x, q),
    }
}

/// The reference for [`simd::absmax_bits`]: `max(bits(|x[j]|))`, 0 for an empty row.
pub fn absmax_bits_scalar(x: &[f32]) -> u32 {
    x.iter().fold(0, |m, v| m.max(v.to_bits() & 0x7fff_ffff))
}

/// The reference for [`simd::quantize_residual`]: the reference quantize formula with a given
/// `inv`, then `r[j] = x[j] - s · (q[j] as f32)`; returns `max(bits(|r[j]|))`.
pub fn quantize_residual_scalar(x: &[f32], inv: f32, s: f32, q: &mut [i8], r: &mut [f32]) -> u32 {
    assert!(x.len() == q.len() && x.len() == r.len());
    let mut m = 0u32;
    for ((d, rr), &v) in q.iter_mut().zip(r.iter_mut()).zip(x) {
        *d = q1(v, inv);
        *rr = v - s * *d as f32;
        m = m.max(rr.to_bits() & 0x7fff_ffff);
    }
    m
}

fn absmax_bits(x: &[f32]) -> u32 {
    simd::absmax_bits(x).unwrap_or_else(|| absmax_bits_scalar(x))
}

/// The reference formula for one element, `clamp(round_half_even(v · inv), ±127)`: every scalar
/// loop here and every SIMD kernel's tail.
#[inline(always)]
pub(crate) fn q1(v: f32, inv: f32) -> i8 {
    (v * inv).round_ties_even().clamp(-QMAX, QMAX) as i8
}

fn quantize_finite(x: &[f32], inv: f32, q: &mut [i8]) {
    if simd::quantize_row_finite(x, inv, q).is_none() {
        for (d, &v) in q.iter_mut().zip(x) {
            *d = q1(v, inv);
        }
    }
}

fn quantize_residual(x: &[f32], inv: f32, s: f32, q: &mut [i8], r: &mut [f32]) -> u32 {
    simd::quantize_residual(x, inv, s, q, r).unwrap_or_else(|| quantize_residual_scalar(x, inv, s, q, r))
}

fn quantize_residual_inplace(r: &mut [f32], inv: f32, s: f32, q: &mut [i8]) -> u32 {
    simd::quantize_residual_inplace(r, inv, s, q).unwrap_or_else(|| {
        // No SIMD path: the reference on a copy of the source.
        let x = r.to_vec();
        quantize_residual_scalar(&x, inv, s, q, r)
    })
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
        *d = q1(v, inv);
    }
    amax / QMAX
}

/// `len` zeroed elements, zeroed on all rayon threads: a large `vec![0; len]` is zeroed by one
/// thread (a recycled heap block is memset by calloc), the serial step that kept weight packing
/// from scaling with cores.
pub fn par_zeroed<T: Copy + Default + Send + Sync>(len: usize) -> Vec<T> {
    let mut v = Vec::new();
    rayon::iter::repeat_n(T::default(), len).collect_into_vec(&mut v);
    v
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
    let mut q = par_zeroed::<i8>(n * k);
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
    assert_eq!(x.len(), rows * cols, "x is not [rows, cols]");
    assert_eq!(q.len(), terms * rows * cols, "q is not [T·M, K]");
    assert_eq!(scales.len(), terms * rows, "scales is not [T·M]");
    if terms == 1 {
        return quantize_rows(x, rows, cols, q, scales);
    }
    if cols == 0 {
        scales.iter_mut().for_each(|s| *s = ABSMAX_FLOOR / QMAX);
        return;
    }
    if terms * rows * cols < PAR_MIN_ELEMS || rows < 2 || rayon::current_num_threads() < 2 {
        with_scratch(cols, |r| {
            for (i, xr) in x.chunks(cols).enumerate() {
                let mut row = RowTerms::new(xr, r, terms);
                for t in 0..terms {
                    let at = t * rows + i;
                    scales[at] = row.next(&mut q[at * cols..(at + 1) * cols]);
                }
            }
        });
        return;
    }
    // Blocks of rows, a few per thread; each block gets its rows of every term's slice.
    let per = rows.div_ceil(rayon::current_num_threads() * 4).max(1);
    let mut q_left: Vec<&mut [i8]> = q.chunks_mut(rows * cols).collect();
    let mut s_left: Vec<&mut [f32]> = scales.chunks_mut(rows).collect();
    rayon::scope(|sc| {
        for (b, xb) in x.chunks(per * cols).enumerate() {
            let nb = xb.len() / cols;
            let mut qb = Vec::with_capacity(terms);
            let mut sb = Vec::with_capacity(terms);
            for t in 0..terms {
                let (a, rest) = std::mem::take(&mut q_left[t]).split_at_mut(nb * cols);
                qb.push(a);
                q_left[t] = rest;
                let (a, rest) = std::mem::take(&mut s_left[t]).split_at_mut(nb);
                sb.push(a);
                s_left[t] = rest;
            }
            debug_assert!(b * per + nb <= rows);
            sc.spawn(move |_| {
                with_scratch(cols, |r| {
                    for (i, xr) in xb.chunks(cols).enumerate() {
                        let mut row = RowTerms::new(xr, r, terms);
                        for t in 0..terms {
                            sb[t][i] = row.next(&mut qb[t][i * cols..(i + 1) * cols]);
                        }
                    }
                })
            });
        }
    });
}

thread_local! {
    /// Per-thread residual row for [`quantize_rows_terms`] (grows to the largest K seen).
    static SCRATCH: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

fn with_scratch<R>(len: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
    SCRATCH.with(|c| match c.try_borrow_mut() {
        Ok(mut v) => {
            if v.len() < len {
                v.resize(len, 0.0);
            }
            f(&mut v[..len])
        }
        // re-entered on this thread (rayon work stealing inside f): a private buffer
        Err(_) => f(&mut vec![0f32; len]),
    })
}

/// One row of [`quantize_rows_terms`], one term per [`RowTerms::next`] call. The residual lives
/// in a K-float scratch row; the first term reads `x` directly. While the residual stays finite
/// each term is one fused pass (quantize + next residual + its absmax); a row with NaN or ±inf
/// runs the reference steps (general quantizer, then `r -= s · q`), which give the same bits.
struct RowTerms<'a> {
    x: &'a [f32],
    r: &'a mut [f32],
    t: usize,
    terms: usize,
    /// `absmax_bits` of the next term's source (x for t = 0, r after).
    a: u32,
}

impl<'a> RowTerms<'a> {
    fn new(x: &'a [f32], r: &'a mut [f32], terms: usize) -> Self {
        let a = absmax_bits(x);
        RowTerms { x, r, t: 0, terms, a }
    }

    /// Quantizes the next term into `q` (one row of K), returns its scale.
    #[inline]
    fn next(&mut self, q: &mut [i8]) -> f32 {
        let (first, last) = (self.t == 0, self.t + 1 >= self.terms);
        self.t += 1;
        if self.a <= simd::FINITE_MAX_BITS {
            let amax = f32::from_bits(self.a).max(ABSMAX_FLOOR);
            let (inv, s) = (QMAX / amax, amax / QMAX);
            match (first, last) {
                (true, true) => quantize_finite(self.x, inv, q),
                (false, true) => quantize_finite(self.r, inv, q),
                (true, false) => self.a = quantize_residual(self.x, inv, s, q, self.r),
                (false, false) => self.a = quantize_residual_inplace(self.r, inv, s, q),
            }
            return s;
        }
        if first && last {
            return quantize_row(self.x, q);
        }
        if first {
            self.r.copy_from_slice(self.x);
        }
        let s = quantize_row(self.r, q);
        if !last {
            for (d, &qv) in self.r.iter_mut().zip(q.iter()) {
                *d -= s * qv as f32;
            }
            self.a = absmax_bits(self.r);
        }
        s
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
    if terms == 0 {
        return dst.fill(0.0);
    }
    if n == 0 {
        return;
    }
    let body = |(i, dr): (usize, &mut [f32])| {
        let row = |t: usize| &c[(t * m + i) * n..(t * m + i + 1) * n];
        // terms 0 and 1 in one pass (= zero the row, then accumulate each), the rest accumulated
        dequantize_row2(row(0), a_scale[i], row(1), a_scale[m + i], w_scale, dr);
        for t in 2..terms {
            dequantize_row_acc(row(t), a_scale[t * m + i], w_scale, dr);
        }
    };
    for_each_out_row(dst, n, body);
}

/// Two activation terms against a weight with a second term, in one pass:
/// `dst = dequantize_output_terms(c, a_scale, 2, w_scale)` then `dst[m] += cl[m] · (a_scale[m] ·
/// lo_scale)` (the second weight term meets the first activation term only), bit-identical to
/// doing the two in turn. `c: [2·M, N]`, `a_scale: [2·M]`, `cl, dst: [M, N]`.
pub fn dequantize_output_2lo(c: &[i32], a_scale: &[f32], w_scale: &[f32], cl: &[i32], lo_scale: &[f32], dst: &mut [f32]) {
    let n = w_scale.len();
    let m = a_scale.len() / 2;
    assert_eq!(a_scale.len(), 2 * m, "a_scale is not [2·M]");
    assert_eq!(c.len(), 2 * m * n, "c is not [2·M, N]");
    assert!(cl.len() == m * n && dst.len() == m * n && lo_scale.len() == n, "cl/dst are not [M, N]");
    if n == 0 {
        return;
    }
    let body = |(i, dr): (usize, &mut [f32])| {
        let row = |t: usize| &c[(t * m + i) * n..(t * m + i + 1) * n];
        dequantize_row2_lo(row(0), a_scale[i], row(1), a_scale[m + i], w_scale, &cl[i * n..(i + 1) * n], a_scale[i], lo_scale, dr);
    };
    for_each_out_row(dst, n, body);
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
    let mut out = vec![0f32; x.len()];
    scale_columns_into(x, col, &mut out);
    out
}

/// [`scale_columns`] into a caller's buffer (`out.len() == x.len()`), e.g. a reused scratch.
pub fn scale_columns_into(x: &[f32], col: &[f32], out: &mut [f32]) {
    assert_eq!(out.len(), x.len(), "out is not the size of x");
    let k = col.len().max(1);
    for (o, xr) in out.chunks_mut(k).zip(x.chunks(k)) {
        for ((d, &v), &c) in o.iter_mut().zip(xr).zip(col) {
            *d = v * c;
        }
    }
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
    for_each_out_row(dst, n, |(i, dr)| dequantize_row(&c[i * n..(i + 1) * n], a_scale[i], w_scale, dr));
}

/// Calls `body((i, row i))` for every N-wide row of `dst: [M, N]` (N > 0), on the rayon pool
/// when the output is large enough to pay for the dispatch.
fn for_each_out_row(dst: &mut [f32], n: usize, body: impl Fn((usize, &mut [f32])) + Send + Sync) {
    let m = dst.len() / n;
    if m * n >= PAR_MIN_ELEMS && m > 1 {
        dst.par_chunks_mut(n).enumerate().for_each(body);
    } else {
        dst.chunks_mut(n).enumerate().for_each(body);
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

/// Two output terms at once: `d = 0`, then [`dequantize_row_acc`] with `(c0, sa0)` and
/// `(c1, sa1)`, in one pass. SIMD where the CPU has it, bit-identical to
/// [`dequantize_row2_scalar`].
#[inline]
pub fn dequantize_row2(c0: &[i32], sa0: f32, c1: &[i32], sa1: f32, sw: &[f32], d: &mut [f32]) {
    if simd::dequantize_row2(c0, sa0, c1, sa1, sw, d).is_none() {
        dequantize_row2_scalar(c0, sa0, c1, sa1, sw, d);
    }
}

/// The reference for [`dequantize_row2`]: `d[j] = (0 + c0·(sa0·sw)) + c1·(sa1·sw)`.
pub fn dequantize_row2_scalar(c0: &[i32], sa0: f32, c1: &[i32], sa1: f32, sw: &[f32], d: &mut [f32]) {
    assert!(c0.len() == d.len() && c1.len() == d.len() && sw.len() == d.len());
    for j in 0..d.len() {
        d[j] = (0.0 + c0[j] as f32 * (sa0 * sw[j])) + c1[j] as f32 * (sa1 * sw[j]);
    }
}

/// [`dequantize_row2`] and then [`dequantize_row_acc`]`(cl, sal, swl)` (a second weight term) in
/// one pass; SIMD where the CPU has it, bit-identical to [`dequantize_row2_lo_scalar`].
#[inline]
#[allow(clippy::too_many_arguments)]
pub fn dequantize_row2_lo(c0: &[i32], sa0: f32, c1: &[i32], sa1: f32, sw: &[f32], cl: &[i32], sal: f32, swl: &[f32], d: &mut [f32]) {
    if simd::dequantize_row2_lo(c0, sa0, c1, sa1, sw, cl, sal, swl, d).is_none() {
        dequantize_row2_lo_scalar(c0, sa0, c1, sa1, sw, cl, sal, swl, d);
    }
}

/// The reference for [`dequantize_row2_lo`]: `d[j] = ((0 + c0·(sa0·sw)) + c1·(sa1·sw)) + cl·(sal·swl)`.
#[allow(clippy::too_many_arguments)]
pub fn dequantize_row2_lo_scalar(c0: &[i32], sa0: f32, c1: &[i32], sa1: f32, sw: &[f32], cl: &[i32], sal: f32, swl: &[f32], d: &mut [f32]) {
    let n = d.len();
    assert!(c0.len() == n && c1.len() == n && sw.len() == n && cl.len() == n && swl.len() == n);
    for j in 0..n {
        d[j] = ((0.0 + c0[j] as f32 * (sa0 * sw[j])) + c1[j] as f32 * (sa1 * sw[j])) + cl[j] as f32 * (sal * swl[j]);
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

    #[test]
    fn dequantize_output_2lo_matches_two_terms_then_the_second_weight_term() {
        // decode (M = 1, serial) and a prefill block large enough for the parallel path
        for &(m, n) in &[(1usize, 72usize), (1, 1536), (40, 1024), (3, 5)] {
            let mut seed = 0x2101u64 + (m * n) as u64;
            let mut next = || {
                seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                (seed >> 33) as u32
            };
            let mut ci = |len: usize| -> Vec<i32> { (0..len).map(|_| (next() % 2_000_001) as i32 - 1_000_000).collect() };
            let (c, cl) = (ci(2 * m * n), ci(m * n));
            let mut fv = |len: usize, s: f32| -> Vec<f32> { (0..len).map(|_| (next() % 10_000 + 1) as f32 * s).collect() };
            let (a_scale, w_scale, lo_scale) = (fv(2 * m, 1e-4), fv(n, 1e-5), fv(n, 1e-7));
            let mut want = vec![0f32; m * n];
            dequantize_output_terms(&c, &a_scale, 2, &w_scale, &mut want);
            let mut extra = vec![0f32; m * n];
            dequantize_output(&cl, &a_scale[..m], &lo_scale, &mut extra);
            for (d, e) in want.iter_mut().zip(&extra) {
                *d += e;
            }
            let mut got = vec![7f32; m * n];
            dequantize_output_2lo(&c, &a_scale, &w_scale, &cl, &lo_scale, &mut got);
            for j in 0..m * n {
                assert_eq!(got[j].to_bits(), want[j].to_bits(), "m {m} n {n} j {j}");
            }
        }
    }
}
