//! `ork-route MODEL.gguf`: the routing table of a model — per weight tensor, the engine for
//! prefill and for decode and why — plus the cost model's predicted RK3588 rates next to the
//! published anchors (see `src/route/mod.rs` for the cost model and its sources).
//!
//! The GGUF tensor directory is read directly (header, KV pairs skipped by type, tensor infos):
//! no llama.cpp needed. The same `ORK_*` variables as the plugin apply (`ORK_ROUTE`, `ORK_MINM`,
//! `ORK_DECODE`, `ORK_ACT_TERMS`, ...); `--m N` sets the prefill ubatch rows (default 512).
//!
//! `--ram GB[,GB..]` plans a board instead ([`board`]): what stays resident on the NPU, what
//! streams from the `.orkpack` cache, what stays on the CPU, the predicted peak RSS and
//! prefill/decode rates, for the GGUF given (its tensor directory only: no tensor data is read)
//! or, with `--model NAME|all [--quant Q4_K_M|Q8_0]`, for built-in dense shapes
//! (`board::DENSE_MODELS`), with the largest that fits each board.
//!
//! Every rate and time it prints is modelled, not measured, and its first line says so and what
//! it assumes ([`print_assumptions`]): the NPU at the cost model's published rates, the host's
//! work at this machine's frozen figures (`ggml_ork::route::HostCost`, one measurement each)
//! scaled by `A76_OVER_HERE` (an assumption). The anchors it prints next to them (Qwen3-1.7B
//! int8, RK3588): prefill 178 tok/s (rknpu-facts §4) to 278 tok/s pp256 (seed 002), decode
//! 12.8 tok/s (seed 002; 11.0 in seed 000); librkllmrt 184 / 11.71 (seed 002).
//!
//! The tool's own code, outside the library: the board planner ([`board`]), what it adds to the
//! cost model ([`cost`]), the GGUF header reader ([`gguf`]) and a whole model's predicted rates
//! ([`model`]); the cost model it prices them with is the library's (`ggml_ork::route`).

mod board;
mod cost;
mod gguf;
mod model;

use clap::Parser;
use ggml_ork::config::Config;
use ggml_ork::route::{self, Availability, CostModel, Engine, MatMul};
use gguf::read_gguf;
use model::{predict, prefill_work, ModelShape};

fn type_name(t: u32) -> &'static str {
    ggml_ork::quant::types::weight_type(t).map_or("other", |w| w.name)
}

/// Command line: `MODEL.gguf` and `--flag VALUE` pairs (a flag given twice: the last one counts).
#[derive(Parser)]
#[command(
    name = "ork-route",
    about = "The routing table of a GGUF model (per weight: prefill and decode engine, and why), or a board plan (--ram)",
    override_usage = "ork-route MODEL.gguf [--m ROWS] [--npu-mhz MHz]\n       ork-route MODEL.gguf --ram GB[,GB..] [--ctx TOKENS] [--disk-mbps MB/s] [--npu-mhz MHz]\n       ork-route --model NAME|all [--quant Q4_K_M|Q8_0] --ram GB[,GB..] [--ctx TOKENS] [--disk-mbps MB/s] [--npu-mhz MHz]",
    args_override_self = true
)]
struct Args {
    /// The model file (its GGUF header only is read).
    #[arg(value_name = "MODEL.gguf", required_unless_present = "model")]
    path: Option<String>,
    /// Prefill ubatch rows, 1..=1048576.
    #[arg(long = "m", value_name = "ROWS", default_value = "512", value_parser = in_range::<usize>(1, 1 << 20))]
    m_prefill: usize,
    /// Board RAM sizes in GiB (`--ram 16,32`): plan a board instead.
    #[arg(long, value_name = "GB[,GB..]", value_parser = ram_sizes)]
    ram: Option<RamSizes>,
    /// A built-in dense shape (`--model Qwen3-32B`, or `all`) instead of a GGUF; needs --ram.
    #[arg(long, value_name = "NAME|all", requires = "ram")]
    model: Option<String>,
    /// The built-in shape's file type (default: each of them).
    #[arg(long, value_name = "Q4_K_M|Q8_0", value_parser = quant)]
    quant: Option<board::Quant>,
    /// Context (KV cache) tokens of the board plan, 1..=16777216.
    #[arg(long, value_name = "TOKENS", default_value = "4096", value_parser = in_range::<usize>(1, 1 << 24))]
    ctx: usize,
    /// The board disk's read rate in MB/s (default 1500: an NVMe SSD, an assumption).
    #[arg(long, value_name = "MB/s", value_parser = positive)]
    disk_mbps: Option<f64>,
    /// The NPU clock in MHz the board runs at, 1..=10000 (the rates are modelled at 1000).
    #[arg(long, value_name = "MHz", value_parser = in_range::<u64>(1, 10_000))]
    npu_mhz: Option<u64>,
}

/// `--ram`'s list (a type of its own: one value, not one flag per size).
#[derive(Clone)]
struct RamSizes(Vec<f64>);

impl Args {
    /// Board RAM sizes in GiB (empty: no board plan).
    fn ram(&self) -> &[f64] {
        self.ram.as_ref().map_or(&[], |r| &r.0)
    }

    /// The file types of the built-in shapes to plan.
    fn quants(&self) -> Vec<board::Quant> {
        self.quant.map_or(board::Quant::ALL.to_vec(), |q| vec![q])
    }
}

/// A parser of an integer flag in `lo..=hi`.
fn in_range<T: std::str::FromStr + PartialOrd + std::fmt::Display + Copy>(lo: T, hi: T) -> impl Fn(&str) -> Result<T, String> + Clone {
    move |v| v.parse().ok().filter(|x| (lo..=hi).contains(x)).ok_or_else(|| format!("bad value {v:?}: must be {lo}..={hi}"))
}

fn ram_sizes(v: &str) -> Result<RamSizes, String> {
    v.split(',').map(|g| g.parse::<f64>().ok().filter(|g| *g > 0.0 && *g < 1e6)).collect::<Option<_>>().map(RamSizes).ok_or_else(|| format!("bad value {v:?}"))
}

fn quant(v: &str) -> Result<board::Quant, String> {
    board::Quant::ALL.into_iter().find(|q| q.name().eq_ignore_ascii_case(v)).ok_or_else(|| format!("bad value {v:?}"))
}

fn positive(v: &str) -> Result<f64, String> {
    v.parse().ok().filter(|d: &f64| *d > 0.0).ok_or_else(|| format!("bad value {v:?}"))
}

/// The first line of every output: the figures are modelled, and what they assume.
fn print_assumptions(model: &CostModel) {
    println!(
        "# modelled, not measured: {} NPU at the cost model's published rates (src/route/mod.rs); host work = this x86 machine's frozen figures (route::HostCost: one measurement each) x A76_OVER_HERE = {:.1} (an assumption); no board has measured these figures",
        model.soc.id.name().to_uppercase(),
        route::A76_OVER_HERE
    );
}

/// The cost model at the board's NPU clock (`--npu-mhz`: a mainline port's fixed 200 MHz, a
/// devfreq step; `ork-selftest` prints the clock the driver reports), said in one line.
fn with_clock(model: CostModel, mhz: Option<u64>) -> CostModel {
    match mhz {
        Some(m) => {
            println!("# NPU clock {m} MHz (--npu-mhz): the modelled int8 rate scaled from 1000 MHz; memory feed and submit floor unchanged");
            crate::cost::at_npu_clock(model, m * 1_000_000)
        }
        None => model,
    }
}

fn gib(b: u64) -> f64 {
    b as f64 / (1u64 << 30) as f64
}

/// Prints one model's board plan.
fn print_plan(bm: &board::BoardModel, b: &board::Board, p: &board::BoardPlan) {
    let count = |pl: board::Place| p.place.iter().filter(|&&x| x == pl).count();
    println!("## {} on a {:.0} GiB board (ctx {}, ubatch {}; GGUF {:.2} GiB, {:.2} B parameters)", bm.name, gib(b.ram_bytes), b.ctx, b.ubatch, gib(p.gguf_bytes), bm.params() as f64 / 1e9);
    if !p.fits {
        println!(
            "#   DOES NOT FIT: the GGUF mapping, KV cache, compute buffers and scratch alone need {:.2} GiB + {:.2} GiB OS reserve > {:.2} GiB RAM",
            gib(p.fixed_bytes),
            gib(board::OS_RESERVE_BYTES),
            gib(b.ram_bytes)
        );
        return;
    }
    println!("#   resident on the NPU: {} MUL_MAT weights, {:.2} GiB of int8 tiles and scales (budget {:.2} GiB)", count(board::Place::Resident), gib(p.resident_bytes), gib(p.resident_budget));
    println!(
        "#   streamed per prefill ubatch from the .orkpack cache: {} weights, {:.2} GiB ({:.2} s at {:.0} MB/s = min(disk, copy))",
        count(board::Place::Streamed),
        gib(p.streamed_bytes),
        p.stream_s,
        b.stream.bps() / 1e6
    );
    println!(
        "#   on the CPU: {} MUL_MAT weights the NPU layout cannot hold, the output head ({}; M = 1 in generation), embedding and norms: {:.2} GiB of GGUF bytes",
        count(board::Place::Cpu),
        if bm.head_tied { "tied to the embedding" } else { "output.weight" },
        gib(p.cpu_bytes)
    );
    println!(
        "#   peak RSS {:.2} GiB = GGUF mapping {:.2} + KV {:.2} + compute {:.2} + ORK scratch and ring {:.2} + process {:.2} + resident tiles {:.2}; with the {:.0} GiB OS reserve, {:.2} GiB of {:.0} left",
        gib(p.peak_rss),
        gib(p.gguf_bytes),
        gib(p.kv_bytes),
        gib(p.compute_bytes),
        gib(p.scratch_bytes),
        gib(board::PROCESS_BASE_BYTES),
        gib(p.resident_bytes),
        gib(board::OS_RESERVE_BYTES),
        gib(b.ram_bytes.saturating_sub(p.peak_rss + board::OS_RESERVE_BYTES)),
        gib(b.ram_bytes)
    );
    println!(
        "#   predicted (modelled, RK3588, A76 = {:.1}x this machine's core: an assumption): pp{} {:.1} tok/s with the NPU (NPU MUL_MATs {:.2} s, stream {:.2} s per ubatch) vs {:.1} tok/s CPU only ({:.1}x); decode {:.2} tok/s (ggml-cpu)",
        route::A76_OVER_HERE,
        b.ubatch,
        p.pp_npu,
        p.npu_s,
        p.stream_s,
        p.pp_cpu,
        p.pp_npu / p.pp_cpu,
        p.decode
    );
}

/// `--ram`: the board plan of a GGUF or of built-in shapes, and the largest model per board.
fn board_mode(a: &Args, file_model: Option<board::BoardModel>) {
    let cfg = Config::from_lookup(|k| std::env::var(k).ok()).0;
    let id = cfg.soc.as_deref().and_then(ggml_ork::npu::soc::SocId::parse).unwrap_or(ggml_ork::npu::soc::SocId::Rk3588);
    print_assumptions(&crate::cost::for_soc(id));
    let model = with_clock(crate::cost::for_soc(id), a.npu_mhz);
    let stream = board::StreamRate { disk_bps: a.disk_mbps.map_or(board::BOARD_DISK_BPS, |d| d * 1e6), ..board::StreamRate::BOARD };
    let boards: Vec<board::Board> = a.ram().iter().map(|&g| board::Board { ctx: a.ctx, ubatch: a.m_prefill, stream, ..board::Board::new(g) }).collect();
    println!(
        "# board plan, SoC {}; memory: GGUF mapped (ggml-cpu reads it in place), int8 tiles resident up to RAM - {:.0} GiB OS reserve - the rest, the remainder streamed from the .orkpack cache (disk {:.0} MB/s, copy {:.0} MB/s); vendor driver (one tile copy)",
        model.soc.id.name(),
        gib(board::OS_RESERVE_BYTES),
        stream.disk_bps / 1e6,
        stream.copy_bps / 1e6
    );
    if let Some(bm) = file_model {
        for b in &boards {
            print_plan(&bm, b, &board::plan(&cfg, &model, &bm, b));
        }
        return;
    }
    let name = a.model.as_deref().unwrap_or("all");
    let descs: Vec<&board::DenseDesc> = board::DENSE_MODELS.iter().filter(|d| name == "all" || d.name.eq_ignore_ascii_case(name)).collect();
    if descs.is_empty() {
        eprintln!("ork-route: no built-in model {name:?}; known: {}", board::DENSE_MODELS.iter().map(|d| d.name).collect::<Vec<_>>().join(", "));
        std::process::exit(2);
    }
    for b in &boards {
        for &q in &a.quants() {
            for d in &descs {
                let bm = board::BoardModel::from_desc(d, q);
                print_plan(&bm, b, &board::plan(&cfg, &model, &bm, b));
            }
        }
    }
    if name == "all" {
        println!("\n# the largest built-in dense model per board with every prefill MUL_MAT on the NPU (resident or streamed; rates modelled):");
        for b in &boards {
            for &q in &a.quants() {
                match board::largest_fitting(&cfg, &model, b, q) {
                    Some((d, bm, p)) => println!(
                        "#   {:>3.0} GiB, {:<6}: {:<14} GGUF {:5.2} GiB, resident {:5.2} GiB, streamed {:5.2} GiB, peak RSS {:5.2} GiB; pp{} {:6.1} tok/s vs CPU {:5.1} ({:.1}x), decode {:.2} tok/s  [{}]",
                        gib(b.ram_bytes),
                        q.name(),
                        d.name,
                        gib(p.gguf_bytes),
                        gib(p.resident_bytes),
                        gib(p.streamed_bytes),
                        gib(p.peak_rss),
                        b.ubatch,
                        p.pp_npu,
                        p.pp_cpu,
                        p.pp_npu / p.pp_cpu,
                        p.decode,
                        bm.name
                    ),
                    None => println!("#   {:>3.0} GiB, {:<6}: none of the built-in models fits", gib(b.ram_bytes), q.name()),
                }
            }
        }
        println!("#   shapes from: {}", board::DENSE_MODELS.iter().map(|d| format!("{} ({})", d.name, d.source)).collect::<Vec<_>>().join("; "));
    }
}

fn main() {
    let a = Args::parse();
    let m_prefill = a.m_prefill;
    let Some(path) = a.path.clone() else {
        board_mode(&a, None);
        return;
    };
    let path = path.as_str();
    let (kv, tensors) = match read_gguf(path) {
        Ok(x) => x,
        Err(e) => {
            eprintln!("ork-route: {path}: {e}");
            std::process::exit(1);
        }
    };
    if !a.ram().is_empty() {
        let infos: Vec<board::TensorInfo<'_>> = tensors.iter().map(|t| (t.name.as_str(), t.dims.as_slice(), t.ggml_type)).collect();
        let lookup = |k: &str| kv.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        let name = std::path::Path::new(path).file_name().map_or(path.to_string(), |f| f.to_string_lossy().into_owned());
        board_mode(&a, Some(board::from_gguf(&name, &lookup, &infos)));
        return;
    }
    let cfg = Config::from_lookup(|k| std::env::var(k).ok()).0;
    let id = cfg.soc.as_deref().and_then(ggml_ork::npu::soc::SocId::parse).unwrap_or(ggml_ork::npu::soc::SocId::Rk3588);
    print_assumptions(&crate::cost::for_soc(id));
    let model = with_clock(crate::cost::for_soc(id), a.npu_mhz);
    let arch = kv.iter().find(|(k, _)| k == "general.architecture").map_or("?", |(_, v)| v.as_str());
    println!("# {path} ({arch}, {} tensors); policy ORK_ROUTE={:?}, ORK_MINM={}, ORK_DECODE={:?}; SoC {}", tensors.len(), cfg.route, cfg.min_m, cfg.decode, model.soc.id.name());
    let table = route_table(&cfg, &model, &tensors, m_prefill);
    let layers = tensors.iter().filter(|t| t.name.ends_with("attn_norm.weight")).count();
    if layers > 0 && !table.per_layer.is_empty() {
        let shape = ModelShape { layers, ..table };
        let r = predict(&cfg, &model, &shape, m_prefill);
        println!("\n# predicted (modelled) for this model on {} with this policy: prefill {:.0} tok/s (M={m_prefill}), decode {:.1} tok/s (LM head on the CPU when tied; attention not modelled)", model.soc.id.name(), r.prefill_tok_s, r.decode_tok_s);
    }
    print_anchors();
}

/// One line per tensor of the model (`tensors`): the engine of its prefill (`m_prefill` rows) and
/// decode MUL_MATs under `cfg` and why, then the count of each pair. Returns the shapes of the
/// first layer's MUL_MATs and the head's, for [`predict`] (its layers left to the caller).
fn route_table(cfg: &Config, model: &CostModel, tensors: &[gguf::Tensor], m_prefill: usize) -> ModelShape {
    println!("{:<28} {:>14} {:>7} | {:<8} {:<8} | why (prefill M={m_prefill}; decode M=1)", "tensor", "K x N", "type", "prefill", "decode");
    let has_output = tensors.iter().any(|t| t.name == "output.weight");
    let av = Availability { gpu: cfg.decode == ggml_ork::config::DecodeSelect::Gpu, npu_busy: false };
    let mut counts = std::collections::BTreeMap::<(&str, &str), usize>::new();
    let mut layer_shapes: Vec<(usize, usize, u32, route::precision::Role)> = Vec::new();
    let mut head = None;
    for t in tensors {
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
            let decide = |m: usize| {
                let mm = MatMul { m, k, n, ggml_type: t.ggml_type };
                let d = crate::cost::decide_with(cfg, model, &mm, av);
                (d.engine, crate::cost::why(cfg, &mm, av, &d))
            };
            let (p, d) = (decide(m_prefill), decide(1));
            if t.name.starts_with("blk.0.") {
                layer_shapes.push((k, n, t.ggml_type, route::precision::Role::of(&t.name)));
            }
            if t.name == "output.weight" {
                head = Some((k, n, t.ggml_type));
            }
            (p.0, d.0, format!("{} | {}", p.1, d.1))
        };
        *counts.entry((pre.name(), dec.name())).or_default() += 1;
        println!("{:<28} {:>14} {:>7} | {:<8} {:<8} | {why}", t.name, format!("{k} x {n}"), type_name(t.ggml_type), pre.name(), dec.name());
    }
    println!("\n# summary (prefill engine, decode engine): count");
    for ((p, d), c) in &counts {
        println!("#   ({p}, {d}): {c}");
    }
    ModelShape { layers: 0, per_layer: layer_shapes, head, attn_dim: 0 }
}

/// The cost model on the Qwen3-1.7B shape against the published anchors: NPU only, each
/// precision setting inside llama.cpp, and the host's modelled work (what each assumes).
fn print_anchors() {
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
    let mut fused = crate::cost::npu_only(ggml_ork::npu::soc::SocId::Rk3588);
    fused.split_s = 0.0;
    let a = predict(&anchors_cfg, &fused, &q, 256);
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
        // Each role's K in this model (a role it lacks has no work: its terms count for nothing).
        let k_of = |r: route::precision::Role| q.per_layer.iter().find(|e| e.3 == r).map(|e| e.0).or(q.head.map(|h| h.0)).unwrap_or(0);
        let terms = route::precision::Role::ALL.map(|r| route::precision::decide(&c, r, false, &work, k_of(r)).terms);
        let b = predict(&c, &crate::cost::for_soc(ggml_ork::npu::soc::SocId::Rk3588), &q, 256);
        println!(
            "#   predicted, {what} inside llama.cpp, with host: prefill {:.0}, decode {:.1} (the layers' NPU work {:.2}x plain W8A8; rows {:.2}x with the head)",
            b.prefill_tok_s,
            b.decode_tok_s,
            crate::cost::work_ratio(&terms, &work),
            crate::cost::rows_ratio(&terms, &counts)
        );
    }
    // NPU only against the NPU with the host's measured work around each run (route::HostCost).
    let here = Config::from_lookup(|k| std::env::var(k).ok()).0;
    let rk = ggml_ork::npu::soc::SocId::Rk3588;
    let (npu, host) = (crate::cost::npu_only(rk), crate::cost::for_soc(rk));
    let (a, b) = (predict(&here, &npu, &q, 512), predict(&here, &host, &q, 512));
    let w = prefill_work(&here, &host, &q, 512);
    let h = host.host.expect("the model with the host's work");
    println!("#   Qwen3-1.7B Q8_0 pp512 on RK3588, modelled: NPU only {:.0} tok/s, with host {:.0} tok/s", a.prefill_tok_s, b.prefill_tok_s);
    println!(
        "#     host per MUL_MAT = {:.2} (an A76 core over this machine's: an assumption) x this machine's frozen figures (act-quant {:.3} ns per row·K quantized + the reuse check {:.3} ns per row·K of K, V and up + output {:.3} ns per row·N + NPU runs' host part {:.4} ns per row·(K + N) + {:.1} µs per MUL_MAT), {}; \
         per prompt token at M=512: {:.2} submits on the busiest core, {:.0} row·K ({:.0} quantized: K, V and up read the activation Q and gate quantized), {:.0} row·N over {} MUL_MATs; \
         not counted: the timed simulator's completion past its modelled time (its threads waiting for this machine's CPUs; on a board the kernel's round trip is taken as inside the submit floor, an assumption)",
        route::A76_OVER_HERE,
        h.act_quant_s * 1e9,
        h.check_s * 1e9,
        h.output_s * 1e9,
        h.npu_io_s * 1e9,
        h.matmul_s * 1e6,
        if h.pipelined {
            "the activation and output passes of MUL_MATs cut into pieces overlapping the NPU (npu::plan::pipeline_bounds; the ends route::pipeline_ends cuts short, each one more weight feed; where the graph shows the activation held, the first piece whole and no pass before it), the NPU runs' host part after each submit"
        } else {
            "after one another with the NPU runs (nothing pipelined)"
        },
        w.submits_per_token,
        w.row_k_per_token,
        w.act_row_k_per_token,
        w.row_n_per_token,
        w.matmuls
    );
    println!("#   anchors: ork/llama.cpp prefill 178 (rknpu-facts §4) .. 278 pp256 (seed 002), decode 12.8 (seed 002), 11.0 (seed 000); librkllmrt 184 / 11.71 (seed 002); CPU only 35.5 / 9.43 (seed 001)");
}
