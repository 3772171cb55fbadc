#!/usr/bin/env bash
# Where the prefill MUL_MATs' time goes per prompt token, at several ubatch sizes M: llama-bench
# -p $P -ub M -n 0 with the timed NPU (ORK_NPU=sim ORK_SIM_TIMING=board: no compute, every submit
# completes at the hardware time src/npu/soc.rs NpuTiming models for an RK3588 core) and
# ORK_PROFILE=1, and ggml-cpu alone (ORK_OFF=1) right after it for scale. Per M, one row:
#   - the two rates (tok/s, llama-bench);
#   - µs per prompt token of each host step the prefill MUL_MATs' profile line reports (act-quant,
#     of which the reuse check: the hash of an activation that may be the one the MUL_MAT before
#     quantized, K/V after Q and up after gate; submit = the NPU runs' wall time their device time does not cover, of which "cores" is the
#     cores' threads' host work (register commands, syncs) and "late" their submits' time past
#     the hardware time (here: the timed simulator completing after its modelled time, its threads
#     waiting for one of this machine's CPUs), dequant, arbiter), the calibrated correction (exit
#     line `correction N ms`: the dots and adds of the calibrated correction, inside act-quant and
#     dequant; only for a model the calibration file holds), their sum (the host's work), the
#     host time on the critical path (the MUL_MATs' wall time the modelled NPU time did not
#     cover: pieces pipelined, `Npu::pipeline_rows`, overlap their activation and output passes
#     with the NPU), the pieces per MUL_MAT, and the modelled NPU device time (`wait`);
#   - host / device: the critical-path host time over the modelled device time.
# ORK_LOCK_DIR is a fresh directory (below) unless set: only this script's processes arbitrate.
# Every arm runs with llama.cpp's default OpenMP policy (OMP_WAIT_POLICY unset: its threads spin
# for a while after each CPU split), the headline; ORK_BENCH_OMP_WAIT=passive gives the tuned row.
# ORK_BASE_LIB=/path/to/an/older/libggml-ork.so adds a "before" row per M, run right before the
# current build's row (the same machine state, for a before/after table); several paths
# (space-separated) add a row each, tagged with the file's name.
# The per-token figures divide the process's totals by the tokens it prefilled: (1 warm-up + R)
# × P (llama-bench's warm-up runs the whole prompt). The device time is a model, not a board; the
# host times are this machine's cores (under whatever else runs on them), not an A76's.
#
#   bash bench-scripts/prefill_host_table.sh [MODEL.gguf]   # default: SmolLM2-135M Q8_0
#   P=512 UB="32 128 512" R=1 T=2 bash bench-scripts/prefill_host_table.sh \
#       ~/.cache/ggml-ork-env/synth/synth-qwen3-1.7b-Q8_0.gguf   # bench-scripts/synth_models.sh
source "$(dirname "$0")/lib.sh"
bench_env
bench_build_plugin >/dev/null
M=${1:-$BENCH_MODEL}
# A lock directory of this script's own: on a shared builder other processes' simulated NPUs
# would otherwise hold the cross-process NPU lock and their work would show as arbiter time.
export ORK_LOCK_DIR=${ORK_LOCK_DIR:-$(mktemp -d)}
P=${P:-512} R=${R:-1} T=${T:-2}
echo "# $(basename "$M"), llama-bench -p $P -n 0 -r $R -t $T, OMP_WAIT_POLICY=${ORK_BENCH_OMP_WAIT:-unset, the default of llama.cpp}; µs per prompt token (tokens = (1 + $R) × $P per process)"
echo "| M (-ub) | ORK, board timing (t/s) | CPU alone (t/s) | act-quant (reuse check) | submit (cores, late) | dequant | arbiter | host work | host, critical path | pieces per MUL_MAT | modelled NPU device | host critical / device |"
echo "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
rate() { grep -E " pp$P " | tail -1 | awk -F'|' '{print $(NF-1)}' | sed -E 's/ //g; s/±.*//'; }
if [ -n "${ORK_BENCH_OMP_WAIT:-}" ]; then export OMP_WAIT_POLICY=$ORK_BENCH_OMP_WAIT; else unset OMP_WAIT_POLICY; fi
for ub in ${UB:-32 128 512}; do
 o=$(env GGML_BACKEND_PATH="$ORK_LIB" ORK_OFF=1 nice "$LLAMA_BIN/llama-bench" -m "$M" -p "$P" -ub "$ub" -n 0 -t "$T" -r "$R" 2>&1 | rate)
 nbase=$(echo ${ORK_BASE_LIB:-} | wc -w)
 for lib in ${ORK_BASE_LIB:-} "$ORK_LIB"; do
  tag=$([ "$lib" = "$ORK_LIB" ] && echo "$ub" || { [ "$nbase" -gt 1 ] && echo "$ub, $(basename "$lib" .so)" || echo "$ub, before"; })
  b=$(env GGML_BACKEND_PATH="$lib" ORK_NPU=sim ORK_SIM_TIMING=board ORK_PROFILE=1 \
        nice "$LLAMA_BIN/llama-bench" -m "$M" -p "$P" -ub "$ub" -n 0 -t "$T" -r "$R" 2>&1)
  pre=$(echo "$b" | grep -E "prefill MUL_MAT: npu" | tail -1)
  ex=$(echo "$b" | grep -E "ORK ran [0-9]+ MUL_MAT" | tail -1)
  tok=$(( (1 + R) * P ))
  # µs per token of the first number after $2 in line $1
  us() { echo "$1" | grep -oE "$2 [0-9.]+ ms" | head -1 | grep -oE "[0-9.]+" | awk -v n=$tok '{printf "%.0f", $1 * 1000 / n}' || true; }
  aq=$(us "$pre" "act-quant") sb=$(us "$pre" "submit") dq=$(us "$pre" "dequant") ar=$(us "$pre" "arbiter")
  co=$(us "$pre" "host work") la=$(us "$pre" "past the hardware time") ck=$(us "$pre" "the reuse check")
  wt=$(us "$pre" "wait") cr=$(us "$pre" "host on the critical path")
  host=$(( ${aq:-0} + ${sb:-0} + ${dq:-0} + ${ar:-0} ))
  cr=${cr:-$host}  # a build without pipelining reports no critical path: all its host work is on it
  runs=$(echo "$pre" | grep -oE "npu [0-9]+ runs" | grep -oE "[0-9]+") || runs=
  pieces=$(echo "$pre" | grep -oE "[0-9]+ pieces" | grep -oE "[0-9]+" | awk -v r="${runs:-0}" '{ if (r > 0) printf "%.2f", $1 / r; else print "-" }') || pieces=
  ratio=$(awk -v h="${cr:-0}" -v d="${wt:-0}" 'BEGIN { if (d > 0) printf "%.2f×", h / d; else print "-" }')
  echo "| $tag | $(echo "$b" | rate) | $o | ${aq:--}${ck:+ ($ck)} | ${sb:--}${co:+ ($co, ${la:--})} | ${dq:--} | ${ar:--} | $host | ${cr:--} | ${pieces:--} | ${wt:--} | $ratio |"
  if [ -n "${KEEP_LOG:-}" ]; then echo "$b" > "$KEEP_LOG.ub$ub$([ "$lib" = "$ORK_LIB" ] || echo ".before.$(basename "$lib" .so)").log"; fi
 done
done
