//! Vulkan GEMV kernels against their scalar references, on lavapipe (`ORK_VK_DEVICE=llvmpipe`).
//!
//! Without a Vulkan device these tests FAIL, unless `ORK_VK_OPTIONAL=1` (then they pass with a
//! note): CI installs lavapipe (`tests/setup-vulkan.sh`), so a missing device there is a bug.

use std::sync::{Arc, OnceLock};

mod vk_common;

use ggml_ork::vk::reference::{Q4K_BLOCK_BYTES, Q4_0_BLOCK_BYTES};
use ggml_ork::vk::{VkEngine, VkError, VkWeightData};
use vk_common::{reference_i8, reference_q4_0, reference_q4k};

fn engine() -> Option<Arc<VkEngine>> {
    static ENGINE: OnceLock<Option<Arc<VkEngine>>> = OnceLock::new();
    ENGINE
        .get_or_init(|| {
            let e = VkEngine::open(Some("llvmpipe")).expect("VkEngine::open failed");
            if e.is_none() && std::env::var("ORK_VK_OPTIONAL").as_deref() != Ok("1") {
                panic!("no Vulkan device (lavapipe): run tests/setup-vulkan.sh, or set ORK_VK_OPTIONAL=1");
            }
            e
        })
        .clone()
}

macro_rules! engine_or_skip {
    () => {
        match engine() {
            Some(e) => e,
            None => {
                eprintln!("ORK_VK_OPTIONAL=1 and no Vulkan device: skipped");
                return;
            }
        }
    };
}

/// splitmix64: deterministic test data without a rand dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn f32(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
    fn fill_f32(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.f32()).collect()
    }
    /// A normal f16 (bits) of magnitude roughly 2^(lo-15) .. 2^(hi-15).
    fn f16(&mut self, lo: u32, hi: u32, signed: bool) -> u16 {
        let e = lo + self.below((hi - lo + 1) as usize) as u32;
        let s = if signed && self.next() & 1 == 1 { 0x8000 } else { 0 };
        (s | (e << 10) | (self.next() as u32 & 0x3FF)) as u16
    }
}

fn q4_0_blocks(r: &mut Rng, blocks: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(blocks * Q4_0_BLOCK_BYTES);
    for _ in 0..blocks {
        v.extend_from_slice(&r.f16(5, 12, true).to_le_bytes());
        v.extend((0..16).map(|_| r.next() as u8));
    }
    v
}

fn q4k_blocks(r: &mut Rng, blocks: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(blocks * Q4K_BLOCK_BYTES);
    for _ in 0..blocks {
        v.extend_from_slice(&r.f16(3, 9, false).to_le_bytes());
        v.extend_from_slice(&r.f16(3, 9, false).to_le_bytes());
        v.extend((0..12 + 128).map(|_| r.next() as u8));
    }
    v
}

/// Float comparison: NMSE (test-backend-ops' measure) ≤ 5e-4 and, per element,
/// |got - want| ≤ 1e-5 · Σ_k |w·x| + 1e-30 (f32 summation-order error only).
fn assert_close(what: &str, got: &[f32], want: &[f32], abs_sum: &[f32]) {
    let (mut err, mut norm) = (0f64, 0f64);
    for (i, ((&g, &w), &a)) in got.iter().zip(want).zip(abs_sum).enumerate() {
        assert!(g.is_finite(), "{what}: y[{i}] = {g}");
        let d = (g - w) as f64;
        err += d * d;
        norm += (w as f64) * (w as f64);
        assert!(d.abs() <= 1e-5 * a as f64 + 1e-30, "{what}: y[{i}] = {g}, reference {w}, Σ|wx| = {a}");
    }
    let nmse = err / norm.max(f64::MIN_POSITIVE);
    assert!(nmse <= 5e-4, "{what}: NMSE {nmse:e} > 5e-4");
}

/// Σ_k |W[n][k] · x[m][k]| with W given dequantized, `[M, N]`.
fn abs_dot(wd: &[f32], x: &[f32], m: usize, n: usize, k: usize) -> Vec<f32> {
    let mut out = vec![0f32; m * n];
    for mi in 0..m {
        for ni in 0..n {
            out[mi * n + ni] =
                (0..k).map(|i| (wd[ni * k + i] * x[mi * k + i]).abs()).sum::<f32>();
        }
    }
    out
}

#[test]
fn i8_bit_exact_random_shapes() {
    let e = engine_or_skip!();
    let mut r = Rng(1);
    let mut shapes = vec![(1, 1, 1), (1, 3, 17), (4, 129, 7), (2, 576, 63), (3, 64, 576), (4, 33, 1536), (1, 5, 4099)];
    for _ in 0..12 {
        shapes.push((1 + r.below(4), 1 + r.below(300), 1 + r.below(2000)));
    }
    for (m, n, k) in shapes {
        let w: Vec<i8> = (0..n * k).map(|_| (r.below(255) as i32 - 127) as i8).collect();
        let scale: Vec<f32> = (0..n).map(|_| r.f32().abs() * 0.01 + 1e-4).collect();
        let x = r.fill_f32(m * k);
        let wt = e.upload(VkWeightData::I8 { w: &w, scale: &scale }, n, k).unwrap();
        let mut y = vec![f32::NAN; m * n];
        e.gemv(&wt, &x, m, &mut y).unwrap();
        let mut want = vec![0f32; m * n];
        reference_i8(&w, &scale, &x, m, n, k, &mut want);
        for i in 0..m * n {
            assert_eq!(y[i].to_bits(), want[i].to_bits(), "i8 M={m} N={n} K={k}: y[{i}] {} != {}", y[i], want[i]);
        }
    }
}

#[test]
fn i8_extremes_are_exact() {
    // Every product at ±127·±127 and a long K: the largest sums the kernel sees.
    let e = engine_or_skip!();
    let (m, n, k) = (4, 6, 8191);
    let w: Vec<i8> = (0..n * k).map(|i| if (i / k) % 2 == 0 { 127 } else { -127 }).collect();
    let scale = vec![1.0f32; n];
    let x: Vec<f32> = (0..m * k).map(|i| if (i / k) % 2 == 0 { 3.0 } else { -3.0 }).collect();
    let wt = e.upload(VkWeightData::I8 { w: &w, scale: &scale }, n, k).unwrap();
    let mut y = vec![0f32; m * n];
    e.gemv(&wt, &x, m, &mut y).unwrap();
    let mut want = vec![0f32; m * n];
    reference_i8(&w, &scale, &x, m, n, k, &mut want);
    assert_eq!(y, want);
    assert_eq!(y[0], 127.0 * 127.0 * k as f32 * (3.0 / 127.0));
}

#[test]
fn q4_0_matches_reference() {
    let e = engine_or_skip!();
    let mut r = Rng(2);
    let mut shapes = vec![(1, 1, 32), (4, 3, 64), (2, 577, 576), (1, 64, 1536), (3, 130, 96)];
    for _ in 0..8 {
        shapes.push((1 + r.below(4), 1 + r.below(300), 32 * (1 + r.below(64))));
    }
    for (m, n, k) in shapes {
        let b = q4_0_blocks(&mut r, n * k / 32);
        let x = r.fill_f32(m * k);
        let wt = e.upload(VkWeightData::Q4_0(&b), n, k).unwrap();
        let mut y = vec![f32::NAN; m * n];
        e.gemv(&wt, &x, m, &mut y).unwrap();
        let mut want = vec![0f32; m * n];
        reference_q4_0(&b, &x, m, n, k, &mut want);
        let mut wd = vec![0f32; n * k];
        vk_common::dequantize_row_q4_0(&b, &mut wd);
        assert_close(&format!("q4_0 M={m} N={n} K={k}"), &y, &want, &abs_dot(&wd, &x, m, n, k));
    }
}

#[test]
fn q4k_matches_reference() {
    let e = engine_or_skip!();
    let mut r = Rng(3);
    let mut shapes = vec![(1, 1, 256), (4, 3, 512), (2, 129, 1536), (1, 64, 256), (3, 7, 4096)];
    for _ in 0..8 {
        shapes.push((1 + r.below(4), 1 + r.below(300), 256 * (1 + r.below(8))));
    }
    for (m, n, k) in shapes {
        let b = q4k_blocks(&mut r, n * k / 256);
        let x = r.fill_f32(m * k);
        let wt = e.upload(VkWeightData::Q4K(&b), n, k).unwrap();
        let mut y = vec![f32::NAN; m * n];
        e.gemv(&wt, &x, m, &mut y).unwrap();
        let mut want = vec![0f32; m * n];
        reference_q4k(&b, &x, m, n, k, &mut want);
        let mut wd = vec![0f32; n * k];
        vk_common::dequantize_row_q4k(&b, &mut wd);
        assert_close(&format!("q4_k M={m} N={n} K={k}"), &y, &want, &abs_dot(&wd, &x, m, n, k));
    }
}

#[test]
fn batch_one_submit_matches_single_calls_and_large_m_splits() {
    let e = engine_or_skip!();
    let mut r = Rng(4);
    let (n1, k1) = (100, 77);
    let w1: Vec<i8> = (0..n1 * k1).map(|_| r.next() as i8).collect();
    let s1: Vec<f32> = (0..n1).map(|_| r.f32().abs() + 0.01).collect();
    let a = e.upload(VkWeightData::I8 { w: &w1, scale: &s1 }, n1, k1).unwrap();
    let (n2, k2) = (50, 256);
    let b2 = q4k_blocks(&mut r, n2 * k2 / 256);
    let b = e.upload(VkWeightData::Q4K(&b2), n2, k2).unwrap();
    let (n3, k3) = (70, 64);
    let b3 = q4_0_blocks(&mut r, n3 * k3 / 32);
    let c = e.upload(VkWeightData::Q4_0(&b3), n3, k3).unwrap();

    // M = 7 on the int8 weight: split into dispatches of 4 + 3 inside the same submit.
    let (xa, xb, xc) = (r.fill_f32(7 * k1), r.fill_f32(2 * k2), r.fill_f32(k3));
    let (mut ya, mut yb, mut yc) = (vec![0f32; 7 * n1], vec![0f32; 2 * n2], vec![0f32; n3]);
    e.gemv_batch(&mut [(&a, &xa, 7, &mut ya), (&b, &xb, 2, &mut yb), (&c, &xc, 1, &mut yc)]).unwrap();

    let mut want = vec![0f32; 7 * n1];
    reference_i8(&w1, &s1, &xa, 7, n1, k1, &mut want);
    assert_eq!(ya, want);
    let mut single = vec![0f32; 2 * n2];
    e.gemv(&b, &xb, 2, &mut single).unwrap();
    assert_eq!(yb, single, "batched and single Q4_K results differ");
    let mut single = vec![0f32; n3];
    e.gemv(&c, &xc, 1, &mut single).unwrap();
    assert_eq!(yc, single, "batched and single Q4_0 results differ");
}

#[test]
fn shape_errors_are_reported_not_panics() {
    let e = engine_or_skip!();
    let w = vec![1i8; 8];
    let s = vec![1f32; 2];
    assert!(matches!(e.upload(VkWeightData::I8 { w: &w, scale: &s }, 3, 3), Err(VkError::Shape { .. })));
    assert!(matches!(e.upload(VkWeightData::Q4_0(&[0u8; 18]), 1, 16), Err(VkError::Shape { .. })));
    assert!(matches!(e.upload(VkWeightData::Q4K(&[0u8; 100]), 1, 256), Err(VkError::Shape { .. })));
    let wt = e.upload(VkWeightData::I8 { w: &w, scale: &s }, 2, 4).unwrap();
    let mut y = vec![0f32; 2];
    assert!(matches!(e.gemv(&wt, &[0.0; 3], 1, &mut y), Err(VkError::Shape { .. })));
    assert!(matches!(e.gemv(&wt, &[0.0; 4], 1, &mut [0f32; 3]), Err(VkError::Shape { .. })));
    assert!(e.device_name().contains("llvmpipe"), "{}", e.device_name());
}

#[test]
fn wide_n_spills_into_second_dispatch_dimension() {
    // 600 000 rows need more than 65 535 workgroups along x (rows per workgroup ≤ 64).
    let e = engine_or_skip!();
    let mut r = Rng(5);
    let (m, n, k) = (2, 600_000, 13);
    let w: Vec<i8> = (0..n * k).map(|_| r.next() as i8).collect();
    let scale: Vec<f32> = (0..n).map(|_| r.f32().abs() + 0.01).collect();
    let x = r.fill_f32(m * k);
    let wt = e.upload(VkWeightData::I8 { w: &w, scale: &scale }, n, k).unwrap();
    let mut y = vec![f32::NAN; m * n];
    e.gemv(&wt, &x, m, &mut y).unwrap();
    let mut want = vec![0f32; m * n];
    reference_i8(&w, &scale, &x, m, n, k, &mut want);
    let bad = y.iter().zip(&want).position(|(a, b)| a.to_bits() != b.to_bits());
    assert_eq!(bad, None, "first mismatch");
}
