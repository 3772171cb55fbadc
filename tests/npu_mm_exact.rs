//! Bit-exact int32 results of `Npu::mm_run` through the simulator against the scalar reference,
//! over ≥ 10 000 random (M, K, N) and the edge shapes of the planner (M = 1, K = 32, K at and
//! above the 10752 full-K ceiling, N at and above 8192, 1–3 cores, both SoCs).
mod common;

use common::{rk3588, sim_npu, Rng};
use ggml_ork::npu::kif::sim::SimFaults;
use ggml_ork::npu::layout::TileSets;
use ggml_ork::npu::soc::{SocDesc, SocId};
use ggml_ork::npu::{reference_mm, Budget, Npu};

fn check(npu: &Npu, rng: &mut Rng, m: usize, k: usize, n: usize, cores: u32) -> ggml_ork::npu::RunStats {
    let w = rng.i8s(n * k);
    let tw = ggml_ork::npu::layout::tile_weight(npu.soc(), &w, n, k).unwrap();
    let rw = npu.upload(&tw).unwrap();
    let a = rng.i8s(m * k);
    let mut c = vec![i32::MIN; m * n];
    let st = npu.mm_run(&rw, &a, m, &mut c, Budget { max_cores: cores }).unwrap();
    assert!(c == reference_mm(&a, &w, m, k, n), "mismatch M={m} K={k} N={n} cores={cores}");
    st
}

#[test]
fn random_small_shapes_10k() {
    let (sim, npu) = sim_npu(rk3588(), SimFaults::default());
    let mut rng = Rng::new(0x5eed);
    let mut triples = 0;
    while triples < 10_000 {
        let k = 32 * rng.range(1, 12);
        let n = 32 * rng.range(1, 10);
        let w = rng.i8s(n * k);
        let rw = npu.upload(&ggml_ork::npu::layout::tile_weight(npu.soc(), &w, n, k).unwrap()).unwrap();
        for _ in 0..25 {
            let m = if rng.range(0, 4) == 0 { 1 } else { rng.range(1, 70) };
            let cores = rng.range(1, 3) as u32;
            let a = rng.i8s(m * k);
            let mut c = vec![0x7fff_ffff; m * n];
            npu.mm_run(&rw, &a, m, &mut c, Budget { max_cores: cores }).unwrap();
            assert!(c == reference_mm(&a, &w, m, k, n), "mismatch M={m} K={k} N={n} cores={cores}");
            triples += 1;
        }
    }
    assert!(sim.programs_run() >= 10_000);
}

#[test]
fn k_split_shapes() {
    let (_sim, npu) = sim_npu(rk3588(), SimFaults::default());
    let mut rng = Rng::new(7);
    for (m, k, n) in [(3, 1056, 64), (70, 2080, 96), (1, 1056, 32), (257, 1024, 64), (5, 3072, 64), (65, 4096, 64), (2, 1536, 96)] {
        for cores in 1..=3 {
            check(&npu, &mut rng, m, k, n, cores);
        }
    }
}

#[test]
fn fullk_ceiling() {
    let (_sim, npu) = sim_npu(rk3588(), SimFaults::default());
    let mut rng = Rng::new(11);
    // At the ceiling: M = 1 runs one full-K program per core; M > 1 goes K-split.
    let st = check(&npu, &mut rng, 1, 10752, 64, 1);
    assert_eq!(st.programs, 1, "M=1 K=10752 should be one full-K program");
    let st = check(&npu, &mut rng, 3, 10752, 128, 2);
    assert_eq!(st.cores, 2);
    assert_eq!(st.programs, 2 * 11, "M=3 K=10752 should be 11 K-slices per core");
    // Above the ceiling: no full-K companion, K-split even for M = 1.
    let st = check(&npu, &mut rng, 1, 10784, 64, 1);
    assert_eq!(st.programs, 11);
}

#[test]
fn n_at_and_above_8192() {
    let (_sim, npu) = sim_npu(rk3588(), SimFaults::default());
    let mut rng = Rng::new(13);
    for (m, n) in [(1, 8192), (2, 8224), (5, 16416)] {
        for cores in [1, 3] {
            check(&npu, &mut rng, m, 64, n, cores);
        }
    }
}

#[test]
fn cores_follow_n_blocks() {
    let (_sim, npu) = sim_npu(rk3588(), SimFaults::default());
    let mut rng = Rng::new(17);
    // N = 32·NN: each core needs ≥ 2 N-blocks.
    for (n, want) in [(32, 1), (64, 1), (96, 1), (128, 2), (160, 2), (192, 3), (1024, 3)] {
        assert_eq!(check(&npu, &mut rng, 4, 64, n, 3).cores, want, "N={n}");
    }
    assert_eq!(check(&npu, &mut rng, 4, 64, 1024, 2).cores, 2);
}

#[test]
fn rk3576_two_cores() {
    let (_sim, npu) = sim_npu(SocDesc::get(SocId::Rk3576), SimFaults::default());
    let mut rng = Rng::new(19);
    let st = check(&npu, &mut rng, 9, 2048, 256, 3);
    assert_eq!(st.cores, 2);
}

#[test]
fn concurrent_runs_on_one_npu() {
    let (_sim, npu) = sim_npu(rk3588(), SimFaults::default());
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let npu = &npu;
            s.spawn(move || {
                let mut rng = Rng::new(100 + t);
                for _ in 0..20 {
                    let (m, k, n) = (rng.range(1, 40), 32 * rng.range(1, 40), 32 * rng.range(2, 12));
                    check(npu, &mut rng, m, k, n, 3);
                }
            });
        }
    });
}

#[test]
fn tiled_bytes_roundtrip_via_import() {
    let (_sim, npu) = sim_npu(rk3588(), SimFaults::default());
    let mut rng = Rng::new(23);
    let (m, k, n) = (6, 2048, 96);
    let w = rng.i8s(n * k);
    let tw = ggml_ork::npu::layout::tile_weight(npu.soc(), &w, n, k).unwrap();
    let rw = npu.upload_bytes_observed(n, k, TileSets::Both, &tw.bytes, &mut |_, _| {}).unwrap();
    assert!(npu.upload_bytes_observed(n, k, TileSets::Both, &tw.bytes[1..], &mut |_, _| {}).is_err());
    let a = rng.i8s(m * k);
    let mut c = vec![0; m * n];
    npu.mm_run(&rw, &a, m, &mut c, Budget { max_cores: 3 }).unwrap();
    assert_eq!(c, reference_mm(&a, &w, m, k, n));
}

/// Cache maintenance covers the bytes each run's submits exchange with the device (activation
/// blocks, regcmd, task descriptors and sentinels written; output blocks read), widened to
/// whole cache lines: ≤ 1.1× those bytes for prefill shapes and for M = 1 (decode on the NPU),
/// whatever size a bigger shape grew the scratch to before.
#[test]
fn synced_bytes_track_what_submits_exchange() {
    let (_sim, npu) = sim_npu(rk3588(), SimFaults::default());
    let mut rng = Rng::new(0x5c);
    // SmolLM2-135M's projections (K 576, N 576/192/1536; down K 1536, N 576), largest first.
    for (m, k, n) in [(512, 1536, 576), (512, 576, 1536), (128, 576, 576), (32, 576, 192), (1, 576, 1536), (1, 1536, 576), (1, 576, 192), (7, 576, 64)] {
        let st = check(&npu, &mut rng, m, k, n, 3);
        let ratio = st.synced_bytes as f64 / st.io_bytes as f64;
        assert!(st.io_bytes >= (m * k + m * n * 4) as u64, "M={m} K={k} N={n}: io {} B", st.io_bytes);
        assert!((1.0..=1.1).contains(&ratio), "M={m} K={k} N={n}: synced {} B for {} B exchanged ({ratio:.3}x)", st.synced_bytes, st.io_bytes);
    }
    let (synced, io) = npu.synced();
    assert!(synced > 0 && io > 0 && synced as f64 <= 1.1 * io as f64);
}
