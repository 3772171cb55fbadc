//! Concurrent writers: two processes (children of this test binary) and two threads load the
//! same "model" into one empty cache at the same moment. Both finish with outputs equal to a
//! clean pack, and the directory ends with exactly one valid entry per weight and no temporary
//! files; a later load hits every entry.

mod cache_common;

use cache_common::*;
use ggml_ork::backend::weights::pack;
use ggml_ork::cache::{self, PackCache};
use ggml_ork::npu::soc::{SocDesc, SocId};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

const N: usize = 256;
const K: usize = 1024;
const WEIGHTS: usize = 10;

const ENV_DIR: &str = "ORK_TEST_CONCURRENT_DIR";

fn name(i: usize) -> String {
    format!("blk.{i}.ffn_down.weight")
}

/// Loads the model through the cache in `dir`; panics on any output that differs from a clean
/// pack. Returns (hits, packs).
fn load_model(dir: &Path) -> (u64, u64) {
    let dev = cached(dir);
    for i in 0..WEIGHTS {
        let bytes = weight_bytes(100 + i as u64, N, K);
        let nm = name(i);
        let src = source(&nm, &bytes, K);
        let pw = pack(&dev, &src, N, K).expect("pack");
        assert!(observe(&dev, &pw, &src) == clean(&nm, &bytes, N, K), "weight {i}: output differs from a clean pack");
    }
    let (h, p, _) = counts(&dev);
    (h, p)
}

/// The cache holds exactly one valid entry per weight and nothing else.
fn assert_one_valid_entry_each(dir: &Path) {
    let mut files = Vec::new();
    for sub in std::fs::read_dir(dir).unwrap().flatten() {
        for f in std::fs::read_dir(sub.path()).unwrap().flatten() {
            files.push(f.file_name().to_string_lossy().into_owned());
        }
    }
    assert_eq!(files.len(), WEIGHTS, "entries: {files:?}");
    assert!(files.iter().all(|f| f.ends_with(".orkpack") && !f.starts_with('.')), "{files:?}");
    let c = PackCache::new(dir, u64::MAX);
    for i in 0..WEIGHTS {
        let bytes = weight_bytes(100 + i as u64, N, K);
        let id = cache::identity(&SocDesc::get(SocId::Rk3588), GGML_TYPE_F32, &bytes, 4 * K, &name(i), N, K, 2, None);
        c.load(&id).unwrap_or_else(|e| panic!("weight {i}: {e}"));
    }
}

/// The child side: waits for the parent's start signal, then loads the model.
#[test]
#[ignore = "run by two_processes_load_the_same_model_at_once as a child process"]
fn concurrent_child() {
    let dir = std::env::var(ENV_DIR).expect("run only as a child of two_processes_load_the_same_model_at_once");
    let dir = Path::new(&dir);
    let go = dir.join("go");
    let t0 = Instant::now();
    while !go.exists() {
        assert!(t0.elapsed() < Duration::from_secs(60), "no start signal");
        std::thread::sleep(Duration::from_millis(1));
    }
    let (h, p) = load_model(&dir.join("cache"));
    println!("child {}: {h} hits, {p} packs", std::process::id());
}

#[test]
fn two_processes_load_the_same_model_at_once() {
    let tmp = tempfile::tempdir().unwrap();
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..2)
        .map(|_| {
            Command::new(&exe)
                .args(["--exact", "concurrent_child", "--ignored", "--nocapture", "--test-threads=1"])
                .env(ENV_DIR, tmp.path())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("spawn child")
        })
        .collect();
    std::fs::write(tmp.path().join("go"), b"").unwrap();
    for c in children {
        let out = c.wait_with_output().unwrap();
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "child failed:\n{text}");
        assert!(text.contains("1 passed"), "child did not run the test:\n{text}");
        eprintln!("{}", text.lines().find(|l| l.contains(" hits, ")).unwrap_or(""));
    }
    assert_one_valid_entry_each(&tmp.path().join("cache"));
    assert_eq!(load_model(&tmp.path().join("cache")), (WEIGHTS as u64, 0), "a later load hits every entry");
}

#[test]
fn two_threads_load_the_same_model_at_once() {
    let tmp = tempfile::tempdir().unwrap();
    let barrier = std::sync::Barrier::new(2);
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                barrier.wait();
                load_model(tmp.path())
            });
        }
    });
    assert_one_valid_entry_each(tmp.path());
    assert_eq!(load_model(tmp.path()), (WEIGHTS as u64, 0));
}
