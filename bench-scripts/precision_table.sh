#!/usr/bin/env bash
# The precision table of docs/precision.md: for each model file and configuration, NPU rows sent
# per token against plain W8A8 (the exit line's own counter), mean KL divergence and same-top-token
# rate against the CPU's F16 logits, and perplexity, on 8 × 128 tokens of the britannica text.
#
#   bash bench-scripts/precision_table.sh [MODEL_PREFIX ...]    # default: smollm2-135m
#
# MODEL_PREFIX names the set-up's models ($ORK_MODELS/<prefix>-{F16,Q8_0,Q4_K_M}.gguf). The F16
# base logits are made once per prefix in $ORK_ENV/kld/. Takes ~1 min per row on 2 cores. TYPES (default
# "Q8_0 F16 Q4_K_M") picks the model types; CONFIGS (an extended regex over the configuration
# labels, default all) picks the rows.
source "$(dirname "$0")/../tests/common.sh"
set +e
build_plugin >/dev/null
CHUNKS=${CHUNKS:-8}
mkdir -p "$ORK_ENV/kld"
run() { # prefix type label env...
  local prefix=$1 t=$2 label=$3; shift 3
  [[ "$label" =~ ${CONFIGS:-.} ]] || return 0
  local base="$ORK_ENV/kld/$prefix-F16-${CHUNKS}x128.kld"
  local out
  out=$(env GGML_BACKEND_PATH="$ORK_LIB" ORK_NPU=sim ORK_CACHE=0 "$@" "$LLAMA_BIN/llama-perplexity" -m "$ORK_MODELS/$prefix-$t.gguf" \
        -f "$ORK_CORPUS" -c 128 -b 128 --chunks "$CHUNKS" -t 2 --kl-divergence-base "$base" --kl-divergence 2>&1)
  local kld top ppl ratio
  kld=$(echo "$out" | awk '/^Mean +KLD/ {print $3}')
  top=$(echo "$out" | awk '/^Same top p/ {print $4}')
  ppl=$(echo "$out" | grep -E '^Mean +PPL\(Q\) +:' | sed 's/.*: *//' | awk '{print $1}')
  ratio=$(echo "$out" | grep -oE 'rows sent = [0-9.]+x' | grep -oE '[0-9.]+x' | tail -1)
  echo "| $prefix $t | $label | ${ratio:--} | $kld | $top % | $ppl |"
}
echo "| model | configuration | NPU rows vs plain W8A8 | mean KLD vs F16 | same top token | PPL |"
echo "|---|---|---:|---:|---:|---:|"
for prefix in "${@:-smollm2-135m}"; do
  base="$ORK_ENV/kld/$prefix-F16-${CHUNKS}x128.kld"
  [ -f "$base" ] || env GGML_BACKEND_PATH="$ORK_LIB" ORK_OFF=1 "$LLAMA_BIN/llama-perplexity" -m "$ORK_MODELS/$prefix-F16.gguf" \
      -f "$ORK_CORPUS" -c 128 -b 128 --chunks "$CHUNKS" -t 2 --kl-divergence-base "$base" >/dev/null 2>&1
  for t in ${TYPES:-Q8_0 F16 Q4_K_M}; do
    calibrate_models "$prefix-$t" >&2
    run "$prefix" "$t" "CPU (ggml-cpu)" ORK_OFF=1
    run "$prefix" "$t" "ORK default (rotated, calibrated correction, ORK_NPU_WORK=1)"
    run "$prefix" "$t" "ORK rotated, no calibrated correction (ORK_MEAN_CORRECT=0)" ORK_MEAN_CORRECT=0
    run "$prefix" "$t" "ORK rotated, calibrated correction, ORK_NPU_WORK=1.05" ORK_NPU_WORK=1.05
    run "$prefix" "$t" "ORK rotated, calibrated correction, ORK_NPU_WORK=1.40" ORK_NPU_WORK=1.40
    run "$prefix" "$t" "ORK rotated plain W8A8 everywhere (ORK_ACT_TERMS=1 ORK_WEIGHT_TERMS=1)" ORK_ACT_TERMS=1 ORK_WEIGHT_TERMS=1
    run "$prefix" "$t" "ORK unrotated multi-term (ORK_ROTATE=0)" ORK_ROTATE=0
  done
done
