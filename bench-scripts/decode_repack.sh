#!/usr/bin/env bash
# Decode with ORK loaded as fast as ggml-cpu alone: does llama.cpp keep ggml-cpu's repacked
# weights (its CPU_REPACK buffer type, the SIMD re-layout its decode kernels read) when ORK is
# loaded? Same binaries, ORK on the simulator against the plugin switched off (ORK_OFF=1):
#
#  (a) llama-bench -p 0 -n 64 -r 1 -t 2: decode tokens/s, ORK loaded (GGML_BACKEND_PATH=$ORK_LIB
#      ORK_NPU=sim) vs CPU alone, PAIRS pairs alternating which arm goes first, llama.cpp's
#      defaults otherwise (OMP_WAIT_POLICY unset: the headline row). Table: CPU t/s and ORK t/s of
#      each pair, ORK/CPU per pair, the median ratio.
#  (b) decode after an NPU prefill: llama-completion with a ~500-token prompt (PROMPT_CHARS of the
#      corpus), greedy, -n 64 --ignore-eos, -t 2, --no-warmup; ORK on the timed simulator
#      (ORK_NPU=sim ORK_SIM_TIMING=board: the prefill's programs not computed, each submit
#      completing at the modelled board NPU time; the text is meaningless, the decode is ggml-cpu's)
#      vs CPU alone, PAIRS pairs; llama.cpp's `eval time ... ms per token`, the ratio (target
#      <= 1.02), the prompt eval times and the NPU MUL_MAT count of the ORK runs (must be live).
#  (c) per model, the model buffers llama.cpp reports at load (llama-completion -lv 4, one ORK run
#      and one CPU run): CPU_REPACK with ORK equal to the CPU alone's.
#
# A benchmark, never a test (tests/run-all.sh does not call it). All times are wall time on this
# machine: on a loaded, shared host every figure moves; the load average is printed before and after.
# With OMP_WAIT_POLICY unset llama.cpp's threads spin between graphs, and on 2 busy shared cores
# that makes the figures the other load's (SmolLM2 Q4_0 tg64: ~100 t/s idle, ~5 t/s at load 3):
# take the headline rows on an idle host; BENCH_OMP_WAIT=passive gives usable ratios on a busy one.
#
#   bash bench-scripts/decode_repack.sh
#   PAIRS=1 MODELS="smollm2-135m-Q4_0 smollm2-135m-Q4_K_M smollm2-135m-Q8_0" bash bench-scripts/decode_repack.sh
#
# Env: MODELS (names in $ORK_MODELS or $ORK_ENV/synth, or paths; default SmolLM2-135M Q4_0, Q4_K_M,
# Q8_0 and the Qwen3-1.7B-shaped synthetic Q4_0 and Q4_K_M, made by bench-scripts/synth_models.sh
# when missing: F16 3.1 GB, once), DECODE_MODELS (part (b)'s models; default those of
# "smollm2-135m-Q4_0 smollm2-135m-Q8_0 synth-qwen3-1.7b-Q4_0" that are in MODELS; "" skips (b)),
# PAIRS (default 3), BENCH_TOKENS (64), BENCH_THREADS (2), PROMPT_CHARS (2200, about 500 tokens),
# DECODE_SIM_TIMING (board; compute runs the prefill bit-exactly, minutes on the synthetic),
# BENCH_OMP_WAIT (OMP_WAIT_POLICY for every run; unset by default).
# Results: $ORK_ENV/decode-repack/results.md (the tables printed), results.json, logs/ (each run's
# stderr).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
bench_env
bench_build_plugin
ALL="smollm2-135m-Q4_0 smollm2-135m-Q4_K_M smollm2-135m-Q8_0 synth-qwen3-1.7b-Q4_0 synth-qwen3-1.7b-Q4_K_M"
DECODE_DEFAULT="smollm2-135m-Q4_0 smollm2-135m-Q8_0 synth-qwen3-1.7b-Q4_0"
MODELS=${MODELS:-$ALL}
if [ -z "${DECODE_MODELS+set}" ]; then
  DECODE_MODELS=
  for n in $DECODE_DEFAULT; do
    case " $MODELS " in *" $n "*) DECODE_MODELS+=" $n" ;; esac
  done
fi
path_of() { # a model's name or path -> its path
  case $1 in
    */*|*.gguf) echo "$1" ;;
    synth-*) echo "$ORK_ENV/synth/$1.gguf" ;;
    *) echo "$ORK_MODELS/$1.gguf" ;;
  esac
}
paths() {
  local n p out=()
  for n in $1; do
    p=$(path_of "$n")
    if [ ! -f "$p" ] && [[ $(basename "$p") == synth-qwen3-1.7b-* ]]; then
      echo "== $(basename "$p") missing: bench-scripts/synth_models.sh (once; F16 3.1 GB)" >&2
      bash "$ROOT/bench-scripts/synth_models.sh" >/dev/null
    fi
    [ -f "$p" ] || { echo "decode_repack: no model $p" >&2; exit 1; }
    out+=("$p")
  done
  echo "${out[*]}"
}
export DR_MODELS; DR_MODELS=$(paths "$MODELS")
export DR_DECODE_MODELS; DR_DECODE_MODELS=$(paths "$DECODE_MODELS")
export DR_OUT=$ORK_ENV/decode-repack
mkdir -p "$DR_OUT"
rm -rf "$DR_OUT/logs"
python3 "$ROOT/bench-scripts/decode_repack.py"
