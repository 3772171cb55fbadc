#!/usr/bin/env bash
# Recompiles every shaders/*.comp with glslc and compares with the committed shaders/spv/*.spv.
#   shaders/check.sh           check (exit 1 on drift, 2 when glslc is missing)
#   shaders/check.sh --update  rewrite the committed SPIR-V
# Flags are part of the contract: keep them in sync with shaders/README.md.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
command -v glslc >/dev/null || { echo "glslc not found" >&2; exit 2; }
GLSLC_FLAGS=(--target-env=vulkan1.1 -O -I "$here")
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
status=0
for src in "$here"/*.comp; do
  name=$(basename "$src" .comp)
  glslc "${GLSLC_FLAGS[@]}" -o "$tmp/$name.spv" "$src"
  if [ "${1:-}" = "--update" ]; then
    cp "$tmp/$name.spv" "$here/spv/$name.spv"
  elif ! cmp -s "$tmp/$name.spv" "$here/spv/$name.spv"; then
    echo "stale SPIR-V: shaders/spv/$name.spv differs from glslc output of shaders/$name.comp" >&2
    status=1
  fi
done
exit $status
