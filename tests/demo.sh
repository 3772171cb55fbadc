#!/usr/bin/env bash
# The demo: upstream llama.cpp (pinned b11549, unmodified) loads libggml-ork.so and generates
# text with SmolLM2-135M Q8_0, its prefill matmuls running on the ORK NPU (the bit-exact
# simulator here: ORK_NPU=sim). First run sets everything up (~6 min on 2 cores).
# ORK_DEMO_TYPE=Q4_K_M (or F16) picks another of the set-up models; ORK_DECODE=gpu
# ORK_VK_DEVICE=llvmpipe puts decode on the GPU (lavapipe here).
# The demo needs the pinned release only; the test command also sets up the earlier supported ones.
export ORK_SETUP_RELEASES=${ORK_SETUP_RELEASES:-0}
source "$(dirname "$0")/common.sh"
build_plugin
calibrate_models "smollm2-135m-${ORK_DEMO_TYPE:-Q8_0}"
M=$ORK_MODELS/smollm2-135m-${ORK_DEMO_TYPE:-Q8_0}.gguf
PROMPT=${1:-"Johannes Gutenberg built the first printing press with movable type in Mainz around 1450. Before it, every book was copied by hand. The printing press changed Europe because books could be made quickly and cheaply. Within fifty years of its invention"}

echo "== devices (GGML_BACKEND_PATH=$ORK_LIB, ORK_NPU=sim)"
GGML_BACKEND_PATH=$ORK_LIB ORK_NPU=sim "$LLAMA_BIN/llama-cli" --list-devices 2>&1 | grep -v "^load_backend" || true
echo
echo "== generation on ORK (simulated NPU; decode: ${ORK_DECODE:-auto}), $(basename "$M"), greedy, 48 tokens"
GGML_BACKEND_PATH=$ORK_LIB ORK_NPU=sim "$LLAMA_BIN/llama-completion" -m "$M" -p "$PROMPT" -n 48 \
  --temp 0 -no-cnv -t 2 --no-warmup 2>"$ORK_ENV/demo.log"
echo
echo
grep -E "^ork: " "$ORK_ENV/demo.log" || true
grep -E "prompt eval time|eval time" "$ORK_ENV/demo.log" | sed 's/^.*common_perf_print: */  /' || true
