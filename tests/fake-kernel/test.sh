#!/usr/bin/env bash
# The fake-kernel step of the test command (tests/run-all.sh): builds the plugin, ork-selftest,
# examples/rocket_place, the fake kernel and its shim, runs the kernel model's own tests, then
# tests/fake-kernel/test.py (docs/fake-kernel.md).
source "$(dirname "$0")/../common.sh"
cd "$ROOT"
build_plugin
cargo build --release --quiet --bin ork-selftest --example rocket_place -p ggml-ork
cargo build --release --quiet -p ork-fake-kernel
# The kernel model's own tests: the cache views, rocket's per-fd windows and PRIME sharing.
if ! out=$(cargo test --release --quiet -p ork-fake-kernel 2>&1); then
  echo "$out" | tail -30; echo "FAIL fake-kernel/model-tests: cargo test -p ork-fake-kernel"; exit 1
fi
echo "PASS fake-kernel/model-tests: $(echo "$out" | grep -E "^test result" | tail -1)"
"${CC:-cc}" -O2 -Wall -Werror -shared -fPIC -o target/release/libork_fake_kernel_shim.so fake-kernel/src/shim.c -ldl -lpthread
python3 "$ROOT/tests/fake-kernel/test.py"
