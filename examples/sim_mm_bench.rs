//! Micro-benchmark of the simulator's int8 kernel (`matmul_tiled`) alone.
fn main() {
    let (m, k, n) = (128usize, 576usize, 1536usize);
    let a: Vec<i8> = (0..m * k).map(|i| (i * 7 % 251) as i8).collect();
    let w: Vec<i8> = (0..n * k).map(|i| (i * 13 % 241) as i8).collect();
    for threads in [1, 2] {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        let t = std::time::Instant::now();
        let c = pool.install(|| ggml_ork::npu::kif::sim::matmul_tiled(&a, &w, m, k, n));
        let dt = t.elapsed();
        println!("{threads} threads: {dt:?} {:.2} GOP/s (c0={})", 2.0 * (m * n * k) as f64 / dt.as_secs_f64() / 1e9, c[0]);
    }
}
