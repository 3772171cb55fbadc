#!/usr/bin/env bash
# Release artifact for boards: the aarch64 libggml-ork.so that a board owner drops beside the
# llama.cpp tools of any supported release (one file for all of them: the plugin recognises the
# host's ggml at load, src/ffi/release.rs):
#   dist/libggml-ork-aarch64.so      (debug info stripped; symbols kept)
#   dist/libggml-ork-aarch64.txt     (manifest: the supported llama.cpp/ggml releases, commit, toolchain, sha256)
# The manifest is also embedded in the .so as the ELF section .ork_build
# (`readelf -p .ork_build libggml-ork-aarch64.so`).
# Checks: `file` says ARM aarch64; `nm -D --defined-only` exports ggml_backend_init.
# Idempotent; ~1 min cold (after tests/cross/setup.sh), seconds warm.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
ORK_ENV=${ORK_ENV:-$HOME/.cache/ggml-ork-env}
bash tests/cross/setup.sh
source tests/cross/env.sh

# The llama.cpp releases this plugin is for: one layout header per release in ggml-headers/ (each
# drift-checked against that release's tree), with the PyPI sdist the set-up builds it from.
supported=()
for h in ggml-headers/ork_ggml_b*.h; do
  build=$(sed -n 's/^#define ORK_LLAMA_BUILD \([0-9]*\).*/\1/p' "$h")
  ggml=$(sed -n 's/^#define ORK_GGML_VERSION "\(.*\)".*/\1/p' "$h")
  api=$(sed -n 's/^#define GGML_BACKEND_API_VERSION \([0-9]*\).*/\1/p' "$h")
  sdist=$(grep -ho "[0-9]\{4\}\.[0-9]*\.$build" tests/setup-env.sh tests/setup-releases.sh | head -1)
  [ -n "$build" ] && [ -n "$ggml" ] && [ -n "$api" ] && [ -n "$sdist" ] \
    || { echo "release: cannot read the release of $h"; exit 1; }
  supported+=("llama.cpp b$build (ggml $ggml, backend API version $api; PyPI sdist xllamacpp==$sdist)")
done
"$CROSS_CARGO" build --release --lib --target "$CROSS_TRIPLE" --quiet
so=$CARGO_TARGET_DIR/$CROSS_TRIPLE/release/libggml_ork.so

mkdir -p dist
name=libggml-ork-aarch64
out=dist/$name.so
man=dist/$name.txt
commit=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
dirty=$(git diff --quiet HEAD 2>/dev/null || echo "+dirty")
{
  echo "artifact: $name.so"
  for r in "${supported[@]}"; do echo "for: $r"; done
  echo "load: GGML_BACKEND_PATH=/abs/path/$name.so llama-cli -m model.gguf -t 4 ..."
  echo "crate: ggml-ork $(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1), commit $commit$dirty"
  echo "target: $CROSS_TRIPLE ($("$RUSTC" --version))"
} >"$man.tmp"
aarch64-linux-gnu-objcopy --strip-debug --add-section .ork_build="$man.tmp" \
  --set-section-flags .ork_build=noload,readonly "$so" "$out.tmp"
mv "$out.tmp" "$out"

# checks
file -b "$out" | grep -q "ARM aarch64" || { echo "release: $out is not aarch64: $(file -b "$out")"; exit 1; }
aarch64-linux-gnu-nm -D --defined-only "$out" | grep -qw ggml_backend_init \
  || { echo "release: $out does not export ggml_backend_init"; exit 1; }
for r in "${supported[@]}"; do
  readelf -p .ork_build "$out" | grep -qF "${r%% (*}" || { echo "release: .ork_build does not name ${r%% (*}"; exit 1; }
done
{ cat "$man.tmp"; echo "sha256: $(sha256sum "$out" | cut -d' ' -f1)"; echo "size: $(stat -c %s "$out") bytes"; } >"$man"
rm -f "$man.tmp"
echo "== $out"
file -b "$out"
aarch64-linux-gnu-nm -D --defined-only "$out" | grep -w ggml_backend_init
cat "$man"
