//! Warm `.orkpack` load vs a plain mmap + touch of the same bytes, side by side.
//!
//! `cargo run --release --example orkpack_load [-- TOTAL_MB]` (default 256). Writes TOTAL_MB of
//! entries (2048×2048 int8 weights) into a fresh directory under `$TMPDIR`, reads them once so
//! both sides start from the page cache, then times (median of 5 rounds):
//!
//! * `cache load`: `PackCache::load` for every entry — open, mmap, parse and check the header,
//!   compare the identity, verify the payload checksum (reads every byte), read the scales;
//! * `+ import`: the same plus `Npu::upload_bytes` of the tiles (the simulator's `mem_import`
//!   copies once into device memory; on rknpu/rocket it can import the mapping);
//! * `mmap + touch`: open + the same mapping call, then read every byte (u64 xor-fold);
//! * `mmap + page touch`: open + mapping, one byte per 4 KiB page.
//!
//! The figure of merit is `cache load / mmap + touch` (target ≤ 1.2).

use ggml_ork::cache::{format, Identity, PackCache};
use ggml_ork::npu::soc::SocId;
use ggml_ork::npu::{Npu, NpuConfig, NpuKind};
use std::fs::File;
use std::hint::black_box;
use std::time::Instant;

const N: usize = 2048;
const K: usize = 2048;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn time(rounds: usize, mut f: impl FnMut()) -> f64 {
    median((0..rounds).map(|_| {
        let t = Instant::now();
        f();
        t.elapsed().as_secs_f64() * 1e3
    }).collect())
}

fn main() {
    let total_mb: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(256);
    let count = (total_mb << 20).div_ceil(N * K).max(1);
    let dir = std::env::temp_dir().join(format!("orkpack-bench-{}", std::process::id()));
    let cache = PackCache::new(&dir, u64::MAX);
    let npu = Npu::open(&NpuConfig { kind: NpuKind::Sim, soc: Some(SocId::Rk3588), max_cores: None, pin_cpus: vec![], wcache_budget_bytes: None })
        .expect("simulator");
    let soc = npu.soc().clone();

    // Entries hold tiles in the NPU's own layout (K > 1024 adds the full-K companion).
    let tile_bytes = Npu::tile_weight(&soc, &vec![1i8; N * K], N, K).expect("tile").bytes.len();
    let mut ids: Vec<Identity> = Vec::new();
    let mut paths = Vec::new();
    for i in 0..count {
        let tiles: Vec<u8> = (0..tile_bytes).map(|j| (j as u32).wrapping_mul(2_654_435_761).wrapping_add(i as u32) as u8 >> 1).collect();
        let scales = vec![0.01f32; ggml_ork::cache::format::scale_count(N, K, 1)];
        let id = ggml_ork::cache::identity(&soc, 8, &tiles, K, &format!("blk.{i}.w"), N, K, 1);
        paths.push(cache.store(&id, &tiles, &scales).expect("store"));
        ids.push(id);
    }
    let bytes: u64 = paths.iter().map(|p| std::fs::metadata(p).unwrap().len()).sum();

    let load = || {
        for id in &ids {
            let hit = cache.load(id).expect("valid entry");
            black_box(hit.tiles().len());
            black_box(hit.scales());
        }
    };
    let load_import = || {
        for id in &ids {
            let hit = cache.load(id).expect("valid entry");
            black_box(npu.upload_bytes(N, K, hit.tiles()).expect("import"));
            black_box(hit.scales());
        }
    };
    let touch = || {
        for p in &paths {
            let f = File::open(p).unwrap();
            let m = ggml_ork::npu::kif::filemap::map_file_readonly(&f).unwrap();
            let mut acc = 0u64;
            for c in m.chunks_exact(8) {
                acc ^= u64::from_le_bytes(c.try_into().unwrap());
            }
            black_box(acc);
        }
    };
    let page_touch = || {
        for p in &paths {
            let f = File::open(p).unwrap();
            let m = ggml_ork::npu::kif::filemap::map_file_readonly(&f).unwrap();
            black_box(m.iter().step_by(4096).fold(0u8, |a, &b| a ^ b));
        }
    };
    touch(); // page cache warm

    let rounds = 5;
    let t_load = time(rounds, load);
    let t_import = time(rounds, load_import);
    let t_touch = time(rounds, touch);
    let t_page = time(rounds, page_touch);
    let mb = bytes as f64 / (1 << 20) as f64;
    println!("{count} entries, {mb:.0} MB ({}-byte header each), {} rayon threads", format::HEADER_BYTES, rayon::current_num_threads());
    println!("{:<22} {:>9} {:>9}", "", "ms", "GB/s");
    for (what, t) in [("cache load", t_load), ("cache load + import", t_import), ("mmap + touch", t_touch), ("mmap + page touch", t_page)] {
        println!("{what:<22} {t:>9.1} {:>9.2}", mb / 1024.0 / (t / 1e3));
    }
    println!("ratio cache load / mmap + touch = {:.2}", t_load / t_touch);
    println!("ratio cache load + import / mmap + touch = {:.2}", t_import / t_touch);
    let _ = std::fs::remove_dir_all(&dir);
}
