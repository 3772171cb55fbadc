#!/usr/bin/env bash
# Peak RSS of llama-completion with ORK's weight buffers over llama.cpp's mapping of the model
# file (the default) against the GGUF copy in ORK's own buffers (ORK_MAP_WEIGHTS=0, what every
# build before it did) and the CPU alone (ORK_OFF=1), in one run (a benchmark, never a test).
#
#   bash bench-scripts/rss_mapped.sh [MODEL.gguf ...]   (default: SmolLM2-135M Q8_0, Gemma-3-270M Q8_0)
#
# Per model: the demo prompt, 16 greedy tokens, -t 2, ORK_NPU=sim, under /usr/bin/time -v
# ("Maximum resident set size"); each ORK arm with its own fresh ORK_CACHE_DIR, run twice: cold
# (packs every weight it uses and writes the .orkpack entries) then warm (cache hits). Prints one
# row per run: peak RSS, the text's md5 (the same in every row of a model), and the `resident`
# part of ORK's exit line (GGUF copy / file-backed). RSS_BEFORE_LIB=path runs the copy arm with
# another libggml-ork.so (e.g. main's build) instead of ORK_MAP_WEIGHTS=0.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
bench_env
bench_build_plugin
PROMPT=$(sed -n 's/^PROMPT=${1:-"\(.*\)"}$/\1/p' "$ROOT/tests/demo.sh")
[ -n "$PROMPT" ] || { echo "rss_mapped: no prompt in tests/demo.sh" >&2; exit 1; }
MODELS=("$@")
[ ${#MODELS[@]} -gt 0 ] || MODELS=("$ORK_MODELS/smollm2-135m-Q8_0.gguf" "$ORK_MODELS/gemma3-270m-Q8_0.gguf")
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
export ORK_LOCK_DIR=$WORK/lock
mkdir -p "$ORK_LOCK_DIR"
BEFORE_LIB=${RSS_BEFORE_LIB:-$ORK_LIB}

# run TAG LIB EXTRA_ARGS ENV...: one llama-completion under /usr/bin/time -v; prints its row.
run() {
  local tag=$1 lib=$2 extra=$3
  shift 3
  local out=$WORK/out.txt err=$WORK/err.txt
  env "$@" GGML_BACKEND_PATH="$lib" ORK_NPU=sim /usr/bin/time -v "$LLAMA_BIN/llama-completion" -m "$MODEL" -p "$PROMPT" -n 16 \
    --temp 0 -no-cnv -t 2 --no-warmup --seed 1 $extra >"$out" 2>"$err" || { echo "$tag: failed"; tail -5 "$err"; return 1; }
  local kb md5 res
  kb=$(sed -n 's/.*Maximum resident set size (kbytes): //p' "$err")
  md5=$(md5sum <"$out" | cut -c1-8)
  res=$(grep -o 'weights: [0-9]* cache hits, [0-9]* packs' "$err" | tail -1 || true)
  res="$res; $(grep -o 'memory (MiB): resident .*' "$err" | tail -1 || true)"
  printf '| %s | %s | %d MiB | %s | %s |\n' "$(basename "$MODEL" .gguf)" "$tag" $((kb / 1024)) "$md5" "$res"
}

echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "| model | arm | peak RSS | text md5 | ORK exit line: weights; resident |"
echo "|---|---|---|---|---|"
for MODEL in "${MODELS[@]}"; do
  run "CPU only (ORK_OFF=1)" "$ORK_LIB" "" ORK_OFF=1
  mkdir -p "$WORK/copy-$$" "$WORK/mapped-$$"
  for c in cold warm; do
    run "GGUF copy (ORK_MAP_WEIGHTS=0), $c cache" "$BEFORE_LIB" "" ORK_MAP_WEIGHTS=0 ORK_CACHE_DIR="$WORK/copy-$$"
  done
  for c in cold warm; do
    run "mapped (default), $c cache" "$ORK_LIB" "" ORK_CACHE_DIR="$WORK/mapped-$$"
  done
  run "-lm none (no mmap), warm cache" "$ORK_LIB" "-lm none" ORK_CACHE_DIR="$WORK/mapped-$$"
  rm -rf "$WORK/copy-$$" "$WORK/mapped-$$"
done
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
