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

use crate::os::team;

pub mod mean;
pub mod rotate;
pub mod simd;
pub mod types;

/// Floor on a row's absolute maximum, so an all-zero row quantizes to zeros with a finite scale.
pub const ABSMAX_FLOOR: f32 = 1e-9;
/// Largest int8 magnitude used (symmetric: -128 is never produced).
pub const QMAX: f32 = 127.0;

/// Rows at or above this many elements in total are quantized (dequantized) in parallel.
pub const PAR_MIN_ELEMS: usize = 1 << 15;

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

thread_local! {
    /// Per-thread row buffers of [`prepare_rows_hashed`] (grow to the largest size asked).
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

/// One row's int8 terms ([`prepare_rows_hashed`]), one term per [`RowTerms::next`] call. The residual lives
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

/// The longest activation row [`prepare_rows_hashed`] takes four at a time (with their dots); rows up to
/// twice as long go two at a time, longer ones alone. `ORK_BENCH_ONLY=mean cargo run --release
/// --example bench_host` (one core, µs per token of the dot): K = 2048 in fours 0.2, in pairs
/// 0.00–0.06, alone 0.04–0.10; K = 6144 at M = 512 in pairs 0.62–0.74, alone 0.18–0.31 (the rows,
/// their copies and the direction overflow L1).
const DOT_GROUP_MAX_K: usize = 1024;

/// What makes an activation row the row the NPU's weight expects: the weight's rotation of K, or
/// its per-input-channel column scales.
#[derive(Clone, Copy)]
pub enum RowPrep<'a> {
    Rotate(&'a rotate::Rotation),
    Columns(&'a [f32]),
}

/// The identity of an activation row: XXH3-64 of its bytes ([`prepare_rows_hashed`] takes it
/// while the row is in cache for its activation pass).
#[inline]
pub fn row_hash(xr: &[f32]) -> u64 {
    twox_hash::XxHash3_64::oneshot(bytemuck::cast_slice(xr))
}

/// The activation pass of an NPU matmul, rows in parallel: each row of `x: [M, K]` is rotated
/// (or column-scaled) into a per-thread row buffer and quantized into `terms` int8 terms straight
/// from it, `x ≈ Σ_t s_t·q_t` per row with term t quantizing the residual of terms `0..t` (about
/// 7 more bits per term for outlier-heavy rows). Term-major: rows `t·M..(t+1)·M` of
/// `q: [T·M, K]` / `scales: [T·M]` hold term t, so one NPU matmul of T·M rows against the
/// resident weight computes every term. With a calibrated direction `dir: [K]`,
/// `dots[m] = x_m·dir` ([`mean::dot16`] on the row as it came in), taken while the row is in
/// cache; with `hashes: [M]` (else empty), each row's [`row_hash`], the activation's reuse key.
///
/// Every output row is computed from its input row alone, by the same per-row kernels as
/// `scale_columns_into` / `Rotation::apply_row` followed by the per-row quantizer and
/// [`mean::correct_along`]'s dot, so the bits are theirs whatever the split over threads (the
/// tests compare them). Runs on the team ([`team::for_each_block`]) when the rows are many.
#[allow(clippy::too_many_arguments)]
pub fn prepare_rows_hashed(x: &[f32], m: usize, k: usize, terms: usize, prep: RowPrep<'_>, dir: Option<&[f32]>, q: &mut [i8], scales: &mut [f32], dots: &mut [f32], hashes: &mut [u64]) {
    assert!(terms >= 1, "at least one term");
    assert!(hashes.is_empty() || hashes.len() == m, "hashes is not [M] (or empty)");
    assert_eq!(x.len(), m * k, "x is not [M, K]");
    assert_eq!(q.len(), terms * m * k, "q is not [T·M, K]");
    assert_eq!(scales.len(), terms * m, "scales is not [T·M]");
    assert_eq!(dots.len(), if dir.is_some() { m } else { 0 }, "dots is not [M] (or empty without a direction)");
    match prep {
        RowPrep::Rotate(r) => assert_eq!(r.k(), k, "the rotation is not of K"),
        RowPrep::Columns(c) => assert_eq!(c.len(), k, "the column scales are not [K]"),
    }
    if let Some(d) = dir {
        assert_eq!(d.len(), k, "the direction is not [K]");
    }
    if m == 0 {
        return;
    }
    if k == 0 {
        scales.iter_mut().for_each(|s| *s = ABSMAX_FLOOR / QMAX);
        dots.iter_mut().for_each(|d| *d = 0.0);
        hashes.iter_mut().for_each(|h| *h = row_hash(&[]));
        return;
    }
    // One block of rows: its input rows, its rows of every term's q / scales, its dots.
    struct Block<'b> {
        x: &'b [f32],
        q: Vec<&'b mut [i8]>,
        s: Vec<&'b mut [f32]>,
        dots: &'b mut [f32],
        h: &'b mut [u64],
    }
    let run = |b: Block<'_>| {
        let Block { x, mut q, mut s, dots, h } = b;
        // Row buffers for a group of rows and the residual. The dots of a group are taken in
        // the pass that brings its rows in (the copy for the rotation), the group's rows giving
        // the core independent chains of adds (a row alone waits on the add latency); the group
        // is then rotated and quantized row by row from the buffers. Rows up to 1024 go four at
        // a time, up to 2048 two, longer ones alone (more long rows and their copies do not stay
        // in L1; the one row's reads, from further away, then hide most of its dot's latency).
        let group = if k <= DOT_GROUP_MAX_K { 4 } else if k <= 2 * DOT_GROUP_MAX_K { 2 } else { 1 };
        with_scratch((group + 1) * k, |buf| {
            let (rows4, resid) = buf.split_at_mut(group * k);
            for (g, xg) in x.chunks(group * k).enumerate() {
                let nr = xg.len() / k;
                let r = |j: usize| &xg[j * k..(j + 1) * k];
                let g0 = group * g;
                match (prep, dir) {
                    (RowPrep::Rotate(_), Some(d)) if nr == 4 => {
                        dots[g0..g0 + 4].copy_from_slice(&mean::dot16_rows_copy([r(0), r(1), r(2), r(3)], d, &mut rows4[..4 * k]));
                    }
                    (RowPrep::Rotate(_), Some(d)) if group == 1 => {
                        dots[g0] = mean::dot16_rows_copy([r(0)], d, &mut rows4[..k])[0];
                    }
                    (RowPrep::Rotate(_), Some(d)) if nr == 2 => {
                        dots[g0..g0 + 2].copy_from_slice(&mean::dot16_rows_copy([r(0), r(1)], d, &mut rows4[..2 * k]));
                    }
                    _ => {
                        if let Some(d) = dir {
                            for (j, o) in dots[g0..g0 + nr].iter_mut().enumerate() {
                                *o = mean::dot16(r(j), d);
                            }
                        }
                        for (j, row) in rows4.chunks_exact_mut(k).take(nr).enumerate() {
                            match prep {
                                RowPrep::Rotate(_) => row.copy_from_slice(r(j)),
                                RowPrep::Columns(c) => {
                                    for ((o, &v), &c) in row.iter_mut().zip(r(j)).zip(c) {
                                        *o = v * c;
                                    }
                                }
                            }
                        }
                    }
                }
                for (j, row) in rows4.chunks_exact_mut(k).take(nr).enumerate() {
                    let i = g0 + j;
                    if let Some(h) = h.get_mut(i) {
                        *h = row_hash(r(j));
                    }
                    if let RowPrep::Rotate(rot) = prep {
                        rot.apply_row(row);
                    }
                    if terms == 1 {
                        s[0][i] = quantize_row(row, &mut q[0][i * k..(i + 1) * k]);
                    } else {
                        let mut rt = RowTerms::new(row, resid, terms);
                        for t in 0..terms {
                            s[t][i] = rt.next(&mut q[t][i * k..(i + 1) * k]);
                        }
                    }
                }
            }
        })
    };
    let per = block_rows(m, terms * m * k);
    let mut q_left: Vec<&mut [i8]> = q.chunks_mut(m * k).collect();
    let mut s_left: Vec<&mut [f32]> = scales.chunks_mut(m).collect();
    let (mut d_left, mut h_left) = (dots, hashes);
    let mut blocks = Vec::with_capacity(m.div_ceil(per));
    for xb in x.chunks(per * k) {
        let nb = xb.len() / k;
        let q = q_left.iter_mut().map(|t| take_front(t, nb * k)).collect();
        let s = s_left.iter_mut().map(|t| take_front(t, nb)).collect();
        let dots = take_front(&mut d_left, if dir.is_some() { nb } else { 0 });
        let hn = if h_left.is_empty() { 0 } else { nb };
        let h = take_front(&mut h_left, hn);
        blocks.push(Block { x: xb, q, s, dots, h });
    }
    team::for_each_block(blocks, run);
}

/// The first `n` elements of `*s`, which keeps the rest.
fn take_front<'a, T>(s: &mut &'a mut [T], n: usize) -> &'a mut [T] {
    let (a, rest) = std::mem::take(s).split_at_mut(n);
    *s = rest;
    a
}

/// Int32 results `[R, N]`: one row-major matrix, or column segments held apart (an NPU
/// matmul's cores each keep their columns in buffers of their own, `npu::Shares`).
#[derive(Clone, Copy)]
pub enum CRows<'a> {
    /// `[R, N]` row-major.
    Dense(&'a [i32]),
    /// Column segments; every column is in exactly one.
    Parts(&'a [CPart<'a>]),
}

/// A column range of [`CRows`] located once: row `r` is
/// `blocks[r / rows][(r % rows)·stride + at..][..nc]` (`one` when there are no blocks), or, with
/// `parts` > 1, the sum of `blocks[(r / rows)·parts + p]`'s for every `p` (a K-split's partials).
#[derive(Clone, Copy)]
pub struct Located<'a> {
    one: &'a [i32],
    blocks: &'a [&'a [i32]],
    rows: usize,
    parts: usize,
    stride: usize,
    at: usize,
    nc: usize,
}

impl<'a> Located<'a> {
    /// Partial `p` of row `r`'s columns.
    #[inline]
    fn partial(&self, r: usize, p: usize) -> &'a [i32] {
        let (c, r) = if self.blocks.is_empty() { (self.one, r) } else { (self.blocks[(r / self.rows) * self.parts + p], r % self.rows) };
        &c[r * self.stride + self.at..r * self.stride + self.at + self.nc]
    }

    /// The range's columns of row `r` (one partial: [`Located::sum_row`] otherwise).
    #[inline]
    pub fn row(&self, r: usize) -> &'a [i32] {
        debug_assert_eq!(self.parts, 1, "a row of partials is summed");
        self.partial(r, 0)
    }

    /// Row `r` into `out`: its partials added (wrapping, as the int32 sums they are; any order
    /// gives the same bits).
    pub fn sum_row(&self, r: usize, out: &mut Vec<i32>) {
        out.clear();
        out.extend_from_slice(self.partial(r, 0));
        for p in 1..self.parts {
            out.iter_mut().zip(self.partial(r, p)).for_each(|(o, &v)| *o = o.wrapping_add(v));
        }
    }
}

/// One column segment of [`CRows::Parts`]: global columns `n0..n0+nc` of `total` rows, in
/// blocks of `rows` rows (the last may hold fewer), each block as `parts` partials to add (a
/// K-split; 1 otherwise): row `r` is the sum over `p` of
/// `blocks[(r / rows)·parts + p][(r % rows)·stride + at..][..nc]`.
pub struct CPart<'a> {
    pub n0: usize,
    pub nc: usize,
    pub total: usize,
    pub rows: usize,
    pub parts: usize,
    pub stride: usize,
    pub at: usize,
    pub blocks: Vec<&'a [i32]>,
}

impl CPart<'_> {
    /// Whether its blocks hold its `total` rows.
    fn holds(&self) -> bool {
        self.rows > 0
            && self.parts > 0
            && self.blocks.len() == self.total.div_ceil(self.rows) * self.parts
            && self.blocks.iter().enumerate().all(|(b, c)| {
                let rows = self.rows.min(self.total - (b / self.parts) * self.rows);
                self.at + self.nc <= self.stride && c.len() >= (rows - 1) * self.stride + self.at + self.nc
            })
    }
}

impl<'a> CRows<'a> {
    /// The segments `(n0, nc)` of a row, by first column (`[(0, n)]` for a dense matrix).
    pub fn segments(&self, n: usize) -> Vec<(usize, usize)> {
        match self {
            CRows::Dense(_) => vec![(0, n)],
            CRows::Parts(parts) => {
                let mut v: Vec<(usize, usize)> = parts.iter().map(|p| (p.n0, p.nc)).collect();
                v.sort_unstable();
                v
            }
        }
    }

    /// Where each column range `(n0, nc)` of `segs` (each inside one segment) is held: a
    /// [`Located`] per range, so a row's range is one slice away ([`Located::row`]).
    pub fn locate(&self, segs: &[(usize, usize)], n: usize) -> Vec<Located<'a>> {
        segs.iter()
            .map(|&(n0, nc)| match *self {
                CRows::Dense(c) => Located { one: c, blocks: &[], rows: 0, parts: 1, stride: n, at: n0, nc },
                CRows::Parts(parts) => parts
                    .iter()
                    .find(|p| n0 >= p.n0 && n0 + nc <= p.n0 + p.nc)
                    .map(|p| Located { one: &[], blocks: &p.blocks, rows: p.rows, parts: p.parts, stride: p.stride, at: p.at + (n0 - p.n0), nc })
                    .unwrap_or_else(|| panic!("columns {n0}..{} are not inside one segment", n0 + nc)),
            })
            .collect()
    }

    /// Rows held (`R`), given the row length `n`.
    fn rows(&self, n: usize) -> usize {
        match self {
            CRows::Dense(c) => c.len().checked_div(n).unwrap_or(0),
            CRows::Parts(parts) => parts.first().map_or(0, |p| p.total),
        }
    }

    /// Whether it holds exactly `rows` rows of `n` columns.
    fn is(&self, rows: usize, n: usize) -> bool {
        match self {
            CRows::Dense(c) => c.len() == rows * n,
            CRows::Parts(parts) => {
                parts.iter().all(|p| p.total == rows && (rows == 0 || p.holds()))
                    && self.segments(n).iter().try_fold(0, |at, &(n0, nc)| (n0 == at).then_some(n0 + nc)) == Some(n)
            }
        }
    }
}

/// The int32 results of an NPU matmul and what turns them into `dst`, for [`dequantize_fused`].
pub struct Output<'a> {
    /// `c: [T·M, N]`, term-major rows (the activation terms against the first weight term).
    pub c: CRows<'a>,
    /// `[T·M]`, the activation terms' scales.
    pub a_scale: &'a [f32],
    pub terms: usize,
    /// `[N]`, the first weight term's scales.
    pub w_scale: &'a [f32],
    /// The second weight term: `cl: [L·M, N]` (the first L activation terms against it) and its
    /// scales `[N]`. Its segments are `c`'s or contain them.
    pub lo: Option<(CRows<'a>, &'a [f32])>,
    /// The calibrated correction: `coef: [M]`, each row's coefficient (`None` leaves the row),
    /// and `e: [N]`, the NPU's error along the weight's direction (`mean::Direction::err`).
    pub corr: Option<(&'a [Option<f32>], &'a [f32])>,
}

/// The output pass of an NPU matmul, one pass over `dst: [M, N]`, rows in parallel:
/// `dst[m] = Σ_t c_t[m]·(s_t[m]·w_scale) + Σ_l cl_l[m]·(s_l[m]·lo_scale) + coef[m]·e` — the
/// dequantization of every term, the second weight term and the calibrated correction, each
/// row finished while it is in cache. The same floats in the same order as every term's
/// dequantization in turn, then the second weight term's, then [`mean::correct_along`]'s add (the tests compare them bit for bit); a row depends on its own
/// inputs only.
pub fn dequantize_fused(o: &Output<'_>, dst: &mut [f32]) {
    let n = o.w_scale.len();
    let terms = o.terms;
    assert!(terms >= 1, "at least one term");
    let m = o.a_scale.len() / terms;
    assert_eq!(o.a_scale.len(), terms * m, "a_scale is not [T·M]");
    assert!(o.c.is(terms * m, n), "c is not [T·M, N]");
    assert_eq!(dst.len(), m * n, "dst is not [M, N]");
    let lt = match o.lo {
        Some((cl, ls)) => {
            assert_eq!(ls.len(), n, "lo_scale is not [N]");
            let lt = cl.rows(n).checked_div(m).unwrap_or(0);
            assert!(cl.is(lt * m, n) && lt <= terms, "cl is not [L·M, N] with L ≤ T");
            lt
        }
        None => 0,
    };
    if let Some((coef, e)) = o.corr {
        assert!(coef.len() == m && e.len() == n, "the correction is not [M] / [N]");
    }
    if n == 0 {
        return;
    }
    // Every formula is per column, so a row is finished segment by segment (the same floats).
    let segs = o.c.segments(n);
    let (cs, ls_at) = (o.c.locate(&segs, n), o.lo.map(|(cl, _)| cl.locate(&segs, n)));
    let body = |(i, drow): (usize, &mut [f32])| {
        for (j, &(n0, nc)) in segs.iter().enumerate() {
            let (cj, lj) = (&cs[j], ls_at.as_ref().map(|l| &l[j]));
            let dr = &mut drow[n0..n0 + nc];
            if cj.parts == 1 && lj.is_none_or(|l| l.parts == 1) {
                fused_segment(o, i, m, n0, lt, |t| cj.row(t * m + i), |t| lj.expect("a second term").row(t * m + i), dr);
            } else {
                // A K-split's partials, added per row into buffers of this thread's (in cache).
                PARTIAL_SUMS.with_borrow_mut(|bufs| {
                    bufs.resize_with(terms + lt, Vec::new);
                    let (bc, bl) = bufs.split_at_mut(terms);
                    for (t, b) in bc.iter_mut().enumerate() {
                        cj.sum_row(t * m + i, b);
                    }
                    for (t, b) in bl.iter_mut().enumerate() {
                        lj.expect("a second term").sum_row(t * m + i, b);
                    }
                    fused_segment(o, i, m, n0, lt, |t| &bc[t][..], |t| &bl[t][..], dr);
                });
            }
        }
    };
    for_each_out_row(dst, n, body);
}

thread_local! {
    /// Row buffers of [`dequantize_fused`] for results held as partials.
    static PARTIAL_SUMS: std::cell::RefCell<Vec<Vec<i32>>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Output row `i`'s columns `n0..n0 + dr.len()` of [`dequantize_fused`]: `row(t)` / `lrow(t)`
/// are the columns of activation term `t` against the first / second weight term.
#[allow(clippy::too_many_arguments)] // the output, the row, its columns and where its terms are
#[inline]
fn fused_segment<'r>(o: &Output<'_>, i: usize, m: usize, n0: usize, lt: usize, row: impl Fn(usize) -> &'r [i32], lrow: impl Fn(usize) -> &'r [i32], dr: &mut [f32]) {
    let (terms, nc) = (o.terms, dr.len());
    let ws = &o.w_scale[n0..n0 + nc];
    let sa = |t: usize| o.a_scale[t * m + i];
    let p = |t: usize| (row(t), sa(t), ws);
    let lo = |t: usize| (lrow(t), sa(t), o.lo.map_or(&[][..], |(_, ls)| &ls[n0..n0 + nc]));
    let corr = o.corr.and_then(|(coef, e)| coef[i].map(|c| (c, &e[n0..n0 + nc])));
    match (terms, o.lo.is_some(), lt) {
        (1, false, _) => dequantize::<1>(simd::FIRST, [p(0)], corr, dr),
        (2, true, 1) => dequantize::<3>(simd::ZERO, [p(0), p(1), lo(0)], corr, dr),
        _ => {
            if terms == 1 {
                dequantize::<1>(simd::FIRST, [p(0)], None, dr);
            } else {
                dequantize::<2>(simd::ZERO, [p(0), p(1)], None, dr);
                for t in 2..terms {
                    dequantize::<1>(simd::ACC, [p(t)], None, dr);
                }
            }
            for t in 0..lt {
                dequantize::<1>(simd::ACC, [lo(t)], None, dr);
            }
            if let Some((cc, e)) = corr {
                add_scaled_row(cc, e, dr);
            }
        }
    }
}

/// `d[j] += cc · e[j]` (multiply, then add: never fused), the correction's add on one row.
#[inline]
pub fn add_scaled_row(cc: f32, e: &[f32], d: &mut [f32]) {
    assert_eq!(e.len(), d.len());
    for (o, &v) in d.iter_mut().zip(e) {
        *o += cc * v;
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

/// Rows per task of a row-parallel pass over `rows` rows touching `elems` elements: all of them
/// in one task below [`PAR_MIN_ELEMS`] or without a team to share them, else a few tasks per
/// thread of the team ([`team::threads`]).
fn block_rows(rows: usize, elems: usize) -> usize {
    let threads = team::threads();
    if elems < PAR_MIN_ELEMS || rows < 2 || threads < 2 { rows.max(1) } else { rows.div_ceil(threads * 4).max(1) }
}

/// Calls `body((i, row i))` for every N-wide row of `dst: [M, N]` (N > 0), in blocks of rows on
/// the team ([`team::for_each`]) when the output is large enough to pay for the dispatch.
fn for_each_out_row(dst: &mut [f32], n: usize, body: impl Fn((usize, &mut [f32])) + Send + Sync) {
    let m = dst.len() / n;
    let per = block_rows(m, m * n);
    let blocks: Vec<(usize, &mut [f32])> = dst.chunks_mut(per * n).enumerate().collect();
    team::for_each_block(blocks, |(b, rows)| rows.chunks_mut(n).enumerate().for_each(|(j, r)| body((b * per + j, r))));
}

/// `out[r] = f(row r)` for the K-wide rows of `x: [R, K]`, in blocks of rows on the team when
/// they are many.
pub fn map_rows<T: Send>(x: &[f32], k: usize, out: &mut [T], f: impl Fn(&[f32]) -> T + Sync) {
    assert_eq!(x.len(), out.len() * k, "x is not [R, K]");
    let r = out.len();
    let per = block_rows(r, x.len());
    let blocks: Vec<(&[f32], &mut [T])> = x.chunks(per * k.max(1)).zip(out.chunks_mut(per)).collect();
    team::for_each_block(blocks, |(xb, ob)| xb.chunks(k.max(1)).zip(ob.iter_mut()).for_each(|(xr, o)| *o = f(xr)));
}

/// One output row's terms, SIMD where the CPU has it, bit-identical to [`dequantize_tail`]:
/// `d[j] = ((start + p[0]) + p[1]) + …`, then `+ cc·e[j]` with a correction `(cc, e)`. `start`
/// ([`simd::FIRST`], [`simd::ZERO`], [`simd::ACC`]): nothing, `0 +`, `d[j] +`; a product
/// `(c, sa, sw)` is `c[j] as f32 · (sa · sw[j])`. Multiply, then add: never fused.
#[inline]
pub fn dequantize<const N: usize>(init: u8, p: [(&[i32], f32, &[f32]); N], corr: Option<(f32, &[f32])>, d: &mut [f32]) {
    let n = d.len();
    assert!(p.iter().all(|(c, _, sw)| c.len() == n && sw.len() == n) && corr.is_none_or(|(_, e)| e.len() == n));
    let (cc, e) = corr.unwrap_or((0.0, &[]));
    let r = simd::Row { p, cc, e };
    fn run<const N: usize, const INIT: u8, const CORR: bool>(r: &simd::Row<'_, N>, d: &mut [f32]) {
        if simd::dequantize::<N, INIT, CORR>(r, d).is_none() {
            dequantize_tail::<N, INIT, CORR>(r, 0, d);
        }
    }
    match (init, corr.is_some()) {
        (simd::FIRST, false) => run::<N, { simd::FIRST }, false>(&r, d),
        (simd::FIRST, true) => run::<N, { simd::FIRST }, true>(&r, d),
        (simd::ZERO, false) => run::<N, { simd::ZERO }, false>(&r, d),
        (simd::ZERO, true) => run::<N, { simd::ZERO }, true>(&r, d),
        (_, false) => run::<N, { simd::ACC }, false>(&r, d),
        (_, true) => run::<N, { simd::ACC }, true>(&r, d),
    }
}

/// The reference for [`dequantize`] on the elements from `from` on (the SIMD kernels' tail).
pub fn dequantize_tail<const N: usize, const INIT: u8, const CORR: bool>(r: &simd::Row<'_, N>, from: usize, d: &mut [f32]) {
    for j in from..d.len() {
        let mut acc = match INIT {
            simd::ZERO => Some(0.0),
            simd::ACC => Some(d[j]),
            _ => None,
        };
        for &(c, sa, sw) in &r.p {
            let v = c[j] as f32 * (sa * sw[j]);
            acc = Some(acc.map_or(v, |a| a + v));
        }
        let v = acc.expect("a product");
        d[j] = if CORR { v + r.cc * r.e[j] } else { v };
    }
}

#[cfg(test)]
mod simd_tests;

#[cfg(test)]
mod tests {
    use super::*;
    use super::simd_tests::*;

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


    /// `prepare_rows` against the passes it fuses, each row's scalar reference (the rotation's
    /// scalar definition, `scale_columns_into`, the scalar quantizers, `mean::dot16`): the same
    /// bits for every row, whatever the pool size and so the split of the rows over threads,
    /// and NaN / ±inf rows too.
    #[test]
    fn the_activation_pass_is_the_passes_it_fuses_bit_for_bit() {
        let mut s = 11u64;
        for &(m, k, terms) in &[(1, 576, 1), (3, 64, 2), (40, 576, 1), (100, 576, 2), (130, 1024, 1), (70, 576, 3), (7, 2048, 1), (5, 1536, 2), (3, 6144, 1)] {
            let mut x: Vec<f32> = (0..m * k).map(|i| lcg(&mut s) * if i % k == 7 { 80.0 } else { 1.0 }).collect();
            if m > 2 {
                x[k + 5] = f32::NAN;
                x[2 * k + 1] = f32::INFINITY;
            }
            let rot = rotate::Rotation::new(k).expect("a rotation");
            let col: Vec<f32> = (0..k).map(|_| 1.0 + lcg(&mut s).abs()).collect();
            let dir: Vec<f32> = (0..k).map(|_| lcg(&mut s)).collect();
            for prep in [RowPrep::Rotate(&rot), RowPrep::Columns(&col)] {
                // The reference: every row on its own, scalar kernels.
                let mut xs = x.clone();
                match prep {
                    RowPrep::Rotate(r) => xs.chunks_mut(k).for_each(|row| r.apply_row_scalar(row)),
                    RowPrep::Columns(c) => scale_columns_into(&x, c, &mut xs),
                }
                let (mut wq, mut ws) = (vec![0i8; terms * m * k], vec![0f32; terms * m]);
                for (i, xr) in xs.chunks(k).enumerate() {
                    let mut r = xr.to_vec();
                    for t in 0..terms {
                        let at = t * m + i;
                        let q = &mut wq[at * k..(at + 1) * k];
                        ws[at] = quantize_row_scalar(&r, q);
                        for (v, &qv) in r.iter_mut().zip(q.iter()) {
                            *v -= ws[at] * qv as f32;
                        }
                    }
                }
                let wd: Vec<f32> = x.chunks(k).map(|r| mean::dot16(r, &dir)).collect();
                for threads in [1, 2, 5] {
                    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
                    let (mut q, mut sc, mut d) = (vec![9i8; terms * m * k], vec![9f32; terms * m], vec![9f32; m]);
                    let mut h = vec![9u64; m];
                    pool.install(|| prepare_rows_hashed(&x, m, k, terms, prep, Some(&dir), &mut q, &mut sc, &mut d, &mut h));
                    assert_eq!(h, x.chunks(k).map(row_hash).collect::<Vec<_>>(), "m {m} k {k} terms {terms} threads {threads}: row hashes");
                    let tag = format!("m {m} k {k} terms {terms} threads {threads} rotated {}", matches!(prep, RowPrep::Rotate(_)));
                    assert_eq!(q, wq, "{tag}: int8 terms");
                    assert_eq!(sc.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), ws.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), "{tag}: scales");
                    assert_eq!(d.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), wd.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), "{tag}: dots");
                    // Without a direction: the same terms, no dots.
                    let (mut q2, mut s2) = (vec![0i8; terms * m * k], vec![0f32; terms * m]);
                    pool.install(|| prepare_rows(&x, m, k, terms, prep, None, &mut q2, &mut s2, &mut []));
                    assert!(q2 == q && s2.iter().zip(&sc).all(|(a, b)| a.to_bits() == b.to_bits()), "{tag}: without a direction");
                }
            }
        }
    }

    /// `dequantize_fused` against the passes it fuses, in their scalar definitions: every term's
    /// dequantization, then each second-weight-term row added, then `mean::correct_along`'s add
    /// (`c_m·e`, rows whose coefficient is None left alone) — the same bits for every shape the
    /// backend makes, on one thread and on several.
    #[test]
    fn the_output_pass_is_the_passes_it_fuses_bit_for_bit() {
        let mut seed = 0x0dd_u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for &(m, n, terms, lo, corr) in &[
            (1, 24, 1, false, true),
            (40, 64, 1, false, true),
            (600, 64, 1, false, true),
            (600, 64, 1, false, false),
            (37, 100, 2, true, true),
            (300, 130, 2, true, true),
            (300, 130, 2, true, false),
            (9, 33, 1, true, true),
            (9, 33, 2, false, true),
            (200, 200, 3, true, true),
        ] {
            let mut ci = |len: usize| -> Vec<i32> { (0..len).map(|_| (next() % 2_000_001) as i32 - 1_000_000).collect() };
            let (c, cl) = (ci(terms * m * n), ci(m * n));
            let mut fv = |len: usize, s: f32| -> Vec<f32> { (0..len).map(|_| ((next() % 20_001) as f32 - 10_000.0) * s).collect() };
            let (a_scale, w_scale, lo_scale, e) = (fv(terms * m, 1e-4), fv(n, 1e-5), fv(n, 1e-7), fv(n, 1e-3));
            let coef: Vec<Option<f32>> = (0..m).map(|i| if i % 5 == 3 { None } else { Some((i as f32 - 20.0) * 0.37) }).collect();
            // The reference, pass after pass, scalar kernels.
            let mut want = vec![0f32; m * n];
            for (i, d) in want.chunks_mut(n).enumerate() {
                let row = |t: usize| &c[(t * m + i) * n..(t * m + i + 1) * n];
                match terms {
                    1 => dequantize_row_scalar(row(0), a_scale[i], &w_scale, d),
                    _ => {
                        dequantize_row2_scalar(row(0), a_scale[i], row(1), a_scale[m + i], &w_scale, d);
                        for t in 2..terms {
                            dequantize_row_acc_scalar(row(t), a_scale[t * m + i], &w_scale, d);
                        }
                    }
                }
                if lo {
                    dequantize_row_acc_scalar(&cl[i * n..(i + 1) * n], a_scale[i], &lo_scale, d);
                }
                if let (true, Some(cc)) = (corr, coef[i]) {
                    for (o, &v) in d.iter_mut().zip(&e) {
                        *o += cc * v;
                    }
                }
            }
            let out = Output {
                c: CRows::Dense(&c),
                a_scale: &a_scale,
                terms,
                w_scale: &w_scale,
                lo: lo.then_some((CRows::Dense(&cl[..]), &lo_scale[..])),
                corr: corr.then_some((&coef[..], &e[..])),
            };
            // The same results held as two cores' column segments (core 0: the first and last
            // thirds, core 1: the middle one), as `npu::Shares` keeps them.
            let cuts = [0, n / 3, 2 * n / 3, n];
            let segs: [Vec<(usize, usize, usize)>; 2] = [
                vec![(cuts[0], cuts[1] - cuts[0], 0), (cuts[2], cuts[3] - cuts[2], cuts[1] - cuts[0])],
                vec![(cuts[1], cuts[2] - cuts[1], 0)],
            ];
            let split = |full: &[i32]| -> Vec<Vec<i32>> {
                let rows = full.len() / n;
                segs.iter()
                    .map(|ss| {
                        let mut v = Vec::new();
                        for r in 0..rows {
                            for &(n0, nc, _) in ss {
                                v.extend_from_slice(&full[r * n + n0..r * n + n0 + nc]);
                            }
                        }
                        v
                    })
                    .collect()
            };
            let (cp, clp) = (split(&c), split(&cl));
            fn parts<'a>(v: &'a [Vec<i32>], segs: &'a [Vec<(usize, usize, usize)>], rows: usize) -> Vec<CPart<'a>> {
                v.iter()
                    .zip(segs)
                    .flat_map(|(c, ss)| {
                        let ncols = ss.iter().map(|s| s.1).sum();
                        ss.iter().map(move |&(n0, nc, col0)| CPart { n0, nc, total: rows, rows: rows.max(1), parts: 1, stride: ncols, at: col0, blocks: vec![&c[..]] })
                    })
                    .collect()
            }
            let (pc, pcl) = (parts(&cp, &segs, terms * m), parts(&clp, &segs, if lo { m } else { 0 }));
            let out_parts = Output { c: CRows::Parts(&pc), lo: lo.then_some((CRows::Parts(&pcl), &lo_scale[..])), ..out };
            // And as the NPU's output buffers hold them: each segment in blocks of 5 rows (the
            // last one shorter), rows of the segment's width.
            const TILE: usize = 5;
            let tiled = |full: &[i32]| -> Vec<Vec<Vec<i32>>> {
                let rows = full.len() / n;
                segs.iter()
                    .flatten()
                    .map(|&(n0, nc, _)| (0..rows.div_ceil(TILE)).map(|t| (t * TILE..rows.min((t + 1) * TILE)).flat_map(|r| full[r * n + n0..r * n + n0 + nc].to_vec()).collect()).collect())
                    .collect()
            };
            let (tc, tcl) = (tiled(&c), tiled(&cl));
            fn tparts<'a>(t: &'a [Vec<Vec<i32>>], segs: &[Vec<(usize, usize, usize)>], rows: usize, parts: usize) -> Vec<CPart<'a>> {
                t.iter()
                    .zip(segs.iter().flatten())
                    .map(|(bl, &(n0, nc, _))| CPart { n0, nc, total: rows, rows: TILE, parts, stride: nc, at: 0, blocks: bl.iter().map(|b| &b[..]).collect() })
                    .collect()
            }
            let (tpc, tpcl) = (tparts(&tc, &segs, terms * m, 1), tparts(&tcl, &segs, if lo { m } else { 0 }, 1));
            let out_tiled = Output { c: CRows::Parts(&tpc), lo: lo.then_some((CRows::Parts(&tpcl), &lo_scale[..])), ..out };
            // And as a K-split leaves them: each block as three partials whose int32 sum
            // (wrapping) is the block, the first one extreme.
            let mut noise = |len: usize| -> Vec<i32> { (0..len).map(|_| next() as i32).collect() };
            let mut split3 = |t: &[Vec<Vec<i32>>]| -> Vec<Vec<Vec<i32>>> {
                t.iter()
                    .map(|bl| {
                        bl.iter()
                            .flat_map(|b| {
                                let (p0, p1) = (noise(b.len()), noise(b.len()));
                                let p2 = b.iter().zip(&p0).zip(&p1).map(|((&v, &a), &c)| v.wrapping_sub(a).wrapping_sub(c)).collect();
                                [p0, p1, p2]
                            })
                            .collect()
                    })
                    .collect()
            };
            let (kc, kcl) = (split3(&tc), split3(&tcl));
            let (kpc, kpcl) = (tparts(&kc, &segs, terms * m, 3), tparts(&kcl, &segs, if lo { m } else { 0 }, 3));
            let out_ksplit = Output { c: CRows::Parts(&kpc), lo: lo.then_some((CRows::Parts(&kpcl), &lo_scale[..])), ..out };
            // The first term in partials beside a dense second one (one side summed per row).
            let out_mixed = Output { c: CRows::Parts(&kpc), ..out };
            for (how, out) in [("dense", &out), ("parts", &out_parts), ("blocks", &out_tiled), ("k-split partials", &out_ksplit), ("mixed", &out_mixed)] {
                for threads in [1, 3] {
                    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
                    let mut got = vec![7f32; m * n];
                    pool.install(|| dequantize_fused(out, &mut got));
                    for j in 0..m * n {
                        assert_eq!(got[j].to_bits(), want[j].to_bits(), "{how} m {m} n {n} terms {terms} lo {lo} corr {corr} threads {threads} j {j}");
                    }
                }
            }
        }
    }
}
