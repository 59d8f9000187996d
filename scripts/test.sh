#!/usr/bin/env bash
# The test suite: sets up if needed (scripts/setup.sh), then runs the C++ unit
# tests (ctest), the Python tests (pytest) and the CPU fuzz harness
# (scripts/fuzz.sh: ASan + UBSan, 20,000 damaged files and engines, about a
# minute with its build; KILN_SKIP_FUZZ=1 skips it) and the aarch64 check
# (scripts/cross_aarch64.sh: the run side cross-built for aarch64, its kiln_runner
# run under qemu; a few minutes on a clean cache, most of it the build;
# KILN_SKIP_CROSS=1 skips it). GPU tests are not here: they run on the GPU
# machine through scripts/gpu_check.sh and skip elsewhere.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
python=${PYTHON:-python3}
ctest_bin=$($python -c 'import cmake, os; print(os.path.join(cmake.CMAKE_BIN_DIR, "ctest"))')
status=0
"$ctest_bin" --test-dir build --output-on-failure -j2 || status=1
KILN_REQUIRE_COMPILER=1 $python -m pytest -ra || status=1
if [ "${KILN_SKIP_FUZZ:-0}" != 1 ]; then
  bash scripts/fuzz.sh || status=1
fi
if [ "${KILN_SKIP_CROSS:-0}" != 1 ]; then
  bash scripts/cross_aarch64.sh || status=1
fi
exit $status
