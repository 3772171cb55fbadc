//! Per-row host cost of the Hadamard rotation in front of int8 activation quantization (issue 15),
//! measured side by side in one run against the activation quantizers the crate uses today.
//!
//! `cargo run --release --example rotate_bench`
//!
//! For each width K, on the same M = 64 rows (unit noise plus four channels at 50×, the shape of
//! LLM hidden states), per row:
//! * `q1`     — `quant::quantize_row`, today's single-term per-row quantizer (the baseline);
//! * `q2`     — `quant::quantize_rows_terms(.., 2, ..)`, today's default two-term activations;
//! * `rot`    — `Rotation::apply_row` on a copy of the row (the rotation alone, SIMD path);
//! * `rot+q1` — `rotate_quantize_row` below: copy, rotate, `quantize_row`;
//! * `bd+q1`  — the same with the block-diagonal rotation `Rotation::with_max_order(K, 1)`
//!   (WHT blocks of the largest power of two dividing K, no dense factor): the cheaper choice;
//! * `rot-sc` — `Rotation::apply_row_scalar`, the scalar reference (shows the SIMD speed-up).
//!
//! Method: one-thread rayon pool (a per-core figure), paired rounds — in every round each method
//! runs one sample of about 1 ms, in an order that rotates between rounds — and the median over
//! rounds of the per-row time and of the per-round ratio to `q1` (this machine is shared and noisy;
//! a paired ratio survives that better than absolute times). The `err` column is the relative
//! error of the dequantized activations, ‖x̂ − x‖/‖x‖ (for the rotated path measured in the rotated
//! basis, which R leaves unchanged). ggml-cpu's Q8_0 quantizer is not called here (`bench_host`
//! compares against it). Knobs: `ORK_BENCH_ROUNDS` (default 31), `ORK_ROT_KS` (comma list of K).

use std::hint::black_box;
use std::time::Instant;

use ggml_ork::quant::rotate::Rotation;
use ggml_ork::quant::{self, quantize_row};

const M: usize = 64;
const SAMPLE_S: f64 = 1e-3;

struct Rng(u64);
impl Rng {
    fn unit(&mut self) -> f32 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}

/// One method's work over all M rows (one repetition).
type Op<'a> = Box<dyn FnMut() + 'a>;

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn rel_err(x: &[f32], q: &[i8], s: &[f32], terms: usize) -> f64 {
    let (mut e, mut t) = (0f64, 0f64);
    for (j, &v) in x.iter().enumerate() {
        let d: f64 = (0..terms).map(|i| q[i * x.len() + j] as f64 * s[i] as f64).sum();
        e += (d - v as f64).powi(2);
        t += (v as f64).powi(2);
    }
    (e / t).sqrt()
}

fn bench_k(k: usize, rounds: usize) {
    let rot = Rotation::new(k).expect("K must be a multiple of 32");
    let bd = Rotation::with_max_order(k, 1).expect("K must be a multiple of 32");
    let mut g = Rng(k as u64);
    let outliers = [k / 7, k / 3, k / 3 + 1, k - 5];
    let x: Vec<f32> = (0..M * k)
        .map(|i| g.unit() * if outliers.contains(&(i % k)) { 50.0 } else { 1.0 })
        .collect();

    // accuracy, averaged over the rows
    let (mut e1, mut e2, mut er, mut eb) = (0f64, 0f64, 0f64, 0f64);
    let mut scratch = vec![0f32; k];
    for r in x.chunks(k) {
        let mut q = vec![0i8; 2 * k];
        let mut s = [0f32; 2];
        s[0] = quantize_row(r, &mut q[..k]);
        e1 += rel_err(r, &q[..k], &s[..1], 1);
        quantize_rows_terms(r, 1, k, 2, &mut q, &mut s);
        e2 += rel_err(r, &q, &s, 2);
        s[0] = rotate_quantize_row(&rot, r, &mut q[..k], &mut scratch);
        let mut y = r.to_vec();
        rot.apply_row(&mut y);
        er += rel_err(&y, &q[..k], &s[..1], 1);
        s[0] = rotate_quantize_row(&bd, r, &mut q[..k], &mut scratch);
        y.copy_from_slice(r);
        bd.apply_row(&mut y);
        eb += rel_err(&y, &q[..k], &s[..1], 1);
    }
    let errs = [e1, e2, f64::NAN, er, eb, f64::NAN].map(|e| e / M as f64);

    let mut q1 = vec![0i8; M * k];
    let mut s1 = vec![0f32; M];
    let mut q2 = vec![0i8; 2 * M * k];
    let mut s2 = vec![0f32; 2 * M];
    let mut y = x.clone();
    let mut qr = vec![0i8; M * k];
    let mut sr = vec![0f32; M];
    let mut sc = vec![0f32; k];
    let mut qb = vec![0i8; M * k];
    let mut sb = vec![0f32; M];
    let mut sc2 = vec![0f32; k];
    let mut ys = x.clone();
    let names = ["q1", "q2", "rot", "rot+q1", "bd+q1", "rot-sc"];
    let mut ops: Vec<Op> = vec![
        Box::new(|| {
            for ((r, q), s) in x.chunks(k).zip(q1.chunks_mut(k)).zip(s1.iter_mut()) {
                *s = quantize_row(black_box(r), q);
            }
            black_box(&q1);
        }),
        Box::new(|| {
            quantize_rows_terms(black_box(&x), M, k, 2, &mut q2, &mut s2);
            black_box(&q2);
        }),
        Box::new(|| {
            y.copy_from_slice(&x);
            for r in y.chunks_mut(k) {
                rot.apply_row(black_box(r));
            }
            black_box(&y);
        }),
        Box::new(|| {
            for ((r, q), s) in x.chunks(k).zip(qr.chunks_mut(k)).zip(sr.iter_mut()) {
                *s = rotate_quantize_row(&rot, black_box(r), q, &mut sc);
            }
            black_box(&qr);
        }),
        Box::new(|| {
            for ((r, q), s) in x.chunks(k).zip(qb.chunks_mut(k)).zip(sb.iter_mut()) {
                *s = rotate_quantize_row(&bd, black_box(r), q, &mut sc2);
            }
            black_box(&qb);
        }),
        Box::new(|| {
            ys.copy_from_slice(&x);
            for r in ys.chunks_mut(k) {
                rot.apply_row_scalar(black_box(r));
            }
            black_box(&ys);
        }),
    ];
    // repetitions per sample, so that each sample takes about SAMPLE_S
    let reps: Vec<usize> = ops
        .iter_mut()
        .map(|op| {
            op();
            let t = Instant::now();
            op();
            ((SAMPLE_S / t.elapsed().as_secs_f64().max(1e-7)) as usize).clamp(1, 1 << 16)
        })
        .collect();
    let n = ops.len();
    let mut per_row = vec![Vec::with_capacity(rounds); n];
    let mut ratio = vec![Vec::with_capacity(rounds); n];
    for round in 0..rounds {
        let mut t = vec![0f64; n];
        for step in 0..n {
            let i = (step + round) % n;
            let start = Instant::now();
            for _ in 0..reps[i] {
                (ops[i])();
            }
            t[i] = start.elapsed().as_secs_f64() / (reps[i] * M) as f64;
        }
        for i in 0..n {
            per_row[i].push(t[i] * 1e9);
            ratio[i].push(t[i] / t[0]);
        }
    }
    println!("K {k}: R = {}; bd = {}", rot.describe(), bd.describe());
    for i in 0..n {
        let e = if errs[i].is_nan() { "        ".to_string() } else { format!("{:8.2e}", errs[i]) };
        println!("  {:7} {:9.1} ns/row  {:6.2}× q1   err {e}", names[i], median(&mut per_row[i]), median(&mut ratio[i]));
    }
}

fn main() {
    let rounds = std::env::var("ORK_BENCH_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(31);
    let ks: Vec<usize> = std::env::var("ORK_ROT_KS")
        .ok()
        .map(|v| v.split(',').filter_map(|s| s.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![576, 1536, 2048, 960, 2560, 4864, 6912, 8960, 11008, 14336]);
    let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build().expect("rayon pool");
    println!(
        "SIMD path {:?}; {M} rows per sample, {rounds} paired rounds, medians, one thread",
        ggml_ork::quant::simd::active()
    );
    pool.install(|| {
        for k in ks {
            bench_k(k, rounds);
        }
    });
}

/// Multi-term quantization of plain rows: the activation pass with unit column scales.
fn quantize_rows_terms(x: &[f32], rows: usize, cols: usize, terms: usize, q: &mut [i8], scales: &mut [f32]) {
    let ones = vec![1f32; cols];
    quant::prepare_rows_hashed(x, rows, cols, terms, quant::RowPrep::Columns(&ones), None, q, scales, &mut [], &mut []);
}

/// Rotates one activation row and quantizes it: `out_q ← q(x·R)`, returns the scale.
fn rotate_quantize_row(rot: &Rotation, x: &[f32], out_q: &mut [i8], scratch: &mut [f32]) -> f32 {
    let s = &mut scratch[..rot.k()];
    s.copy_from_slice(x);
    rot.apply_row(s);
    quantize_row(s, out_q)
}
