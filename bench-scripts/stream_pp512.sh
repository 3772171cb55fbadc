#!/usr/bin/env bash
# Streamed prefill against all-resident (issue 24): llama-bench pp512 (-ub 512) with the timed NPU
# (ORK_NPU=sim ORK_SIM_TIMING=board ORK_PROFILE=1), two arms run alternately ROUNDS times:
#   resident  - the default residency budget (every weight resident);
#   streamed  - ORK_WCACHE_BUDGET_MB=$BUDGET (default 410: about a quarter of the Qwen3-1.7B
#               shape's 1640 MiB of int8 tiles), the weights past it streamed (`backend::stream`).
# Per run: the rate, the NPU MUL_MATs, the MUL_MATs left to the CPU at graph split and after
# NPU errors, and the exit line's streaming part; at the end the median rate of each arm and
# streamed / resident. The first run of a model writes its `.orkpack` entries (a warm-up run of
# each arm is made first and not counted). The load average is printed before and after.
#
#   bash bench-scripts/stream_pp512.sh [MODEL.gguf]   # default: the synthetic Qwen3-1.7B Q8_0
#   ROUNDS=3 BUDGET=410 bash bench-scripts/stream_pp512.sh ~/.cache/ggml-ork-env/synth/synth-qwen3-1.7b-Q4_K_M.gguf
source "$(dirname "$0")/lib.sh"
bench_env
bench_build_plugin >/dev/null
M=${1:-$ORK_ENV/synth/synth-qwen3-1.7b-Q8_0.gguf}
export ORK_LOCK_DIR=${ORK_LOCK_DIR:-$(mktemp -d)}
export OMP_WAIT_POLICY=${ORK_BENCH_OMP_WAIT:-passive}
ROUNDS=${ROUNDS:-2} BUDGET=${BUDGET:-410} T=${T:-2}
echo "# $(basename "$M"), llama-bench -p 512 -ub 512 -n 0 -r 1 -t $T, timed NPU; load average: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "| arm | round | pp512 (t/s) | NPU MUL_MAT | left to the CPU at split | CPU after NPU errors | streaming (exit line) |"
echo "|---|---:|---:|---:|---:|---:|---|"
one() {  # arm round budget-env...
  local arm=$1 round=$2; shift 2
  local b
  # (a value a line lacks is empty, not an error: `|| true` under lib.sh's pipefail)
  b=$(env "$@" GGML_BACKEND_PATH="$ORK_LIB" ORK_NPU=sim ORK_SIM_TIMING=board ORK_PROFILE=1 \
        nice "$LLAMA_BIN/llama-bench" -m "$M" -p 512 -ub 512 -n 0 -t "$T" -r 1 2>&1)
  local ex rate
  ex=$(echo "$b" | grep -E "ORK ran [0-9]+ MUL_MAT" | tail -1) || true
  rate=$(echo "$b" | grep -E " pp512 " | tail -1 | awk -F'|' '{print $(NF-1)}' | sed -E 's/ //g; s/±.*//') || true
  local npu split fell st
  npu=$(echo "$ex" | grep -oE "ORK ran [0-9]+" | grep -oE "[0-9]+") || true
  split=$(echo "$ex" | grep -oE "[0-9]+ MUL_MAT graph nodes were left" | grep -oE "^[0-9]+") || true
  fell=$(echo "$ex" | grep -oE "[0-9]+ MUL_MAT fell back" | grep -oE "^[0-9]+") || true
  st=$(echo "$ex" | grep -oE "streamed: [^;]*" | head -1) || true
  [ "$round" = warm-up ] || echo "$arm $rate" >> "$RATES"
  echo "| $arm | $round | ${rate:--} | ${npu:--} | ${split:--} | ${fell:--} | ${st:-none} |"
}
RATES=$(mktemp)
one resident warm-up ORK_STREAM=1
one streamed warm-up ORK_STREAM=1 ORK_WCACHE_BUDGET_MB=$BUDGET
for r in $(seq 1 "$ROUNDS"); do
  one resident "$r" ORK_STREAM=1
  one streamed "$r" ORK_STREAM=1 ORK_WCACHE_BUDGET_MB=$BUDGET
done
med() { grep "^$1 " "$RATES" | awk '{print $2}' | sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
res=$(med resident) str=$(med streamed)
echo
echo "median pp512: resident $res t/s, streamed (budget $BUDGET MiB) $str t/s, streamed / resident $(awk -v a="$str" -v b="$res" 'BEGIN {printf "%.2f", a / b}'); load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
rm -f "$RATES"
