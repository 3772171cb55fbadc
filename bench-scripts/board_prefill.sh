#!/usr/bin/env bash
# Board-like prefill here: llama-bench with the timed simulator (ORK_SIM_TIMING=board: every
# submit completes at the hardware time src/npu/soc.rs NpuTiming models for an RK3588 core, no
# compute), so the rate is this machine's host work plus a modelled board NPU. Per prompt length:
# the rate with ORK (board timing), with ORK computing on the simulator, and ggml-cpu alone
# (ORK_OFF=1), side by side in one run, and where ORK's prefill MUL_MAT time went (ORK_PROFILE).
# The NPU time is a model, not a board; the host times are this machine's cores, not an A76's.
#
#   bash bench-scripts/board_prefill.sh [MODEL.gguf]     # default: SmolLM2-135M Q8_0; P="128 512"
source "$(dirname "$0")/lib.sh"
bench_env
bench_build_plugin >/dev/null
M=${1:-$BENCH_MODEL}
echo "| prompt | ORK, board timing (t/s) | ORK computing (t/s) | CPU alone (t/s) | ORK prefill MUL_MAT, board timing: modelled NPU wait / host (act-quant, submit (the cores' host work, past the hardware time), dequant, arbiter) |"
echo "|---|---:|---:|---:|---|"
for p in ${P:-128 512}; do
  rate() { grep -E " pp$p " | awk -F'|' '{print $(NF-1)}' | sed 's/ //g'; }
  b=$(env GGML_BACKEND_PATH="$ORK_LIB" ORK_NPU=sim ORK_SIM_TIMING=board ORK_PROFILE=1 "$LLAMA_BIN/llama-bench" -m "$M" -p "$p" -n 0 -t 2 -r 2 2>&1)
  c=$(env GGML_BACKEND_PATH="$ORK_LIB" ORK_NPU=sim "$LLAMA_BIN/llama-bench" -m "$M" -p "$p" -n 0 -t 2 -r 2 2>&1 | rate)
  o=$(env GGML_BACKEND_PATH="$ORK_LIB" ORK_OFF=1 "$LLAMA_BIN/llama-bench" -m "$M" -p "$p" -n 0 -t 2 -r 2 2>&1 | rate)
  prof=$(echo "$b" | grep -E "^(ork: )? +prefill MUL_MAT:" | sed -E 's/.*act-quant ([0-9.]+) ms \(the reuse check [0-9.]+ ms\), submit ([0-9.]+) ms \(the cores. host work ([0-9.]+) ms, past the hardware time ([0-9.]+) ms\), wait ([0-9.]+) ms, dequant ([0-9.]+) ms, arbiter ([0-9.]+) ms.*/wait \5 ms \/ act-quant \1, submit \2 (cores \3, late \4), dequant \6, arbiter \7 ms/')
  echo "| pp$p | $(echo "$b" | rate) | $c | $o | ${prof:--} |"
done
