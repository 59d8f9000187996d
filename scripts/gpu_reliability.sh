#!/usr/bin/env bash
# The damaged-file campaign (tests/gpu/reliability_campaign.py): damaged copies
# (1/8/64 bit flips, truncations) of the sample programs (an MLP, its fp16
# variant, a conv net, a two-engine model) run by kiln_runner with expected
# outputs, each classified ok / refused / wrong / crash / hang.
#
#   bash scripts/gpu_reliability.sh --prepare   # CPU machine: exports the samples into
#                                               # $KILN_GPU_BUNDLE/reliability (~200 KB) and
#                                               # the ExecuTorch SDK if missing
#   bash scripts/gpu_reliability.sh [campaign flags]   # GPU machine (or locally, where every
#                                               # run is 'refused' for lack of a GPU)
# Carry $KILN_GPU_BUNDLE/executorch_sdk + $KILN_GPU_BUNDLE/reliability (.gpu_carry by default).
# Results (table.md, results.json, the bad copies) go to $OUT/reliability (or out/reliability).
# Exit status 1 when any run was wrong, crashed or hung.
set -uo pipefail
cd "$(dirname "$0")/.."
bundle=${KILN_GPU_BUNDLE:-.gpu_carry}
out=${OUT:-out}/reliability
mkdir -p "$out"

if [ "${1:-}" = "--prepare" ]; then
  set -e
  python=${PYTHON:-python3}
  [ -d "$bundle/executorch_sdk" ] || bash scripts/make_executorch_sdk.sh "$bundle/executorch_sdk"
  rm -rf "$bundle/reliability"
  PYTHONPATH=python $python tests/fuzz/export_samples.py --out "$bundle/reliability"
  git rev-parse --short HEAD >"$bundle/reliability/COMMIT"
  du -sh "$bundle/reliability"
  exit 0
fi

runner=${KILN_RUNNER:-}
if [ -z "$runner" ]; then
  if [ -d "$bundle/executorch_sdk" ]; then  # GPU machine: build the runner against the carried SDK
    cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_BUILD_PYTHON=OFF \
      -DCMAKE_PREFIX_PATH="$PWD/$bundle/executorch_sdk" >"$out/configure.log" 2>&1 &&
      cmake --build build-gpu -j"$(nproc)" --target kiln_runner >"$out/build.log" 2>&1 ||
      { tail -40 "$out/configure.log" "$out/build.log"; exit 1; }
    runner=build-gpu/tools/kiln_runner/kiln_runner
  else
    runner=build/tools/kiln_runner/kiln_runner  # this machine's scripts/setup.sh build
  fi
fi
samples=$bundle/reliability
[ -f "$samples/samples.json" ] || samples=build-fuzz/samples  # locally, after scripts/fuzz.sh
if [ ! -f "$samples/samples.json" ]; then
  echo "no samples: run 'bash scripts/gpu_reliability.sh --prepare' on a CPU machine first" >&2
  exit 2
fi
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/gpu.txt"
echo "commit: $(cat "$samples/COMMIT" 2>/dev/null || git rev-parse --short HEAD)" | tee -a "$out/gpu.txt"
PYTHONUNBUFFERED=1 python3 tests/gpu/reliability_campaign.py --samples "$samples" --runner "$runner" \
  --out "$out" "$@"
