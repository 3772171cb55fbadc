//! Hadamard rotation of the K dimension, so that per-row int8 activations survive outlier
//! channels (issue 15).
//!
//! **What this module owns.** An orthonormal K×K matrix R per matmul width K ([`Rotation`]), a
//! row kernel that computes `x ← x·R` in O(K log K + K·b/4) ([`Rotation::apply_row`]). It does
//! not decide which matmuls are rotated, nor wire the rotation into weight packing or the
//! backend: callers do (`pack`, `quant::prepare_rows_hashed`).
//!
//! **Why.** LLM hidden states carry a few channels hundreds of times larger than the rest, so one
//! absmax scale per row leaves the ordinary channels with a handful of int8 levels (plain W8A8
//! measured KLD 0.074 on Gemma-3-1B, 0.142 on SmolLM2 here; peer-facts §3). For any orthogonal R,
//! `x·Wᵀ = (x·R)·(W·R)ᵀ`; a Hadamard R spreads every channel over all K outputs with equal weight,
//! so an outlier becomes a small bump on every channel and the row's absmax falls towards its RMS
//! (QuaRot, Ashkboos et al. 2024, arXiv 2404.00456; the Hadamard-rotated W8A8 in rk-llama.cpp
//! measured KLD 0.0030, better than CPU Q8_0).
//!
//! **One function for both sides.** The product needs the *same* R on the activation rows and on
//! the weight rows (`x·Wᵀ = x·R·Rᵀ·Wᵀ = (x·R)·(W·R)ᵀ`), never its transpose, so `apply_row` is
//! applied to each activation row per matmul and to each dequantized weight row once at pack
//! time. There is deliberately no `apply_row_t`: R is not symmetric when it has a Paley factor,
//! and nothing in W8A8 needs `x·Rᵀ` (the test `product_is_invariant_with_the_same_r_on_both_sides`
//! states the contract).
//!
//! **Random signs.** R = D·H: a fixed pseudo-random ±1 diagonal D (`flips`, the
//! same per K in every process) before the Hadamard matrix H, as QuaRot does. A plain Hadamard
//! matrix maps a row's mean (its projection on the all-ones vector, which H's first column is) into
//! one output channel, and LLM activation rows and weight rows have such structured components;
//! D makes them look random to H. Measured (Gemma-3-270M Q8_0, KLD vs F16, the default plan of
//! the time): 0.00279 without D, 0.00233 with it (docs/precision.md). Negation is exact, so the
//! scalar and SIMD paths apply D the same way, first.
//!
//! **Construction.** `K = m·b` with `m = 2ⁿ` and H = (H_b ⊗ H_m)/√K, where H_m is Sylvester's
//! Hadamard matrix (`H[i][j] = (-1)^popcount(i & j)`, applied by the fast Walsh–Hadamard
//! transform, n stages of add/sub butterflies per m-block) and H_b a dense Hadamard matrix of a
//! small order b built here by Paley's constructions (Paley 1933): **Paley I** for a prime
//! q ≡ 3 (mod 4), order q+1 (I + the skew Jacobsthal core); **Paley II** for a prime q ≡ 1 (mod 4),
//! order 2(q+1) (the symmetric conference matrix with each entry replaced by a 2×2 block). Only
//! prime q, no prime powers: that leaves out 52 (q = 25) and 172 (no Paley q at all), which no
//! common width needs below the order cap. With the row laid out as b blocks of m, `x·R` is: WHT
//! of every block, then each column j of the b×m grid mixed by H_b (`y[i₂][j] = Σ_{i₁} H_b[i₁][i₂]
//! ·z[i₁][j]`, vectorised along j), then one multiply by 1/√K. The b inputs of a column go in
//! groups of four whose 16 signed sums are tabulated once (14 adds), and each output adds b/4 table
//! entries: about b/4 + 4 adds per element instead of b.
//! [`Rotation::new`] picks the **largest power of two m whose cofactor b is a constructible order
//! no larger than [`DEFAULT_MAX_ORDER`]**; the dense factor costs about b/4 adds per element
//! against log₂ m for the WHT, so the cap bounds the host cost. `examples/rotate_bench.rs`, one
//! x86 core, rotate + quantize against quantize alone: 8.6× at K = 576 (H36 ⊗ H16), 6.8× at 1536,
//! 5× at 2048, 12× at 8960 (H140 ⊗ H64) where the block-diagonal 35 × H256 costs 2.6× (today's
//! two-term quantizer: 2.2×); a lower cap ([`Rotation::with_max_order`]) trades some of the
//! outlier spreading for speed. When no such b exists, R is
//! **block-diagonal**: K/m copies of H_m/√m with m the largest power of two dividing K. K must be
//! a multiple of 32 (so a fallback block has ≥ 32 channels); otherwise `new` returns `None` and the
//! caller leaves that matmul unrotated.
//!
//! | K     | R                              | K     | R                             |
//! |-------|--------------------------------|-------|-------------------------------|
//! | 576   | H36 (Paley II, 17) ⊗ H16       | 4096  | H4096                         |
//! | 640   | H20 (Paley I, 19) ⊗ H32        | 4864  | H76 (Paley II, 37) ⊗ H64      |
//! | 896   | H28 (Paley II, 13) ⊗ H32       | 5120  | H20 ⊗ H256                    |
//! | 960   | H60 (Paley I, 59) ⊗ H16        | 6144  | H12 ⊗ H512                    |
//! | 1024  | H1024                          | 6912  | H108 (Paley I, 107) ⊗ H64     |
//! | 1152  | H36 ⊗ H32                      | 8192  | H8192                         |
//! | 1536  | H12 (Paley I, 11) ⊗ H128       | 8960  | H140 (Paley I, 139) ⊗ H64     |
//! | 2048  | H2048                          | 11008 | block-diagonal 43 × H256      |
//! | 2560  | H20 ⊗ H128                     | 14336 | H28 ⊗ H512                    |
//! | 3072  | H12 ⊗ H256                     | 18944 | H148 (Paley II, 73) ⊗ H128    |
//!
//! (11008 = 2⁸·43: 172 and 344 have no prime-q Paley matrix, 688 and up are far over the cap.)
//! `k_table_matches_the_module_doc` checks this table.
//!
//! **Bit-exact SIMD.** Like [`super::simd`], the row kernel has a scalar definition
//! ([`Rotation::apply_row_scalar`]) and AVX2 (x86-64, detected at run time; the WHT also on
//! AVX-512 where built and detected) and NEON (aarch64) versions that give the same bits for
//! every finite input. The scalar reference fixes every
//! element's sequence of operations: WHT stage h = 1, 2, 4, … with `(a, b) → (a + b, a - b)`; then,
//! per column, each group's signed sums `((a ± b) ± c) ± d` (and their negations for a negative
//! first sign), `acc = T₀`, `acc = acc + T_g` for g = 1, 2, … in order, and `acc · (1/√K)` (with no
//! dense factor, the multiply right after the WHT). The SIMD versions compute those same
//! operations: the butterflies with h below the vector width inside a register as
//! `partner + (self ^ sign)` (IEEE addition is commutative and `a + (-b)` is `a - b`), two stages
//! h, 2h at a time from four loads (each element still gets the same two butterflies), the scale
//! folded into the last WHT pass, and the dense factor eight columns at a time with the group sums
//! in a stack table (sign flips are exact), eight or four outputs per pass; never a fused
//! multiply-add. NaN inputs give NaN outputs on every path; only the NaN payload may differ.
#![allow(unsafe_code)]

#[cfg(any(target_arch = "aarch64", target_arch = "x86_64"))]
use std::mem::MaybeUninit;

#[cfg(target_arch = "aarch64")]
use std::arch::aarch64::*;
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// K must be a multiple of this for a rotation to exist.
pub const K_MULTIPLE: usize = 32;
/// Default cap on the dense factor's order b (about b/4 adds per element): every width in the
/// module doc's table gets a full Hadamard except 11008.
pub const DEFAULT_MAX_ORDER: usize = 160;
/// Largest dense order any [`Rotation`] may use (sizes the kernels' stack table: 4·ORDER_LIMIT
/// vectors of 32 bytes).
pub const ORDER_LIMIT: usize = 256;

/// How a Hadamard matrix of some order was built.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Construction {
    /// Order 2ⁿ: `H[i][j] = (-1)^popcount(i & j)` (order 1 included).
    Sylvester,
    /// Order q+1 for a prime q ≡ 3 (mod 4).
    PaleyI { q: usize },
    /// Order 2(q+1) for a prime q ≡ 1 (mod 4).
    PaleyII { q: usize },
}

fn is_prime(q: usize) -> bool {
    q >= 2 && (2..).take_while(|d| d * d <= q).all(|d| q % d != 0)
}

/// χ(a) for a in 0..q: 0, 1 for a nonzero square mod q, -1 otherwise (q an odd prime).
fn quadratic_character(q: usize) -> Vec<i8> {
    let mut chi = vec![-1i8; q];
    chi[0] = 0;
    for a in 1..q {
        chi[a * a % q] = 1;
    }
    chi
}

/// A Hadamard matrix of the given order, row-major ±1 (`H·Hᵀ = order·I`), by Sylvester (powers of
/// two) or Paley I/II with a prime q; `None` for orders neither construction reaches.
pub fn hadamard(order: usize) -> Option<(Construction, Vec<i8>)> {
    if order == 0 {
        return None;
    }
    if order.is_power_of_two() {
        let h = (0..order * order).map(|e| if ((e / order) & (e % order)).count_ones() % 2 == 0 { 1 } else { -1 }).collect();
        return Some((Construction::Sylvester, h));
    }
    if order % 4 != 0 {
        return None;
    }
    let q = order - 1;
    if q % 4 == 3 && is_prime(q) {
        // H = I + [[0, 1ᵀ], [-1, Q]], Q[i][j] = χ(j - i) skew-symmetric (χ(-1) = -1).
        let chi = quadratic_character(q);
        let mut h = vec![0i8; order * order];
        for i in 0..order {
            for j in 0..order {
                h[i * order + j] = match (i, j) {
                    (0, _) => 1,
                    (_, 0) => -1,
                    _ if i == j => 1,
                    _ => chi[(j + q - i) % q],
                };
            }
        }
        return Some((Construction::PaleyI { q }, h));
    }
    let q = order / 2 - 1;
    if q % 4 == 1 && is_prime(q) {
        // C = [[0, 1ᵀ], [1, Q]] symmetric conference matrix (χ(-1) = 1); each entry c becomes
        // [[1, -1], [-1, -1]] when c = 0, else c·[[1, 1], [1, -1]].
        let chi = quadratic_character(q);
        let c = |i: usize, j: usize| -> i8 {
            match (i, j) {
                (0, 0) => 0,
                (0, _) | (_, 0) => 1,
                _ => chi[(j + q - i) % q],
            }
        };
        let mut h = vec![0i8; order * order];
        for i in 0..order {
            for j in 0..order {
                let (bi, bj, r, s) = (i / 2, j / 2, i % 2, j % 2);
                let e = c(bi, bj);
                h[i * order + j] = if e == 0 {
                    if r == 0 && s == 0 {
                        1
                    } else {
                        -1
                    }
                } else if r == 1 && s == 1 {
                    -e
                } else {
                    e
                };
            }
        }
        return Some((Construction::PaleyII { q }, h));
    }
    None
}

/// The dense factor H_b as the kernels read it.
#[derive(Clone, Debug)]
struct Dense {
    /// `pat[c·(b/4) + g][r] = 16·g + p` with p the sign pattern of `H_b[4g..4g+4][4c + r]` (bit
    /// t set when `H_b[4g + t][4c + r] = -1`): where output `i₂ = 4c + r`'s term for input group
    /// g sits in the table of signed group sums ([`group_sums_scalar`]). Outputs go in fours so
    /// that a kernel reads one array per group for four independent sums. Every entry < 4b.
    pat: Vec<[u16; 4]>,
}

impl Dense {
    /// H_b (row-major ±1, b a multiple of 4) as sign patterns.
    fn new(h: &[i8], b: usize) -> Self {
        assert!(b % 4 == 0 && b <= ORDER_LIMIT && h.len() == b * b);
        let gn = b / 4;
        let entry = |i2: usize, g: usize| {
            let p = (0..4).fold(0, |p, t| p | usize::from(h[(4 * g + t) * b + i2] < 0) << t);
            (16 * g + p) as u16
        };
        let pat = (0..gn).flat_map(|c| (0..gn).map(move |g| std::array::from_fn(|r| entry(4 * c + r, g)))).collect();
        Dense { pat }
    }
}

/// An orthonormal K×K rotation: `D·(H_b ⊗ H_m)/√K` (a Hadamard matrix of order K, up to scale,
/// after the random ±1 diagonal D), or block-diagonal `D·(I_{K/m} ⊗ H_m/√m)`. Built once per K and shared (it is `Sync`); the same value
/// must rotate the weight rows and the activation rows of a matmul.
#[derive(Clone, Debug)]
pub struct Rotation {
    k: usize,
    /// WHT block length, a power of two.
    m: usize,
    /// K / m.
    blocks: usize,
    /// `Some` when the blocks are mixed by H_b (b = blocks > 1).
    dense: Option<Dense>,
    /// How the factor of order `blocks` was built; `None` when block-diagonal.
    construction: Option<Construction>,
    /// 1/√K, or 1/√m when block-diagonal.
    scale: f32,
    /// The random ±1 diagonal D of R = D·H (the channels [`flips`] negates before the Hadamard
    /// transform) as a sign-bit mask per channel (`1 << 31` where negated), applied with an
    /// xor: a negation is exactly a flip of the sign bit, and a mask pass vectorises where a
    /// walk of the scattered channels does not.
    signs: Vec<u32>,
}

impl Rotation {
    /// Whether width K has a rotation ([`Rotation::new`] gives one exactly then).
    pub fn exists(k: usize) -> bool {
        k != 0 && k % K_MULTIPLE == 0
    }

    /// The rotation for width K with the default dense-order cap, [`DEFAULT_MAX_ORDER`]; `None`
    /// when K is 0 or not a multiple of [`K_MULTIPLE`].
    pub fn new(k: usize) -> Option<Self> {
        Self::with_max_order(k, DEFAULT_MAX_ORDER)
    }

    /// [`Rotation::new`] with another cap on the dense order (clamped to [`ORDER_LIMIT`]): the
    /// largest power of two m with `K = m·b` for a constructible b ≤ cap, else block-diagonal.
    pub fn with_max_order(k: usize, max_order: usize) -> Option<Self> {
        if k == 0 || k % K_MULTIPLE != 0 {
            return None;
        }
        let cap = max_order.min(ORDER_LIMIT);
        let tz = k.trailing_zeros();
        let odd = k >> tz;
        for t in 0..=tz {
            let b = odd << t;
            if b > cap {
                break;
            }
            if let Some((construction, h)) = hadamard(b) {
                let m = k / b;
                let dense = (b > 1).then(|| Dense::new(&h, b));
                return Some(Rotation { k, m, blocks: b, dense, construction: Some(construction), scale: (1.0 / (k as f64).sqrt()) as f32, signs: signs(k) });
            }
        }
        let m = 1usize << tz;
        Some(Rotation { k, m, blocks: k / m, dense: None, construction: None, scale: (1.0 / (m as f64).sqrt()) as f32, signs: signs(k) })
    }

    /// The width K.
    pub fn k(&self) -> usize {
        self.k
    }

    /// A one-line description: `H12 (Paley I, q=11) ⊗ H128`, `H2048`, `43 × H256 block-diagonal`.
    pub fn describe(&self) -> String {
        match self.construction {
            None => format!("{} × H{} block-diagonal", self.blocks, self.m),
            Some(_) if self.blocks == 1 => format!("H{}", self.m),
            Some(Construction::PaleyI { q }) => format!("H{} (Paley I, q={q}) ⊗ H{}", self.blocks, self.m),
            Some(Construction::PaleyII { q }) => format!("H{} (Paley II, q={q}) ⊗ H{}", self.blocks, self.m),
            Some(Construction::Sylvester) => format!("H{} ⊗ H{}", self.blocks, self.m),
        }
    }

    /// `x ← x·R` for one row (`x.len() == K`): an activation row before quantization, or a weight
    /// row at pack time — the same call for both. SIMD where the CPU has it, bit-identical to
    /// [`Rotation::apply_row_scalar`] for finite rows.
    pub fn apply_row(&self, x: &mut [f32]) {
        assert_eq!(x.len(), self.k, "row is not [K]");
        self.flip(x);
        match &self.dense {
            Some(d) => {
                wht(x, self.m, None);
                dense(x, self.m, self.blocks, &d.pat, self.scale);
            }
            None => wht(x, self.m, Some(self.scale)),
        }
    }

    /// The reference for [`Rotation::apply_row`]: WHT of each m-block, then the dense factor
    /// (or the scale alone), in the operation order the module doc fixes.
    pub fn apply_row_scalar(&self, x: &mut [f32]) {
        assert_eq!(x.len(), self.k, "row is not [K]");
        self.flip(x);
        wht_scalar(x, self.m);
        match &self.dense {
            Some(d) => dense_scalar(x, self.m, self.blocks, &d.pat, self.scale),
            None => scale_scalar(x, self.scale),
        }
    }
}

impl Rotation {
    /// `x ← x·D`: negates the channels [`flips`] chose (exact, so every path shares it), as
    /// an xor of their sign bits.
    fn flip(&self, x: &mut [f32]) {
        for (v, &s) in x.iter_mut().zip(&self.signs) {
            *v = f32::from_bits(v.to_bits() ^ s);
        }
    }

}

/// [`flips`] as a per-channel sign-bit mask.
fn signs(k: usize) -> Vec<u32> {
    let mut m = vec![0u32; k];
    for i in flips(k) {
        m[i as usize] = 1 << 31;
    }
    m
}

/// The random ±1 diagonal D of width K: channel i is negated when bit 0 of the i-th output of
/// SplitMix64 (Steele et al. 2014), seeded with a fixed constant xor K, is set. Fixed per K, so
/// the packed weights (and their cache entries) and the activation rows always agree.
fn flips(k: usize) -> Vec<u32> {
    let mut state = 0x6f72_6b5f_7369_676e_u64 ^ (k as u64);
    (0..k as u32)
        .filter(|_| {
            state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            (z ^ (z >> 31)) & 1 == 1
        })
        .collect()
}

// ------------------------------------------------------------------------ scalar references

/// Unnormalised in-place Walsh–Hadamard transform of every m-block of `x` (m a power of two
/// dividing `x.len()`): stages h = 1, 2, …, m/2, each `(x[j], x[j+h]) → (a + b, a - b)`.
fn wht_scalar(x: &mut [f32], m: usize) {
    let mut h = 1;
    while h < m {
        for blk in x.chunks_exact_mut(2 * h) {
            let (lo, hi) = blk.split_at_mut(h);
            for (a, b) in lo.iter_mut().zip(hi.iter_mut()) {
                let (u, v) = (*a, *b);
                *a = u + v;
                *b = u - v;
            }
        }
        h *= 2;
    }
}

/// The 16 signed sums of one group of four inputs, `t[p] = ±a ± b ± c ± d` with input i negated
/// when bit i of p is set: for even p `((a ± b) ± c) ± d` left to right, and `t[p ^ 15] = -t[p]`
/// (so `a - a` gives +0 at p and -0 at p ^ 15, the same in every kernel).
fn group_sums_scalar(a: f32, b: f32, c: f32, d: f32) -> [f32; 16] {
    let mut t = [0f32; 16];
    for p in (0..16).step_by(2) {
        let ab = if p & 2 == 0 { a + b } else { a - b };
        let abc = if p & 4 == 0 { ab + c } else { ab - c };
        let v = if p & 8 == 0 { abc + d } else { abc - d };
        t[p] = v;
        t[p ^ 15] = -v;
    }
    t
}

/// `x[i₂·m + j] ← (Σ_{i₁} H_b[i₁][i₂]·x[i₁·m + j]) · scale` for every column j. The inputs of a
/// column go in groups of four; the sum is `T₀ + T₁ + …` left to right over the groups, `T_g`
/// the group's signed sum for output i₂'s sign pattern (`pat` as in [`Dense`]). b/4 adds per
/// output plus 14 per group, instead of b - 1.
fn dense_scalar(x: &mut [f32], m: usize, b: usize, pat: &[[u16; 4]], scale: f32) {
    let gn = b / 4;
    assert!(b % 4 == 0 && b <= ORDER_LIMIT && x.len() == m * b && pat.len() == gn * gn);
    let mut tab = [0f32; 4 * ORDER_LIMIT];
    for j in 0..m {
        for g in 0..gn {
            let at = |t: usize| x[(4 * g + t) * m + j];
            tab[16 * g..16 * g + 16].copy_from_slice(&group_sums_scalar(at(0), at(1), at(2), at(3)));
        }
        for (c, chunk) in pat.chunks_exact(gn).enumerate() {
            for r in 0..4 {
                let mut acc = tab[chunk[0][r] as usize];
                for e in &chunk[1..] {
                    acc += tab[e[r] as usize];
                }
                x[(4 * c + r) * m + j] = acc * scale;
            }
        }
    }
}

fn scale_scalar(x: &mut [f32], s: f32) {
    for v in x {
        *v *= s;
    }
}

// ------------------------------------------------------------------------------ dispatchers

/// [`wht_scalar`], then [`scale_scalar`] when `scale` is given (fused into the last pass on the
/// SIMD paths); SIMD where there is a path and a block fills a vector.
fn wht(x: &mut [f32], m: usize, scale: Option<f32>) {
    assert!(m.is_power_of_two() && x.len() % m == 0);
    #[cfg(all(target_arch = "x86_64", ork_avx512))]
    if m >= 16 && has_avx512() {
        // SAFETY: AVX-512 F and DQ detected just above; m is a power of two ≥ 16 dividing
        // x.len() (asserted).
        return unsafe { wht_avx512(x, m, scale) };
    }
    #[cfg(target_arch = "x86_64")]
    if m >= 8 && is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 detected just above; m is a power of two ≥ 8 dividing x.len() (asserted).
        return unsafe { wht_avx2(x, m, scale) };
    }
    #[cfg(target_arch = "aarch64")]
    if m >= 4 {
        // SAFETY: NEON is the aarch64 baseline; m is a power of two ≥ 4 dividing x.len().
        return unsafe { wht_neon(x, m, scale) };
    }
    wht_scalar(x, m);
    if let Some(s) = scale {
        scale_scalar(x, s);
    }
}

/// [`dense_scalar`] on the SIMD path when there is one and m is a multiple of the 8-column strip.
fn dense(x: &mut [f32], m: usize, b: usize, pat: &[[u16; 4]], scale: f32) {
    assert!(b % 4 == 0 && b <= ORDER_LIMIT && x.len() == m * b && pat.len() == (b / 4) * (b / 4));
    debug_assert!(pat.iter().flatten().all(|&e| (e as usize) < 4 * b));
    #[cfg(target_arch = "x86_64")]
    if m % 8 == 0 && is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 detected just above; x is [b, m] with m a multiple of 8, pat holds
        // (b/4)² entries < 4b (built so by `Dense::new`), b ≤ ORDER_LIMIT (asserted).
        return unsafe { dense_avx2(x, m, b, pat, scale) };
    }
    #[cfg(target_arch = "aarch64")]
    if m % 8 == 0 {
        // SAFETY: as for AVX2 above; NEON is the aarch64 baseline.
        return unsafe { dense_neon(x, m, b, pat, scale) };
    }
    dense_scalar(x, m, b, pat, scale)
}

// ------------------------------------------------------------------- x86-64 AVX2 (run time)

/// Sign-bit masks for lanes whose index has bit h set (h = 1, 2, 4).
#[cfg(target_arch = "x86_64")]
const AVX2_SIGN: [[u32; 8]; 3] = {
    const S: u32 = 0x8000_0000;
    [[0, S, 0, S, 0, S, 0, S], [0, 0, S, S, 0, 0, S, S], [0, 0, 0, 0, S, S, S, S]]
};

/// [`wht_scalar`] (then `· scale` when given), eight lanes at a time. Passes over the row: the
/// stages h = 1, 2, 4 inside each vector fused with the radix-4 pass h = 8, 16 (m ≥ 32), then
/// radix-4 passes (h, 2h from four loads), then a radix-2 pass when one stage is left; the scale
/// multiplies the outputs of the last pass.
///
/// # Safety
/// The CPU must support AVX2; m is a power of two ≥ 8 dividing `x.len()`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn wht_avx2(x: &mut [f32], m: usize, scale: Option<f32>) {
    let n = x.len();
    let p = x.as_mut_ptr();
    // SAFETY: AVX2 enabled (caller's contract). Every load and store touches p[j..j+8] with j a
    // multiple of 8 and j + 8 <= n: each pass walks bases 0, S, 2S, … < n with S | m | n, and
    // inside a base reaches at most base + S - 8 (radix-4 at h: S = 4h, offsets j + 3h with
    // j < base + h; radix-2: S = 2h; the in-vector pass: S = 8 or 32).
    unsafe {
        let s1 = _mm256_loadu_ps(AVX2_SIGN[0].as_ptr() as *const f32);
        let s2 = _mm256_loadu_ps(AVX2_SIGN[1].as_ptr() as *const f32);
        let s4 = _mm256_loadu_ps(AVX2_SIGN[2].as_ptr() as *const f32);
        let vs = _mm256_set1_ps(scale.unwrap_or(1.0));
        // Stages h = 1, 2, 4 inside one vector: lane l gets partner(l) + (±x[l]), i.e.
        // x[l^h] + x[l] where bit h of l is clear and x[l^h] - x[l] where it is set.
        let inreg = |v: __m256| {
            let v = _mm256_add_ps(_mm256_permute_ps::<0b10_11_00_01>(v), _mm256_xor_ps(v, s1));
            let v = _mm256_add_ps(_mm256_permute_ps::<0b01_00_11_10>(v), _mm256_xor_ps(v, s2));
            _mm256_add_ps(_mm256_permute2f128_ps::<0x01>(v, v), _mm256_xor_ps(v, s4))
        };
        // Stages h and 2h on x[j], x[j+h], x[j+2h], x[j+3h] (each element gets the scalar
        // reference's two butterflies), stored with the scale when this is the last pass.
        let radix4 = |j: usize, h: usize, a: __m256, b: __m256, c: __m256, d: __m256, last: bool| {
            let (s, t) = (_mm256_add_ps(a, b), _mm256_sub_ps(a, b));
            let (u, w) = (_mm256_add_ps(c, d), _mm256_sub_ps(c, d));
            let mut o = [_mm256_add_ps(s, u), _mm256_add_ps(t, w), _mm256_sub_ps(s, u), _mm256_sub_ps(t, w)];
            if last && scale.is_some() {
                o = o.map(|v| _mm256_mul_ps(v, vs));
            }
            for (i, v) in o.into_iter().enumerate() {
                _mm256_storeu_ps(p.add(j + i * h), v);
            }
        };
        let mut h;
        if m >= 32 {
            let mut j = 0;
            while j < n {
                let ld = |o: usize| inreg(_mm256_loadu_ps(p.add(j + o)));
                radix4(j, 8, ld(0), ld(8), ld(16), ld(24), m == 32);
                j += 32;
            }
            h = 32;
        } else {
            let last = m == 8 && scale.is_some();
            let mut j = 0;
            while j < n {
                let v = inreg(_mm256_loadu_ps(p.add(j)));
                _mm256_storeu_ps(p.add(j), if last { _mm256_mul_ps(v, vs) } else { v });
                j += 8;
            }
            h = 8;
        }
        while 4 * h <= m {
            let mut base = 0;
            while base < n {
                for j in (base..base + h).step_by(8) {
                    let ld = |o: usize| _mm256_loadu_ps(p.add(j + o));
                    radix4(j, h, ld(0), ld(h), ld(2 * h), ld(3 * h), 4 * h == m);
                }
                base += 4 * h;
            }
            h *= 4;
        }
        if h < m {
            let mut base = 0;
            while base < n {
                for j in (base..base + h).step_by(8) {
                    let (pa, pb) = (p.add(j), p.add(j + h));
                    let (a, b) = (_mm256_loadu_ps(pa), _mm256_loadu_ps(pb));
                    let (mut s, mut t) = (_mm256_add_ps(a, b), _mm256_sub_ps(a, b));
                    if scale.is_some() {
                        (s, t) = (_mm256_mul_ps(s, vs), _mm256_mul_ps(t, vs));
                    }
                    _mm256_storeu_ps(pa, s);
                    _mm256_storeu_ps(pb, t);
                }
                base += 2 * h;
            }
        }
    }
}

/// Whether the AVX-512 WHT kernel can run here.
#[cfg(all(target_arch = "x86_64", ork_avx512))]
fn has_avx512() -> bool {
    is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512dq")
}

/// Sign-bit masks for lanes whose index has bit h set (h = 1, 2, 4, 8).
#[cfg(all(target_arch = "x86_64", ork_avx512))]
const AVX512_SIGN: [[u32; 16]; 4] = {
    let mut t = [[0u32; 16]; 4];
    let mut i = 0;
    while i < 4 {
        let mut l = 0;
        while l < 16 {
            if l & (1 << i) != 0 {
                t[i][l] = 0x8000_0000;
            }
            l += 1;
        }
        i += 1;
    }
    t
};

/// [`wht_avx2`] sixteen lanes at a time: the stages h = 1, 2, 4, 8 inside each vector, fused
/// with the radix-4 pass h = 16, 32 (m ≥ 64) or the radix-2 pass h = 16 (m = 32); then radix-4
/// passes, then a radix-2 pass when one stage is left; the scale multiplies the outputs of the
/// last pass. Every element gets the scalar reference's butterflies in its order (a + b as
/// b + a, a - b as a + (-b): the same IEEE results).
///
/// # Safety
/// The CPU must support AVX-512 F and DQ; m is a power of two ≥ 16 dividing `x.len()`.
#[cfg(all(target_arch = "x86_64", ork_avx512))]
#[allow(clippy::incompatible_msrv)] // built only where cfg(ork_avx512): a compiler with these intrinsics
#[target_feature(enable = "avx512f,avx512dq")]
unsafe fn wht_avx512(x: &mut [f32], m: usize, scale: Option<f32>) {
    let n = x.len();
    let p = x.as_mut_ptr();
    // SAFETY: AVX-512 F/DQ enabled (caller's contract). Every load and store touches
    // p[j..j+16] with j a multiple of 16 and j + 16 <= n: each pass walks bases 0, S, 2S, … < n
    // with S | m | n, and inside a base reaches at most base + S - 16 (radix-4 at h: S = 4h,
    // offsets j + 3h with j < base + h; radix-2: S = 2h; the in-vector pass: S = 16).
    unsafe {
        let sg = |i: usize| _mm512_loadu_ps(AVX512_SIGN[i].as_ptr() as *const f32);
        let (s1, s2, s4, s8) = (sg(0), sg(1), sg(2), sg(3));
        let vs = _mm512_set1_ps(scale.unwrap_or(1.0));
        // Lane l gets x[l^h] + (±x[l]): x[l^h] + x[l] where bit h of l is clear, x[l^h] - x[l]
        // where it is set.
        let inreg = |v: __m512| {
            let v = _mm512_add_ps(_mm512_permute_ps::<0b10_11_00_01>(v), _mm512_xor_ps(v, s1));
            let v = _mm512_add_ps(_mm512_permute_ps::<0b01_00_11_10>(v), _mm512_xor_ps(v, s2));
            let v = _mm512_add_ps(_mm512_shuffle_f32x4::<0b10_11_00_01>(v, v), _mm512_xor_ps(v, s4));
            _mm512_add_ps(_mm512_shuffle_f32x4::<0b01_00_11_10>(v, v), _mm512_xor_ps(v, s8))
        };
        let radix4 = |j: usize, h: usize, a: __m512, b: __m512, c: __m512, d: __m512, last: bool| {
            let (s, t) = (_mm512_add_ps(a, b), _mm512_sub_ps(a, b));
            let (u, w) = (_mm512_add_ps(c, d), _mm512_sub_ps(c, d));
            let mut o = [_mm512_add_ps(s, u), _mm512_add_ps(t, w), _mm512_sub_ps(s, u), _mm512_sub_ps(t, w)];
            if last && scale.is_some() {
                o = o.map(|v| _mm512_mul_ps(v, vs));
            }
            for (i, v) in o.into_iter().enumerate() {
                _mm512_storeu_ps(p.add(j + i * h), v);
            }
        };
        let radix2 = |j: usize, h: usize, a: __m512, b: __m512, last: bool| {
            let (mut s, mut t) = (_mm512_add_ps(a, b), _mm512_sub_ps(a, b));
            if last && scale.is_some() {
                (s, t) = (_mm512_mul_ps(s, vs), _mm512_mul_ps(t, vs));
            }
            _mm512_storeu_ps(p.add(j), s);
            _mm512_storeu_ps(p.add(j + h), t);
        };
        let mut h;
        let mut j = 0;
        if m >= 64 {
            while j < n {
                let ld = |o: usize| inreg(_mm512_loadu_ps(p.add(j + o)));
                radix4(j, 16, ld(0), ld(16), ld(32), ld(48), m == 64);
                j += 64;
            }
            h = 64;
        } else if m == 32 {
            while j < n {
                radix2(j, 16, inreg(_mm512_loadu_ps(p.add(j))), inreg(_mm512_loadu_ps(p.add(j + 16))), true);
                j += 32;
            }
            h = 32;
        } else {
            while j < n {
                let v = inreg(_mm512_loadu_ps(p.add(j)));
                _mm512_storeu_ps(p.add(j), if scale.is_some() { _mm512_mul_ps(v, vs) } else { v });
                j += 16;
            }
            h = 16;
        }
        while 4 * h <= m {
            let mut base = 0;
            while base < n {
                for j in (base..base + h).step_by(16) {
                    let ld = |o: usize| _mm512_loadu_ps(p.add(j + o));
                    radix4(j, h, ld(0), ld(h), ld(2 * h), ld(3 * h), 4 * h == m);
                }
                base += 4 * h;
            }
            h *= 4;
        }
        if h < m {
            let mut base = 0;
            while base < n {
                for j in (base..base + h).step_by(16) {
                    radix2(j, h, _mm512_loadu_ps(p.add(j)), _mm512_loadu_ps(p.add(j + h)), true);
                }
                base += 2 * h;
            }
        }
    }
}

/// [`dense_scalar`] eight columns at a time: per column strip, the 16 signed sums of every
/// input group into a stack table (14 adds and 8 sign flips per group), then each output as the
/// sum of b/4 table entries, eight outputs at a time (eight independent add chains).
///
/// # Safety
/// The CPU must support AVX2; `x.len() == m·b` with m a multiple of 8 and b a multiple of 4, at
/// most [`ORDER_LIMIT`]; `pat.len() == (b/4)²` with every entry < 4b.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn dense_avx2(x: &mut [f32], m: usize, b: usize, pat: &[[u16; 4]], scale: f32) {
    let gn = b / 4;
    let p = x.as_mut_ptr();
    let mut tab = [MaybeUninit::<__m256>::uninit(); 4 * ORDER_LIMIT];
    let tp = tab.as_mut_ptr() as *mut __m256;
    // SAFETY: AVX2 enabled (caller's contract). Loads and stores touch x[i·m + j .. +8] with
    // i < b and j + 8 <= m, inside x (len m·b). The table holds 4·ORDER_LIMIT ≥ 16·gn vectors;
    // slots 0..16·gn are all written for each column strip before any is read, and reads use
    // pat entries < 4b = 16·gn.
    unsafe {
        let neg = _mm256_set1_ps(-0.0);
        let vs = _mm256_set1_ps(scale);
        let rd = |e: &[u16; 4]| [*tp.add(e[0] as usize), *tp.add(e[1] as usize), *tp.add(e[2] as usize), *tp.add(e[3] as usize)];
        let add = |a: [__m256; 4], e: &[u16; 4]| {
            let t = rd(e);
            [_mm256_add_ps(a[0], t[0]), _mm256_add_ps(a[1], t[1]), _mm256_add_ps(a[2], t[2]), _mm256_add_ps(a[3], t[3])]
        };
        let mut j = 0;
        while j < m {
            for g in 0..gn {
                let q = p.add(4 * g * m + j);
                let (a, b, c, d) = (_mm256_loadu_ps(q), _mm256_loadu_ps(q.add(m)), _mm256_loadu_ps(q.add(2 * m)), _mm256_loadu_ps(q.add(3 * m)));
                let ab = [_mm256_add_ps(a, b), _mm256_sub_ps(a, b)];
                // abc[k] for the pattern bits (p >> 1) & 3 = k: b negated by bit 0, c by bit 1
                let abc = [_mm256_add_ps(ab[0], c), _mm256_add_ps(ab[1], c), _mm256_sub_ps(ab[0], c), _mm256_sub_ps(ab[1], c)];
                let t = tp.add(16 * g);
                for (k, &v) in abc.iter().enumerate() {
                    let (lo, hi) = (_mm256_add_ps(v, d), _mm256_sub_ps(v, d));
                    t.add(2 * k).write(lo);
                    t.add((2 * k) ^ 15).write(_mm256_xor_ps(lo, neg));
                    t.add(2 * k + 8).write(hi);
                    t.add((2 * k + 8) ^ 15).write(_mm256_xor_ps(hi, neg));
                }
            }
            let store = |c: usize, a: [__m256; 4]| {
                for (r, v) in a.into_iter().enumerate() {
                    _mm256_storeu_ps(p.add((4 * c + r) * m + j), _mm256_mul_ps(v, vs));
                }
            };
            // two chunks of four outputs per pass, then the odd chunk
            let mut chunks = pat.chunks_exact(gn).enumerate();
            while let Some((c, ca)) = chunks.next() {
                if let Some((_, cb)) = chunks.next() {
                    let (mut a, mut b) = (rd(&ca[0]), rd(&cb[0]));
                    for (ea, eb) in ca[1..].iter().zip(&cb[1..]) {
                        a = add(a, ea);
                        b = add(b, eb);
                    }
                    store(c, a);
                    store(c + 1, b);
                } else {
                    let mut a = rd(&ca[0]);
                    for e in &ca[1..] {
                        a = add(a, e);
                    }
                    store(c, a);
                }
            }
            j += 8;
        }
    }
}

// ----------------------------------------------------------------- aarch64 NEON (baseline ISA)

/// Sign-bit masks for lanes whose index has bit h set (h = 1, 2).
#[cfg(target_arch = "aarch64")]
const NEON_SIGN: [[u32; 4]; 2] = {
    const S: u32 = 0x8000_0000;
    [[0, S, 0, S], [0, 0, S, S]]
};

/// [`wht_avx2`] on four lanes: stages h = 1, 2 inside each vector fused with the radix-4 pass
/// h = 4, 8 (m ≥ 16), then radix-4 passes, then a radix-2 pass when one stage is left.
///
/// # Safety
/// m is a power of two ≥ 4 dividing `x.len()`.
#[cfg(target_arch = "aarch64")]
unsafe fn wht_neon(x: &mut [f32], m: usize, scale: Option<f32>) {
    let n = x.len();
    let p = x.as_mut_ptr();
    // SAFETY: NEON is the aarch64 baseline. Every load and store touches p[j..j+4] with j a
    // multiple of 4 and j + 4 <= n: each pass walks bases 0, S, 2S, … < n with S | m | n, and
    // inside a base reaches at most base + S - 4 (radix-4 at h: S = 4h, offsets j + 3h with
    // j < base + h; radix-2: S = 2h; the in-vector pass: S = 4 or 16).
    unsafe {
        let s1 = vld1q_u32(NEON_SIGN[0].as_ptr());
        let s2 = vld1q_u32(NEON_SIGN[1].as_ptr());
        let vs = vdupq_n_f32(scale.unwrap_or(1.0));
        let flip = |v: float32x4_t, s: uint32x4_t| vreinterpretq_f32_u32(veorq_u32(vreinterpretq_u32_f32(v), s));
        let inreg = |v: float32x4_t| {
            let v = vaddq_f32(vrev64q_f32(v), flip(v, s1));
            vaddq_f32(vextq_f32::<2>(v, v), flip(v, s2))
        };
        let radix4 = |j: usize, h: usize, a: float32x4_t, b: float32x4_t, c: float32x4_t, d: float32x4_t, last: bool| {
            let (s, t) = (vaddq_f32(a, b), vsubq_f32(a, b));
            let (u, w) = (vaddq_f32(c, d), vsubq_f32(c, d));
            let mut o = [vaddq_f32(s, u), vaddq_f32(t, w), vsubq_f32(s, u), vsubq_f32(t, w)];
            if last && scale.is_some() {
                o = o.map(|v| vmulq_f32(v, vs));
            }
            for (i, v) in o.into_iter().enumerate() {
                vst1q_f32(p.add(j + i * h), v);
            }
        };
        let mut h;
        if m >= 16 {
            let mut j = 0;
            while j < n {
                let ld = |o: usize| inreg(vld1q_f32(p.add(j + o)));
                radix4(j, 4, ld(0), ld(4), ld(8), ld(12), m == 16);
                j += 16;
            }
            h = 16;
        } else {
            let last = m == 4 && scale.is_some();
            let mut j = 0;
            while j < n {
                let v = inreg(vld1q_f32(p.add(j)));
                vst1q_f32(p.add(j), if last { vmulq_f32(v, vs) } else { v });
                j += 4;
            }
            h = 4;
        }
        while 4 * h <= m {
            let mut base = 0;
            while base < n {
                for j in (base..base + h).step_by(4) {
                    let ld = |o: usize| vld1q_f32(p.add(j + o));
                    radix4(j, h, ld(0), ld(h), ld(2 * h), ld(3 * h), 4 * h == m);
                }
                base += 4 * h;
            }
            h *= 4;
        }
        if h < m {
            let mut base = 0;
            while base < n {
                for j in (base..base + h).step_by(4) {
                    let (pa, pb) = (p.add(j), p.add(j + h));
                    let (a, b) = (vld1q_f32(pa), vld1q_f32(pb));
                    let (mut s, mut t) = (vaddq_f32(a, b), vsubq_f32(a, b));
                    if scale.is_some() {
                        (s, t) = (vmulq_f32(s, vs), vmulq_f32(t, vs));
                    }
                    vst1q_f32(pa, s);
                    vst1q_f32(pb, t);
                }
                base += 2 * h;
            }
        }
    }
}

/// [`dense_avx2`] with each column strip as two NEON vectors; four outputs at a time (eight
/// independent add chains).
///
/// # Safety
/// `x.len() == m·b` with m a multiple of 8 and b a multiple of 4, at most [`ORDER_LIMIT`];
/// `pat.len() == (b/4)²` with every entry < 4b.
#[cfg(target_arch = "aarch64")]
unsafe fn dense_neon(x: &mut [f32], m: usize, b: usize, pat: &[[u16; 4]], scale: f32) {
    let gn = b / 4;
    let p = x.as_mut_ptr();
    let mut tab = [MaybeUninit::<float32x4x2_t>::uninit(); 4 * ORDER_LIMIT];
    let tp = tab.as_mut_ptr() as *mut float32x4x2_t;
    // SAFETY: NEON baseline. Loads and stores touch x[i·m + j .. +8] with i < b and j + 8 <= m,
    // inside x (len m·b, caller's contract). The table holds 4·ORDER_LIMIT ≥ 16·gn pairs; slots
    // 0..16·gn are all written for each column strip before any is read, and reads use pat
    // entries < 4b = 16·gn (caller's contract).
    unsafe {
        let vs = vdupq_n_f32(scale);
        let add = |a: float32x4x2_t, c: float32x4x2_t| float32x4x2_t(vaddq_f32(a.0, c.0), vaddq_f32(a.1, c.1));
        let sub = |a: float32x4x2_t, c: float32x4x2_t| float32x4x2_t(vsubq_f32(a.0, c.0), vsubq_f32(a.1, c.1));
        let neg = |a: float32x4x2_t| float32x4x2_t(vnegq_f32(a.0), vnegq_f32(a.1));
        let ld = |q: *const f32| float32x4x2_t(vld1q_f32(q), vld1q_f32(q.add(4)));
        let rd = |e: &[u16; 4]| [*tp.add(e[0] as usize), *tp.add(e[1] as usize), *tp.add(e[2] as usize), *tp.add(e[3] as usize)];
        let mut j = 0;
        while j < m {
            for g in 0..gn {
                let q = p.add(4 * g * m + j);
                let (a, b, c, d) = (ld(q), ld(q.add(m)), ld(q.add(2 * m)), ld(q.add(3 * m)));
                let ab = [add(a, b), sub(a, b)];
                let abc = [add(ab[0], c), add(ab[1], c), sub(ab[0], c), sub(ab[1], c)];
                let t = tp.add(16 * g);
                for (k, &v) in abc.iter().enumerate() {
                    let (lo, hi) = (add(v, d), sub(v, d));
                    t.add(2 * k).write(lo);
                    t.add((2 * k) ^ 15).write(neg(lo));
                    t.add(2 * k + 8).write(hi);
                    t.add((2 * k + 8) ^ 15).write(neg(hi));
                }
            }
            for (c, chunk) in pat.chunks_exact(gn).enumerate() {
                let mut acc = rd(&chunk[0]);
                for e in &chunk[1..] {
                    let t = rd(e);
                    acc = [add(acc[0], t[0]), add(acc[1], t[1]), add(acc[2], t[2]), add(acc[3], t[3])];
                }
                for (r, a) in acc.into_iter().enumerate() {
                    let q = p.add((4 * c + r) * m + j);
                    vst1q_f32(q, vmulq_f32(a.0, vs));
                    vst1q_f32(q.add(4), vmulq_f32(a.1, vs));
                }
            }
            j += 8;
        }
    }
}

#[cfg(test)]
mod tests;
