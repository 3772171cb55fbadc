//! Scalar references for every GEMV kernel of `ggml_ork::vk` (f16 decoding, 4-bit block
//! decoding, the references themselves), for `tests/vk_gemv.rs`.
//!
//! The int8 reference is the exact formula the shader computes (integer sums, the same two f32
//! multiplications in the same order), so the GPU must match it bit for bit. The 4-bit
//! references dequantize a row with ggml's own formula (`dequantize_row_q4_0` /
//! `dequantize_row_q4_K` in the pinned `ggml-quants.c`) and then dot in f32; the GPU sums in a
//! different order (and factors the block scale out), so those are compared with a tolerance.

use ggml_ork::vk::reference::{quantize_row_i8, Q4K_BLOCK_BYTES, Q4K_BLOCK_ELEMS, Q4_0_BLOCK_BYTES, Q4_0_BLOCK_ELEMS};

/// IEEE half (binary16 bits) → f32, exact (subnormals included), like `GGML_FP16_TO_FP32`.
pub fn f16_to_f32(h: u16) -> f32 {
    let sign = ((h as u32) & 0x8000) << 16;
    let exp = ((h >> 10) & 0x1F) as u32;
    let man = (h & 0x3FF) as u32;
    let bits = match (exp, man) {
        (0, 0) => sign,
        (0, _) => {
            // Subnormal: value = man * 2^-24, exactly representable in f32.
            let v = man as f32 * (1.0 / 16_777_216.0);
            return if sign != 0 { -v } else { v };
        }
        (31, 0) => sign | 0x7F80_0000,
        (31, _) => sign | 0x7FC0_0000 | (man << 13),
        _ => sign | ((exp + 112) << 23) | (man << 13),
    };
    f32::from_bits(bits)
}

fn le_f16(b: &[u8], at: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[at], b[at + 1]]))
}

/// Dequantizes Q4_0 blocks (`blocks.len() / 18` of them) into `out: [blocks * 32] f32`,
/// as ggml's `dequantize_row_q4_0`: `(q - 8) * d`, low nibbles first.
pub fn dequantize_row_q4_0(blocks: &[u8], out: &mut [f32]) {
    assert_eq!(blocks.len() % Q4_0_BLOCK_BYTES, 0, "dequantize_row_q4_0: partial block");
    assert_eq!(out.len(), blocks.len() / Q4_0_BLOCK_BYTES * Q4_0_BLOCK_ELEMS);
    for (b, o) in blocks.chunks_exact(Q4_0_BLOCK_BYTES).zip(out.chunks_exact_mut(Q4_0_BLOCK_ELEMS)) {
        let d = le_f16(b, 0);
        for j in 0..16 {
            let q = b[2 + j];
            o[j] = ((q & 0xF) as i32 - 8) as f32 * d;
            o[j + 16] = ((q >> 4) as i32 - 8) as f32 * d;
        }
    }
}

/// Scale and min of sub-block `j` (0..8) from the 12 packed bytes (ggml `get_scale_min_k4`).
pub fn q4k_scale_min(j: usize, s: &[u8]) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        ((s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4), (s[j + 4] >> 4) | ((s[j] >> 6) << 4))
    }
}

/// Dequantizes Q4_K super-blocks into `out: [blocks * 256] f32`, as ggml's
/// `dequantize_row_q4_K`: element = `d*sc * q - dmin*m` per 32-element sub-block.
pub fn dequantize_row_q4k(blocks: &[u8], out: &mut [f32]) {
    assert_eq!(blocks.len() % Q4K_BLOCK_BYTES, 0, "dequantize_row_q4k: partial block");
    assert_eq!(out.len(), blocks.len() / Q4K_BLOCK_BYTES * Q4K_BLOCK_ELEMS);
    for (b, o) in blocks.chunks_exact(Q4K_BLOCK_BYTES).zip(out.chunks_exact_mut(Q4K_BLOCK_ELEMS)) {
        let d = le_f16(b, 0);
        let dmin = le_f16(b, 2);
        let scales = &b[4..16];
        let qs = &b[16..];
        for c in 0..4 {
            let (sc1, m1) = q4k_scale_min(2 * c, scales);
            let (sc2, m2) = q4k_scale_min(2 * c + 1, scales);
            let (d1, m1) = (d * sc1 as f32, dmin * m1 as f32);
            let (d2, m2) = (d * sc2 as f32, dmin * m2 as f32);
            let q = &qs[32 * c..32 * c + 32];
            for l in 0..32 {
                o[64 * c + l] = d1 * (q[l] & 0xF) as f32 - m1;
                o[64 * c + 32 + l] = d2 * (q[l] >> 4) as f32 - m2;
            }
        }
    }
}

/// Reference for the int8 kernel.
/// `w: [N, K]` row-major i8, `w_scale: [N]` f32, `x: [M, K]` row-major f32 (quantized here per
/// row with [`quantize_row_i8`]); writes `y: [M, N]` row-major f32 =
/// `(a_scale[m] * w_scale[n]) * (Σ_k xq[m][k] * w[n][k]) as f32`.
pub fn reference_i8(w: &[i8], w_scale: &[f32], x: &[f32], m: usize, n: usize, k: usize, y: &mut [f32]) {
    assert_eq!(w.len(), n * k, "reference_i8: w is not [N, K]");
    assert_eq!(w_scale.len(), n, "reference_i8: w_scale is not [N]");
    assert_eq!(x.len(), m * k, "reference_i8: x is not [M, K]");
    assert_eq!(y.len(), m * n, "reference_i8: y is not [M, N]");
    let mut xq = vec![0i8; k];
    for mi in 0..m {
        let a_scale = quantize_row_i8(&x[mi * k..(mi + 1) * k], &mut xq);
        for ni in 0..n {
            let wr = &w[ni * k..(ni + 1) * k];
            let acc: i32 = wr.iter().zip(&xq).map(|(&a, &b)| a as i32 * b as i32).sum();
            y[mi * n + ni] = (a_scale * w_scale[ni]) * acc as f32;
        }
    }
}

fn reference_dequant(
    op: &str,
    dequant: fn(&[u8], &mut [f32]),
    block_elems: usize,
    block_bytes: usize,
    (w, x, m, n, k): (&[u8], &[f32], usize, usize, usize),
    y: &mut [f32],
) {
    assert_eq!(k % block_elems, 0, "{op}: K is not a multiple of {block_elems}");
    let row_bytes = k / block_elems * block_bytes;
    assert_eq!(w.len(), n * row_bytes, "{op}: w is not [N, K] blocks");
    assert_eq!(x.len(), m * k, "{op}: x is not [M, K]");
    assert_eq!(y.len(), m * n, "{op}: y is not [M, N]");
    let mut row = vec![0f32; k];
    for ni in 0..n {
        dequant(&w[ni * row_bytes..(ni + 1) * row_bytes], &mut row);
        for mi in 0..m {
            let xr = &x[mi * k..(mi + 1) * k];
            y[mi * n + ni] = row.iter().zip(xr).fold(0.0f32, |s, (a, b)| s + a * b);
        }
    }
}

/// Reference for the Q4_0 kernel. `w: [N, K/32]` Q4_0 blocks (GGUF bytes), `x: [M, K]` f32;
/// writes `y: [M, N]` f32: each row dequantized as ggml does, then a sequential f32 dot.
pub fn reference_q4_0(w: &[u8], x: &[f32], m: usize, n: usize, k: usize, y: &mut [f32]) {
    let shape = (w, x, m, n, k);
    reference_dequant("reference_q4_0", dequantize_row_q4_0, Q4_0_BLOCK_ELEMS, Q4_0_BLOCK_BYTES, shape, y);
}

/// Reference for the Q4_K kernel. `w: [N, K/256]` Q4_K super-blocks, `x: [M, K]` f32;
/// writes `y: [M, N]` f32 (dequantize as ggml, then a sequential f32 dot).
pub fn reference_q4k(w: &[u8], x: &[f32], m: usize, n: usize, k: usize, y: &mut [f32]) {
    let shape = (w, x, m, n, k);
    reference_dequant("reference_q4k", dequantize_row_q4k, Q4K_BLOCK_ELEMS, Q4K_BLOCK_BYTES, shape, y);
}

#[test]
fn f16_decoding() {
    assert_eq!(f16_to_f32(0x3C00), 1.0);
    assert_eq!(f16_to_f32(0xC000), -2.0);
    assert_eq!(f16_to_f32(0x0001), 5.960_464_5e-8);
    assert_eq!(f16_to_f32(0x7BFF), 65504.0);
    assert!(f16_to_f32(0x7C00).is_infinite());
    assert_eq!(f16_to_f32(0x8000).to_bits(), 0x8000_0000);
}
