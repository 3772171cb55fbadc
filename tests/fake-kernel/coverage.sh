#!/usr/bin/env bash
# Line coverage of the kernel interfaces (src/npu/kif/rknpu.rs, rocket.rs, drm.rs) when
# ork-selftest runs under the fake kernel (both personalities, board quirks on). Not part of the
# test command (an instrumented build takes minutes); docs/fake-kernel.md quotes its output.
# Needs rustup's llvm-tools (rustup component add llvm-tools-preview).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
BIN=$(dirname "$(rustc --print target-libdir)")/bin
OUT=$ROOT/target/cov
rm -rf "$OUT/prof" && mkdir -p "$OUT/prof"
# The instrumented build scripts write profiles of their own when they run: keep them in $OUT,
# apart from the runs' (by default they land as default_*.profraw in the working directory).
LLVM_PROFILE_FILE="$OUT/build-prof/%p.profraw" RUSTFLAGS="-C instrument-coverage" \
  cargo build --release --quiet --bin ork-selftest --target-dir "$OUT"
cargo build --release --quiet -p ork-fake-kernel
"${CC:-cc}" -O2 -Wall -Werror -shared -fPIC -o target/release/libork_fake_kernel_shim.so fake-kernel/src/shim.c -ldl -lpthread
for run in "rknpu cold,wedge" "rocket cold,wedge" "rknpu none"; do
  set -- $run
  LLVM_PROFILE_FILE="$OUT/prof/%p.profraw" ORK_NPU=$1 ORK_FK_QUIRKS=$2 ORK_FK_BUILD=0 \
    tests/fake-kernel/run.sh "$OUT/release/ork-selftest" >/dev/null 2>&1 || { echo "ork-selftest failed under ORK_NPU=$1 ORK_FK_QUIRKS=$2"; exit 1; }
done
"$BIN/llvm-profdata" merge -sparse "$OUT"/prof/*.profraw -o "$OUT/kif.profdata"
"$BIN/llvm-cov" report "$OUT/release/ork-selftest" -instr-profile="$OUT/kif.profdata" \
  "$ROOT/src/npu/kif/rknpu.rs" "$ROOT/src/npu/kif/rocket.rs" "$ROOT/src/npu/kif/drm.rs"
# Functions never entered, per file (the ioctl wrappers must not be among them).
"$BIN/llvm-cov" report --show-functions "$OUT/release/ork-selftest" -instr-profile="$OUT/kif.profdata" \
  "$ROOT/src/npu/kif/rknpu.rs" "$ROOT/src/npu/kif/rocket.rs" "$ROOT/src/npu/kif/drm.rs" \
  | awk '$1 ~ /^(src|\/)/ || /^File/ {print; next} $3 == $2 && $2 > 0 {print "  never entered: " $1}'
