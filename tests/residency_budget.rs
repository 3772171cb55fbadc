//! The default residency budget leaves room for ORK's own host buffers (the GGUF weights live
//! there for the CPU): packed weights past it keep one int8 term, then stay on the CPU, with one
//! warning each and a count in the summary line; an explicit `ORK_WCACHE_BUDGET_MB` is kept.

mod cache_common;

use cache_common::*;
use ggml_ork::backend::weights::pack;
use ggml_ork::backend::Device;
use ggml_ork::config::Config;
use ggml_ork::npu::kif::sim::PAGE_BYTES;
use ggml_ork::npu::soc::{SocDesc, SocId};
use ggml_ork::npu::{domain, Npu, NpuConfig, NpuError, NpuKind};
use std::sync::atomic::Ordering::Relaxed;

const N: usize = 96;
const K: usize = 160;

/// Bytes one int8 term of an `[N, K]` weight reserves (its tiles, page-rounded).
fn term_bytes() -> u64 {
    let tiles = Npu::tile_weight(&SocDesc::get(SocId::Rk3588), &vec![0i8; N * K], N, K).unwrap().bytes.len() as u64;
    tiles.div_ceil(PAGE_BYTES) * PAGE_BYTES
}

#[test]
fn ork_buffers_lower_the_default_budget() {
    if std::env::var_os("ORK_WCACHE_BUDGET_MB").is_some() {
        eprintln!("skipped: ORK_WCACHE_BUDGET_MB is set");
        return;
    }
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
    let (cfg, bad) = Config::from_lookup(|k| (k == "ORK_WCACHE_BUDGET_MB").then(|| "64".to_string()));
    assert!(bad.is_empty(), "{bad:?}");
    let npu = Npu::open(&NpuConfig {
        kind: NpuKind::Sim,
        soc: Some(SocId::Rk3588),
        max_cores: None,
        pin_cpus: vec![],
        wcache_budget_bytes: cfg.wcache_budget_mb.map(|mb| mb << 20),
    })
    .expect("simulator opens");
    let dev = Device { npu, vk: None, cfg: Box::leak(Box::new(cfg)), stats: Default::default(), cache: None };
    dev.host_buffers_changed(1 << 40);
    assert_eq!(dev.npu.residency_budget(), 64 << 20, "ORK_WCACHE_BUDGET_MB wins");
    let w = weight_bytes(3, N, K);
    assert!(pack(&dev, &source("w", &w, K), N, K).unwrap().lo.is_some());
}
