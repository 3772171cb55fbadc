#!/usr/bin/env bash
# The on-board kit: one command on an RK3588 / RK3576 board that checks the machine, proves the NPU
# bit-exact, captures golden regcmd streams, benchmarks the llama-bench arms on the big cores,
# compares with rkllm when present, and writes ONE report file to share.
#
#   bash bench-scripts/onboard-kit.sh [--dry-run] [--model M.gguf] [--rkllm M.rkllm]
#                                     [--rkllm-demo PATH] [--threads 4] [--out FILE] [--skip-bench]
#
# Steps (each reported as RAN / WARN / FAIL / SKIPPED with the reason):
#   1 board      SoC from the device tree (rk3588 / rk3576); none → automatic dry run
#   2 driver     /sys/module/rknpu/version (vendor) or the rocket module; /dev/dri/card* and
#                /dev/accel/* driver names via sysfs and ork-selftest (no dmesg needed); the NPU clock
#                (devfreq), repeated next to every NPU figure on rocket boards (200 MHz by default)
#   3 perms      the NPU / GPU device nodes are readable and writable by this user
#   4 ddr        /sys/class/devfreq/*dmc*: governor, cur/max frequency — WARN when memory is not at
#                its top frequency (the most common reason for half the published speed)
#   5 cpus       big-core topology (cpuinfo_max_freq), cpufreq governors → taskset for -t 4
#   6 build      cargo build --release (plugin + ork-selftest + ork-regdump)
#   7 selftest   ork-selftest: the NPU core's bit-exact suite on the real device
#   8 regdump    ork-regdump --synth M K N for a few shapes (golden regcmd streams)
#   9 bench      llama-bench arms (CPU / ORK / all-NPU / GPU decode), -t 4 on the big cores
#  10 rkllm      rkllm's demo on a .rkllm model when the model and librkllmrt.so are present
#  11 cache      .orkpack cold vs warm weight preparation (bench-scripts/orkpack_warm.sh) on the
#                board's NPU, -t 4 on the big cores: the speed-up and its upload bound
#  12 host       bench-scripts/host_bench.sh on the big cores: the NEON quantizers/dequantizers vs
#                memcpy and ggml-cpu, packing per core and its scaling, ORK's per-token host time
#                in decode with the real NPU (the ratios this workplace can only proxy)
#  13 e2e        the CI's fake-kernel checks against the real device node, no preload
#                (tests/fake-kernel/test.py --device real): greedy 16 tokens, perplexity 2 x 128,
#                test-backend-ops -b ORK -o MUL_MAT, ORK_NPU=<this board's driver> vs ORK_NPU=sim
#                on this board, the exit line requiring a live NPU; one board/<check> line per
#                CI fake-kernel/<check> line, the NPU clock on each on rocket
#
# --dry-run (automatic without a board) runs every step that can run here — the checks read what
# exists, the build, the regcmd capture, the arms on the simulator with short settings — and says
# which it skipped and why. Simulated results are labelled so in the report.
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}

DRY=0 MODEL="" RKLLM_MODEL=${RKLLM_MODEL:-} RKLLM_DEMO=${RKLLM_DEMO:-} THREADS=4 OUTFILE="" SKIP_BENCH=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --dry-run) DRY=1 ;;
    --model) MODEL=$2; shift ;;
    --rkllm) RKLLM_MODEL=$2; shift ;;
    --rkllm-demo) RKLLM_DEMO=$2; shift ;;
    --threads) THREADS=$2; shift ;;
    --out) OUTFILE=$2; shift ;;
    --skip-bench) SKIP_BENCH=1 ;;
    -h|--help) sed -n '2,36p' "$0"; exit 0 ;;
    *) echo "onboard-kit: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done

STAMP=$(date -u +%Y%m%dT%H%MZ)
OUTFILE=${OUTFILE:-$PWD/ork-onboard-report-$(hostname)-$STAMP.md}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/ork-kit.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
REPORT=$WORK/report.md
SUMMARY=()

say() { echo "$*" | tee -a "$REPORT"; }
raw() { tee -a "$REPORT"; }
block() { echo '```' >>"$REPORT"; cat | tee -a "$REPORT"; echo '```' >>"$REPORT"; }
# The NPU clock, read again for every figure: mainline (rocket) boards default to 200 MHz with no
# devfreq governor, so a rocket figure means nothing without it (peer-facts §2).
npu_clock() {
  local d f
  d=$(ls -d /sys/class/devfreq/*npu* 2>/dev/null | head -1)
  if [[ -n $d && -r $d/cur_freq ]]; then f=$(cat "$d/cur_freq"); echo "NPU clock $((f / 1000000)) MHz ($d)"
  else echo "NPU clock unknown (no /sys/class/devfreq/*npu*)"; fi
}
status() { # step verdict text
  local text=$3
  # Steps that measure the NPU carry the clock it ran at, on rocket boards.
  if [[ ${ROCKET:-0} == 1 && $1 =~ ^(selftest|bench|cache|host|e2e)$ ]]; then text="$text [$(npu_clock)]"; fi
  SUMMARY+=("| $1 | $2 | $text |")
  say "**$1: $2** — $text"
  say ""
}

say "# ggml-ork on-board report"
say ""
say "- date: $STAMP, host: $(hostname), kernel: $(uname -r), arch: $(uname -m)"
say "- ggml-ork: $(git -C "$ROOT" describe --always --dirty 2>/dev/null || echo unknown)"
say ""

# ------------------------------------------------------------------ 1 board
say "## 1. board"
COMPAT=$(tr '\0' ' ' </proc/device-tree/compatible 2>/dev/null || true)
MODELNAME=$(tr -d '\0' </proc/device-tree/model 2>/dev/null || true)
SOC=""
case "$COMPAT" in
  *rockchip,rk3588*) SOC=rk3588 ;;
  *rockchip,rk3576*) SOC=rk3576 ;;
esac
if [[ -n "$SOC" ]]; then
  status "board" RAN "$SOC (${MODELNAME:-no model string}); compatible: $COMPAT"
else
  status "board" "SKIPPED" "no RK3588/RK3576 in /proc/device-tree/compatible (${COMPAT:-absent}) → dry run"
  DRY=1
fi
if [[ $DRY == 1 ]]; then
  say "> **DRY RUN**: no board here. Every step that can run here runs; the rest say SKIPPED. Anything"
  say "> measured below used the bit-exact NPU *simulator* (ORK_NPU=sim) and lavapipe — not board numbers."
  say ""
fi

# ------------------------------------------------------------------ 2 driver
say "## 2. kernel driver"
DRV=""
if [[ -r /sys/module/rknpu/version ]]; then
  DRV="rknpu $(cat /sys/module/rknpu/version)"
elif [[ -d /sys/module/rknpu ]]; then
  DRV="rknpu (no version file)"
fi
ROCKET=0
if [[ -d /sys/module/rocket ]]; then DRV="${DRV:+$DRV; }rocket (mainline accel)"; ROCKET=1; fi
# The ORK_NPU value of this board's driver (step 13); rknpu when both modules are loaded.
NPU_KIND=""
if [[ -d /sys/module/rknpu ]]; then NPU_KIND=rknpu; elif [[ $ROCKET == 1 ]]; then NPU_KIND=rocket; fi
if [[ -n "$DRV" ]]; then say "- $(npu_clock)"; fi
{
  for n in /dev/dri/card* /dev/accel/accel*; do
    [[ -e $n ]] || continue
    d=$(basename "$(readlink -f "/sys/class/$( [[ $n == /dev/dri/* ]] && echo drm || echo accel)/$(basename "$n")/device/driver" 2>/dev/null)" 2>/dev/null)
    echo "$n driver=${d:-?}"
  done
} >"$WORK/nodes.txt"
[[ -s $WORK/nodes.txt ]] && block <"$WORK/nodes.txt"
if [[ -n "$DRV" ]]; then
  status "driver" RAN "$DRV"
elif [[ $DRY == 1 ]]; then
  status "driver" SKIPPED "no rknpu/rocket module here (not a board)"
else
  status "driver" FAIL "neither /sys/module/rknpu nor /sys/module/rocket: load the vendor rknpu driver (0.9.x) or rocket"
fi

# ------------------------------------------------------------------ 3 perms
say "## 3. device node permissions"
NODES=$(ls /dev/dri/card* /dev/dri/renderD* /dev/accel/accel* 2>/dev/null || true)
if [[ -z "$NODES" ]]; then
  status "perms" SKIPPED "no /dev/dri or /dev/accel nodes here"
else
  bad=()
  for n in $NODES; do
    ls -l "$n" >>"$WORK/perms.txt"
    [[ -r $n && -w $n ]] || bad+=("$n")
  done
  block <"$WORK/perms.txt"
  if [[ ${#bad[@]} -eq 0 ]]; then
    status "perms" RAN "all nodes read/write for $(id -un) (groups: $(id -Gn))"
  else
    status "perms" WARN "not read/write for $(id -un): ${bad[*]} — add the user to the owning group (render/video) or adjust udev rules"
  fi
fi

# ------------------------------------------------------------------ 4 ddr
say "## 4. DDR frequency"
DMC=$(ls -d /sys/class/devfreq/*dmc* 2>/dev/null | head -1)
if [[ -z "$DMC" ]]; then
  status "ddr" SKIPPED "no /sys/class/devfreq/*dmc* here"
else
  gov=$(cat "$DMC/governor" 2>/dev/null) cur=$(cat "$DMC/cur_freq" 2>/dev/null) max=$(cat "$DMC/max_freq" 2>/dev/null)
  avail=$(cat "$DMC/available_frequencies" 2>/dev/null)
  top=$(tr ' ' '\n' <<<"$avail" | sort -n | tail -1)
  say "- $DMC: governor=$gov cur_freq=$cur max_freq=$max available=[$avail]"
  if [[ -n "$cur" && -n "$top" && "$cur" -lt "$top" ]] || [[ -n "$cur" && -n "$max" && "$cur" -lt "$max" ]]; then
    status "ddr" WARN "memory at $((cur / 1000000)) MHz, top is $(( ${top:-$max} / 1000000 )) MHz (governor $gov): results will be low — run \`echo performance | sudo tee $DMC/governor\` and rerun"
  else
    status "ddr" RAN "memory at its top frequency ($((cur / 1000000)) MHz, governor $gov)"
  fi
fi

# ------------------------------------------------------------------ 5 cpus
say "## 5. CPU topology"
declare -A FREQ
for c in /sys/devices/system/cpu/cpu[0-9]*; do
  f=$(cat "$c/cpufreq/cpuinfo_max_freq" 2>/dev/null || echo 0)
  FREQ[${c##*cpu}]=$f
done
TOPF=$(printf '%s\n' "${FREQ[@]}" | sort -n | tail -1)
BIG=$(for k in "${!FREQ[@]}"; do [[ ${FREQ[$k]} == "$TOPF" ]] && echo "$k"; done | sort -n | head -"$THREADS" | paste -sd, -)
say "- CPUs: $(for k in $(printf '%s\n' "${!FREQ[@]}" | sort -n); do printf 'cpu%s=%sMHz ' "$k" $(( ${FREQ[$k]} / 1000 )); done)"
say "- cpufreq governors: $(cat /sys/devices/system/cpu/cpufreq/policy*/scaling_governor 2>/dev/null | sort | uniq -c | tr -s ' \n' ' ' || echo unknown)"
TASKSET=""
if command -v taskset >/dev/null && [[ -n "$BIG" && "$TOPF" != 0 ]]; then TASKSET="taskset -c $BIG"; fi
if [[ "$TOPF" == 0 && $DRY == 1 ]]; then
  status "cpus" SKIPPED "no cpufreq information here; llama-bench runs unpinned"
elif [[ "$TOPF" == 0 ]]; then
  status "cpus" WARN "no cpufreq information; llama.cpp threads are not pinned"
else
  status "cpus" RAN "big cores (top max freq $((TOPF / 1000)) MHz): $BIG → llama-bench runs under \`$TASKSET\` with -t $THREADS"
fi

# ------------------------------------------------------------------ 6 build
say "## 6. build"
if (cd "$ROOT" && cargo build --release --quiet --lib --bin ork-selftest --bin ork-regdump) >"$WORK/build.log" 2>&1; then
  # copy + rename (new inode): never rewrite a .so that a running process has mapped
  cp -f "$CARGO_TARGET_DIR/release/libggml_ork.so" "$CARGO_TARGET_DIR/release/.libggml-ork.so.new"
  mv -f "$CARGO_TARGET_DIR/release/.libggml-ork.so.new" "$CARGO_TARGET_DIR/release/libggml-ork.so"
  export ORK_LIB=$CARGO_TARGET_DIR/release/libggml-ork.so
  status "build" RAN "cargo build --release ($(rustc --version 2>/dev/null))"
  BUILT=1
else
  tail -20 "$WORK/build.log" | block
  status "build" FAIL "cargo build --release failed (log above)"
  BUILT=0
fi

# ------------------------------------------------------------------ 7 selftest
say "## 7. NPU self-test (bit-exact, real device)"
if [[ $BUILT == 1 ]]; then
  ORK_LOG=warn "$CARGO_TARGET_DIR/release/ork-selftest" >"$WORK/selftest.txt" 2>&1
  rc=$?
  block <"$WORK/selftest.txt"
  case $rc in
    0) status "selftest" RAN "all bit-exact checks passed on the device" ;;
    2) if [[ $DRY == 1 ]]; then status "selftest" SKIPPED "no NPU device here (ork-selftest exit 2); the simulator runs the same suite in cargo test"
       else status "selftest" FAIL "ork-selftest found no NPU device (exit 2)"; fi ;;
    *) status "selftest" FAIL "ork-selftest exit $rc (see above)" ;;
  esac
else
  status "selftest" SKIPPED "build failed"
fi

# ------------------------------------------------------------------ 8 regdump
say "## 8. golden regcmd streams (ork-regdump --synth)"
if [[ $BUILT == 1 ]]; then
  ok=0 n=0
  for shape in "4 32 32" "1 2048 2048" "64 576 1536" "130 3072 256"; do
    n=$((n + 1))
    set -- $shape
    f=$WORK/regdump-${1}x${2}x${3}.txt
    if "$CARGO_TARGET_DIR/release/ork-regdump" --synth "$@" --soc "${SOC:-rk3588}" >"$f" 2>&1; then
      ok=$((ok + 1))
      say "<details><summary>M=$1 K=$2 N=$3 (${SOC:-rk3588}): $(wc -l <"$f") lines, sha256 $(sha256sum "$f" | cut -c1-16)</summary>"
      say ""
      block <"$f" >/dev/null
      say "</details>"
      say ""
    else
      say "- M=$1 K=$2 N=$3: $(head -1 "$f")"
    fi
  done
  status "regdump" "$([[ $ok == "$n" ]] && echo RAN || echo FAIL)" "$ok of $n streams synthesised for ${SOC:-rk3588} (compare on the board with captured submits)"
else
  status "regdump" SKIPPED "build failed"
fi

# ------------------------------------------------------------------ 9 bench
say "## 9. llama-bench arms"
if [[ $SKIP_BENCH == 1 ]]; then
  status "bench" SKIPPED "--skip-bench"
elif [[ $BUILT != 1 ]]; then
  status "bench" SKIPPED "build failed"
else
  if [[ -z "${LLAMA_BIN:-}" ]]; then
    eval "$(bash "$ROOT/tests/setup-env.sh" --print-env 2>"$WORK/setup.log")" || true
  fi
  MODEL=${MODEL:-${ORK_MODELS:+$ORK_MODELS/smollm2-135m-Q8_0.gguf}}
  if [[ -z "${LLAMA_BIN:-}" || ! -x "$LLAMA_BIN/llama-bench" || ! -f "$MODEL" ]]; then
    status "bench" SKIPPED "no llama-bench or model (LLAMA_BIN=${LLAMA_BIN:-unset}, model=${MODEL:-unset})"
  else
    export LLAMA_BIN BENCH_MODEL=$MODEL BENCH_OUT=$WORK/bench BENCH_TASKSET="$TASKSET" ORK_CORPUS=${ORK_CORPUS:-}
    if [[ $DRY == 1 ]]; then
      # Short settings: the simulator is slow. Labelled "simulated" in the table.
      export BENCH_BOARD=0 BENCH_THREADS=2 BENCH_P=32 BENCH_N=8 BENCH_R=1 BENCH_ROUNDS=1 BENCH_NO_PPL=1
    else
      export BENCH_BOARD=1 BENCH_THREADS=$THREADS BENCH_P=${BENCH_P:-256} BENCH_N=${BENCH_N:-64} BENCH_R=${BENCH_R:-3} BENCH_ROUNDS=${BENCH_ROUNDS:-1}
    fi
    if BENCH_PYTHON_CHART=${BENCH_PYTHON_CHART:-python3} python3 "$ROOT/bench-scripts/e2e_bench.py" >"$WORK/bench.txt" 2>"$WORK/bench.err"; then
      grep -v '^chart:' "$WORK/bench.txt" | raw >/dev/null
      status "bench" RAN "$( [[ $DRY == 1 ]] && echo "SIMULATED NPU + lavapipe, short settings (-p 32 -n 8 -t 2)" || echo "-t $BENCH_THREADS under $TASKSET, -p $BENCH_P -n $BENCH_N -r $BENCH_R")"
    else
      tail -20 "$WORK/bench.err" | block
      status "bench" FAIL "e2e_bench.py failed (log above)"
    fi
    # The host's team kept awake through an NPU matmul (ORK_KEEP_AWAKE, default 1) against
    # asleep, and ggml-cpu's OpenMP team (the default) against a pool of ORK's own
    # (ORK_HOST_THREADS), paired, on this board's NPU and cores: the defaults were set on the
    # simulator.
    if [[ $DRY != 1 && -n "$NPU_KIND" ]]; then
      BENCH_NPU=$NPU_KIND T=$THREADS P=128 PAIRS=3 ARMS="awake: asleep:ORK_KEEP_AWAKE=0 ownpool:ORK_HOST_THREADS=$THREADS" \
        bash "$ROOT/bench-scripts/paired_prefill.sh" "$MODEL" 2>"$WORK/keep-awake.err" | grep -v '^\[setup' | block
    fi
  fi
fi

# ------------------------------------------------------------------ 10 rkllm
say "## 10. rkllm comparison"
RKLIB=$(ldconfig -p 2>/dev/null | grep -o '/[^ ]*librkllmrt\.so' | head -1)
for d in /usr/lib /usr/local/lib /usr/lib/aarch64-linux-gnu; do [[ -z "$RKLIB" && -f $d/librkllmrt.so ]] && RKLIB=$d/librkllmrt.so; done
if [[ -z "$RKLLM_MODEL" || ! -f "$RKLLM_MODEL" ]]; then
  status "rkllm" SKIPPED "no .rkllm model (pass --rkllm MODEL.rkllm or set RKLLM_MODEL)"
elif [[ -z "$RKLIB" ]]; then
  status "rkllm" SKIPPED "librkllmrt.so not found (ldconfig, /usr/lib, /usr/local/lib)"
elif [[ -z "$RKLLM_DEMO" || ! -x "$RKLLM_DEMO" ]]; then
  status "rkllm" SKIPPED "no rkllm demo binary (pass --rkllm-demo PATH to rknn-llm's llm_demo)"
else
  # llm_demo MODEL max_new_tokens max_context; RKLLM_LOG_LEVEL=1 prints prefill/generate speed.
  printf 'The Industrial Revolution began in\nexit\n' | RKLLM_LOG_LEVEL=1 timeout 600 $TASKSET "$RKLLM_DEMO" "$RKLLM_MODEL" 64 512 >"$WORK/rkllm.txt" 2>&1
  grep -iE "prefill|generate|token.?s|tokens/s|memory" "$WORK/rkllm.txt" | tail -20 | block
  status "rkllm" RAN "$(basename "$RKLLM_MODEL") with $RKLIB — compare its prefill/generate tokens/s with the ORK rows of step 9 (same model family and size)"
fi

# Steps 11-12: benchmark scripts run with llama-completion on the model of step 9.
# bench_script NAME LOG KEEP WRITER -- ENV... -- SCRIPT ARGS...: skips with the reason when
# --skip-bench, a failed build or no llama-completion / model; else runs SCRIPT under ENV (and the
# big-core taskset on a board), writes the lines `KEEP report` keeps from its output into the
# report with WRITER (block: as a code block, raw: as markdown), and reports the step RAN with
# `KEEP verdict`, or FAIL with the log's tail.
bench_script() {
  local name=$1 log=$2 keep=$3 writer=$4; shift 5
  local envs=()
  while [[ $1 != -- ]]; do envs+=("$1"); shift; done
  shift
  if [[ $SKIP_BENCH == 1 ]]; then status "$name" SKIPPED "--skip-bench"; return; fi
  if [[ $BUILT != 1 ]]; then status "$name" SKIPPED "build failed"; return; fi
  if [[ -z "${LLAMA_BIN:-}" || ! -x "$LLAMA_BIN/llama-completion" || ! -f "${MODEL:-}" ]]; then
    status "$name" SKIPPED "no llama-completion or model (LLAMA_BIN=${LLAMA_BIN:-unset}, model=${MODEL:-unset})"
    return
  fi
  if env "${envs[@]}" LLAMA_BIN="$LLAMA_BIN" BENCH_MODEL="$MODEL" $TASKSET bash "$@" >"$log" 2>&1; then
    $keep report <"$log" | $writer >/dev/null
    status "$name" RAN "$($keep verdict <"$log")$( [[ $DRY == 1 ]] && echo " — SIMULATED NPU, this host's CPU" || echo " — under ${TASKSET:-no taskset}")"
  else
    tail -20 "$log" | block
    status "$name" FAIL "$(basename "$1") failed (log above)"
  fi
}

# ------------------------------------------------------------------ 11 cache
say "## 11. .orkpack cache: cold vs warm weight preparation"
cache_lines() {
  case $1 in
    report) grep -E '^(model|cold|warm|cache|generated|weight preparation|bound):?' ;;
    verdict) grep -o 'cold / median warm[^(]*([^)]*): [0-9.]*x' | tail -1 ;;
  esac
}
if [[ $DRY == 1 ]]; then
  CACHE_ENV=(ORKPACK_NPU=sim ORKPACK_THREADS=2 ORKPACK_SKIP_LOAD=1)
else
  CACHE_ENV=(ORKPACK_NPU=auto ORKPACK_THREADS="$THREADS" ORKPACK_SKIP_LOAD=1)
fi
bench_script cache "$WORK/cache.txt" cache_lines block -- "${CACHE_ENV[@]}" -- "$ROOT/bench-scripts/orkpack_warm.sh" "${MODEL:-}"

# ------------------------------------------------------------------ 12 host
say "## 12. host-side benchmarks (quantizers, packing, decode host time)"
host_lines() {
  case $1 in
    report) grep -E '^\||^## |^bench_host|^decode overhead|targets missed' ;;
    verdict) grep -Eo '[0-9]+ of [0-9]+ targets missed' | tail -1 ;;
  esac
}
if [[ $DRY == 1 ]]; then
  # Short settings; the decode figure comes from the simulator.
  HOST_ENV=(BENCH_NPU=sim BENCH_THREADS=2 ORK_BENCH_ROUNDS=9 REPEATS=1 DECODE_TOKENS=12)
else
  HOST_ENV=(BENCH_NPU=auto BENCH_THREADS="$THREADS" BENCH_TASKSET="$TASKSET" REPEATS=3 DECODE_TOKENS=40)
fi
bench_script host "$WORK/host.txt" host_lines raw -- "${HOST_ENV[@]}" -- "$ROOT/bench-scripts/host_bench.sh"

# ------------------------------------------------------------------ 13 e2e
say "## 13. end-to-end checks on the device node (the CI's fake-kernel checks)"
if [[ $BUILT != 1 ]]; then
  status "e2e" SKIPPED "build failed"
elif [[ $DRY == 1 || -z "$NPU_KIND" ]]; then
  status "e2e" SKIPPED "no rknpu/rocket driver here; CI runs the same checks under the fake kernel (bash tests/fake-kernel/test.sh)"
else
  if [[ -z "${LLAMA_BIN:-}" || -z "${ORK_MODELS:-}" || -z "${ORK_CORPUS:-}" ]]; then
    eval "$(bash "$ROOT/tests/setup-env.sh" --print-env 2>>"$WORK/setup.log")" || true
  fi
  E2E_MODEL=${MODEL:-${ORK_MODELS:+$ORK_MODELS/smollm2-135m-Q8_0.gguf}}
  if [[ -z "${LLAMA_BIN:-}" || ! -x "$LLAMA_BIN/llama-completion" || ! -x "$LLAMA_BIN/llama-perplexity" \
        || ! -x "$LLAMA_BIN/test-backend-ops" || ! -f "$E2E_MODEL" || ! -f "${ORK_CORPUS:-}" ]]; then
    status "e2e" SKIPPED "no llama-completion / llama-perplexity / test-backend-ops, model or corpus (LLAMA_BIN=${LLAMA_BIN:-unset}, model=${E2E_MODEL:-unset}, ORK_CORPUS=${ORK_CORPUS:-unset})"
  else
    LLAMA_BIN=$LLAMA_BIN ORK_MODELS=${ORK_MODELS:-$(dirname "$E2E_MODEL")} ORK_CORPUS=$ORK_CORPUS ORK_LIB=$ORK_LIB \
      python3 "$ROOT/tests/fake-kernel/test.py" --device real --npu "$NPU_KIND" --model "$E2E_MODEL" >"$WORK/e2e.txt" 2>&1
    rc=$?
    block <"$WORK/e2e.txt"
    tally=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$WORK/e2e.txt" | tail -1)
    if [[ $rc == 0 ]]; then
      status "e2e" RAN "ORK_NPU=$NPU_KIND on the device node vs ORK_NPU=sim: ${tally:-?} (compare each board/<check> line with CI's fake-kernel/<check>)"
    else
      status "e2e" FAIL "tests/fake-kernel/test.py --device real exit $rc: ${tally:-no tally} (lines above)"
    fi
  fi
fi

# ------------------------------------------------------------------ summary
{
  echo "## summary"
  echo
  echo "| step | verdict | detail |"
  echo "|---|---|---|"
  printf '%s\n' "${SUMMARY[@]}"
  echo
  [[ $DRY == 1 ]] && echo "Dry run: steps marked SKIPPED need a board; measured numbers come from the simulator."
} >"$WORK/summary.md"
cat "$WORK/summary.md"
{ cat "$WORK/summary.md"; echo; cat "$REPORT"; } >"$OUTFILE"
echo
echo "report: $OUTFILE"
