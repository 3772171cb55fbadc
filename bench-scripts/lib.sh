# Sourced by the bench scripts: environment, plugin build, and the one place that names the
# model and the arms. Benchmarks are never run as tests (tests/run-all.sh does not call them).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}

# Pinned llama.cpp tools, models, corpus (tests/setup-env.sh; idempotent, sets up on first run).
bench_env() {
  eval "$(bash "$ROOT/tests/setup-env.sh" --print-env)"
  export LLAMA_SRC LLAMA_BIN ORK_MODELS ORK_CORPUS ORK_ENV
  export BENCH_MODEL=${BENCH_MODEL:-$ORK_MODELS/smollm2-135m-Q8_0.gguf}
}

# Build the plugin and publish it under ggml's naming, libggml-ork.so (absolute path in ORK_LIB).
bench_build_plugin() {
  (cd "$ROOT" && cargo build --release --lib --quiet)
  # Copy then rename: a new inode, so a llama.cpp process that has the old file mapped keeps it
  # (cp over a mapped .so truncates it in place and the running process dies of SIGBUS).
  cp -f "$CARGO_TARGET_DIR/release/libggml_ork.so" "$CARGO_TARGET_DIR/release/.libggml-ork.so.new"
  mv -f "$CARGO_TARGET_DIR/release/.libggml-ork.so.new" "$CARGO_TARGET_DIR/release/libggml-ork.so"
  export ORK_LIB="$CARGO_TARGET_DIR/release/libggml-ork.so"
}
