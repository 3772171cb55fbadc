#!/usr/bin/env bash
# Idempotent cross build of the pinned llama.cpp (b11549, the tree tests/setup-env.sh extracts)
# for aarch64, into $ORK_ENV/build-aarch64. Same cmake flags as the x86 build in setup-env.sh,
# plus the toolchain file and an RK3588/RK3576 CPU baseline (Cortex-A76/A55 and A72/A53 boards
# differ; armv8.2-a+dotprod+fp16 is what both RK SoCs' big and little cores have).
# Only what the emulated end-to-end run needs is built: ggml-cpu and llama-completion
# (~5 min of 2 cores cold; seconds when up to date). Not part of CI.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
eval "$(bash "$ROOT/tests/setup-env.sh" --print-env)"
bash "$ROOT/tests/cross/setup.sh"
BUILD=$ORK_ENV/build-aarch64
ARM_ARCH=${ORK_CROSS_ARM_ARCH:-armv8.2-a+dotprod+fp16}
TARGETS=(ggml-cpu llama-completion ${ORK_CROSS_LLAMA_TARGETS:-})
log() { echo "[cross-llama] $*" >&2; }
if [ ! -f "$BUILD/.configured-$ARM_ARCH" ]; then
  log "configure $BUILD (-DGGML_CPU_ARM_ARCH=$ARM_ARCH)"
  cmake -S "$LLAMA_SRC" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_TOOLCHAIN_FILE="$ROOT/tests/cross/aarch64-toolchain.cmake" \
    -DBUILD_SHARED_LIBS=ON -DGGML_BACKEND_DL=ON -DGGML_CPU=ON -DGGML_NATIVE=OFF -DGGML_RPC=ON \
    -DGGML_CPU_ARM_ARCH="$ARM_ARCH" \
    -DLLAMA_OPENSSL=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
    -DLLAMA_BUILD_TESTS=ON -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_SERVER=ON \
    -DLLAMA_BUILD_NUMBER=11549 -DLLAMA_BUILD_COMMIT=xllamacpp-2026.10.11549 \
    >"$ORK_ENV/cmake-configure-aarch64.log" 2>&1 \
    || { tail -30 "$ORK_ENV/cmake-configure-aarch64.log" >&2; exit 1; }
  touch "$BUILD/.configured-$ARM_ARCH"
fi
export CCACHE_DIR=$ORK_ENV/ccache CCACHE_BASEDIR=$ORK_ENV
log "build ${TARGETS[*]} (about 5 min cold on 2 cores)"
t0=$(date +%s)
cmake --build "$BUILD" -j"$(nproc)" --target "${TARGETS[@]}" >"$ORK_ENV/cmake-build-aarch64.log" 2>&1 \
  || { tail -40 "$ORK_ENV/cmake-build-aarch64.log" >&2; exit 1; }
log "built in $(( $(date +%s) - t0 )) s: $(file -b "$BUILD/bin/llama-completion" | cut -d, -f1-2)"
echo "export LLAMA_BIN_AARCH64=$BUILD/bin"
