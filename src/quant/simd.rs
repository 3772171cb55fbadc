//! SIMD fast paths for the per-row W8A8 host arithmetic: NEON on aarch64 (every board this
//! product runs on), AVX2 on x86-64 (this workplace, chosen at run time).
//!
//! Around every NPU matmul the host quantizes the activation rows (f32 → int8, one absmax scale
//! per row) and turns the int32 results back into f32. Both are streaming loops over a few
//! thousand elements per row, run once per matmul per token batch; on the Cortex-A76/A55 cores
//! of an RK3588 the scalar versions cost a noticeable share of the prefill time, because
//! `round_ties_even` and NaN-ignoring `max` do not auto-vectorise. These kernels do the same
//! arithmetic four (NEON) or eight (AVX2) lanes at a time.
//!
//! The contract is **bit-identity with the scalar references** in `quant/mod.rs`
//! (`quantize_row_scalar`, `dequantize_row_scalar`, `dequantize_row_acc_scalar`), not mere
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
//! This is the one file outside the C-ABI and kernel-interface modules that holds `unsafe`:
//! SIMD intrinsics (raw-pointer loads/stores, `target_feature` functions) are the accepted
//! exception, kept here, small, with a `// SAFETY:` line on every block. Callers see only safe
//! functions that return `None` when no SIMD path exists on the running CPU.

#[cfg(target_arch = "aarch64")]
use std::arch::aarch64::*;
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use super::{ABSMAX_FLOOR, QMAX};

/// The SIMD path used on this CPU, if any: "neon", "avx2" or `None` (scalar only).
pub fn active() -> Option<&'static str> {
    #[cfg(target_arch = "aarch64")]
    {
        Some("neon")
    }
    #[cfg(target_arch = "x86_64")]
    {
        if is_x86_feature_detected!("avx2") {
            Some("avx2")
        } else {
            None
        }
    }
    #[cfg(not(any(target_arch = "aarch64", target_arch = "x86_64")))]
    {
        None
    }
}

/// Scalar step shared by every kernel's tail: the reference formula for one element.
#[inline(always)]
fn q1(v: f32, inv: f32) -> i8 {
    (v * inv).round_ties_even().clamp(-QMAX, QMAX) as i8
}

/// `quantize_row_scalar` on SIMD lanes. `None` when this CPU has no SIMD path.
#[inline]
pub fn quantize_row(x: &[f32], q: &mut [i8]) -> Option<f32> {
    assert_eq!(x.len(), q.len());
    #[cfg(target_arch = "aarch64")]
    {
        Some(quantize_row_neon(x, q))
    }
    #[cfg(target_arch = "x86_64")]
    {
        if is_x86_feature_detected!("avx2") {
            // SAFETY: AVX2 was detected on this CPU just above; lengths are equal (asserted).
            Some(unsafe { quantize_row_avx2(x, q) })
        } else {
            None
        }
    }
    #[cfg(not(any(target_arch = "aarch64", target_arch = "x86_64")))]
    {
        None
    }
}

/// `dequantize_row_scalar`: `d[j] = c[j] as f32 * (sa * sw[j])`. `None` without a SIMD path.
#[inline]
pub fn dequantize_row(c: &[i32], sa: f32, sw: &[f32], d: &mut [f32]) -> Option<()> {
    assert!(c.len() == d.len() && sw.len() == d.len());
    #[cfg(target_arch = "aarch64")]
    {
        dequantize_row_neon(c, sa, sw, d);
        Some(())
    }
    #[cfg(target_arch = "x86_64")]
    {
        if is_x86_feature_detected!("avx2") {
            // SAFETY: AVX2 was detected on this CPU just above; lengths are equal (asserted).
            unsafe { dequantize_row_avx2(c, sa, sw, d) };
            Some(())
        } else {
            None
        }
    }
    #[cfg(not(any(target_arch = "aarch64", target_arch = "x86_64")))]
    {
        None
    }
}

/// `dequantize_row_acc_scalar`: `d[j] += c[j] as f32 * (sa * sw[j])`. `None` without SIMD.
#[inline]
pub fn dequantize_row_acc(c: &[i32], sa: f32, sw: &[f32], d: &mut [f32]) -> Option<()> {
    assert!(c.len() == d.len() && sw.len() == d.len());
    #[cfg(target_arch = "aarch64")]
    {
        dequantize_row_acc_neon(c, sa, sw, d);
        Some(())
    }
    #[cfg(target_arch = "x86_64")]
    {
        if is_x86_feature_detected!("avx2") {
            // SAFETY: AVX2 was detected on this CPU just above; lengths are equal (asserted).
            unsafe { dequantize_row_acc_avx2(c, sa, sw, d) };
            Some(())
        } else {
            None
        }
    }
    #[cfg(not(any(target_arch = "aarch64", target_arch = "x86_64")))]
    {
        None
    }
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

#[cfg(target_arch = "aarch64")]
fn dequantize_row_neon(c: &[i32], sa: f32, sw: &[f32], d: &mut [f32]) {
    let n = d.len();
    let mut i = 0;
    // SAFETY: NEON baseline; loads read c/sw[i..i+4], the store writes d[i..i+4], i+4 <= n and
    // all three slices have length n (asserted by the caller).
    unsafe {
        let vsa = vdupq_n_f32(sa);
        while i + 4 <= n {
            let s = vmulq_f32(vsa, vld1q_f32(sw.as_ptr().add(i)));
            let v = vmulq_f32(vcvtq_f32_s32(vld1q_s32(c.as_ptr().add(i))), s);
            vst1q_f32(d.as_mut_ptr().add(i), v);
            i += 4;
        }
    }
    for j in i..n {
        d[j] = c[j] as f32 * (sa * sw[j]);
    }
}

#[cfg(target_arch = "aarch64")]
fn dequantize_row_acc_neon(c: &[i32], sa: f32, sw: &[f32], d: &mut [f32]) {
    let n = d.len();
    let mut i = 0;
    // SAFETY: NEON baseline; loads read c/sw/d[i..i+4], the store writes d[i..i+4], i+4 <= n and
    // all three slices have length n (asserted by the caller). mul then add, never fused.
    unsafe {
        let vsa = vdupq_n_f32(sa);
        while i + 4 <= n {
            let s = vmulq_f32(vsa, vld1q_f32(sw.as_ptr().add(i)));
            let v = vmulq_f32(vcvtq_f32_s32(vld1q_s32(c.as_ptr().add(i))), s);
            let p = d.as_mut_ptr().add(i);
            vst1q_f32(p, vaddq_f32(vld1q_f32(p), v));
            i += 4;
        }
    }
    for j in i..n {
        d[j] += c[j] as f32 * (sa * sw[j]);
    }
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

/// # Safety
/// The CPU must support AVX2; `c`, `sw`, `d` have equal lengths.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn dequantize_row_avx2(c: &[i32], sa: f32, sw: &[f32], d: &mut [f32]) {
    let n = d.len();
    let mut i = 0;
    // SAFETY: AVX2 enabled (caller's contract); loads read c/sw[i..i+8], the store writes
    // d[i..i+8], i+8 <= n and all slices have length n.
    unsafe {
        let vsa = _mm256_set1_ps(sa);
        while i + 8 <= n {
            let s = _mm256_mul_ps(vsa, _mm256_loadu_ps(sw.as_ptr().add(i)));
            let v = _mm256_cvtepi32_ps(_mm256_loadu_si256(c.as_ptr().add(i) as *const __m256i));
            _mm256_storeu_ps(d.as_mut_ptr().add(i), _mm256_mul_ps(v, s));
            i += 8;
        }
    }
    for j in i..n {
        d[j] = c[j] as f32 * (sa * sw[j]);
    }
}

/// # Safety
/// The CPU must support AVX2; `c`, `sw`, `d` have equal lengths.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn dequantize_row_acc_avx2(c: &[i32], sa: f32, sw: &[f32], d: &mut [f32]) {
    let n = d.len();
    let mut i = 0;
    // SAFETY: AVX2 enabled (caller's contract); loads read c/sw/d[i..i+8], the store writes
    // d[i..i+8], i+8 <= n and all slices have length n. mul then add, never fused.
    unsafe {
        let vsa = _mm256_set1_ps(sa);
        while i + 8 <= n {
            let s = _mm256_mul_ps(vsa, _mm256_loadu_ps(sw.as_ptr().add(i)));
            let v = _mm256_cvtepi32_ps(_mm256_loadu_si256(c.as_ptr().add(i) as *const __m256i));
            let p = d.as_mut_ptr().add(i);
            _mm256_storeu_ps(p, _mm256_add_ps(_mm256_loadu_ps(p), _mm256_mul_ps(v, s)));
            i += 8;
        }
    }
    for j in i..n {
        d[j] += c[j] as f32 * (sa * sw[j]);
    }
}
