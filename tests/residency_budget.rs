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
    assert!(dev.breakdown().contains("1 weights kept one int8 term"), "{}", dev.breakdown());
    assert!(dev.summary()[4].ends_with("; budget: 0 not resident, 1 one int8 term"), "{:?}", dev.summary());

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
    let dev = Device { npu, vk: None, cfg: Box::leak(Box::new(cfg)), stats: Default::default(), placement: Default::default(), stream: Default::default(), cache: None, calib: None };
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
    Device { npu, vk: None, cfg: Box::leak(Box::new(cfg)), stats: Default::default(), placement: Default::default(), stream: Default::default(), cache, calib: None }
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
    dev.placement.expected_term_bytes.store(3 * term, Relaxed);
    let pws: Vec<_> = model.iter().map(|(name, bytes)| pack(&dev, &source(name, bytes, BK), BN, BK).unwrap()).collect();
    assert_eq!(pws.iter().map(|pw| pw.lo.is_some()).collect::<Vec<_>>(), [true, false, false], "exact rest: first weight");
    drop(pws);
    // Without a budget limit the same entries give two terms everywhere.
    let dev = device_with_budget(1 << 40, tmp.path());
    let (name, bytes) = &model[2];
    assert!(pack(&dev, &source(name, bytes, BK), BN, BK).unwrap().lo.is_some());
}

/// Resident bytes by kind, exactly: an `[N, K]` weight with two int8 terms on the simulator
/// (one copy of everything), a weight buffer (the GGUF copy) and a compute buffer in ORK's
/// buffers, the NPU scratch of three cores.
#[test]
fn memory_is_counted_by_kind() {
    use ggml_ork::backend::buffer::Buffer;
    use ggml_ork::npu::kif::RknpuTask;
    use ggml_ork::npu::layout::WeightGeometry;
    const MN: usize = 96;
    const MK: usize = 2080; // three K-slices, not in the M-scheduler envelope
    let dev: &'static Device = Box::leak(Box::new(uncached()));
    let soc = SocDesc::get(SocId::Rk3588);
    // Default smallest M (unknown = 1): both tile sets. K-slice tiles 96·1024 + 96·1024 +
    // 96·32 (→ 4096) bytes and the full-K tile 96·2080 = 199680 (→ 200704): 401408 per term.
    let geom = WeightGeometry::with_sets(&soc, MN, MK, dev.npu.tile_sets(MN, MK));
    assert_eq!(page_round(geom.total_bytes) as u64, 401_408);
    assert_eq!(dev.npu.term_bytes(MN, MK), 401_408);
    let weights = Buffer::new(Some(dev), 12_345_678);
    weights.mark_weights();
    weights.mark_weights();
    let compute = Buffer::new(Some(dev), 1_000_000);
    let w = weight_bytes(7, MN, MK);
    let pw = pack(dev, &source("blk.0.ffn_down.weight", &w, MK), MN, MK).expect("resident");
    assert!(pw.lo.is_some(), "two terms");
    dev.note_memory();
    let m = dev.memory();
    // Scratch: regcmd and task array (one page each until a chain needs more) on each of three
    // cores, and the one 256 KiB activation image of lease slot 0.
    let regcmd = page_round(1) as u64;
    let task = page_round(std::mem::size_of::<RknpuTask>()) as u64;
    let scratch = 3 * (regcmd + task) + (256 << 10);
    // row scales [N], column scales [K], second-term row scales [N], f32
    let scales = 4 * (MN + MK + MN) as u64;
    let total = 12_345_678 + 1_000_000 + 2 * 401_408 + scales + scratch;
    let want = ggml_ork::backend::Memory {
        gguf: 12_345_678,
        buffers: 1_000_000,
        tiles: [401_408, 401_408],
        scales,
        scratch,
        copies: 0,
        gguf_mapped: 0,
        total,
        peak: total,
    };
    assert_eq!(m, want);
    assert_eq!(dev.npu.resident_bytes(), 2 * 401_408, "what the budget bounds: both terms, one copy");
    let line = dev.breakdown();
    assert!(line.contains(&want.line()), "{line}");
    assert!(line.contains("GGUF copy 11.8, compute buffers 1.0, int8 tiles 0.4 + 0.4 (terms 1 + 2)"), "{line}");
    assert!(dev.profile().contains(&want.line()));
    // Dropped: the tiles, scales and buffers go, the peak stays.
    drop(pw);
    drop(weights);
    drop(compute);
    let after = dev.memory();
    assert_eq!((after.gguf, after.buffers, after.tiles, after.scales, after.peak), (0, 0, [0, 0], 0, want.peak));
    assert_eq!(dev.npu.resident_bytes(), 0);
}

/// A kernel interface that holds every weight `copies` times (as `rocket` mirrors each buffer
/// onto every core's file descriptor), over the simulator.
struct Mirrored(ggml_ork::npu::kif::sim::SimKif);

impl ggml_ork::npu::kif::KernelInterface for Mirrored {
    fn name(&self) -> &'static str {
        "mirrored"
    }
    fn describe(&self) -> String {
        "simulator holding every weight once per core".into()
    }
    fn mem_create(&self, size: usize, flags: u32, d: ggml_ork::npu::kif::DomainId) -> Result<ggml_ork::npu::kif::Bo, ggml_ork::npu::kif::KifError> {
        self.0.mem_create(size, flags, d)
    }
    fn mem_sync(&self, bo: &ggml_ork::npu::kif::Bo, dir: ggml_ork::npu::kif::SyncDir, offset: usize, len: usize) -> Result<usize, ggml_ork::npu::kif::KifError> {
        self.0.mem_sync(bo, dir, offset, len)
    }
    fn mem_destroy(&self, bo: ggml_ork::npu::kif::Bo) -> Result<(), ggml_ork::npu::kif::KifError> {
        self.0.mem_destroy(bo)
    }
    fn submit(&self, job: &ggml_ork::npu::kif::SubmitJob<'_>) -> Result<ggml_ork::npu::kif::SubmitDone, ggml_ork::npu::kif::KifError> {
        self.0.submit(job)
    }
    fn reset(&self) -> Result<(), ggml_ork::npu::kif::KifError> {
        self.0.reset()
    }
    fn weight_copies(&self, cores: u32) -> u32 {
        cores
    }
}

/// Per-core copies count against the residency budget and in the memory report: on three cores
/// a weight costs three times its tiles, its domain holds one.
#[test]
fn per_core_copies_count_against_the_budget() {
    use ggml_ork::npu::layout::tile_weight;
    let soc = SocDesc::get(SocId::Rk3588);
    let term = term_bytes();
    let sim = ggml_ork::npu::kif::sim::SimKif::new(soc.clone(), None).unwrap();
    // Room for five copies: one weight (three copies) fits, a second does not.
    let cfg = NpuConfig { wcache_budget_bytes: Some(5 * term), ..NpuConfig::default() };
    let npu = Npu::with_kif(std::sync::Arc::new(Mirrored(sim)), soc.clone(), &cfg).unwrap();
    assert_eq!(npu.weight_copies(), 3);
    assert_eq!(npu.term_bytes(N, K), 3 * term);
    let tw = tile_weight(&soc, &vec![1i8; N * K], N, K).unwrap();
    let r = npu.upload(&tw).expect("three copies fit in five");
    assert_eq!((npu.resident_bytes(), npu.domain_usage()), (3 * term, vec![term]));
    assert!(matches!(npu.upload(&tw), Err(NpuError::NoRoom { .. })), "six copies do not fit in five");
    // On one core there are no mirrors.
    let one = Npu::with_kif(
        std::sync::Arc::new(Mirrored(ggml_ork::npu::kif::sim::SimKif::new(soc.clone(), None).unwrap())),
        soc,
        &NpuConfig { max_cores: Some(1), wcache_budget_bytes: Some(5 * term), ..NpuConfig::default() },
    )
    .unwrap();
    assert_eq!(one.weight_copies(), 1);
    // The report: (copies − 1) × tiles, plus the scratch mirrors of cores 1 and 2.
    let dev = Device { npu: npu.clone(), vk: None, cfg: Box::leak(Box::new(Config::from_lookup(|_| None).0)), stats: Default::default(), placement: Default::default(), stream: Default::default(), cache: None, calib: None };
    let held = ggml_ork::backend::Held::new(&dev.stats.mem, [r.resident_bytes(), 0], 0);
    dev.note_memory();
    let (scratch, mirrored) = npu.scratch_bytes();
    let image = 256u64 << 10;
    assert_eq!(mirrored, (scratch - image) * 2 / 3 + 2 * image, "cores 1 and 2 of three equal scratch sets, and the activation image twice");
    assert_eq!(dev.memory().copies, 2 * term + mirrored);
    drop(held);
    drop(r);
    assert_eq!(npu.resident_bytes(), 0);
}

/// A device whose matmuls all have M ≥ `smallest_m` (ORK_MINM with decode off the NPU), with a
/// cache in `dir`.
fn device_for_m(smallest_m: usize, dir: &std::path::Path) -> Device {
    let (cfg, _) = Config::from_lookup(|k| (k == "ORK_ROTATE").then(|| "0".into()));
    let npu = Npu::open(&NpuConfig { kind: NpuKind::Sim, soc: Some(SocId::Rk3588), smallest_m, ..NpuConfig::default() }).expect("simulator opens");
    Device { npu, vk: None, cfg: Box::leak(Box::new(cfg)), stats: Default::default(), placement: Default::default(), stream: Default::default(), cache: Some(ggml_ork::cache::PackCache::new(dir, u64::MAX)), calib: None }
}

/// Prefill-only devices keep one tile set (K = 2080: the K-slice tiles, 200704 bytes a term
/// instead of 401408): the same results bit for bit, the budget and the report count the one
/// set, and the cache keeps the two layouts apart.
#[test]
fn prefill_only_weights_keep_one_tile_set() {
    const MN: usize = 96;
    const MK: usize = 2080;
    let tmp = tempfile::tempdir().unwrap();
    let w = weight_bytes(9, MN, MK);
    let src = source("blk.0.ffn_down.weight", &w, MK);
    let both = device_for_m(1, tmp.path());
    let pw_both = pack(&both, &src, MN, MK).unwrap();
    let one = device_for_m(32, tmp.path());
    assert_eq!((both.npu.term_bytes(MN, MK), one.npu.term_bytes(MN, MK)), (401_408, 200_704));
    let pw_one = pack(&one, &src, MN, MK).unwrap();
    assert_eq!((counts(&both), counts(&one)), ((0, 1, 1), (0, 1, 1)), "one layout per cache key: the prefill-only device repacks");
    assert_eq!(one.memory().tiles, [200_704, 200_704]);
    assert_eq!(one.npu.resident_bytes(), 2 * 200_704);
    assert_eq!(observe(&one, &pw_one, &src), observe(&both, &pw_both, &src), "same int32 results, same floats");
    // A warm start of each layout hits its own entry.
    for smallest in [1, 32] {
        let dev = device_for_m(smallest, tmp.path());
        let pw = pack(&dev, &src, MN, MK).unwrap();
        assert_eq!(counts(&dev), (1, 0, 0), "smallest M {smallest}");
        assert_eq!(observe(&dev, &pw, &src), observe(&both, &pw_both, &src));
    }
}

/// A weight buffer over llama.cpp's mapping of the model file (`buffer_from_host_ptr`) holds no
/// copy: the memory report counts its bytes as file-backed GGUF bytes, outside ORK's total and
/// peak, and not as a GGUF copy; they still lower the default budget (the pages share the RAM
/// while the CPU decodes from them). Its weights are announced at `init_tensor` like a copy's,
/// and nothing is packed then (each is packed at its first NPU MUL_MAT).
#[test]
fn a_mapped_weight_buffer_is_file_backed_not_a_copy() {
    use ggml_ork::backend::buffer::{Buffer, Name, Tensor};
    let dev: &'static Device = Box::leak(Box::new(uncached()));
    let base = domain::default_budget_bytes();
    dev.note_memory();
    let before = dev.memory();
    let mapped = Buffer::mapped(Some(dev), 50_000_000);
    assert!(mapped.is_mapped());
    assert_eq!(dev.npu.residency_budget(), base - 50_000_000, "the mapped bytes lower the default budget");
    let m = dev.memory();
    assert_eq!((m.gguf, m.buffers, m.gguf_mapped), (0, 0, 50_000_000), "file-backed, not a copy");
    assert_eq!((m.total, m.peak), (before.total, before.peak), "not ORK's memory");
    let line = dev.breakdown();
    assert!(line.contains("(GGUF copy 0.0, compute buffers 0.0,"), "{line}");
    assert!(line.contains("; GGUF file-backed 47.7 MiB (read in place from llama.cpp's mapping of the model file, not in the total)"), "{line}");
    let memory = &dev.summary()[3];
    assert!(memory.contains(" (GGUF copy 0.0, ") && memory.ends_with("; GGUF mapped 47.7"), "{memory}");
    mapped.mark_weights();
    assert_eq!(dev.memory().gguf, 0, "marking a mapped buffer's weights makes no copy");
    // A copy beside it (--no-mmap, ORK_MAP_WEIGHTS=0) is ORK's memory.
    let copy = Buffer::new(Some(dev), 1_000_000);
    copy.mark_weights();
    let m = dev.memory();
    assert_eq!((m.gguf, m.buffers, m.gguf_mapped, m.total), (1_000_000, 0, 50_000_000, before.total + 1_000_000));
    // Announced at init, not packed.
    let t = Tensor { addr: 0x1000, ggml_type: ggml_ork::quant::types::Q8_0, ne: [K as i64, N as i64, 1, 1], contiguous: true, is_view: false, name: Name(b"blk.0.attn_q.weight") };
    mapped.init_tensor(&t);
    assert_eq!(dev.placement.expected_term_bytes.load(Relaxed), dev.npu.term_bytes(N, K));
    assert_eq!(dev.stats.packed.load(Relaxed), 0);
    assert!(mapped.weights.placed(t.addr, N, K, t.ggml_type).is_none());
    drop(copy);
    drop(mapped);
    let m = dev.memory();
    assert_eq!((m.gguf, m.gguf_mapped, m.total, dev.placement.expected_term_bytes.load(Relaxed)), (0, 0, before.total, 0));
    assert_eq!(dev.npu.residency_budget(), base);
}
