#!/usr/bin/env bash
# One GPU-machine call for the correctness suites, sharing one build (build-gpu):
#   1. scripts/gpu_check.sh          build, GPU ctest, conformance + carried models,
#                                    runtime features, the installed consumer app
#   2. scripts/gpu_reliability.sh    damaged-file campaign (ok/refused/wrong/crash/hang)
#   3. scripts/gpu_reliability_tests.sh  bad inputs, threads, streams, cycles, OOM,
#                                    SM mismatch, compute-sanitizer
# Each part runs when its carried folder is there (see each script); logs go to $OUT.
# KILN_CAMPAIGN_COPIES sets the campaign's copies per file (default 25).
# Exit 1 when any part failed.
set -uo pipefail
cd "$(dirname "$0")/.."
bundle=${KILN_GPU_BUNDLE:-.gpu_carry}
status=0
part() { echo; echo "===== $1 ($(date +%T))"; }
if [ -d "$bundle/models" ] || [ -d "$bundle/conformance" ]; then
  part "gpu_check"
  bash scripts/gpu_check.sh --trials 1 || status=1
fi
if [ -d "$bundle/reliability" ]; then
  part "gpu_reliability (campaign)"
  bash scripts/gpu_reliability.sh --copies "${KILN_CAMPAIGN_COPIES:-25}" || status=1
fi
if [ -d "$bundle/reliability_tests" ]; then
  part "gpu_reliability_tests"
  KILN_BUILD_DIR=build-gpu bash scripts/gpu_reliability_tests.sh || status=1
fi
part "done: exit $status"
exit $status
