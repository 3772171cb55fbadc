//! The mean correction: the host's exact product on the rows' mean replaces the NPU's.
//!
//! An NPU matmul `Y = X·Wᵀ` of M activation rows makes an error `Δ(x) = Q(x)·Q(W)ᵀ − x·Wᵀ` per
//! row. Its weight part, `x·(Q(W) − W)ᵀ`, is linear in x, and the rows of one ubatch share a
//! large common component: the mean row `x̄` (LLM activations have channels that are large on
//! every token, the rotation spreads them but does not remove them). Along that component the
//! weight error is the same vector on every row, a coherent bias that the next layers do not
//! average away. So, per matmul of M ≥ 2 rows:
//!
//! * the host computes `x̄ = (1/M)·Σ x_m` and each row's share of it,
//!   `c_m = (x_m·x̄)/(x̄·x̄)` (the rows' coefficients average exactly 1);
//! * the host computes the mean row's exact product `ŷ = x̄·Wᵀ` from the GGUF weight (one
//!   matrix-vector product, K·N multiply-adds, 1/M of the matmul; `pack::source_matvec`);
//! * the NPU's mean output is `ȳ = (1/M)·Σ Y_m`; with `b = ŷ − ȳ`, each row becomes
//!   `Y_m + c_m·b`.
//!
//! Since `Σ c_m = M`, the corrected rows' weight error is `(x_m − c_m·x̄)·(Q(W) − W)ᵀ`: only the
//! part of each row orthogonal to the mean keeps its error. A row unlike the others (the first
//! token, whose activations an attention sink shapes) is corrected by its own projection on the
//! mean, not by the others' error: a plain `+b` on every row (c_m = 1) measured KLD 0.0081 on
//! Gemma-3-270M Q8_0 against 0.0035 uncorrected, the projection 0.0025 (docs/precision.md).
//!
//! Pure f32/f64 arithmetic on the host, no device: the backend runs the matrix-vector product
//! beside the NPU run and applies [`correct_to_mean`] to the dequantized output.

/// The mean of M activation rows and each row's coefficient along it.
#[derive(Clone, Debug, PartialEq)]
pub struct MeanRow {
    /// `x̄: [K]`, the rows' mean (accumulated in f64).
    pub mean: Vec<f32>,
    /// `c: [M]`, `(x_m·x̄)/(x̄·x̄)`; they average 1.
    pub coef: Vec<f32>,
}

/// [`MeanRow`] of `x: [M, K]`; `None` when M < 2 (one row has nothing to share), when the mean is
/// zero, or when a value is not finite (the rows then keep the NPU's result as it is).
pub fn mean_row(x: &[f32], m: usize, k: usize) -> Option<MeanRow> {
    assert_eq!(x.len(), m * k, "x is not [M, K]");
    if m < 2 || k == 0 {
        return None;
    }
    let mut acc = vec![0f64; k];
    for row in x.chunks_exact(k) {
        for (a, &v) in acc.iter_mut().zip(row) {
            *a += v as f64;
        }
    }
    let mean: Vec<f32> = acc.iter().map(|&a| (a / m as f64) as f32).collect();
    let mm: f64 = mean.iter().map(|&v| v as f64 * v as f64).sum();
    if !(mm.is_finite() && mm > 0.0) {
        return None;
    }
    let coef: Vec<f32> = x.chunks_exact(k).map(|row| (dot64(row, &mean) / mm) as f32).collect();
    coef.iter().all(|c| c.is_finite()).then_some(MeanRow { mean, coef })
}

/// `Σ a·b` accumulated in f64.
fn dot64(a: &[f32], b: &[f32]) -> f64 {
    a.iter().zip(b).map(|(&x, &y)| x as f64 * y as f64).sum()
}

/// `dst[m][n] += c_m · (exact[n] − ȳ[n])` with `ȳ` the mean of `dst`'s M rows (f64 sums): the
/// NPU's output `dst: [M, N]` corrected to the host's exact product `exact: [N]` on the mean row.
/// Returns `|exact − ȳ|₂ / |exact|₂`, the relative error the NPU made on the mean row (0 when
/// `exact` is zero).
pub fn correct_to_mean(dst: &mut [f32], m: usize, n: usize, coef: &[f32], exact: &[f32]) -> f64 {
    assert_eq!(dst.len(), m * n, "dst is not [M, N]");
    assert_eq!(coef.len(), m, "coef is not [M]");
    assert_eq!(exact.len(), n, "exact is not [N]");
    let mut mean = vec![0f64; n];
    for row in dst.chunks_exact(n) {
        for (a, &v) in mean.iter_mut().zip(row) {
            *a += v as f64;
        }
    }
    // A column whose exact value or NPU mean is not finite (a damaged weight row) is left as the
    // NPU computed it rather than spread over every row.
    let b: Vec<f32> = mean.iter().zip(exact).map(|(&s, &e)| (e as f64 - s / m as f64) as f32).map(|v| if v.is_finite() { v } else { 0.0 }).collect();
    for (row, &c) in dst.chunks_exact_mut(n).zip(coef) {
        for (d, &bj) in row.iter_mut().zip(&b) {
            *d += c * bj;
        }
    }
    let ee: f64 = exact.iter().filter(|v| v.is_finite()).map(|&v| v as f64 * v as f64).sum();
    let bb: f64 = b.iter().map(|&v| v as f64 * v as f64).sum();
    if ee > 0.0 {
        (bb / ee).sqrt()
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// xorshift64*, uniform in [-1, 1).
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> f32 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            ((self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 40) as f32 / (1u64 << 23) as f32) - 1.0
        }
    }

    fn matmul(x: &[f32], w: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
        let mut y = vec![0f32; m * n];
        for i in 0..m {
            for j in 0..n {
                y[i * n + j] = dot64(&x[i * k..(i + 1) * k], &w[j * k..(j + 1) * k]) as f32;
            }
        }
        y
    }

    fn err(a: &[f32], b: &[f32]) -> f64 {
        a.iter().zip(b).map(|(&x, &y)| (x as f64 - y as f64).powi(2)).sum::<f64>().sqrt()
    }

    #[test]
    fn coefficients_average_one_and_follow_the_rows() {
        let (m, k) = (5, 8);
        let mut g = Rng(7);
        let base: Vec<f32> = (0..k).map(|_| g.next()).collect();
        let scale = [1.0f32, 2.0, 0.5, 1.5, 0.0];
        let x: Vec<f32> = scale.iter().flat_map(|&s| base.iter().map(move |&b| s * b)).collect();
        let r = mean_row(&x, m, k).unwrap();
        let avg: f32 = r.coef.iter().sum::<f32>() / m as f32;
        assert!((avg - 1.0).abs() < 1e-6, "{:?}", r.coef);
        // Rows that are multiples of one vector: c_m is the multiple over the mean multiple (1).
        for (c, s) in r.coef.iter().zip(scale) {
            assert!((c - s).abs() < 1e-5, "{c} vs {s}");
        }
        assert_eq!(mean_row(&x[..k], 1, k), None, "one row");
        assert_eq!(mean_row(&[0.0; 16], 2, 8), None, "a zero mean");
        assert_eq!(mean_row(&[f32::NAN, 1.0, 1.0, 1.0], 2, 2), None, "not finite");
    }

    /// A perturbed weight standing for Q(W) (error 1e-2 per element) on rows with a large common
    /// component: the correction removes the error along the mean, which is most of it, and
    /// leaves identical rows exact.
    #[test]
    fn the_correction_removes_the_error_along_the_mean() {
        let (m, k, n) = (16, 64, 24);
        let mut g = Rng(0x51);
        let w: Vec<f32> = (0..n * k).map(|_| g.next()).collect();
        let wq: Vec<f32> = w.iter().map(|&v| v + 0.01 * g.next()).collect();
        let common: Vec<f32> = (0..k).map(|_| 4.0 * g.next()).collect();
        let x: Vec<f32> = (0..m).flat_map(|_| common.clone()).zip((0..m * k).map(|_| 0.3 * g.next())).map(|(c, r)| c + r).collect();
        let want = matmul(&x, &w, m, k, n);
        let mut y = matmul(&x, &wq, m, k, n);
        let before = err(&y, &want);
        let r = mean_row(&x, m, k).unwrap();
        let exact = matmul(&r.mean, &w, 1, k, n);
        let rel = correct_to_mean(&mut y, m, n, &r.coef, &exact);
        let after = err(&y, &want);
        assert!(after < 0.25 * before, "error {before} → {after}");
        assert!(rel > 0.0 && rel < 0.05, "the mean row's relative error {rel}");
        // The corrected rows' mean, weighted by nothing, is the exact product on the mean row.
        for j in 0..n {
            let ybar: f64 = (0..m).map(|i| y[i * n + j] as f64).sum::<f64>() / m as f64;
            assert!((ybar - exact[j] as f64).abs() < 1e-4 * (1.0 + exact[j].abs() as f64), "column {j}: {ybar} vs {}", exact[j]);
        }
        // Identical rows: every row is the exact product.
        let x1: Vec<f32> = (0..m).flat_map(|_| common.clone()).collect();
        let mut y1 = matmul(&x1, &wq, m, k, n);
        let r1 = mean_row(&x1, m, k).unwrap();
        correct_to_mean(&mut y1, m, n, &r1.coef, &matmul(&r1.mean, &w, 1, k, n));
        assert!(err(&y1, &matmul(&x1, &w, m, k, n)) < 1e-4, "identical rows are exact after it");
    }

    #[test]
    fn a_column_that_is_not_finite_is_left_alone() {
        let mut y = vec![1.0f32, 2.0, 3.0, 4.0];
        correct_to_mean(&mut y, 2, 2, &[1.0, 1.0], &[f32::NAN, 4.0]);
        assert_eq!(y, [1.0, 3.0, 3.0, 5.0], "column 0 untouched, column 1 moved to its exact mean");
    }

    /// A row unlike the others (orthogonal to their common direction, as large) keeps nearly all
    /// of its own result: its coefficient is small, unlike a plain `+b` on every row.
    #[test]
    fn a_row_unlike_the_mean_is_barely_moved() {
        let (m, k) = (8, 32);
        let mut g = Rng(3);
        let common: Vec<f32> = (0..k).map(|_| g.next()).collect();
        let cc = dot64(&common, &common);
        let mut v: Vec<f32> = (0..k).map(|_| g.next()).collect();
        let p = dot64(&v, &common) / cc;
        v.iter_mut().zip(&common).for_each(|(a, &c)| *a -= (p * c as f64) as f32);
        let s = (cc / dot64(&v, &v)).sqrt() as f32;
        let mut x: Vec<f32> = v.iter().map(|&a| a * s).collect();
        for _ in 1..m {
            x.extend_from_slice(&common);
        }
        let r = mean_row(&x, m, k).unwrap();
        assert!(r.coef[0].abs() < 0.2 && r.coef[1] > 1.0, "{:?}", r.coef);
    }
}
