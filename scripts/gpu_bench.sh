#!/usr/bin/env bash
# Runs on the GPU machine after scripts/gpu_check.sh built build-gpu: the
# benchmark suite (benchmarks/run_benchmarks.py), Kiln through kiln_runner
# against the PyTorch peers, on the carried vision groups ($KILN_GPU_BUNDLE,
# default .gpu_carry). Arguments go to run_benchmarks.py, e.g.
#   bash scripts/gpu_bench.sh --models mlp_policy,resnet50 --peers kiln,eager,compile,reduce_overhead,aoti
# Results: benchmarks/results/ and $OUT/bench/ (<date>_<commit>.{md,json},
# latest.md). If the runner is not built yet, builds only it (about a minute).
set -uo pipefail
cd "$(dirname "$0")/.."
bundle=${KILN_GPU_BUNDLE:-.gpu_carry}
out=${OUT:-out/gpu}
mkdir -p "$out/bench"
runner=build-gpu/tools/kiln_runner/kiln_runner
if [ ! -x "$runner" ]; then
  echo "building kiln_runner (build-gpu)"
  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$PWD/$bundle/executorch_sdk" -DKILN_BUILD_PYTHON=OFF >"$out/configure.log" 2>&1 &&
    cmake --build build-gpu -j"$(nproc)" --target kiln_runner >"$out/build.log" 2>&1 ||
    { tail -30 "$out/configure.log" "$out/build.log"; exit 1; }
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
PYTHONUNBUFFERED=1 python3 benchmarks/run_benchmarks.py --carry "$bundle" --runner "$runner" \
  --results-dir benchmarks/results "$@"
rc=$?
cp benchmarks/results/*.md benchmarks/results/*.json "$out/bench/" 2>/dev/null
exit $rc
