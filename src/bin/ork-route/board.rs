//! Board planning: what a dense model costs in RAM on a board of a given size with ORK, which of
//! its weights stay resident on the NPU, which stream, which stay on the CPU, and the predicted
//! prefill and decode rates (`ork-route --ram GB`).
//!
//! **Memory model** (what the plugin holds, docs/design.md "ORK as an ACCEL device"):
//! * the GGUF bytes: llama.cpp maps the model file and ORK's weight buffers *are* that mapping
//!   (`buffer_from_host_ptr`); ggml-cpu reads every weight of it once per decoded token, so all of
//!   the file's tensor bytes are counted resident (file-backed pages, clean, shared);
//! * the int8 tiles ORK keeps resident: per weight, its tiled layout with the tile sets the
//!   plans read (`npu::plan::tile_sets` at the smallest M the NPU runs), page-rounded, times its
//!   int8 weight terms (`precision::decide`), plus the f32 row scales, column scales and the
//!   second term's row scales ([`npu_bytes`]);
//! * the KV cache (f16 K and V of every layer for `ctx` tokens), llama.cpp's compute buffer
//!   ([`compute_bytes`], an estimate), ORK's per-core scratch and the stream ring
//!   ([`STREAM_RING_WEIGHTS`] of the largest weight), a process base ([`PROCESS_BASE_BYTES`]) and
//!   an OS reserve ([`OS_RESERVE_BYTES`], the same 1 GiB ORK's residency budget leaves);
//! * what does not fit resident **streams**: its packed tiles are read from the `.orkpack` cache
//!   on disk into the ring while the NPU runs the weights before it. The cache's page cache is
//!   reclaimable and not counted; the stream rate is min(disk, copy) ([`StreamRate`]).
//!
//! The output head runs with M = 1 in generation (llama.cpp computes the logits of the last
//! token only), so it stays on ggml-cpu and holds no tiles; the token embedding is a GET_ROWS.
//!
//! **Rates** are modelled, not measured: the route cost model ([`route::CostModel`], RK3588
//! figures, the host's work scaled by the A76 assumption [`route::A76_OVER_HERE`]). Prefill of a
//! `ubatch`-row ubatch from an empty context: the NPU MUL_MATs (with their host work) overlapped
//! with the streamed bytes' reads (the ring lets the next weight's read run under the NPU's
//! current one), then the CPU's attention and the head's one row. The CPU-only figure runs every
//! MUL_MAT at ggml-cpu's rate. Decode is the CPU's (ORK leaves M = 1 to ggml-cpu): every GGUF
//! weight byte read once per token.

use ggml_ork::config::{Config, DecodeSelect};
use ggml_ork::npu::layout::WeightGeometry;
use ggml_ork::quant::types::{self, bytes_per_weight};
use ggml_ork::route::precision::{self, Role};
use ggml_ork::route::{self, CostModel};

/// OS reserve kept free of the process: kernel, page tables, CMA, other services (the 1 GiB the
/// plugin's default residency budget leaves: `npu::domain`, RAM − 1 GiB).
pub const OS_RESERVE_BYTES: u64 = 1 << 30;
/// The llama.cpp process without weights, KV or compute buffers (binary, libraries, tokenizer,
/// heap): an **estimate** (SmolLM2-135M's CPU-only peak RSS is 361 MB with 145 MB of GGUF).
pub const PROCESS_BASE_BYTES: u64 = 200 << 20;
/// The stream ring holds this many of the largest weight's tiles: the one the NPU runs and the
/// one being filled (the streaming path's ring, `backend::stream::RING_SLOTS`: four slots, two
/// weights of up to two terms).
pub const STREAM_RING_WEIGHTS: u64 = 2;
/// Copy rate of packed tiles from a mapped, page-cached `.orkpack` entry into a ring slot on
/// **this machine** (B/s): the streaming path's measured rate ([`route::StreamCost::MEASURED`],
/// `bench-scripts/stream_pp512.sh`: 5.9–6.4 GB/s; `cargo run --release --example
/// stream_copy_rate`, a plain copy from a mapped file, gave 6.32 GB/s). Scaled to the board by
/// [`route::A76_OVER_HERE`] (an assumption for this kind of work too).
pub const STREAM_COPY_BPS_HERE: f64 = 1.0 / route::StreamCost::MEASURED.copy_s_per_byte;
/// **Assumption**: sequential read rate of the board's disk where the `.orkpack` cache lives (an
/// NVMe SSD on the RK3588's PCIe 3.0 ×4 M.2 slot; no measured figure in the shared sources).
/// `ork-route --disk-mbps` replaces it (an eMMC module reads ~250 MB/s).
pub const BOARD_DISK_BPS: f64 = 1.5e9;

/// Where the streamed tiles come from and how fast.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StreamRate {
    /// Disk read rate (B/s) of the `.orkpack` cache.
    pub disk_bps: f64,
    /// Copy rate (B/s) on a board core.
    pub copy_bps: f64,
}

impl StreamRate {
    pub const BOARD: StreamRate = StreamRate { disk_bps: BOARD_DISK_BPS, copy_bps: STREAM_COPY_BPS_HERE / route::A76_OVER_HERE };

    pub fn bps(&self) -> f64 {
        self.disk_bps.min(self.copy_bps)
    }
}

/// One dense MUL_MAT weight `[N, K]` of the model.
#[derive(Clone, Debug, PartialEq)]
pub struct Weight {
    pub name: String,
    pub k: usize,
    pub n: usize,
    pub ggml_type: u32,
    pub role: Role,
}

impl Weight {
    /// Its bytes in the GGUF.
    pub fn gguf_bytes(&self) -> u64 {
        (self.k as f64 * self.n as f64 * bytes_per_weight(self.ggml_type)).round() as u64
    }
}

/// A dense decoder's dimensions: what a published `config.json` ([`DenseDesc`]) and a GGUF's
/// metadata ([`from_gguf`]) both give.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dims {
    pub layers: usize,
    pub hidden: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub ffn: usize,
    pub vocab: usize,
}

/// A dense model as the board plan sees it.
#[derive(Clone, Debug)]
pub struct BoardModel {
    pub name: String,
    pub dims: Dims,
    /// The layers' MUL_MAT weights, which the NPU runs in prefill.
    pub matmuls: Vec<Weight>,
    /// The output head (ggml-cpu in generation: M = 1); with `head_tied` it is the token
    /// embedding itself (its bytes counted here, not in `other_bytes`).
    pub head: Option<Weight>,
    pub head_tied: bool,
    /// GGUF bytes of everything else (an untied embedding, norms): read by ggml-cpu in place.
    pub other_bytes: u64,
}

impl BoardModel {
    /// All tensor bytes of the GGUF.
    pub fn gguf_bytes(&self) -> u64 {
        self.matmuls.iter().map(Weight::gguf_bytes).sum::<u64>() + self.head.as_ref().map_or(0, Weight::gguf_bytes) + self.other_bytes
    }

    /// Parameters (elements of every weight).
    pub fn params(&self) -> u64 {
        let mm: u64 = self.matmuls.iter().map(|w| (w.k * w.n) as u64).sum();
        mm + self.head.as_ref().map_or(0, |w| (w.k * w.n) as u64) + if self.head_tied { 0 } else { (self.dims.vocab * self.dims.hidden) as u64 }
    }

    /// Bytes of the f16 KV cache for `ctx` tokens.
    pub fn kv_bytes(&self, ctx: usize) -> u64 {
        let d = &self.dims;
        2 * 2 * (d.layers * d.kv_heads * d.head_dim * ctx) as u64
    }

    /// The model's MUL_MAT work per precision role (Σ K·N; the head included: the precision
    /// plan counts it as the backend does).
    pub fn role_work(&self) -> precision::RoleWork {
        let mut w = [0; precision::ROLES];
        for m in self.matmuls.iter().chain(self.head.as_ref()) {
            w[m.role.index()] += (m.k * m.n) as u64;
        }
        w
    }

    /// The model from a dense description with `quant`'s type per tensor.
    pub fn from_desc(desc: &DenseDesc, quant: Quant) -> BoardModel {
        let d = &desc.dims;
        let q = d.heads * d.head_dim;
        let kv = d.kv_heads * d.head_dim;
        let mut matmuls = Vec::with_capacity(7 * d.layers);
        for l in 0..d.layers {
            for (name, k, n, role) in [
                ("attn_q", d.hidden, q, Role::AttnQ),
                ("attn_k", d.hidden, kv, Role::AttnK),
                ("attn_v", d.hidden, kv, Role::AttnV),
                ("attn_output", q, d.hidden, Role::AttnOut),
                ("ffn_gate", d.hidden, d.ffn, Role::FfnGate),
                ("ffn_up", d.hidden, d.ffn, Role::FfnUp),
                ("ffn_down", d.ffn, d.hidden, Role::FfnDown),
            ] {
                matmuls.push(Weight { name: format!("blk.{l}.{name}.weight"), k, n, ggml_type: quant.layer_type(role, l, d.layers), role });
            }
        }
        let embd = if desc.tied { 0 } else { (d.vocab as f64 * d.hidden as f64 * bytes_per_weight(quant.embd_type())) as u64 };
        // Norms: attention and FFN norms per layer, q/k norms where the family has them, f32.
        let norms = 4 * (d.layers * (2 * d.hidden + if desc.qk_norm { 2 * d.head_dim } else { 0 }) + d.hidden) as u64;
        let name = if desc.tied { "token_embd.weight" } else { "output.weight" };
        let head = Some(Weight { name: name.into(), k: d.hidden, n: d.vocab, ggml_type: quant.head_type(), role: Role::Head });
        BoardModel {
            name: format!("{} {}", desc.name, quant.name()),
            dims: desc.dims,
            matmuls,
            head,
            head_tied: desc.tied,
            other_bytes: embd + norms,
        }
    }
}

/// A GGUF file type the plan can describe a model in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Quant {
    Q4KM,
    Q8_0,
}

impl Quant {
    pub const ALL: [Quant; 2] = [Quant::Q4KM, Quant::Q8_0];

    pub fn name(self) -> &'static str {
        match self {
            Quant::Q4KM => "Q4_K_M",
            Quant::Q8_0 => "Q8_0",
        }
    }

    /// The type llama-quantize gives a layer weight (llama.cpp `llama_tensor_get_type`, ftype
    /// MOSTLY_Q4_K_M: Q4_K, with Q6_K for `attn_v` and `ffn_down` in the layers `use_more_bits`
    /// picks: the first and last eighth and every third one between).
    pub fn layer_type(self, role: Role, layer: usize, layers: usize) -> u32 {
        match self {
            Quant::Q8_0 => types::Q8_0,
            Quant::Q4KM => {
                let more = layer < layers / 8 || layer >= 7 * layers / 8 || (layer - layers / 8) % 3 == 2;
                if matches!(role, Role::AttnV | Role::FfnDown) && more {
                    types::Q6_K
                } else {
                    types::Q4_K
                }
            }
        }
    }

    /// The output head's type (and a tied embedding's): Q6_K under Q4_K_M.
    pub fn head_type(self) -> u32 {
        match self {
            Quant::Q8_0 => types::Q8_0,
            Quant::Q4KM => types::Q6_K,
        }
    }

    /// An untied token embedding's type.
    pub fn embd_type(self) -> u32 {
        match self {
            Quant::Q8_0 => types::Q8_0,
            Quant::Q4KM => types::Q4_K,
        }
    }
}

/// A dense decoder-only transformer's published shape (the `config.json` of its Hugging Face
/// repository, cited per entry).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DenseDesc {
    pub name: &'static str,
    pub source: &'static str,
    pub dims: Dims,
    pub tied: bool,
    /// Per-head q/k RMS norms (Qwen3, Gemma-3).
    pub qk_norm: bool,
}

const fn desc(name: &'static str, source: &'static str, dims: [usize; 7], tied: bool, qk_norm: bool) -> DenseDesc {
    let [layers, hidden, heads, kv_heads, head_dim, ffn, vocab] = dims;
    DenseDesc { name, source, dims: Dims { layers, hidden, heads, kv_heads, head_dim, ffn, vocab }, tied, qk_norm }
}

/// Well-known dense shapes, smallest first: `[layers, hidden, heads, kv heads, head dim, FFN,
/// vocab]`. Qwen3's from the Qwen/Qwen3-* `config.json` files (0.6B, 4B, 8B and 32B checked
/// against copies of them in this session's reference search; 1.7B is
/// `model::ModelShape::qwen3_1_7b` and the synthetic GGUF). Qwen3.6-27B is not here: its
/// dimensions are not in the shared sources (and its family mixes linear-attention layers: not a
/// plain dense stack).
pub const DENSE_MODELS: &[DenseDesc] = &[
    desc("Qwen3-0.6B", "huggingface.co/Qwen/Qwen3-0.6B config.json", [28, 1024, 16, 8, 128, 3072, 151936], true, true),
    desc("Qwen3-1.7B", "huggingface.co/Qwen/Qwen3-1.7B config.json", [28, 2048, 16, 8, 128, 6144, 151936], true, true),
    desc("Llama-3.2-3B", "huggingface.co/meta-llama/Llama-3.2-3B config.json", [28, 3072, 24, 8, 128, 8192, 128256], true, false),
    desc("Qwen3-4B", "huggingface.co/Qwen/Qwen3-4B config.json", [36, 2560, 32, 8, 128, 9728, 151936], true, true),
    desc("Llama-3.1-8B", "huggingface.co/meta-llama/Llama-3.1-8B config.json", [32, 4096, 32, 8, 128, 14336, 128256], false, false),
    desc("Qwen3-8B", "huggingface.co/Qwen/Qwen3-8B config.json", [36, 4096, 32, 8, 128, 12288, 151936], false, true),
    desc("Qwen3-14B", "huggingface.co/Qwen/Qwen3-14B config.json", [40, 5120, 40, 8, 128, 17408, 151936], false, true),
    desc("Gemma-3-27B", "huggingface.co/google/gemma-3-27b-it config.json (text_config)", [62, 5376, 32, 16, 128, 21504, 262208], true, true),
    desc("Qwen3-32B", "huggingface.co/Qwen/Qwen3-32B config.json", [64, 5120, 64, 8, 128, 25600, 151936], false, true),
    desc("Llama-3.1-70B", "huggingface.co/meta-llama/Llama-3.1-70B config.json", [80, 8192, 64, 8, 128, 28672, 128256], false, false),
];

/// The board and the run.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Board {
    pub ram_bytes: u64,
    /// Context (KV cache) tokens.
    pub ctx: usize,
    /// Prefill ubatch rows.
    pub ubatch: usize,
    pub stream: StreamRate,
}

impl Board {
    pub fn new(ram_gib: f64) -> Board {
        Board { ram_bytes: (ram_gib * (1u64 << 30) as f64) as u64, ctx: 4096, ubatch: 512, stream: StreamRate::BOARD }
    }
}

/// Where a layer weight's prefill runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    /// Tiles resident in NPU memory.
    Resident,
    /// Tiles read from the `.orkpack` cache into the ring per ubatch.
    Streamed,
    /// ggml-cpu (the NPU layout cannot hold the shape).
    Cpu,
}

/// The board plan of one model.
#[derive(Clone, Debug)]
pub struct BoardPlan {
    /// Per `BoardModel::matmuls` entry.
    pub place: Vec<Place>,
    /// ORK's bytes of each matmul (int8 tiles of every term + scales): the tests check them; the
    /// tool prints their sums.
    #[cfg_attr(not(test), allow(dead_code))]
    pub npu_bytes: Vec<u64>,
    pub gguf_bytes: u64,
    pub kv_bytes: u64,
    pub compute_bytes: u64,
    /// ORK's per-core scratch and the stream ring.
    pub scratch_bytes: u64,
    pub resident_bytes: u64,
    pub streamed_bytes: u64,
    /// GGUF bytes of the weights ggml-cpu runs in prefill too (head, embedding, norms, shapes the
    /// NPU cannot hold).
    pub cpu_bytes: u64,
    /// Everything but the resident tiles: GGUF + KV + compute + scratch + process base.
    pub fixed_bytes: u64,
    pub peak_rss: u64,
    /// The budget for resident tiles: RAM − OS reserve − `fixed_bytes` (0 when negative).
    pub resident_budget: u64,
    /// Whether the process fits (`peak_rss` + OS reserve ≤ RAM).
    pub fits: bool,
    /// Predicted pp`ubatch` tok/s with the plan, and CPU-only.
    pub pp_npu: f64,
    pub pp_cpu: f64,
    /// Predicted decode tok/s (ggml-cpu either way).
    pub decode: f64,
    /// Seconds per ubatch: the NPU MUL_MATs with host, the streamed bytes' reads.
    pub npu_s: f64,
    pub stream_s: f64,
}

/// llama.cpp's compute buffer for a `ubatch`-row prefill, **estimated**: f32 activations of the
/// widest layer intermediates (gate, up and their product over FFN; Q/K/V/attention output and
/// the residual over the hidden width), flash attention (llama.cpp's `auto` picks it on the
/// CPU: no M × ctx score matrix), and one row of logits.
pub fn compute_bytes(m: &BoardModel, ubatch: usize) -> u64 {
    let d = &m.dims;
    4 * (ubatch * (3 * d.ffn + 6 * d.hidden.max(d.heads * d.head_dim)) + d.vocab) as u64
}

/// ORK's bytes for one weight: every int8 term's tiles with the tile sets the plans read,
/// page-rounded (what the residency budget counts, `Npu::term_bytes`, one copy: the vendor
/// driver), and the f32 scales (row scales, column scales, the second term's row scales).
pub fn npu_bytes(cfg: &Config, model: &CostModel, w: &Weight, work: &precision::RoleWork) -> u64 {
    let soc = &model.soc;
    let smallest_m = if cfg.decode == DecodeSelect::Npu { 1 } else { cfg.min_m.max(1) };
    let sets = ggml_ork::npu::plan::tile_sets(soc, w.n, w.k, smallest_m);
    let tiles = ggml_ork::npu::kif::page_round(WeightGeometry::with_sets(soc, w.n, w.k, sets).total_bytes) as u64;
    let t = precision::decide(cfg, w.role, types::is_float(w.ggml_type), work, w.k).terms;
    let scales = 4 * (w.n + w.k + if t.weight > 1 { w.n } else { 0 }) as u64;
    tiles * t.weight as u64 + scales
}

/// Whether the NPU layout holds the weight's shape.
fn npu_holds(model: &CostModel, w: &Weight) -> bool {
    w.k % model.soc.k_align as usize == 0 && w.n % model.soc.n_align as usize == 0 && types::weight_type(w.ggml_type).is_some()
}

/// Plans `m` on `board` (see the module docs for the model).
pub fn plan(cfg: &Config, model: &CostModel, m: &BoardModel, board: &Board) -> BoardPlan {
    let work = m.role_work();
    let cores = cfg.max_cores.unwrap_or(model.soc.cores);
    let holds: Vec<bool> = m.matmuls.iter().map(|w| npu_holds(model, w)).collect();
    let npu_bytes: Vec<u64> = m.matmuls.iter().map(|w| npu_bytes(cfg, model, w, &work)).collect();
    let gguf_bytes = m.gguf_bytes();
    let kv_bytes = m.kv_bytes(board.ctx);
    let compute = compute_bytes(m, board.ubatch);
    // Per core: the activation int8 rows and the int32 outputs of the widest MUL_MAT.
    let widest = m.matmuls.iter().map(|w| w.k.max(w.n)).max().unwrap_or(0) as u64;
    let core_scratch = cores as u64 * board.ubatch as u64 * widest * 5;
    let largest = npu_bytes.iter().copied().max().unwrap_or(0);
    let fixed_no_ring = gguf_bytes + kv_bytes + compute + core_scratch + PROCESS_BASE_BYTES;
    let total_npu: u64 = npu_bytes.iter().zip(&holds).filter(|(_, &h)| h).map(|(b, _)| b).sum();
    let avail = board.ram_bytes.saturating_sub(OS_RESERVE_BYTES + fixed_no_ring);
    // The ring only where something streams.
    let ring = if avail >= total_npu { 0 } else { STREAM_RING_WEIGHTS * largest };
    let fixed_bytes = fixed_no_ring + ring;
    let resident_budget = board.ram_bytes.saturating_sub(OS_RESERVE_BYTES + fixed_bytes);
    // Resident in the order the graph runs them (layer order); the rest streams.
    let (mut used, mut place) = (0u64, Vec::with_capacity(m.matmuls.len()));
    for (b, &h) in npu_bytes.iter().zip(&holds) {
        place.push(if !h {
            Place::Cpu
        } else if used + b <= resident_budget {
            used += b;
            Place::Resident
        } else {
            Place::Streamed
        });
    }
    let streamed_bytes: u64 = npu_bytes.iter().zip(&place).filter(|(_, p)| **p == Place::Streamed).map(|(b, _)| b).sum();
    let cpu_bytes = gguf_bytes - m.matmuls.iter().zip(&place).filter(|(_, p)| **p != Place::Cpu).map(|(w, _)| w.gguf_bytes()).sum::<u64>();
    let peak_rss = fixed_bytes + used;
    let fits = peak_rss + OS_RESERVE_BYTES <= board.ram_bytes;

    // Rates.
    let ub = board.ubatch;
    let attn = 2.0 * (ub * ub) as f64 * (m.dims.heads * m.dims.head_dim) as f64 * m.dims.layers as f64 / model.cpu_ops;
    let head_s = |rows: usize| m.head.as_ref().map_or(0.0, |w| model.cpu_s(rows, w.k, w.n, w.ggml_type));
    let (mut npu_s, mut cpu_pre_s, mut cpu_dec_s) = (0.0, 0.0, 0.0);
    for (w, p) in m.matmuls.iter().zip(&place) {
        let prec = precision::decide(cfg, w.role, types::is_float(w.ggml_type), &work, w.k);
        let cpu = model.cpu_s(ub, w.k, w.n, w.ggml_type);
        cpu_pre_s += cpu;
        cpu_dec_s += model.cpu_s(1, w.k, w.n, w.ggml_type);
        npu_s += match p {
            Place::Cpu => cpu,
            _ => {
                let host = if prec.mean_correct && model.host.is_some() { model.mean_correct_s(ub, w.k, w.n) } else { 0.0 };
                model.npu_host(ub, w.k, w.n, prec.terms, cores, crate::cost::chain(crate::cost::layer_link(w.role), prec)).0 + host
            }
        };
    }
    let rate = board.stream.bps();
    let stream_s = streamed_bytes as f64 / rate;
    // The first streamed weight's read is exposed (nothing runs before it in the ring).
    let first = npu_bytes.iter().zip(&place).find(|(_, p)| **p == Place::Streamed).map_or(0.0, |(b, _)| *b as f64 / rate);
    let tail = attn + head_s(1);
    let pre = npu_s.max(stream_s) + first + tail;
    let pre_cpu = cpu_pre_s + tail;
    let dec = cpu_dec_s + head_s(1);
    BoardPlan {
        place,
        npu_bytes,
        gguf_bytes,
        kv_bytes,
        compute_bytes: compute,
        scratch_bytes: core_scratch + ring,
        resident_bytes: used,
        streamed_bytes,
        cpu_bytes,
        fixed_bytes,
        peak_rss,
        resident_budget,
        fits,
        pp_npu: ub as f64 / pre,
        pp_cpu: ub as f64 / pre_cpu,
        decode: 1.0 / dec,
        npu_s,
        stream_s,
    }
}

/// The largest model of [`DENSE_MODELS`] in `quant` that fits `board` with every prefill
/// MUL_MAT on the NPU (resident or streamed), with its plan.
pub fn largest_fitting(cfg: &Config, model: &CostModel, board: &Board, quant: Quant) -> Option<(DenseDesc, BoardModel, BoardPlan)> {
    DENSE_MODELS
        .iter()
        .map(|d| {
            let bm = BoardModel::from_desc(d, quant);
            let p = plan(cfg, model, &bm, board);
            (*d, bm, p)
        })
        .filter(|(_, bm, p)| p.fits && p.place.iter().all(|&x| x != Place::Cpu) && !bm.matmuls.is_empty())
        .max_by_key(|(_, bm, _)| bm.params())
}

/// One tensor of a GGUF directory: name, dimensions (ggml order: K first), ggml type.
pub type TensorInfo<'a> = (&'a str, &'a [u64], u32);

/// The model from a GGUF's tensor directory and its `{arch}.*` metadata (`kv` looks a key up
/// as text). Layer MUL_MATs are the 2-D `blk.*` weights; the head is `output.weight`, or the
/// token embedding when there is none (tied); everything else (embedding, norms, 3-D expert
/// tensors) is read in place by ggml-cpu.
pub fn from_gguf(name: &str, kv: &dyn Fn(&str) -> Option<String>, tensors: &[TensorInfo<'_>]) -> BoardModel {
    let arch = kv("general.architecture").unwrap_or_default();
    let num = |key: &str| kv(&format!("{arch}.{key}")).and_then(|v| v.parse::<usize>().ok());
    let bytes = |dims: &[u64], ty: u32| (dims.iter().product::<u64>() as f64 * bytes_per_weight(ty)).round() as u64;
    let (mut matmuls, mut head, mut embd, mut other_bytes) = (Vec::new(), None, None, 0u64);
    for &(tname, dims, ty) in tensors {
        let w = || Weight { name: tname.to_string(), k: dims[0] as usize, n: dims[1] as usize, ggml_type: ty, role: Role::of(tname) };
        if dims.len() == 2 && tname.starts_with("blk.") {
            matmuls.push(w());
        } else if dims.len() == 2 && tname == "output.weight" {
            head = Some(w());
        } else if dims.len() == 2 && tname == "token_embd.weight" {
            embd = Some(w());
        } else {
            other_bytes += bytes(dims, ty);
        }
    }
    let head_tied = head.is_none() && embd.is_some();
    let vocab = head.as_ref().or(embd.as_ref()).map_or(0, |w| w.n);
    if head_tied {
        head = embd.take().map(|mut w| {
            w.role = Role::Head;
            w
        });
    } else if let Some(e) = embd {
        other_bytes += e.gguf_bytes();
    }
    let hidden = num("embedding_length").unwrap_or(0);
    let heads = num("attention.head_count").unwrap_or(1).max(1);
    BoardModel {
        name: name.to_string(),
        dims: Dims {
            layers: num("block_count").unwrap_or(0),
            hidden,
            heads,
            kv_heads: num("attention.head_count_kv").unwrap_or(heads),
            head_dim: num("attention.key_length").unwrap_or(hidden / heads),
            ffn: num("feed_forward_length").unwrap_or(0),
            vocab,
        },
        matmuls,
        head,
        head_tied,
        other_bytes,
    }
}

/// Real values of the planner's plans (`ork-route --ram`); `tests/board_plan.rs` runs the binary.
#[cfg(test)]
mod tests {
    use super::*;
    use ggml_ork::npu::soc::SocId;

    fn cfg() -> Config {
        Config::from_lookup(|_| None).0
    }

    fn desc(name: &str) -> &'static DenseDesc {
        DENSE_MODELS.iter().find(|d| d.name == name).expect(name)
    }

    const GIB: u64 = 1 << 30;

    #[test]
    fn every_dense_weight_is_resident_or_streamed_and_the_peak_fits() {
        let (c, model) = (cfg(), crate::cost::for_soc(SocId::Rk3588));
        // Qwen3-8B Q8_0: 36 layers × 7 MUL_MATs; its int8 tiles (~7 GiB) do not all fit a 16 GiB
        // board beside its 8 GiB GGUF mapping.
        let m = BoardModel::from_desc(desc("Qwen3-8B"), Quant::Q8_0);
        assert_eq!(m.matmuls.len(), 36 * 7);
        let b = Board::new(16.0);
        let p = plan(&c, &model, &m, &b);
        // One weight's ORK bytes by hand: attn_q 4096 × 4096, K in the full-K envelope (one tile
        // set), no padding at this shape, one int8 term, f32 row and column scales.
        let q = m.matmuls.iter().position(|w| w.name == "blk.0.attn_q.weight").unwrap();
        assert_eq!(p.npu_bytes[q], 4096 * 4096 + 4 * (4096 + 4096));
        let all: u64 = p.npu_bytes.iter().sum();
        assert_eq!(p.resident_bytes + p.streamed_bytes, all, "resident + streamed = every dense weight's tiles");
        assert!(p.streamed_bytes > 0 && p.resident_bytes > 0, "{p:?}");
        assert!(p.place.iter().all(|&x| x != Place::Cpu));
        assert!(p.resident_bytes <= p.resident_budget);
        assert!(p.fits && p.peak_rss + OS_RESERVE_BYTES <= b.ram_bytes, "peak {} of {}", p.peak_rss, b.ram_bytes);
        // The peak is its parts: fixed (GGUF, KV, compute, scratch and ring, process) + tiles.
        assert_eq!(p.peak_rss, p.gguf_bytes + p.kv_bytes + p.compute_bytes + p.scratch_bytes + PROCESS_BASE_BYTES + p.resident_bytes);
        // KV: 36 layers × 8 heads × 128 × 4096 tokens × K and V × f16.
        assert_eq!(p.kv_bytes, 36 * 8 * 128 * 4096 * 2 * 2);
        // Residency is filled in graph order, first fit: what is left of the budget is smaller than
        // any weight that streams.
        let smallest_streamed = p.npu_bytes.iter().zip(&p.place).filter(|(_, &x)| x == Place::Streamed).map(|(b, _)| *b).min().unwrap();
        assert!(p.resident_budget - p.resident_bytes < smallest_streamed, "{} left, a {smallest_streamed}-byte weight streams", p.resident_budget - p.resident_bytes);
        // More RAM: more resident, less streamed, same total; enough RAM: nothing streams.
        let p32 = plan(&c, &model, &m, &Board::new(32.0));
        assert_eq!(p32.streamed_bytes, 0);
        assert_eq!(p32.resident_bytes, all);
        assert!(p32.pp_npu > p.pp_npu, "streamed bytes cost time: {} vs {}", p32.pp_npu, p.pp_npu);
        // The NPU prefill beats the CPU's, decode is ggml-cpu's in both plans.
        assert!(p.pp_npu > 3.0 * p.pp_cpu, "{} vs {}", p.pp_npu, p.pp_cpu);
        assert_eq!(p.decode, p32.decode);
    }

    #[test]
    fn a_model_bigger_than_ram_does_not_fit() {
        let (c, model) = (cfg(), crate::cost::for_soc(SocId::Rk3588));
        let m = BoardModel::from_desc(desc("Llama-3.1-70B"), Quant::Q8_0);
        let p = plan(&c, &model, &m, &Board::new(32.0));
        assert!(!p.fits && m.gguf_bytes() > 32 * GIB, "{p:?}");
        assert_eq!(p.resident_bytes, 0);
    }

    #[test]
    fn the_largest_model_per_board() {
        let (c, model) = (cfg(), crate::cost::for_soc(SocId::Rk3588));
        let big = |ram: f64, q: Quant| largest_fitting(&c, &model, &Board::new(ram), q).expect("something fits");
        // 32 GiB: at least a 27B Q4_K_M with every prefill MUL_MAT on the NPU.
        let (d, m, p) = big(32.0, Quant::Q4KM);
        assert!(m.params() >= 27_000_000_000, "{} {}", d.name, m.params());
        assert!(p.place.iter().all(|&x| x != Place::Cpu) && p.fits && p.pp_npu > p.pp_cpu);
        // A bigger board never holds a smaller largest model; Q8_0 never a bigger one than Q4_K_M.
        for q in Quant::ALL {
            assert!(big(32.0, q).1.params() >= big(16.0, q).1.params());
        }
        assert!(big(16.0, Quant::Q8_0).1.params() <= big(16.0, Quant::Q4KM).1.params());
    }

    #[test]
    fn a_gguf_header_and_its_description_agree() {
        // The synthetic Qwen3-1.7B shape of the environment cache (vocab 49152), quantized by
        // llama-quantize: its tensor directory gives the same weights and types as the description
        // with the Q4_K_M rule, and its tensor bytes are the file's less the header and alignment.
        let env = std::env::var("ORK_ENV").unwrap_or_else(|_| format!("{}/.cache/ggml-ork-env", std::env::var("HOME").unwrap_or_default()));
        let path = format!("{env}/synth/synth-qwen3-1.7b-Q4_K_M.gguf");
        let Ok((kv, tensors)) = crate::gguf::read_gguf(&path) else {
            eprintln!("skipped: no {path} (tests/setup-env.sh makes it)");
            return;
        };
        let infos: Vec<TensorInfo<'_>> = tensors.iter().map(|t| (t.name.as_str(), t.dims.as_slice(), t.ggml_type)).collect();
        let lookup = |k: &str| kv.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        let from_file = from_gguf("synth", &lookup, &infos);
        let base = desc("Qwen3-1.7B");
        let d = DenseDesc { dims: Dims { vocab: 49152, ..base.dims }, ..*base };
        let from_desc = BoardModel::from_desc(&d, Quant::Q4KM);
        let key = |m: &BoardModel| {
            let mut v: Vec<_> = m.matmuls.iter().map(|w| (w.name.clone(), w.k, w.n, w.ggml_type)).collect();
            v.sort();
            v
        };
        assert_eq!(key(&from_file), key(&from_desc));
        let f = &from_file.dims;
        assert_eq!((f.layers, f.hidden, f.kv_heads, f.head_dim, f.ffn, f.vocab), (28, 2048, 8, 128, 6144, 49152));
        assert!(from_file.head_tied && from_file.head.as_ref().map(|h| h.ggml_type) == from_desc.head.as_ref().map(|h| h.ggml_type));
        assert_eq!(from_file.gguf_bytes(), from_desc.gguf_bytes());
        let file = std::fs::metadata(&path).unwrap().len();
        assert!(file > from_file.gguf_bytes() && file - from_file.gguf_bytes() < 8 << 20, "file {file}, tensors {}", from_file.gguf_bytes());
    }
}
