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

# The calibration file ORK's correction reads (src/cache/calib.rs): every tool the scripts start
# sees it. calibrate_models records it for the given set-up models (smollm2-135m-Q8_0, …):
# llama-perplexity over 8 chunks of 128 tokens of the corpus's last 200 kB (the perplexity and
# KLD checks read its start) with ORK_CALIBRATE=1 on the simulator, once per model (a stamp beside
# the file; about 20 s for a SmolLM2 model, 60 s for a Gemma one).
export ORK_CALIBRATION=${ORK_CALIBRATION:-$ORK_ENV/calibration.orkcal}
calibrate_models() {
  local text=$ORK_ENV/calibration.txt m stamp
  [ -s "$text" ] || tail -c 200000 "$ORK_CORPUS" > "$text"
  # The stamps say which models the file holds; a file that is gone takes its stamps with it.
  [ -s "$ORK_CALIBRATION" ] || rm -f "$ORK_CALIBRATION".*.stamp
  for m in "$@"; do
    stamp=$ORK_CALIBRATION.$m.stamp
    [ -e "$stamp" ] && continue
    echo "== calibration: $m (llama-perplexity, 8 x 128 tokens, ORK_CALIBRATE=1)"
    GGML_BACKEND_PATH=$ORK_LIB ORK_NPU=sim ORK_CALIBRATE=1 "$LLAMA_BIN/llama-perplexity" -m "$ORK_MODELS/$m.gguf" \
      -f "$text" -c 128 -b 128 --chunks 8 -t 2 >"$ORK_ENV/calibration-$m.log" 2>&1 \
      || { echo "calibration of $m failed (log: $ORK_ENV/calibration-$m.log)"; return 1; }
    grep -q "^ork: calibration: " "$ORK_ENV/calibration-$m.log" \
      || { echo "calibration of $m recorded nothing (log: $ORK_ENV/calibration-$m.log)"; return 1; }
    touch "$stamp"
  done
}
