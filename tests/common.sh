# Sourced by the demo and test scripts: set-up, build, and the paths they share.
# Everything big (llama.cpp build, models) lives in $ORK_ENV outside the repo.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
eval "$(bash "$ROOT/tests/setup-env.sh" --print-env)"
export LLAMA_SRC LLAMA_BIN ORK_MODELS ORK_CORPUS ORK_ENV ORK_RELEASES

# Build the plugin and publish it under ggml's naming, libggml-ork.so.
build_plugin() {
  (cd "$ROOT" && cargo build --release --lib --quiet)
  # copy then rename: a tool that has the old file loaded keeps its mapping (cp -f would rewrite it in place)
  cp -f "$ROOT/target/release/libggml_ork.so" "$ROOT/target/release/.libggml-ork.so.tmp"
  mv -f "$ROOT/target/release/.libggml-ork.so.tmp" "$ROOT/target/release/libggml-ork.so"
  export ORK_LIB="$ROOT/target/release/libggml-ork.so"
}
