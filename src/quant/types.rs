//! The ggml weight types ORK accepts as MUL_MAT weights: the one table of their ids, names and
//! block geometry. Every type ggml can dequantize to f32 qualifies (packing goes through the host
//! process's `to_float`); the block geometry gives the bytes the CPU reads per weight (the cost
//! model) and the float types are those one int8 term cannot carry (more activation terms).
//!
//! The ids are ggml's `enum ggml_type` values; `ffi`'s tests compare them with the bindgen
//! constants of `ggml-headers/`, which the ABI drift test checks against the pinned headers.

/// One ggml weight type: `block_bytes` bytes hold `block_elems` weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WeightType {
    pub id: u32,
    pub name: &'static str,
    pub block_elems: u32,
    pub block_bytes: u32,
}

pub const F32: u32 = 0;
pub const F16: u32 = 1;
pub const Q4_0: u32 = 2;
pub const Q4_1: u32 = 3;
pub const Q5_0: u32 = 6;
pub const Q5_1: u32 = 7;
pub const Q8_0: u32 = 8;
pub const Q2_K: u32 = 10;
pub const Q3_K: u32 = 11;
pub const Q4_K: u32 = 12;
pub const Q5_K: u32 = 13;
pub const Q6_K: u32 = 14;
pub const IQ4_NL: u32 = 20;
pub const BF16: u32 = 30;

const fn ty(id: u32, name: &'static str, block_elems: u32, block_bytes: u32) -> WeightType {
    WeightType { id, name, block_elems, block_bytes }
}

/// Every type ORK accepts, by id.
pub const WEIGHT_TYPES: &[WeightType] = &[
    ty(F32, "f32", 1, 4),
    ty(F16, "f16", 1, 2),
    ty(Q4_0, "q4_0", 32, 18),
    ty(Q4_1, "q4_1", 32, 20),
    ty(Q5_0, "q5_0", 32, 22),
    ty(Q5_1, "q5_1", 32, 24),
    ty(Q8_0, "q8_0", 32, 34),
    ty(Q2_K, "q2_K", 256, 84),
    ty(Q3_K, "q3_K", 256, 110),
    ty(Q4_K, "q4_K", 256, 144),
    ty(Q5_K, "q5_K", 256, 176),
    ty(Q6_K, "q6_K", 256, 210),
    ty(IQ4_NL, "iq4_nl", 32, 18),
    ty(BF16, "bf16", 1, 2),
];

/// The accepted type with ggml id `id`, if any.
pub fn weight_type(id: u32) -> Option<&'static WeightType> {
    WEIGHT_TYPES.iter().find(|t| t.id == id)
}

/// Float source types (F32, F16, BF16): 8+ mantissa bits that one int8 term cannot carry.
pub fn is_float(id: u32) -> bool {
    matches!(id, F32 | F16 | BF16)
}

/// Bytes per weight element as the CPU reads them (block overhead included); 1.0 for a type
/// outside the table.
pub fn bytes_per_weight(id: u32) -> f64 {
    weight_type(id).map_or(1.0, |t| t.block_bytes as f64 / t.block_elems as f64)
}
