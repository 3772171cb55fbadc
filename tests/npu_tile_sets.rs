//! One tile set per weight where one suffices (`npu::plan::tile_sets`): which sets a weight
//! keeps for the M it runs with, what the blob then holds, which path every M takes on it, and
//! bit-exact int32 results through the simulator on every kept layout against the scalar
//! reference.
mod common;

use common::{rk3588, sim_npu, Rng};
use ggml_ork::npu::kif::sim::SimFaults;
use ggml_ork::npu::layout::{tile_weight_sets, TileSets, WeightGeometry};
use ggml_ork::npu::plan::{plan, tile_sets, PathKind};
use ggml_ork::npu::{reference_mm, Budget};

#[test]
fn the_planner_keeps_the_sets_its_plans_read() {
    let soc = rk3588();
    // (K, sets with decode off the NPU (ORK_MINM = 32), sets with M = 1 on the NPU)
    for (k, prefill_only, with_decode) in [
        (576, TileSets::Both, TileSets::Both),       // one K-slice: one set anyway
        (1024, TileSets::Both, TileSets::Both),      // one K-slice
        (1536, TileSets::FullK, TileSets::FullK),    // M-scheduler envelope: every M full-K
        (2048, TileSets::FullK, TileSets::FullK),
        (4096, TileSets::FullK, TileSets::FullK),
        (2080, TileSets::KSplit, TileSets::Both),    // K % 512 != 0: M > 1 K-split, M = 1 full-K
        (6144, TileSets::KSplit, TileSets::Both),    // above the envelope
        (10752, TileSets::KSplit, TileSets::Both),   // at the full-K ceiling
        (11264, TileSets::Both, TileSets::Both),     // above it: no companion, one set anyway
    ] {
        assert_eq!(tile_sets(&soc, 64, k, 32), prefill_only, "K={k} M >= 32");
        assert_eq!(tile_sets(&soc, 64, k, 1), with_decode, "K={k} M >= 1");
        // The planner never reads a set the decision left out, for any M it keeps it for.
        let both = WeightGeometry::new(&soc, 64, k);
        for m in [1usize, 2, 32, 300] {
            let path = plan(&soc, &both, m, 3).path;
            let needs_fullk = both.sk == 1 || path == PathKind::FullK;
            let needs_ksplit = both.sk == 1 || path == PathKind::KSplit;
            let keeps = |s: TileSets| (s != TileSets::KSplit || both.fullk.is_empty(), s != TileSets::FullK || both.fullk.is_empty());
            for (smallest, sets) in [(32usize, prefill_only), (1, with_decode)] {
                if m >= smallest {
                    let (fk, ks) = keeps(sets);
                    assert!(!needs_fullk || fk || both.sk == 1, "K={k} M={m}: full-K tiles needed but dropped");
                    assert!(!needs_ksplit || ks || both.sk == 1, "K={k} M={m}: K-slice tiles needed but dropped");
                }
            }
        }
    }
}

#[test]
fn one_set_blobs_hold_one_set() {
    let soc = rk3588();
    for (n, k) in [(96, 2080), (64, 1536), (2048, 6144), (6144, 2048)] {
        let both = WeightGeometry::new(&soc, n, k);
        let ks = WeightGeometry::with_sets(&soc, n, k, TileSets::KSplit);
        let fk = WeightGeometry::with_sets(&soc, n, k, TileSets::FullK);
        let ks_bytes: usize = both.tiles.iter().map(|t| t.padded_bytes).sum();
        let fk_bytes: usize = both.fullk.iter().map(|t| t.padded_bytes).sum();
        assert_eq!(both.total_bytes, ks_bytes + fk_bytes);
        assert_eq!((ks.total_bytes, ks.tiles, ks.fullk.len()), (ks_bytes, both.tiles.clone(), 0), "N={n} K={k}");
        assert_eq!((fk.total_bytes, fk.tiles.len()), (fk_bytes, 0), "N={n} K={k}");
        assert_eq!(fk.fullk.iter().map(|t| (t.n0, t.nc, t.kp)).collect::<Vec<_>>(), both.fullk.iter().map(|t| (t.n0, t.nc, t.kp)).collect::<Vec<_>>());
    }
    // A 2048 × 6144 weight (K = 6144, the Qwen3-1.7B FFN down projection): 12 MiB K-slice tiles
    // and a 12 MiB full-K copy; prefill alone keeps the K-slice tiles: half.
    let g = WeightGeometry::new(&soc, 2048, 6144);
    assert_eq!((g.total_bytes, WeightGeometry::with_sets(&soc, 2048, 6144, TileSets::KSplit).total_bytes), (24 << 20, 12 << 20));
}

#[test]
fn every_layout_is_bit_exact_for_every_m() {
    let (_sim, npu) = sim_npu(rk3588(), SimFaults::default());
    let mut rng = Rng::new(0x7115);
    for (k, n) in [(2080usize, 96usize), (1536, 64), (4608, 64)] {
        let w = rng.i8s(n * k);
        for sets in [TileSets::Both, TileSets::KSplit, TileSets::FullK] {
            if sets == TileSets::FullK && !(k % 512 == 0 && k <= 4096) {
                continue; // never chosen outside the M-scheduler envelope
            }
            let tw = tile_weight_sets(npu.soc(), &w, n, k, sets).unwrap();
            let geom = WeightGeometry::with_sets(npu.soc(), n, k, sets);
            assert_eq!(tw.bytes.len(), geom.total_bytes);
            let rw = npu.upload(&tw).unwrap();
            for m in [1usize, 3, 70, 257] {
                let p = plan(npu.soc(), &geom, m, 3);
                match sets {
                    TileSets::KSplit => assert_eq!(p.path, PathKind::KSplit, "K={k} M={m}"),
                    TileSets::FullK => assert_eq!(p.path, PathKind::FullK, "K={k} M={m}"),
                    TileSets::Both => {}
                }
                for cores in [1u32, 3] {
                    let a = rng.i8s(m * k);
                    let mut c = vec![i32::MIN; m * n];
                    npu.mm_run(&rw, &a, m, &mut c, Budget { max_cores: cores }).unwrap();
                    assert!(c == reference_mm(&a, &w, m, k, n), "mismatch {sets:?} M={m} K={k} N={n} cores={cores}");
                }
            }
        }
    }
}
