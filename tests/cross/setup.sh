#!/usr/bin/env bash
# Idempotent set-up of the aarch64 cross route (Debian 12 bookworm, x86-64 host):
#   - Debian's rustc-web / cargo-web (1.96, bookworm-security) for amd64 plus the matching arm64
#     std (libstd-rust-web-dev:arm64, multiarch). rustup's toolchain stays untouched and first on
#     PATH; the cross scripts call Debian's rustc by explicit path (RUSTC=/usr/bin/rustc).
#   - the aarch64 cross gcc/g++/binutils and cross libc (linker, cc crate, llama.cpp cross build)
#   - qemu-user-static (runner; used WITHOUT -L: with -L every test binary hangs at its first
#     thread spawn, the cross ld.so meets the multiarch libc)
#   - runtime libraries for emulated programs, always the multiarch :arm64 packages:
#     libgomp1 (llama.cpp's ggml-cpu uses OpenMP), libvulkan1 + mesa-vulkan-drivers (lavapipe, so
#     the Vulkan tests run under qemu too instead of being skipped)
# Run as root (CI) or with sudo. Does nothing when everything is present (about 1 s).
set -euo pipefail

log() { echo "[cross-setup] $*" >&2; }
SUDO=; [ "$(id -u)" = 0 ] || SUDO=sudo

installed() { # pkg[:arch] -> 0 when dpkg says "install ok installed"
  [ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null)" = "install ok installed" ]
}

if ! dpkg --print-foreign-architectures | grep -qx arm64; then
  log "dpkg --add-architecture arm64"
  $SUDO dpkg --add-architecture arm64
  rm -f /tmp/.ork-cross-apt-updated
fi

# Host-side pieces (amd64) and the arm64 std. rustc-web and libstd-rust-web-dev:arm64 must be
# the same exact version: they are installed in one apt-get call, unpinned (the security suite
# keeps only the newest).
pkgs=()
for p in rustc-web cargo-web libstd-rust-web-dev:arm64 \
         gcc-aarch64-linux-gnu g++-aarch64-linux-gnu libc6-dev-arm64-cross binutils-aarch64-linux-gnu \
         qemu-user-static file libclang-dev cmake ccache \
         libgomp1:arm64 libvulkan1:arm64 mesa-vulkan-drivers:arm64; do
  installed "$p" || pkgs+=("$p")
done
# The arm64 lavapipe must match the amd64 Mesa already on the machine (Multi-Arch: same);
# installing both in one call lets apt upgrade them together when needed.
if [ ${#pkgs[@]} -gt 0 ]; then
  case " ${pkgs[*]} " in *" mesa-vulkan-drivers:arm64 "*) pkgs+=(mesa-vulkan-drivers) ;; esac
  log "apt-get install ${pkgs[*]}"
  $SUDO apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >&2
fi

# The arm64 Mesa drops *.aarch64.json ICD manifests into /usr/share/vulkan/icd.d, where the
# x86-64 Vulkan loader finds them too and prints "Failed loading library ... Ignoring this JSON"
# on every instance it creates. Divert them (dpkg-divert: survives upgrades) to a folder of their
# own; the cross test run points the emulated loader at it with VK_DRIVER_FILES.
ICD_DIR=/usr/share/ork-cross/vulkan-icd
$SUDO mkdir -p "$ICD_DIR"
for f in /usr/share/vulkan/icd.d/*.aarch64.json; do
  [ -e "$f" ] || continue
  $SUDO dpkg-divert --quiet --local --rename --divert "$ICD_DIR/$(basename "$f")" --add "$f"
done
[ -f "$ICD_DIR/lvp_icd.aarch64.json" ] || { log "no arm64 lavapipe manifest in $ICD_DIR"; exit 1; }

# Sanity: the Debian rustc has an aarch64 std of its own version.
v=$(/usr/bin/rustc --version | awk '{print $2}')
ls /usr/lib/rustlib/aarch64-unknown-linux-gnu/lib/libstd-*.rlib >/dev/null 2>&1 \
  || { log "no aarch64 std under /usr/lib/rustlib for rustc $v"; exit 1; }
log "ready: /usr/bin/rustc $v, $(aarch64-linux-gnu-gcc -dumpversion) cross gcc, $(qemu-aarch64-static --version | head -1)"
