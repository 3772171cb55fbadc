#!/usr/bin/env bash
# Streamed prefill computes what the resident path computes, at the Qwen3-1.7B shape: greedy text
# of llama-completion on the computing simulator (ORK_NPU=sim, no board timing), the demo prompt
# repeated to about 500 tokens (one ubatch of -ub 512), all-resident against
# ORK_WCACHE_BUDGET_MB=$BUDGET (default 410), both reading the same `.orkpack` entries. Prints the
# two texts' equality, each run's NPU MUL_MATs and the streamed run's streaming counts.
#
#   bash bench-scripts/stream_equal.sh [MODEL.gguf]   # default: the synthetic Qwen3-1.7B Q8_0
source "$(dirname "$0")/lib.sh"
bench_env
bench_build_plugin >/dev/null
M=${1:-$ORK_ENV/synth/synth-qwen3-1.7b-Q8_0.gguf}
BUDGET=${BUDGET:-410} N=${N:-8}
export ORK_LOCK_DIR=${ORK_LOCK_DIR:-$(mktemp -d)} OMP_WAIT_POLICY=${ORK_BENCH_OMP_WAIT:-passive}
P=$(sed -nE 's/^PROMPT=\$\{1:-"([^"]+)"\}.*/\1/p' "$ROOT/tests/demo.sh")
PP=$P; for _ in $(seq 9); do PP="$PP $P"; done
gen() {  # out-prefix env...
  local o=$1; shift
  env "$@" GGML_BACKEND_PATH="$ORK_LIB" ORK_NPU=sim ORK_PROFILE=1 "$LLAMA_BIN/llama-completion" -m "$M" -p "$PP" -n "$N" \
    --temp 0 -no-cnv -t 2 --no-warmup --seed 1 -b 512 -ub 512 2>"$o.err" >"$o.out" || true
}
d=$(mktemp -d)
gen "$d/resident" ORK_STREAM=1
gen "$d/streamed" ORK_WCACHE_BUDGET_MB="$BUDGET"
for a in resident streamed; do
  ex=$(grep -E "ORK ran [0-9]+ MUL_MAT" "$d/$a.err" | tail -1 || true)
  echo "$a: $(grep -oE 'prompt eval time = .*tokens' "$d/$a.err" | head -1 || true); NPU MUL_MAT $(echo "$ex" | grep -oE 'ORK ran [0-9]+' | grep -oE '[0-9]+' || true); $(echo "$ex" | grep -oE 'streamed: [^;]*' || echo 'nothing streamed')"
done
if cmp -s "$d/resident.out" "$d/streamed.out" && [ -s "$d/resident.out" ]; then echo "texts: equal ($N tokens)"; else echo "texts: DIFFER"; fi
echo "logs: $d"
