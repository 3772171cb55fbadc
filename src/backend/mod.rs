//! The ggml device "ORK" in safe Rust: which MUL_MATs it accepts, how a weight becomes a resident
//! NPU weight, and how one MUL_MAT executes. `crate::ffi` turns ggml's raw structs into the
//! plain values and slices used here.
//!
//! **What kind of ggml device ORK is.** ORK registers as an ACCEL device beside the CPU (like
//! ggml-blas), with its own *host* weight buffer type: weights keep their GGUF bytes in ordinary
//! memory (so ggml-cpu can still read them in place for decode) and additionally get a packed,
//! resident int8 copy on the NPU, keyed by the tensor's data address. The scheduler gives ORK the
//! MUL_MATs it accepts and the CPU everything else, with no copies (both sides read host
//! memory). README "Design: ORK as an ACCEL device" gives the measured argument.
//!
//! W8A8 flow of one MUL_MAT (`dst = src0 · src1ᵀ` in ggml's terms, `C = A · Wᵀ` here):
//! `x: [M, K] f32` → per-row int8 (`quant`) → `npu::Npu::mm_run` (pack → plan → regcmd → submit →
//! wait) → `c: [M, N] i32` → `dst: [M, N] f32 = c · a_scale[m] · w_scale[n]`.

pub mod arbiter;
pub mod gpu;
pub mod weights;

use crate::cache::PackCache;
use crate::config::Config;
use crate::npu::{Budget, Npu, NpuError};
use crate::quant;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Instant;
pub use weights::{PackedWeight, WeightSource, WeightStore};

/// ggml type ids ORK accepts as MUL_MAT weights (anything ggml can dequantize to f32).
/// Values are checked against the pinned headers by the ABI drift test.
pub const WEIGHT_TYPES: &[(u32, &str)] = &[
    (0, "f32"),
    (1, "f16"),
    (2, "q4_0"),
    (3, "q4_1"),
    (6, "q5_0"),
    (7, "q5_1"),
    (8, "q8_0"),
    (10, "q2_K"),
    (11, "q3_K"),
    (12, "q4_K"),
    (13, "q5_K"),
    (14, "q6_K"),
    (20, "iq4_nl"),
    (30, "bf16"),
];

/// Activation terms that meet a weight's second int8 term.
const LO_ACT_TERMS: usize = 1;

/// Counters for the profile / summary line.
#[derive(Default)]
pub struct Stats {
    pub npu_matmuls: AtomicU64,
    pub gpu_matmuls: AtomicU64,
    pub gpu_submits: AtomicU64,
    pub gpu_ns: AtomicU64,
    pub npu_rows: AtomicU64,
    pub npu_fallbacks: AtomicU64,
    /// MUL_MATs sent to the CPU because their weight could not be made resident.
    pub not_resident: AtomicU64,
    pub declined_small_m: AtomicU64,
    /// Weights packed from their source (cold), and weights loaded from the `.orkpack` cache.
    pub packed: AtomicU64,
    pub cache_hits: AtomicU64,
    /// Cache entries written.
    pub cache_writes: AtomicU64,
    /// Weight preparation time (packing or cache loading, hashing included).
    pub pack_ns: AtomicU64,
    pub quant_ns: AtomicU64,
    pub npu_ns: AtomicU64,
    pub dequant_ns: AtomicU64,
    pub submits: AtomicU64,
    /// Per phase (0 = prefill, 1 = decode): NPU runs and their time split.
    pub phase: [PhaseStats; 2],
    /// MUL_MAT nodes run on ggml's CPU backend inside ORK's own graph_compute (whole-graph mode,
    /// e.g. under ggml-rpc-server), per phase; and the other ops run there.
    pub cpu_mm: [AtomicU64; 2],
    pub cpu_ops: AtomicU64,
    pub cpu_ns: AtomicU64,
    /// GPU decode runs per phase.
    pub gpu_phase: [AtomicU64; 2],
}

/// NPU runs of one phase and where their time went.
#[derive(Default)]
pub struct PhaseStats {
    pub runs: AtomicU64,
    pub rows: AtomicU64,
    pub quant_ns: AtomicU64,
    /// Host side of the NPU run: activation packing, regcmd, submit ioctls.
    pub submit_ns: AtomicU64,
    /// Time the NPU was busy (per-core average of the interface's measured busy time).
    pub wait_ns: AtomicU64,
    pub dequant_ns: AtomicU64,
    /// Time spent waiting for the arbiter (cores held by another context, or another process).
    pub arb_ns: AtomicU64,
    /// Runs computed on the CPU because another process held the NPU.
    pub fallback: AtomicU64,
}

impl Stats {
    pub fn summary(&self) -> String {
        let ms = |a: &AtomicU64| a.load(Relaxed) as f64 / 1e6;
        format!(
            "ORK ran {} MUL_MAT on the NPU ({} rows, {} submits) and {} on the GPU ({} submits, {:.1} ms); {} MUL_MAT graph nodes were left to the CPU \
             (M < ORK_MINM) at graph split; {} NPU errors fell back to the CPU; weights: {} cache hits, {} packs \
             ({} cache writes), prepared in {:.0} ms; time: act-quant {:.1} ms, npu {:.1} ms, dequant {:.1} ms",
            self.npu_matmuls.load(Relaxed),
            self.npu_rows.load(Relaxed),
            self.submits.load(Relaxed),
            self.gpu_matmuls.load(Relaxed),
            self.gpu_submits.load(Relaxed),
            ms(&self.gpu_ns),
            self.declined_small_m.load(Relaxed),
            self.npu_fallbacks.load(Relaxed),
            self.cache_hits.load(Relaxed),
            self.packed.load(Relaxed),
            self.cache_writes.load(Relaxed),
            ms(&self.pack_ns),
            ms(&self.quant_ns),
            ms(&self.npu_ns),
            ms(&self.dequant_ns),
        )
    }

    /// The `ORK_PROFILE=1` table: per op kind (prefill / decode MUL_MAT), which engine ran it, how
    /// many times, and the time split.
    pub fn profile(&self, arb: Option<&arbiter::Arbiter>) -> String {
        let ms = |a: &AtomicU64| a.load(Relaxed) as f64 / 1e6;
        let mut out = String::from("ORK profile (per op kind):");
        for (i, name) in ["prefill", "decode"].iter().enumerate() {
            let p = &self.phase[i];
            out += &format!(
                "\n  {name:7} MUL_MAT: npu {} runs ({} rows; act-quant {:.1} ms, submit {:.1} ms, wait {:.1} ms, dequant {:.1} ms, arbiter {:.1} ms; {} on the CPU while another process held the NPU), gpu {} runs, cpu {} runs in ORK's graph",
                p.runs.load(Relaxed),
                p.rows.load(Relaxed),
                ms(&p.quant_ns),
                ms(&p.submit_ns),
                ms(&p.wait_ns),
                ms(&p.dequant_ns),
                ms(&p.arb_ns),
                p.fallback.load(Relaxed),
                self.gpu_phase[i].load(Relaxed),
                self.cpu_mm[i].load(Relaxed),
            );
        }
        out += &format!(
            "\n  decode  MUL_MAT left to ggml-cpu at graph split: {} nodes; other ops run by ORK on ggml-cpu: {} ({:.1} ms)",
            self.declined_small_m.load(Relaxed),
            self.cpu_ops.load(Relaxed),
            ms(&self.cpu_ns)
        );
        if let Some(a) = arb {
            out += &format!("\n  {}", a.summary());
        }
        out
    }
}

/// The ORK device: the NPU plus policy inputs. One per process.
pub struct Device {
    pub npu: Arc<Npu>,
    /// The GPU decode engine, opened when `ORK_DECODE=gpu` and a suitable device exists.
    pub vk: Option<Arc<crate::vk::VkEngine>>,
    pub cfg: &'static Config,
    pub stats: Stats,
    /// The `.orkpack` cache (None when `ORK_CACHE=0` or no directory resolves).
    pub cache: Option<PackCache>,
}

/// A MUL_MAT as ggml describes it, reduced to what decides acceptance.
#[derive(Clone, Copy, Debug)]
pub struct MatMulShape {
    pub weight_type: u32,
    /// K = src0.ne[0], N = src0.ne[1]; src0 must be 2-D.
    pub k: usize,
    pub n: usize,
    pub weight_is_2d: bool,
    pub weight_contiguous: bool,
    pub weight_in_ork_buffer: bool,
    pub weight_has_to_float: bool,
    /// src1 (activations): f32, contiguous; M = all its rows.
    pub act_is_f32: bool,
    pub act_contiguous: bool,
    pub m: usize,
    pub dst_is_f32: bool,
    pub dst_contiguous: bool,
    /// op_params[1] == 1: src0 is a Hadamard rotation, not a weight.
    pub hadamard_hint: bool,
    /// op_params[3]: lowest representation src1 may be converted to (10/15/20 forbid int8).
    pub act_min_prec: i32,
}

/// Why ORK declines an op (debug log only).
pub fn mul_mat_unsupported(dev: &Device, s: &MatMulShape) -> Option<String> {
    if !s.weight_in_ork_buffer {
        return Some("weight not in an ORK buffer".into());
    }
    if !WEIGHT_TYPES.iter().any(|&(t, _)| t == s.weight_type) || !s.weight_has_to_float {
        return Some(format!("weight type {} not supported", s.weight_type));
    }
    if !s.weight_is_2d || !s.weight_contiguous {
        return Some("weight is not a contiguous 2-D matrix".into());
    }
    if !s.act_is_f32 || !s.act_contiguous || !s.dst_is_f32 || !s.dst_contiguous {
        return Some("activations/output are not contiguous f32".into());
    }
    if s.hadamard_hint {
        return Some("Hadamard rotation matmul".into());
    }
    if matches!(s.act_min_prec, 10 | 15 | 20) {
        return Some("activation precision pinned to float".into());
    }
    if let Err(e) = dev.npu.check_shape(s.n, s.k) {
        return Some(e.to_string());
    }
    None
}

impl Device {
    /// Whether decode matmuls can go to the GPU.
    pub fn gpu_ready(&self) -> bool {
        self.vk.is_some()
    }

    /// Runs `dst = x · Wᵀ` for `x: [M, K] f32` and `dst: [M, N] f32` with a packed weight.
    /// On an NPU error the same int8 arithmetic runs on the CPU (exact same result) and the error
    /// is logged once per kind.
    pub fn run_mul_mat(&self, w: &PackedWeight, src: &WeightSource<'_>, x: &[f32], m: usize, dst: &mut [f32]) {
        let (k, n) = (w.k, w.n);
        assert_eq!(x.len(), m * k, "x is not [M, K]");
        assert_eq!(dst.len(), m * n, "dst is not [M, N]");
        let t0 = Instant::now();
        let xs = quant::scale_columns(x, &w.col_scale);
        let x = &xs[..];
        let terms = self.cfg.act_terms_for(weights::is_float_type(w.ggml_type));
        let rows = terms * m;
        let mut a = vec![0i8; rows * k];
        let mut a_scale = vec![0f32; rows];
        quant::quantize_rows_terms(x, m, k, terms, &mut a, &mut a_scale);
        let t1 = Instant::now();
        let mut c = vec![0i32; rows * n];
        let phase = crate::route::Phase::of(self.cfg, m);
        let ps = &self.stats.phase[(phase == crate::route::Phase::Decode) as usize];
        let want = self.cfg.max_cores.unwrap_or(self.npu.soc().cores);
        let lease = self.arbiter().acquire(phase, want);
        let ta = Instant::now();
        ps.arb_ns.fetch_add((ta - t1).as_nanos() as u64, Relaxed);
        let (budget, first) = match &lease {
            Ok(l) => (Budget { max_cores: l.count }, l.first),
            Err(_) => (Budget { max_cores: want }, 0),
        };
        let mut device_ns = 0u64;
        let mut cores = 1u64;
        let r = match &lease {
            Ok(_) => self.npu.mm_run_at(&w.resident, &a, rows, &mut c, budget, first),
            Err(e) => Err(NpuError::NoDevice(e.to_string())),
        };
        match r {
            Ok(rs) => {
                self.stats.submits.fetch_add(rs.submits as u64, Relaxed);
                device_ns += rs.device_ns;
                cores = rs.cores.max(1) as u64;
            }
            Err(e) => {
                if lease.is_ok() {
                    self.note_npu_error(&e);
                } else {
                    ps.fallback.fetch_add(1, Relaxed);
                }
                let (q, _, _) = weights::quantize_source(src, n, k);
                c = crate::npu::reference_mm(&a, &q, rows, k, n);
            }
        }
        let t2 = Instant::now();
        quant::dequantize_output_terms(&c, &a_scale, terms, &w.scales, dst);
        if let Some((lo, lo_scales)) = &w.lo {
            // Second weight term against the first activation term only: the cross terms with
            // later activation terms sit below both terms' resolution (SmolLM2: NMSE ≤ 3e-8 with
            // them, ≤ 1.2e-6 without, against 1e-4 for one weight term) and would cost T·M more
            // NPU rows.
            let lt = LO_ACT_TERMS.min(terms);
            let mut cl = vec![0i32; lt * m * n];
            let r = match &lease {
                Ok(_) => self.npu.mm_run_at(lo, &a[..lt * m * k], lt * m, &mut cl, budget, first),
                Err(e) => Err(NpuError::NoDevice(e.to_string())),
            };
            if let Ok(rs) = &r {
                device_ns += rs.device_ns;
            }
            if let Err(e) = r {
                if lease.is_ok() {
                    self.note_npu_error(&e);
                }
                let (q, s, col) = weights::quantize_source(src, n, k);
                let (ql, _) = weights::quantize_residual(src, n, k, &col, &q, &s);
                cl = crate::npu::reference_mm(&a[..lt * m * k], &ql, lt * m, k, n);
            }
            let mut extra = vec![0f32; m * n];
            quant::dequantize_output_terms(&cl, &a_scale[..lt * m], lt, lo_scales, &mut extra);
            for (d, e) in dst.iter_mut().zip(extra) {
                *d += e;
            }
        }
        drop(lease);
        let t3 = Instant::now();
        let npu_ns = (t2 - ta).as_nanos() as u64;
        let wait = (device_ns / cores).min(npu_ns);
        ps.runs.fetch_add(1, Relaxed);
        ps.rows.fetch_add(m as u64, Relaxed);
        ps.quant_ns.fetch_add((t1 - t0).as_nanos() as u64, Relaxed);
        ps.submit_ns.fetch_add(npu_ns - wait, Relaxed);
        ps.wait_ns.fetch_add(wait, Relaxed);
        ps.dequant_ns.fetch_add((t3 - t2).as_nanos() as u64, Relaxed);
        self.stats.npu_matmuls.fetch_add(1, Relaxed);
        self.stats.npu_rows.fetch_add(m as u64, Relaxed);
        self.stats.quant_ns.fetch_add((t1 - t0).as_nanos() as u64, Relaxed);
        self.stats.npu_ns.fetch_add((t2 - t1).as_nanos() as u64, Relaxed);
        self.stats.dequant_ns.fetch_add((t3 - t2).as_nanos() as u64, Relaxed);
    }

    /// The process's NPU arbiter (one per process, created on first use).
    pub fn arbiter(&self) -> &'static arbiter::Arbiter {
        static ARB: std::sync::OnceLock<arbiter::Arbiter> = std::sync::OnceLock::new();
        ARB.get_or_init(|| {
            let d = self.npu.describe();
            let kif = d.split('(').nth(1).and_then(|s| s.split(')').next()).unwrap_or("npu");
            let name: String = format!("{}-{kif}", self.npu.soc().id.name())
                .chars()
                .map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' })
                .collect();
            arbiter::Arbiter::new(self.cfg, self.npu.cores(), &name)
        })
    }

    fn note_npu_error(&self, e: &NpuError) {
        let n = self.stats.npu_fallbacks.fetch_add(1, Relaxed);
        if n < 3 {
            log::warn!("NPU matmul failed ({e}); computed on the CPU instead");
        }
    }
}
