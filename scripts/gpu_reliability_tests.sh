#!/usr/bin/env bash
# Issue 13's GPU reliability tests, items 3-5: bad inputs through ExecuTorch's Module,
# 8 threads x 10,000 runs on shared engines, alternating caller streams with device-only
# I/O, 1,000 load/run/destroy cycles, an engine too large for the GPU, an sm_87-only
# engine, then compute-sanitizer (memcheck on the GPU ctest binaries, the runner and this
# test; racecheck on a subset).
#
#   bash scripts/gpu_reliability_tests.sh --prepare   # CPU machine: exports the .pte files
#        # into $KILN_GPU_BUNDLE/reliability_tests (~3.5 MB) and the ExecuTorch SDK if missing
#   bash scripts/gpu_reliability_tests.sh             # GPU machine: build + everything below
#
# Carry $KILN_GPU_BUNDLE/executorch_sdk and $KILN_GPU_BUNDLE/reliability_tests
# (.gpu_carry by default). Logs go to $OUT/reliability_tests (or out/reliability_tests).
# KILN_SANITIZER=0 skips compute-sanitizer; KILN_RELIABILITY_ARGS passes flags to
# kiln_reliability_test (e.g. "--runs=1000"). Exit 1 when any part failed.
set -uo pipefail
cd "$(dirname "$0")/.."
bundle=${KILN_GPU_BUNDLE:-.gpu_carry}
files=$bundle/reliability_tests
out=${OUT:-out}/reliability_tests
mkdir -p "$out"

if [ "${1:-}" = "--prepare" ]; then
  set -e
  python=${PYTHON:-python3}
  [ -d "$bundle/executorch_sdk" ] || bash scripts/make_executorch_sdk.sh "$bundle/executorch_sdk"
  rm -rf "$files"
  PYTHONPATH=python $python tests/gpu/export_reliability_tests.py --out "$files"
  git rev-parse --short HEAD >"$files/COMMIT"
  du -sh "$files"
  exit 0
fi

if [ ! -f "$files/tiny_mlp.pte" ]; then
  echo "no $files: run 'bash scripts/gpu_reliability_tests.sh --prepare' on the CPU machine" >&2
  exit 2
fi
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
echo "commit: $(cat "$files/COMMIT" 2>/dev/null) (files), $(git rev-parse --short HEAD 2>/dev/null) (sources)" | tee -a "$out/gpu.txt"

build=${KILN_BUILD_DIR:-build-gpu}
if [ -d "$bundle/executorch_sdk" ]; then
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_BUILD_PYTHON=OFF \
    -DCMAKE_PREFIX_PATH="$PWD/$bundle/executorch_sdk" >"$out/configure.log" 2>&1 &&
    cmake --build "$build" -j"$(nproc)" >"$out/build.log" 2>&1 ||
    { tail -40 "$out/configure.log" "$out/build.log"; exit 1; }
else
  build=build  # this machine's scripts/setup.sh build
fi
test_bin=$build/tests/cpp/kiln_reliability_test
runner=$build/tools/kiln_runner/kiln_runner
failed=0

# 1. The reliability test program (one line per check; SKIP without a GPU).
echo "== kiln_reliability_test"
# shellcheck disable=SC2086
"$test_bin" "$files" ${KILN_RELIABILITY_ARGS:-} 2>"$out/reliability_test.stderr" | tee "$out/reliability_test.log"
[ "${PIPESTATUS[0]}" = 0 ] || failed=1

# 2. The GPU ctest suite (also what scripts/gpu_check.sh runs).
echo "== ctest"
(cd "$build" && ctest --output-on-failure -j8) >"$out/ctest.log" 2>&1 || { failed=1; echo "FAIL  ctest (log: $out/ctest.log)"; }
tail -3 "$out/ctest.log"

# 3. compute-sanitizer. Works on the Firecracker H200 machines, refuses the device on
# gVisor ("Device not supported"): then every run below is reported as SKIP.
sanitizer=$(command -v compute-sanitizer || echo "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer")
if [ "${KILN_SANITIZER:-1}" = 0 ]; then
  echo "SKIP  compute-sanitizer (KILN_SANITIZER=0)"
elif [ ! -x "$sanitizer" ]; then
  echo "SKIP  compute-sanitizer: not found (looked on PATH and at $sanitizer)"
else
  # --report-api-errors no: the kernel loader probes cudaFuncGetParamInfo one index past
  # the last argument on purpose (src/runtime/README.md, Engine::load step 3).
  # The sm_87 engine is refused on purpose; the OOM check asks for more than the GPU has.
  san() {  # san TOOL NAME COMMAND...: one line PASS/FAIL/SKIP, full log in $out
    local tool=$1 name=$2; shift 2
    local log="$out/sanitizer_${tool}_${name}.log"
    "$sanitizer" --tool "$tool" --error-exitcode 86 --report-api-errors no \
      --target-processes all "$@" >"$log" 2>&1
    local rc=$?
    if grep -q "Device not supported\|not supported on this platform" "$log"; then
      echo "SKIP  $tool $name: compute-sanitizer does not support this machine (log: $log)"
    elif [ "$rc" = 0 ]; then
      echo "PASS  $tool $name: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | tail -1)"
    elif ! grep -qE 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" && "$@" >/dev/null 2>&1; then
      # No summary at all: the tool instrumented nothing (a CPU-only test binary
      # makes no CUDA call); the program itself passes without the tool.
      echo "N/A   $tool $name: nothing instrumented (exit $rc: $(grep -m1 -E '=========' "$log" | cut -c1-160))"
    else
      echo "FAIL  $tool $name (exit $rc): $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | tail -1) (log: $log)"
      failed=1
    fi
  }
  echo "== compute-sanitizer memcheck"
  # Every GPU ctest binary (the GPU-free ones run too; they are quick).
  for t in "$build"/tests/cpp/kiln_*_tests; do
    [ -x "$t" ] || continue
    san memcheck "$(basename "$t")" "$t"
  done
  # The runner on a sample model, host and device I/O, graphs off and on.
  san memcheck runner_tiny_mlp "$runner" --model_path="$files/tiny_mlp.pte" --num_runs=20
  san memcheck runner_tiny_mlp_graphs "$runner" --model_path="$files/tiny_mlp.pte" \
    --use_cuda_graphs=true --num_runs=20
  san memcheck runner_deep_mlp_device_io "$runner" --model_path="$files/deep_mlp_device_io.pte" \
    --device_io=true --num_runs=20
  # This test program with small counts (memcheck is ~10-100x slower).
  san memcheck reliability_test "$test_bin" "$files" --runs=50 --threads=4 --stream_runs=64 \
    --cycles=20 --only=bad_inputs,threads,streams,cycles,sm
  echo "== compute-sanitizer racecheck (shared-memory races in Kiln's generated kernels)"
  san racecheck runner_tiny_mlp "$runner" --model_path="$files/tiny_mlp.pte" --num_runs=5
  san racecheck runner_deep_mlp "$runner" --model_path="$files/deep_mlp.pte" --num_runs=5
  [ -x "$build/tests/cpp/kiln_runtime_conv_tests" ] &&
    san racecheck kiln_runtime_conv_tests "$build/tests/cpp/kiln_runtime_conv_tests"
  echo "== compute-sanitizer synccheck"
  san synccheck runner_deep_mlp "$runner" --model_path="$files/deep_mlp.pte" --num_runs=5
fi

if [ "$failed" = 0 ]; then echo "gpu_reliability_tests: all passed"; else echo "gpu_reliability_tests: FAILED (logs: $out)"; fi
exit "$failed"
