#!/usr/bin/env bash
# Idempotent, cached set-up of the *reference* Vulkan backend (llama.cpp's own ggml-vulkan, from the
# pinned source in $LLAMA_SRC) for bench-scripts/vk_side_by_side.sh. Benchmark only, never CI.
#   - Debian 12's Vulkan-Hpp headers (1.3.239) are too old for the pinned ggml-vulkan.cpp
#     (vk::LayerSettingEXT), so Debian 13's libvulkan-dev 1.4.309.0-1 is *unpacked* (headers only,
#     not installed) through a private apt configuration that leaves the system's apt state alone.
#   - spirv-headers is installed from the system's own suites.
#   - a separate build directory $ORK_ENV/build-vk, same flags as tests/setup-env.sh plus
#     GGML_VULKAN=ON; only ggml-vulkan and test-backend-ops are built (-j2).
# Prints the build's bin directory on stdout.
set -euo pipefail
: "${ORK_ENV:?}" "${LLAMA_SRC:?}"
log() { echo "[vk-ref] $*" >&2; }
exec 8>"$ORK_ENV/.lock-vk"; flock 8

HDR=$ORK_ENV/vk-headers-1.4.309
if [ ! -f "$HDR/.ok" ]; then
  log "unpacking Debian trixie libvulkan-dev 1.4.309.0-1 headers into $HDR"
  APT=$ORK_ENV/apt-trixie
  rm -rf "$APT"; mkdir -p "$APT/sources" "$APT/lists/partial" "$APT/cache/archives/partial" "$APT/dl"
  uri=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
  uri=${uri:-http://deb.debian.org/debian}
  cat >"$APT/sources/trixie.sources" <<SRC
Types: deb
URIs: $uri
Suites: trixie
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
  opts=(-o Dir::Etc::SourceList=/dev/null -o Dir::Etc::SourceParts="$APT/sources"
        -o Dir::State::Lists="$APT/lists" -o Dir::Cache="$APT/cache" -o APT::Get::List-Cleanup=0)
  apt-get "${opts[@]}" update -qq >&2
  (cd "$APT/dl" && apt-get "${opts[@]}" download libvulkan-dev=1.4.309.0-1 >&2)
  rm -rf "$HDR"; mkdir -p "$HDR"
  dpkg -x "$APT"/dl/libvulkan-dev_1.4.309.0-1_*.deb "$HDR"
  [ -f "$HDR/usr/include/vulkan/vulkan.hpp" ]
  touch "$HDR/.ok"
fi

if ! dpkg -s spirv-headers >/dev/null 2>&1; then
  log "apt-get install spirv-headers"
  SUDO=; [ "$(id -u)" = 0 ] || SUDO=sudo
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends spirv-headers >&2 \
    || { $SUDO apt-get update -qq >&2
         DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends spirv-headers >&2; }
fi

BUILD=$ORK_ENV/build-vk
if [ ! -f "$BUILD/.build-ok" ] || [ ! -f "$BUILD/bin/libggml-vulkan.so" ] || [ ! -x "$BUILD/bin/test-backend-ops" ]; then
  export CCACHE_DIR=$ORK_ENV/ccache CCACHE_BASEDIR=$ORK_ENV
  log "configuring $BUILD (GGML_VULKAN=ON)"
  cmake -S "$LLAMA_SRC" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release \
    -DBUILD_SHARED_LIBS=ON -DGGML_BACKEND_DL=ON -DGGML_CPU=ON -DGGML_NATIVE=OFF -DGGML_RPC=ON \
    -DGGML_VULKAN=ON -DVulkan_INCLUDE_DIR="$HDR/usr/include" \
    -DLLAMA_OPENSSL=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
    -DLLAMA_BUILD_TESTS=ON -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_SERVER=ON \
    -DLLAMA_BUILD_NUMBER=11549 -DLLAMA_BUILD_COMMIT=vk-ref >"$ORK_ENV/cmake-configure-vk.log" 2>&1 \
    || { tail -30 "$ORK_ENV/cmake-configure-vk.log" >&2; exit 1; }
  log "building ggml-vulkan, ggml-cpu, test-backend-ops (-j${VK_REF_JOBS:-2}; ggml-vulkan.cpp takes minutes)"
  cmake --build "$BUILD" -j"${VK_REF_JOBS:-2}" --target ggml-cpu ggml-vulkan test-backend-ops \
    >"$ORK_ENV/cmake-build-vk.log" 2>&1 \
    || { tail -40 "$ORK_ENV/cmake-build-vk.log" >&2; exit 1; }
  touch "$BUILD/.build-ok"
fi
echo "$BUILD/bin"
