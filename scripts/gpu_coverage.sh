#!/usr/bin/env bash
# GPU machine: the coverage sweep's numerics (docs/coverage.md, fp32/fp16
# error columns). Builds kiln_runner against the carried ExecuTorch C++ SDK,
# then runs tools/coverage/gpu_coverage.py on the carried coverage groups.
# Prepare on the CPU machine (after the sweep kept its .pte files):
#   bash scripts/make_executorch_sdk.sh .gpu_carry/executorch_sdk
#   python3 tools/coverage/coverage_sweep.py --pack .gpu_carry/coverage --keep-pte out/coverage/pte
# One call per group (each <= 46 MiB + the 13 MiB SDK; 64 MiB a call):
#   bash scripts/gpu_coverage.sh .gpu_carry/coverage/cov_00
# Results: $OUT/coverage_gpu_cov_00.json (+ .log); copy them into
# docs/coverage_gpu/ and run coverage_sweep.py --report to merge.
set -uo pipefail
cd "$(dirname "$0")/.."
sdk=${KILN_EXECUTORCH_SDK:-.gpu_carry/executorch_sdk}
out=${OUT:-out/gpu}
mkdir -p "$out"
if [ ! -x build-gpu/tools/kiln_runner/kiln_runner ]; then
  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$PWD/$sdk" \
    -DKILN_BUILD_PYTHON=OFF -DKILN_BUILD_TESTS=OFF >"$out/coverage_configure.log" 2>&1 ||
    { tail -40 "$out/coverage_configure.log"; exit 1; }
  cmake --build build-gpu -j"$(nproc)" --target kiln_runner >"$out/coverage_build.log" 2>&1 ||
    { grep -E "error|Error" "$out/coverage_build.log" | head -40; exit 1; }
fi
echo "kiln_runner built"
PYTHONUNBUFFERED=1 python3 tools/coverage/gpu_coverage.py "$@" \
  --runner build-gpu/tools/kiln_runner/kiln_runner --out "$out"
