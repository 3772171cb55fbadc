#!/usr/bin/env bash
# End-to-end on the product's target, under emulation (not in CI: minutes of qemu).
# Upstream llama.cpp b11549 cross-built for aarch64 (tests/cross/build-llama.sh, once, ~5 min of
# 2 cores cold) runs llama-completion under qemu-aarch64 (QEMU_CPU=cortex-a76) with the aarch64
# release plugin (tests/cross/release.sh) on the simulated NPU, SmolLM2-135M Q8_0, greedy; the
# text is compared with the same command natively on x86-64 with the x86 plugin.
# Then the board CPU's repacked weights: ggml-cpu on a Cortex-A76 (dotprod) re-lays Q8_0 (q8_0_4x4)
# and Q4_0 (q4_0_4x4) out into its CPU_REPACK buffer type for its decode kernels, and with ORK
# loaded llama.cpp must still put them there: llama-completion -lv 4 under the same qemu, SmolLM2
# Q8_0 and Q4_0 (the same prompt, 1 token), with the aarch64 plugin on the simulated NPU and with
# ORK_OFF=1; the `CPU_REPACK model buffer size` of the two runs must be equal and > 0, and the ORK
# run's prefill live on the NPU (exit status 1 otherwise).
# Prints one summary line per part; outputs in $ORK_ENV/aarch64-e2e/.
# Usage: [N_TOKENS=16] [AARCH64_REPACK_ONLY=1: the CPU_REPACK part alone] aarch64_e2e.sh
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$ROOT/tests/common.sh"
cd "$ROOT"
eval "$(bash tests/cross/build-llama.sh)"            # LLAMA_BIN_AARCH64
bash tests/cross/release.sh >/dev/null
SO_A64=$(ls -t "$ROOT"/dist/libggml-ork*-aarch64.so | head -1)
N=${N_TOKENS:-16}
M=$ORK_MODELS/smollm2-135m-Q8_0.gguf
# >= 32 prompt tokens so the prefill matmuls reach ORK (ORK_MINM)
PROMPT="The Industrial Revolution began in Britain in the late eighteenth century. Steam engines, iron and coal changed how goods were made, and factories drew workers from the countryside into the growing towns. Its most important consequence was"
OUT=$ORK_ENV/aarch64-e2e; mkdir -p "$OUT"
args=(-m "$M" -p "$PROMPT" -n "$N" --temp 0 -no-cnv -t 2 --no-warmup --seed 1)
if [ "${AARCH64_REPACK_ONLY:-0}" != 1 ]; then
build_plugin                                        # ORK_LIB (x86-64)

t0=$(date +%s.%N)
GGML_BACKEND_PATH=$ORK_LIB ORK_NPU=sim ORK_PROFILE=1 "$LLAMA_BIN/llama-completion" "${args[@]}" \
  >"$OUT/x86_64.txt" 2>"$OUT/x86_64.log"
t1=$(date +%s.%N)
QEMU_CPU=cortex-a76 GGML_BACKEND_PATH=$SO_A64 ORK_NPU=sim ORK_PROFILE=1 \
  qemu-aarch64-static "$LLAMA_BIN_AARCH64/llama-completion" "${args[@]}" \
  >"$OUT/aarch64.txt" 2>"$OUT/aarch64.log"
t2=$(date +%s.%N)

grep -E "^ork: " "$OUT/aarch64.log" | head -5 || true
grep -qE "ORK ran: npu [1-9][0-9]* MUL_MAT \([1-9][0-9]* submits, [0-9]+ rows sent = [0-9.]+x plain W8A8\)" "$OUT/aarch64.log" || { echo "aarch64 run: no MUL_MAT ran on ORK (log: $OUT/aarch64.log)"; exit 1; }
# a live NPU: nothing fell back to the CPU (an NPU whose every run failed gives the CPU's text too)
grep -qE "fallbacks: 0 after NPU errors \(0 failed runs\)" "$OUT/aarch64.log" || { echo "aarch64 run: NPU errors fell back to the CPU (log: $OUT/aarch64.log)"; exit 1; }
if cmp -s "$OUT/x86_64.txt" "$OUT/aarch64.txt"; then same=equal; else same=DIFFERENT; diff "$OUT/x86_64.txt" "$OUT/aarch64.txt" || true; fi
printf 'aarch64 e2e (%s tokens, %s): text %s to x86-64; wall x86-64 %.1f s, aarch64 under qemu %.1f s\n' \
  "$N" "$(basename "$SO_A64")" "$same" "$(awk "BEGIN{print $t1 - $t0}")" "$(awk "BEGIN{print $t2 - $t1}")" | tee "$OUT/result.txt"
echo "--- text:"; cat "$OUT/aarch64.txt"; echo
fi

# ---- the board CPU's repacked weights kept with ORK loaded (CPU_REPACK, llama.cpp -lv 4) ----
repack_sizes() { # log -> the CPU_REPACK model buffer sizes in it, "+"-joined ("" when none)
  grep -oE 'CPU_REPACK model buffer size *= *[0-9.]+ MiB' "$1" | grep -oE '[0-9.]+ MiB$' | sed 's/ MiB$//' | paste -sd+ - || true
}
repack_bad=0
: >"$OUT/repack.txt"
for t in Q8_0 Q4_0; do
  m=$ORK_MODELS/smollm2-135m-$t.gguf
  for arm in ork cpu; do
    if [ $arm = ork ]; then sw=ORK_NPU=sim; else sw=ORK_OFF=1; fi
    env QEMU_CPU=cortex-a76 GGML_BACKEND_PATH="$SO_A64" "$sw" qemu-aarch64-static "$LLAMA_BIN_AARCH64/llama-completion" \
      -m "$m" -p "$PROMPT" -n 1 --temp 0 -no-cnv -t 2 --no-warmup --seed 1 -lv 4 \
      >"$OUT/repack-$t-$arm.txt" 2>"$OUT/repack-$t-$arm.log" \
      || echo "aarch64 $t ($arm): llama-completion failed, exit status $? (log: $OUT/repack-$t-$arm.log)"
  done
  so=$(repack_sizes "$OUT/repack-$t-ork.log")
  sc=$(repack_sizes "$OUT/repack-$t-cpu.log")
  live=no
  if grep -qE "ORK ran: npu [1-9][0-9]* MUL_MAT \([1-9][0-9]* submits, [0-9]+ rows sent = [0-9.]+x plain W8A8\)" "$OUT/repack-$t-ork.log" \
     && grep -qE "fallbacks: 0 after NPU errors \(0 failed runs\)" "$OUT/repack-$t-ork.log"; then
    live=yes
  fi
  if [ -n "$sc" ] && [ "$so" = "$sc" ] && awk -v s="$sc" 'BEGIN { n = split(s, a, "+"); t = 0; for (i = 1; i <= n; i++) t += a[i]; exit !(t > 0) }' \
     && [ $live = yes ]; then
    verdict=ok
  else
    verdict=WRONG; repack_bad=1
  fi
  printf 'aarch64 CPU_REPACK smollm2-135m %s (QEMU_CPU=cortex-a76): ORK loaded %s MiB, ORK_OFF=1 %s MiB; ORK prefill on the NPU: %s; %s\n' \
    "$t" "${so:-none}" "${sc:-none}" "$live" "$verdict" | tee -a "$OUT/repack.txt"
done
[ $repack_bad = 0 ] || { echo "aarch64: CPU_REPACK with ORK loaded not equal to the CPU alone's and > 0, or the NPU not live (logs: $OUT/repack-*.log)"; exit 1; }
