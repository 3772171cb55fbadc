//! `ORK_HOST_THREADS` sizes the host team that runs the passes around an NPU matmul with a pool
//! of ORK's own: a large matmul on the simulator with `ORK_HOST_THREADS=3` leaves exactly two
//! `ork-host-*` threads in the process, the calling thread leading them (the pool is built at the
//! first pass, once per process: this file holds one test).

use ggml_ork::backend::weights::pack;
use ggml_ork::backend::{Device, WeightSource};
use ggml_ork::config::Config;
use ggml_ork::npu::soc::SocId;
use ggml_ork::npu::{Npu, NpuConfig, NpuKind};

const N: usize = 64;
const K: usize = 576;
const M: usize = 64; // M·K ≥ quant::PAR_MIN_ELEMS: the passes go to the pool

fn to_float(row: &[u8], out: &mut [f32]) {
    for (o, c) in out.iter_mut().zip(row.chunks_exact(4)) {
        *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
    }
}

/// The names of this process's threads that start with `prefix`.
fn threads_named(prefix: &str) -> usize {
    std::fs::read_dir("/proc/self/task")
        .expect("/proc/self/task")
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|c| c.starts_with(prefix))
        .count()
}

#[test]
fn the_host_pool_has_the_threads_asked_for() {
    let pairs = [("ORK_HOST_THREADS", "3"), ("ORK_NO_AFFINITY", "1")];
    let (cfg, bad) = Config::from_lookup(|k| pairs.iter().find(|(a, _)| *a == k).map(|(_, b)| b.to_string()));
    assert!(bad.is_empty(), "{bad:?}");
    let npu = Npu::open(&NpuConfig { kind: NpuKind::Sim, soc: Some(SocId::Rk3588), ..NpuConfig::default() }).expect("simulator opens");
    let dev = Device { npu, vk: None, cfg: Box::leak(Box::new(cfg)), stats: Default::default(), placement: Default::default(), stream: Default::default(), cache: None, calib: None };
    let w: Vec<f32> = (0..N * K).map(|i| ((i * 7919) % 257) as f32 / 257.0 - 0.5).collect();
    let bytes: Vec<u8> = w.iter().flat_map(|v| v.to_le_bytes()).collect();
    let src = WeightSource { name: "blk.0.attn_q.weight", ggml_type: 0, bytes: &bytes, row_bytes: 4 * K, to_float: &to_float };
    let pw = pack(&dev, &src, N, K).expect("packs");
    assert_eq!(threads_named("ork-host-"), 0, "no pool before the first pass");
    let x: Vec<f32> = (0..M * K).map(|i| ((i * 104729) % 263) as f32 / 263.0 - 0.5).collect();
    let mut y = vec![0f32; M * N];
    dev.run_mul_mat(&pw, &src, &x, M, &mut y);
    assert!(y.iter().any(|&v| v != 0.0) && y.iter().all(|v| v.is_finite()));
    assert_eq!(threads_named("ork-host-"), 2, "ORK_HOST_THREADS=3: the calling thread leads two of the pool's");
}
