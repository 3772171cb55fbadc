//! Host-side benchmarks of the W8A8 arithmetic around an NPU matmul, each reported as a **ratio
//! measured in one run** against a baseline timed in the same rounds (this machine is shared and
//! noisy, so absolute times are not comparable between runs, but a paired ratio is).
//!
//! `cargo run --release --example bench_host` (or `bash bench-scripts/host_bench.sh`).
//!
//! What it measures (issue "Benchmarks here and the on-board kit"):
//! 1. Activation quantization f32 → int8 per row, `quant::quantize_rows` and the two-term
//!    `quant::quantize_rows_split`, vs a `memcpy` of the same input bytes (`M·K·4`). Target: the
//!    quantizer reaches ≥ 70 % of memcpy's throughput (ratio = t_memcpy / t_op).
//! 2. The same quantizers vs ggml-cpu's own activation quantizer, Q8_0 `from_float` from the CPU
//!    backend's type traits, on the same rows, one call per row as ggml's MUL_MAT does. Target:
//!    ours at least as fast (ratio = t_ggml / t_ours ≥ 1).
//! 3. Output dequantization int32 → f32, `quant::dequantize_output` and
//!    `quant::dequantize_output_split`, vs a `memcpy` of the same input bytes (`M·N·4`, or
//!    `2M·N·4` for the split form). Target ≥ 70 %.
//! 4. Weight packing (to_float → column-equalised per-channel int8 → tile, one term:
//!    `pack::pack_source`, the backend's packing, which quantizes and tiles each
//!    32-row block while it is in cache; before commit bd138d2 the separate
//!    `quantize_source` + `npu::npu::layout::tile_weight`, same bytes) in GB/s of int8 weight
//!    produced per core (target ≥ 1 GB/s), and its speed-up on all cores (target ≥ 1.8× on 2).
//! 5. The calibrated correction's host cost per token inside the fused passes the backend runs
//!    (the K-dot in `quant::prepare_rows`, the N multiply-adds in `quant::dequantize_fused`, each
//!    timed with and without in the same rounds, the fastest round of each: a difference of two
//!    medians on a loaded machine is mostly other processes' noise) against the rotated
//!    activation path of the same rows (target ≤ 5 %); the output pass before (dequantize, then `correct_along` as a pass of
//!    its own) and after (fused); the activation path before (copy, serial rotation,
//!    `quantize_rows`) and after (`prepare_rows`), and `prepare_rows` on every core vs one. Then
//!    the same cost per prefill token of one whole layer of SmolLM2-135M and of Qwen3-1.7B (one
//!    activation pass and dot per distinct activation, one output pass per weight).
//!
//! Everything in 1–3 runs in a one-thread rayon pool: the comparison is per core, the way ggml-cpu
//! quantizes its share of rows on each of its threads.
//!
//! ggml-cpu is reached by dlopen of `$LLAMA_BIN/libggml-cpu.so` (or `ORK_GGML_CPU_LIB`) with
//! `libloading` and dlsym of `ggml_get_type_traits_cpu`; the `struct ggml_type_traits_cpu` layout is
//! the pinned b11549 `ggml/include/ggml-cpu.h`. Packing dequantizes with ggml-base's
//! `ggml_get_type_traits(Q8_0)->to_float`, as the plugin does inside llama.cpp. The unsafe code for
//! those calls lives in this file (bench code, not library code), each block with its SAFETY note.
//! Without the library the ggml comparison is reported as skipped and packing uses an f32 source.
//!
//! Knobs: `ORK_BENCH_ROUNDS` (paired rounds, default 41; the median is reported),
//! `ORK_BENCH_SAMPLE_MS` (time per sample, default 1: on a shared, loaded machine a sample much
//! shorter than a scheduler time slice is rarely preempted, and the median discards those that
//! are; 3 ms samples gave ratios off by 2-3× at load 8 on 2 cores), `ORK_BENCH_ONLY` (comma list of the
//! sections to run: `quant`, `dequant`, `pack`, `mean`; default all).

use std::ffi::c_void;
use std::hint::black_box;
use std::path::PathBuf;
use std::time::Instant;

use ggml_ork::pack::{pack_source, WeightSource};
use ggml_ork::npu::soc::{SocDesc, SocId};
use ggml_ork::quant;

/// ggml type id of Q8_0 (ggml.h `GGML_TYPE_Q8_0`).
const GGML_TYPE_Q8_0: i32 = 8;
/// Q8_0 block: 32 values, one f16 scale + 32 int8 (ggml-common.h `block_q8_0`).
const QK8_0: usize = 32;
const Q8_0_BLOCK_BYTES: usize = 34;

type FromFloat = unsafe extern "C" fn(x: *const f32, y: *mut c_void, k: i64);
type ToFloat = unsafe extern "C" fn(x: *const c_void, y: *mut f32, k: i64);

/// `struct ggml_type_traits_cpu` (ggml-cpu.h, b11549).
#[repr(C)]
struct TypeTraitsCpu {
    from_float: Option<FromFloat>,
    vec_dot: *const c_void,
    vec_dot_type: i32,
    nrows: i64,
}

/// `struct ggml_type_traits` (ggml.h, b11549).
#[repr(C)]
struct TypeTraits {
    type_name: *const std::ffi::c_char,
    blck_size: i64,
    blck_size_interleave: i64,
    type_size: usize,
    is_quantized: bool,
    to_float: Option<ToFloat>,
    from_float_ref: *const c_void,
}

/// ggml's Q8_0 row quantizer and dequantizer, with the libraries kept loaded.
struct GgmlQ8 {
    from_float: FromFloat,
    to_float: ToFloat,
    _cpu: libloading::Library,
    _base: libloading::Library,
}

fn load_ggml() -> Result<GgmlQ8, String> {
    let cpu_path = match std::env::var_os("ORK_GGML_CPU_LIB") {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(std::env::var_os("LLAMA_BIN").ok_or("LLAMA_BIN is not set")?).join("libggml-cpu.so"),
    };
    let base_path = cpu_path.with_file_name("libggml-base.so");
    // SAFETY: loading the pinned ggml build; its initialisers only set up ggml's own tables.
    let base = unsafe { libloading::Library::new(&base_path) }.map_err(|e| format!("{}: {e}", base_path.display()))?;
    // SAFETY: as above; libggml-cpu.so finds libggml-base.so.0 through its RUNPATH or the one
    // already loaded.
    let cpu = unsafe { libloading::Library::new(&cpu_path) }.map_err(|e| format!("{}: {e}", cpu_path.display()))?;
    // SAFETY: the symbols and signatures of ggml-cpu.h / ggml.h at b11549:
    // `void ggml_cpu_init(void)`, `const struct ggml_type_traits_cpu * ggml_get_type_traits_cpu(enum ggml_type)`,
    // `const struct ggml_type_traits * ggml_get_type_traits(enum ggml_type)`.
    unsafe {
        let init: libloading::Symbol<unsafe extern "C" fn()> = cpu.get(b"ggml_cpu_init\0").map_err(|e| e.to_string())?;
        init();
        let get_cpu: libloading::Symbol<unsafe extern "C" fn(i32) -> *const TypeTraitsCpu> =
            cpu.get(b"ggml_get_type_traits_cpu\0").map_err(|e| e.to_string())?;
        let get_base: libloading::Symbol<unsafe extern "C" fn(i32) -> *const TypeTraits> =
            base.get(b"ggml_get_type_traits\0").map_err(|e| e.to_string())?;
        // SAFETY: both return pointers into static tables, valid while the libraries are loaded.
        let tc = get_cpu(GGML_TYPE_Q8_0).as_ref().ok_or("no Q8_0 cpu traits")?;
        let tb = get_base(GGML_TYPE_Q8_0).as_ref().ok_or("no Q8_0 traits")?;
        if tb.blck_size != QK8_0 as i64 || tb.type_size != Q8_0_BLOCK_BYTES {
            return Err(format!("unexpected Q8_0 traits: block {} size {}", tb.blck_size, tb.type_size));
        }
        Ok(GgmlQ8 {
            from_float: tc.from_float.ok_or("Q8_0 has no from_float")?,
            to_float: tb.to_float.ok_or("Q8_0 has no to_float")?,
            _cpu: cpu,
            _base: base,
        })
    }
}

impl GgmlQ8 {
    /// Quantizes `x: [rows, k] f32` to Q8_0 rows of `k/32·34` bytes, one call per row.
    fn quantize(&self, x: &[f32], rows: usize, k: usize, y: &mut [u8]) {
        let rb = k / QK8_0 * Q8_0_BLOCK_BYTES;
        assert!(k % QK8_0 == 0 && x.len() == rows * k && y.len() == rows * rb);
        for r in 0..rows {
            // SAFETY: row r of x has k floats; row r of y has room for k/32 Q8_0 blocks.
            unsafe { (self.from_float)(x[r * k..].as_ptr(), y[r * rb..].as_mut_ptr().cast(), k as i64) };
        }
    }

    /// Dequantizes one Q8_0 row of `out.len()` values.
    fn dequantize_row(&self, row: &[u8], out: &mut [f32]) {
        assert_eq!(row.len(), out.len() / QK8_0 * Q8_0_BLOCK_BYTES);
        // SAFETY: `row` holds out.len()/32 whole blocks; `out` has room for them.
        unsafe { (self.to_float)(row.as_ptr().cast(), out.as_mut_ptr(), out.len() as i64) };
    }
}

// ------------------------------------------------------------------------------- timing

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let n = v.len();
    if n % 2 == 1 { v[n / 2] } else { 0.5 * (v[n / 2 - 1] + v[n / 2]) }
}

/// Seconds per call of `f`, over `iters` calls.
fn per_call(f: &mut dyn FnMut(), iters: usize) -> f64 {
    let t = Instant::now();
    for _ in 0..iters {
        f();
    }
    t.elapsed().as_secs_f64() / iters as f64
}

/// How many calls fill about `sample_s` seconds.
fn calibrate(f: &mut dyn FnMut(), sample_s: f64) -> usize {
    f(); // warm caches and allocations
    let mut iters = 1usize;
    loop {
        let t = per_call(f, iters) * iters as f64;
        if t >= sample_s / 4.0 || iters >= 1 << 24 {
            return ((iters as f64 * sample_s / t.max(1e-9)).ceil() as usize).max(1);
        }
        iters *= 4;
    }
}

/// Paired timing: each round times `base` then `op` (alternating order) and records
/// `t_base / t_op`. Returns (median s/call base, median s/call op, median ratio).
fn paired(base: &mut dyn FnMut(), op: &mut dyn FnMut(), rounds: usize, sample_s: f64) -> (f64, f64, f64) {
    let (b, o, r, _) = paired_best(base, op, rounds, sample_s);
    (b, o, r)
}

/// [`paired`] plus the ratio of the two best (smallest) times over all rounds: what the
/// comparison gives when neither side was slowed by other load at some point of the run.
fn paired_best(base: &mut dyn FnMut(), op: &mut dyn FnMut(), rounds: usize, sample_s: f64) -> (f64, f64, f64, f64) {
    let (b, o, r, mb, mo) = paired_min(base, op, rounds, sample_s);
    (b, o, r, mb / mo)
}

/// [`paired`] plus the smallest time of each side over all rounds (s/call): on a loaded machine
/// a small difference of two medians is mostly other processes' noise, the minima are the work.
fn paired_min(base: &mut dyn FnMut(), op: &mut dyn FnMut(), rounds: usize, sample_s: f64) -> (f64, f64, f64, f64, f64) {
    let ib = calibrate(base, sample_s);
    let io = calibrate(op, sample_s);
    let (mut tb, mut to, mut r) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..rounds {
        let (b, o) = if i % 2 == 0 {
            let b = per_call(base, ib);
            (b, per_call(op, io))
        } else {
            let o = per_call(op, io);
            (per_call(base, ib), o)
        };
        tb.push(b);
        to.push(o);
        r.push(b / o);
    }
    let best = |v: &[f64]| v.iter().cloned().fold(f64::INFINITY, f64::min);
    let (mb, mo) = (best(&tb), best(&to));
    (median(tb), median(to), median(r), mb, mo)
}

/// Hidden-state-like data: mostly small, a few outlier channels (as in LLM activations).
fn activations(len: usize, k: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|i| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let u = (s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0;
            if (i % k) % 97 == 3 { u * 40.0 } else { u }
        })
        .collect()
}

struct Row {
    name: String,
    value: f64,
    unit: &'static str,
    target: &'static str,
    ok: Option<bool>,
    detail: String,
}

impl Row {
    /// Ours against `memcpy` of the same input bytes: `r` = memcpy time / our time (target 70 %).
    fn vs_memcpy(name: String, r: f64, detail: String) -> Row {
        Row { name, value: r * 100.0, unit: "%", target: "≥ 70 %", ok: Some(r >= 0.70), detail }
    }

    /// The calibrated correction's cost against the activation path's (target ≤ 5 %).
    fn correction_share(name: String, cost: f64, act: f64, detail: String) -> Row {
        Row { name, value: cost / act * 100.0, unit: "%", target: "≤ 5 %", ok: Some(cost <= 0.05 * act), detail }
    }

    /// Ours against ggml-cpu's quantizer: `r` = ggml time / our time (target: at least as fast).
    /// A ratio reported without a target: `r` = first time / second time.
    fn info(name: String, r: f64, detail: String) -> Row {
        Row { name, value: r, unit: "×", target: "—", ok: None, detail }
    }

    fn vs_ggml(name: String, r: f64, detail: String) -> Row {
        Row { name, value: r, unit: "×", target: "≥ 1.0×", ok: Some(r >= 1.0), detail }
    }
}

fn verdict(ok: Option<bool>) -> &'static str {
    match ok {
        Some(true) => "met",
        Some(false) => "MISSED",
        None => "info",
    }
}

/// The default activation path of `x: [M, K]`: every row rotated (into `xr`), then one int8 term.
fn rotate_quantize(rot: &ggml_ork::quant::rotate::Rotation, x: &[f32], m: usize, xr: &mut [f32], q: &mut [i8], s: &mut [f32]) {
    xr.copy_from_slice(x);
    for row in xr.chunks_mut(rot.k()) {
        rot.apply_row(row);
    }
    quant::quantize_rows(xr, m, rot.k(), q, s);
}

/// A weight's source bytes for the benchmarks: ggml's Q8_0 of `w: [N, K]` when ggml-cpu is loaded,
/// else `w` as f32.
fn source_bytes(ggml: Option<&GgmlQ8>, w: &[f32], n: usize, k: usize) -> Vec<u8> {
    match ggml {
        Some(g) => {
            let mut b = vec![0u8; n * k / QK8_0 * Q8_0_BLOCK_BYTES];
            g.quantize(w, n, k, &mut b);
            b
        }
        None => bytemuck::cast_slice(w).to_vec(),
    }
}

/// Dequantizes one f32 source row (the bytes are the values).
fn f32_row(row: &[u8], out: &mut [f32]) {
    out.copy_from_slice(bytemuck::cast_slice(row));
}

/// The [`WeightSource`] over [`source_bytes`]' bytes, and its type's name.
fn weight_source<'a>(q8: bool, bytes: &'a [u8], k: usize, q8_row: &'a (dyn Fn(&[u8], &mut [f32]) + Sync), f32_row: &'a (dyn Fn(&[u8], &mut [f32]) + Sync)) -> (WeightSource<'a>, &'static str) {
    if q8 {
        (WeightSource { name: "", ggml_type: GGML_TYPE_Q8_0 as u32, bytes, row_bytes: k / QK8_0 * Q8_0_BLOCK_BYTES, to_float: q8_row }, "Q8_0")
    } else {
        (WeightSource { name: "", ggml_type: 0, bytes, row_bytes: k * 4, to_float: f32_row }, "f32")
    }
}

fn main() {
    let rounds = env_usize("ORK_BENCH_ROUNDS", 41).max(1);
    let sample_s = env_usize("ORK_BENCH_SAMPLE_MS", 1) as f64 / 1e3;
    let ncpu = std::thread::available_parallelism().map_or(1, |n| n.get());
    let ggml = match load_ggml() {
        Ok(g) => Some(g),
        Err(e) => {
            println!("ggml-cpu not loaded ({e}): the ggml comparison is SKIPPED, packing uses an f32 source");
            None
        }
    };
    println!(
        "bench_host: {rounds} paired rounds of ~{:.0} ms samples, medians; {ncpu} CPUs online; host {}",
        sample_s * 1e3,
        std::env::consts::ARCH
    );
    let one = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
    let mut rows: Vec<Row> = Vec::new();
    let only = std::env::var("ORK_BENCH_ONLY").unwrap_or_default();
    let section = |name: &str| only.is_empty() || only.split(',').any(|s| s.trim() == name);

    // 1 + 2. activation quantization (K = SmolLM2 hidden 576 / FFN 1536; M = decode, ubatch).
    let quant_shapes: &[(usize, usize)] = if section("quant") { &[(1, 576), (64, 576), (64, 1536), (64, 2048), (512, 576)] } else { &[] };
    for &(m, k) in quant_shapes {
        let x = activations(m * k, k, (m * 31 + k) as u64);
        let src_bytes: Vec<u8> = bytemuck::cast_slice(&x).to_vec();
        let mut copy = vec![0u8; src_bytes.len()];
        let mut q = vec![0i8; m * k];
        let mut s = vec![0f32; m];
        let mut q2 = vec![0i8; 2 * m * k];
        let mut s2 = vec![0f32; 2 * m];
        let mut gq = vec![0u8; m * k / QK8_0 * Q8_0_BLOCK_BYTES];
        let rot = ggml_ork::quant::rotate::Rotation::new(k).expect("a rotation of K");
        let mut xr = vec![0f32; m * k];
        let (mut qr, mut sr) = (vec![0i8; m * k], vec![0f32; m]);
        one.install(|| {
            let mut memcpy = || {
                copy.copy_from_slice(black_box(&src_bytes));
                black_box(&mut copy);
            };
            let mut plain = || {
                quant::quantize_rows(black_box(&x), m, k, &mut q, &mut s);
                black_box(&mut q);
            };
            let mut split = || {
                quantize_rows_terms(black_box(&x), m, k, 2, &mut q2, &mut s2);
                black_box(&mut q2);
            };
            // The default activation path: rotate every row, then one int8 term.
            let mut rotated = || {
                rotate_quantize(&rot, black_box(&x), m, &mut xr, &mut qr, &mut sr);
                black_box(&mut qr);
            };
            let gbs = |t: f64| format!("{:.2} GB/s of f32 in", (m * k * 4) as f64 / t / 1e9);
            let (_, t, r) = paired(&mut memcpy, &mut plain, rounds, sample_s);
            rows.push(Row::vs_memcpy(format!("quantize_rows M={m} K={k} vs memcpy"), r, gbs(t)));
            let (_, t, r) = paired(&mut memcpy, &mut split, rounds, sample_s);
            rows.push(Row::vs_memcpy(format!("quantize_rows_split M={m} K={k} vs memcpy"), r, gbs(t)));
            let (tp, tr, r) = paired(&mut plain, &mut rotated, rounds, sample_s);
            rows.push(Row::info(
                format!("rotate + quantize_rows M={m} K={k} vs quantize_rows"),
                r,
                format!("rotated {:.2} µs/row, plain {:.2} µs/row ({})", tr * 1e6 / m as f64, tp * 1e6 / m as f64, rot.describe()),
            ));
            if let Some(g) = &ggml {
                let mut theirs = || {
                    g.quantize(black_box(&x), m, k, &mut gq);
                    black_box(&mut gq);
                };
                let us = |to: f64, tg: f64| format!("ours {:.1} µs, ggml {:.1} µs", to * 1e6, tg * 1e6);
                let (tg, to, r) = paired(&mut theirs, &mut plain, rounds, sample_s);
                rows.push(Row::vs_ggml(format!("quantize_rows M={m} K={k} vs ggml-cpu Q8_0 from_float"), r, us(to, tg)));
                let (tg, to, r) = paired(&mut theirs, &mut split, rounds, sample_s);
                rows.push(Row::vs_ggml(format!("quantize_rows_split M={m} K={k} vs ggml-cpu Q8_0 from_float"), r, us(to, tg)));
                let (tg, to, r) = paired(&mut theirs, &mut rotated, rounds, sample_s);
                rows.push(Row::vs_ggml(format!("rotate + quantize_rows M={m} K={k} vs ggml-cpu Q8_0 from_float"), r, us(to, tg)));
            }
        });
    }

    // 3. output dequantization (N = FFN 1536 / hidden 576).
    let dequant_shapes: &[(usize, usize)] = if section("dequant") { &[(1, 1536), (64, 1536), (64, 576), (512, 1536)] } else { &[] };
    for &(m, n) in dequant_shapes {
        let c: Vec<i32> = (0..2 * m * n).map(|i| ((i as i64 * 2654435761) % 200_001 - 100_000) as i32).collect();
        let a_scale: Vec<f32> = (0..2 * m).map(|i| 1e-3 + i as f32 * 1e-6).collect();
        let w_scale: Vec<f32> = (0..n).map(|i| 2e-3 + i as f32 * 1e-7).collect();
        let mut dst = vec![0f32; m * n];
        for split in [false, true] {
            let in_rows = if split { 2 * m } else { m };
            let src_bytes: Vec<u8> = bytemuck::cast_slice(&c[..in_rows * n]).to_vec();
            let mut copy = vec![0u8; src_bytes.len()];
            one.install(|| {
                let mut memcpy = || {
                    copy.copy_from_slice(black_box(&src_bytes));
                    black_box(&mut copy);
                };
                let mut op = || {
                    if split {
                        dequantize_output_terms(black_box(&c[..2 * m * n]), &a_scale, 2, &w_scale, &mut dst);
                    } else {
                        dequantize_output(black_box(&c[..m * n]), &a_scale[..m], &w_scale, &mut dst);
                    }
                    black_box(&mut dst);
                };
                let (_, t, r) = paired(&mut memcpy, &mut op, rounds, sample_s);
                let f = if split { "dequantize_output_split" } else { "dequantize_output" };
                let detail = format!("{:.2} GB/s of i32 in", (in_rows * n * 4) as f64 / t / 1e9);
                rows.push(Row::vs_memcpy(format!("{f} M={m} N={n} vs memcpy"), r, detail));
            });
        }
    }

    // 4. packing: to_float → column-equalised per-channel int8 → tile, 1 core vs all cores.
    let soc = SocDesc::get(SocId::Rk3588);
    let pack_rounds = (rounds / 3).max(3);
    let pack_shapes: &[(usize, usize)] = if section("pack") { &[(1536, 576), (2048, 2048)] } else { &[] };
    for &(n, k) in pack_shapes {
        let w = activations(n * k, k, 77 + n as u64);
        let bytes = source_bytes(ggml.as_ref(), &w, n, k);
        let (q8_row, f32_row) = (|row: &[u8], out: &mut [f32]| ggml.as_ref().unwrap().dequantize_row(row, out), f32_row);
        let (src, what) = weight_source(ggml.is_some(), &bytes, k, &q8_row, &f32_row);
        let pack = || {
            black_box(pack_source(&soc, &src, n, k, 1, None).expect("pack_source"));
        };
        let all = rayon::ThreadPoolBuilder::new().num_threads(ncpu).build().unwrap();
        let mut p1 = || one.install(pack);
        let mut pn = || all.install(pack);
        let (t1, tn, speedup, best) = paired_best(&mut p1, &mut pn, pack_rounds, sample_s.max(0.05));
        let gbs = (n * k) as f64 / t1 / 1e9;
        rows.push(Row {
            name: format!("pack {what} N={n} K={k}, 1 core"),
            value: gbs,
            unit: "GB/s",
            target: "≥ 1 GB/s",
            ok: Some(gbs >= 1.0),
            detail: format!("{:.1} ms per weight; GB/s = int8 bytes produced", t1 * 1e3),
        });
        rows.push(Row {
            name: format!("pack {what} N={n} K={k}, {ncpu} cores vs 1"),
            value: speedup,
            unit: "×",
            target: if ncpu == 2 { "≥ 1.8×" } else { "≥ 1.8× (on 2)" },
            ok: if ncpu >= 2 { Some(speedup >= 1.8) } else { None },
            detail: format!(
                "{:.1} ms on {ncpu} cores; best-of-rounds ratio {best:.2}× (shared machine: other load lowers the median)",
                tn * 1e3
            ),
        });
    }

    // 5. the calibrated correction, one core each, side by side in the same rounds: its cost
    //    inside the fused passes the backend runs (`quant::prepare_rows` with the direction's
    //    dot vs without; `quant::dequantize_fused` with `c_m·e` vs without) against the
    //    activation path (`prepare_rows` without the dot), per token; and the whole output pass
    //    before (dequantize, then `correct_along` as its own pass: dot over K and N adds) and
    //    after (one fused pass, the dots taken in the activation pass).
    let mean_shapes: &[(usize, usize, usize)] = if section("mean") { &[(128, 1536, 576), (512, 1536, 576), (512, 2048, 2048), (512, 6144, 2048)] } else { &[] };
    for &(m, n, k) in mean_shapes {
        let x = activations(m * k, k, 5 + m as u64);
        let dir = quant::mean::Direction::new(activations(k, k, 77), &vec![1.0; n], &vec![0.5; n]).expect("a direction");
        let rot = ggml_ork::quant::rotate::Rotation::new(k).expect("a rotation of K");
        let (mut q, mut sa, mut dots) = (vec![0i8; m * k], vec![0f32; m], vec![0f32; m]);
        let c: Vec<i32> = (0..m * n).map(|i| ((i * 2_654_435_761) % 2_000_001) as i32 - 1_000_000).collect();
        let a_scale = vec![1e-4f32; m];
        let w_scale: Vec<f32> = (0..n).map(|j| 1e-5 * (1 + j % 13) as f32).collect();
        let coef: Vec<Option<f32>> = (0..m).map(|i| dir.coefficient(quant::mean::dot16(&x[i * k..(i + 1) * k], &dir.dir))).collect();
        let (mut y, mut y2, mut y3, mut y4) = (vec![0f32; m * n], vec![0f32; m * n], vec![0f32; m * n], vec![0f32; m * n]);
        let (mut qb, mut sab) = (vec![0i8; m * k], vec![0f32; m]);
        one.install(|| {
            let prep = quant::RowPrep::Rotate(&rot);
            let mut act = || prepare_rows(black_box(&x), m, k, 1, prep, None, &mut qb, &mut sab, &mut []);
            let mut act_dot = || prepare_rows(black_box(&x), m, k, 1, prep, Some(&dir.dir), &mut q, &mut sa, &mut dots);
            let (_, _, _, ta, tad) = paired_min(&mut act, &mut act_dot, rounds, sample_s);
            let out = |corr: bool| quant::Output { c: quant::CRows::Dense(&c), a_scale: &a_scale, terms: 1, w_scale: &w_scale, lo: None, corr: corr.then_some((&coef[..], &dir.err[..])) };
            let (o0, o1) = (out(false), out(true));
            let mut plain = || quant::dequantize_fused(black_box(&o0), &mut y);
            let mut fused = || quant::dequantize_fused(black_box(&o1), &mut y2);
            let (_, _, _, tp, tf) = paired_min(&mut plain, &mut fused, rounds, sample_s);
            let mut before = || {
                dequantize_output(black_box(&c), &a_scale, &w_scale, &mut y3);
                quant::mean::correct_along(&mut y3, black_box(&x), m, k, n, &dir);
            };
            let mut after = || {
                quant::dequantize_fused(black_box(&o1), &mut y4);
            };
            let (tb, tafter, r) = paired(&mut before, &mut after, rounds, sample_s);
            assert!(y3.iter().zip(&y4).all(|(a, b)| a.to_bits() == b.to_bits()), "the fused pass gives the two passes' bits");
            let per = |t: f64| t * 1e6 / m as f64;
            let cost = (tad - ta).max(0.0) + (tf - tp).max(0.0);
            rows.push(Row::correction_share(
                format!("calibrated correction's host cost (N={n} K={k} M={m}) vs the activation path"),
                cost,
                ta,
                format!(
                    "{:.3} µs per token (dot in the activation pass {:+.3}, c·e in the output pass {:+.3}); activation path {:.2} µs per token; output pass without it {:.2} (fastest of the rounds each)",
                    per(cost),
                    per(tad - ta),
                    per(tf - tp),
                    per(ta),
                    per(tp)
                ),
            ));
            rows.push(Row::info(
                format!("output pass with the correction (N={n} K={k} M={m}): two passes (dequantize, correct_along) vs one fused"),
                r,
                format!("{:.2} → {:.2} µs per token", per(tb), per(tafter)),
            ));
        });
        // The activation path before (copy, serial rotation, then quantize_rows) and after
        // (prepare_rows), one core, then prepare_rows on every core.
        let mut xr = vec![0f32; m * k];
        let (mut qr, mut sr) = (vec![0i8; m * k], vec![0f32; m]);
        one.install(|| {
            let mut old = || rotate_quantize(&rot, black_box(&x), m, &mut xr, &mut qr, &mut sr);
            let mut new = || prepare_rows(black_box(&x), m, k, 1, quant::RowPrep::Rotate(&rot), Some(&dir.dir), &mut q, &mut sa, &mut dots);
            let (to, tn, r) = paired(&mut old, &mut new, rounds, sample_s);
            rows.push(Row::info(
                format!("activation path (K={k} M={m}), one core: copy + rotate + quantize_rows vs prepare_rows (with the dot)"),
                r,
                format!("{:.2} → {:.2} µs per token", to * 1e6 / m as f64, tn * 1e6 / m as f64),
            ));
        });
        let all = rayon::ThreadPoolBuilder::new().num_threads(ncpu).build().unwrap();
        let mut one_core = || one.install(|| prepare_rows(black_box(&x), m, k, 1, quant::RowPrep::Rotate(&rot), Some(&dir.dir), &mut q, &mut sa, &mut dots));
        let (mut q2, mut sa2, mut dots2) = (vec![0i8; m * k], vec![0f32; m], vec![0f32; m]);
        let mut all_cores = || all.install(|| prepare_rows(black_box(&x), m, k, 1, quant::RowPrep::Rotate(&rot), Some(&dir.dir), &mut q2, &mut sa2, &mut dots2));
        let (t1, tn, r) = paired(&mut one_core, &mut all_cores, rounds, sample_s);
        rows.push(Row::info(
            format!("prepare_rows (K={k} M={m}) on {ncpu} cores vs one"),
            r,
            format!("{:.2} → {:.2} µs per token (shared machine: other load lowers it)", t1 * 1e6 / m as f64, tn * 1e6 / m as f64),
        ));
    }

    // 5b. The same per prefill token of a whole layer: one activation pass (and one dot) per
    //     distinct activation (Q/K/V share theirs, as gate/up do), one output pass (and one c·e)
    //     per weight; each part timed with and without the correction in the same rounds, one core.
    //     (hidden, FFN, Q, K/V outputs): SmolLM2-135M (config.json: 576, 1536, 9 × 64, 3 × 64),
    //     Qwen3-1.7B (2048, 6144, 16 × 128, 8 × 128).
    let layers: &[(&str, usize, usize, usize, usize)] = if section("mean") { &[("SmolLM2-135M", 576, 1536, 576, 192), ("Qwen3-1.7B", 2048, 6144, 2048, 1024)] } else { &[] };
    for &(model, h, f, nq, nkv) in layers {
        for m in [128usize, 512] {
            // (K, activations of that K per layer), (N, weights of that N per layer)
            let acts = [(h, 3.0), (f, 1.0)];
            let mut outs: Vec<(usize, f64)> = Vec::new();
            for n in [nq, nkv, nkv, h, f, f, h] {
                match outs.iter_mut().find(|(o, _)| *o == n) {
                    Some((_, c)) => *c += 1.0,
                    None => outs.push((n, 1.0)),
                }
            }
            let (mut act, mut dot, mut ce) = (0f64, 0f64, 0f64);
            let mut dot_at = Vec::new();
            one.install(|| {
                for &(k, count) in &acts {
                    let x = activations(m * k, k, 31 + k as u64);
                    let dir = activations(k, k, 77);
                    let rot = ggml_ork::quant::rotate::Rotation::new(k).expect("a rotation of K");
                    let prep = quant::RowPrep::Rotate(&rot);
                    let (mut q, mut sa, mut dots) = (vec![0i8; m * k], vec![0f32; m], vec![0f32; m]);
                    let (mut qb, mut sab) = (vec![0i8; m * k], vec![0f32; m]);
                    let mut plain = || prepare_rows(black_box(&x), m, k, 1, prep, None, &mut qb, &mut sab, &mut []);
                    let mut with = || prepare_rows(black_box(&x), m, k, 1, prep, Some(&dir), &mut q, &mut sa, &mut dots);
                    let (_, _, _, tp, tw) = paired_min(&mut plain, &mut with, rounds, sample_s);
                    act += count * tp;
                    dot += count * (tw - tp);
                    dot_at.push(format!("K={k}: {:+.3}", (tw - tp) * 1e6 / m as f64));
                }
                for &(n, count) in &outs {
                    let c: Vec<i32> = (0..m * n).map(|i| ((i * 2_654_435_761) % 2_000_001) as i32 - 1_000_000).collect();
                    let a_scale = vec![1e-4f32; m];
                    let w_scale: Vec<f32> = (0..n).map(|j| 1e-5 * (1 + j % 13) as f32).collect();
                    let e: Vec<f32> = (0..n).map(|j| 1e-3 * ((j % 7) as f32 - 3.0)).collect();
                    let coef: Vec<Option<f32>> = (0..m).map(|i| Some(0.01 * (i % 11) as f32)).collect();
                    let (mut y, mut y2) = (vec![0f32; m * n], vec![0f32; m * n]);
                    let out = |corr: bool| quant::Output { c: quant::CRows::Dense(&c), a_scale: &a_scale, terms: 1, w_scale: &w_scale, lo: None, corr: corr.then_some((&coef[..], &e[..])) };
                    let (o0, o1) = (out(false), out(true));
                    let mut plain = || quant::dequantize_fused(black_box(&o0), &mut y);
                    let mut with = || quant::dequantize_fused(black_box(&o1), &mut y2);
                    let (_, _, _, tp, tw) = paired_min(&mut plain, &mut with, rounds, sample_s);
                    ce += count * (tw - tp);
                }
            });
            let per = |t: f64| t * 1e6 / m as f64;
            let cost = dot.max(0.0) + ce.max(0.0);
            rows.push(Row::correction_share(
                format!("calibrated correction's host cost per prefill token, one {model} layer (M={m}) vs its activation path"),
                cost,
                act,
                format!(
                    "{:.3} µs per token (dots {:+.3} over {} activations, each {}; c·e {:+.3} over 7 weights); activation path {:.2} µs per token (fastest of the rounds each)",
                    per(cost),
                    per(dot),
                    acts.iter().map(|a| a.1).sum::<f64>(),
                    dot_at.join(", "),
                    per(ce),
                    per(act)
                ),
            ));
        }
    }

    println!();
    println!("| measurement | result | target | verdict | detail |");
    println!("|---|---:|---|---|---|");
    for r in &rows {
        let v = match r.unit {
            "%" => format!("{:.0} %", r.value),
            "×" => format!("{:.2}×", r.value),
            u => format!("{:.2} {u}", r.value),
        };
        println!("| {} | {v} | {} | {} | {} |", r.name, r.target, verdict(r.ok), r.detail);
    }
    let missed = rows.iter().filter(|r| r.ok == Some(false)).count();
    println!();
    println!("{missed} of {} targets missed", rows.iter().filter(|r| r.ok.is_some()).count());
}

/// The activation pass without row hashes (`quant::prepare_rows_hashed`).
#[allow(clippy::too_many_arguments)]
fn prepare_rows(x: &[f32], m: usize, k: usize, terms: usize, prep: quant::RowPrep<'_>, dir: Option<&[f32]>, q: &mut [i8], scales: &mut [f32], dots: &mut [f32]) {
    quant::prepare_rows_hashed(x, m, k, terms, prep, dir, q, scales, dots, &mut []);
}

/// Multi-term quantization of plain rows: the activation pass with unit column scales.
fn quantize_rows_terms(x: &[f32], rows: usize, cols: usize, terms: usize, q: &mut [i8], scales: &mut [f32]) {
    let ones = vec![1f32; cols];
    prepare_rows(x, rows, cols, terms, quant::RowPrep::Columns(&ones), None, q, scales, &mut []);
}

/// `dst = Σ_t c_t · s_t · w_scale` for `c: [T·M, N]`: the output pass without a second weight
/// term or correction (`quant::dequantize_fused`).
fn dequantize_output_terms(c: &[i32], a_scale: &[f32], terms: usize, w_scale: &[f32], dst: &mut [f32]) {
    quant::dequantize_fused(&quant::Output { c: quant::CRows::Dense(c), a_scale, terms, w_scale, lo: None, corr: None }, dst);
}

fn dequantize_output(c: &[i32], a_scale: &[f32], w_scale: &[f32], dst: &mut [f32]) {
    dequantize_output_terms(c, a_scale, 1, w_scale, dst);
}
