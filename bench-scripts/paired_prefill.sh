#!/usr/bin/env bash
# Paired prefill rates of several ORK arms, as users run llama.cpp: llama-bench -p $P -n 0 -t $T
# -r 1 with the timed NPU (ORK_NPU=sim ORK_SIM_TIMING=board: each submit completes at the hardware
# time modelled for an RK3588 core, src/npu/soc.rs; the host's work is this machine's), or on a
# board its NPU (BENCH_NPU=rknpu or rocket; BENCH_TASKSET puts llama-bench on the big cores). The arms
# of one pair run back to back, PAIRS pairs in all; each arm's rate is compared with the first
# arm's of the same pair, and the median of those ratios is printed with their range.
#
# OpenMP's wait policy is left as the environment has it: unset is llama.cpp's default (its
# threads spin for a while after each CPU split); OMP_WAIT_POLICY=passive in front of the command
# gives the tuned row.
#
# An arm is name:VAR=value,VAR=value (no spaces); LIB=/path/libggml-ork.so picks another plugin
# build (default: this tree's, built here). The first arm is the reference.
#
#   ARMS="awake: asleep:ORK_KEEP_AWAKE=0" PAIRS=3 bash bench-scripts/paired_prefill.sh MODEL.gguf
#   ARMS="before:LIB=/tmp/old/libggml-ork.so now:" UB="128 512" bash bench-scripts/paired_prefill.sh MODEL.gguf
source "$(dirname "$0")/lib.sh"
bench_env
bench_build_plugin >/dev/null
M=${1:-$BENCH_MODEL}
export ORK_LOCK_DIR=${ORK_LOCK_DIR:-$(mktemp -d)}
P=${P:-512} T=${T:-2} PAIRS=${PAIRS:-3}
read -r -a arms <<<"${ARMS:-awake: asleep:ORK_KEEP_AWAKE=0}"
NPU=${BENCH_NPU:-sim}
timing=$([ "$NPU" = sim ] && echo board || echo compute)
echo "# $(basename "$M"), llama-bench -p $P -n 0 -r 1 -t $T, ORK_NPU=$NPU$([ "$NPU" = sim ] && echo " ORK_SIM_TIMING=board"), OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-unset, the default of llama.cpp}, $PAIRS pairs; t/s per pair, arm / first arm"
rate() { grep -E " pp$P " | tail -1 | awk -F'|' '{print $(NF-1)}' | sed -E 's/ //g; s/±.*//'; }
run_arm() { # $1 = arm spec, $2 = ubatch
  local spec=${1#*:} lib=$ORK_LIB envs=()
  IFS=',' read -r -a kv <<<"$spec"
  for e in "${kv[@]}"; do
    [ -z "$e" ] && continue
    case $e in LIB=*) lib=${e#LIB=} ;; *) envs+=("$e") ;; esac
  done
  env GGML_BACKEND_PATH="$lib" ORK_NPU="$NPU" ORK_SIM_TIMING="$timing" "${envs[@]}" \
    ${BENCH_TASKSET:-} nice "$LLAMA_BIN/llama-bench" -m "$M" -p "$P" -ub "$2" -n 0 -t "$T" -r 1 2>&1 | rate
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", a / b }'; }
median() { tr ' ' '\n' | grep . | sort -n | awk '{ v[NR] = $1 } END { m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2; printf "median %.3f (%s .. %s)", m, v[1], v[NR] }'; }
for ub in ${UB:-$P}; do
  declare -A ratios=()
  for ((i = 1; i <= PAIRS; i++)); do
    line="ub $ub pair $i:"
    ref=""
    for a in "${arms[@]}"; do
      r=$(run_arm "$a" "$ub")
      n=${a%%:*}
      line+=" $n $r"
      if [ -z "$ref" ]; then
        ref=$r
      else
        ratios[$n]+="$(ratio "$r" "$ref") "
      fi
    done
    echo "$line"
  done
  for a in "${arms[@]:1}"; do
    n=${a%%:*}
    echo "ub $ub: $n / ${arms[0]%%:*}: $(echo "${ratios[$n]}" | median)"
  done
  unset ratios
done
