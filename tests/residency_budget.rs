//! The default residency budget leaves room for ORK's own host buffers (the GGUF weights live
//! there for the CPU): packed weights past it keep one int8 term, then stay on the CPU, with one
//! warning each and a count in the summary line; an explicit `ORK_WCACHE_BUDGET_MB` is kept.

mod cache_common;

use cache_common::*;
use ggml_ork::backend::weights::pack;
use ggml_ork::backend::Device;
use ggml_ork::config::Config;
use ggml_ork::npu::kif::page_round;
use ggml_ork::npu::soc::{SocDesc, SocId};
use ggml_ork::npu::{domain, Npu, NpuConfig, NpuError, NpuKind};
use std::sync::atomic::Ordering::Relaxed;

const N: usize = 96;
const K: usize = 160;

/// Bytes one int8 term of an `[N, K]` weight reserves (its tiles, page-rounded).
fn term_bytes() -> u64 {
    let tiles = ggml_ork::npu::layout::tile_weight(&SocDesc::get(SocId::Rk3588), &vec![0i8; N * K], N, K).unwrap().bytes.len() as u64;
    page_round(tiles as usize) as u64
}

#[test]
fn ork_buffers_lower_the_default_budget() {
    let dev = uncached();
    let base = domain::default_budget_bytes();
    assert_eq!(dev.npu.residency_budget(), base, "default: RAM - 1 GiB");
    let term = term_bytes();
    // ORK buffers that leave room for one and a half terms.
    let buffers = base - term * 3 / 2;
    dev.host_buffers_changed(buffers as i64);
    assert_eq!(dev.npu.residency_budget(), term * 3 / 2);

    let w1 = weight_bytes(1, N, K);
    let pw = pack(&dev, &source("blk.0.attn_q.weight", &w1, K), N, K).expect("the first term fits");
    assert!(pw.lo.is_none(), "the second term does not fit: one term");
    let w2 = weight_bytes(2, N, K);
    let second = pack(&dev, &source("blk.0.attn_k.weight", &w2, K), N, K);
    assert!(matches!(second, Err(NpuError::NoRoom { .. })), "{:?}", second.err());
    assert_eq!(dev.stats.one_term_for_budget.load(Relaxed), 1);
    assert!(dev.stats.summary().contains("1 weights kept one int8 term"), "{}", dev.stats.summary());

    // The buffers freed: the budget is back, and a weight gets both terms.
    dev.host_buffers_changed(-(buffers as i64));
    assert_eq!(dev.npu.residency_budget(), base);
    let pw2 = pack(&dev, &source("blk.0.attn_k.weight", &w2, K), N, K).expect("fits again");
    assert!(pw2.lo.is_some(), "two terms");
}

#[test]
fn an_explicit_budget_is_kept() {
    let (cfg, bad) = Config::from_lookup(|k| match k {
        "ORK_WCACHE_BUDGET_MB" => Some("64".to_string()),
        "ORK_ROTATE" => Some("0".to_string()),
        _ => None,
    });
    assert!(bad.is_empty(), "{bad:?}");
    let npu = Npu::open(&NpuConfig {
        kind: NpuKind::Sim,
        soc: Some(SocId::Rk3588),
        max_cores: None,
        pin_cpus: vec![],
        wcache_budget_bytes: cfg.wcache_budget_mb.map(|mb| mb << 20),
        ..NpuConfig::default()
    })
    .expect("simulator opens");
    let dev = Device { npu, vk: None, cfg: Box::leak(Box::new(cfg)), stats: Default::default(), cache: None, calib: None };
    dev.host_buffers_changed(1 << 40);
    assert_eq!(dev.npu.residency_budget(), 64 << 20, "ORK_WCACHE_BUDGET_MB wins");
    dev.host_buffers_changed(-(1 << 40));
    let w = weight_bytes(3, N, K);
    assert!(pack(&dev, &source("w", &w, K), N, K).unwrap().lo.is_some());
}

/// A device with an explicit residency budget of `budget` bytes and a cache in `dir`.
fn device_with_budget(budget: u64, dir: &std::path::Path) -> Device {
    // The unrotated multi-term path: two weight terms for every weight, which the budget rules
    // are about.
    let (cfg, _) = Config::from_lookup(|k| match k {
        "ORK_WCACHE_BUDGET_MB" => Some((budget >> 20).max(1).to_string()),
        "ORK_ROTATE" => Some("0".to_string()),
        _ => None,
    });
    let npu = Npu::open(&NpuConfig { kind: NpuKind::Sim, soc: Some(SocId::Rk3588), max_cores: None, pin_cpus: vec![], wcache_budget_bytes: Some(budget), ..NpuConfig::default() })
        .expect("simulator opens");
    let cache = Some(ggml_ork::cache::PackCache::new(dir, u64::MAX));
    Device { npu, vk: None, cfg: Box::leak(Box::new(cfg)), stats: Default::default(), cache, calib: None }
}

#[test]
fn a_model_too_large_for_two_terms_keeps_one_term_everywhere() {
    const BN: usize = 1024;
    const BK: usize = 1024;
    let term = {
        let t = ggml_ork::npu::layout::tile_weight(&SocDesc::get(SocId::Rk3588), &vec![0i8; BN * BK], BN, BK).unwrap().bytes.len() as u64;
        page_round(t as usize) as u64
    };
    let tmp = tempfile::tempdir().unwrap();
    let model: Vec<(String, Vec<u8>)> = (0..3).map(|i| (format!("blk.{i}.ffn_up.weight"), weight_bytes(40 + i, BN, BK))).collect();
    let src_total: u64 = model.iter().map(|(_, b)| b.len() as u64).sum();
    // Room for four terms of three weights: one term each, plus one second term.
    let start = |run: &str| {
        let dev = device_with_budget(4 * term, tmp.path());
        dev.host_buffers_changed(src_total as i64);
        // Every weight stays resident until the start ends, as in a process.
        let pws: Vec<_> = model
            .iter()
            .map(|(name, bytes)| pack(&dev, &source(name, bytes, BK), BN, BK).unwrap_or_else(|e| panic!("{run}: {name} not resident: {e}")))
            .collect();
        let out: Vec<(bool, Vec<u32>)> =
            pws.iter().zip(&model).map(|(pw, (name, bytes))| (pw.lo.is_some(), observe(&dev, pw, &source(name, bytes, BK)).1)).collect();
        assert!(dev.npu.resident_bytes() <= 4 * term, "{run}: within the budget");
        assert_eq!(dev.stats.one_term_for_budget.load(Relaxed), 2, "{run}");
        (out, dev.stats.cache_hits.load(Relaxed), dev.stats.cache_writes.load(Relaxed))
    };
    let (cold, hits, writes) = start("cold");
    // The rest is estimated on the safe side (two resident bytes per parameter), so the one
    // second term that fits goes to the weight placed last.
    assert_eq!(cold.iter().map(|o| o.0).collect::<Vec<_>>(), [false, false, true], "second terms: last weight only");
    assert_eq!((hits, writes), (0, 3));
    // A warm start hits the two-term entries and imports what the budget allows: same terms,
    // same results bit for bit, nothing repacked.
    let (warm, hits, writes) = start("warm");
    assert_eq!((hits, writes), (3, 0));
    assert_eq!(warm, cold, "warm start: same terms and results");
    // When ORK's buffers announced their weights (ggml's tensor initialisation), the rest is
    // known exactly and the second term goes to the first weight placed.
    let tmp2 = tempfile::tempdir().unwrap();
    let dev = device_with_budget(4 * term, tmp2.path());
    dev.host_buffers_changed(src_total as i64);
    dev.stats.expected_term_bytes.store(3 * term, Relaxed);
    let pws: Vec<_> = model.iter().map(|(name, bytes)| pack(&dev, &source(name, bytes, BK), BN, BK).unwrap()).collect();
    assert_eq!(pws.iter().map(|pw| pw.lo.is_some()).collect::<Vec<_>>(), [true, false, false], "exact rest: first weight");
    drop(pws);
    // Without a budget limit the same entries give two terms everywhere.
    let dev = device_with_budget(1 << 40, tmp.path());
    let (name, bytes) = &model[2];
    assert!(pack(&dev, &source(name, bytes, BK), BN, BK).unwrap().lo.is_some());
}
