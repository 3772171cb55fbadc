//! SIMD fast paths for the per-row W8A8 host arithmetic: NEON on aarch64 (every board this
//! product runs on), AVX2 on x86-64 (this workplace, chosen at run time), and AVX-512 (F/BW/DQ,
//! also chosen at run time) for the finite-row quantizer kernels.
//!
//! Around every NPU matmul the host quantizes the activation rows (f32 → int8, one absmax scale
//! per row) and turns the int32 results back into f32. Both are streaming loops over a few
//! thousand elements per row, run once per matmul per token batch; on the Cortex-A76/A55 cores
//! of an RK3588 the scalar versions cost a noticeable share of the prefill time, because
//! `round_ties_even` and NaN-ignoring `max` do not auto-vectorise. These kernels do the same
//! arithmetic four (NEON), eight (AVX2) or sixteen (AVX-512) lanes at a time.
//!
//! Two kinds of quantizer kernel: the general one (`quantize_row`, any input, the reference's
//! clamp and NaN rule in every lane) and the finite-row ones (`absmax_bits`,
//! `quantize_row_finite`, `quantize_residual[_inplace]`) that the callers in `quant/mod.rs` use
//! whenever the absmax pass finds no NaN/inf in the row — no clamp or NaN work per vector, and
//! the multi-term activation quantizer's residual `r = x - s·q` (with its absmax) computed in
//! the same pass that produces `q`.
//!
//! The contract is **bit-identity with the scalar references** in `quant/mod.rs`
//! (`quantize_row_scalar`, `dequantize_tail`), not mere
//! closeness: the NPU path is tested bit-exactly end to end, and a kernel that differed in one
//! ulp on one platform would make those tests platform-dependent. So each kernel keeps the
//! scalar operation order (`v * inv`, then round; `c as f32 * (sa * sw)`; no fused
//! multiply-add) and reproduces the scalar edge cases:
//! * absmax ignores NaN lanes like `f32::max` (NEON masks them out before `fmax`; AVX2's
//!   `maxps` returns its second operand, the accumulator, when the first is NaN);
//! * rounding is ties-to-even independent of the FP control register (NEON `fcvtns`; AVX2
//!   `roundps` with an explicit mode, then an exact conversion);
//! * out-of-range values and ±inf saturate to ±127, NaN becomes 0, -128 is never produced.
//!
//! Besides the C-ABI, NPU kernel-interface and Vulkan modules, this file and `quant/rotate.rs`
//! (the Hadamard rotation's kernels) are the ones that hold `unsafe`: SIMD intrinsics
//! (raw-pointer loads/stores, `target_feature` functions), with a `// SAFETY:` line on every block. Callers see only safe functions that return `None` when no
//! SIMD path exists on the running CPU; `dispatch!` picks the kernel in each of them.
#![allow(unsafe_code)]

#[cfg(target_arch = "aarch64")]
use std::arch::aarch64::*;
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use super::{q1, ABSMAX_FLOOR, QMAX};

/// The kernel for this CPU, as `Some(result)`, or `None` where no SIMD path exists: `neon` on
/// aarch64 (the architecture's baseline), else on x86-64 `avx512` where built (`cfg(ork_avx512)`)
/// and detected at run time, then `avx2` where detected. Each arm is evaluated only on a CPU that
/// has its instructions, which is what the `// SAFETY:` notes at the call sites rely on; the arms
/// for other architectures are not compiled.
macro_rules! dispatch {
    (neon: $neon:expr, $(avx512: $avx512:expr,)? avx2: $avx2:expr $(,)?) => {{
        #[cfg(target_arch = "aarch64")]
        let picked = Some($neon);
        #[cfg(target_arch = "x86_64")]
        #[allow(unused_labels)] // kernels without an AVX-512 arm
        let picked = 'x86: {
            $(
                #[cfg(ork_avx512)]
                if has_avx512() {
                    break 'x86 Some($avx512);
                }
            )?
            if is_x86_feature_detected!("avx2") {
                Some($avx2)
            } else {
                None
            }
        };
        #[cfg(not(any(target_arch = "aarch64", target_arch = "x86_64")))]
        let picked = None;
        picked
    }};
}

/// The SIMD path used on this CPU, if any: "neon", "avx512", "avx2" or `None` (scalar only).
pub fn active() -> Option<&'static str> {
    dispatch!(neon: "neon", avx512: "avx512", avx2: "avx2")
}

/// `quantize_row_scalar` on SIMD lanes. `None` when this CPU has no SIMD path.
#[inline]
pub fn quantize_row(x: &[f32], q: &mut [i8]) -> Option<f32> {
    assert_eq!(x.len(), q.len());
    dispatch!(
        neon: quantize_row_neon(x, q),
        // SAFETY: AVX2 detected by `dispatch!`; lengths are equal (asserted).
        avx2: unsafe { quantize_row_avx2(x, q) },
    )
}

/// An output row's start ([`dequantize`]'s `INIT`): the first product alone, `0 +` the first
/// product (a -0 product becomes +0, as in a zeroed row), or `d +` the first product.
pub const FIRST: u8 = 0;
pub const ZERO: u8 = 1;
pub const ACC: u8 = 2;

/// One output row's terms: the products `p[t] = (c, sa, sw)`, each `c[j] as f32 · (sa · sw[j])`,
/// and, for a kernel with `CORR`, the correction `cc · e[j]`.
pub struct Row<'a, const N: usize> {
    pub p: [(&'a [i32], f32, &'a [f32]); N],
    pub cc: f32,
    pub e: &'a [f32],
}

/// `quant::dequantize_tail` on SIMD lanes: `d[j] = ((start + p[0]) + p[1]) + … (+ cc·e[j])`,
/// the scalar operations in the scalar order (mul, then add, never fused). `None` without a SIMD
/// path. Every slice of `r` has `d`'s length (the caller asserts it).
#[inline]
pub fn dequantize<const N: usize, const INIT: u8, const CORR: bool>(r: &Row<'_, N>, d: &mut [f32]) -> Option<()> {
    dispatch!(
        neon: dequantize_neon::<N, INIT, CORR>(r, d),
        // SAFETY: AVX-512F detected by `dispatch!`; every slice has d's length (the caller's).
        avx512: unsafe { dequantize_avx512::<N, INIT, CORR>(r, d) },
        // SAFETY: AVX2 detected by `dispatch!`; every slice has d's length (the caller's).
        avx2: unsafe { dequantize_avx2::<N, INIT, CORR>(r, d) },
    )
}

#[cfg(target_arch = "aarch64")]
fn dequantize_neon<const N: usize, const INIT: u8, const CORR: bool>(r: &Row<'_, N>, d: &mut [f32]) {
    let n = d.len();
    let mut i = 0;
    // SAFETY: NEON baseline; the loads read the products' c/sw, e and d at [i, i+4), the store
    // writes d[i..i+4], i+4 <= n and every slice has length n (the caller's contract).
    unsafe {
        while i + 4 <= n {
            let mut acc = match INIT {
                ZERO => Some(vdupq_n_f32(0.0)),
                ACC => Some(vld1q_f32(d.as_ptr().add(i))),
                _ => None,
            };
            for &(c, sa, sw) in &r.p {
                let v = vmulq_f32(vcvtq_f32_s32(vld1q_s32(c.as_ptr().add(i))), vmulq_f32(vdupq_n_f32(sa), vld1q_f32(sw.as_ptr().add(i))));
                acc = Some(match acc { Some(a) => vaddq_f32(a, v), None => v });
            }
            let mut v = acc.expect("a product");
            if CORR {
                v = vaddq_f32(v, vmulq_f32(vdupq_n_f32(r.cc), vld1q_f32(r.e.as_ptr().add(i))));
            }
            vst1q_f32(d.as_mut_ptr().add(i), v);
            i += 4;
        }
    }
    super::dequantize_tail::<N, INIT, CORR>(r, i, d);
}

/// # Safety
/// The CPU must support AVX2; every slice of `r` has `d`'s length.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn dequantize_avx2<const N: usize, const INIT: u8, const CORR: bool>(r: &Row<'_, N>, d: &mut [f32]) {
    let n = d.len();
    let mut i = 0;
    // SAFETY: AVX2 enabled (caller's contract); the loads read the products' c/sw, e and d at
    // [i, i+8), the store writes d[i..i+8], i+8 <= n and every slice has length n.
    unsafe {
        while i + 8 <= n {
            let mut acc = match INIT {
                ZERO => Some(_mm256_setzero_ps()),
                ACC => Some(_mm256_loadu_ps(d.as_ptr().add(i))),
                _ => None,
            };
            for &(c, sa, sw) in &r.p {
                let s = _mm256_mul_ps(_mm256_set1_ps(sa), _mm256_loadu_ps(sw.as_ptr().add(i)));
                let v = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_loadu_si256(c.as_ptr().add(i) as *const __m256i)), s);
                acc = Some(match acc { Some(a) => _mm256_add_ps(a, v), None => v });
            }
            let mut v = acc.expect("a product");
            if CORR {
                v = _mm256_add_ps(v, _mm256_mul_ps(_mm256_set1_ps(r.cc), _mm256_loadu_ps(r.e.as_ptr().add(i))));
            }
            _mm256_storeu_ps(d.as_mut_ptr().add(i), v);
            i += 8;
        }
    }
    super::dequantize_tail::<N, INIT, CORR>(r, i, d);
}

// ---------------------------------------------------------------- aarch64 NEON (baseline ISA)

#[cfg(target_arch = "aarch64")]
fn quantize_row_neon(x: &[f32], q: &mut [i8]) -> f32 {
    let n = x.len();
    let mut i = 0;
    // SAFETY: NEON is part of the aarch64 baseline; every load reads x[i..i+16] with i+16 <= n.
    let mut amax = unsafe {
        let z = vdupq_n_f32(0.0);
        let (mut m0, mut m1, mut m2, mut m3) = (z, z, z, z);
        // |v| with NaN lanes zeroed (vceqq(v, v) is false only for NaN), so NaN is ignored
        // exactly as `f32::max` ignores it, signalling NaN included.
        let absnn = |v: float32x4_t| {
            let a = vabsq_f32(v);
            vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_f32(a), vceqq_f32(a, a)))
        };
        while i + 16 <= n {
            let p = x.as_ptr().add(i);
            m0 = vmaxq_f32(m0, absnn(vld1q_f32(p)));
            m1 = vmaxq_f32(m1, absnn(vld1q_f32(p.add(4))));
            m2 = vmaxq_f32(m2, absnn(vld1q_f32(p.add(8))));
            m3 = vmaxq_f32(m3, absnn(vld1q_f32(p.add(12))));
            i += 16;
        }
        vmaxvq_f32(vmaxq_f32(vmaxq_f32(m0, m1), vmaxq_f32(m2, m3)))
    };
    for &v in &x[i..] {
        amax = amax.max(v.abs());
    }
    let amax = amax.max(ABSMAX_FLOOR);
    let inv = QMAX / amax;
    let mut i = 0;
    // SAFETY: NEON baseline; loads read x[i..i+16] and the store writes q[i..i+16], i+16 <= n
    // and q.len() == n (asserted by the caller).
    unsafe {
        let vinv = vdupq_n_f32(inv);
        let lo = vdupq_n_s8(-(QMAX as i8));
        while i + 16 <= n {
            let p = x.as_ptr().add(i);
            // fcvtns: round to nearest, ties to even, saturating; NaN -> 0.
            let a = vcvtnq_s32_f32(vmulq_f32(vld1q_f32(p), vinv));
            let b = vcvtnq_s32_f32(vmulq_f32(vld1q_f32(p.add(4)), vinv));
            let c = vcvtnq_s32_f32(vmulq_f32(vld1q_f32(p.add(8)), vinv));
            let d = vcvtnq_s32_f32(vmulq_f32(vld1q_f32(p.add(12)), vinv));
            // Saturating narrows keep order, so clamping to -127 after them equals clamp-then-narrow.
            let ab = vcombine_s16(vqmovn_s32(a), vqmovn_s32(b));
            let cd = vcombine_s16(vqmovn_s32(c), vqmovn_s32(d));
            let r = vmaxq_s8(vcombine_s8(vqmovn_s16(ab), vqmovn_s16(cd)), lo);
            vst1q_s8(q.as_mut_ptr().add(i), r);
            i += 16;
        }
    }
    for (d, &v) in q[i..].iter_mut().zip(&x[i..]) {
        *d = q1(v, inv);
    }
    amax / QMAX
}

// ---------------------------------------------------------------- x86-64 AVX2 (runtime-detected)

/// # Safety
/// The CPU must support AVX2; `q.len() == x.len()`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn quantize_row_avx2(x: &[f32], q: &mut [i8]) -> f32 {
    let n = x.len();
    let mut i = 0;
    // SAFETY: AVX2 is enabled for this function (caller's contract); loads read x[i..i+32],
    // i+32 <= n.
    let mut amax = unsafe {
        let absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
        let z = _mm256_setzero_ps();
        let (mut m0, mut m1, mut m2, mut m3) = (z, z, z, z);
        while i + 32 <= n {
            let p = x.as_ptr().add(i);
            // maxps returns the second operand (the accumulator) when the first is NaN.
            m0 = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(p), absmask), m0);
            m1 = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(p.add(8)), absmask), m1);
            m2 = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(p.add(16)), absmask), m2);
            m3 = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(p.add(24)), absmask), m3);
            i += 32;
        }
        let m = _mm256_max_ps(_mm256_max_ps(m0, m1), _mm256_max_ps(m2, m3));
        let mut lanes = [0f32; 8];
        _mm256_storeu_ps(lanes.as_mut_ptr(), m);
        lanes.iter().fold(0f32, |a, &b| a.max(b))
    };
    for &v in &x[i..] {
        amax = amax.max(v.abs());
    }
    let amax = amax.max(ABSMAX_FLOOR);
    let inv = QMAX / amax;
    let mut i = 0;
    // SAFETY: AVX2 enabled (caller's contract); loads read x[i..i+32] and the store writes
    // q[i..i+32], i+32 <= n == q.len().
    unsafe {
        let vinv = _mm256_set1_ps(inv);
        let (lo, hi) = (_mm256_set1_ps(-QMAX), _mm256_set1_ps(QMAX));
        let perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
        // One group of 8: v*inv, round ties-to-even with an explicit mode (MXCSR-independent),
        // clamp (NaN -> -127 by maxps' operand rule), exact convert, then zero the NaN lanes.
        let g = |p: *const f32| {
            let t = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(
                _mm256_loadu_ps(p),
                vinv,
            ));
            let c = _mm256_min_ps(_mm256_max_ps(t, lo), hi);
            let ord = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_ORD_Q>(t, t));
            _mm256_and_si256(_mm256_cvtps_epi32(c), ord)
        };
        while i + 32 <= n {
            let p = x.as_ptr().add(i);
            let (a, b, c, d) = (g(p), g(p.add(8)), g(p.add(16)), g(p.add(24)));
            // packs work within 128-bit halves; the permute restores element order.
            let r = _mm256_packs_epi16(_mm256_packs_epi32(a, b), _mm256_packs_epi32(c, d));
            let r = _mm256_permutevar8x32_epi32(r, perm);
            _mm256_storeu_si256(q.as_mut_ptr().add(i) as *mut __m256i, r);
            i += 32;
        }
    }
    for (d, &v) in q[i..].iter_mut().zip(&x[i..]) {
        *d = q1(v, inv);
    }
    amax / QMAX
}

// ------------------------------------------------ finite-row fast path (all rows without NaN/inf)
//
// Almost every activation row is finite. For such a row, `|v · (127 / amax)|` rounds to at most
// 127 for every element (|v| ≤ amax, and `amax · fl(127 / amax)` is within two ulps of 127), so
// the reference's clamp and NaN rule are no-ops and the quantize pass is just multiply, round,
// narrow. The absmax pass decides which path a row takes: it takes the integer maximum of the
// sign-cleared bit patterns, which for finite non-negative floats orders exactly like the float
// maximum and puts ±inf (0x7f80_0000) and every NaN (above it) on top, so one compare after the
// pass detects a non-finite row. Such rows go through the general kernels above.

/// Largest bit pattern of a finite non-negative f32 (`f32::MAX`).
pub const FINITE_MAX_BITS: u32 = 0x7f7f_ffff;

/// `max(bits(|x[j]|))` over the row (0 for an empty row); above [`FINITE_MAX_BITS`] iff the row
/// has a NaN or ±inf. Otherwise `f32::from_bits` of it equals the reference's NaN-ignoring absmax.
#[inline]
pub fn absmax_bits(x: &[f32]) -> Option<u32> {
    dispatch!(
        neon: absmax_bits_neon(x),
        // SAFETY: AVX-512F/BW/DQ detected by `dispatch!`.
        avx512: unsafe { absmax_bits_avx512(x) },
        // SAFETY: AVX2 detected by `dispatch!`.
        avx2: unsafe { absmax_bits_avx2(x) },
    )
}

/// `q[j] = round_half_even(x[j] · inv)` for a finite row whose `inv = 127 / max(absmax, floor)`
/// was computed from this same row (so no clamp is needed). Equals the reference's quantize loop
/// under that precondition; without it the result saturates to [-128, 127] but is unspecified.
/// `None` without a SIMD path.
#[inline]
pub fn quantize_row_finite(x: &[f32], inv: f32, q: &mut [i8]) -> Option<()> {
    assert_eq!(x.len(), q.len());
    let (x, r, n) = (x.as_ptr(), std::ptr::null_mut(), x.len());
    dispatch!(
        // SAFETY: NEON is the aarch64 baseline; x and q have n elements (asserted); keep = false
        // never touches r.
        neon: unsafe { quant_resid_neon(x, r, n, inv, 0.0, q, false) },
        // SAFETY: AVX-512F/BW/DQ detected by `dispatch!`; the rest as for NEON.
        avx512: unsafe { quant_resid_avx512(x, r, n, inv, 0.0, q, false) },
        // SAFETY: AVX2 detected by `dispatch!`; the rest as for NEON.
        avx2: unsafe { quant_resid_avx2(x, r, n, inv, 0.0, q, false) },
    )
    .map(|_| ())
}

/// [`quantize_row_finite`] plus the residual for the next term, in the same pass:
/// `r[j] = x[j] - s · (q[j] as f32)` (multiply, then subtract: never fused). Returns
/// [`absmax_bits`] of `r`. `None` without a SIMD path.
#[inline]
pub fn quantize_residual(x: &[f32], inv: f32, s: f32, q: &mut [i8], r: &mut [f32]) -> Option<u32> {
    assert!(x.len() == q.len() && x.len() == r.len());
    let (x, r, n) = (x.as_ptr(), r.as_mut_ptr(), x.len());
    dispatch!(
        // SAFETY: NEON is the aarch64 baseline; x, q, r have n elements (asserted) and x does
        // not alias r (&/&mut).
        neon: unsafe { quant_resid_neon(x, r, n, inv, s, q, true) },
        // SAFETY: AVX-512F/BW/DQ detected by `dispatch!`; the rest as for NEON.
        avx512: unsafe { quant_resid_avx512(x, r, n, inv, s, q, true) },
        // SAFETY: AVX2 detected by `dispatch!`; the rest as for NEON.
        avx2: unsafe { quant_resid_avx2(x, r, n, inv, s, q, true) },
    )
}

/// [`quantize_residual`] with the residual written over its input: `r ← r - s · q`.
#[inline]
pub fn quantize_residual_inplace(r: &mut [f32], inv: f32, s: f32, q: &mut [i8]) -> Option<u32> {
    assert_eq!(r.len(), q.len());
    let (p, n) = (r.as_mut_ptr(), r.len());
    dispatch!(
        // SAFETY: NEON is the aarch64 baseline; source and destination are the same n-element
        // slice, each element (vector) is read before it is written.
        neon: unsafe { quant_resid_neon(p, p, n, inv, s, q, true) },
        // SAFETY: AVX-512F/BW/DQ detected by `dispatch!`; the rest as for NEON.
        avx512: unsafe { quant_resid_avx512(p, p, n, inv, s, q, true) },
        // SAFETY: AVX2 detected by `dispatch!`; the rest as for NEON.
        avx2: unsafe { quant_resid_avx2(p, p, n, inv, s, q, true) },
    )
}

/// Scalar tail shared by the residual kernels: one element, returns `bits(|r|)` (0 without r).
///
/// # Safety
/// `x.add(j)` readable; when `keep`, `r.add(j)` writable (it may equal `x`).
#[inline(always)]
unsafe fn resid1(x: *const f32, r: *mut f32, j: usize, inv: f32, s: f32, q: &mut [i8], keep: bool) -> u32 {
    // SAFETY: the caller's contract.
    let v = unsafe { *x.add(j) };
    let qv = q1(v, inv);
    q[j] = qv;
    if keep {
        let rv = v - s * qv as f32;
        // SAFETY: the caller's contract.
        unsafe { *r.add(j) = rv };
        rv.to_bits() & 0x7fff_ffff
    } else {
        0
    }
}

#[cfg(target_arch = "aarch64")]
fn absmax_bits_neon(x: &[f32]) -> u32 {
    let n = x.len();
    let mut i = 0;
    // SAFETY: NEON baseline; every load reads x[i..i+16] with i+16 <= n.
    let mut m = unsafe {
        let z = vdupq_n_u32(0);
        let mask = vdupq_n_u32(0x7fff_ffff);
        let (mut m0, mut m1, mut m2, mut m3) = (z, z, z, z);
        while i + 16 <= n {
            let p = x.as_ptr().add(i) as *const u32;
            m0 = vmaxq_u32(m0, vandq_u32(vld1q_u32(p), mask));
            m1 = vmaxq_u32(m1, vandq_u32(vld1q_u32(p.add(4)), mask));
            m2 = vmaxq_u32(m2, vandq_u32(vld1q_u32(p.add(8)), mask));
            m3 = vmaxq_u32(m3, vandq_u32(vld1q_u32(p.add(12)), mask));
            i += 16;
        }
        vmaxvq_u32(vmaxq_u32(vmaxq_u32(m0, m1), vmaxq_u32(m2, m3)))
    };
    for &v in &x[i..] {
        m = m.max(v.to_bits() & 0x7fff_ffff);
    }
    m
}

/// `q = round_half_even(src · inv)` (finite-row precondition), and when `keep`,
/// `r = src - s · q` with the bit-absmax of r returned.
///
/// # Safety
/// `src` readable for n floats, `q.len() == n`; when `keep`, `r` writable for n floats and either
/// equal to `src` or not overlapping it.
#[cfg(target_arch = "aarch64")]
unsafe fn quant_resid_neon(src: *const f32, r: *mut f32, n: usize, inv: f32, s: f32, q: &mut [i8], keep: bool) -> u32 {
    debug_assert_eq!(q.len(), n);
    let mut i = 0;
    // SAFETY: NEON baseline; loads read src[i..i+16], stores write q[i..i+16] and r[i..i+16],
    // i+16 <= n (caller's contract); each r vector is stored after the src vector it replaces
    // was loaded.
    let mut m = unsafe {
        let vinv = vdupq_n_f32(inv);
        let vs = vdupq_n_f32(s);
        let mask = vdupq_n_u32(0x7fff_ffff);
        let mut acc = vdupq_n_u32(0);
        while i + 16 <= n {
            let p = src.add(i);
            let (v0, v1, v2, v3) = (vld1q_f32(p), vld1q_f32(p.add(4)), vld1q_f32(p.add(8)), vld1q_f32(p.add(12)));
            // fcvtns: round to nearest, ties to even (in range by the precondition).
            let a = vcvtnq_s32_f32(vmulq_f32(v0, vinv));
            let b = vcvtnq_s32_f32(vmulq_f32(v1, vinv));
            let c = vcvtnq_s32_f32(vmulq_f32(v2, vinv));
            let d = vcvtnq_s32_f32(vmulq_f32(v3, vinv));
            let ab = vcombine_s16(vqmovn_s32(a), vqmovn_s32(b));
            let cd = vcombine_s16(vqmovn_s32(c), vqmovn_s32(d));
            vst1q_s8(q.as_mut_ptr().add(i), vcombine_s8(vqmovn_s16(ab), vqmovn_s16(cd)));
            if keep {
                let o = r.add(i);
                let res = |v: float32x4_t, k: int32x4_t| vsubq_f32(v, vmulq_f32(vs, vcvtq_f32_s32(k)));
                let (r0, r1, r2, r3) = (res(v0, a), res(v1, b), res(v2, c), res(v3, d));
                vst1q_f32(o, r0);
                vst1q_f32(o.add(4), r1);
                vst1q_f32(o.add(8), r2);
                vst1q_f32(o.add(12), r3);
                let bits = |v: float32x4_t| vandq_u32(vreinterpretq_u32_f32(v), mask);
                acc = vmaxq_u32(acc, vmaxq_u32(vmaxq_u32(bits(r0), bits(r1)), vmaxq_u32(bits(r2), bits(r3))));
            }
            i += 16;
        }
        vmaxvq_u32(acc)
    };
    for j in i..n {
        // SAFETY: j < n; the caller's contract.
        m = m.max(unsafe { resid1(src, r, j, inv, s, q, keep) });
    }
    m
}

/// # Safety
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn absmax_bits_avx2(x: &[f32]) -> u32 {
    let n = x.len();
    let mut i = 0;
    // SAFETY: AVX2 enabled (caller's contract); loads read x[i..i+32], i+32 <= n.
    let mut m = unsafe {
        let mask = _mm256_set1_epi32(0x7fff_ffff);
        let z = _mm256_setzero_si256();
        let (mut m0, mut m1, mut m2, mut m3) = (z, z, z, z);
        while i + 32 <= n {
            let p = x.as_ptr().add(i) as *const __m256i;
            m0 = _mm256_max_epu32(m0, _mm256_and_si256(_mm256_loadu_si256(p), mask));
            m1 = _mm256_max_epu32(m1, _mm256_and_si256(_mm256_loadu_si256(p.add(1)), mask));
            m2 = _mm256_max_epu32(m2, _mm256_and_si256(_mm256_loadu_si256(p.add(2)), mask));
            m3 = _mm256_max_epu32(m3, _mm256_and_si256(_mm256_loadu_si256(p.add(3)), mask));
            i += 32;
        }
        if i + 16 <= n {
            let p = x.as_ptr().add(i) as *const __m256i;
            m0 = _mm256_max_epu32(m0, _mm256_and_si256(_mm256_loadu_si256(p), mask));
            m1 = _mm256_max_epu32(m1, _mm256_and_si256(_mm256_loadu_si256(p.add(1)), mask));
            i += 16;
        }
        let m = _mm256_max_epu32(_mm256_max_epu32(m0, m1), _mm256_max_epu32(m2, m3));
        let h = _mm_max_epu32(_mm256_castsi256_si128(m), _mm256_extracti128_si256::<1>(m));
        let h = _mm_max_epu32(h, _mm_shuffle_epi32::<0b01_00_11_10>(h));
        let h = _mm_max_epu32(h, _mm_shuffle_epi32::<0b10_11_00_01>(h));
        _mm_cvtsi128_si32(h) as u32
    };
    for &v in &x[i..] {
        m = m.max(v.to_bits() & 0x7fff_ffff);
    }
    m
}

/// AVX2 form of `quant_resid_neon` (same contract).
///
/// # Safety
/// The CPU must support AVX2; `src` readable for n floats, `q.len() == n`; when `keep`, `r`
/// writable for n floats and either equal to `src` or not overlapping it.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn quant_resid_avx2(src: *const f32, r: *mut f32, n: usize, inv: f32, s: f32, q: &mut [i8], keep: bool) -> u32 {
    debug_assert_eq!(q.len(), n);
    let mut i = 0;
    // SAFETY: AVX2 enabled (caller's contract); loads read src[i..i+32], stores write q[i..i+32]
    // and r[i..i+32], i+32 <= n; each r vector is stored after the src vector it replaces was
    // loaded.
    let mut m = unsafe {
        let vinv = _mm256_set1_ps(inv);
        let vs = _mm256_set1_ps(s);
        let mask = _mm256_set1_epi32(0x7fff_ffff);
        let perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
        let mut acc = _mm256_setzero_si256();
        // round with an explicit mode (MXCSR-independent), then an exact conversion.
        let g = |v: __m256| {
            _mm256_cvtps_epi32(_mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(
                v, vinv,
            )))
        };
        while i + 32 <= n {
            let p = src.add(i);
            let (v0, v1, v2, v3) = (_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8)), _mm256_loadu_ps(p.add(16)), _mm256_loadu_ps(p.add(24)));
            let (a, b, c, d) = (g(v0), g(v1), g(v2), g(v3));
            // packs work within 128-bit halves; the permute restores element order.
            let qv = _mm256_packs_epi16(_mm256_packs_epi32(a, b), _mm256_packs_epi32(c, d));
            _mm256_storeu_si256(q.as_mut_ptr().add(i) as *mut __m256i, _mm256_permutevar8x32_epi32(qv, perm));
            if keep {
                let o = r.add(i);
                let res = |v: __m256, k: __m256i| _mm256_sub_ps(v, _mm256_mul_ps(vs, _mm256_cvtepi32_ps(k)));
                let (r0, r1, r2, r3) = (res(v0, a), res(v1, b), res(v2, c), res(v3, d));
                _mm256_storeu_ps(o, r0);
                _mm256_storeu_ps(o.add(8), r1);
                _mm256_storeu_ps(o.add(16), r2);
                _mm256_storeu_ps(o.add(24), r3);
                let bits = |v: __m256| _mm256_and_si256(_mm256_castps_si256(v), mask);
                acc = _mm256_max_epu32(
                    acc,
                    _mm256_max_epu32(_mm256_max_epu32(bits(r0), bits(r1)), _mm256_max_epu32(bits(r2), bits(r3))),
                );
            }
            i += 32;
        }
        let h = _mm_max_epu32(_mm256_castsi256_si128(acc), _mm256_extracti128_si256::<1>(acc));
        let h = _mm_max_epu32(h, _mm_shuffle_epi32::<0b01_00_11_10>(h));
        let h = _mm_max_epu32(h, _mm_shuffle_epi32::<0b10_11_00_01>(h));
        _mm_cvtsi128_si32(h) as u32
    };
    for j in i..n {
        // SAFETY: j < n; the caller's contract.
        m = m.max(unsafe { resid1(src, r, j, inv, s, q, keep) });
    }
    m
}

// ----------------------------------------- x86-64 AVX-512 (runtime-detected, finite-row kernels)
//
// Same arithmetic as the AVX2 kernels, sixteen lanes at a time, with the rounding mode embedded
// in the conversion (`vcvtps2dq {rn-sae}`: ties-to-even whatever MXCSR says) and masked loads and
// stores for the row tail instead of a scalar loop. The AVX-512 intrinsics are stable from Rust
// 1.89; `build.rs` sets `ork_avx512` on such compilers, older ones (the crate's MSRV is 1.85)
// build the AVX2 path only.

/// Whether the AVX-512 finite-row kernels can run here (F for the arithmetic, BW for the packs,
/// DQ for `vrangeps`, which takes max(|a|, |b|) in one instruction).
#[cfg(all(target_arch = "x86_64", ork_avx512))]
#[inline]
fn has_avx512() -> bool {
    is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bw") && is_x86_feature_detected!("avx512dq")
}

/// `vrangeps` immediate: the larger magnitude (imm[1:0] = 11), sign cleared (imm[3:2] = 10). Used
/// only on residuals, which are finite or ±inf (its NaN rules are not the reference's).
#[cfg(all(target_arch = "x86_64", ork_avx512))]
const RANGE_MAX_ABS: i32 = 0b1011;

/// # Safety
/// The CPU must support AVX-512F.
#[cfg(all(target_arch = "x86_64", ork_avx512))]
// Built only where cfg(ork_avx512) says rustc >= 1.89, whatever the declared MSRV.
#[allow(clippy::incompatible_msrv)]
#[target_feature(enable = "avx512f")]
unsafe fn absmax_bits_avx512(x: &[f32]) -> u32 {
    let n = x.len();
    let mut i = 0;
    let p = x.as_ptr() as *const i32;
    // SAFETY: AVX-512F enabled (caller's contract); full loads read x[i..i+64] or x[i..i+16]
    // within n; the masked load reads only the lanes below n (masked-off lanes never fault).
    unsafe {
        let mask = _mm512_set1_epi32(0x7fff_ffff);
        let z = _mm512_setzero_si512();
        let (mut m0, mut m1, mut m2, mut m3) = (z, z, z, z);
        while i + 64 <= n {
            m0 = _mm512_max_epu32(m0, _mm512_and_si512(_mm512_loadu_epi32(p.add(i)), mask));
            m1 = _mm512_max_epu32(m1, _mm512_and_si512(_mm512_loadu_epi32(p.add(i + 16)), mask));
            m2 = _mm512_max_epu32(m2, _mm512_and_si512(_mm512_loadu_epi32(p.add(i + 32)), mask));
            m3 = _mm512_max_epu32(m3, _mm512_and_si512(_mm512_loadu_epi32(p.add(i + 48)), mask));
            i += 64;
        }
        while i + 16 <= n {
            m0 = _mm512_max_epu32(m0, _mm512_and_si512(_mm512_loadu_epi32(p.add(i)), mask));
            i += 16;
        }
        if i < n {
            let k: __mmask16 = ((1u32 << (n - i)) - 1) as u16;
            m1 = _mm512_max_epu32(m1, _mm512_and_si512(_mm512_maskz_loadu_epi32(k, p.add(i)), mask));
        }
        _mm512_reduce_max_epu32(_mm512_max_epu32(_mm512_max_epu32(m0, m1), _mm512_max_epu32(m2, m3)))
    }
}

/// AVX-512 form of `quant_resid_avx2` (same contract).
///
/// # Safety
/// The CPU must support AVX-512F, BW and DQ; `src` readable for n floats, `q.len() == n`; when
/// `keep`, `r` writable for n floats and either equal to `src` or not overlapping it.
#[cfg(all(target_arch = "x86_64", ork_avx512))]
// Built only where cfg(ork_avx512) says rustc >= 1.89, whatever the declared MSRV.
#[allow(clippy::incompatible_msrv)]
#[target_feature(enable = "avx512f,avx512bw,avx512dq")]
unsafe fn quant_resid_avx512(src: *const f32, r: *mut f32, n: usize, inv: f32, s: f32, q: &mut [i8], keep: bool) -> u32 {
    debug_assert_eq!(q.len(), n);
    let qp = q.as_mut_ptr();
    let mut i = 0;
    // SAFETY: AVX-512F/BW/DQ enabled (caller's contract); full loads and stores touch
    // [i, i+64) or [i, i+16) within n; the masked load/stores touch only lanes below n; each r
    // vector is stored after the src vector it replaces was loaded.
    unsafe {
        let vinv = _mm512_set1_ps(inv);
        let vs = _mm512_set1_ps(s);
        let perm = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
        // max |r| as a float (sign cleared); r is finite or ±inf here, never NaN.
        let mut acc = _mm512_setzero_ps();
        let g = |v: __m512| _mm512_cvt_roundps_epi32::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm512_mul_ps(v, vinv));
        let res = |v: __m512, k: __m512i| _mm512_sub_ps(v, _mm512_mul_ps(vs, _mm512_cvtepi32_ps(k)));
        let mx = |a: __m512, b: __m512| _mm512_range_ps::<RANGE_MAX_ABS>(a, b);
        while i + 64 <= n {
            let p = src.add(i);
            let (v0, v1, v2, v3) = (_mm512_loadu_ps(p), _mm512_loadu_ps(p.add(16)), _mm512_loadu_ps(p.add(32)), _mm512_loadu_ps(p.add(48)));
            let (a, b, c, d) = (g(v0), g(v1), g(v2), g(v3));
            // packs work within 128-bit lanes; the permute restores element order.
            let qv = _mm512_packs_epi16(_mm512_packs_epi32(a, b), _mm512_packs_epi32(c, d));
            _mm512_storeu_si512(qp.add(i) as *mut __m512i, _mm512_permutexvar_epi32(perm, qv));
            if keep {
                let o = r.add(i);
                let (r0, r1, r2, r3) = (res(v0, a), res(v1, b), res(v2, c), res(v3, d));
                _mm512_storeu_ps(o, r0);
                _mm512_storeu_ps(o.add(16), r1);
                _mm512_storeu_ps(o.add(32), r2);
                _mm512_storeu_ps(o.add(48), r3);
                acc = mx(acc, mx(mx(r0, r1), mx(r2, r3)));
            }
            i += 64;
        }
        while i < n {
            let k: __mmask16 = if n - i >= 16 { 0xffff } else { ((1u32 << (n - i)) - 1) as u16 };
            let v = _mm512_maskz_loadu_ps(k, src.add(i));
            let a = g(v);
            // vpmovsdb: saturating narrow (in range here), stored for the active lanes only.
            _mm512_mask_cvtsepi32_storeu_epi8(qp.add(i), k, a);
            if keep {
                let rv = res(v, a);
                _mm512_mask_storeu_ps(r.add(i), k, rv);
                acc = mx(acc, rv); // inactive lanes: 0 - s·0 = 0
            }
            i += 16;
        }
        _mm512_reduce_max_epu32(_mm512_castps_si512(acc))
    }
}

/// Test access to each x86 ISA's finite-row kernels (the dispatchers pick only the widest one):
/// `(absmax_bits(x), q, r)` with `r = x - s·q` when `resid`, for "avx2" or "avx512";
/// `None` when this CPU lacks that ISA.
#[cfg(all(test, target_arch = "x86_64"))]
pub(crate) fn finite_kernels_isa(isa: &str, x: &[f32], inv: f32, s: f32, resid: bool) -> Option<(u32, Vec<i8>, Vec<f32>, u32)> {
    let n = x.len();
    let mut q = vec![0x5au8 as i8; n];
    let mut r = vec![7f32; n];
    let rp = if resid { r.as_mut_ptr() } else { std::ptr::null_mut() };
    // SAFETY: each kernel runs only when its ISA was detected; q and r have n elements.
    let (a, m) = unsafe {
        match isa {
            "avx2" if is_x86_feature_detected!("avx2") => (absmax_bits_avx2(x), quant_resid_avx2(x.as_ptr(), rp, n, inv, s, &mut q, resid)),
            #[cfg(ork_avx512)]
            "avx512" if has_avx512() => (absmax_bits_avx512(x), quant_resid_avx512(x.as_ptr(), rp, n, inv, s, &mut q, resid)),
            _ => return None,
        }
    };
    Some((a, q, r, m))
}

/// The sixteen lane sums of `mean::dot16` for `R` rows against one `b` over their first
/// `k / 16 * 16` elements: lane `l` of row `r` is `((0 + x[l]·b[l]) + x[16 + l]·b[16 + l]) + …`,
/// each product rounded, then added (never fused), in order — the scalar loop's values bit for
/// bit (`mean::dot16_rows` adds the lanes pairwise and the tail after it). `None` without SIMD.
/// With a `copy: [R·K]` (else empty), the rows are also copied into it, row `r` at `r·K`, in the
/// same pass: where they come from a slower cache, the dot costs no reads of its own.
#[inline]
pub fn dot16_lanes<const R: usize>(rows: [&[f32]; R], b: &[f32], copy: &mut [f32]) -> Option<[[f32; 16]; R]> {
    assert!(rows.iter().all(|r| r.len() == b.len()), "rows and b differ in length");
    assert!(copy.is_empty() || copy.len() == R * b.len(), "copy is not [R·K] (or empty)");
    dispatch!(
        neon: dot16_lanes_neon(rows, b, copy),
        // SAFETY: AVX-512F detected by `dispatch!`; every row has b's length, copy R·K or 0
        // (asserted).
        avx512: unsafe { dot16_lanes_avx512(rows, b, copy) },
        // SAFETY: AVX2 detected by `dispatch!`; every row has b's length, copy R·K or 0
        // (asserted).
        avx2: unsafe { dot16_lanes_avx2(rows, b, copy) },
    )
}

/// The tail of a copying [`dot16_lanes`] kernel: each row's elements past the sixteen-element
/// blocks copied (the blocks were copied with the dot).
fn copy_tails<const R: usize>(rows: &[&[f32]; R], copy: &mut [f32], full: usize) {
    if copy.is_empty() {
        return;
    }
    let k = copy.len() / R;
    for (r, row) in rows.iter().enumerate() {
        copy[r * k + full..(r + 1) * k].copy_from_slice(&row[full..]);
    }
}

#[cfg(target_arch = "aarch64")]
fn dot16_lanes_neon<const R: usize>(rows: [&[f32]; R], b: &[f32], copy: &mut [f32]) -> [[f32; 16]; R] {
    let (k, full) = (b.len(), b.len() / 16 * 16);
    let mut out = [[0f32; 16]; R];
    let cp = (!copy.is_empty()).then_some(copy.as_mut_ptr());
    // SAFETY: NEON baseline; every load reads [j, j + 16) of a slice of length ≥ full ≥ j + 16
    // (all rows have b's length), every copy store [r·k + j, r·k + j + 16) of copy (R·k long
    // when not empty); the stores into `out` write a [f32; 16] in four quarters. mul then add.
    unsafe {
        let mut acc = [[vdupq_n_f32(0.0); 4]; R];
        let mut j = 0;
        while j < full {
            let bp = b.as_ptr().add(j);
            let bb = [vld1q_f32(bp), vld1q_f32(bp.add(4)), vld1q_f32(bp.add(8)), vld1q_f32(bp.add(12))];
            // Every row's loads before any store (a store, then a load at the same address
            // modulo a page, can stall the load).
            let mut xs = [[vdupq_n_f32(0.0); 4]; R];
            for (v, row) in xs.iter_mut().zip(&rows) {
                for (q, v) in v.iter_mut().enumerate() {
                    *v = vld1q_f32(row.as_ptr().add(j + 4 * q));
                }
            }
            for (r, (a, x)) in acc.iter_mut().zip(&xs).enumerate() {
                for q in 0..4 {
                    if let Some(c) = cp {
                        vst1q_f32(c.add(r * k + j + 4 * q), x[q]);
                    }
                    a[q] = vaddq_f32(a[q], vmulq_f32(x[q], bb[q]));
                }
            }
            j += 16;
        }
        for (o, a) in out.iter_mut().zip(&acc) {
            for q in 0..4 {
                vst1q_f32(o.as_mut_ptr().add(4 * q), a[q]);
            }
        }
    }
    copy_tails(&rows, copy, full);
    out
}

/// # Safety
/// The CPU must support AVX2; every row has `b`'s length.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn dot16_lanes_avx2<const R: usize>(rows: [&[f32]; R], b: &[f32], copy: &mut [f32]) -> [[f32; 16]; R] {
    let (k, full) = (b.len(), b.len() / 16 * 16);
    let mut out = [[0f32; 16]; R];
    let cp = (!copy.is_empty()).then_some(copy.as_mut_ptr());
    // SAFETY: AVX2 enabled (caller's contract); every load reads [j, j + 16) of a slice of length
    // ≥ full ≥ j + 16, every copy store [r·k + j, r·k + j + 16) of copy (R·k long when not
    // empty); the stores into `out` write a [f32; 16] in two halves. mul then add, never fused.
    unsafe {
        let mut acc = [[_mm256_setzero_ps(); 2]; R];
        let mut j = 0;
        while j < full {
            let bp = b.as_ptr().add(j);
            let (b0, b1) = (_mm256_loadu_ps(bp), _mm256_loadu_ps(bp.add(8)));
            // Every row's loads before any store (see the AVX-512 kernel).
            let mut xs = [(_mm256_setzero_ps(), _mm256_setzero_ps()); R];
            for (v, row) in xs.iter_mut().zip(&rows) {
                *v = (_mm256_loadu_ps(row.as_ptr().add(j)), _mm256_loadu_ps(row.as_ptr().add(j + 8)));
            }
            for (r, (a, &(x0, x1))) in acc.iter_mut().zip(&xs).enumerate() {
                if let Some(c) = cp {
                    _mm256_storeu_ps(c.add(r * k + j), x0);
                    _mm256_storeu_ps(c.add(r * k + j + 8), x1);
                }
                a[0] = _mm256_add_ps(a[0], _mm256_mul_ps(x0, b0));
                a[1] = _mm256_add_ps(a[1], _mm256_mul_ps(x1, b1));
            }
            j += 16;
        }
        for (o, a) in out.iter_mut().zip(&acc) {
            _mm256_storeu_ps(o.as_mut_ptr(), a[0]);
            _mm256_storeu_ps(o.as_mut_ptr().add(8), a[1]);
        }
    }
    copy_tails(&rows, copy, full);
    out
}

/// # Safety
/// The CPU must support AVX-512F; every row has `b`'s length.
#[cfg(all(target_arch = "x86_64", ork_avx512))]
#[allow(clippy::incompatible_msrv)]
#[target_feature(enable = "avx512f")]
unsafe fn dot16_lanes_avx512<const R: usize>(rows: [&[f32]; R], b: &[f32], copy: &mut [f32]) -> [[f32; 16]; R] {
    let (k, full) = (b.len(), b.len() / 16 * 16);
    let mut out = [[0f32; 16]; R];
    let cp = (!copy.is_empty()).then_some(copy.as_mut_ptr());
    // SAFETY: AVX-512F enabled (caller's contract); every load reads [j, j + 16) of a slice of
    // length ≥ full ≥ j + 16, every copy store [r·k + j, r·k + j + 16) of copy (R·k long when
    // not empty); each store into `out` writes one [f32; 16]. mul then add, never fused.
    unsafe {
        let mut acc = [_mm512_setzero_ps(); R];
        let mut j = 0;
        while j < full {
            let bb = _mm512_loadu_ps(b.as_ptr().add(j));
            // Every row's load before any store: a store followed by a load 4 KiB away (rows
            // of 1024 floats and their copies) would stall the load on the store.
            // (Plain loops: a closure would not inherit the target features.)
            let mut xs = [_mm512_setzero_ps(); R];
            for (v, row) in xs.iter_mut().zip(&rows) {
                *v = _mm512_loadu_ps(row.as_ptr().add(j));
            }
            for (r, (a, &x)) in acc.iter_mut().zip(&xs).enumerate() {
                if let Some(c) = cp {
                    _mm512_storeu_ps(c.add(r * k + j), x);
                }
                *a = _mm512_add_ps(*a, _mm512_mul_ps(x, bb));
            }
            j += 16;
        }
        for (o, a) in out.iter_mut().zip(&acc) {
            _mm512_storeu_ps(o.as_mut_ptr(), *a);
        }
    }
    copy_tails(&rows, copy, full);
    out
}

/// Test access to each x86 ISA's [`dot16_lanes`] kernel for four rows (the dispatcher picks
/// only the widest): "avx2" or "avx512"; `None` when this CPU lacks that ISA.
#[cfg(all(test, target_arch = "x86_64"))]
pub(crate) fn dot16_lanes_isa(isa: &str, rows: [&[f32]; 4], b: &[f32], copy: &mut [f32]) -> Option<[[f32; 16]; 4]> {
    assert!(rows.iter().all(|r| r.len() == b.len()));
    assert!(copy.is_empty() || copy.len() == 4 * b.len());
    // SAFETY: each kernel runs only when its ISA was detected; every row has b's length, copy is
    // 4·K or empty.
    unsafe {
        match isa {
            "avx2" if is_x86_feature_detected!("avx2") => Some(dot16_lanes_avx2(rows, b, copy)),
            #[cfg(ork_avx512)]
            "avx512" if has_avx512() => Some(dot16_lanes_avx512(rows, b, copy)),
            _ => None,
        }
    }
}

/// # Safety
/// The CPU must support AVX-512F; every slice of `r` has `d`'s length.
#[cfg(all(target_arch = "x86_64", ork_avx512))]
#[allow(clippy::incompatible_msrv)]
#[target_feature(enable = "avx512f")]
unsafe fn dequantize_avx512<const N: usize, const INIT: u8, const CORR: bool>(r: &Row<'_, N>, d: &mut [f32]) {
    let n = d.len();
    let mut i = 0;
    // SAFETY: AVX-512F enabled (caller's contract); the loads read the products' c/sw, e and d
    // at [i, i+16), the store writes d[i..i+16], i+16 <= n and every slice has length n.
    unsafe {
        while i + 16 <= n {
            let mut acc = match INIT {
                ZERO => Some(_mm512_setzero_ps()),
                ACC => Some(_mm512_loadu_ps(d.as_ptr().add(i))),
                _ => None,
            };
            for &(c, sa, sw) in &r.p {
                let s = _mm512_mul_ps(_mm512_set1_ps(sa), _mm512_loadu_ps(sw.as_ptr().add(i)));
                let v = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_loadu_si512(c.as_ptr().add(i) as *const __m512i)), s);
                acc = Some(match acc { Some(a) => _mm512_add_ps(a, v), None => v });
            }
            let mut v = acc.expect("a product");
            if CORR {
                v = _mm512_add_ps(v, _mm512_mul_ps(_mm512_set1_ps(r.cc), _mm512_loadu_ps(r.e.as_ptr().add(i))));
            }
            _mm512_storeu_ps(d.as_mut_ptr().add(i), v);
            i += 16;
        }
    }
    super::dequantize_tail::<N, INIT, CORR>(r, i, d);
}

/// Test access to each x86 ISA's output kernel for one product (the dispatcher picks only the
/// widest), with `corr = Some((cc, e))` the correction too, for "avx2" or "avx512"; false when
/// this CPU lacks that ISA.
#[cfg(all(test, target_arch = "x86_64"))]
pub(crate) fn dequantize_row_isa(isa: &str, c: &[i32], sa: f32, sw: &[f32], corr: Option<(f32, &[f32])>, d: &mut [f32]) -> bool {
    assert!(c.len() == d.len() && sw.len() == d.len() && corr.is_none_or(|(_, e)| e.len() == d.len()));
    let (cc, e) = corr.unwrap_or((0.0, &[]));
    let r = Row { p: [(c, sa, sw)], cc, e };
    // SAFETY: each kernel runs only when its ISA was detected; lengths are equal (asserted).
    unsafe {
        match (isa, corr.is_some()) {
            ("avx2", false) if is_x86_feature_detected!("avx2") => dequantize_avx2::<1, FIRST, false>(&r, d),
            ("avx2", true) if is_x86_feature_detected!("avx2") => dequantize_avx2::<1, FIRST, true>(&r, d),
            #[cfg(ork_avx512)]
            ("avx512", false) if has_avx512() => dequantize_avx512::<1, FIRST, false>(&r, d),
            #[cfg(ork_avx512)]
            ("avx512", true) if has_avx512() => dequantize_avx512::<1, FIRST, true>(&r, d),
            _ => return false,
        }
    }
    true
}
