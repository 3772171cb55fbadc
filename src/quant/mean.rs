//! The calibrated correction: each row's share of a fixed direction gets the host's exact
//! product instead of the NPU's.
//!
//! An NPU matmul `Y = X·Wᵀ` makes an error `Δ(x) = Q(x)·Q(W)ᵀ − x·Wᵀ` per row. Its weight part,
//! `x·(Q(W) − W)ᵀ`, is linear in x, and LLM activations share a large component that is nearly
//! the same on every token and every prompt (channels that are large everywhere: the rotation
//! spreads them over K but does not remove them). Along that component the weight error is one
//! vector on every row, a coherent bias the next layers do not average away.
//!
//! So per weight, once: `d` = the mean of the activation rows the weight received in a
//! calibration run (`cache::calib`), and `e = d·Wᵀ − d·Q(W)ᵀ`, the exact product on `d` minus the
//! product with the int8 terms the NPU holds (without rounding `d` itself; [`Direction`]). Per
//! row, from that row alone: `c_m = (x_m·d)/(d·d)` and `Y_m += c_m·e` ([`correct_along`]): K
//! multiply-adds for the coefficient, N for the correction. A row's result depends on nothing
//! else in its ubatch, so it is the same bits whoever shares the ubatch (a server's other
//! requests, another `-ub`), and the same on every run: `d` comes from a file.
//!
//! The corrected weight error of row `x_m` is `(x_m − c_m·d)·(Q(W) − W)ᵀ`: only the part of the
//! row off the calibrated direction keeps it. A row unlike the calibration rows (small `c_m`) is
//! barely moved. Pure f32/f64 arithmetic on the host, no device.

/// A weight's calibrated direction and the NPU's error on it.
#[derive(Clone, Debug, PartialEq)]
pub struct Direction {
    /// `d: [K]`, the calibration rows' mean.
    pub dir: Vec<f32>,
    /// `d·d` (f64 sum), > 0.
    pub dir_sq: f64,
    /// `e: [N]`, `d·Wᵀ − d·Q(W)ᵀ`; a column whose value is not finite holds 0 (left as the NPU
    /// computed it rather than moved by a damaged weight row).
    pub err: Vec<f32>,
}

impl Direction {
    /// The direction `d` with the exact product `exact = d·Wᵀ` and the held product `held =
    /// d·Q(W)ᵀ` (both `[N]`, f64); None when `d` is zero or not finite.
    pub fn new(dir: Vec<f32>, exact: &[f64], held: &[f64]) -> Option<Direction> {
        assert_eq!(exact.len(), held.len(), "exact and held products differ in N");
        let dir_sq: f64 = dir.iter().map(|&v| v as f64 * v as f64).sum();
        if !(dir_sq.is_finite() && dir_sq > 0.0) {
            return None;
        }
        let err = exact.iter().zip(held).map(|(&a, &b)| (a - b) as f32).map(|v| if v.is_finite() { v } else { 0.0 }).collect();
        Some(Direction { dir, dir_sq, err })
    }

    /// `1/(d·d)` in f32: a row's coefficient is `c_m = (x_m·d) · inv_sq` ([`dot16`] for the dot).
    pub fn inv_sq(&self) -> f32 {
        (1.0 / self.dir_sq) as f32
    }

    /// Row `x_m`'s coefficient from its dot `x_m·d` ([`dot16`]): `(x_m·d) · (1/(d·d))`, None when
    /// it is not finite (the row is then left as the NPU computed it). The same floats as
    /// [`correct_along`], wherever the dot was taken (the activation pass, beside it).
    #[inline]
    pub fn coefficient(&self, dot: f32) -> Option<f32> {
        let c = dot * self.inv_sq();
        c.is_finite().then_some(c)
    }

    /// `|e|₂ / |d·Wᵀ|₂` for the held product `exact`: the NPU's relative error on `d`.
    pub fn relative_error(&self, exact: &[f64]) -> f64 {
        let ee: f64 = exact.iter().filter(|v| v.is_finite()).map(|v| v * v).sum();
        let bb: f64 = self.err.iter().map(|&v| v as f64 * v as f64).sum();
        if ee > 0.0 {
            (bb / ee).sqrt()
        } else {
            0.0
        }
    }
}

/// `Σ a·b` in sixteen f32 lanes (each lane's products in order, then the lanes pairwise): SIMD
/// multiplies and adds after the compiler, the same sum for a row wherever it sits. The dot of a
/// row's coefficient, taken in the activation pass (`quant::prepare_rows_hashed`) or by [`correct_along`].
pub fn dot16(a: &[f32], b: &[f32]) -> f32 {
    dot16_rows([a], b)[0]
}

/// [`dot16`] of `R` rows against one `b`, bit for bit each row's [`dot16`] (the same lanes, the
/// same order in each lane): one row's sixteen lanes are sixteen chains of dependent adds, so a
/// row alone waits on the add latency; `R` rows give the core `R` times as many independent
/// chains.
pub fn dot16_rows<const R: usize>(rows: [&[f32]; R], b: &[f32]) -> [f32; R] {
    dot16_rows_copy(rows, b, &mut [])
}

/// [`dot16_rows`] that also copies the rows into `copy: [R·K]` (row `r` at `r·K`; empty for
/// none) in the same pass over them.
pub fn dot16_rows_copy<const R: usize>(rows: [&[f32]; R], b: &[f32], copy: &mut [f32]) -> [f32; R] {
    let k = b.len();
    assert!(rows.iter().all(|r| r.len() == k), "rows and b differ in length");
    assert!(copy.is_empty() || copy.len() == R * k, "copy is not [R·K] (or empty)");
    let full = k / 16 * 16;
    if let Some(acc) = super::simd::dot16_lanes(rows, b, copy) {
        return finish16(acc, rows, b, full);
    }
    if !copy.is_empty() {
        for (r, row) in rows.iter().enumerate() {
            copy[r * k..(r + 1) * k].copy_from_slice(row);
        }
    }
    let mut acc = [[0f32; 16]; R];
    for j in (0..full).step_by(16) {
        let bb: &[f32; 16] = b[j..j + 16].try_into().expect("16 lanes");
        for (a, row) in acc.iter_mut().zip(&rows) {
            let x: &[f32; 16] = row[j..j + 16].try_into().expect("16 lanes");
            for l in 0..16 {
                a[l] += x[l] * bb[l];
            }
        }
    }
    finish16(acc, rows, b, full)
}

/// A row's dot from its sixteen lane sums over `[0, full)`: the lanes added pairwise (8, 4, 2,
/// 1 apart), then the tail's products.
#[inline]
fn finish16<const R: usize>(acc: [[f32; 16]; R], rows: [&[f32]; R], b: &[f32], full: usize) -> [f32; R] {
    let mut out = [0f32; R];
    for ((o, mut a), row) in out.iter_mut().zip(acc).zip(&rows) {
        let tail: f32 = row[full..].iter().zip(&b[full..]).map(|(&x, &y)| x * y).sum();
        let mut w = 16;
        while w > 1 {
            w /= 2;
            for l in 0..w {
                a[l] += a[l + w];
            }
        }
        *o = a[0] + tail;
    }
    out
}

/// `dst[m] += c_m · e` with `c_m = (x_m·d)/(d·d)` for `x: [M, K]` and the NPU's output
/// `dst: [M, N]`: each row corrected along `d` from its own values only. A row whose coefficient
/// is not finite is left as it is.
///
/// The scalar definition of the correction: the backend takes the dots in its activation pass
/// and adds `c_m·e` inside its output pass (`quant::dequantize_fused`), the same floats in the
/// same order.
pub fn correct_along(dst: &mut [f32], x: &[f32], m: usize, k: usize, n: usize, d: &Direction) {
    assert_eq!(x.len(), m * k, "x is not [M, K]");
    assert_eq!(dst.len(), m * n, "dst is not [M, N]");
    assert_eq!((d.dir.len(), d.err.len()), (k, n), "the direction is not [K] / [N]");
    for (row, out) in x.chunks_exact(k).zip(dst.chunks_exact_mut(n)) {
        let Some(c) = d.coefficient(dot16(row, &d.dir)) else { continue };
        for (o, &e) in out.iter_mut().zip(&d.err) {
            *o += c * e;
        }
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

    fn dot64(a: &[f32], b: &[f32]) -> f64 {
        a.iter().zip(b).map(|(&x, &y)| x as f64 * y as f64).sum()
    }

    fn matmul(x: &[f32], w: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
        (0..m * n).map(|i| dot64(&x[i / n * k..(i / n + 1) * k], &w[i % n * k..(i % n + 1) * k]) as f32).collect()
    }

    fn matvec64(d: &[f32], w: &[f32], k: usize) -> Vec<f64> {
        w.chunks_exact(k).map(|r| dot64(d, r)).collect()
    }

    fn err(a: &[f32], b: &[f32]) -> f64 {
        a.iter().zip(b).map(|(&x, &y)| (x as f64 - y as f64).powi(2)).sum::<f64>().sqrt()
    }

    /// The definition `dot16` had before it shared `dot16_rows`' code: the bits every row keeps.
    fn dot16_reference(a: &[f32], b: &[f32]) -> f32 {
        let mut acc = [0f32; 16];
        let (ca, cb) = (a.chunks_exact(16), b.chunks_exact(16));
        let tail: f32 = ca.remainder().iter().zip(cb.remainder()).map(|(&x, &y)| x * y).sum();
        for (x, y) in ca.zip(cb) {
            for l in 0..16 {
                acc[l] += x[l] * y[l];
            }
        }
        let mut w = 16;
        while w > 1 {
            w /= 2;
            for l in 0..w {
                acc[l] += acc[l + w];
            }
        }
        acc[0] + tail
    }

    #[test]
    fn rows_at_once_are_each_rows_lane_dot_bit_for_bit() {
        let mut g = Rng(9);
        for k in [0, 1, 15, 16, 17, 576, 1000, 2048] {
            let b: Vec<f32> = (0..k).map(|_| g.next() * 3.0).collect();
            let rows: Vec<Vec<f32>> = (0..4).map(|_| (0..k).map(|_| g.next() * 50.0).collect()).collect();
            let got = dot16_rows([&rows[0][..], &rows[1], &rows[2], &rows[3]], &b);
            for r in 0..4 {
                assert_eq!(got[r].to_bits(), dot16_reference(&rows[r], &b).to_bits(), "K={k} row {r}");
                assert_eq!(dot16(&rows[r], &b).to_bits(), dot16_reference(&rows[r], &b).to_bits(), "K={k} row {r} alone");
            }
        }
    }

    #[test]
    fn the_lane_dot_is_the_dot() {
        let mut g = Rng(2);
        for k in [1, 15, 16, 17, 576, 1000] {
            let (a, b): (Vec<f32>, Vec<f32>) = (0..k).map(|_| (g.next(), g.next())).unzip();
            assert!((dot16(&a, &b) as f64 - dot64(&a, &b)).abs() < 1e-4 * k as f64, "K={k}");
        }
    }

    /// A perturbed weight standing for Q(W) on rows sharing a large component with the
    /// calibration rows: the correction removes most of the error, each row from its own values.
    #[test]
    fn the_correction_removes_the_error_along_the_direction_row_by_row() {
        let (m, k, n) = (16, 64, 24);
        let mut g = Rng(0x51);
        let w: Vec<f32> = (0..n * k).map(|_| g.next()).collect();
        let wq: Vec<f32> = w.iter().map(|&v| v + 0.01 * g.next()).collect();
        let common: Vec<f32> = (0..k).map(|_| 4.0 * g.next()).collect();
        let rows = |g: &mut Rng, m: usize| -> Vec<f32> { (0..m * k).map(|i| common[i % k] * (1.0 + 0.2 * g.next()) + 0.3 * g.next()).collect() };
        // The direction from other rows (the calibration text), applied to these.
        let calib = rows(&mut g, 64);
        let dir: Vec<f32> = (0..k).map(|j| (0..64).map(|r| calib[r * k + j] as f64).sum::<f64>() as f32 / 64.0).collect();
        let d = Direction::new(dir.clone(), &matvec64(&dir, &w, k), &matvec64(&dir, &wq, k)).unwrap();
        let x = rows(&mut g, m);
        let want = matmul(&x, &w, m, k, n);
        let mut y = matmul(&x, &wq, m, k, n);
        let before = err(&y, &want);
        correct_along(&mut y, &x, m, k, n, &d);
        let after = err(&y, &want);
        assert!(after < 0.25 * before, "error {before} → {after}");
        // Row by row: the same row alone gets the same bits.
        for i in [0, 7, m - 1] {
            let mut yi = matmul(&x[i * k..(i + 1) * k], &wq, 1, k, n);
            correct_along(&mut yi, &x[i * k..(i + 1) * k], 1, k, n, &d);
            assert_eq!(yi, y[i * n..(i + 1) * n], "row {i}");
        }
        // The direction itself becomes exact.
        let mut yd = matmul(&dir, &wq, 1, k, n);
        correct_along(&mut yd, &dir, 1, k, n, &d);
        assert!(err(&yd, &matmul(&dir, &w, 1, k, n)) < 1e-4, "the direction's own product is exact after it");
        let rel = d.relative_error(&matvec64(&dir, &w, k));
        assert!(rel > 0.0 && rel < 0.05, "{rel}");
    }

    #[test]
    fn columns_and_rows_that_are_not_finite_are_left_alone() {
        let d = Direction::new(vec![1.0, 0.0], &[f64::NAN, 4.0], &[1.0, 3.0]).unwrap();
        assert_eq!(d.err, [0.0, 1.0]);
        let mut y = vec![1.0f32, 2.0, 3.0, 4.0];
        correct_along(&mut y, &[2.0, 0.0, f32::INFINITY, 0.0], 2, 2, 2, &d);
        assert_eq!(y, [1.0, 4.0, 3.0, 4.0], "row 0 moved by 2·e, row 1 (c not finite) untouched");
        assert_eq!(Direction::new(vec![0.0; 2], &[1.0], &[1.0]), None, "a zero direction");
    }

    /// A row orthogonal to the direction keeps its own result.
    #[test]
    fn a_row_unlike_the_direction_is_barely_moved() {
        let k = 32;
        let mut g = Rng(3);
        let common: Vec<f32> = (0..k).map(|_| g.next()).collect();
        let cc = dot64(&common, &common);
        let mut v: Vec<f32> = (0..k).map(|_| g.next()).collect();
        let p = dot64(&v, &common) / cc;
        v.iter_mut().zip(&common).for_each(|(a, &c)| *a -= (p * c as f64) as f32);
        let d = Direction::new(common.clone(), &[1.0], &[0.0]).unwrap();
        let mut y = vec![0f32];
        correct_along(&mut y, &v, 1, k, 1, &d);
        assert!(y[0].abs() < 1e-5, "{}", y[0]);
        let mut y = vec![0f32];
        correct_along(&mut y, &common, 1, k, 1, &d);
        assert!((y[0] - 1.0).abs() < 1e-5, "{}", y[0]);
    }
}
