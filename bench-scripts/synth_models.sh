#!/usr/bin/env bash
# Real-size models for benchmarks: GGUF files with the dimensions of Qwen3-1.7B (hidden 2048, FFN
# 6144, 28 layers, 16 heads, 8 KV heads, head dim 128, tied head) and, on request, of Qwen3-8B
# (hidden 4096, FFN 12288, 36 layers, 32 heads, 8 KV heads, head dim 128), with seeded random
# weights (bench-scripts/synth_model.py: the same file every time) and the set-up's SmolLM2
# tokenizer (vocabulary 49152, so the embedding is 49152 rows, not Qwen's 151936). Written as F16
# by the pinned llama.cpp tree's gguf-py, then Q8_0, Q4_K_M and Q4_0 by the set-up's llama-quantize,
# into $ORK_ENV/synth (outside the repo; never committed, never run by a test). Made once each.
#
#   bash bench-scripts/synth_models.sh            # Qwen3-1.7B shape: F16 3.1 GB, Q8_0, Q4_K_M, Q4_0
#   SYNTH="1.7b 8b" bash bench-scripts/synth_models.sh   # also Qwen3-8B shape (F16 16 GB, removed
#                                                         # after quantizing unless KEEP_F16=1)
#   SYNTH_TYPES="Q4_0" ...                        # other types (default: Q8_0 Q4_K_M Q4_0 for 1.7b,
#                                                 # Q8_0 Q4_K_M for 8b, whose F16 is not kept)
# Prints the paths of the quantized files. numpy and pyyaml (gguf-py's imports) come from PyPI into
# a venv in $ORK_ENV/synth/venv.
source "$(dirname "$0")/lib.sh"
bench_env
OUT=$ORK_ENV/synth
mkdir -p "$OUT"
PY=$OUT/venv/bin/python
if ! "$PY" -c 'import numpy, yaml' 2>/dev/null; then
  python3 -m venv "$OUT/venv"
  "$OUT/venv/bin/pip" install -q numpy==2.4.6 pyyaml==6.0.3 >&2
fi
TOK=$ORK_MODELS/smollm2-135m-Q8_0.gguf
for size in ${SYNTH:-1.7b}; do
  case $size in
    1.7b) shape=qwen3-1.7b keep=1 types=${SYNTH_TYPES:-Q8_0 Q4_K_M Q4_0} ;;
    8b) shape=qwen3-8b keep=${KEEP_F16:-0} types=${SYNTH_TYPES:-Q8_0 Q4_K_M} ;;
    *) echo "synth_models: SYNTH names 1.7b and/or 8b, not $size" >&2; exit 2 ;;
  esac
  f16=$OUT/synth-$shape-F16.gguf
  for t in $types; do
    out=$OUT/synth-$shape-$t.gguf
    [ -s "$out" ] && { echo "$out"; continue; }
    if [ ! -s "$f16" ]; then
      echo "== $shape: F16 with seeded random weights" >&2
      PYTHONPATH=$LLAMA_SRC/gguf-py nice "$PY" "$ROOT/bench-scripts/synth_model.py" "$shape" "$TOK" "$f16.tmp" >&2
      mv "$f16.tmp" "$f16"
    fi
    echo "== $shape: $t (llama-quantize)" >&2
    nice "$LLAMA_BIN/llama-quantize" "$f16" "$out.tmp" $t 2 >"$OUT/quantize-$shape-$t.log" 2>&1 \
      || { tail -20 "$OUT/quantize-$shape-$t.log" >&2; exit 1; }
    mv "$out.tmp" "$out"
    echo "$out"
  done
  [ "$keep" = 1 ] || rm -f "$f16"
done
