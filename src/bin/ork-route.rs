//! `ork-route MODEL.gguf`: the routing table of a model — per weight tensor, the engine for
//! prefill and for decode and why — plus the cost model's predicted RK3588 rates next to the
//! published anchors (see `src/route/mod.rs` for the model and its sources).
//!
//! The GGUF tensor directory is read directly (header, KV pairs skipped by type, tensor infos):
//! no llama.cpp needed. The same `ORK_*` variables as the plugin apply (`ORK_ROUTE`, `ORK_MINM`,
//! `ORK_DECODE`, `ORK_ACT_TERMS`, ...); `--m N` sets the prefill ubatch rows (default 512).

use ggml_ork::config::Config;
use ggml_ork::route::{self, Availability, CostModel, Engine, MatMul, ModelShape};
use std::io::{BufReader, Read};

#[derive(Debug, thiserror::Error)]
enum GgufError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("not a GGUF file (magic {0:?})")]
    Magic([u8; 4]),
    #[error("unknown GGUF value type {0}")]
    Type(u32),
    #[error("implausible GGUF field: {0}")]
    Bad(String),
}

/// Longest string (key, value, tensor name) accepted from a GGUF header.
const MAX_GGUF_STRING: u64 = 1 << 20;
/// Largest tensor dimension accepted (ggml's `ne` is int64; no real weight comes near this).
const MAX_DIM: u64 = 1 << 31;

struct Tensor {
    name: String,
    dims: Vec<u64>,
    ggml_type: u32,
}

struct Reader<R: Read>(R);

impl<R: Read> Reader<R> {
    fn bytes<const N: usize>(&mut self) -> Result<[u8; N], GgufError> {
        let mut b = [0u8; N];
        self.0.read_exact(&mut b)?;
        Ok(b)
    }
    fn u32(&mut self) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.bytes()?))
    }
    fn u64(&mut self) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.bytes()?))
    }
    fn string(&mut self) -> Result<String, GgufError> {
        let n = self.u64()?;
        if n > MAX_GGUF_STRING {
            return Err(GgufError::Bad(format!("string of {n} bytes")));
        }
        let mut b = vec![0u8; n as usize];
        self.0.read_exact(&mut b)?;
        Ok(String::from_utf8_lossy(&b).into_owned())
    }
    /// Reads a value of GGUF type `t`; returns it as text for scalars/strings we care about.
    fn value(&mut self, t: u32) -> Result<Option<String>, GgufError> {
        Ok(match t {
            0 | 1 | 7 => Some(self.bytes::<1>()?[0].to_string()),
            2 | 3 => Some(u16::from_le_bytes(self.bytes()?).to_string()),
            4 => Some(self.u32()?.to_string()),
            5 => Some(i32::from_le_bytes(self.bytes()?).to_string()),
            6 => Some(f32::from_le_bytes(self.bytes()?).to_string()),
            8 => Some(self.string()?),
            9 => {
                let (et, n) = (self.u32()?, self.u64()?);
                for _ in 0..n {
                    self.value(et)?;
                }
                None
            }
            10 | 11 => Some(self.u64()?.to_string()),
            12 => Some(f64::from_le_bytes(self.bytes()?).to_string()),
            other => return Err(GgufError::Type(other)),
        })
    }
}

/// GGUF key/value pairs (scalars and strings as text) and the tensor directory.
type Gguf = (Vec<(String, String)>, Vec<Tensor>);

fn read_gguf(path: &str) -> Result<Gguf, GgufError> {
    let mut r = Reader(BufReader::new(std::fs::File::open(path)?));
    let magic = r.bytes::<4>()?;
    if &magic != b"GGUF" {
        return Err(GgufError::Magic(magic));
    }
    let _version = r.u32()?;
    let (nt, nkv) = (r.u64()?, r.u64()?);
    let mut kv = Vec::new();
    for _ in 0..nkv {
        let k = r.string()?;
        let t = r.u32()?;
        if let Some(v) = r.value(t)? {
            kv.push((k, v));
        }
    }
    let mut tensors = Vec::new();
    for _ in 0..nt {
        let name = r.string()?;
        let nd = r.u32()?;
        if nd > 4 {
            return Err(GgufError::Bad(format!("tensor {name} has {nd} dimensions")));
        }
        let dims = (0..nd).map(|_| r.u64()).collect::<Result<Vec<_>, _>>()?;
        if dims.iter().any(|&d| d > MAX_DIM) {
            return Err(GgufError::Bad(format!("tensor {name} has dimensions {dims:?}")));
        }
        let ggml_type = r.u32()?;
        let _offset = r.u64()?;
        tensors.push(Tensor { name, dims, ggml_type });
    }
    Ok((kv, tensors))
}

fn type_name(t: u32) -> &'static str {
    ggml_ork::quant::types::weight_type(t).map_or("other", |w| w.name)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let Some(path) = args.iter().skip(1).find(|a| !a.starts_with("--") && a.parse::<usize>().is_err()) else {
        eprintln!("usage: ork-route MODEL.gguf [--m ROWS]");
        std::process::exit(2);
    };
    let m_prefill = args.iter().position(|a| a == "--m").and_then(|i| args.get(i + 1)).and_then(|v| v.parse().ok()).unwrap_or(512usize);
    if !(1..=1 << 20).contains(&m_prefill) {
        eprintln!("ork-route: --m must be 1..=1048576 rows");
        std::process::exit(2);
    }
    let (kv, tensors) = match read_gguf(path) {
        Ok(x) => x,
        Err(e) => {
            eprintln!("ork-route: {path}: {e}");
            std::process::exit(1);
        }
    };
    let cfg = Config::from_lookup(|k| std::env::var(k).ok()).0;
    let id = cfg.soc.as_deref().and_then(ggml_ork::npu::soc::SocId::parse).unwrap_or(ggml_ork::npu::soc::SocId::Rk3588);
    let model = CostModel::for_soc(id);
    let arch = kv.iter().find(|(k, _)| k == "general.architecture").map_or("?", |(_, v)| v.as_str());
    println!("# {path} ({arch}, {} tensors); policy ORK_ROUTE={:?}, ORK_MINM={}, ORK_DECODE={:?}; SoC {}", tensors.len(), cfg.route, cfg.min_m, cfg.decode, model.soc.id.name());
    println!("{:<28} {:>14} {:>7} | {:<8} {:<8} | why (prefill M={m_prefill}; decode M=1)", "tensor", "K x N", "type", "prefill", "decode");
    let has_output = tensors.iter().any(|t| t.name == "output.weight");
    let av = Availability { gpu: cfg.decode == ggml_ork::config::DecodeSelect::Gpu, npu_busy: false };
    let mut counts = std::collections::BTreeMap::<(&str, &str), usize>::new();
    let mut layer_shapes: Vec<(usize, usize, u32, route::precision::Role)> = Vec::new();
    let mut head = None;
    for t in &tensors {
        let (k, n) = (t.dims.first().copied().unwrap_or(0) as usize, t.dims.get(1).copied().unwrap_or(1) as usize);
        let fixed = |why: &str| (Engine::Cpu, Engine::Cpu, why.to_string());
        let (pre, dec, why) = if t.dims.len() < 2 {
            fixed("1-D (norm/bias): element-wise ops stay on ggml-cpu")
        } else if t.dims.len() > 2 && t.dims[2] > 1 {
            fixed("3-D expert tensor: MUL_MAT_ID stays on ggml-cpu's fused MoE path (ORK refuses MUL_MAT_ID)")
        } else if t.name == "token_embd.weight" {
            if has_output {
                fixed("GET_ROWS (embedding lookup) is not a MUL_MAT: ggml-cpu")
            } else {
                fixed("tied embedding: placed for GET_ROWS on ggml-cpu, so the LM head MUL_MAT runs there too")
            }
        } else if ggml_ork::quant::types::weight_type(t.ggml_type).is_none() {
            fixed("weight type ORK does not dequantize: ggml-cpu")
        } else if k % model.soc.k_align as usize != 0 || n % model.soc.n_align as usize != 0 {
            fixed("K or N not a multiple of 32: the NPU layout cannot hold it")
        } else {
            let p = route::decide_with(&cfg, &model, &MatMul { m: m_prefill, k, n, ggml_type: t.ggml_type }, av);
            let d = route::decide_with(&cfg, &model, &MatMul { m: 1, k, n, ggml_type: t.ggml_type }, av);
            if t.name.starts_with("blk.0.") {
                layer_shapes.push((k, n, t.ggml_type, route::precision::Role::of(&t.name)));
            }
            if t.name == "output.weight" {
                head = Some((k, n, t.ggml_type));
            }
            (p.engine, d.engine, format!("{} | {}", p.why(), d.why()))
        };
        *counts.entry((pre.name(), dec.name())).or_default() += 1;
        println!("{:<28} {:>14} {:>7} | {:<8} {:<8} | {why}", t.name, format!("{k} x {n}"), type_name(t.ggml_type), pre.name(), dec.name());
    }
    println!("\n# summary (prefill engine, decode engine): count");
    for ((p, d), c) in &counts {
        println!("#   ({p}, {d}): {c}");
    }
    let layers = tensors.iter().filter(|t| t.name.ends_with("attn_norm.weight")).count();
    if layers > 0 && !layer_shapes.is_empty() {
        let shape = ModelShape { layers, per_layer: layer_shapes, head, attn_dim: 0 };
        let r = route::predict(&cfg, &model, &shape, m_prefill);
        println!("\n# predicted for this model on {} with this policy: prefill {:.0} tok/s (M={m_prefill}), decode {:.1} tok/s (LM head on the CPU when tied; attention not modelled)", model.soc.id.name(), r.prefill_tok_s, r.decode_tok_s);
    }
    // The anchors' model, one-term W8A8 as they measured, with ork's own engine (no llama.cpp
    // split overhead) and with this plugin's defaults inside llama.cpp.
    let q = ModelShape::qwen3_1_7b();
    let anchors_cfg = Config::from_lookup(|k| match k {
        "ORK_ACT_TERMS" | "ORK_WEIGHT_TERMS" => Some("1".into()),
        "ORK_DECODE" => Some("npu".into()),
        _ => None,
    })
    .0;
    // The anchors ran their own engines' host paths: the NPU-only model is what they calibrate.
    let mut fused = CostModel::npu_only(ggml_ork::npu::soc::SocId::Rk3588);
    fused.split_s = 0.0;
    let a = route::predict(&anchors_cfg, &fused, &q, 256);
    println!("\n# Qwen3-1.7B Q8_0 on RK3588, cost model vs published anchors (tok/s):");
    println!("#   predicted, W8A8 1 term, all on the NPU, no split overhead: prefill {:.0} (pp256), decode {:.1}", a.prefill_tok_s, a.decode_tok_s);
    // Each precision setting inside llama.cpp (this policy's routing; the environment's other
    // variables apply, the precision ones are set per line).
    let rot = |work: &'static str| -> [(&'static str, &'static str); 5] {
        [("ORK_ROTATE", "1"), ("ORK_NPU_WORK", work), ("ORK_MEAN_CORRECT", ""), ("ORK_ACT_TERMS", ""), ("ORK_WEIGHT_TERMS", "")]
    };
    let (default, v, attn, wide) = (rot(""), rot("1.05"), rot("1.15"), rot("1.40"));
    let settings: [(&str, &[(&str, &str)]); 6] = [
        ("this environment's precision settings", &[]),
        ("default: rotated, the calibrated correction, ORK_NPU_WORK=1 (one term in every layer)", &default),
        ("rotated, extra terms within ORK_NPU_WORK=1.05", &v),
        ("rotated, extra terms within ORK_NPU_WORK=1.15", &attn),
        ("rotated, extra terms within ORK_NPU_WORK=1.40", &wide),
        ("unrotated multi-term (ORK_ROTATE=0: 2 weight, 2 activation terms)", &[("ORK_ROTATE", "0"), ("ORK_ACT_TERMS", ""), ("ORK_WEIGHT_TERMS", "")]),
    ];
    for (what, set) in settings {
        let c = Config::from_lookup(|k| match set.iter().find(|(n, _)| *n == k) {
            Some((_, v)) => (!v.is_empty()).then(|| v.to_string()),
            None => std::env::var(k).ok(),
        })
        .0;
        let (counts, work) = (q.role_counts(), q.role_work());
        let terms = route::precision::Role::ALL.map(|r| route::precision::terms_for(&c, r, false, &work));
        let b = route::predict(&c, &CostModel::for_soc(ggml_ork::npu::soc::SocId::Rk3588), &q, 256);
        println!(
            "#   predicted, {what} inside llama.cpp, with host: prefill {:.0}, decode {:.1} (the layers' NPU work {:.2}x plain W8A8; rows {:.2}x with the head)",
            b.prefill_tok_s,
            b.decode_tok_s,
            route::precision::work_ratio(&terms, &work),
            route::precision::rows_ratio(&terms, &counts)
        );
    }
    // NPU only against the NPU with the host's measured work around each run (route::HostCost).
    let here = Config::from_lookup(|k| std::env::var(k).ok()).0;
    let rk = ggml_ork::npu::soc::SocId::Rk3588;
    let (npu, host) = (CostModel::npu_only(rk), CostModel::for_soc(rk));
    let (a, b) = (route::predict(&here, &npu, &q, 512), route::predict(&here, &host, &q, 512));
    let w = route::prefill_work(&here, &host, &q, 512);
    let h = host.host;
    println!("#   Qwen3-1.7B Q8_0 pp512 on RK3588: NPU only {:.0} tok/s, with host {:.0} tok/s", a.prefill_tok_s, b.prefill_tok_s);
    println!(
        "#     host per MUL_MAT = {:.2} (an A76 core over this machine's: an assumption) x (act-quant {:.3} ns per row·K + output {:.3} ns per row·N + NPU runs' host part {:.3} ns per row·(K + N) + {:.1} µs per MUL_MAT), {}; \
         per prompt token at M=512: {:.2} submits on the busiest core, {:.0} row·K, {:.0} row·N over {} MUL_MATs",
        h.a76,
        h.act_quant_s * 1e9,
        h.output_s * 1e9,
        h.npu_io_s * 1e9,
        h.matmul_s * 1e6,
        if h.pipelined {
            "the activation and output passes of MUL_MATs cut into pieces overlapping the NPU (npu::plan::pipeline_rows), the NPU runs' host part after each submit"
        } else {
            "after one another with the NPU runs (nothing pipelined)"
        },
        w.submits_per_token,
        w.row_k_per_token,
        w.row_n_per_token,
        w.matmuls
    );
    println!("#   anchors: ork/llama.cpp prefill 178 (rknpu-facts §4) .. 278 pp256 (seed 002), decode 12.8 (seed 002), 11.0 (seed 000); librkllmrt 184 / 11.71 (seed 002); CPU only 35.5 / 9.43 (seed 001)");
}
