#!/usr/bin/env bash
# cargo's runner for aarch64-unknown-linux-gnu: plain qemu-aarch64-static (never -L: with -L the
# cross ld.so meets the multiarch libc and every test hangs at its first thread spawn).
# It also sets, for the emulated test processes only (not for cargo's build scripts):
#   CC            -> abi-cc.sh, so tests/abi_drift.rs compiles its probe for aarch64 and runs it
#                    under qemu (this host has no binfmt_misc for aarch64 children)
#   VK_DRIVER_FILES -> the arm64 lavapipe manifest (tests/cross/setup.sh diverts it out of the
#                    x86 loader's search path)
#   QEMU_CPU      -> cortex-a76 (RK3588 big core: neon, fp16, dotprod; no i8mm, no SVE)
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export CC="$here/abi-cc.sh"
export VK_DRIVER_FILES=${VK_DRIVER_FILES:-/usr/share/ork-cross/vulkan-icd/lvp_icd.aarch64.json}
export VK_ICD_FILENAMES=$VK_DRIVER_FILES
export QEMU_CPU=${QEMU_CPU:-cortex-a76}
exec qemu-aarch64-static "$@"
