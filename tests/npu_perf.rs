//! Throughput smoke of the simulator on SmolLM-135M-like prefill shapes (ignored by default;
//! run with `cargo test --test npu_perf -- --ignored --nocapture`). Still checks bit-exactness.
mod common;

use common::{rk3588, sim_npu, Rng};
use ggml_ork::npu::kif::sim::SimFaults;
use ggml_ork::npu::{reference_mm, Budget};

#[test]
#[ignore]
fn smollm135m_prefill_shapes() {
    let (_sim, npu) = sim_npu(rk3588(), SimFaults::default());
    let mut rng = Rng::new(9);
    let m = 128;
    for (n, k) in [(576, 576), (192, 576), (1536, 576), (576, 1536), (49152, 576)] {
        let w = rng.i8s(n * k);
        let rw = npu.upload(&ggml_ork::npu::layout::tile_weight(npu.soc(), &w, n, k).unwrap()).unwrap();
        let a = rng.i8s(m * k);
        let mut c = vec![0; m * n];
        let t = std::time::Instant::now();
        let st = npu.mm_run(&rw, &a, m, &mut c, Budget { max_cores: 3 }).unwrap();
        let dt = t.elapsed();
        let gops = 2.0 * (m * n * k) as f64 / dt.as_secs_f64() / 1e9;
        println!("M={m} K={k} N={n}: {dt:?} ({gops:.1} GOP/s), {st:?}");
        if n * k <= 1536 * 576 {
            assert_eq!(c, reference_mm(&a, &w, m, k, n));
        }
    }
}
