//! Shared fixtures of the `cache_*` tests: a simulator device with or without a cache, f32
//! weights as ggml would hand them over, and the clean (uncached) reference for each weight.
#![allow(dead_code)] // each test binary uses part of it

use ggml_ork::backend::{Device, PackedWeight, WeightSource};
use ggml_ork::cache::PackCache;
use ggml_ork::config::Config;
use ggml_ork::npu::soc::SocId;
use ggml_ork::npu::{Npu, NpuConfig, NpuKind};
use std::path::Path;

pub const GGML_TYPE_F32: u32 = 0;
pub const M: usize = 5;

/// A simulator device on `soc`, with a cache in `dir` (limit `max_bytes`) or none.
pub fn device(dir: Option<&Path>, soc: SocId, max_bytes: u64) -> Device {
    // The unrotated multi-term path (two weight terms for every weight), whose entries these
    // tests build by hand; the rotated path has its own tests.
    let (cfg, _) = Config::from_lookup(|k| (k == "ORK_ROTATE").then(|| "0".into()));
    let npu = Npu::open(&NpuConfig { kind: NpuKind::Sim, soc: Some(soc), max_cores: None, pin_cpus: vec![], wcache_budget_bytes: None, ..NpuConfig::default() })
        .expect("simulator opens");
    Device { npu, vk: None, cfg: Box::leak(Box::new(cfg)), stats: Default::default(), placement: Default::default(), stream: Default::default(), cache: dir.map(|d| PackCache::new(d, max_bytes)), calib: None }
}

pub fn cached(dir: &Path) -> Device {
    device(Some(dir), SocId::Rk3588, u64::MAX)
}

pub fn uncached() -> Device {
    device(None, SocId::Rk3588, 0)
}

/// `[N, K]` f32 weight bytes (little-endian), deterministic in `seed`.
pub fn weight_bytes(seed: u64, n: usize, k: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n * k)
        .flat_map(|i| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let v = ((x >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * if i % 97 == 0 { 8.0 } else { 1.0 };
            v.to_le_bytes()
        })
        .collect()
}

pub fn f32_to_float(row: &[u8], out: &mut [f32]) {
    for (o, c) in out.iter_mut().zip(row.chunks_exact(4)) {
        *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
    }
}

/// A weight source over `bytes` (`[N, K]` f32).
pub fn source<'a>(name: &'a str, bytes: &'a [u8], k: usize) -> WeightSource<'a> {
    WeightSource { name, ggml_type: GGML_TYPE_F32, bytes, row_bytes: 4 * k, to_float: &f32_to_float }
}

/// Activations `[M, K]`.
pub fn activations(k: usize) -> Vec<f32> {
    (0..M * k).map(|i| ((i * 37 % 101) as f32 - 50.0) / 17.0).collect()
}

/// What a packed weight computes: `dst = x · Wᵀ`, `[M, N]` f32, via the NPU (simulator).
pub fn run(dev: &Device, pw: &PackedWeight, src: &WeightSource<'_>) -> Vec<f32> {
    let x = activations(pw.k);
    let mut dst = vec![0f32; M * pw.n];
    dev.run_mul_mat(pw, src, &x, M, &mut dst);
    dst
}

/// Everything a packed weight is observed by: its scales and its matmul output (bit patterns).
pub fn observe(dev: &Device, pw: &PackedWeight, src: &WeightSource<'_>) -> (Vec<u32>, Vec<u32>) {
    (pw.scales.iter().map(|s| s.to_bits()).collect(), run(dev, pw, src).iter().map(|v| v.to_bits()).collect())
}

/// The clean reference: packed without any cache.
pub fn clean(name: &str, bytes: &[u8], n: usize, k: usize) -> (Vec<u32>, Vec<u32>) {
    let dev = uncached();
    let src = source(name, bytes, k);
    let pw = ggml_ork::backend::weights::pack(&dev, &src, n, k).expect("clean pack");
    observe(&dev, &pw, &src)
}

/// (hits, packs, writes) of a device.
pub fn counts(dev: &Device) -> (u64, u64, u64) {
    use std::sync::atomic::Ordering::Relaxed;
    (dev.stats.cache_hits.load(Relaxed), dev.stats.packed.load(Relaxed), dev.stats.cache_writes.load(Relaxed))
}
