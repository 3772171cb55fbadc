//! Bit-exactness of the SIMD row kernels (`quant::simd`) against the scalar references.
//!
//! The dispatchers (`quantize_row`, `dequantize_row`, `dequantize_row_acc`) take the SIMD path
//! whenever the CPU has one, so comparing them with the `*_scalar` functions compares NEON (on
//! aarch64, also under qemu) or AVX2 (x86-64) with the reference. `simd_path_is_active` makes sure
//! that comparison is not scalar against scalar. Row lengths cover empty rows, pure tails, whole
//! vector bodies and body + tail; inputs cover random values over the whole f32 range, random bit
//! patterns (NaN, ±inf, subnormals), exact ties, ±0 and saturation.

use super::*;

// The row kernels under their names before `quant::dequantize` took their place: the SIMD-path
// forms call it, the `*_scalar` references state each formula on its own (as the library did).

pub(super) fn dequantize_row(c: &[i32], sa: f32, sw: &[f32], d: &mut [f32]) {
    dequantize::<1>(simd::FIRST, [(c, sa, sw)], None, d);
}

pub(super) fn dequantize_row_acc(c: &[i32], sa: f32, sw: &[f32], d: &mut [f32]) {
    dequantize::<1>(simd::ACC, [(c, sa, sw)], None, d);
}

pub(super) fn dequantize_row2(c0: &[i32], sa0: f32, c1: &[i32], sa1: f32, sw: &[f32], d: &mut [f32]) {
    dequantize::<2>(simd::ZERO, [(c0, sa0, sw), (c1, sa1, sw)], None, d);
}

#[allow(clippy::too_many_arguments)]
pub(super) fn dequantize_row2_lo(c0: &[i32], sa0: f32, c1: &[i32], sa1: f32, sw: &[f32], cl: &[i32], sal: f32, swl: &[f32], d: &mut [f32]) {
    dequantize::<3>(simd::ZERO, [(c0, sa0, sw), (c1, sa1, sw), (cl, sal, swl)], None, d);
}

pub(super) fn dequantize_row_corr(c: &[i32], sa: f32, sw: &[f32], cc: f32, e: &[f32], d: &mut [f32]) {
    dequantize::<1>(simd::FIRST, [(c, sa, sw)], Some((cc, e)), d);
}

pub(super) fn dequantize_row_scalar(c: &[i32], sa: f32, sw: &[f32], d: &mut [f32]) {
    assert!(c.len() == d.len() && sw.len() == d.len());
    for ((d, &v), &sw) in d.iter_mut().zip(c).zip(sw) {
        *d = v as f32 * (sa * sw);
    }
}

pub(super) fn dequantize_row_acc_scalar(c: &[i32], sa: f32, sw: &[f32], d: &mut [f32]) {
    assert!(c.len() == d.len() && sw.len() == d.len());
    for ((d, &v), &sw) in d.iter_mut().zip(c).zip(sw) {
        *d += v as f32 * (sa * sw);
    }
}

pub(super) fn dequantize_row2_scalar(c0: &[i32], sa0: f32, c1: &[i32], sa1: f32, sw: &[f32], d: &mut [f32]) {
    for j in 0..d.len() {
        d[j] = (0.0 + c0[j] as f32 * (sa0 * sw[j])) + c1[j] as f32 * (sa1 * sw[j]);
    }
}

#[allow(clippy::too_many_arguments)]
pub(super) fn dequantize_row2_lo_scalar(c0: &[i32], sa0: f32, c1: &[i32], sa1: f32, sw: &[f32], cl: &[i32], sal: f32, swl: &[f32], d: &mut [f32]) {
    for j in 0..d.len() {
        d[j] = ((0.0 + c0[j] as f32 * (sa0 * sw[j])) + c1[j] as f32 * (sa1 * sw[j])) + cl[j] as f32 * (sal * swl[j]);
    }
}

pub(super) fn dequantize_row_corr_scalar(c: &[i32], sa: f32, sw: &[f32], cc: f32, e: &[f32], d: &mut [f32]) {
    dequantize_row_scalar(c, sa, sw, d);
    add_scaled_row(cc, e, d);
}

/// `dst[m][n] = Σ_t c_t[m][n] · s_t[m] · w_scale[n]` for `c: [T·M, N]`, through
/// [`dequantize_fused`].
pub(super) fn dequantize_output_terms(c: &[i32], a_scale: &[f32], terms: usize, w_scale: &[f32], dst: &mut [f32]) {
    dequantize_fused(&Output { c: CRows::Dense(c), a_scale, terms, w_scale, lo: None, corr: None }, dst);
}

pub(super) fn dequantize_output(c: &[i32], a_scale: &[f32], w_scale: &[f32], dst: &mut [f32]) {
    dequantize_output_terms(c, a_scale, 1, w_scale, dst);
}

/// Two activation terms and the second weight term (`cl: [M, N]`) through [`dequantize_fused`].
pub(super) fn dequantize_output_2lo(c: &[i32], a_scale: &[f32], w_scale: &[f32], cl: &[i32], lo_scale: &[f32], dst: &mut [f32]) {
    dequantize_fused(&Output { c: CRows::Dense(c), a_scale, terms: 2, w_scale, lo: Some((CRows::Dense(cl), lo_scale)), corr: None }, dst);
}

/// Multi-term quantization of `x: [rows, cols]` (`q: [T·M, K]`, `scales: [T·M]`), as the
/// activation pass does it for unit column scales (a multiply by 1 is exact).
pub(super) fn quantize_rows_terms(x: &[f32], rows: usize, cols: usize, terms: usize, q: &mut [i8], scales: &mut [f32]) {
    let ones = vec![1f32; cols];
    prepare_rows(x, rows, cols, terms, RowPrep::Columns(&ones), None, q, scales, &mut []);
}

#[allow(clippy::too_many_arguments)]
pub(super) fn prepare_rows(x: &[f32], m: usize, k: usize, terms: usize, prep: RowPrep<'_>, dir: Option<&[f32]>, q: &mut [i8], scales: &mut [f32], dots: &mut [f32]) {
    prepare_rows_hashed(x, m, k, terms, prep, dir, q, scales, dots, &mut []);
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        self.0 >> 11
    }
    /// Uniform in [-1, 1).
    fn unit(&mut self) -> f32 {
        (self.next() >> 29) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    /// A value from one of several distributions, the last ones with specials.
    fn value(&mut self, kind: u64) -> f32 {
        match kind {
            0 => self.unit(),
            // wide exponent range, both signs
            1 => self.unit() * 2f32.powi(self.below(200) as i32 - 100),
            // activations with rare large outliers
            2 => self.unit() * if self.below(64) == 0 { 300.0 } else { 1.0 },
            // any bit pattern: NaNs (quiet and signalling), ±inf, subnormals, ±0
            3 => f32::from_bits(self.next() as u32),
            // small integers and halves: exact ties once scaled by a power-of-two inverse
            _ => (self.below(509) as f32 - 254.0) * 0.5,
        }
    }
    /// An int32 matmul sum: small, any bit pattern, one of `extremes`, or a large multiple of 37
    /// (beyond 2^24 the conversion to f32 rounds).
    fn sum(&mut self, extremes: [i32; 4]) -> i32 {
        match self.below(4) {
            0 => self.below(255) as i32 - 127,
            1 => self.next() as i32,
            2 => extremes[self.below(4) as usize],
            _ => (self.below(1 << 22) as i32 - (1 << 21)) * 37,
        }
    }
    fn sums(&mut self, n: usize, extremes: [i32; 4]) -> Vec<i32> {
        (0..n).map(|_| self.sum(extremes)).collect()
    }
    fn special(&mut self) -> f32 {
        SPECIALS[self.below(SPECIALS.len() as u64) as usize]
    }
}

/// Scale values the dequantizers must carry through bit-exactly.
const SPECIALS: [f32; 7] = [0.0, -0.0, f32::INFINITY, f32::NAN, f32::MIN_POSITIVE / 7.0, f32::MAX, 1e-30];
/// Extreme sums for the two-term dequantizer tests.
const TWO_TERM_EXTREMES: [i32; 4] = [i32::MIN, i32::MAX, 0, -(1 << 25) - 3];

const LENS: &[usize] = &[0, 1, 3, 4, 5, 7, 8, 15, 16, 17, 31, 32, 33, 47, 48, 63, 64, 65, 100, 127, 128, 129, 576, 1000, 1536];

fn same_f32(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

fn check_quant(x: &[f32], what: &str) {
    let mut qs = vec![0x55u8 as i8; x.len()];
    let mut qv = vec![0x2au8 as i8; x.len()];
    let ss = quantize_row_scalar(x, &mut qs);
    let sv = quantize_row(x, &mut qv);
    assert!(same_f32(ss, sv), "{what}: scale {sv:e} != scalar {ss:e} (len {})", x.len());
    if let Some(j) = (0..x.len()).find(|&j| qs[j] != qv[j]) {
        panic!("{what}: q[{j}] = {} != scalar {} for x = {:e} (bits {:#x}), len {}", qv[j], qs[j], x[j], x[j].to_bits(), x.len());
    }
    assert!(qv.iter().all(|&v| v != -128), "{what}: -128 produced");
}

#[test]
fn simd_path_is_active() {
    #[cfg(target_arch = "aarch64")]
    assert_eq!(simd::active(), Some("neon"));
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") {
        let avx512 = cfg!(ork_avx512)
            && std::is_x86_feature_detected!("avx512f")
            && std::is_x86_feature_detected!("avx512bw")
            && std::is_x86_feature_detected!("avx512dq");
        assert_eq!(simd::active(), Some(if avx512 { "avx512" } else { "avx2" }));
    }
    eprintln!("quant SIMD path: {:?}", simd::active());
}

#[test]
fn quantize_row_simd_matches_scalar_random() {
    let mut r = Rng(0x5eed);
    for kind in 0..5 {
        for &n in LENS {
            for rep in 0..6 {
                let x: Vec<f32> = (0..n).map(|_| r.value(kind)).collect();
                check_quant(&x, &format!("kind {kind} rep {rep}"));
                // the same row with a few specials sprinkled in
                let mut y = x.clone();
                for _ in 0..(n / 16).min(4) {
                    let j = r.below(n as u64) as usize;
                    y[j] = [f32::NAN, -0.0, 0.0, f32::from_bits(0x7fa0_0001), f32::MIN_POSITIVE / 3.0][r.below(5) as usize];
                }
                check_quant(&y, &format!("kind {kind} rep {rep} + specials"));
            }
        }
    }
}

#[test]
fn quantize_row_simd_ties_to_even_known_values() {
    // amax 127 → inv exactly 1: x rounds as it is. 40 elements = a full AVX2 body (32) + tail,
    // two and a half NEON bodies.
    let mut x = vec![0f32; 40];
    let pat = [0.5f32, 1.5, 2.5, -0.5, -1.5, -2.5, 126.5, -126.5, 3.49999, -0.0];
    let want = [0i8, 2, 2, 0, -2, -2, 126, -126, 3, 0];
    for (j, v) in x.iter_mut().enumerate() {
        *v = pat[j % pat.len()];
    }
    x[39] = 127.0;
    let mut q = vec![9i8; 40];
    assert_eq!(quantize_row(&x, &mut q), 1.0);
    for j in 0..39 {
        assert_eq!(q[j], want[j % want.len()], "x[{j}] = {}", x[j]);
    }
    assert_eq!(q[39], 127);
    check_quant(&x, "ties inv=1");
    // amax 63.5 → inv exactly 2: quarters become ties.
    let x: Vec<f32> = (0..=254).map(|k| (k as f32 - 127.0) * 0.25).chain([63.5]).collect();
    check_quant(&x, "ties inv=2");
    let mut q = vec![0i8; x.len()];
    quantize_row(&x, &mut q);
    assert_eq!(&q[0..6], &[-64, -63, -62, -62, -62, -61], "(-31.75, -31.5, ...)·2 rounded half-even");
}

#[test]
fn quantize_row_simd_edge_rows() {
    let n = 37; // one AVX2 body + tail; two NEON bodies + tail
    let rows: Vec<(&str, Vec<f32>)> = vec![
        ("zeros", vec![0.0; n]),
        ("negative zeros", vec![-0.0; n]),
        ("all NaN", vec![f32::NAN; n]),
        ("+inf", (0..n).map(|j| if j == 5 { f32::INFINITY } else { j as f32 }).collect()),
        ("-inf", (0..n).map(|j| if j == 33 { f32::NEG_INFINITY } else { -(j as f32) }).collect()),
        ("max", (0..n).map(|j| if j % 2 == 0 { f32::MAX } else { -f32::MAX / j as f32 }).collect()),
        ("subnormal", (0..n).map(|j| f32::from_bits(j as u32 + 1)).collect()),
        ("NaN beside max", (0..n).map(|j| if j % 3 == 0 { f32::NAN } else { j as f32 - 18.0 }).collect()),
        ("sNaN", (0..n).map(|j| if j == 0 { f32::from_bits(0xff80_0001) } else { j as f32 * 1e30 }).collect()),
        ("tiny", (0..n).map(|j| (j as f32 - 18.0) * 1e-12).collect()),
        // NaN in the vector body with the maximum also there: a kernel that let NaN into its
        // lane maxima would end with the tail's maximum instead
        ("NaN then max in body", (0..n).map(|j| match j { 0 => f32::NAN, 5 => -100.0, _ => 1.0 }).collect()),
    ];
    for (what, x) in &rows {
        check_quant(x, what);
    }
    // Real values, not only agreement: an all-NaN row quantizes to zeros with the floor scale;
    // NaN lanes never win the absmax.
    let mut q = vec![1i8; n];
    assert_eq!(quantize_row(&rows[2].1, &mut q), ABSMAX_FLOOR / QMAX);
    assert!(q.iter().all(|&v| v == 0));
    let s = quantize_row(&rows[7].1, &mut q);
    assert_eq!(s, 17.0 / QMAX); // |1 - 18| = |35 - 18| = 17; j = 0 and 36 are NaN
    assert_eq!((q[0], q[1], q[2], q[35], q[36]), (0, -127, -120, 127, 0)); // -16·127/17 = -119.53
}

fn check_deq(c: &[i32], sa: f32, sw: &[f32], what: &str) {
    let mut ds = vec![0f32; c.len()];
    let mut dv = vec![1f32; c.len()];
    dequantize_row_scalar(c, sa, sw, &mut ds);
    dequantize_row(c, sa, sw, &mut dv);
    for j in 0..c.len() {
        assert!(same_f32(ds[j], dv[j]), "{what}: d[{j}] = {:e} != scalar {:e} (c {}, sa {sa:e}, sw {:e})", dv[j], ds[j], c[j], sw[j]);
    }
}

fn check_deq_acc(c: &[i32], sa: f32, sw: &[f32], init: &[f32], what: &str) {
    let mut ds = init.to_vec();
    let mut dv = init.to_vec();
    dequantize_row_acc_scalar(c, sa, sw, &mut ds);
    dequantize_row_acc(c, sa, sw, &mut dv);
    for j in 0..c.len() {
        assert!(same_f32(ds[j], dv[j]), "{what}: d[{j}] = {:e} != scalar {:e}", dv[j], ds[j]);
    }
}

#[test]
fn dequantize_rows_simd_match_scalar() {
    let mut r = Rng(42);
    for &n in LENS {
        for rep in 0..8 {
            let c = r.sums(n, [i32::MIN, i32::MAX, (1 << 24) + 1, -(1 << 25) - 3]);
            let init: Vec<f32> = (0..n).map(|j| if j % 11 == 3 { -0.0 } else { r.value(1) }).collect();
            let sw: Vec<f32> = (0..n)
                .map(|_| if rep >= 6 && r.below(8) == 0 { r.special() } else { r.value(1).abs() })
                .collect();
            let sa = if rep == 7 { r.special() } else { r.value(1).abs() };
            check_deq(&c, sa, &sw, &format!("n {n} rep {rep}"));
            check_deq_acc(&c, sa, &sw, &init, &format!("acc n {n} rep {rep}"));
        }
    }
    // a real value: 3 · (0.5 · 0.25)
    let mut d = [0f32; 9];
    dequantize_row(&[3; 9], 0.5, &[0.25; 9], &mut d);
    assert_eq!(d, [0.375; 9]);
    dequantize_row_acc(&[-8; 9], 1.0 / 64.0, &[2.0; 9], &mut d);
    assert_eq!(d, [0.125; 9]); // 0.375 - 8 · (2 / 64)
}

#[test]
fn matrix_functions_match_scalar_rows() {
    let mut r = Rng(9);
    // below and above the parallel threshold
    for &(m, n) in &[(3usize, 70usize), (40, 1000)] {
        let x: Vec<f32> = (0..m * n).map(|_| r.value(2)).collect();
        let mut q = vec![0i8; m * n];
        let mut s = vec![0f32; m];
        quantize_rows(&x, m, n, &mut q, &mut s);
        for i in 0..m {
            let mut qr = vec![0i8; n];
            let sr = quantize_row_scalar(&x[i * n..(i + 1) * n], &mut qr);
            assert_eq!(s[i].to_bits(), sr.to_bits());
            assert_eq!(&q[i * n..(i + 1) * n], &qr[..]);
        }
        let terms = 3;
        let c: Vec<i32> = (0..terms * m * n).map(|_| r.next() as i32 >> 8).collect();
        let a3: Vec<f32> = (0..terms * m).map(|_| r.unit().abs() * 1e-3).collect();
        let w: Vec<f32> = (0..n).map(|_| r.unit().abs() * 1e-2).collect();
        let mut y = vec![0f32; m * n];
        dequantize_output(&c[..m * n], &a3[..m], &w, &mut y);
        let mut y3 = vec![0f32; m * n];
        dequantize_output_terms(&c, &a3, terms, &w, &mut y3);
        for i in 0..m {
            let mut d = vec![0f32; n];
            dequantize_row_scalar(&c[i * n..(i + 1) * n], a3[i], &w, &mut d);
            assert!(d.iter().zip(&y[i * n..(i + 1) * n]).all(|(a, b)| a.to_bits() == b.to_bits()), "row {i}");
            let mut d = vec![0f32; n];
            for t in 0..terms {
                let cr = &c[(t * m + i) * n..(t * m + i + 1) * n];
                dequantize_row_acc_scalar(cr, a3[t * m + i], &w, &mut d);
            }
            assert!(d.iter().zip(&y3[i * n..(i + 1) * n]).all(|(a, b)| a.to_bits() == b.to_bits()), "terms row {i}");
        }
    }
}

#[test]
fn absmax_bits_simd_matches_scalar() {
    let mut r = Rng(0xab5);
    for kind in 0..5 {
        for &n in LENS {
            for rep in 0..4 {
                let mut x: Vec<f32> = (0..n).map(|_| r.value(kind)).collect();
                if rep == 3 && n > 0 {
                    let j = r.below(n as u64) as usize;
                    x[j] = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, f32::MAX][r.below(4) as usize];
                }
                let want = absmax_bits_scalar(&x);
                if let Some(got) = simd::absmax_bits(&x) {
                    assert_eq!(got, want, "kind {kind} n {n} rep {rep}");
                }
                // For a finite row the bits are the reference's NaN-ignoring absmax.
                if want <= simd::FINITE_MAX_BITS {
                    assert_eq!(f32::from_bits(want), x.iter().fold(0f32, |a, v| a.max(v.abs())));
                } else {
                    assert!(x.iter().any(|v| !v.is_finite()), "kind {kind} n {n}: non-finite flagged on a finite row");
                }
            }
        }
    }
    assert_eq!(absmax_bits_scalar(&[]), 0);
    assert_eq!(absmax_bits_scalar(&[-3.0, 2.0, -0.0]), 3f32.to_bits());
}

#[test]
fn residual_kernels_match_scalar() {
    let mut r = Rng(0x7e5);
    for kind in [0u64, 1, 2, 4] {
        for &n in LENS {
            for rep in 0..4 {
                let x: Vec<f32> = (0..n).map(|_| r.value(kind)).collect();
                let amax = x.iter().fold(0f32, |a, v| a.max(v.abs())).max(ABSMAX_FLOOR);
                let (inv, s) = (QMAX / amax, amax / QMAX);
                let what = format!("kind {kind} n {n} rep {rep}");
                // finite kernel = the reference quantizer on a finite row
                let mut qref = vec![0i8; n];
                assert_eq!(quantize_row_scalar(&x, &mut qref).to_bits(), s.to_bits());
                let mut qf = vec![0x55u8 as i8; n];
                if simd::quantize_row_finite(&x, inv, &mut qf).is_some() {
                    assert_eq!(qf, qref, "finite {what}");
                }
                let (mut qs, mut rs) = (vec![0i8; n], vec![0f32; n]);
                let ms = quantize_residual_scalar(&x, inv, s, &mut qs, &mut rs);
                assert_eq!(qs, qref, "residual scalar q {what}");
                for j in 0..n {
                    assert_eq!(rs[j].to_bits(), (x[j] - s * qref[j] as f32).to_bits(), "residual scalar {what} j {j}");
                }
                assert_eq!(ms, absmax_bits_scalar(&rs));
                let (mut qv, mut rv) = (vec![0x2au8 as i8; n], vec![1f32; n]);
                if let Some(mv) = simd::quantize_residual(&x, inv, s, &mut qv, &mut rv) {
                    assert_eq!(qv, qs, "residual q {what}");
                    assert!(rv.iter().zip(&rs).all(|(a, b)| a.to_bits() == b.to_bits()), "residual r {what}");
                    assert_eq!(mv, ms, "residual absmax {what}");
                }
                let (mut qi, mut ri) = (vec![0x2au8 as i8; n], x.clone());
                if let Some(mi) = simd::quantize_residual_inplace(&mut ri, inv, s, &mut qi) {
                    assert_eq!(qi, qs, "in-place q {what}");
                    assert!(ri.iter().zip(&rs).all(|(a, b)| a.to_bits() == b.to_bits()), "in-place r {what}");
                    assert_eq!(mi, ms, "in-place absmax {what}");
                }
            }
        }
    }
}

/// The multi-term quantizer as it was first written (copy the row, then per term the reference
/// quantizer and `r -= s · q`), the definition `quantize_rows_terms` must keep bit for bit.
fn terms_reference(x: &[f32], rows: usize, cols: usize, terms: usize) -> (Vec<i8>, Vec<f32>) {
    let mut q = vec![0i8; terms * rows * cols];
    let mut s = vec![0f32; terms * rows];
    for i in 0..rows {
        let mut r = x[i * cols..(i + 1) * cols].to_vec();
        for t in 0..terms {
            let at = t * rows + i;
            let qr = &mut q[at * cols..(at + 1) * cols];
            s[at] = if cols == 0 { ABSMAX_FLOOR / QMAX } else { quantize_row_scalar(&r, qr) };
            for (d, &qv) in r.iter_mut().zip(qr.iter()) {
                *d -= s[at] * qv as f32;
            }
        }
    }
    (q, s)
}

#[test]
fn quantize_rows_terms_matches_reference() {
    let mut r = Rng(0x7e2);
    // serial and parallel (≥ 2^15 elements) paths, odd K, K below one vector
    let shapes = [(1usize, 1usize), (1, 576), (3, 33), (5, 7), (17, 100), (64, 576), (40, 1000), (9, 1537), (2, 0)];
    for &(m, k) in &shapes {
        for terms in 1..=4 {
            for kind in 0..5 {
                let mut x: Vec<f32> = (0..m * k).map(|_| r.value(kind)).collect();
                // specials in some rows: NaN, ±inf, f32::MAX (its residual overflows to inf)
                if kind == 2 && m * k > 0 {
                    for _ in 0..m.min(6) {
                        let j = r.below((m * k) as u64) as usize;
                        x[j] = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, f32::MAX, -f32::MAX, 0.0][r.below(6) as usize];
                    }
                }
                let (qr, sr) = terms_reference(&x, m, k, terms);
                let mut q = vec![0x33u8 as i8; terms * m * k];
                let mut s = vec![-1f32; terms * m];
                quantize_rows_terms(&x, m, k, terms, &mut q, &mut s);
                let what = format!("M {m} K {k} terms {terms} kind {kind}");
                for j in 0..s.len() {
                    assert!(same_f32(s[j], sr[j]), "{what}: scale {j} {:e} != {:e}", s[j], sr[j]);
                }
                if let Some(j) = (0..q.len()).find(|&j| q[j] != qr[j]) {
                    panic!("{what}: q[{j}] = {} != reference {}", q[j], qr[j]);
                }
            }
        }
    }
    // real values: x = 1.3·[..] with amax 127·1.3; the second term carries what the first lost
    let x: Vec<f32> = (0..40).map(|j| (j as f32 - 20.0) * 0.37 + if j == 3 { 127.0 } else { 0.0 }).collect();
    let (mut q, mut s) = (vec![0i8; 80], vec![0f32; 2]);
    quantize_rows_terms(&x, 1, 40, 2, &mut q, &mut s);
    let y: Vec<f32> = (0..40).map(|j| s[0] * q[j] as f32 + s[1] * q[40 + j] as f32).collect();
    let err = x.iter().zip(&y).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    assert!(err <= s[1] * 0.5 * 1.001, "two-term error {err} vs half a step {}", s[1] * 0.5);
    assert!(s[1] < s[0] / 100.0 && s[1] > 0.0);
}

/// Every x86 ISA's finite-row kernels against the scalar references (the dispatchers above only
/// exercise the widest ISA of this CPU).
#[cfg(target_arch = "x86_64")]
#[test]
fn finite_kernels_every_x86_isa_match_scalar() {
    let mut r = Rng(0x15a);
    let mut ran = Vec::new();
    for isa in ["avx2", "avx512"] {
        for kind in 0..5u64 {
            for &n in LENS {
                for rep in 0..3 {
                    let x: Vec<f32> = (0..n).map(|_| r.value(kind)).collect();
                    let want_a = absmax_bits_scalar(&x);
                    let amax = f32::from_bits(want_a.min(simd::FINITE_MAX_BITS)).max(ABSMAX_FLOOR);
                    let (inv, s) = (QMAX / amax, amax / QMAX);
                    let Some((a, q, _, _)) = simd::finite_kernels_isa(isa, &x, inv, s, false) else { continue };
                    let what = format!("{isa} kind {kind} n {n} rep {rep}");
                    assert_eq!(a, want_a, "absmax {what}");
                    if want_a > simd::FINITE_MAX_BITS {
                        continue; // random bit patterns with NaN/inf: the general kernel's case
                    }
                    let mut qref = vec![0i8; n];
                    quantize_row_scalar(&x, &mut qref);
                    assert_eq!(q, qref, "finite q {what}");
                    let (mut qs, mut rs) = (vec![0i8; n], vec![0f32; n]);
                    let ms = quantize_residual_scalar(&x, inv, s, &mut qs, &mut rs);
                    let (_, qv, rv, mv) = simd::finite_kernels_isa(isa, &x, inv, s, true).unwrap();
                    assert_eq!(qv, qs, "residual q {what}");
                    assert!(rv.iter().zip(&rs).all(|(a, b)| a.to_bits() == b.to_bits()), "residual r {what}");
                    assert_eq!(mv, ms, "residual absmax {what}");
                    checked(&mut ran, isa);
                }
            }
        }
    }
    every_isa_checked("finite-row kernels", &ran);
}

/// Per-channel weight scales for the two-term tests: specials in repetitions 5..8.
fn two_term_weight_scales(r: &mut Rng, n: usize, rep: usize) -> Vec<f32> {
    (0..n).map(|_| if rep >= 5 && r.below(6) == 0 { r.special() } else { r.value(1) }).collect()
}

/// A per-row activation scale for the two-term tests: specials in repetitions 6 and 7.
fn two_term_act_scale(r: &mut Rng, rep: usize) -> f32 {
    if rep >= 6 && r.below(2) == 0 { r.special() } else { r.value(1) }
}

#[test]
fn dequantize_row2_lo_matches_row2_then_accumulate() {
    let mut r = Rng(0xd3);
    for &n in LENS {
        for rep in 0..8 {
            let (c0, c1, cl) = (r.sums(n, TWO_TERM_EXTREMES), r.sums(n, TWO_TERM_EXTREMES), r.sums(n, TWO_TERM_EXTREMES));
            let (sw, swl) = (two_term_weight_scales(&mut r, n, rep), two_term_weight_scales(&mut r, n, rep));
            let pick = |r: &mut Rng| two_term_act_scale(r, rep);
            let (sa0, sa1, sal) = (pick(&mut r), pick(&mut r), pick(&mut r));
            // the definition: two terms, then the second weight term accumulated
            let mut want = vec![3f32; n];
            dequantize_row2_scalar(&c0, sa0, &c1, sa1, &sw, &mut want);
            dequantize_row_acc_scalar(&cl, sal, &swl, &mut want);
            let mut ds = vec![5f32; n];
            dequantize_row2_lo_scalar(&c0, sa0, &c1, sa1, &sw, &cl, sal, &swl, &mut ds);
            let mut dv = vec![6f32; n];
            dequantize_row2_lo(&c0, sa0, &c1, sa1, &sw, &cl, sal, &swl, &mut dv);
            for j in 0..n {
                assert!(same_f32(ds[j], want[j]), "scalar n {n} rep {rep} j {j}");
                assert!(same_f32(dv[j], want[j]), "simd n {n} rep {rep} j {j}: {:e} vs {:e}", dv[j], want[j]);
            }
        }
    }
}

#[test]
fn dequantize_row2_matches_zero_then_two_accumulates() {
    let mut r = Rng(0xd2);
    for &n in LENS {
        for rep in 0..8 {
            let (c0, c1) = (r.sums(n, TWO_TERM_EXTREMES), r.sums(n, TWO_TERM_EXTREMES));
            let sw = two_term_weight_scales(&mut r, n, rep);
            let pick = |r: &mut Rng| two_term_act_scale(r, rep);
            let (sa0, sa1) = (pick(&mut r), pick(&mut r));
            // the definition: a zeroed row, then two accumulates
            let mut want = vec![0f32; n];
            dequantize_row_acc_scalar(&c0, sa0, &sw, &mut want);
            dequantize_row_acc_scalar(&c1, sa1, &sw, &mut want);
            let mut ds = vec![5f32; n];
            dequantize_row2_scalar(&c0, sa0, &c1, sa1, &sw, &mut ds);
            let mut dv = vec![6f32; n];
            dequantize_row2(&c0, sa0, &c1, sa1, &sw, &mut dv);
            for j in 0..n {
                assert!(same_f32(ds[j], want[j]), "scalar n {n} rep {rep} j {j}");
                assert!(same_f32(dv[j], want[j]), "simd n {n} rep {rep} j {j}: {:e} vs {:e}", dv[j], want[j]);
            }
        }
    }
    // -0 products become +0, as on a zeroed row
    let mut d = [1f32; 9];
    dequantize_row2(&[-1; 9], 0.0, &[0; 9], 1.0, &[1.0; 9], &mut d);
    assert!(d.iter().all(|v| v.to_bits() == 0));
}

/// The scalar lane sums `dot16_lanes` must reproduce: lane `l` adds `x[j]·b[j]` for `j ≡ l`
/// (mod 16) in order, over the whole sixteen-element blocks.
fn dot16_lanes_scalar(x: &[f32], b: &[f32]) -> [f32; 16] {
    let mut acc = [0f32; 16];
    for (xs, bs) in x.chunks_exact(16).zip(b.chunks_exact(16)) {
        for l in 0..16 {
            acc[l] += xs[l] * bs[l];
        }
    }
    acc
}

#[test]
fn dot16_lanes_match_the_scalar_lanes() {
    let mut r = Rng(0xd016);
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
    let mut ran: Vec<&str> = Vec::new();
    for &n in LENS {
        for kind in 0..5 {
            let b: Vec<f32> = (0..n).map(|_| r.value(kind)).collect();
            let rows: Vec<Vec<f32>> = (0..4).map(|_| (0..n).map(|_| r.value(kind)).collect()).collect();
            let rr = [&rows[0][..], &rows[1], &rows[2], &rows[3]];
            let want: Vec<[f32; 16]> = rows.iter().map(|x| dot16_lanes_scalar(x, &b)).collect();
            let check = |got: [[f32; 16]; 4], what: &str| {
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    for l in 0..16 {
                        assert!(same_f32(g[l], w[l]), "{what} n {n} kind {kind} row {i} lane {l}: {:e} vs {:e}", g[l], w[l]);
                    }
                }
            };
            let one = simd::dot16_lanes([&rows[1][..]], &b, &mut []);
            assert_eq!(one.is_some(), simd::active().is_some(), "a SIMD path exists but dot16_lanes took none");
            if let Some(g) = one {
                assert!((0..16).all(|l| same_f32(g[0][l], want[1][l])), "one row n {n} kind {kind}");
            }
            // With a copy, the rows land in it whole (bits, NaN payloads included).
            let copied = |c: &[f32], what: &str| {
                for (i, row) in rows.iter().enumerate() {
                    assert!(c[i * n..(i + 1) * n].iter().zip(row).all(|(a, b)| a.to_bits() == b.to_bits()), "{what} copy n {n} kind {kind} row {i}");
                }
            };
            let mut copy = vec![9f32; 4 * n];
            if let Some(g) = simd::dot16_lanes(rr, &b, &mut []) {
                check(g, "dispatched");
                check(simd::dot16_lanes(rr, &b, &mut copy).unwrap(), "dispatched, copying");
                copied(&copy, "dispatched");
            }
            #[cfg(target_arch = "x86_64")]
            for isa in ["avx2", "avx512"] {
                if let Some(g) = simd::dot16_lanes_isa(isa, rr, &b, &mut []) {
                    check(g, isa);
                    copy.fill(9.0);
                    check(simd::dot16_lanes_isa(isa, rr, &b, &mut copy).unwrap(), isa);
                    copied(&copy, isa);
                    checked(&mut ran, isa);
                }
            }
        }
    }
    every_isa_checked("dot16 lane kernels", &ran);
}

#[test]
fn one_term_output_kernels_of_each_isa_match_scalar() {
    let mut r = Rng(0x0e17);
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
    let mut ran: Vec<&str> = Vec::new();
    for &n in LENS {
        for rep in 0..8 {
            let c = r.sums(n, [i32::MIN, i32::MAX, (1 << 24) + 1, -(1 << 25) - 3]);
            let sw: Vec<f32> = (0..n).map(|_| if rep >= 6 && r.below(8) == 0 { r.special() } else { r.value(1).abs() }).collect();
            let e: Vec<f32> = (0..n).map(|_| if rep >= 5 && r.below(8) == 0 { r.special() } else { r.value(1) }).collect();
            let sa = if rep == 7 { r.special() } else { r.value(1).abs() };
            let cc = if rep == 4 { r.special() } else { r.value(1) };
            let mut want = vec![0f32; n];
            dequantize_row_scalar(&c, sa, &sw, &mut want);
            let mut want_corr = vec![0f32; n];
            dequantize_row_corr_scalar(&c, sa, &sw, cc, &e, &mut want_corr);
            let mut got = vec![7f32; n];
            dequantize_row_corr(&c, sa, &sw, cc, &e, &mut got);
            assert!((0..n).all(|j| same_f32(got[j], want_corr[j])), "dispatched corr n {n} rep {rep}");
            #[cfg(target_arch = "x86_64")]
            for isa in ["avx2", "avx512"] {
                let mut d = vec![7f32; n];
                if !simd::dequantize_row_isa(isa, &c, sa, &sw, None, &mut d) {
                    continue;
                }
                assert!((0..n).all(|j| same_f32(d[j], want[j])), "{isa} n {n} rep {rep}");
                d.fill(7.0);
                assert!(simd::dequantize_row_isa(isa, &c, sa, &sw, Some((cc, &e)), &mut d));
                if let Some(j) = (0..n).find(|&j| !same_f32(d[j], want_corr[j])) {
                    panic!("{isa} corr n {n} rep {rep} j {j}: {:e} vs {:e}", d[j], want_corr[j]);
                }
                checked(&mut ran, isa);
            }
        }
    }
    every_isa_checked("one-term output kernels", &ran);
}

/// Notes that `isa`'s kernel was compared (once per ISA).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // only the x86 ISAs are compared apart
fn checked(ran: &mut Vec<&'static str>, isa: &'static str) {
    if !ran.contains(&isa) {
        ran.push(isa);
    }
}

/// The end of a per-ISA test: which ISAs' kernels it compared, and AVX2's among them wherever the
/// CPU has it (a test that compared nothing would pass).
fn every_isa_checked(what: &str, ran: &[&str]) {
    eprintln!("{what} checked: {ran:?}");
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") {
        assert!(ran.contains(&"avx2"), "{what}: the AVX2 kernels were not compared");
    }
}
