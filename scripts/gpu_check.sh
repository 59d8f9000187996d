#!/usr/bin/env bash
# Runs on the GPU machine (H200, no ExecuTorch wheel, no network): builds the
# runtime, delegate and runner against the carried ExecuTorch C++ SDK, then
# runs the GPU tests against PyTorch. Prepare the carried folder on the CPU
# machine with scripts/prepare_gpu_bundle.sh; logs go to $OUT (or out/gpu).
# Parts whose carried files are absent are skipped: one call carries at most
# 64 MiB, so carry executorch_sdk + COMMIT with either models/ (the sample
# MLPs, 47 MB) or conformance/ + vision_* (about 25 MB); see docs/benchmarks.md.
# KILN_SKIP_VISION=1 skips the vision models' numerics even when carried;
# KILN_SKIP_REFERENCE=1 the reference groups (hf_bert, hf_llama) likewise.
set -uo pipefail
cd "$(dirname "$0")/.."
bundle=${KILN_GPU_BUNDLE:-.gpu_carry}
out=${OUT:-out/gpu}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
echo "commit: $(cat "$bundle/COMMIT" 2>/dev/null || git rev-parse --short HEAD)" | tee -a "$out/gpu.txt"

cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$PWD/$bundle/executorch_sdk" -DKILN_BUILD_PYTHON=OFF \
  >"$out/configure.log" 2>&1 || { tail -40 "$out/configure.log"; exit 1; }
cmake --build build-gpu -j"$(nproc)" >"$out/build.log" 2>&1 || { grep -E "error|Error" "$out/build.log" | head -40; exit 1; }
echo "build ok"
ctest_failed=0
if [ -x build-gpu/tests/cpp/kiln_engine_format_tests ]; then
  # The whole log is kept; a failing test fails this script (the end of the
  # script checks ctest_failed), it is not hidden behind `| tail`.
  (cd build-gpu && ctest --output-on-failure -j8) >"$out/ctest.log" 2>&1 || ctest_failed=1
  tail -5 "$out/ctest.log"
  [ "$ctest_failed" = 0 ] || { echo "FAIL  GPU ctest (log: $out/ctest.log):"; grep -E "\*\*\*Failed|Exception|Timeout" "$out/ctest.log" | head -20; }
fi
vision_args=()
if [ "${KILN_SKIP_VISION:-0}" != 1 ] && ls "$bundle"/vision_*/manifest_vision.json >/dev/null 2>&1; then
  vision_args=(--vision "$bundle")
fi
# Reference groups (tests/gpu/export_hf_models.py: hf_bert, hf_llama): PyTorch's
# outputs were computed on the CPU machine and carried.
reference_args=()
if [ "${KILN_SKIP_REFERENCE:-0}" != 1 ] && ls "$bundle"/*/manifest_reference.json >/dev/null 2>&1; then
  reference_args=(--reference-groups "$bundle")
fi
if [ -d "$bundle/models" ] || [ -d "$bundle/conformance" ] || ((${#vision_args[@]})) || ((${#reference_args[@]})); then
  PYTHONUNBUFFERED=1 python3 tests/gpu/run_gpu_tests.py --models "$bundle/models" "$bundle/conformance" "${vision_args[@]}" \
    "${reference_args[@]}" --runner build-gpu/tools/kiln_runner/kiln_runner --out "$out" "$@" || gpu_tests_failed=1
else
  echo "no $bundle/models, $bundle/conformance, $bundle/vision_* or reference groups: GPU model tests skipped"
fi
# Several methods in one .pte, weights stored and uploaded once (issue 12).
multi_failed=0
if [ -f "$bundle/multi_method/manifest.json" ] && [ -x build-gpu/tests/cpp/kiln_multi_method_test ]; then
  PYTHONUNBUFFERED=1 python3 tests/gpu/multi_method_test.py --files "$bundle/multi_method" \
    --binary build-gpu/tests/cpp/kiln_multi_method_test --out "$out" || multi_failed=1
else
  echo "($bundle/multi_method not carried: multi-method test skipped)"
fi
# Engine-owned mutable state: a KV cache kept on the GPU and updated in place
# (issue 12; files from tests/gpu/export_state_test.py).
state_failed=0
if [ -f "$bundle/state/manifest.json" ] && [ -x build-gpu/tests/cpp/kiln_state_test ]; then
  steps=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['steps'])" "$bundle/state/manifest.json")
  build-gpu/tests/cpp/kiln_state_test "$bundle/state" "$steps" 1e-5 2>&1 | grep -vE "^I " || state_failed=1
else
  echo "($bundle/state not carried: engine-state test skipped)"
fi
# The C++ generation example against HF greedy generation (issue 12; files
# from examples/llm_generate/export_llama.py --reference, one folder per dtype).
llm_failed=0
if ls "$bundle"/llm/*/manifest.json >/dev/null 2>&1 && [ -x build-gpu/examples/llm_generate/llm_generate ]; then
  PYTHONUNBUFFERED=1 python3 tests/gpu/llm_generate_test.py --bundle "$bundle/llm" \
    --binary build-gpu/examples/llm_generate/llm_generate 2>&1 | tee "$out/llm_generate.log" || llm_failed=1
else
  echo "($bundle/llm not carried: generation example test skipped)"
fi
# Which code an engine's kernels load with: its cubin for this GPU, a JIT of
# its PTX, or a refusal naming both SMs (issue 14; files from
# tests/gpu/export_sm_targets.py).
sm_failed=0
if [ -f "$bundle/sm_targets/manifest.json" ]; then
  PYTHONUNBUFFERED=1 python3 tests/gpu/sm_targets_test.py --files "$bundle/sm_targets" \
    --runner build-gpu/tools/kiln_runner/kiln_runner --out "$out" || sm_failed=1
else
  echo "($bundle/sm_targets not carried: SM-targets test skipped)"
fi
# kiln_runtime, the torch-free Python runtime over libkiln_c_api.so (issue 14;
# files from tests/gpu/export_python_runtime.py): numpy and torch-CUDA DLPack
# inputs against PyTorch, device-resident outputs through DLPack.
pyrt_failed=0
if [ -f "$bundle/python_runtime/manifest.json" ] && [ -f build-gpu/src/c_api/libkiln_c_api.so ]; then
  KILN_RUNTIME_LIBRARY="$PWD/build-gpu/src/c_api/libkiln_c_api.so" PYTHONUNBUFFERED=1 \
    python3 tests/gpu/python_runtime_test.py --files "$bundle/python_runtime" \
      $([ -f "$bundle/state/manifest.json" ] && echo --state "$bundle/state") 2>&1 | grep -vE "^I " |
    tee "$out/python_runtime.log"
  [ "${PIPESTATUS[0]}" = 0 ] || pyrt_failed=1
else
  echo "($bundle/python_runtime not carried: Python runtime test skipped)"
fi
# Dynamic shapes: one engine per shape bucket, sizes picked at execute, other
# sizes refused (issue 12 item 1; files from tests/gpu/export_dynamic_shapes.py).
dyn_failed=0
if [ -f "$bundle/dynamic_shapes/manifest.json" ]; then
  PYTHONUNBUFFERED=1 python3 tests/gpu/dynamic_shapes_test.py --files "$bundle/dynamic_shapes" \
    --runner build-gpu/tools/kiln_runner/kiln_runner 2>&1 | tee "$out/dynamic_shapes.log"
  [ "${PIPESTATUS[0]}" = 0 ] || dyn_failed=1
else
  echo "($bundle/dynamic_shapes not carried: dynamic-shapes test skipped)"
fi
if [ ! -f "$bundle/models/mlp_fp32.pte" ]; then
  echo "($bundle/models not carried: runtime features and consumer app skipped)"
  [ "${gpu_tests_failed:-0}" = 0 ] && [ "$ctest_failed" = 0 ] && [ "$multi_failed" = 0 ] && [ "$state_failed" = 0 ] &&
    [ "$sm_failed" = 0 ] && [ "$llm_failed" = 0 ] && [ "$pyrt_failed" = 0 ] && [ "$dyn_failed" = 0 ]
  exit
fi

# Runtime features (graph replay, caller streams, shared engines and scratch).
if [ -x build-gpu/tests/cpp/kiln_runtime_features_test ]; then
  PYTHONUNBUFFERED=1 python3 tests/gpu/runtime_features_test.py --models "$bundle/models" \
    --binary build-gpu/tests/cpp/kiln_runtime_features_test --out "$out" || features_failed=1
  # One model through the runner with graphs on: copy counters printed.
  build-gpu/tools/kiln_runner/kiln_runner --model_path="$bundle/models/mlp_fp32.pte" \
    --use_cuda_graphs=true --num_runs=200 2>&1 | grep -E "latency|counters|Error" || true
fi
# The CMake package as a user consumes it: install, build the example app out
# of tree (with the caller-stream guard), run it on the GPU.
app_failed=0
cmake --install build-gpu --prefix /tmp/kiln-install --component kiln_runtime >"$out/install.log" 2>&1 &&
  cmake -S examples/cpp_module_app -B /tmp/kiln-app -G Ninja -DAPP_USE_CALLER_STREAM=ON \
    -DCMAKE_PREFIX_PATH="$PWD/$bundle/executorch_sdk;/tmp/kiln-install" >"$out/app.log" 2>&1 &&
  cmake --build /tmp/kiln-app >>"$out/app.log" 2>&1 || { echo "FAIL  consumer app did not build"; tail -20 "$out/app.log"; app_failed=1; }
if [ "$app_failed" = 0 ]; then
  /tmp/kiln-app/cpp_module_app "$bundle/models/mlp_fp32.pte" && echo "PASS  installed package: consumer app ran mlp_fp32 on the GPU" ||
    { echo "FAIL  consumer app exit $?"; app_failed=1; }
fi
[ "${gpu_tests_failed:-0}" = 0 ] && [ "${features_failed:-0}" = 0 ] && [ "$app_failed" = 0 ] &&
  [ "$ctest_failed" = 0 ] && [ "$multi_failed" = 0 ] && [ "$state_failed" = 0 ] && [ "$sm_failed" = 0 ] && [ "$llm_failed" = 0 ] &&
  [ "$pyrt_failed" = 0 ] && [ "$dyn_failed" = 0 ]
