//! Streamed prefill (`backend::stream`): a weight past the residency budget runs on the NPU
//! through ring slots, with the same bits as the same weight resident; from the `.orkpack` entry
//! and, without a cache, packed from its source bytes again.

mod cache_common;

use cache_common::*;
use ggml_ork::backend::weights::Placed;
use ggml_ork::backend::Device;
use ggml_ork::config::Config;
use ggml_ork::npu::soc::SocId;
use ggml_ork::npu::{Npu, NpuConfig, NpuKind};
use std::sync::atomic::Ordering::Relaxed;

/// A simulator device (rotation on: the default precision path) with residency budget
/// `budget` bytes, streaming on, and a cache in `dir` or none.
fn device(budget: Option<u64>, dir: Option<&std::path::Path>) -> Device {
    let (cfg, _) = Config::from_lookup(|_| None);
    let npu = Npu::open(&NpuConfig { kind: NpuKind::Sim, soc: Some(SocId::Rk3588), wcache_budget_bytes: budget, ..NpuConfig::default() }).expect("simulator opens");
    let dev = Device { npu, vk: None, cfg: Box::leak(Box::new(cfg)), stats: Default::default(), placement: Default::default(), stream: Default::default(), cache: dir.map(|d| ggml_ork::cache::PackCache::new(d, u64::MAX)), calib: None };
    dev.stream.enable(true);
    dev
}

const M_PREFILL: usize = 64;

/// Runs `[M, K] × [N, K]ᵀ` on `dev` through its weight store, resident or streamed; the output
/// and whether it streamed.
fn run(dev: &Device, name: &str, w: &[u8], n: usize, k: usize, x: &[f32]) -> (Vec<f32>, bool) {
    let store = ggml_ork::backend::WeightStore::default();
    let src = source(name, w, k);
    let m = x.len() / k;
    let mut y = vec![0f32; m * n];
    match store.get_or_place(dev, w.as_ptr() as usize, &src, n, k, true).expect("placed") {
        Placed::Resident(pw) => {
            dev.run_mul_mat(&pw, &src, x, m, &mut y);
            (y, false)
        }
        Placed::Streamed(ss) => {
            let pw = dev.stream.fill_now(dev, &ss, Some(&src)).expect("filled");
            assert!(pw.resident.is_streamed());
            dev.run_mul_mat(&pw, &src, x, m, &mut y);
            (y, true)
        }
    }
}

fn input(m: usize, k: usize) -> Vec<f32> {
    (0..m * k).map(|i| ((i * 37 % 101) as f32 - 50.0) / 17.0).collect()
}

#[test]
fn a_streamed_weight_computes_the_resident_bits() {
    let dir = tempfile::tempdir().unwrap();
    for (name, n, k) in [("blk.0.ffn_up.weight", 96, 160), ("blk.0.ffn_down.weight", 64, 2048)] {
        let w = weight_bytes(n as u64, n, k);
        let x = input(M_PREFILL, k);
        let (resident, streamed_there) = run(&device(None, None), name, &w, n, k, &x);
        assert!(!streamed_there);
        // Budget 0: nothing is resident; with a cache (entry written at the first placement,
        // then mapped) and without (packed again at each fill).
        for cache in [Some(dir.path()), None] {
            let dev = device(Some(0), cache);
            let (y, streamed) = run(&dev, name, &w, n, k, &x);
            assert!(streamed, "{name}: past the budget it streams");
            assert_eq!(y.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), resident.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), "{name} cache {}: same bits", cache.is_some());
            let s = &dev.stream;
            assert_eq!((s.weights.load(Relaxed), s.failed.load(Relaxed)), (1, 0));
            assert!(s.bytes.load(Relaxed) > 0 && s.fills.load(Relaxed) >= 1);
            assert_eq!(dev.npu.resident_bytes(), 0, "nothing resident");
            assert_eq!(dev.stats.npu_matmuls.load(Relaxed), 1, "it ran on the NPU");
        }
    }
}

/// With streaming on, a weight is resident whole or streamed: a budget with room for one of its
/// two terms streams it rather than keeping one term (the arithmetic would differ).
#[test]
fn a_weight_is_resident_whole_or_streamed() {
    let (n, k) = (96, 160);
    let w = weight_bytes(3, n, k);
    let x = input(M_PREFILL, k);
    // ORK_ROTATE=0: two weight terms for every weight.
    let (cfg, _) = Config::from_lookup(|v| (v == "ORK_ROTATE").then(|| "0".into()));
    let cfg: &'static Config = Box::leak(Box::new(cfg));
    let open = |budget| {
        let npu = Npu::open(&NpuConfig { kind: NpuKind::Sim, soc: Some(SocId::Rk3588), wcache_budget_bytes: budget, ..NpuConfig::default() }).unwrap();
        Device { npu, vk: None, cfg, stats: Default::default(), placement: Default::default(), stream: Default::default(), cache: None, calib: None }
    };
    let full = open(None);
    let (resident, _) = run(&full, "blk.0.attn_q.weight", &w, n, k, &x);
    let term = full.npu.term_bytes(n, k);
    let dev = open(Some(term * 3 / 2));
    dev.stream.enable(true);
    let (y, streamed) = run(&dev, "blk.0.attn_q.weight", &w, n, k, &x);
    assert!(streamed, "one term's room: streamed whole");
    assert_eq!(y, resident);
    assert_eq!(dev.stats.one_term_for_budget.load(Relaxed), 0);
}

/// A streamed weight whose NPU run fails is computed on the CPU and counted, like a resident one
/// (the same int8 arithmetic: the same floats as the NPU's).
#[test]
fn a_failed_streamed_run_falls_back_counted() {
    let (n, k) = (96, 160);
    let w = weight_bytes(5, n, k);
    let x = input(M_PREFILL, k);
    let (resident, _) = run(&device(None, None), "blk.0.ffn_up.weight", &w, n, k, &x);
    let (cfg, _) = Config::from_lookup(|_| None);
    let npu = Npu::open(&NpuConfig { kind: NpuKind::Sim, soc: Some(SocId::Rk3588), wcache_budget_bytes: Some(0), sim_fault: Some("timeout_every:1".into()), ..NpuConfig::default() })
        .expect("simulator opens");
    let dev = Device { npu, vk: None, cfg: Box::leak(Box::new(cfg)), stats: Default::default(), placement: Default::default(), stream: Default::default(), cache: None, calib: None };
    dev.stream.enable(true);
    let (y, streamed) = run(&dev, "blk.0.ffn_up.weight", &w, n, k, &x);
    assert!(streamed);
    let s = &dev.stats;
    assert_eq!((s.npu_matmuls.load(Relaxed), s.npu_fallbacks.load(Relaxed)), (0, 1), "counted as a fallback");
    assert!(s.npu_errors.load(Relaxed) >= 1);
    assert_eq!(y, resident, "the CPU's int8 arithmetic gives the NPU's floats");
}

/// The fill worker runs ahead: a prefetched fill is the one the next use takes (counted as run
/// ahead, the same bits), and after one pass over two weights in order, the first one's use
/// prefetches the second (the order learned), so the second's fill is taken ready again.
#[test]
fn fills_run_ahead_in_the_learned_order() {
    let dir = tempfile::tempdir().unwrap();
    let dev = device(Some(0), Some(dir.path()));
    let (n, k) = (96, 160);
    let (wa, wb) = (weight_bytes(7, n, k), weight_bytes(8, n, k));
    let x = input(M_PREFILL, k);
    let store = ggml_ork::backend::WeightStore::default();
    let place = |name: &'static str, w: &Vec<u8>| match store.get_or_place(&dev, w.as_ptr() as usize, &source(name, w, k), n, k, true).expect("placed") {
        Placed::Streamed(ss) => ss,
        Placed::Resident(_) => panic!("budget 0: streamed"),
    };
    let (sa, sb) = (place("blk.0.ffn_up.weight", &wa), place("blk.0.ffn_gate.weight", &wb));
    let (aa, ab) = (wa.as_ptr() as usize, wb.as_ptr() as usize);
    let st = &dev.stream;
    let y = |pw: &ggml_ork::backend::PackedWeight, w: &Vec<u8>| {
        let mut y = vec![0f32; M_PREFILL * n];
        dev.run_mul_mat(pw, &source("", w, k), &x, M_PREFILL, &mut y);
        y
    };
    // First pass: nothing known ahead; a then b, filled when reached.
    let first_a = y(&st.take(&dev, aa, &sa, None).unwrap(), &wa);
    let _ = st.take(&dev, ab, &sb, None).unwrap();
    assert_eq!(st.ahead.load(Relaxed), 0);
    // An explicit prefetch of a is taken by a's use.
    st.prefetch(&dev, aa, sa.clone());
    let pa = st.take(&dev, aa, &sa, None).unwrap();
    assert_eq!(st.ahead.load(Relaxed), 1, "taken from the worker");
    assert_eq!(y(&pa, &wa), first_a, "the same bits");
    drop(pa);
    // a was followed by b: after a's use the worker fills b.
    st.prefetch_successor(&dev, aa);
    assert!(st.has_pending());
    let _ = st.take(&dev, ab, &sb, None).unwrap();
    assert_eq!(st.ahead.load(Relaxed), 2, "b was filled ahead");
    assert_eq!((st.fills.load(Relaxed), st.failed.load(Relaxed)), (4, 0));
    // A fill running ahead for another weight is let go, not taken.
    st.prefetch(&dev, ab, sb.clone());
    let _ = st.take(&dev, aa, &sa, None).unwrap();
    assert_eq!(st.ahead.load(Relaxed), 2);
}
