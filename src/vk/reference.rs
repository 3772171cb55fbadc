//! What the GEMV engine shares with its scalar references (`tests/vk_common`): the 4-bit block
//! sizes and the activation quantizer.

/// Elements per Q4_0 block (`QK4_0`).
pub const Q4_0_BLOCK_ELEMS: usize = 32;
/// Bytes per Q4_0 block: f16 d + 16 bytes of nibbles (`sizeof(block_q4_0)`).
pub const Q4_0_BLOCK_BYTES: usize = 18;
/// Elements per Q4_K super-block (`QK_K`).
pub const Q4K_BLOCK_ELEMS: usize = 256;
/// Bytes per Q4_K super-block: f16 d, f16 dmin, 12 bytes scales, 128 bytes nibbles.
pub const Q4K_BLOCK_BYTES: usize = 144;

/// Quantizes one activation row exactly as the NPU path does (`crate::quant::quantize_row`):
/// `x: [K] f32` → `q: [K] i8`; returns the dequantization scale `amax / 127`.
pub fn quantize_row_i8(x: &[f32], q: &mut [i8]) -> f32 {
    assert_eq!(x.len(), q.len(), "quantize_row_i8: x and q lengths differ");
    crate::quant::quantize_row(x, q)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantize_rounds_half_even_and_clamps() {
        let x = [127.0, 0.5, 1.5, -2.5, -127.0, 0.0];
        let mut q = [0i8; 6];
        let s = quantize_row_i8(&x, &mut q);
        assert_eq!(s, 1.0);
        assert_eq!(q, [127, 0, 2, -2, -127, 0]);
    }
}
