//! Packers: fast paths equal the scalar references byte for byte; the tile formula of
//! rknpu-facts §3.2 holds; geometry sizes are Σ round_up(Kp·Nc, 4096) (+ the full-K companion).
mod common;

use common::{rk3588, Rng};
use ggml_ork::npu::layout::{self, ABlock, WeightGeometry};


/// An RK3588 description with small random K- and N-slices (so multi-slice geometries stay
/// cheap), full-K tiles on or off, and a random `[N, K]` of up to `max_blocks` 32-blocks a side.
fn small_slices(rng: &mut Rng, fullk: bool, max_blocks: usize) -> (ggml_ork::npu::soc::SocDesc, usize, usize) {
    let mut soc = rk3588();
    soc.k_slice = 32 * rng.range(1, 4) as u32;
    soc.n_max_per_program = 32 * rng.range(1, 4) as u32;
    soc.fullk_ceiling = if fullk { 10752 } else { 0 };
    let (n, k) = (32 * rng.range(1, max_blocks), 32 * rng.range(1, max_blocks));
    (soc, n, k)
}

#[test]
fn block_tiler_equals_reference() {
    let mut rng = Rng::new(31);
    for case in 0..60 {
        let (soc, n, k) = small_slices(&mut rng, case % 2 == 0, 9);
        let w = rng.i8s(n * k);
        let g = WeightGeometry::new(&soc, n, k);
        let want = common::tile_weight_ref(&g, &w);
        // The block tiler (npu::layout::tile_weight = tile_weight_with over the whole matrix), full i8 range.
        assert_eq!(ggml_ork::npu::layout::tile_weight(&soc, &w, n, k).unwrap().bytes, want, "N={n} K={k}");
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
    assert_eq!(ggml_ork::npu::layout::tile_weight(&soc, &w, 64, 2048).unwrap(), ggml_ork::npu::layout::tile_weight(&soc, &w, 64, 2048).unwrap());
    assert!(ggml_ork::npu::layout::tile_weight(&soc, &w, 64, 2047).is_err());
    assert!(ggml_ork::npu::layout::tile_weight(&soc, &w[1..], 64, 2048).is_err());
    assert!(ggml_ork::npu::layout::tile_weight(&soc, &w, 48, 2048).is_err());
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
        common::pack_a_ref(&a, k, &b, &mut x);
        layout::pack_a_fast(&a, k, &b, &mut y);
        assert_eq!(x, y);
    }
}

/// The backend's fused packing (`pack_source`: one 32-row block at a time, quantized and tiled
/// while in cache) gives exactly the bytes and scales of the separate steps — column scales,
/// `quantize_source`, `quantize_residual`, `npu::layout::tile_weight` of each term — over multi-slice and
/// full-K geometries, one and two terms, rows with outliers, zeros, and non-finite values.
#[test]
fn fused_packing_equals_quantize_then_tile() {
    use ggml_ork::pack::{pack_source, quantize_residual, quantize_source, WeightSource};
    let mut rng = Rng::new(77);
    for case in 0..40 {
        let (soc, n, k) = small_slices(&mut rng, case % 3 != 0, 7);
        let w: Vec<f32> = (0..n * k)
            .map(|i| {
                let (r, c) = (i / k, i % k);
                let u = rng.next_u64();
                let v = ((u >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 2.0;
                match (case % 5, r % 7, c % 13) {
                    (_, 3, _) => 0.0,                           // an all-zero row
                    (_, _, 5) => v * 300.0,                     // an outlier column
                    (4, 2, 1) if r < 32 => f32::NAN,            // non-finite values in some cases
                    (4, 5, 2) if r < 64 => f32::INFINITY,
                    _ => v,
                }
            })
            .collect();
        let bytes: Vec<u8> = w.iter().flat_map(|v| v.to_le_bytes()).collect();
        let to_float = |b: &[u8], out: &mut [f32]| {
            for (o, c) in out.iter_mut().zip(b.chunks_exact(4)) {
                *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        };
        let src = WeightSource { name: "w", ggml_type: 0, bytes: &bytes, row_bytes: k * 4, to_float: &to_float };
        // Unrotated (column equalisation) and rotated (no equalisation: all-ones columns).
        let rotation = ggml_ork::quant::rotate::Rotation::new(k);
        for rot in [None, rotation.as_ref()] {
            let (q, s, col) = quantize_source(&src, n, k, rot);
            if rot.is_some() {
                assert!(col.iter().all(|&c| c == 1.0), "rotated weights have no column equalisation");
            }
            let (ql, sl) = quantize_residual(&src, n, k, rot, &col, &q, &s);
            let want_hi = ggml_ork::npu::layout::tile_weight(&soc, &q, n, k).unwrap().bytes;
            let want_lo = ggml_ork::npu::layout::tile_weight(&soc, &ql, n, k).unwrap().bytes;
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            for terms in [1, 2] {
                let what = format!("case {case} N={n} K={k} terms {terms} rotated {} k_slice {} n_slice {}", rot.is_some(), soc.k_slice, soc.n_max_per_program);
                let p = pack_source(&soc, &src, n, k, terms, rot).unwrap();
                assert_eq!(p.tiles.len(), terms, "{what}");
                assert!(p.tiles[0].bytes == want_hi, "hi tiles differ: {what}");
                assert_eq!(bits(&p.scales), bits(&s), "{what}");
                assert_eq!(bits(&p.col_scale), bits(&col), "{what}");
                if terms == 2 {
                    assert!(p.tiles[1].bytes == want_lo, "lo tiles differ: {what}");
                    assert_eq!(bits(&p.lo_scales), bits(&sl), "{what}");
                } else {
                    assert!(p.lo_scales.is_empty());
                }
            }
        }
    }
    // A shape the NPU cannot hold is an error, as for tile_weight.
    let bytes = vec![0u8; 33 * 64 * 4];
    let to_float = |_: &[u8], out: &mut [f32]| out.fill(1.0);
    let src = WeightSource { name: "w", ggml_type: 0, bytes: &bytes, row_bytes: 64 * 4, to_float: &to_float };
    assert!(pack_source(&rk3588(), &src, 33, 64, 1, None).is_err());
    // so is a term count other than 1 or 2
    assert!(pack_source(&rk3588(), &src, 32, 64, 3, None).is_err());
    assert!(pack_source(&rk3588(), &src, 32, 64, 0, None).is_err());
}
