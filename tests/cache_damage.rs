//! The damaged-cache corpus: every kind of bad `.orkpack` entry is rejected, the weight is
//! repacked and the entry rewritten, and what the weight computes equals a clean (uncached)
//! pack bit for bit. Also: hits on a clean cache, the two-models-one-shape case of the C
//! predecessor, and LRU eviction.

mod cache_common;

use cache_common::*;
use ggml_ork::backend::weights::pack;
use ggml_ork::cache::format::{self, HEADER_BYTES};
use ggml_ork::cache::{self, CacheError, PackCache};
use ggml_ork::npu::soc::{SocDesc, SocId};

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

const N: usize = 96;
const K: usize = 160;
const NAME: &str = "blk.0.ffn_up.weight";

fn id_of(soc: SocId, name: &str, bytes: &[u8]) -> cache::Identity {
    cache::identity(&SocDesc::get(soc), GGML_TYPE_F32, bytes, 4 * K, name, N, K, 2, None)
}

/// Packs the weight once through a cache in `dir` and returns the entry's path.
fn prime(dir: &Path, soc: SocId, name: &str, bytes: &[u8]) -> PathBuf {
    let dev = device(Some(dir), soc, u64::MAX);
    pack(&dev, &source(name, bytes, K), N, K).unwrap();
    let p = dev.cache.as_ref().unwrap().path_for(&id_of(soc, name, bytes));
    assert!(p.is_file(), "entry written at {}", p.display());
    p
}

/// The entry for the weight is valid and holds exactly the clean tiles.
fn assert_entry_is_clean(dir: &Path, bytes: &[u8]) {
    let c = PackCache::new(dir, u64::MAX);
    let hit = c.load(&id_of(SocId::Rk3588, NAME, bytes)).expect("rewritten entry is valid");
    let src = source(NAME, bytes, K);
    // F32 source: two weight terms; payload = hi tiles ++ lo tiles, scales ++ col ++ lo scales.
    let (q, scales, col) = ggml_ork::pack::quantize_source(&src, N, K, None);
    let (ql, sl) = ggml_ork::pack::quantize_residual(&src, N, K, None, &col, &q, &scales);
    let soc = SocDesc::get(SocId::Rk3588);
    let mut tiles = ggml_ork::npu::layout::tile_weight(&soc, &q, N, K).unwrap().bytes;
    tiles.extend_from_slice(&ggml_ork::npu::layout::tile_weight(&soc, &ql, N, K).unwrap().bytes);
    assert_eq!(hit.tiles(), &tiles[..]);
    let f: Vec<f32> = scales.iter().chain(&col).chain(&sl).copied().collect();
    assert_eq!(hit.scales(), f);
}

/// Applies `damage` to a primed entry, then checks: miss → 0 hits, 1 pack, 1 rewrite, clean
/// output; the rewritten entry is valid; and the next load is a hit with clean output.
fn check_rejected(what: &str, damage: impl FnOnce(&Path, &Path)) {
    let tmp = tempfile::tempdir().unwrap();
    let bytes = weight_bytes(1, N, K);
    let want = clean(NAME, &bytes, N, K);
    let path = prime(tmp.path(), SocId::Rk3588, NAME, &bytes);
    damage(&path, tmp.path());

    let c = PackCache::new(tmp.path(), u64::MAX);
    let err = c.load(&id_of(SocId::Rk3588, NAME, &bytes)).err();
    assert!(err.is_some(), "{what}: damaged entry was accepted");

    let dev = cached(tmp.path());
    let src = source(NAME, &bytes, K);
    let pw = pack(&dev, &src, N, K).unwrap_or_else(|e| panic!("{what}: pack failed: {e}"));
    assert_eq!(counts(&dev), (0, 1, 1), "{what}: expected a repack and a rewrite ({err:?})");
    assert!(observe(&dev, &pw, &src) == want, "{what}: output differs from a clean pack");
    assert_entry_is_clean(tmp.path(), &bytes);

    let dev = cached(tmp.path());
    let pw = pack(&dev, &src, N, K).unwrap();
    assert_eq!(counts(&dev), (1, 0, 0), "{what}: rewritten entry should hit");
    assert!(observe(&dev, &pw, &src) == want, "{what}: hit output differs from a clean pack");
}

fn rewrite(path: &Path, f: impl FnOnce(&mut Vec<u8>)) {
    let mut b = fs::read(path).unwrap();
    f(&mut b);
    fs::write(path, b).unwrap();
}

#[test]
fn warm_cache_hits_and_matches_a_clean_pack() {
    let tmp = tempfile::tempdir().unwrap();
    let bytes = weight_bytes(1, N, K);
    let want = clean(NAME, &bytes, N, K);
    let src = source(NAME, &bytes, K);

    let cold = cached(tmp.path());
    let pw = pack(&cold, &src, N, K).unwrap();
    assert_eq!(counts(&cold), (0, 1, 1));
    assert!(observe(&cold, &pw, &src) == want);

    let warm = cached(tmp.path());
    let pw = pack(&warm, &src, N, K).unwrap();
    assert_eq!(counts(&warm), (1, 0, 0));
    assert!(observe(&warm, &pw, &src) == want);
    assert_entry_is_clean(tmp.path(), &bytes);
}

#[test]
fn disabled_cache_writes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let (cfg, _) = ggml_ork::config::Config::from_lookup(|k| match k {
        "ORK_CACHE" => Some("0".into()),
        "ORK_CACHE_DIR" => Some(tmp.path().to_str().unwrap().into()),
        _ => None,
    });
    assert!(PackCache::from_config(&cfg).is_none());
    let (cfg, _) = ggml_ork::config::Config::from_lookup(|k| match k {
        "ORK_CACHE_DIR" => Some(tmp.path().to_str().unwrap().into()),
        "ORK_CACHE_MAX_MB" => Some("3".into()),
        _ => None,
    });
    let c = PackCache::from_config(&cfg).expect("enabled by default");
    assert_eq!(c.dir(), tmp.path());
    assert_eq!(c.max_bytes(), 3 << 20);
}

#[test]
fn truncated_entries_are_rejected() {
    for cut in [0usize, 100, HEADER_BYTES - 1, HEADER_BYTES, HEADER_BYTES + 100] {
        check_rejected(&format!("truncated to {cut}"), |p, _| rewrite(p, |b| b.truncate(cut)));
    }
    check_rejected("last byte missing", |p, _| rewrite(p, |b| { b.pop(); }));
    check_rejected("one byte appended", |p, _| rewrite(p, |b| b.push(0)));
}

#[test]
fn bit_flips_in_the_header_are_rejected() {
    // magic, version, layout fp, quant fp, soc, source hash, type, n, k, name, qmax, tiles_off,
    // file_bytes, payload hash, header checksum, padding.
    for pos in [0usize, 8, 17, 25, 33, 50, 64, 72, 80, 110, 176, 184, 216, 230, 241, 3000, HEADER_BYTES - 1] {
        for bit in [0u8, 7] {
            check_rejected(&format!("header bit {bit} of byte {pos}"), |p, _| rewrite(p, |b| b[pos] ^= 1 << bit));
        }
    }
}

#[test]
fn bit_flips_in_the_payload_are_rejected() {
    let tiles = N * K;
    for pos in [HEADER_BYTES, HEADER_BYTES + tiles / 2, HEADER_BYTES + tiles - 1] {
        check_rejected(&format!("tile byte {pos}"), |p, _| rewrite(p, |b| b[pos] ^= 0x10));
    }
    check_rejected("scale byte", |p, _| rewrite(p, |b| {
        let last = b.len() - 2;
        b[last] ^= 0x01
    }));
}

/// A weight whose tile sets are each over 1 MiB and not a multiple of it: the hit path imports
/// the two terms at once and joins their checksums at the 1 MiB chunk that straddles them. A
/// flip anywhere — first term, the straddling chunk on either side, the second term past it —
/// is still a miss, frees what was imported, and the repacked weight computes the clean result.
#[test]
fn large_two_term_entries_verify_across_the_term_boundary() {
    const BN: usize = 1056;
    const BK: usize = 1120;
    const BIG: &str = "blk.0.ffn_down.weight";
    let bytes = weight_bytes(3, BN, BK);
    let want = clean(BIG, &bytes, BN, BK);
    let src = source(BIG, &bytes, BK);
    let id = cache::identity(&SocDesc::get(SocId::Rk3588), GGML_TYPE_F32, &bytes, 4 * BK, BIG, BN, BK, 2, None);
    let one = ggml_ork::npu::layout::tile_weight(&SocDesc::get(SocId::Rk3588), &vec![0i8; BN * BK], BN, BK).unwrap().bytes.len();
    let chunk = format::HASH_CHUNK_BYTES;
    assert!(one > chunk && one % chunk != 0, "tile set of {one} bytes does not exercise the join");
    let boundary = HEADER_BYTES + one;
    let straddle_end = HEADER_BYTES + one.div_ceil(chunk) * chunk;
    let clean_usage = {
        let dev = uncached();
        let _pw = pack(&dev, &src, BN, BK).unwrap();
        dev.npu.domain_usage()
    };
    for pos in [HEADER_BYTES + 7, boundary - 1, boundary, straddle_end - 1, straddle_end, straddle_end + chunk + 3, HEADER_BYTES + 2 * one - 1] {
        let tmp = tempfile::tempdir().unwrap();
        let dev = cached(tmp.path());
        pack(&dev, &src, BN, BK).unwrap();
        let path = dev.cache.as_ref().unwrap().path_for(&id);
        let warm = cached(tmp.path());
        let pw = pack(&warm, &src, BN, BK).unwrap();
        assert_eq!(counts(&warm), (1, 0, 0), "clean large entry should hit");
        assert!(observe(&warm, &pw, &src) == want, "large hit output differs from a clean pack");

        rewrite(&path, |b| b[pos] ^= 0x04);
        let dev = cached(tmp.path());
        let pw = pack(&dev, &src, BN, BK).unwrap();
        assert_eq!(counts(&dev), (0, 1, 1), "flip at byte {pos} (term boundary at {boundary}) was accepted");
        assert_eq!(dev.npu.domain_usage(), clean_usage, "flip at byte {pos}: the rejected import was not freed");
        assert!(observe(&dev, &pw, &src) == want, "flip at byte {pos}: repacked output differs");
    }
}

#[test]
fn wrong_container_version_is_rejected_even_when_well_sealed() {
    check_rejected("container version 2", |p, _| {
        rewrite(p, |b| {
            let o = 8 /* the container version field (FORMAT.md) */;
            b[o..o + 4].copy_from_slice(&(format::CONTAINER_VERSION + 1).to_le_bytes());
            reseal_header(b);
        })
    });
}

/// A file made by a build with another tile layout or quantization rule, found under the key.
#[test]
fn stale_layout_or_quantization_is_rejected() {
    for (what, tweak) in [
        ("layout fingerprint", (|id: &mut cache::Identity| id.layout_fp ^= 1) as fn(&mut cache::Identity)),
        ("quantization fingerprint", |id: &mut cache::Identity| id.quant_fp ^= 1),
    ] {
        check_rejected(what, |p, _| {
            let bytes = weight_bytes(1, N, K);
            let mut id = id_of(SocId::Rk3588, NAME, &bytes);
            tweak(&mut id);
            let good = fs::read(p).unwrap();
            let hd = format::parse_header(&good).unwrap();
            let file = encode_file(&id, cache::quant_params(), format::tiles(&hd, &good), &format::scales(&hd, &good));
            fs::write(p, file).unwrap();
        });
    }
}

#[test]
fn entry_from_another_soc_is_rejected() {
    check_rejected("rk3576 entry", |p, dir| {
        let other = dir.join("rk3576");
        let bytes = weight_bytes(1, N, K);
        let theirs = prime(&other, SocId::Rk3576, NAME, &bytes);
        fs::copy(theirs, p).unwrap();
    });
}

#[test]
fn entry_from_another_model_with_identical_shapes_is_rejected() {
    check_rejected("other model's entry", |p, dir| {
        let other = dir.join("other-model");
        let theirs = prime(&other, SocId::Rk3588, NAME, &weight_bytes(2, N, K));
        fs::copy(theirs, p).unwrap();
    });
}

#[test]
fn garbage_and_non_files_are_misses() {
    check_rejected("random bytes", |p, _| fs::write(p, weight_bytes(9, 64, 64)).unwrap());
    check_rejected("empty file", |p, _| fs::write(p, b"").unwrap());
    // A directory where the entry should be: load fails, the store fails, the pack still works.
    let tmp = tempfile::tempdir().unwrap();
    let bytes = weight_bytes(1, N, K);
    let want = clean(NAME, &bytes, N, K);
    let path = prime(tmp.path(), SocId::Rk3588, NAME, &bytes);
    fs::remove_file(&path).unwrap();
    fs::create_dir(&path).unwrap();
    fs::write(path.join("x"), b"x").unwrap();
    let dev = cached(tmp.path());
    let src = source(NAME, &bytes, K);
    let pw = pack(&dev, &src, N, K).unwrap();
    assert_eq!(counts(&dev), (0, 1, 0));
    assert!(observe(&dev, &pw, &src) == want);
}

/// The C predecessor keyed by name and shape: two models with equal shapes shared packs. Here
/// each model gets its own entry and its own correct output, in either order, warm or cold.
#[test]
fn two_models_with_identical_shapes_do_not_share_entries() {
    let tmp = tempfile::tempdir().unwrap();
    let a = weight_bytes(10, N, K);
    let b = weight_bytes(11, N, K);
    let (want_a, want_b) = (clean(NAME, &a, N, K), clean(NAME, &b, N, K));
    assert!(want_a != want_b);
    for round in 0..2 {
        for (bytes, want) in [(&a, &want_a), (&b, &want_b)] {
            let dev = cached(tmp.path());
            let src = source(NAME, bytes, K);
            let pw = pack(&dev, &src, N, K).unwrap();
            assert_eq!(counts(&dev).0, round, "round {round}: hits");
            assert!(observe(&dev, &pw, &src) == *want, "round {round}: wrong model's weights");
        }
    }
    assert_eq!(fs::read_dir(tmp.path()).unwrap().flatten().flat_map(|d| fs::read_dir(d.path()).unwrap()).count(), 2);
}

#[test]
fn the_key_covers_every_identity_field() {
    let c = PackCache::new("/nonexistent", u64::MAX);
    let bytes = weight_bytes(1, N, K);
    let base = id_of(SocId::Rk3588, NAME, &bytes);
    let variants = [
        id_of(SocId::Rk3576, NAME, &bytes),
        id_of(SocId::Rk3588, "blk.1.ffn_up.weight", &bytes),
        cache::identity(&SocDesc::get(SocId::Rk3588), 1, &bytes, 4 * K, NAME, N, K, 2, None),
        cache::identity(&SocDesc::get(SocId::Rk3588), GGML_TYPE_F32, &bytes, 4 * K, NAME, K, N, 2, None),
        id_of(SocId::Rk3588, NAME, &weight_bytes(1, N, K)[..N * K * 4 - 1]),
    ];
    for v in &variants {
        assert_ne!(c.path_for(v), c.path_for(&base), "{v:?}");
    }
    let mut flipped = bytes.clone();
    flipped[1234] ^= 1;
    assert_ne!(id_of(SocId::Rk3588, NAME, &flipped).src_hash, base.src_hash);
}

#[test]
fn eviction_removes_least_recently_used_entries() {
    let tmp = tempfile::tempdir().unwrap();
    // F32 weights: two terms, so 2N + K scale values per entry.
    let floats = format::scale_count(N, K, 2);
    let per_entry = format::layout(N * K, floats).1 as u64;
    let c = PackCache::new(tmp.path(), u64::MAX);
    let ids: Vec<_> = (0..6).map(|i| id_of(SocId::Rk3588, &format!("w{i}"), &weight_bytes(i, N, K))).collect();
    let t0 = SystemTime::now() - Duration::from_secs(1000);
    for (i, id) in ids.iter().enumerate() {
        let p = c.store(id, &vec![i as u8; N * K], &vec![1.0; floats]).unwrap();
        fs::File::options().write(true).open(&p).unwrap().set_modified(t0 + Duration::from_secs(10 * i as u64)).unwrap();
    }
    // w0 is the oldest but is used now: it must survive; w1 and w2 go.
    c.load(&ids[0]).expect("w0 valid");
    // A leftover temp file of a crashed writer, two hours old.
    let stale = tmp.path().join("00").join(".x.orkpack.tmp.1.1");
    fs::create_dir_all(stale.parent().unwrap()).unwrap();
    fs::write(&stale, b"partial").unwrap();
    fs::File::options().write(true).open(&stale).unwrap().set_modified(SystemTime::now() - Duration::from_secs(7200)).unwrap();

    let small = PackCache::new(tmp.path(), 5 * per_entry);
    small.store(&id_of(SocId::Rk3588, "w6", &weight_bytes(6, N, K)), &vec![6; N * K], &vec![1.0; floats]).unwrap();
    // 7 entries > 5: evict down to 90 % of 5 entries → 4 entries left.
    let left: Vec<bool> = ids.iter().map(|id| small.load(id).is_ok()).collect();
    assert_eq!(left, [true, false, false, false, true, true], "LRU order");
    assert!(!stale.exists(), "stale temp file removed");
    assert!(small.disk_bytes() <= 5 * per_entry * 9 / 10);
    // An entry larger than the whole limit is not stored.
    assert!(matches!(
        PackCache::new(tmp.path(), 1000).store(&ids[1], &vec![0; N * K], &vec![1.0; floats]),
        Err(CacheError::TooBig { .. })
    ));
}

/// Sets the mtime of every entry in `dir` to an hour ago (a later start of the program).
fn age_entries(dir: &Path) {
    for sub in fs::read_dir(dir).unwrap().flatten() {
        for f in fs::read_dir(sub.path()).into_iter().flatten().flatten() {
            let old = SystemTime::now() - Duration::from_secs(3600);
            fs::File::options().write(true).open(f.path()).unwrap().set_modified(old).unwrap();
        }
    }
}

#[test]
fn a_model_larger_than_the_limit_keeps_a_stable_cached_part() {
    use std::sync::atomic::Ordering::Relaxed;
    let tmp = tempfile::tempdir().unwrap();
    let floats = format::scale_count(N, K, 2);
    let per_entry = format::layout(2 * N * K, floats).1 as u64;
    // Room for 3.5 entries; the "model" has 5 weights, and two entries of another model
    // (not used for an hour) are in the directory first.
    let limit = 3 * per_entry + per_entry / 2;
    let model: Vec<(String, Vec<u8>)> = (0..5).map(|i| (format!("blk.{i}.ffn_up.weight"), weight_bytes(100 + i, N, K))).collect();
    for i in 0..2 {
        prime(tmp.path(), SocId::Rk3588, &format!("other.{i}"), &weight_bytes(200 + i, N, K));
    }
    age_entries(tmp.path());
    let clean_out: Vec<_> = model.iter().map(|(name, bytes)| clean(name, bytes, N, K)).collect();
    let start = |run: usize| {
        let dev = device(Some(tmp.path()), SocId::Rk3588, limit);
        for ((name, bytes), want) in model.iter().zip(&clean_out) {
            let src = source(name, bytes, K);
            let pw = pack(&dev, &src, N, K).unwrap();
            assert_eq!(&observe(&dev, &pw, &src), want, "run {run}, {name}: output equals a clean pack");
        }
        let s = &dev.stats;
        (s.cache_hits.load(Relaxed), s.packed.load(Relaxed), s.cache_writes.load(Relaxed))
    };
    // First start: the other model's entries are evicted for this one; 3 entries fit; the
    // last two are not written (writing them would evict this model's own first weights).
    assert_eq!(start(1), (0, 5, 3), "first start: hits, packs, writes");
    assert!(PackCache::new(tmp.path(), u64::MAX).disk_bytes() <= limit);
    // Later starts hit the same three and neither write nor evict: no thrashing.
    for run in 2..4 {
        age_entries(tmp.path());
        assert_eq!(start(run), (3, 2, 0), "start {run}: hits, packs, writes");
    }
    let c = PackCache::new(tmp.path(), u64::MAX);
    let cached: Vec<bool> =
        model.iter().map(|(name, bytes)| c.load(&id_of(SocId::Rk3588, name, bytes)).is_ok()).collect();
    assert_eq!(cached, [true, true, true, false, false]);
    // A store that cannot make room says so.
    let (name, bytes) = &model[4];
    let full = PackCache::new(tmp.path(), limit).store(&id_of(SocId::Rk3588, name, bytes), &vec![0; 2 * N * K], &vec![1.0; floats]);
    assert!(matches!(full, Err(CacheError::Full { .. })), "{full:?}");
}

#[test]
fn a_store_that_eviction_cannot_make_room_for_removes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let floats = format::scale_count(N, K, 2);
    let per_entry = format::layout(N * K, floats).1 as u64;
    // A small entry of another model, unused for an hour: the only one that may be evicted.
    let small = id_of(SocId::Rk3588, "other", &weight_bytes(300, N, K));
    let small_path = PackCache::new(tmp.path(), u64::MAX).store(&small, &[7u8; 64], &vec![1.0; floats]).unwrap();
    let old = SystemTime::now() - Duration::from_secs(3600);
    fs::File::options().write(true).open(&small_path).unwrap().set_modified(old).unwrap();
    // Room for two entries and the small one; this process stores two, then a third needs a
    // whole entry freed: evicting the small one would not do, so it stays and the store is
    // refused — and so is every later store of this process, even one that would fit.
    let c = PackCache::new(tmp.path(), 2 * per_entry + 2 * format::HEADER_BYTES as u64 + 4096);
    let ids: Vec<_> = (0..3).map(|i| id_of(SocId::Rk3588, &format!("w{i}"), &weight_bytes(310 + i, N, K))).collect();
    for id in &ids[..2] {
        c.store(id, &vec![1u8; N * K], &vec![1.0; floats]).unwrap();
    }
    let third = c.store(&ids[2], &vec![1u8; N * K], &vec![1.0; floats]);
    assert!(matches!(third, Err(CacheError::Full { .. })), "{third:?}");
    assert!(small_path.exists(), "nothing evicted for a refused store");
    let tiny = c.store(&id_of(SocId::Rk3588, "tiny", &weight_bytes(320, N, K)), &[1u8; 64], &vec![1.0; floats]);
    assert!(matches!(tiny, Err(CacheError::Full { .. })), "refusals are final for the process: {tiny:?}");
}

#[test]
fn weights_outside_model_buffers_bypass_the_cache() {
    use ggml_ork::backend::weights::pack_with;
    let tmp = tempfile::tempdir().unwrap();
    let bytes = weight_bytes(400, N, K);
    let dev = cached(tmp.path());
    pack_with(&dev, &source(NAME, &bytes, K), N, K, false).unwrap();
    assert_eq!(PackCache::new(tmp.path(), u64::MAX).disk_bytes(), 0, "nothing written");
    // A valid entry is not read either.
    prime(tmp.path(), SocId::Rk3588, NAME, &bytes);
    let dev = cached(tmp.path());
    pack_with(&dev, &source(NAME, &bytes, K), N, K, false).unwrap();
    let s = &dev.stats;
    assert_eq!((s.cache_hits.load(std::sync::atomic::Ordering::Relaxed), s.packed.load(std::sync::atomic::Ordering::Relaxed)), (0, 1));
}

#[test]
fn a_store_that_would_leave_the_disk_short_writes_nothing_and_says_so() {
    let tmp = tempfile::tempdir().unwrap();
    let floats = format::scale_count(N, K, 2);
    // A reserve no filesystem has: the first store is refused as DiskFull, no temporary file
    // is left, and every later store of this cache is refused too (however small).
    let c = PackCache::new(tmp.path(), u64::MAX).with_disk_reserve(u64::MAX / 4);
    let id = id_of(SocId::Rk3588, NAME, &weight_bytes(500, N, K));
    let r = c.store(&id, &vec![1u8; N * K], &vec![1.0; floats]);
    assert!(matches!(r, Err(CacheError::DiskFull { reserve, .. }) if reserve == u64::MAX / 4), "{r:?}");
    let tiny = c.store(&id_of(SocId::Rk3588, "tiny", &weight_bytes(501, N, K)), &[1u8; 64], &vec![1.0; floats]);
    assert!(matches!(tiny, Err(CacheError::DiskFull { .. })), "refusals are final for the process: {tiny:?}");
    let files = walkdir(tmp.path());
    assert!(files.is_empty(), "nothing written: {files:?}");
    // The same store with no reserve writes the entry.
    let path = PackCache::new(tmp.path(), u64::MAX).with_disk_reserve(0).store(&id, &vec![1u8; N * K], &vec![1.0; floats]).unwrap();
    assert_eq!(walkdir(tmp.path()), vec![path]);
}

/// Every file under `dir`, sorted.
fn walkdir(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in fs::read_dir(dir).unwrap().map(|e| e.unwrap()) {
        if e.file_type().unwrap().is_dir() {
            out.extend(walkdir(&e.path()));
        } else {
            out.push(e.path());
        }
    }
    out.sort();
    out
}

/// The whole `.orkpack` file image in memory, as `format::write_file` streams it.
fn encode_file(id: &cache::Identity, quant: format::QuantParams, tiles: &[u8], scales: &[f32]) -> Vec<u8> {
    let mut f = Vec::new();
    format::write_file(&mut f, id, quant, tiles, scales).expect("writing to a Vec cannot fail");
    f
}

/// Recomputes the header checksum of a page after an edit: xxh3-64 of the page with its checksum
/// field (offset 240, FORMAT.md) read as zero.
fn reseal_header(page: &mut [u8]) {
    let mut tmp = page[..HEADER_BYTES].to_vec();
    tmp[240..248].fill(0);
    page[240..248].copy_from_slice(&twox_hash::XxHash3_64::oneshot(&tmp).to_le_bytes());
}
