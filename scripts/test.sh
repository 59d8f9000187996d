#!/usr/bin/env bash
# The test suite: sets up if needed (scripts/setup.sh), then runs the C++ unit
# tests (ctest) and the Python tests (pytest). GPU tests are not here: they
# run on the GPU machine through scripts/gpu_check.sh and skip elsewhere.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
python=${PYTHON:-python3}
ctest_bin=$($python -c 'import cmake, os; print(os.path.join(cmake.CMAKE_BIN_DIR, "ctest"))')
status=0
"$ctest_bin" --test-dir build --output-on-failure -j2 || status=1
KILN_REQUIRE_COMPILER=1 $python -m pytest -ra || status=1
exit $status
