#!/usr/bin/env bash
# Runs on the GPU machine: issue 12's GPU work in ONE call, for sessions that may get only one
# machine start (each failed start costs 90-180 s of the session's 1800). Within
# $KILN_CALL_BUDGET seconds (default 585):
#   1. builds llm_generate, kiln_runner and kiln_state_test against the carried ExecuTorch SDK;
#   2. tests/gpu/llm_generate_test.py on $bundle/llm (every program prepare_llm_carry.sh made:
#      tokens and logits against HF, sampling, --stop, device I/O, other architectures, odd
#      shapes), at most $KILN_LLM_TEST_LIMIT seconds (default 170);
#   3. kiln_state_test on $bundle/state (in-place cache, state scopes, the position refusal), and
#      tests/gpu/python_runtime_test.py (kiln_runtime, with --state) when $bundle/python_runtime is carried;
#   4. benchmarks/llm_bench.py on $bundle/llm_bench with the time left: $KILN_ROUNDS rounds
#      (default 2), peers $KILN_BENCH_PEERS (default every peer the bundle has).
# Carry (about 57 MB): $bundle/executorch_sdk, llm_bench, llm, state and COMMIT, where
# bundle=${KILN_GPU_BUNDLE:-.gpu_carry}, and python_runtime if wanted (1 MB). Logs (at most 7 files) go to
# $OUT (else out/gpu).
# Usage: KILN_CALL_BUDGET=540 bash scripts/gpu_llm_call.sh
set -u
SECONDS=0
cd "$(dirname "$0")/.."
bundle=${KILN_GPU_BUNDLE:-.gpu_carry}
out=${OUT:-out/gpu}
mkdir -p "$out"
commit=$(cat "$bundle/COMMIT" 2>/dev/null || git rev-parse --short HEAD 2>/dev/null || echo unknown)
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "commit $commit"; } | tee /tmp/kiln_gpu.txt
{ cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$PWD/$bundle/executorch_sdk" \
    -DKILN_BUILD_PYTHON=OFF && cmake --build build-gpu -j"$(nproc)" --target llm_generate kiln_runner; } \
  >/tmp/kiln_build.txt 2>&1 || { tail -30 /tmp/kiln_build.txt; cp /tmp/kiln_build.txt "$out/"; exit 1; }
cmake --build build-gpu -j"$(nproc)" --target kiln_state_test >>/tmp/kiln_build.txt 2>&1 ||
  echo "kiln_state_test did not build (GoogleTest missing?): the state test is skipped"
echo "built at ${SECONDS}s"
if ls "$bundle"/llm/*/manifest.json >/dev/null 2>&1; then
  PYTHONUNBUFFERED=1 timeout "${KILN_LLM_TEST_LIMIT:-170}" python3 tests/gpu/llm_generate_test.py --bundle "$bundle/llm" \
    --binary build-gpu/examples/llm_generate/llm_generate >/tmp/llm_generate.log 2>&1
  echo "exit $? at ${SECONDS}s" >>/tmp/llm_generate.log
  cp /tmp/llm_generate.log "$out/"
  grep -E "^(PASS|FAIL)|programs pass|^exit" /tmp/llm_generate.log | cut -c1-200
fi
if [ -f "$bundle/state/manifest.json" ] && [ -x build-gpu/tests/cpp/kiln_state_test ]; then
  steps=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['steps'])" "$bundle/state/manifest.json")
  timeout 60 build-gpu/tests/cpp/kiln_state_test "$bundle/state" "$steps" 1e-5 2>&1 | grep -vE "^I " >/tmp/state_test.log
  echo "exit ${PIPESTATUS[0]} at ${SECONDS}s" >>/tmp/state_test.log
  cp /tmp/state_test.log "$out/"
  grep -E "PASS|FAIL|OK \]|FAILED|passed|^exit" /tmp/state_test.log | tail -25 | cut -c1-200
fi
# kiln_runtime (the torch-free Python runtime) with the state scopes, when carried
# (tests/gpu/export_python_runtime.py --out $bundle/python_runtime).
if [ -f "$bundle/python_runtime/manifest.json" ] && cmake --build build-gpu -j"$(nproc)" --target kiln_c_api \
    >>/tmp/kiln_build.txt 2>&1; then
  KILN_RUNTIME_LIBRARY="$PWD/build-gpu/src/c_api/libkiln_c_api.so" PYTHONUNBUFFERED=1 timeout 120 \
    python3 tests/gpu/python_runtime_test.py --files "$bundle/python_runtime" \
    $([ -f "$bundle/state/manifest.json" ] && echo --state "$bundle/state") 2>&1 | grep -vE "^I " >/tmp/python_runtime.log
  echo "exit ${PIPESTATUS[0]} at ${SECONDS}s" >>/tmp/python_runtime.log
  cp /tmp/python_runtime.log "$out/"
  grep -E "PASS|FAIL|^exit" /tmp/python_runtime.log | tail -20 | cut -c1-200
fi
left=$((${KILN_CALL_BUDGET:-585} - SECONDS))
if [ -f "$bundle/llm_bench/manifest.json" ] && [ "$left" -gt 60 ]; then
  echo "llm_bench with ${left}s left"
  # shellcheck disable=SC2086  # the peers flag is two words or none
  PYTHONUNBUFFERED=1 timeout "$left" python3 benchmarks/llm_bench.py --bundle "$bundle/llm_bench" \
    --binary build-gpu/examples/llm_generate/llm_generate --out "$out" --commit "$commit" --rounds "${KILN_ROUNDS:-2}" \
    --warmup 1 --runs 3 ${KILN_BENCH_PEERS:+--peers "$KILN_BENCH_PEERS"} >/tmp/llm_bench.log 2>&1
  echo "exit $? at ${SECONDS}s" >>/tmp/llm_bench.log
  grep -vE "^I |Warning|warn\(" /tmp/llm_bench.log >/tmp/llm_bench_out.log
  cp /tmp/llm_bench_out.log "$out/"
  tail -30 /tmp/llm_bench_out.log | cut -c1-250
else
  echo "llm_bench skipped (${left}s left, or no $bundle/llm_bench)"
fi
cp /tmp/kiln_gpu.txt "$out/gpu.txt"
