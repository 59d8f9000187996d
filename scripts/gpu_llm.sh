#!/usr/bin/env bash
# Runs on the GPU machine (builds build-gpu's llm_generate and kiln_runner if
# scripts/gpu_check.sh has not):
#   1. benchmarks/llm_bench.py on the carried bench model (Kiln's C++ loop,
#      HF generate eager, the static-cache forward under torch.compile
#      reduce-overhead, in one run; the .ptd is rebuilt from its seed);
#   2. a per-step profile (KILN_PROFILE_STEPS=1) of its decode and prefill
#      methods, bucketed by tools/profile_summary.py, and each method's
#      CUDA-graph replay latency.
# Usage: KILN_GPU_BUNDLE=.gpu_carry bash scripts/gpu_llm.sh [commit]
#   KILN_LLM_PEERS (llm_bench's --peers; default every peer, the bundle's persistent_decode_LABEL/
#   variants included), KILN_LLM_ROUNDS (--rounds: the Kiln peers in turn, each its rounds' median),
#   KILN_LLM_PROFILE=0 (the benchmark alone: no steps 2-3, for a call short of time).
# Carries: $KILN_GPU_BUNDLE/llm_bench (export_llama.py --size bench
# --external-weights, then llm_weights.py pack into llm_bench/recipe) and, unless
# build-gpu is built, $KILN_GPU_BUNDLE/executorch_sdk (scripts/make_executorch_sdk.sh).
#   3. the persistent_decode program, when carried, on a 32-SM green context (its
#      fallback engine must run the calls).
# Writes $OUT/llm_bench.{md,json}, $OUT/llm_profile.txt, $OUT/llm_persistent_fallback.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
carry=${KILN_GPU_BUNDLE:-.gpu_carry}
bundle=$carry/llm_bench
out=${OUT:-out/gpu}
commit=${1:-$(cat "$carry/COMMIT" 2>/dev/null || echo unknown)}
bin=build-gpu/examples/llm_generate/llm_generate
runner=build-gpu/tools/kiln_runner/kiln_runner
mkdir -p "$out"
if [ ! -x "$bin" ] || [ ! -x "$runner" ]; then  # configured here too, so gpu_check.sh need not run first
  { [ -f build-gpu/build.ninja ] ||
      cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$PWD/$carry/executorch_sdk" \
        -DKILN_BUILD_PYTHON=OFF -DKILN_BUILD_TESTS=OFF; } >/tmp/kiln_llm_build.log 2>&1 &&
    cmake --build build-gpu -j"$(nproc)" --target llm_generate kiln_runner >>/tmp/kiln_llm_build.log 2>&1 ||
    { tail -30 /tmp/kiln_llm_build.log; exit 1; }
fi
PYTHONUNBUFFERED=1 python3 benchmarks/llm_bench.py --bundle "$bundle" --binary "$bin" --out "$out" \
  --commit "$commit" ${KILN_LLM_PEERS:+--peers "$KILN_LLM_PEERS"} ${KILN_LLM_ROUNDS:+--rounds "$KILN_LLM_ROUNDS"} 2>&1 | grep -vE "^I |Warning|warn\(" | tail -40
if [ "${KILN_LLM_PROFILE:-1}" = 0 ]; then  # the benchmark alone, for a call short of time
  echo "KILN_LLM_PROFILE=0: no green-context fallback check, no step profiles"
  exit 0
fi
read -r pte ptd < <(python3 -c "import json,sys; m=json.load(open(sys.argv[1])); print(m['pte'], m['ptd'])" \
  "$bundle/manifest.json")
# The persistent_decode program on a green context too small for its grid: its fallback engine
# (the usual one, stored beside it) must run the calls, with one log line, never hang.
if [ -f "$bundle/persistent_decode/$pte" ]; then
  { echo "== persistent_decode on a 32-SM green context (the fallback engine runs the calls)"
    timeout 120 "$runner" --model_path="$bundle/persistent_decode/$pte" --data_path="$bundle/$ptd" --method=decode \
      --green_context_sms=32 --use_cuda_graphs=true --cuda_events=true --num_runs=50 --warmup=5 2>&1 |
      grep -E "fallback|latency|rror" | cut -c1-300
    echo "exit ${PIPESTATUS[0]}"; } | tee "$out/llm_persistent_fallback.txt"
fi
: >"$out/llm_profile.txt"
for method in decode prefill; do
  KILN_PROFILE_STEPS=1 "$runner" --model_path="$bundle/$pte" --data_path="$bundle/$ptd" --method="$method" \
    --use_cuda_graphs=false --num_runs=30 --warmup=5 >"/tmp/kiln_llm_$method.txt" 2>&1
  { echo "== $method"; grep -E "latency|steps,|rror" "/tmp/kiln_llm_$method.txt" | tail -5; python3 tools/profile_summary.py "/tmp/kiln_llm_$method.txt"
    "$runner" --model_path="$bundle/$pte" --data_path="$bundle/$ptd" --method="$method" \
      --use_cuda_graphs=true --cuda_events=true --num_runs=200 --warmup=20 2>&1 | grep -E "latency|rror" | sed 's/^/graph replay: /'
    # A/B: the same program built with overlap_launches=False (classic launches).
    if [ -f "$bundle/classic_launch/$pte" ]; then
      "$runner" --model_path="$bundle/classic_launch/$pte" --data_path="$bundle/$ptd" --method="$method" \
        --use_cuda_graphs=true --cuda_events=true --num_runs=200 --warmup=20 2>&1 | grep -E "latency|rror" |
        sed 's/^/graph replay, overlap_launches=False: /'
      "$runner" --model_path="$bundle/$pte" --data_path="$bundle/$ptd" --method="$method" \
        --use_cuda_graphs=false --cuda_events=true --num_runs=200 --warmup=20 2>&1 | grep -E "latency|rror" |
        sed 's/^/stream launches: /'
      "$runner" --model_path="$bundle/classic_launch/$pte" --data_path="$bundle/$ptd" --method="$method" \
        --use_cuda_graphs=false --cuda_events=true --num_runs=200 --warmup=20 2>&1 | grep -E "latency|rror" |
        sed 's/^/stream launches, overlap_launches=False: /'
    fi
  } | tee -a "$out/llm_profile.txt"
done
