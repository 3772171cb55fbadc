#!/usr/bin/env bash
# End-to-end benchmark here: llama-bench arms (CPU, ORK default, all-NPU, GPU decode) on SmolLM2
# Q8_0 and llama-perplexity ORK vs CPU, with the NPU simulated (ORK_NPU=sim) and Vulkan on
# lavapipe — the numbers are labelled so; they are NOT board numbers.
# Writes $ORK_ENV/bench/e2e-bench.{md,json,png} (BENCH_OUT overrides); knobs in e2e_bench.py.
# Usage: bash bench-scripts/e2e_bench.sh
source "$(dirname "$0")/lib.sh"
bench_env
bench_build_plugin
# matplotlib for the chart, in a venv under $ORK_ENV (made once).
VENV=$ORK_ENV/bench-venv
if ! "$VENV/bin/python" -c "import matplotlib" 2>/dev/null; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet matplotlib
fi
export BENCH_OUT=${BENCH_OUT:-$ORK_ENV/bench}
export BENCH_PYTHON_CHART=$VENV/bin/python
python3 "$ROOT/bench-scripts/e2e_bench.py"
