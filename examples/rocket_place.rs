//! Places many weights on the `rocket` kernel interface and checks the first and the last bit
//! for bit against the scalar reference: the placement past one address space that
//! `tests/fake-kernel/test.py` checks small and docs/design.md reports large.
//!
//!     ORK_NPU=rocket ORK_FK_DOMAIN_MB=512 tests/fake-kernel/run.sh \
//!         target/release/examples/rocket_place 3300 384
//!
//! Arguments: MiB of weights to place (default 256), the product's weight cap per address space
//! in MiB (`ORK_DOMAIN_CAP_MB`; default 24). One `[N, K]` weight (N = 4096, K = 4096 by default,
//! `ORK_PLACE_NK=N,K`) is tiled once and uploaded until the total is reached; each upload is a
//! weight of its own, split into one part per core. Prints one line: `placed <MiB> in <n>
//! weights over <d> domains (<s> address spaces), resident <MiB> (<x>× one tile set), results
//! bit-exact on the first and last`. Exit status 1 if a result differs.
use std::sync::Arc;

use ggml_ork::npu::{layout, reference_mm, Budget, Npu, NpuConfig, NpuKind};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let total_mb: u64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(256);
    let cap_mb: u64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(24);
    let (n, k) = std::env::var("ORK_PLACE_NK")
        .ok()
        .and_then(|s| s.split_once(',').and_then(|(a, b)| Some((a.parse().ok()?, b.parse().ok()?))))
        .unwrap_or((4096usize, 4096usize));
    let cfg = NpuConfig {
        kind: NpuKind::Rocket,
        domain_cap_bytes: Some(cap_mb << 20),
        wcache_budget_bytes: Some(u64::MAX),
        ..NpuConfig::default()
    };
    let npu = Npu::open(&cfg).unwrap_or_else(|e| {
        eprintln!("rocket_place: {e} (run it under tests/fake-kernel/run.sh with ORK_NPU=rocket)");
        std::process::exit(2)
    });
    let w: Vec<i8> = (0..n * k).map(|i| ((i * 13 + i / k * 7) % 251) as i8).collect();
    let tw = layout::tile_weight_sets(npu.soc(), &w, n, k, npu.tile_sets(n, k)).expect("tile");
    let one = tw.bytes.len() as u64;
    let mut placed: Vec<Arc<ggml_ork::npu::ResidentWeight>> = Vec::new();
    while (placed.len() as u64) * one < total_mb << 20 {
        match npu.upload(&tw) {
            Ok(r) => placed.push(r),
            Err(e) => {
                eprintln!("rocket_place: upload {} failed: {e}", placed.len());
                std::process::exit(1)
            }
        }
    }
    let m = 7;
    let a: Vec<i8> = (0..m * k).map(|i| ((i * 31) % 255) as i8).collect();
    let want = reference_mm(&a, &w, m, k, n);
    let mut ok = true;
    for r in [placed.first().unwrap(), placed.last().unwrap()] {
        let mut c = vec![0i32; m * n];
        let st = npu.mm_run(r, &a, m, &mut c, Budget::default()).expect("mm_run");
        ok &= c == want && st.cores == 3;
    }
    let domains = npu.domain_usage().len();
    let resident: u64 = placed.iter().map(|r| r.resident_bytes()).sum();
    println!(
        "placed {} MiB in {} weights over {domains} domains ({} address spaces), resident {} MiB ({:.3}× one tile set, {} copies), results {} on the first and last",
        (placed.len() as u64 * one) >> 20,
        placed.len(),
        domains * 3,
        resident >> 20,
        resident as f64 / (placed.len() as u64 * one) as f64,
        npu.weight_copies(),
        if ok { "bit-exact on 3 cores" } else { "WRONG" }
    );
    std::process::exit(if ok { 0 } else { 1 })
}
