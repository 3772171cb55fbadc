#!/usr/bin/env bash
# C compiler for tests/abi_drift.rs when the test runs under qemu: compiles the probe with the
# aarch64 cross gcc (so sizes, offsets and enum values are those of the product's target) and
# leaves, at the requested -o path, a tiny launcher that runs the aarch64 binary under
# qemu-aarch64-static (an emulated process cannot exec an aarch64 child without binfmt_misc).
set -euo pipefail
out=; prev=
for a in "$@"; do [ "$prev" = -o ] && out=$a; prev=$a; done
[ -n "$out" ] || exec aarch64-linux-gnu-gcc "$@"
args=(); prev=
for a in "$@"; do
  if [ "$prev" = -o ]; then args+=("$out.aarch64"); else args+=("$a"); fi; prev=$a
done
aarch64-linux-gnu-gcc "${args[@]}"
printf '#!/bin/sh\nexec qemu-aarch64-static "%s" "$@"\n' "$out.aarch64" >"$out"
chmod +x "$out"
