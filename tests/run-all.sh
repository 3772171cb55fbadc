#!/usr/bin/env bash
# The test command: set-up (idempotent), the crate's tests (unit, simulator, bit-exact, ABI
# drift), the clippy gate, then end-to-end checks inside the pinned llama.cpp tools.
source "$(dirname "$0")/common.sh"
cd "$ROOT"
# The orkpack cache never leaves less than 1 GiB free, so its tests need more than that where
# they write (the temporary directory); say so up front rather than through a failed store.
tmp_free_mib=$(df -Pk "${TMPDIR:-/tmp}" | awk 'NR == 2 { print int($4 / 1024) }')
if [ "${tmp_free_mib:-0}" -lt 2048 ]; then
  echo "run-all: warning: ${tmp_free_mib} MiB free under ${TMPDIR:-/tmp}; the cache tests need about 2 GiB there (stores leave 1 GiB free)"
fi
echo "== cargo test"
export ORK_REQUIRE_GLSLC=1   # committed SPIR-V must match shaders/ (glslc comes with set-up)
cargo test --quiet --no-fail-fast 2>&1 | tee "$ORK_ENV/cargo-test.log" | grep -E "^(test result|running|error|failures:|---- )" || true
if grep -qE "^test result: FAILED|^error" "$ORK_ENV/cargo-test.log"; then
  grep -E -A2 "panicked|FAILED|^error" "$ORK_ENV/cargo-test.log" | head -60
  echo "cargo test failed"; exit 1
fi
# Lints as errors, every unsafe block with its SAFETY comment, every pub unsafe fn with its
# `# Safety` section (clippy comes with set-up).
echo "== cargo clippy"
if ! cargo clippy --workspace --all-targets --quiet -- -D warnings -W clippy::undocumented_unsafe_blocks -W clippy::missing_safety_doc \
     >"$ORK_ENV/cargo-clippy.log" 2>&1; then
  grep -E "^(error|warning)|^ *--> " "$ORK_ENV/cargo-clippy.log" | head -60
  echo "cargo clippy failed (log: $ORK_ENV/cargo-clippy.log)"; exit 1
fi
echo "== build libggml-ork.so (release)"
build_plugin
echo "== calibration of the test models (once per set-up)"
calibrate_models smollm2-135m-Q8_0 smollm2-135m-Q4_K_M smollm2-135m-Q4_0 smollm2-135m-F16 gemma3-270m-Q8_0 gemma3-270m-Q4_K_M
# The remaining steps all run; the script fails at the end if any of them failed.
failed=()
echo "== end-to-end (llama.cpp b11549 + ORK on the simulator)"
python3 "$ROOT/tests/e2e.py" || failed+=(e2e)
echo "== serving: llama-server --parallel 4, two processes, ggml-rpc-server, MUL_MAT_ID (~5 min)"
python3 "$ROOT/tests/e2e_serving.py" || failed+=(serving)
echo "== speculative decoding and --parallel 4 with one engine (ORK_MINM=1 ORK_DECODE=npu): n-gram and draft-model text = plain text in llama-server and llama-cli"
python3 "$ROOT/tests/e2e_spec.py" || failed+=(spec)
echo "== fake kernel: the rknpu and rocket interfaces through their ioctls, against the simulator (~4 min)"
bash "$ROOT/tests/fake-kernel/test.sh" || failed+=(fake-kernel)
echo "== one libggml-ork.so in llama.cpp b11549, b10809 and b10566, in a ggml outside the verified releases, and in b10809's llama-server started as Ollama starts it (~5 min)"
python3 "$ROOT/tests/e2e_releases.py" || failed+=(releases)
echo "== the same libggml-ork.so in the ggml of 11 prebuilt releases b10603..b11739 (PyPI wheels, MUL_MAT graphs vs each release's CPU; ~1 min cold)"
python3 "$ROOT/tests/e2e_wheels.py" || failed+=(wheels)

# ---- the product's own target: aarch64 cross build + the crate's tests under qemu ----------
# (separate step; ~2 min warm, ~6-8 min cold incl. apt set-up; ORK_CROSS=0 skips it locally)
if [ "${ORK_CROSS:-1}" = 0 ]; then
  echo "== aarch64 under qemu: SKIPPED (ORK_CROSS=0)"
else
  echo "== aarch64: cross build + cargo test under qemu-aarch64 (tests/cross/test.sh)"
  bash "$ROOT/tests/cross/test.sh" || failed+=(aarch64)
fi
if [ ${#failed[@]} -gt 0 ]; then
  echo "FAILED steps: ${failed[*]}"
  exit 1
fi
echo "all steps passed"
