#!/usr/bin/env bash
# Host benchmarks (issue "Benchmarks here and the on-board kit"), each a ratio measured in one run:
#  1. examples/bench_host.rs — activation quantizers and output dequantizers vs memcpy, the
#     quantizers vs ggml-cpu's Q8_0 from_float, packing GB/s per core and its multi-core scaling;
#  2. bench-scripts/decode_overhead.py — per-token host overhead of ORK on SmolLM2 decode.
# Usage: bash bench-scripts/host_bench.sh [--no-decode]   (ORK_BENCH_ROUNDS=41 paired rounds of ORK_BENCH_SAMPLE_MS=1 ms samples)
# Writes the tables to stdout and to $ORK_ENV/bench/host-bench.md.
source "$(dirname "$0")/lib.sh"
bench_env
OUT=$ORK_ENV/bench; mkdir -p "$OUT"
cd "$ROOT"
cargo build --release --quiet --example bench_host
{
  echo "## host benchmarks ($(date -u +%Y-%m-%dT%H:%MZ), $(git -C "$ROOT" rev-parse --short HEAD), $(uname -m), $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg))"
  echo
  "$CARGO_TARGET_DIR/release/examples/bench_host"
  if [[ "${1:-}" != "--no-decode" ]]; then
    echo
    bench_build_plugin
    python3 "$ROOT/bench-scripts/decode_overhead.py"
  fi
} | tee "$OUT/host-bench.md"
