#!/usr/bin/env bash
# Idempotent set-up of the Vulkan pieces the `vk` module's tests and bench need on a Debian 12
# (bookworm) host with no GPU: lavapipe (Mesa's CPU Vulkan driver, device "llvmpipe"), the
# Vulkan loader, headers, glslc (to check the committed SPIR-V) and vulkaninfo.
# Run as root (CI) or with sudo. Does nothing when everything is already present.
set -euo pipefail

log() { echo "[setup-vulkan] $*" >&2; }

pkgs=()
ls /usr/share/vulkan/icd.d/lvp_icd*.json >/dev/null 2>&1 || pkgs+=(mesa-vulkan-drivers)
# grep without -q reads to the end: with pipefail, -q's early exit could SIGPIPE the producer and
# make a present library look absent (a spurious apt-get update + install).
ldconfig -p | grep 'libvulkan\.so\.1' >/dev/null || pkgs+=(libvulkan1)
[ -e /usr/include/vulkan/vulkan.h ] || pkgs+=(libvulkan-dev)
command -v glslc >/dev/null || pkgs+=(glslc)
command -v vulkaninfo >/dev/null || pkgs+=(vulkan-tools)

if [ ${#pkgs[@]} -gt 0 ]; then
  log "apt-get install ${pkgs[*]}"
  SUDO=; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >&2
fi

# Sanity: the loader must see a device (lavapipe prints "llvmpipe").
if vulkaninfo --summary 2>/dev/null | grep 'deviceName' >/dev/null; then
  log "$(vulkaninfo --summary 2>/dev/null | grep deviceName | sed 's/^ *//' | tr '\n' ' ')"
else
  log "vulkaninfo sees no device"; exit 1
fi
