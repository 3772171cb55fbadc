"""Writes an F16 GGUF with the dimensions of a real model and seeded random weights, for benchmarks.

    python3 synth_model.py SHAPE TOKENIZER.gguf OUT.gguf      # SHAPE: qwen3-1.7b | qwen3-8b

Run by bench-scripts/synth_models.sh (which supplies numpy and the pinned llama.cpp tree's gguf-py
on the path). The architecture is `qwen3` with the named model's layer count, widths, heads and
head dim (the published config.json figures, below); the tokenizer (every `tokenizer.*` key) is
copied from TOKENIZER.gguf, and the embedding (and the LM head, where the model has its own) are
sized to that tokenizer's vocabulary, not to the original 151936. The weights are normal with
std 1/sqrt(fan-in) × 0.5 (embedding 0.02, norms 1), drawn from numpy's PCG64 seeded per tensor by
its name, so the same inputs give the same file. The text such a model writes is meaningless; it
is for timing only.
"""
import hashlib
import sys

import numpy as np

import gguf

# Qwen3-1.7B / Qwen3-8B config.json: hidden_size, intermediate_size, num_hidden_layers,
# num_attention_heads, num_key_value_heads, head_dim, tie_word_embeddings, rope_theta, rms_norm_eps,
# max_position_embeddings.
SHAPES = {
    "qwen3-1.7b": dict(hidden=2048, ffn=6144, layers=28, heads=16, kv_heads=8, head_dim=128, tied=True, name="Qwen3-1.7B"),
    "qwen3-8b": dict(hidden=4096, ffn=12288, layers=36, heads=32, kv_heads=8, head_dim=128, tied=False, name="Qwen3-8B"),
}
ROPE_THETA = 1_000_000.0
RMS_EPS = 1e-6
CONTEXT = 40960


def seeded(name: str) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64(int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "little")))


def main() -> None:
    shape_name, tok_path, out_path = sys.argv[1:4]
    s = SHAPES[shape_name]
    src = gguf.GGUFReader(tok_path)
    tokens = src.fields["tokenizer.ggml.tokens"]
    vocab = len(tokens.data)

    w = gguf.GGUFWriter(out_path, "qwen3")
    w.add_name(f"synthetic {s['name']} shape (seeded random weights, benchmarks only)")
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_context_length(CONTEXT)
    w.add_embedding_length(s["hidden"])
    w.add_feed_forward_length(s["ffn"])
    w.add_block_count(s["layers"])
    w.add_head_count(s["heads"])
    w.add_head_count_kv(s["kv_heads"])
    w.add_key_length(s["head_dim"])
    w.add_value_length(s["head_dim"])
    w.add_rope_freq_base(ROPE_THETA)
    w.add_layer_norm_rms_eps(RMS_EPS)
    for f in src.fields.values():
        if not f.name.startswith("tokenizer."):
            continue
        t = f.types[0]
        sub = f.types[-1] if t == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(f.name, f.contents(), t, sub_type=sub)

    h, d, q, kv = s["hidden"], s["head_dim"], s["heads"] * s["head_dim"], s["kv_heads"] * s["head_dim"]
    # (name, (rows, cols) in numpy order = (N, K), kind)
    tensors = [("token_embd.weight", (vocab, h), "embd"), ("output_norm.weight", (h,), "norm")]
    if not s["tied"]:
        tensors.append(("output.weight", (vocab, h), "mat"))
    for i in range(s["layers"]):
        b = f"blk.{i}."
        tensors += [
            (b + "attn_norm.weight", (h,), "norm"),
            (b + "attn_q.weight", (q, h), "mat"),
            (b + "attn_k.weight", (kv, h), "mat"),
            (b + "attn_v.weight", (kv, h), "mat"),
            (b + "attn_output.weight", (h, q), "mat"),
            (b + "attn_q_norm.weight", (d,), "norm"),
            (b + "attn_k_norm.weight", (d,), "norm"),
            (b + "ffn_norm.weight", (h,), "norm"),
            (b + "ffn_gate.weight", (s["ffn"], h), "mat"),
            (b + "ffn_up.weight", (s["ffn"], h), "mat"),
            (b + "ffn_down.weight", (h, s["ffn"]), "mat"),
        ]
    for name, shp, kind in tensors:
        dt = np.float32 if kind == "norm" else np.float16
        w.add_tensor_info(name, shp, np.dtype(dt), int(np.prod(shp)) * np.dtype(dt).itemsize)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    params = 0
    for name, shp, kind in tensors:
        if kind == "norm":
            a = np.ones(shp, dtype=np.float32)
        else:
            std = 0.02 if kind == "embd" else 0.5 / np.sqrt(shp[1])
            a = seeded(name).standard_normal(shp, dtype=np.float32)
            a *= std
            a = a.astype(np.float16)
        params += a.size
        w.write_tensor_data(a)
    w.close()
    print(f"{out_path}: {s['name']} shape, vocab {vocab}, {params / 1e9:.2f} G parameters")


if __name__ == "__main__":
    main()
