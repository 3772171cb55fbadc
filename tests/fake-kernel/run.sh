#!/usr/bin/env bash
# Runs a command under the fake NPU kernel (fake-kernel/, docs/fake-kernel.md):
#   ORK_NPU=rknpu tests/fake-kernel/run.sh llama-completion -m model.gguf ...
#   ORK_NPU=rocket tests/fake-kernel/run.sh test-backend-ops -b ORK -o MUL_MAT
# ORK_NPU picks the personality (vendor rknpu on /dev/dri/card1, mainline rocket on
# /dev/accel/accel0); the product opens it exactly as it would open a board's node.
# With ORK_NPU=rknpu, ORK_FK_PORT picks which rknpu driver answers: vendor (default), or a
# mainline port of its ABI: rkopnu, dkms, helios, ep1sode, odd (docs/fake-kernel.md, "The
# mainline ports"); ORK_FK_NODES=render leaves /dev/dri/card1 out (renderD129 only).
# Board behaviour: ORK_FK_QUIRKS (default "cold,wedge"; "none" = an ideal board),
# ORK_FK_DOMAIN_MB (IOMMU window per domain), ORK_FK_CMA_MB (helios's CMA pool),
# ORK_FK_JOB_TIMEOUT_MS (rkopnu's job timeout), ORK_FK_STATS=<file> (counters at exit).
# These are plain environment: they reach the kernel library as they are.
# ORK_FK_BUILD=0 skips the (incremental) cargo build of the kernel library.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
case "${ORK_NPU:-}" in
  rknpu|rocket) ;;
  *) echo "tests/fake-kernel/run.sh: set ORK_NPU=rknpu or ORK_NPU=rocket (got '${ORK_NPU:-}')" >&2; exit 2 ;;
esac
LIB=$ROOT/target/release/libork_fake_kernel.so
SHIM=$ROOT/target/release/libork_fake_kernel_shim.so
if [ "${ORK_FK_BUILD:-1}" = 1 ]; then
  (cd "$ROOT" && cargo build --release -p ork-fake-kernel --quiet)
fi
if [ ! -f "$SHIM" ] || [ "$ROOT/fake-kernel/src/shim.c" -nt "$SHIM" ]; then
  "${CC:-cc}" -O2 -Wall -Werror -shared -fPIC -o "$SHIM" "$ROOT/fake-kernel/src/shim.c" -ldl -lpthread
fi
export ORK_FAKE_KERNEL=$ORK_NPU ORK_FAKE_KERNEL_LIB=$LIB
export ORK_FK_QUIRKS=${ORK_FK_QUIRKS-cold,wedge}
export LD_PRELOAD="$SHIM${LD_PRELOAD:+:$LD_PRELOAD}"
exec "$@"
