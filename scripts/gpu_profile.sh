#!/usr/bin/env bash
# Runs on the GPU machine: where the time goes, Kiln beside PyTorch.
#   1. builds kiln_runner (build-gpu) against the carried ExecuTorch SDK;
#   2. for each named program of the carried vision groups: a Kiln per-step
#      profile (KILN_PROFILE_STEPS=1, device I/O) and its bucket sums
#      (tools/profile_summary.py);
#   3. PyTorch's kernels for the same model, batch and dtype
#      (benchmarks/profile_peer.py), eager and reduce-overhead.
# Usage: bash scripts/gpu_profile.sh PROGRAM[,PROGRAM...]   e.g. vit_b_16_fp16_b8
# KILN_PROFILE_PEERS=0 skips step 3 (PyTorch's profiles). Each program's
# CUDA-graph replay latency (no profiling events) is printed after its profile.
# Writes $OUT/profiles.txt (Kiln, every step) and $OUT/profile_summary.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
names=${1:?usage: gpu_profile.sh PROGRAM[,PROGRAM...]}
bundle=${KILN_GPU_BUNDLE:-.gpu_carry}
out=${OUT:-out/gpu}
work=/tmp/kiln_profile
runner=build-gpu/tools/kiln_runner/kiln_runner
mkdir -p "$out" "$work"
if [ ! -x "$runner" ]; then
  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$PWD/$bundle/executorch_sdk" -DKILN_BUILD_PYTHON=OFF >"$work/configure.log" 2>&1 &&
    cmake --build build-gpu -j"$(nproc)" --target kiln_runner >"$work/build.log" 2>&1 ||
    { tail -30 "$work/configure.log" "$work/build.log"; exit 1; }
fi
PYTHONPATH=benchmarks python3 - "$work" "$names" "$bundle" >"$work/paths.txt" <<'PY'
import sys
from pathlib import Path
import vision_bundle
work, names, carry = Path(sys.argv[1]), sys.argv[2].split(","), sys.argv[3]
for e in vision_bundle.load_entries([carry], unpack_dir=work / "pte"):
    if e["name"] in names:
        print(e["name"], e["model"], e["batch"], e["dtype"], e["pte_path"])
PY
: >"$out/profiles.txt"
: >"$out/profile_summary.txt"
while read -r name model batch dtype pte; do
  echo "== $name" | tee -a "$out/profile_summary.txt"
  KILN_PROFILE_STEPS=1 "$runner" --model_path="$pte" --device_io=true --num_runs=55 --warmup=5 \
    >"$work/$name.txt" 2>&1
  { echo "-- $name"; grep -E "kiln profile|latency" "$work/$name.txt"; } >>"$out/profiles.txt"
  { grep -E "latency|steps," "$work/$name.txt"; python3 tools/profile_summary.py "$work/$name.txt"; } |
    tee -a "$out/profile_summary.txt"
  # Without per-step events: CUDA-graph replay, the figure the benchmark reports.
  "$runner" --model_path="$pte" --device_io=true --use_cuda_graphs=true --cuda_events=true --num_runs=300 \
    --warmup=30 2>&1 | grep -E "^latency" | sed 's/^/graph replay /' | tee -a "$out/profile_summary.txt"
  [ "${KILN_PROFILE_PEERS:-1}" = 0 ] && continue
  for mode in eager reduce_overhead; do
    timeout 300 python3 benchmarks/profile_peer.py --model "$model" --batch "$batch" --dtype "$dtype" \
      --mode "$mode" 2>&1 | grep -E "^torch" | tee -a "$out/profile_summary.txt"
  done
done <"$work/paths.txt"
