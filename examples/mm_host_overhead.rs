//! The host's part of one NPU matmul under the timed simulator (`ORK_SIM_TIMING=board`): wall
//! time of `Npu::mm_run` against the modelled device time per core, for the Qwen3-1.7B shapes.
//!
//!   cargo run --release --example mm_host_overhead [M]
use ggml_ork::npu::{layout, Budget, Npu, NpuConfig, NpuKind};
fn main() {
    let m: usize = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(512);
    let cfg = NpuConfig { kind: NpuKind::Sim, sim_board_timing: true, ..NpuConfig::default() };
    let npu = Npu::open(&cfg).expect("sim");
    for (n, k) in [(2048usize, 2048usize), (1024, 2048), (6144, 2048), (2048, 6144)] {
        let w: Vec<i8> = (0..n * k).map(|i| (i * 13 % 241) as i8).collect();
        let tw = layout::tile_weight_sets(npu.soc(), &w, n, k, npu.tile_sets(n, k)).unwrap();
        let rw = npu.upload(&tw).unwrap();
        let a: Vec<i8> = (0..m * k).map(|i| (i * 7 % 251) as i8).collect();
        let mut c = vec![0i32; m * n];
        let cores = npu.cores();
        let _ = npu.mm_run(&rw, &a, m, &mut c, Budget { max_cores: cores });
        let mut best = (f64::MAX, 0f64, 0u32);
        for _ in 0..std::env::args().nth(2).and_then(|s| s.parse().ok()).unwrap_or(5) {
            let t = std::time::Instant::now();
            let rs = npu.mm_run(&rw, &a, m, &mut c, Budget { max_cores: cores }).unwrap();
            let wall = t.elapsed().as_secs_f64() * 1e3;
            let dev = rs.device_ns as f64 / 1e6 / rs.cores as f64;
            if wall - dev < best.0 - best.1 {
                best = (wall, dev, rs.submits);
            }
        }
        println!("N={n} K={k} M={m}: wall {:.2} ms, device per core {:.2} ms, host {:.2} ms ({:.2}x), {} submits", best.0, best.1, best.0 - best.1, (best.0 - best.1) / best.1, best.2);
    }
}
