//! Shared helpers of the NPU tests: a deterministic PRNG (no external crate) and builders.
#![allow(dead_code)]

use std::sync::Arc;

use ggml_ork::npu::kif::sim::{SimFaults, SimKif};
use ggml_ork::npu::soc::{SocDesc, SocId};
use ggml_ork::npu::layout::{self, BLOCK, BLOCK_BYTES};
use ggml_ork::npu::{Npu, NpuConfig};

/// xorshift64* — deterministic, seedable.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// Uniform in [lo, hi].
    pub fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + (self.next_u64() % (hi - lo + 1) as u64) as usize
    }
    pub fn i8s(&mut self, n: usize) -> Vec<i8> {
        (0..n).map(|_| self.next_u64() as i8).collect()
    }
}

/// A simulator-backed Npu on `soc`, keeping a handle on the simulator.
pub fn sim_npu(soc: SocDesc, faults: SimFaults) -> (Arc<SimKif>, Arc<Npu>) {
    let sim = Arc::new(SimKif::with_faults(soc.clone(), faults));
    let cfg = NpuConfig { wcache_budget_bytes: Some(u64::MAX), ..NpuConfig::default() };
    let npu = Npu::with_kif(sim.clone(), soc, &cfg).expect("open sim");
    (sim, npu)
}

pub fn rk3588() -> SocDesc {
    SocDesc::get(SocId::Rk3588)
}

// ---- scalar references of the layout packers (`ggml_ork::npu::layout`) ----

/// Scalar reference tiler of one tile. `w`: `[N, K]` row-major i8 (the whole weight, K = `k`);
/// `out`: the tile's bytes (`kp·nc` long, at least).
pub fn tile_ref(w: &[i8], k: usize, t: &layout::Tile, out: &mut [u8]) {
    let kt_n = t.kp / BLOCK;
    for nt in 0..t.nc / BLOCK {
        for kt in 0..kt_n {
            for nl in 0..BLOCK {
                for kk in 0..BLOCK {
                    let src = (t.n0 + nt * BLOCK + nl) * k + t.k0 + kt * BLOCK + kk;
                    out[nt * kt_n * BLOCK_BYTES + kt * BLOCK_BYTES + nl * BLOCK + kk] = w[src] as u8;
                }
            }
        }
    }
}

/// Builds the whole blob for `w: [N, K]` row-major i8 (scalar reference).
pub fn tile_weight_ref(geom: &layout::WeightGeometry, w: &[i8]) -> Vec<u8> {
    let mut out = vec![0u8; geom.total_bytes];
    for t in geom.tiles.iter().chain(&geom.fullk) {
        tile_ref(w, geom.k, t, &mut out[t.offset..t.offset + t.padded_bytes]);
    }
    out
}

/// Scalar reference: copies block `b` of `a: [M, K]` row-major i8 into `out: [mc][kp]` row-major.
pub fn pack_a_ref(a: &[i8], k: usize, b: &layout::ABlock, out: &mut [u8]) {
    for r in 0..b.mc {
        for c in 0..b.kp {
            out[r * b.kp + c] = a[(b.m0 + r) * k + b.k0 + c] as u8;
        }
    }
}
