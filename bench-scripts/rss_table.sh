#!/usr/bin/env bash
# Peak RSS by driver (issue #24's criterion): per model, llama-completion with the demo prompt
# (tests/demo.sh), 16 greedy tokens, -t 2, under /usr/bin/time -v ("Maximum resident set size"),
# on the CPU alone (ORK_OFF=1), ORK on the simulator (ORK_NPU=sim), and ORK on the vendor `rknpu`
# and the mainline `rocket` interfaces under the fake kernel (tests/fake-kernel/run.sh). Each ORK
# arm runs with ORK_PROFILE=1 and a fresh ORK_CACHE_DIR (cold: it packs every weight it uses, as
# a new user's first run does). A benchmark, never a test.
#
#   bash bench-scripts/rss_table.sh [MODEL.gguf ...]
#   (default: SmolLM2-135M Q8_0, Gemma-3-270M Q8_0 and the Qwen3-1.7B-shaped synthetic Q8_0 and
#   Q4_K_M of bench-scripts/synth_models.sh, where those exist)
#
# Columns: peak RSS (MiB); for the fake-kernel rows also the peak of RSS less the emulator's own
# mappings (below); int8 = ORK's resident int8 tiles at exit (exit line `int8 tiles A + B (terms
# 1 + 2)`, A + B; scales not included); bound = CPU-only peak RSS + 1.1 × int8; ok = the row's
# RSS (for the fake kernel: less the emulator's mappings) ≤ bound.
#
# The fake kernel is a kernel inside the process: every buffer object has a device view (an
# anonymous mapping the emulated NPU reads and writes), the kernel's own mapping of the BO's
# memfd (the same pages the product maps, but RSS counts a page once per mapping that has it
# faulted in) and per-line hashes of its cache model. None of that is process memory on a board,
# where the NPU reads the pages the process maps. With ORK_FK_RSS_MS the fake kernel samples
# /proc/self/smaps every N ms and reports the largest RSS less those mappings'
# (`rss_less_emu_peak_kib`), which is the column the criterion is checked on for those rows.
#
# Models whose name starts with synth- run the simulator row with ORK_SIM_TIMING=board (programs
# not computed, only their last output word written; the text is meaningless): computing them
# bit-exactly would take minutes. The fake kernel always computes every program.
# RSS_MS (default 50) is the sampling period; RSS_ARMS (default "cpu sim rknpu rocket") the arms;
# RSS_LOGS=<dir> keeps each run's stderr there.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
bench_env
bench_build_plugin
(cd "$ROOT" && cargo build --release -p ork-fake-kernel --quiet)
PROMPT=$(sed -n 's/^PROMPT=${1:-"\(.*\)"}$/\1/p' "$ROOT/tests/demo.sh")
[ -n "$PROMPT" ] || { echo "rss_table: no prompt in tests/demo.sh" >&2; exit 1; }
MODELS=("$@")
if [ ${#MODELS[@]} -eq 0 ]; then
  MODELS=("$ORK_MODELS/smollm2-135m-Q8_0.gguf" "$ORK_MODELS/gemma3-270m-Q8_0.gguf")
  for t in Q8_0 Q4_K_M; do
    f=$ORK_ENV/synth/synth-qwen3-1.7b-$t.gguf
    [ -f "$f" ] && MODELS+=("$f")
  done
fi
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
export ORK_LOCK_DIR=$WORK/lock
mkdir -p "$ORK_LOCK_DIR"
RSS_MS=${RSS_MS:-50}
ARMS=${RSS_ARMS:-cpu sim rknpu rocket}
mib() { awk -v k="$1" 'BEGIN { printf "%.0f", k / 1024 }'; }

# run ARM: one llama-completion of $MODEL under /usr/bin/time -v; sets KB, INT8, LESS, NOTE.
run() {
  local arm=$1 out=$WORK/out.txt err=$WORK/err.txt stats=$WORK/fk.stats cache=$WORK/cache-$1
  local -a pre=(env GGML_BACKEND_PATH="$ORK_LIB" ORK_PROFILE=1 ORK_CACHE_DIR="$cache")
  rm -rf "$cache" "$stats"
  mkdir -p "$cache"
  case $arm in
    cpu) pre+=(ORK_OFF=1) ;;
    sim) pre+=(ORK_NPU=sim)
         case $(basename "$MODEL") in synth-*) pre+=(ORK_SIM_TIMING=board) ;; esac ;;
    rknpu|rocket) pre+=(ORK_NPU=$arm ORK_FK_BUILD=0 ORK_FK_RSS_MS="$RSS_MS" ORK_FK_STATS="$stats"
                        bash "$ROOT/tests/fake-kernel/run.sh") ;;
  esac
  "${pre[@]}" /usr/bin/time -v "$LLAMA_BIN/llama-completion" -m "$MODEL" -p "$PROMPT" -n 16 \
    --temp 0 -no-cnv -t 2 --no-warmup --seed 1 >"$out" 2>"$err" || { echo "$arm: failed" >&2; tail -5 "$err" >&2; return 1; }
  [ -z "${RSS_LOGS:-}" ] || cp "$err" "$RSS_LOGS/$(basename "$MODEL" .gguf)-$arm.log"
  KB=$(sed -n 's/.*Maximum resident set size (kbytes): //p' "$err")
  INT8=$(grep -oE 'int8 tiles [0-9.]+ \+ [0-9.]+' "$err" | tail -1 | awk '{ printf "%.1f", $3 + $5 }')
  LESS= NOTE=
  if [ -f "$stats" ]; then
    LESS=$(sed -n 's/^rss_less_emu_peak_kib=//p' "$stats" | tail -1)
    NOTE="emulator at the sampled peak $(mib "$(sed -n 's/^rss_emu_at_peak_kib=//p' "$stats" | tail -1)") of $(mib "$(sed -n 's/^rss_peak_kib=//p' "$stats" | tail -1)") MiB sampled; peak_bo_bytes $(( $(sed -n 's/^peak_bo_bytes=//p' "$stats" | tail -1) >> 20 )) MiB"
  fi
  rm -rf "$cache"
}

echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "| model | arm | peak RSS (MiB) | less the emulator's mappings (MiB) | int8 resident (MiB) | CPU + 1.1 × int8 (MiB) | ok | note |"
echo "|---|---|---:|---:|---:|---:|---|---|"
for MODEL in "${MODELS[@]}"; do
  name=$(basename "$MODEL" .gguf)
  CPU_KB=
  for arm in $ARMS; do
    [ "$arm" = cpu ] || [ -n "$CPU_KB" ] || { run cpu; CPU_KB=$KB; }
    run "$arm" || { echo "| $name | $arm | failed | | | | | |"; continue; }
    [ "$arm" = cpu ] && CPU_KB=$KB
    if [ "$arm" = cpu ]; then
      echo "| $name | CPU only | $(mib "$KB") | | | | | |"
      continue
    fi
    bound=$(awk -v c="$CPU_KB" -v i="${INT8:-0}" 'BEGIN { printf "%.0f", c / 1024 + 1.1 * i }')
    judged=${LESS:-$KB}
    ok=$(awk -v r="$judged" -v b="$bound" 'BEGIN { print (r / 1024 <= b) ? "yes" : "NO" }')
    tag=$arm; [ "$arm" = sim ] && case $name in synth-*) tag="sim (board timing)" ;; esac
    [ "$arm" = sim ] || tag="$arm (fake kernel)"
    echo "| $name | $tag | $(mib "$KB") | ${LESS:+$(mib "$LESS")} | ${INT8:-?} | $bound | $ok | $NOTE |"
  done
done
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
