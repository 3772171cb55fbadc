#!/usr/bin/env bash
# Decode GEMV side by side on the same Vulkan device (lavapipe here): ORK's GPU decode kernels
# (shaders/gemv_*.comp through src/vk) against the pinned llama.cpp's own Vulkan backend
# (ggml-vulkan's matrix-vector kernels), same MUL_MAT graphs, same process, interleaved rounds.
# On lavapipe the ratio is an instruction-efficiency proxy only (both run as LLVM-compiled code
# on the host CPU); the Mali figure comes from bench-scripts/onboard-kit.sh on a board.
# Benchmark only, never run as a test. First run sets up the reference backend (cached).
#
#   bash bench-scripts/vk_side_by_side.sh [rounds] [reps-per-graph...]   (default: 9 16 1)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
bench_env
ROUNDS=${1:-9}; shift || true
REPS=("$@"); [ ${#REPS[@]} -gt 0 ] || REPS=(16 1)

VKBIN=$(bash "$ROOT/bench-scripts/vk_setup_ref.sh")
bench_build_plugin
H=$VKBIN/ork-vk-gemv-bench
if [ ! -x "$H" ] || [ "$ROOT/bench-scripts/vk_gemv_bench.c" -nt "$H" ]; then
  cc -O2 -Wall -o "$H" "$ROOT/bench-scripts/vk_gemv_bench.c" -I"$LLAMA_SRC/ggml/include" \
    -L"$VKBIN" -lggml -lggml-base -lm -Wl,-rpath,"$VKBIN"
fi

OUT=$ORK_ENV/bench; mkdir -p "$OUT"
MD=$OUT/vk-side-by-side.md
{
  echo "# Decode GEMV: ORK GPU kernels vs ggml-vulkan, same device"
  echo
  echo "\`bash bench-scripts/vk_side_by_side.sh $ROUNDS ${REPS[*]}\`, commit $(git -C "$ROOT" rev-parse --short HEAD), $(date -u +%FT%TZ)"
  echo "Device: $(vulkaninfo --summary 2>/dev/null | grep -m1 deviceName | sed 's/.*= //'); median of $ROUNDS interleaved rounds; ratio = ORK time / ggml-vulkan time (< 1: ORK faster)."
} >"$MD"
for reps in "${REPS[@]}"; do
  log=$OUT/vk-side-by-side-reps$reps.log
  # ggml-vulkan skips CPU-type devices unless asked; ORK: decode (M=1 < ORK_MINM) on the GPU.
  GGML_VK_VISIBLE_DEVICES=0 GGML_BACKEND_PATH=$ORK_LIB ORK_NPU=sim ORK_DECODE=gpu \
    ORK_VK_DEVICE=llvmpipe ORK_PROFILE=1 "$H" "$ROUNDS" "$reps" Vulkan0 ORK >"$log.md" 2>"$log"
  # Our number must be the GPU kernel: every MUL_MAT ORK ran went to the GPU, none to the CPU.
  gpu=$(grep -oP 'decode  MUL_MAT: .*gpu \K[0-9]+(?= runs)' "$log" | head -1)
  cpu=$(grep -oP 'decode  MUL_MAT: .*cpu \K[0-9]+(?= runs in ORK)' "$log" | head -1)
  split=$(grep -oP 'left to ggml-cpu at graph split: \K[0-9]+' "$log" | head -1)
  shapes=$(grep -c '^| q' "$log.md")
  want=$(( shapes * (ROUNDS + 1) * reps ))
  { echo; echo "## $reps MUL_MAT per graph_compute"; echo; cat "$log.md"; echo
    echo "ORK profile: decode MUL_MATs on the GPU $gpu (expected $want), in ORK's graph on the CPU $cpu, left to ggml-cpu $split."; } >>"$MD"
  if [ "${gpu:-0}" != "$want" ] || [ "${cpu:-1}" != 0 ] || [ "${split:-1}" != 0 ]; then
    echo "ORK did not run every GEMV on the GPU (gpu=$gpu cpu=$cpu split=$split, want gpu=$want); see $log" >&2
    cat "$MD"; exit 1
  fi
done
cat "$MD"
echo "(written to $MD)" >&2
