//! Warm `.orkpack` load vs a plain mmap + touch of the same bytes, side by side.
//!
//! `cargo run --release --example orkpack_load [-- TOTAL_MB [ROUNDS]]` (default 256 MB, 7
//! rounds). Writes about TOTAL_MB of entries into a fresh directory under `$TMPDIR`, shaped like
//! SmolLM2-135M's weights (`[N, K]` = 576×576, 192×576, 1536×576, 576×1536, two int8 terms each,
//! as the backend stores them), reads every file once so all arms start from the page cache, then
//! runs the arms **interleaved** — each round runs every arm once, the arm order rotating from
//! round to round — and reports per-arm medians and the per-round ratios' medians:
//!
//! * `mmap + touch`: open + the cache's own mapping call (`filemap::map_file_readonly`), then
//!   read every byte of the file (u64 xor-fold, in 1 MiB pieces on the rayon pool: the same
//!   parallelism as the checksum) — the baseline of the ratio;
//! * `cache load`: `PackCache::load` of every entry — stat, open, map, parse and check the
//!   header, compare the identity, check the length, verify the payload checksum (reads every
//!   byte), then read the scales. The same files, so the same bytes as the baseline;
//! * `warm hit (pack)`: `backend::weights::pack` of every weight, exactly the backend's hit path:
//!   hash the source bytes (the key), open the entry, import both tile sets into simulator device
//!   memory while hashing each piece of the device copy, accept the checksum, read the scales.
//!   The resident weights are dropped after each round;
//! * `device memory only`: `mem_create` + `mem_destroy` of buffers of the same sizes (the page
//!   allocation every import pays, on hardware as in the simulator);
//! * `memcpy into fresh Vec`: the tiles copied into newly allocated host memory (`to_vec`).
//!
//! The figure of merit is `cache load / mmap + touch` (target ≤ 1.2).

use ggml_ork::backend::weights::pack;
use ggml_ork::backend::{Device, WeightSource};
use ggml_ork::cache::{format, Identity, PackCache};
use ggml_ork::npu::kif::{mem_flags, DomainId, KernelInterface};
use ggml_ork::npu::soc::{SocDesc, SocId};
use ggml_ork::npu::{Npu, NpuConfig, NpuKind};
use rayon::prelude::*;
use std::fs::File;
use std::hint::black_box;
use std::path::PathBuf;
use std::time::Instant;

const SHAPES: [(usize, usize); 4] = [(576, 576), (192, 576), (1536, 576), (576, 1536)];

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

struct Weight {
    n: usize,
    k: usize,
    /// Stand-in source bytes (the key hashes them; the hit path never dequantizes them).
    src: Vec<u8>,
    id: Identity,
    path: PathBuf,
    tiles_one: usize,
}

fn no_dequant(_: &[u8], _: &mut [f32]) {
    unreachable!("a cache hit never dequantizes its source")
}

fn main() {
    let mut args = std::env::args().skip(1);
    let total_mb: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(256);
    let rounds: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(7).max(1);
    let dir = std::env::temp_dir().join(format!("orkpack-bench-{}", std::process::id()));
    let cache = PackCache::new(&dir, u64::MAX);
    let npu = Npu::open(&NpuConfig { kind: NpuKind::Sim, soc: Some(SocId::Rk3588), max_cores: None, pin_cpus: vec![], wcache_budget_bytes: None, ..NpuConfig::default() })
        .expect("simulator");
    let soc: SocDesc = npu.soc().clone();

    // Entries as the backend writes them: Q8_0-sized source, two terms (hi ++ lo tiles), scales
    // [N] ++ col [K] ++ lo [N].
    let mut weights: Vec<Weight> = Vec::new();
    let mut file_bytes = 0u64;
    let mut i = 0usize;
    while file_bytes < (total_mb as u64) << 20 {
        let (n, k) = SHAPES[i % SHAPES.len()];
        let one = ggml_ork::npu::layout::tile_weight(&soc, &vec![1i8; n * k], n, k).expect("tile").bytes.len();
        let row_bytes = k / 32 * 34;
        let src: Vec<u8> = (0..n * row_bytes).map(|j| (j as u32).wrapping_mul(2_654_435_761).wrapping_add(i as u32) as u8).collect();
        let tiles: Vec<u8> = (0..2 * one).map(|j| ((j as u32).wrapping_mul(40_503).wrapping_add(i as u32) >> 3) as u8).collect();
        let scales = vec![0.01f32; format::scale_count(n, k, 2)];
        let name = format!("blk.{}.w{}", i / SHAPES.len(), i % SHAPES.len());
        let id = ggml_ork::cache::identity(&soc, 8, &src, row_bytes, &name, n, k, 2, None);
        let path = cache.store(&id, &tiles, &scales).expect("store");
        file_bytes += std::fs::metadata(&path).unwrap().len();
        weights.push(Weight { n, k, src, id, path, tiles_one: one });
        i += 1;
    }

    let (cfg, _) = ggml_ork::config::Config::from_lookup(|k| (k == "ORK_ROTATE").then(|| "0".into()));
    let dev = Device { npu: npu.clone(), vk: None, cfg: Box::leak(Box::new(cfg)), stats: Default::default(), placement: Default::default(), stream: Default::default(), cache: Some(PackCache::new(&dir, u64::MAX)), calib: None };
    let names: Vec<String> = weights.iter().map(|w| w.id.name.clone()).collect();

    let touch = || {
        for w in &weights {
            let f = File::open(&w.path).unwrap();
            let m = ggml_ork::os::filemap::map_file_readonly(&f).unwrap();
            // The same parallelism as the checksum (1 MiB pieces on the rayon pool).
            let acc = m
                .par_chunks(format::HASH_CHUNK_BYTES)
                .map(|p| p.chunks_exact(8).fold(0u64, |a, c| a ^ u64::from_le_bytes(c.try_into().unwrap())))
                .reduce(|| 0, |a, b| a ^ b);
            black_box(acc);
        }
    };
    let load = || {
        for w in &weights {
            let hit = cache.load(&w.id).expect("valid entry");
            black_box(hit.tiles().len());
            black_box(hit.scales());
        }
    };
    let warm_hit = || {
        let before = dev.stats.cache_hits.load(std::sync::atomic::Ordering::Relaxed);
        let mut kept = Vec::with_capacity(weights.len());
        for (w, name) in weights.iter().zip(&names) {
            let src = WeightSource { name, ggml_type: 8, bytes: &w.src, row_bytes: w.k / 32 * 34, to_float: &no_dequant };
            kept.push(pack(&dev, &src, w.n, w.k).expect("hit"));
        }
        let hits = dev.stats.cache_hits.load(std::sync::atomic::Ordering::Relaxed) - before;
        assert_eq!(hits as usize, weights.len(), "every weight must be a cache hit");
        drop(kept);
    };
    // A second simulator: the same device-memory model as the one `npu` runs on.
    let sim = ggml_ork::npu::kif::sim::SimKif::with_faults(soc.clone(), Default::default());
    let kif: &dyn KernelInterface = &sim;
    let alloc_only = || {
        for w in &weights {
            for _ in 0..2 {
                let bo = kif.mem_create(w.tiles_one, mem_flags::DATA, DomainId(1)).expect("mem_create");
                kif.mem_destroy(bo).expect("mem_destroy");
            }
        }
    };
    let copy_fresh = || {
        for w in &weights {
            let hit = cache.open(&w.id).expect("entry");
            black_box(hit.tiles().to_vec());
        }
    };
    touch(); // page cache warm
    warm_hit(); // first-touch effects (fingerprints, scratch buffers) out of the rounds

    type Arm<'a> = (&'static str, &'a dyn Fn());
    let arms: [Arm; 5] = [
        ("mmap + touch", &touch),
        ("cache load", &load),
        ("warm hit (pack)", &warm_hit),
        ("device memory only", &alloc_only),
        ("memcpy into fresh Vec", &copy_fresh),
    ];
    let mut times = vec![Vec::new(); arms.len()];
    for r in 0..rounds {
        for j in 0..arms.len() {
            let a = (j + r) % arms.len();
            let t = Instant::now();
            (arms[a].1)();
            times[a].push(t.elapsed().as_secs_f64() * 1e3);
        }
    }
    let tiles_mb: f64 = weights.iter().map(|w| 2 * w.tiles_one).sum::<usize>() as f64 / (1 << 20) as f64;
    let mb = file_bytes as f64 / (1 << 20) as f64;
    println!(
        "{} entries, {mb:.0} MB of files ({tiles_mb:.0} MB tiles, {}-byte header each), {rounds} interleaved rounds, {} rayon threads",
        weights.len(),
        format::HEADER_BYTES,
        rayon::current_num_threads()
    );
    println!("{:<24} {:>9} {:>9}   (median ms; GB/s of the file bytes)", "", "ms", "GB/s");
    for (a, t) in arms.iter().zip(&times) {
        let m = median(t.clone());
        println!("{:<24} {m:>9.1} {:>9.2}", a.0, mb / 1024.0 / (m / 1e3));
    }
    let ratio = |a: usize, b: usize| median(times[a].iter().zip(&times[b]).map(|(x, y)| x / y).collect());
    println!("ratio cache load / mmap + touch = {:.2} (median of per-round ratios; target <= 1.2)", ratio(1, 0));
    println!("ratio warm hit (pack) / mmap + touch = {:.2}", ratio(2, 0));
    println!("ratio warm hit (pack) / (device memory + mmap + touch) = {:.2}", median(
        (0..rounds).map(|r| times[2][r] / (times[3][r] + times[0][r])).collect()
    ));
    let per = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed) as f64 / 1e6 / (rounds + 1) as f64;
    println!(
        "warm hit split (mean per round, backend counters): source hash {:.1} ms, open + header {:.1} ms, import + verify {:.1} ms",
        per(&dev.stats.cache_hash_ns),
        per(&dev.stats.cache_read_ns),
        per(&dev.stats.cache_import_ns)
    );
    let _ = std::fs::remove_dir_all(&dir);
}
