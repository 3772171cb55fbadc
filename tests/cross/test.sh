#!/usr/bin/env bash
# The product's own target in CI: cross-build the crate for aarch64-unknown-linux-gnu and run its
# whole `cargo test` (unit tests incl. the NEON kernels against the scalar references, the
# simulator's bit-exact tests, the Vulkan tests on arm64 lavapipe, the ABI drift probe compiled for
# aarch64, doctests) under qemu-aarch64 with QEMU_CPU=cortex-a76. Idempotent; warm: ~1-3 min.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
eval "$(bash tests/setup-env.sh --print-env)"
export LLAMA_SRC LLAMA_BIN ORK_MODELS ORK_ENV ORK_RELEASES
bash tests/cross/setup.sh
source tests/cross/env.sh
export ORK_REQUIRE_GLSLC=${ORK_REQUIRE_GLSLC:-1}
log=$ORK_ENV/cross-test.log
t0=$(date +%s)
"$CROSS_CARGO" test --target "$CROSS_TRIPLE" --no-run --quiet >"$log" 2>&1 \
  || { tail -40 "$log"; echo "aarch64 cross build failed"; exit 1; }
t1=$(date +%s)
# Skipped under qemu only: Mesa 22.3's llvmpipe (LLVM 15) for arm64 aborts with "LLVM ERROR:
# Cannot select ... v4f32 = AArch64ISD::VLSHR" while JIT-compiling the shaders that unpack f16
# block scales (Q4_0, Q4_K, and the batch test that uses them). A bug in the emulated CPU
# driver's compiler, not in ORK: boards run Mali drivers, and the same tests pass on x86
# lavapipe in the main cargo test. The int8 GEMV tests do run on arm64 lavapipe here.
VK_SKIP=${ORK_CROSS_VK_SKIP-q4_0_matches_reference q4k_matches_reference batch_one_submit_matches_single_calls_and_large_m_splits}
# Skipped under qemu only: tests that run an aarch64 binary (their own, or ork-route) as a child process.
# Without binfmt_misc (this host has none; registering it would change the host kernel for
# everyone) an emulated process cannot exec an aarch64 child. The same tests run natively on x86.
EXEC_SKIP=${ORK_CROSS_EXEC_SKIP-two_processes_load_the_same_model_at_once ork_route_says_a_model_bigger_than_ram_does_not_fit}
skip=(); for t in $VK_SKIP $EXEC_SKIP; do skip+=(--skip "$t"); done
"$CROSS_CARGO" test --target "$CROSS_TRIPLE" --no-fail-fast --quiet -- --exact "${skip[@]}" >>"$log" 2>&1 || true
t2=$(date +%s)
grep -E "^(test result|running|error|failures:|---- )" "$log" || true
if grep -qE "^test result: FAILED|^error" "$log" || ! grep -q "^test result: ok" "$log"; then
  grep -E "panicked|FAILED|^error" "$log" | head -40
  echo "aarch64 cargo test under qemu failed (log: $log)"; exit 1
fi
echo "aarch64: cross build $((t1 - t0)) s, tests under qemu $((t2 - t1)) s"
