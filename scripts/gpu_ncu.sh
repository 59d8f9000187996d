#!/usr/bin/env bash
# Runs on the GPU machine (Firecracker kinds, where ncu reads counters; see the
# tool library's device notes): Nsight Compute on one run of the carried LLM
# benchmark's decode and prefill methods, one row a kernel, then
# tools/ncu_summary.py's table of kernel families (time less ncu's own ~2.5 us
# a kernel, DRAM bytes, GB/s, the bytes alone at the card's bandwidth).
# docs/design_llm.md reads such a table.
# Usage: KILN_GPU_BUNDLE=.gpu_carry bash scripts/gpu_ncu.sh [peak GB/s, default 3350 (H100 SXM)]
# Carries: $KILN_GPU_BUNDLE/llm_bench and executorch_sdk (as scripts/gpu_llm.sh).
# Writes $OUT/ncu_{decode,prefill}.csv and $OUT/ncu_summary.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
carry=${KILN_GPU_BUNDLE:-.gpu_carry}
bundle=$carry/llm_bench
out=${OUT:-out/gpu}
peak=${1:-3350}
runner=build-gpu/tools/kiln_runner/kiln_runner
mkdir -p "$out"
if [ ! -x "$runner" ]; then
  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$PWD/$carry/executorch_sdk" \
    -DKILN_BUILD_PYTHON=OFF -DKILN_BUILD_TESTS=OFF >/tmp/kiln_ncu_configure.log 2>&1 &&
    cmake --build build-gpu -j"$(nproc)" --target kiln_runner >/tmp/kiln_ncu_build.log 2>&1 ||
    { tail -30 /tmp/kiln_ncu_build.log /tmp/kiln_ncu_configure.log 2>/dev/null; exit 1; }
fi
read -r pte ptd < <(python3 -c "import json,sys; m=json.load(open(sys.argv[1])); print(m['pte'], m['ptd'])" \
  "$bundle/manifest.json")
if [ ! -f "/tmp/$ptd" ]; then
  python3 examples/llm_generate/llm_weights.py unpack --recipe "$bundle/recipe" --out "/tmp/$ptd" | tail -1
fi
: >"$out/ncu_summary.txt"
for method in decode prefill; do
  # One warm-up run and one measured run; the summary takes the measured one's
  # kernels: the last <steps> rows, one kernel a step (true of these programs:
  # generated kernels and one cuBLASLt kernel a GEMM step).
  ncu --clock-control none --csv --page raw \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum,launch__registers_per_thread \
    "$runner" --model_path="$bundle/$pte" --data_path="/tmp/$ptd" --method="$method" --use_cuda_graphs=false \
    --num_runs=1 --warmup=1 >"$out/ncu_$method.csv" 2>"/tmp/kiln_ncu_$method.err" ||
    { echo "ncu failed on $method:"; tail -5 "/tmp/kiln_ncu_$method.err"; exit 1; }
  steps=$(grep -oE "[0-9]+ steps" "/tmp/kiln_ncu_$method.err" "$out/ncu_$method.csv" | head -1 | grep -oE "[0-9]+")
  { echo "== $method ($steps steps)"
    python3 tools/ncu_summary.py "$out/ncu_$method.csv" --last "$steps" --overhead-us 2.5 --peak-gbs "$peak"
  } | tee -a "$out/ncu_summary.txt"
done
