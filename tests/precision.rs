//! The rotated W8A8 path end to end on the simulator: a weight packed through the rotation and
//! activations with outlier channels give `x · Wᵀ` far closer to exact arithmetic than the same
//! work unrotated, the plan's terms are what the device is sent, and the counters say so.

use ggml_ork::backend::weights::pack;
use ggml_ork::backend::{Device, WeightSource};
use ggml_ork::config::Config;
use ggml_ork::route::precision::Role;
use ggml_ork::npu::soc::SocId;
use ggml_ork::npu::{Npu, NpuConfig, NpuKind};
use std::sync::atomic::Ordering::Relaxed;

const N: usize = 64;
const K: usize = 576; // SmolLM2's hidden width: H36 ⊗ H16
const M: usize = 40;

fn device(pairs: &[(&str, &str)]) -> Device {
    let (cfg, bad) = Config::from_lookup(|k| pairs.iter().find(|(a, _)| *a == k).map(|(_, b)| b.to_string()));
    assert!(bad.is_empty(), "{bad:?}");
    let npu = Npu::open(&NpuConfig { kind: NpuKind::Sim, soc: Some(SocId::Rk3588), ..NpuConfig::default() }).expect("simulator opens");
    Device { npu, vk: None, cfg: Box::leak(Box::new(cfg)), stats: Default::default(), placement: Default::default(), stream: Default::default(), cache: None, calib: None }
}

fn lcg(seed: u64) -> impl FnMut() -> f32 {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x >> 40) as f32 / (1u64 << 24) as f32 - 0.5
    }
}

fn to_float(row: &[u8], out: &mut [f32]) {
    for (o, c) in out.iter_mut().zip(row.chunks_exact(4)) {
        *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
    }
}

/// Relative error `|y − x·Wᵀ|² / |x·Wᵀ|²` of one MUL_MAT on `dev` (exact reference in f64), with
/// activations whose channels 7 and 300 are 200× the rest (LLM hidden states).
fn nmse(dev: &Device, name: &str) -> f64 {
    nmse_typed(dev, name, 0)
}

/// [`nmse`] for a weight labelled with ggml type `ggml_type` (the bytes stay f32: the fixture's
/// dequantizer reads them; the type decides the precision plan).
fn nmse_typed(dev: &Device, name: &str, ggml_type: u32) -> f64 {
    let mut r = lcg(5);
    let w: Vec<f32> = (0..N * K).map(|_| r()).collect();
    let x: Vec<f32> = (0..M * K).map(|i| r() * if matches!(i % K, 7 | 300) { 200.0 } else { 1.0 }).collect();
    nmse_of(dev, name, ggml_type, &w, &x)
}

/// `|y − x·Wᵀ|² / |x·Wᵀ|²` of one MUL_MAT of `w: [N, K]` (f32 bytes, labelled `ggml_type`) and
/// `x: [M, K]` on `dev`, against the exact product in f64.
fn nmse_of(dev: &Device, name: &str, ggml_type: u32, w: &[f32], x: &[f32]) -> f64 {
    let bytes: Vec<u8> = w.iter().flat_map(|v| v.to_le_bytes()).collect();
    let src = WeightSource { name, ggml_type, bytes: &bytes, row_bytes: 4 * K, to_float: &to_float };
    let pw = pack(dev, &src, N, K).expect("packs");
    let mut y = vec![0f32; M * N];
    dev.run_mul_mat(&pw, &src, x, M, &mut y);
    nmse_against_exact(x, w, &y)
}

/// `|y − x·Wᵀ|² / |x·Wᵀ|²` for `x: [m, K]`, `w: [N, K]`, `y: [m, N]`, the exact product in f64.
fn nmse_against_exact(x: &[f32], w: &[f32], y: &[f32]) -> f64 {
    let (mut e, mut s) = (0f64, 0f64);
    for i in 0..x.len() / K {
        for j in 0..N {
            let exact: f64 = (0..K).map(|t| x[i * K + t] as f64 * w[j * K + t] as f64).sum();
            e += (y[i * N + j] as f64 - exact).powi(2);
            s += exact * exact;
        }
    }
    e / s
}

#[test]
fn rotation_makes_one_term_accurate_on_outlier_activations() {
    let plain = device(&[("ORK_ROTATE", "0"), ("ORK_ACT_TERMS", "1"), ("ORK_WEIGHT_TERMS", "1")]);
    let rotated = device(&[("ORK_ROTATE", "1"), ("ORK_ACT_TERMS", "1"), ("ORK_WEIGHT_TERMS", "1")]);
    let (p, r) = (nmse(&plain, "w"), nmse(&rotated, "w"));
    assert!(r < 3e-4, "rotated W8A8 NMSE {r:e}");
    assert!(r * 10.0 < p, "rotation gains 10x: {r:e} vs unrotated {p:e}");
    // Same NPU work: one row per input row each.
    for d in [&plain, &rotated] {
        assert_eq!(d.stats.npu_rows_sent.load(Relaxed), M as u64);
        assert_eq!(d.stats.npu_rows.load(Relaxed), M as u64);
        assert_eq!(d.stats.npu_fallbacks.load(Relaxed), 0, "nothing fell back to the CPU");
    }
}

#[test]
fn the_plan_sends_its_terms_and_the_counters_count_them() {
    // A model of 30 layers of 7 matmuls of this test's K x N and a head, as ORK's buffers
    // announce it (all of one shape here, so a budget of 1.15 has room for the value and
    // output projections' second weight terms, not the down-projections').
    let dev = device(&[("ORK_NPU_WORK", "1.15")]);
    for role in Role::ALL {
        let count = match role {
            Role::Head => 1,
            Role::Other => 0,
            _ => 30,
        };
        dev.placement.announced[role.index()].store(count * (N * K) as u64, Relaxed);
    }
    const Q8_0: u32 = 8;
    let other = nmse_typed(&dev, "blk.3.ffn_up.weight", Q8_0);
    assert_eq!(dev.stats.npu_rows_sent.load(Relaxed), M as u64, "plain W8A8 for ordinary weights");
    nmse_typed(&dev, "blk.3.ffn_down.weight", Q8_0);
    assert_eq!(dev.stats.npu_rows_sent.load(Relaxed), 2 * M as u64, "down-projections: plain at this budget");
    let v = nmse_typed(&dev, "blk.3.attn_v.weight", Q8_0);
    assert_eq!(dev.stats.npu_rows_sent.load(Relaxed), 4 * M as u64, "a second weight term: one more row per row");
    let head = nmse_typed(&dev, "output.weight", Q8_0);
    assert_eq!(dev.stats.npu_rows_sent.load(Relaxed), 7 * M as u64, "the head: two activation terms and a second weight term");
    assert_eq!(dev.stats.npu_rows.load(Relaxed), 4 * M as u64);
    assert!(v < other && head < v, "extra terms lower the error: {other:e} {v:e} {head:e}");
    assert!(dev.breakdown().contains(&format!("({} rows sent = 1.75x plain W8A8, ", 7 * M)), "{}", dev.breakdown());
    assert!(dev.summary()[0].ends_with(&format!(" submits, {} rows sent = 1.75x plain W8A8)", 7 * M)), "{:?}", dev.summary());
    // A float weight gets two weight and two activation terms whatever its role.
    nmse(&dev, "blk.3.ffn_up.weight");
    assert_eq!(dev.stats.npu_rows_sent.load(Relaxed), 10 * M as u64, "F32: two weight terms, two activation terms");
}

#[test]
fn an_activation_read_by_several_weights_is_rotated_and_quantized_once() {
    let dev = device(&[("ORK_ROTATE", "1")]);
    let mut r = lcg(9);
    let mk = |r: &mut dyn FnMut() -> f32| -> Vec<u8> { (0..N * K).flat_map(|_| r().to_le_bytes()).collect() };
    let (bq, bk) = (mk(&mut r), mk(&mut r));
    let q = WeightSource { name: "blk.0.attn_q.weight", ggml_type: 0, bytes: &bq, row_bytes: 4 * K, to_float: &to_float };
    let kk = WeightSource { name: "blk.0.attn_k.weight", ggml_type: 0, bytes: &bk, row_bytes: 4 * K, to_float: &to_float };
    let (pq, pk) = (pack(&dev, &q, N, K).unwrap(), pack(&dev, &kk, N, K).unwrap());
    let mut x: Vec<f32> = (0..M * K).map(|_| r()).collect();
    let run = |pw, src: &WeightSource<'_>, x: &[f32]| {
        let mut y = vec![0f32; M * N];
        dev.run_mul_mat(pw, src, x, M, &mut y);
        y
    };
    // Alone (after another activation), then right after Q on the same activation: same bits.
    let k_alone = run(&pk, &kk, &x);
    let other: Vec<f32> = x.iter().map(|v| v * 2.0).collect();
    run(&pq, &q, &other);
    assert_eq!(dev.stats.act_reused.load(Relaxed), 0);
    run(&pq, &q, &x);
    let k_after_q = run(&pk, &kk, &x);
    assert_eq!(dev.stats.act_reused.load(Relaxed), 1, "K reused Q's int8 activation");
    assert_eq!(k_alone, k_after_q);
    // The same memory with new values (ggml reuses tensor memory) is quantized again.
    x[3] += 1.0;
    let k_new = run(&pk, &kk, &x);
    assert_eq!(dev.stats.act_reused.load(Relaxed), 1, "changed values are not reused");
    assert_ne!(k_new, k_after_q);
}

/// Cut into pieces, K after Q: where the reuse check agrees (the same values), K reuses Q's int8
/// terms and its result is the bits of K alone; where it does not (the same memory, new values)
/// K is computed from the new values — the bits of K run on them after another activation — and
/// nothing falls back to the CPU either way.
#[test]
fn k_after_q_in_pieces_reuses_only_unchanged_terms() {
    const K2: usize = 2048;
    const N2: usize = 1024;
    const M2: usize = 512;
    let dev = device(&[("ORK_ROTATE", "1")]);
    let mut r = lcg(41);
    let mk = |r: &mut dyn FnMut() -> f32| -> Vec<u8> { (0..N2 * K2).flat_map(|_| r().to_le_bytes()).collect() };
    let (bq, bk) = (mk(&mut r), mk(&mut r));
    // f32 bytes labelled Q8_0: one weight term, one activation term (the cut needs one).
    let q = WeightSource { name: "blk.0.attn_q.weight", ggml_type: 8, bytes: &bq, row_bytes: 4 * K2, to_float: &to_float };
    let kk = WeightSource { name: "blk.0.attn_k.weight", ggml_type: 8, bytes: &bk, row_bytes: 4 * K2, to_float: &to_float };
    let (pq, pk) = (pack(&dev, &q, N2, K2).unwrap(), pack(&dev, &kk, N2, K2).unwrap());
    let run = |pw, src: &WeightSource<'_>, x: &[f32]| {
        let mut y = vec![0f32; M2 * N2];
        dev.run_mul_mat(pw, src, x, M2, &mut y);
        y.iter().map(|f| f.to_bits()).collect::<Vec<u32>>()
    };
    let mut x: Vec<f32> = (0..M2 * K2).map(|_| r()).collect();
    let other: Vec<f32> = x.iter().map(|v| v * 2.0).collect();
    let reused = || dev.stats.act_reused.load(Relaxed);
    run(&pq, &q, &other);
    let k_alone = run(&pk, &kk, &x);
    run(&pq, &q, &other);
    run(&pq, &q, &x);
    let before = reused();
    let k_after_q = run(&pk, &kk, &x);
    assert!(dev.stats.phase[0].pieces.load(Relaxed) >= 6, "cut into pieces: {}", dev.stats.phase[0].pieces.load(Relaxed));
    assert_eq!(reused(), before + 1, "K reused Q's int8 terms");
    assert!(k_after_q == k_alone, "the same bits as K alone");
    // The same memory, new values: the check fails.
    run(&pq, &q, &x);
    x.iter_mut().step_by(K2 * 97 + 1).for_each(|v| *v += 1.0);
    let before = reused();
    let k_changed = run(&pk, &kk, &x);
    assert_eq!(reused(), before, "changed values are not reused");
    run(&pq, &q, &other);
    let k_fresh = run(&pk, &kk, &x);
    let differ = k_changed.iter().zip(&k_fresh).filter(|(a, b)| a != b).count();
    assert_eq!(differ, 0, "the bits of K computed from the new values");
    assert!(k_changed != k_after_q);
    assert_eq!(dev.stats.npu_fallbacks.load(Relaxed), 0, "nothing fell back to the CPU");
}

/// Activation rows sharing a large common component (LLM hidden states: the same channels large
/// on every token) plus each row's own part; `seed` picks the rows, not the component.
fn common_rows(seed: u64, m: usize) -> Vec<f32> {
    let mut r = lcg(11);
    let common: Vec<f32> = (0..K).map(|i| r() * if matches!(i, 7 | 300) { 60.0 } else { 3.0 }).collect();
    let mut r = lcg(seed);
    (0..m * K).map(|i| common[i % K] * (1.0 + 0.2 * r()) + 0.5 * r()).collect()
}

/// The fixture weight of [`common_rows`]' tests, as f32 bytes labelled Q8_0.
fn common_weight() -> Vec<f32> {
    let mut r = lcg(12);
    (0..N * K).map(|_| r()).collect()
}

/// A device reading the calibration file `cal`, or recording into it.
fn calibrated(cal: &std::path::Path, record: bool, extra: &[(&str, &str)]) -> Device {
    let mut d = device(extra);
    d.calib = Some(ggml_ork::cache::calib::Store::open(cal, record));
    d
}

/// One MUL_MAT of the fixture weight on `x: [m, K]` (m may be any number of rows).
fn run_rows(dev: &Device, x: &[f32]) -> Vec<f32> {
    let w = common_weight();
    let bytes: Vec<u8> = w.iter().flat_map(|v| v.to_le_bytes()).collect();
    let src = WeightSource { name: "blk.0.ffn_up.weight", ggml_type: 8, bytes: &bytes, row_bytes: 4 * K, to_float: &to_float };
    let pw = pack(dev, &src, N, K).expect("packs");
    let m = x.len() / K;
    let mut y = vec![0f32; m * N];
    dev.run_mul_mat(&pw, &src, x, m, &mut y);
    y
}

/// `|y − x·Wᵀ|² / |x·Wᵀ|²` of [`run_rows`].
fn nmse_rows(dev: &Device, x: &[f32]) -> f64 {
    nmse_against_exact(x, &common_weight(), &run_rows(dev, x))
}

#[test]
fn the_calibrated_correction_removes_the_common_error_row_by_row() {
    let dir = std::env::temp_dir().join(format!("ork-precision-cal-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let cal = dir.join("c.orkcal");
    // Calibration: other rows than the ones measured (another "text").
    let rec = calibrated(&cal, true, &[]);
    run_rows(&rec, &common_rows(99, 64));
    assert_eq!(rec.stats.mean_corrected.load(Relaxed), 0, "recording corrects nothing");
    assert_eq!(rec.calib.as_ref().unwrap().flush().unwrap(), 1, "one weight recorded");
    let on = calibrated(&cal, false, &[]);
    let off = device(&[("ORK_MEAN_CORRECT", "0")]);
    let x = common_rows(5, M);
    let (a, b) = (nmse_rows(&on, &x), nmse_rows(&off, &x));
    assert!(a < 0.5 * b, "corrected NMSE {a:e} vs uncorrected {b:e}");
    for (d, corrected) in [(&on, 1), (&off, 0)] {
        assert_eq!(d.stats.npu_rows_sent.load(Relaxed), M as u64, "plain W8A8 either way: no extra NPU row");
        assert_eq!(d.stats.npu_matmuls.load(Relaxed), 1);
        assert_eq!(d.stats.npu_fallbacks.load(Relaxed), 0, "nothing fell back to the CPU");
        assert_eq!(d.stats.mean_corrected.load(Relaxed), corrected);
    }
    assert!(on.breakdown().contains("correction") && on.breakdown().contains("for 1 MUL_MAT"), "{}", on.breakdown());
    // Batch invariance: each row's output is the same bits alone, behind 35 other rows, beside
    // rows unlike it (another seed, scaled) and at M = 1.
    let all = run_rows(&on, &x);
    let row = |y: &[f32], i: usize| y[i * N..(i + 1) * N].to_vec();
    let mut others = common_rows(77, 35);
    others.iter_mut().step_by(3).for_each(|v| *v *= -4.0);
    for i in [0, 13, M - 1] {
        let xi = &x[i * K..(i + 1) * K];
        let alone = run_rows(&on, xi);
        let mut behind = others.clone();
        behind.extend_from_slice(xi);
        let behind = run_rows(&on, &behind);
        let mut beside = xi.to_vec();
        beside.extend_from_slice(&others[..4 * K]);
        let beside = run_rows(&on, &beside);
        assert_eq!(alone, row(&all, i), "row {i}: a row's result does not depend on what shares its ubatch");
        assert_eq!(row(&behind, 35), alone, "row {i} behind 35 others");
        assert_eq!(row(&beside, 0), alone, "row {i} beside unlike rows");
    }
    // Behind 600 others: the host passes split the rows over threads (M·K and M·N past
    // `quant::PAR_MIN_ELEMS`), and the row is still the same bits.
    let mut many = common_rows(78, 600);
    many.iter_mut().step_by(5).for_each(|v| *v *= 3.0);
    let xi = &x[7 * K..8 * K];
    many.extend_from_slice(xi);
    assert_eq!(row(&run_rows(&on, &many), 600), run_rows(&on, xi), "row 7 behind 600 others");
    // Without a calibration entry (another file) nothing is corrected.
    let empty = calibrated(&dir.join("none.orkcal"), false, &[]);
    let plain = run_rows(&empty, &x);
    assert_eq!(empty.stats.mean_corrected.load(Relaxed), 0);
    // The scalar reference: the uncorrected output (same plan, no entry), then
    // `quant::mean::correct_along` with the weight's direction: the fused passes give its bits.
    for (xs, tag) in [(&x, "M = 40"), (&many, "M = 601")] {
        let w = common_weight();
        let bytes: Vec<u8> = w.iter().flat_map(|v| v.to_le_bytes()).collect();
        let src = WeightSource { name: "blk.0.ffn_up.weight", ggml_type: 8, bytes: &bytes, row_bytes: 4 * K, to_float: &to_float };
        let pw = pack(&on, &src, N, K).expect("packs");
        let m = xs.len() / K;
        let mut y = vec![0f32; m * N];
        on.run_mul_mat(&pw, &src, xs, m, &mut y);
        let d = pw.fix.get().and_then(|d| d.as_ref()).expect("the weight's direction");
        let mut want = if m == M { plain.clone() } else { run_rows(&empty, xs) };
        ggml_ork::quant::mean::correct_along(&mut want, xs, m, K, N, d);
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&y), bits(&want), "{tag}: the fused correction is correct_along's bits");
    }
    // Unrotated (the multi-term scheme) is left as it is.
    let legacy = calibrated(&cal, false, &[("ORK_ROTATE", "0")]);
    run_rows(&legacy, &x);
    assert_eq!(legacy.stats.mean_corrected.load(Relaxed), 0);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A large prefill MUL_MAT is cut into pieces the NPU runs while the host prepares the next and
/// finishes the last (`Npu::pipeline_rows`): every row comes out the same bits as the same rows
/// run uncut (ubatches of 64), the correction included, and an NPU failure in one piece is
/// computed on the CPU with the same bits and counted.
#[test]
fn a_pipelined_matmul_gives_every_row_the_bits_of_the_uncut_runs() {
    const K2: usize = 2048;
    const N2: usize = 1024;
    const M2: usize = 512;
    let mut r = lcg(31);
    let w: Vec<f32> = (0..N2 * K2).map(|_| r()).collect();
    let bytes: Vec<u8> = w.iter().flat_map(|v| v.to_le_bytes()).collect();
    let src = WeightSource { name: "blk.0.ffn_up.weight", ggml_type: 8, bytes: &bytes, row_bytes: 4 * K2, to_float: &to_float };
    let mut r = lcg(32);
    let common: Vec<f32> = (0..K2).map(|i| r() * if i % 97 == 5 { 40.0 } else { 2.0 }).collect();
    let rows = |seed: u64, m: usize| -> Vec<f32> {
        let mut r = lcg(seed);
        (0..m * K2).map(|i| common[i % K2] * (1.0 + 0.2 * r()) + 0.5 * r()).collect()
    };
    let dir = std::env::temp_dir().join(format!("ork-precision-pipe-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let cal = dir.join("c.orkcal");
    let rec = calibrated(&cal, true, &[]);
    let pw = pack(&rec, &src, N2, K2).expect("packs");
    let mut y = vec![0f32; 64 * N2];
    rec.run_mul_mat(&pw, &src, &rows(99, 64), 64, &mut y);
    assert_eq!(rec.calib.as_ref().unwrap().flush().unwrap(), 1, "one weight recorded");
    let x = rows(5, M2);
    let run = |dev: &Device, x: &[f32]| {
        let pw = pack(dev, &src, N2, K2).expect("packs");
        let m = x.len() / K2;
        let mut y = vec![0f32; m * N2];
        dev.run_mul_mat(&pw, &src, x, m, &mut y);
        y.iter().map(|f| f.to_bits()).collect::<Vec<u32>>()
    };
    let on = calibrated(&cal, false, &[]);
    let whole = run(&on, &x);
    let p = &on.stats.phase[0];
    assert!(p.pieces.load(Relaxed) >= 2, "M = {M2}, K = {K2}, N = {N2} is cut: {} pieces", p.pieces.load(Relaxed));
    assert_eq!(on.stats.npu_fallbacks.load(Relaxed), 0, "nothing fell back to the CPU");
    assert_eq!(on.stats.mean_corrected.load(Relaxed), 1, "corrected");
    assert_eq!(on.stats.npu_rows_sent.load(Relaxed), M2 as u64, "every row sent once");
    let uncut = calibrated(&cal, false, &[]);
    let mut want = Vec::new();
    for c in x.chunks(64 * K2) {
        want.extend(run(&uncut, c));
    }
    assert_eq!(uncut.stats.phase[0].pieces.load(Relaxed), (M2 / 64) as u64, "ubatches of 64 are not cut");
    assert!(whole == want, "the pieces give the uncut runs' bits");
    // Every 3rd submit times out: some pieces fall back, with the same bits, counted.
    let (cfg, bad) = Config::from_lookup(|_| None);
    assert!(bad.is_empty());
    let npu = Npu::open(&NpuConfig { kind: NpuKind::Sim, soc: Some(SocId::Rk3588), sim_fault: Some("timeout_every:3".into()), ..NpuConfig::default() }).expect("simulator opens");
    let mut faulty = Device { npu, vk: None, cfg: Box::leak(Box::new(cfg)), stats: Default::default(), placement: Default::default(), stream: Default::default(), cache: None, calib: None };
    faulty.calib = Some(ggml_ork::cache::calib::Store::open(&cal, false));
    assert!(run(&faulty, &x) == want, "a piece computed on the CPU after an NPU error has the NPU's bits");
    assert!(faulty.stats.npu_errors.load(Relaxed) >= 1, "the failed NPU runs are counted");
    assert_eq!(faulty.stats.npu_fallbacks.load(Relaxed), 1, "the MUL_MAT counts as fallen back");
    let _ = std::fs::remove_dir_all(&dir);
}
