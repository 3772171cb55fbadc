//! Times the Vulkan decode GEMV for a few SmolLM2-135M decode shapes and prints GB/s of weight
//! bytes streamed (the figure that matters for memory-bound decode).
//!
//! `cargo run --example vk_gemv_bench` — device from `ORK_VK_DEVICE` (default here: llvmpipe, so
//! the numbers are lavapipe's; on the board run with `ORK_VK_DEVICE=Mali`).
//! Shapes are `K×N` (reduction × output channels): 576×1536 (FFN up/gate), 1536×576 (FFN down),
//! 576×49152 (output head). Q4_K needs K % 256 == 0, so it runs only where K allows.

use std::time::{Duration, Instant};

use ggml_ork::vk::{VkEngine, VkWeightData};

fn main() {
    // ORK_VK_DEVICE as the plugin parses it, else lavapipe.
    let cfg = ggml_ork::config::Config::from_lookup(|k| std::env::var(k).ok()).0;
    let device = cfg.vk_device.as_deref().unwrap_or("llvmpipe");
    let engine = VkEngine::open(Some(device)).expect("VkEngine::open").expect("no Vulkan device");
    println!("device: {}", engine.device_name());
    println!("{:>6} {:>6} {:>6} {:>2} {:>10} {:>10} {:>8}", "format", "K", "N", "M", "MiB", "us/call", "GB/s");
    let min_time = Duration::from_millis(
        std::env::var("ORK_BENCH_MS").ok().and_then(|v| v.parse().ok()).unwrap_or(1000),
    );
    let mut seed = 0x1234_5678u32;
    let mut rnd = move || {
        seed ^= seed << 13;
        seed ^= seed >> 17;
        seed ^= seed << 5;
        seed
    };
    for (k, n) in [(576usize, 1536usize), (1536, 576), (576, 49152)] {
        let i8w: Vec<i8> = (0..n * k).map(|_| rnd() as i8).collect();
        let scale: Vec<f32> = (0..n).map(|_| 0.01).collect();
        let q4_0: Vec<u8> = (0..n * k / 32 * 18).map(|i| if i % 18 == 1 { 0x20 } else { rnd() as u8 }).collect();
        let q4k: Vec<u8> = (0..n * k / 256 * 144).map(|i| if i % 144 == 1 || i % 144 == 3 { 0x20 } else { rnd() as u8 }).collect();
        let mut formats: Vec<(&str, VkWeightData<'_>, usize)> = vec![
            ("int8", VkWeightData::I8 { w: &i8w, scale: &scale }, n * k + 4 * n),
            ("q4_0", VkWeightData::Q4_0(&q4_0), q4_0.len()),
        ];
        if k % 256 == 0 {
            formats.push(("q4_k", VkWeightData::Q4K(&q4k), q4k.len()));
        }
        for (name, data, bytes) in formats {
            let w = engine.upload(data, n, k).expect("upload");
            for m in [1usize, 4] {
                let x: Vec<f32> = (0..m * k).map(|_| (rnd() % 2000) as f32 / 1000.0 - 1.0).collect();
                let mut y = vec![0f32; m * n];
                engine.gemv(&w, &x, m, &mut y).expect("gemv"); // warm-up (first use)
                let t0 = Instant::now();
                let mut calls = 0u32;
                while t0.elapsed() < min_time || calls < 3 {
                    engine.gemv(&w, &x, m, &mut y).expect("gemv");
                    calls += 1;
                }
                let per = t0.elapsed().as_secs_f64() / calls as f64;
                println!(
                    "{name:>6} {k:>6} {n:>6} {m:>2} {:>10.2} {:>10.1} {:>8.2}",
                    bytes as f64 / (1 << 20) as f64,
                    per * 1e6,
                    bytes as f64 / per / 1e9
                );
            }
        }
    }
}
