//! The ggml device "ORK" in safe Rust: how it opens, which MUL_MATs it accepts, how a weight
//! becomes a resident NPU weight, how one MUL_MAT executes and how a graph is walked.
//! `crate::ffi` turns ggml's raw structs into the plain values and slices used here and makes
//! no decision of its own.
//!
//! **What kind of ggml device ORK is.** ORK registers as an ACCEL device beside the CPU (like
//! ggml-blas), with its own *host* weight buffer type: weights keep their GGUF bytes in ordinary
//! memory (so ggml-cpu can still read them in place for decode) and additionally get a packed,
//! resident int8 copy on the NPU, keyed by the tensor's data address (past the residency budget
//! a weight is streamed instead: its tiles copied into a ring of NPU buffers for each prefill
//! MUL_MAT, `stream`). The scheduler gives ORK the
//! MUL_MATs it accepts and the CPU everything else, with no copies (both sides read host
//! memory). README "Design: ORK as an ACCEL device" gives the measured argument.
//!
//! W8A8 flow of one MUL_MAT (`dst = src0 · src1ᵀ` in ggml's terms, `C = A · Wᵀ` here):
//! `x: [M, K] f32` → per-row int8 (`quant`) → `npu::Npu::mm_run` (pack → plan → regcmd → submit →
//! wait) → `c: [M, N] i32` → `dst: [M, N] f32 = c · a_scale[m] · w_scale[n]`.

pub mod buffer;
mod counters;
mod device;
mod pool;
pub mod gpu;
pub mod graph;
mod npu_mm;
pub mod packed;
pub mod report;
pub mod stream;
pub mod weights;

use crate::cache::PackCache;
use crate::config::Config;
use crate::npu::{Npu, NpuError};
use crate::quant;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

/// The value for `key` in this thread's memo `memo`, made by `make` the first time it is asked
/// for. For decisions the configuration fixes for the process but that cost a planner run (the
/// engine per shape, the cut of a pipelined MUL_MAT): ggml asks again for every node of every
/// token. Bounded: a prefill brings many M values, and a memo of the repeats is enough.
fn remembered<K: std::hash::Hash + Eq, V: Copy>(memo: &'static std::thread::LocalKey<std::cell::RefCell<std::collections::HashMap<K, V>>>, key: K, make: impl FnOnce() -> V) -> V {
    if let Some(v) = memo.with(|r| r.borrow().get(&key).copied()) {
        return v;
    }
    let v = make();
    memo.with(|r| {
        let mut r = r.borrow_mut();
        if r.len() >= 4096 {
            r.clear();
        }
        r.insert(key, v);
    });
    v
}
pub use crate::pack::WeightSource;
pub use packed::PackedWeight;
pub use weights::WeightStore;
pub use counters::{GraphSnap, GraphStats, Held, MemLedger, Memory, PhaseStats, Stats};

/// What the precision plan and the residency rule read, apart from the counters ([`Stats`],
/// telemetry only): the work ORK's live buffers announced per precision role, their host bytes,
/// and the weights placed so far.
#[derive(Default)]
pub struct Placement {
    /// Work per precision role (`route::precision::RoleWork`: Σ K·N of its weights) in ORK's
    /// live buffers, counted as ggml initialises their tensors: the precision plan's view of the
    /// model.
    pub announced: [AtomicU64; crate::route::precision::ROLES],
    /// Host bytes of ORK's live buffers (the GGUF weights the CPU also reads live there); the
    /// default residency budget is lowered by them (see [`Device::host_buffers_changed`]).
    pub host_buffer_bytes: AtomicU64,
    /// The part of `host_buffer_bytes` in buffers ggml wrote model weights into (the GGUF copy;
    /// the rest are ORK's compute buffers).
    pub weight_buffer_bytes: AtomicU64,
    /// The part of `host_buffer_bytes` in buffers over llama.cpp's mapping of the model file
    /// (`buffer_from_host_ptr`): file-backed GGUF bytes read in place, not ORK's memory.
    pub mapped_buffer_bytes: AtomicU64,
    /// Source bytes of the weights `weights::pack` was called for: with `host_buffer_bytes`,
    /// an estimate of what is still to be placed (see `weights::second_term_fits`).
    pub placed_src_bytes: AtomicU64,
    /// One int8 term's resident bytes of those weights (their tiled size).
    pub placed_term_bytes: AtomicU64,
    /// One int8 term's resident bytes of every weight in ORK's live buffers, summed as ggml
    /// initialises their tensors (before any is loaded); 0 when unknown.
    pub expected_term_bytes: AtomicU64,
}

/// The ORK device: the NPU plus policy inputs. One per process.
pub struct Device {
    pub npu: Arc<Npu>,
    /// The GPU decode engine, opened when `ORK_DECODE=gpu` and a suitable device exists.
    pub vk: Option<Arc<crate::vk::VkEngine>>,
    pub cfg: &'static Config,
    /// Counters: what ran where, what it cost (telemetry only).
    pub stats: Stats,
    /// The precision plan's and the residency rule's inputs.
    pub placement: Placement,
    /// Streamed prefill: the ring, the fill worker and their counters (`stream`; off until the
    /// device enables it).
    pub stream: stream::Streamer,
    /// The `.orkpack` cache (None when `ORK_CACHE=0` or no directory resolves).
    pub cache: Option<PackCache>,
    /// The calibration file the correction reads or `ORK_CALIBRATE` records into
    /// (`cache::calib::Store::from_config`).
    pub calib: Option<crate::cache::calib::Store>,
}

/// A MUL_MAT as ggml describes it, reduced to what decides acceptance.
#[derive(Clone, Copy, Debug)]
pub struct MatMulShape {
    pub weight_type: u32,
    /// K = `src0.ne[0]`, N = `src0.ne[1]`; src0 must be 2-D.
    pub k: usize,
    pub n: usize,
    pub weight_is_2d: bool,
    pub weight_contiguous: bool,
    /// The weight's memory is in an ORK buffer (directly or as a view).
    pub weight_in_ork_buffer: bool,
    /// The weight is a leaf not allocated yet: no buffer, not a view, no op, not an input
    /// (test-backend-ops asks before allocating).
    pub weight_unallocated_leaf: bool,
    /// llama.cpp asks where to place the weight (it sits in ORK's zero-size placement buffer)
    /// and ggml-cpu's `CPU_REPACK` type is the first of ggml-cpu's own that would take it.
    pub weight_cpu_repacks: bool,
    pub weight_has_to_float: bool,
    /// src1 (activations): f32, contiguous; M = all its rows.
    pub act_is_f32: bool,
    pub act_contiguous: bool,
    pub m: usize,
    pub dst_is_f32: bool,
    pub dst_contiguous: bool,
    /// `op_params[1] == 1`: src0 is a Hadamard rotation, not a weight.
    pub hadamard_hint: bool,
    /// `op_params[3]`: lowest representation src1 may be converted to (10/15/20 forbid int8).
    pub act_min_prec: i32,
}

/// Why ORK declines an op (debug log only).
pub fn mul_mat_unsupported(dev: &Device, s: &MatMulShape) -> Option<String> {
    // A leaf not allocated yet will be placed in the tested backend's own buffer type.
    if !s.weight_in_ork_buffer && !s.weight_unallocated_leaf {
        return Some("weight not in an ORK buffer".into());
    }
    // ggml-cpu keeps its repacked layout for decode: llama.cpp then places the weight in
    // CPU_REPACK, where ORK packs its tiles as it is loaded (`Device::keeps_cpu_repack`).
    if s.weight_cpu_repacks && dev.keeps_cpu_repack() {
        return Some("ggml-cpu repacks this weight: it goes to CPU_REPACK, where ORK packs it as it is loaded".into());
    }
    if quant::types::weight_type(s.weight_type).is_none() || !s.weight_has_to_float {
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
    /// ORK's buffers grew (`delta > 0`) or shrank by `|delta|` host bytes. Unless
    /// `ORK_WCACHE_BUDGET_MB` sets the residency budget, it becomes RAM − 1 GiB − those bytes:
    /// on the board's unified memory the packed copy and the GGUF weights (kept for the CPU's
    /// decode and fallbacks) share the same RAM, and a budget of RAM − 1 GiB alone would let the
    /// packed copy of a large model push the process into the OOM killer. Weights past the
    /// budget keep one term or stay on the CPU (one warning each kind).
    pub fn host_buffers_changed(&self, delta: i64) {
        let now = if delta >= 0 {
            self.placement.host_buffer_bytes.fetch_add(delta as u64, Relaxed) + delta as u64
        } else {
            let d = delta.unsigned_abs();
            self.placement.host_buffer_bytes.fetch_sub(d, Relaxed).saturating_sub(d)
        };
        self.note_memory();
        if self.cfg.wcache_budget_mb.is_some() {
            return;
        }
        let budget = crate::npu::domain::default_budget_bytes().saturating_sub(now);
        self.npu.set_residency_budget(budget);
        log::debug!("resident weight budget {} MiB (RAM - 1 GiB - {} MiB of ORK buffers)", budget >> 20, now >> 20);
    }

    /// Copies the NPU's scratch bytes (with the stream ring's) and weight copies into the
    /// [`MemLedger`] and samples the
    /// peak (after a weight placement, a buffer change, and before a report).
    pub fn note_memory(&self) {
        let (scratch, scratch_copies) = self.npu.scratch_bytes();
        let l = &self.stats.mem;
        // The stream ring's slots are NPU buffers beside the scratch (`stream`).
        l.scratch.store(scratch + self.stream.ring_bytes(), Relaxed);
        l.scratch_copies.store(scratch_copies, Relaxed);
        l.weight_copies.store(u64::from(self.npu.weight_copies()), Relaxed);
        self.memory();
    }

    /// Resident bytes by kind now, and the peak so far ([`Stats::memory`]).
    pub fn memory(&self) -> Memory {
        self.stats.memory(&self.placement)
    }

    /// Whether decode matmuls can go to the GPU.
    pub fn gpu_ready(&self) -> bool {
        self.vk.is_some()
    }

    /// Whether weights ggml-cpu repacks stay in its `CPU_REPACK` buffers, ORK packing its tiles
    /// from their bytes as they are loaded (docs/design.md): wherever the CPU decodes, that is
    /// whenever the GPU decode engine is not open (then ORK's buffer holds them, as the GPU copy
    /// is made from the GGUF bytes at the first decode).
    pub fn keeps_cpu_repack(&self) -> bool {
        !self.gpu_ready()
    }

    /// The process's NPU arbiter (one per process, created on first use).
    pub fn arbiter(&self) -> &'static crate::route::arbiter::Arbiter {
        static ARB: std::sync::OnceLock<crate::route::arbiter::Arbiter> = std::sync::OnceLock::new();
        ARB.get_or_init(|| {
            let d = self.npu.describe();
            let kif = d.split('(').nth(1).and_then(|s| s.split(')').next()).unwrap_or("npu");
            let name: String = format!("{}-{kif}", self.npu.soc().id.name())
                .chars()
                .map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' })
                .collect();
            crate::route::arbiter::Arbiter::new(self.cfg, self.npu.cores(), &name)
        })
    }

    /// Logs an NPU run's error (the first three; all are counted in the exit line).
    fn note_npu_error(&self, e: &NpuError) {
        if self.stats.errors_logged.fetch_add(1, Relaxed) < 3 {
            log::warn!("NPU matmul failed ({e}); computed on the CPU instead");
        }
    }
}

#[cfg(test)]
mod stats_tests {
    use super::*;

    /// `remembered` makes a key's value once, keeps each key apart, and is bounded (a full memo
    /// starts over, making values again).
    #[test]
    fn remembered_makes_each_value_once_and_stays_bounded() {
        thread_local! {
            static MEMO: std::cell::RefCell<std::collections::HashMap<(usize, bool), usize>> = Default::default();
        }
        let made = std::cell::Cell::new(0);
        let get = |key: (usize, bool)| {
            remembered(&MEMO, key, || {
                made.set(made.get() + 1);
                key.0 * 2 + usize::from(key.1)
            })
        };
        assert_eq!((get((5, false)), get((5, false)), get((5, true))), (10, 10, 11));
        assert_eq!(made.get(), 2, "one make per key");
        for i in 0..5000 {
            get((100 + i, false));
        }
        assert!(MEMO.with(|m| m.borrow().len()) <= 4096, "bounded");
        let before = made.get();
        get((5, false));
        assert_eq!(made.get(), before + 1, "made again once forgotten");
    }
}
