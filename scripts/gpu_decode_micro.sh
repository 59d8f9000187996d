#!/usr/bin/env bash
# Runs on the GPU machine, needing nothing carried (nvcc and NVRTC only, no ExecuTorch): the
# persistent decode kernel's micro-benchmark (benchmarks/micro/decode_layers_persistent.cu), which
# checks every variant against plain kernels before timing it.
#   0. benchmarks/micro/stage_dot.cu (seconds): what binds the kernel's products on staged rows,
#      shared-memory reads, issue or latency, and what an mma.sync GEMV would change (item 18);
#   1. the engine's defaults (the hand-off variants crossing counted_rows, a_tasks, l2_prefetch,
#      b_inflight, warp_rotary and warp_norm; the copies-in-flight caps; kv_rows 64 / 128 / by
#      position at 512-1024; the weight stream alone with and without L2 prefetches; the trace);
#   2. with time left, again with the options in $KILN_MICRO_ARGS as the base (default: every
#      eleventh-session option on), for its trace: where a layer's time goes with them.
# A call has at most 600 s; the whole script stops itself at $KILN_MICRO_BUDGET seconds (default
# 280) so that a short device allowance still brings its logs back.
# Usage: KILN_COMMIT=<sha> bash scripts/gpu_decode_micro.sh   (writes $OUT/decode_micro_*.txt, else out/gpu)
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-out/gpu}
budget=${KILN_MICRO_BUDGET:-280}
# tasks cap release kv_rows trace_pos counted_rows l2_prefetch warp_rotary warp_norm b_inflight
args=${KILN_MICRO_ARGS:-8 2 1 64 512 1 16 1 1 0}
mkdir -p "$out"
SECONDS=0
# The GPU machine's copy of the tree may have no .git: KILN_COMMIT names the commit for the logs.
commit=${KILN_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || cat .gpu_carry/COMMIT 2>/dev/null || echo unknown)}
gpu=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | head -1)
echo "commit $commit; $gpu"
: >/tmp/kiln_micro_build.txt
build() {  # nvcc arguments; a failure stops the call with the log
  nvcc -O3 -arch=sm_90 -std=c++17 "$@" >>/tmp/kiln_micro_build.txt 2>&1 ||
    { tail -30 /tmp/kiln_micro_build.txt; cp /tmp/kiln_micro_build.txt "$out/"; exit 1; }
}
build -Isrc -o /tmp/kiln_dlp benchmarks/micro/decode_layers_persistent.cu src/ops/decode_layers_kernel.cpp -lnvrtc
build -o /tmp/kiln_sd benchmarks/micro/stage_dot.cu
echo "built in ${SECONDS}s"
{ echo "== stage_dot  (commit $commit; $gpu)"; timeout 60 /tmp/kiln_sd 2>&1; echo "exit $? after ${SECONDS}s"; } >/tmp/stage_dot.txt
cp /tmp/stage_dot.txt "$out/"
grep -E "check|numerics|exit|cycles" /tmp/stage_dot.txt | head -24
run() {  # name, seconds, arguments...
  local name=$1 limit=$2
  shift 2
  { echo "== decode_layers_persistent $*  (commit $commit; $gpu)"
    timeout "$limit" /tmp/kiln_dlp "$@" 2>&1
    echo "exit $? after ${SECONDS}s"; } >"/tmp/$name.txt"
  cp "/tmp/$name.txt" "$out/"
  grep -E "numerics|WRONG|round 0|cannot|exit" "/tmp/$name.txt" | cut -c1-220
}
run decode_micro_defaults $((budget - SECONDS - 20))
left=$((budget - SECONDS - 10))
if [ "$left" -gt 60 ]; then
  # shellcheck disable=SC2086  # the arguments are words
  run decode_micro_options "$left" $args
else
  echo "no time left for the second run (${left}s)"
fi
