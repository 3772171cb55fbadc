//! `route::board`, the board planner behind `ork-route --ram`: real values of its plans.

use ggml_ork::config::Config;
use ggml_ork::npu::soc::SocId;
use ggml_ork::route::board::{self, Board, BoardModel, DenseDesc, Place, Quant};
use ggml_ork::route::CostModel;

fn cfg() -> Config {
    Config::from_lookup(|_| None).0
}

fn desc(name: &str) -> &'static DenseDesc {
    board::DENSE_MODELS.iter().find(|d| d.name == name).expect(name)
}

const GIB: u64 = 1 << 30;

#[test]
fn every_dense_weight_is_resident_or_streamed_and_the_peak_fits() {
    let (c, model) = (cfg(), CostModel::for_soc(SocId::Rk3588));
    // Qwen3-8B Q8_0: 36 layers × 7 MUL_MATs; its int8 tiles (~7 GiB) do not all fit a 16 GiB
    // board beside its 8 GiB GGUF mapping.
    let m = BoardModel::from_desc(desc("Qwen3-8B"), Quant::Q8_0);
    assert_eq!(m.matmuls.len(), 36 * 7);
    let b = Board::new(16.0);
    let p = board::plan(&c, &model, &m, &b);
    // One weight's ORK bytes by hand: attn_q 4096 × 4096, K in the full-K envelope (one tile
    // set), no padding at this shape, one int8 term, f32 row and column scales.
    let q = m.matmuls.iter().position(|w| w.name == "blk.0.attn_q.weight").unwrap();
    assert_eq!(p.npu_bytes[q], 4096 * 4096 + 4 * (4096 + 4096));
    let all: u64 = p.npu_bytes.iter().sum();
    assert_eq!(p.resident_bytes + p.streamed_bytes, all, "resident + streamed = every dense weight's tiles");
    assert!(p.streamed_bytes > 0 && p.resident_bytes > 0, "{p:?}");
    assert!(p.place.iter().all(|&x| x != Place::Cpu));
    assert!(p.resident_bytes <= p.resident_budget);
    assert!(p.fits && p.peak_rss + board::OS_RESERVE_BYTES <= b.ram_bytes, "peak {} of {}", p.peak_rss, b.ram_bytes);
    // The peak is its parts: fixed (GGUF, KV, compute, scratch and ring, process) + tiles.
    assert_eq!(p.peak_rss, p.gguf_bytes + p.kv_bytes + p.compute_bytes + p.scratch_bytes + board::PROCESS_BASE_BYTES + p.resident_bytes);
    // KV: 36 layers × 8 heads × 128 × 4096 tokens × K and V × f16.
    assert_eq!(p.kv_bytes, 36 * 8 * 128 * 4096 * 2 * 2);
    // Residency is filled in graph order, first fit: what is left of the budget is smaller than
    // any weight that streams.
    let smallest_streamed = p.npu_bytes.iter().zip(&p.place).filter(|(_, &x)| x == Place::Streamed).map(|(b, _)| *b).min().unwrap();
    assert!(p.resident_budget - p.resident_bytes < smallest_streamed, "{} left, a {smallest_streamed}-byte weight streams", p.resident_budget - p.resident_bytes);
    // More RAM: more resident, less streamed, same total; enough RAM: nothing streams.
    let p32 = board::plan(&c, &model, &m, &Board::new(32.0));
    assert_eq!(p32.streamed_bytes, 0);
    assert_eq!(p32.resident_bytes, all);
    assert!(p32.pp_npu > p.pp_npu, "streamed bytes cost time: {} vs {}", p32.pp_npu, p.pp_npu);
    // The NPU prefill beats the CPU's, decode is ggml-cpu's in both plans.
    assert!(p.pp_npu > 3.0 * p.pp_cpu, "{} vs {}", p.pp_npu, p.pp_cpu);
    assert_eq!(p.decode, p32.decode);
}

#[test]
fn a_model_bigger_than_ram_does_not_fit() {
    let (c, model) = (cfg(), CostModel::for_soc(SocId::Rk3588));
    let m = BoardModel::from_desc(desc("Llama-3.1-70B"), Quant::Q8_0);
    let p = board::plan(&c, &model, &m, &Board::new(32.0));
    assert!(!p.fits && m.gguf_bytes() > 32 * GIB, "{p:?}");
    assert_eq!(p.resident_bytes, 0);
}

/// The same through the binary (a child process: skipped under qemu, `tests/cross/test.sh`).
#[test]
fn ork_route_says_a_model_bigger_than_ram_does_not_fit() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ork-route")).args(["--model", "Llama-3.1-70B", "--quant", "Q8_0", "--ram", "32"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains("DOES NOT FIT"), "{text}");
}

#[test]
fn the_largest_model_per_board() {
    let (c, model) = (cfg(), CostModel::for_soc(SocId::Rk3588));
    let big = |ram: f64, q: Quant| board::largest_fitting(&c, &model, &Board::new(ram), q).expect("something fits");
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
    let Ok((kv, tensors)) = ggml_ork::route::gguf::read_gguf(&path) else {
        eprintln!("skipped: no {path} (tests/setup-env.sh makes it)");
        return;
    };
    let infos: Vec<board::TensorInfo<'_>> = tensors.iter().map(|t| (t.name.as_str(), t.dims.as_slice(), t.ggml_type)).collect();
    let lookup = |k: &str| kv.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    let from_file = board::from_gguf("synth", &lookup, &infos);
    let base = desc("Qwen3-1.7B");
    let d = DenseDesc { dims: board::Dims { vocab: 49152, ..base.dims }, ..*base };
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
