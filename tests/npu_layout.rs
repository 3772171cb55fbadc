//! Packers: fast paths equal the scalar references byte for byte; the tile formula of
//! rknpu-facts §3.2 holds; geometry sizes are Σ round_up(Kp·Nc, 4096) (+ the full-K companion).
mod common;

use common::{rk3588, Rng};
use ggml_ork::npu::layout::{self, ABlock, WeightGeometry};
use ggml_ork::npu::Npu;

#[test]
fn tile_fast_equals_reference() {
    let mut rng = Rng::new(31);
    let mut soc = rk3588();
    for case in 0..60 {
        // Small slice sizes so multi-slice geometries stay cheap.
        soc.k_slice = 32 * rng.range(1, 4) as u32;
        soc.n_max_per_program = 32 * rng.range(1, 4) as u32;
        soc.fullk_ceiling = if case % 2 == 0 { 10752 } else { 0 };
        let (n, k) = (32 * rng.range(1, 9), 32 * rng.range(1, 9));
        let w = rng.i8s(n * k);
        let g = WeightGeometry::new(&soc, n, k);
        let want = layout::tile_weight_ref(&g, &w);
        assert_eq!(layout::tile_weight_fast(&g, &w), want, "N={n} K={k}");
        let expect_size: usize = g.tiles.iter().map(|t| (t.kp * t.nc).div_ceil(4096) * 4096).sum::<usize>()
            + g.fullk.iter().map(|t| (k * t.nc).div_ceil(4096) * 4096).sum::<usize>();
        assert_eq!(g.total_bytes, expect_size);
        assert_eq!(g.fullk.is_empty(), g.sk == 1 || soc.fullk_ceiling == 0);
        // The formula, element by element, on each K-slice tile.
        for t in &g.tiles {
            let kt_n = t.kp / 32;
            for nn in 0..t.nc {
                for kk in 0..t.kp {
                    let (nt, nl, kt, kl) = (nn / 32, nn % 32, kk / 32, kk % 32);
                    let b = want[t.offset + nt * kt_n * 1024 + kt * 1024 + nl * 32 + kl] as i8;
                    assert_eq!(b, w[(t.n0 + nn) * k + t.k0 + kk]);
                }
            }
            assert!(want[t.offset + t.kp * t.nc..t.offset + t.padded_bytes].iter().all(|&x| x == 0), "padding is zero");
        }
    }
}

#[test]
fn tile_weight_is_deterministic_and_checks_shapes() {
    let soc = rk3588();
    let mut rng = Rng::new(37);
    let w = rng.i8s(64 * 2048);
    assert_eq!(Npu::tile_weight(&soc, &w, 64, 2048).unwrap(), Npu::tile_weight(&soc, &w, 64, 2048).unwrap());
    assert!(Npu::tile_weight(&soc, &w, 64, 2047).is_err());
    assert!(Npu::tile_weight(&soc, &w[1..], 64, 2048).is_err());
    assert!(Npu::tile_weight(&soc, &w, 48, 2048).is_err());
}

#[test]
fn pack_a_fast_equals_reference() {
    let mut rng = Rng::new(41);
    for _ in 0..200 {
        let (m, k) = (rng.range(1, 300), 32 * rng.range(1, 40));
        let a = rng.i8s(m * k);
        let m0 = rng.range(0, m - 1);
        let mc = rng.range(1, m - m0);
        let k0 = 32 * rng.range(0, k / 32 - 1);
        let kp = 32 * rng.range(1, (k - k0) / 32);
        let b = ABlock { m0, mc, k0, kp };
        let mut x = vec![0u8; b.bytes()];
        let mut y = vec![1u8; b.bytes()];
        layout::pack_a_ref(&a, k, &b, &mut x);
        layout::pack_a_fast(&a, k, &b, &mut y);
        assert_eq!(x, y);
    }
}
