# Sourced by the cross scripts: Debian's rustc 1.96 (by explicit path; rustup's toolchain stays
# first on PATH and untouched) with its multiarch arm64 std, the aarch64 cross gcc as linker and
# C compiler, and qemu as the runner. Builds land outside the repo, in $ORK_ENV/cross-target.
CROSS_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export CROSS_TRIPLE=aarch64-unknown-linux-gnu
export CROSS_CARGO=/usr/bin/cargo
export RUSTC=/usr/bin/rustc RUSTDOC=/usr/bin/rustdoc
export CARGO_TARGET_DIR=${ORK_CROSS_TARGET_DIR:-$ORK_ENV/cross-target}
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER=$CROSS_DIR/qemu-run.sh
export CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc
export CXX_aarch64_unknown_linux_gnu=aarch64-linux-gnu-g++
export AR_aarch64_unknown_linux_gnu=aarch64-linux-gnu-ar
export BINDGEN_EXTRA_CLANG_ARGS_aarch64_unknown_linux_gnu="--target=aarch64-unknown-linux-gnu --sysroot=/usr/aarch64-linux-gnu"
