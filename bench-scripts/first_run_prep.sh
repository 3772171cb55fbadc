#!/usr/bin/env bash
# First run's weight preparation and the warm start, with what each writes to disk (a benchmark,
# never run as a test).
#
#   bash bench-scripts/first_run_prep.sh [MODEL.gguf ...]
#        (default: the synthetic Qwen3-1.7B shape, Q8_0 and Q4_K_M, from the environment cache)
#
# Per model: one llama-completion run (ORK_NPU=sim, ORK_PROFILE=1, 4 tokens) with a fresh private
# ORK_CACHE_DIR (the first run: every weight packed, uploaded, written to the cache), then one
# more with the same directory (the warm start: every weight a cache hit, with whatever of the
# cache files the page cache still holds), then one more after dropping the cache files' pages
# (warm-disk: the warm start of a later boot, the files read from disk). Prints the backend's
# `ork:` weight line (hits, packs, "prepared in N ms" and its split), the wall time, the bytes the
# process wrote (/proc/PID/io write_bytes, sampled just before it exits: what reached the
# filesystem layer) and the cache directory's size after the run.
# Env: PREP_THREADS (llama.cpp -t, default 2), PREP_KEEP=1 keeps the work directory, PREP_LIB=path
# runs that plugin instead of building this tree's (a before/after comparison).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -n "${LLAMA_BIN:-}" ] || eval "$(bash tests/setup-env.sh --print-env)"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target}
LIB=${PREP_LIB:-}
if [ -z "$LIB" ]; then
    cargo build --release --lib 2>&1 | tail -1
    # copy + rename (new inode): never rewrite a .so that a running process has mapped
    cp -f "$CARGO_TARGET_DIR/release/libggml_ork.so" "$CARGO_TARGET_DIR/release/.libggml-ork.so.new"
    mv -f "$CARGO_TARGET_DIR/release/.libggml-ork.so.new" "$CARGO_TARGET_DIR/release/libggml-ork.so"
    LIB="$CARGO_TARGET_DIR/release/libggml-ork.so"
fi
THREADS=${PREP_THREADS:-2}
if [ $# -eq 0 ]; then
    set -- "$ORK_ENV/synth/synth-qwen3-1.7b-Q8_0.gguf" "$ORK_ENV/synth/synth-qwen3-1.7b-Q4_K_M.gguf"
fi
WORK=$(mktemp -d)
[ "${PREP_KEEP:-0}" = 1 ] || trap 'rm -rf "$WORK"' EXIT
export ORK_LOCK_DIR="$WORK/lock"
mkdir -p "$ORK_LOCK_DIR"

# 60 tokens: over ORK_MINM, so the prefill's MUL_MATs reach the NPU and every weight is prepared.
PROMPT="The history of the printing press begins in the fifteenth century, when Johannes Gutenberg \
combined movable metal type, oil-based inks and a wooden press adapted from wine making. Within a \
few decades printing shops had spread across Europe, and books became far cheaper than before."

run() { # tag model cache
    local tag=$1 model=$2 cache=$3 t0 t1 pid wb=0 io
    t0=$(date +%s.%N)
    GGML_BACKEND_PATH="$LIB" ORK_NPU=sim ORK_PROFILE=1 ORK_CACHE_DIR="$cache" \
        "$LLAMA_BIN/llama-completion" -m "$model" -p "$PROMPT" -n 4 --temp 0 -no-cnv -t "$THREADS" \
        >"$WORK/$tag.out" 2>"$WORK/$tag.err" </dev/null &
    pid=$!
    # write_bytes of the process, last sample before it is gone
    while io=$(cat /proc/$pid/io 2>/dev/null); do
        wb=$(awk '/^write_bytes/ {print $2}' <<<"$io"); sleep 0.2
    done
    wait $pid
    t1=$(date +%s.%N)
    local line
    line=$(grep 'cache hits' "$WORK/$tag.err" | tail -1 | grep . || { echo "no ork: summary in the $tag run" >&2; tail -20 "$WORK/$tag.err" >&2; exit 1; })
    printf '%-9s wall %5.1f s, wrote %6.0f MB, cache dir %6.0f MB\n       %s\n' "$tag" "$(echo "$t1 - $t0" | bc)" \
        "$(echo "$wb / 1000000" | bc -l)" "$(echo "$(du -sb "$cache" 2>/dev/null | cut -f1 || echo 0) / 1000000" | bc -l)" "$(sed -E 's/^.*(weights: .*cache write [0-9]+ ms\)).*$/\1/' <<<"$line")"
    grep -E "^ork: packing weights" "$WORK/$tag.err" | tail -1 | sed 's/^/       /' || true
}

echo "plugin: $LIB"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) CPUs; -t $THREADS"
for model in "$@"; do
    echo "== $(basename "$model") ($(( $(stat -c %s "$model") / 1000000 )) MB)"
    cache="$WORK/cache-$(basename "$model" .gguf)"
    run first "$model" "$cache"
    run warm "$model" "$cache"
    # The warm start of a later boot: the cache files' pages dropped from the page cache first
    # (posix_fadvise DONTNEED per file: read from disk again, as after a reboot).
    python3 -c 'import os,sys
for root, _, files in os.walk(sys.argv[1]):
    for f in files:
        fd = os.open(os.path.join(root, f), os.O_RDONLY); os.fsync(fd); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED); os.close(fd)' "$cache"
    run warm-disk "$model" "$cache"
    cmp -s "$WORK/first.out" "$WORK/warm.out" || echo "       generated text of the warm run DIFFERS"
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
