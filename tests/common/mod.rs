//! Shared helpers of the NPU tests: a deterministic PRNG (no external crate) and builders.
#![allow(dead_code)]

use std::sync::Arc;

use ggml_ork::npu::kif::sim::{SimFaults, SimKif};
use ggml_ork::npu::soc::{SocDesc, SocId};
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
