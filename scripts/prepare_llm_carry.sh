#!/usr/bin/env bash
# CPU machine: exports the generation example's programs for the GPU machine
# (each call there carries at most 64 MiB), with this checkout's compiler:
#   $carry/llm/fp32   small Llama (7.9M), float32, logits, HF greedy reference,
#                     weights as a recipe rebuilt from the seed on the GPU machine
#   $carry/llm/fp32_dynamic  the same with a dynamic prompt length (prefill
#                     compiled per size 2..64; a 37-token prompt in chunks)
#   $carry/llm/fp16   the same in float16, weights inside the .pte (xz)
#   $carry/llm_bench  (with --bench) the 410M benchmark model, bfloat16,
#                     prompt 512 + 256 new tokens, weights as a recipe;
#                     llm_bench/classic_launch/ the same with overlap_launches=False,
#                     llm_bench/persistent_decode/ with persistent_decode (sm_90 only)
# Then, on the GPU machine: scripts/gpu_check.sh runs tests/gpu/llm_generate_test.py
# on $carry/llm; scripts/gpu_llm.sh benchmarks $carry/llm_bench.
# Usage: bash scripts/prepare_llm_carry.sh [--bench]   (KILN_GPU_BUNDLE, default .gpu_carry)
set -euo pipefail
cd "$(dirname "$0")/.."
carry=${KILN_GPU_BUNDLE:-.gpu_carry}
export PYTHONPATH=python${PYTHONPATH:+:$PYTHONPATH}
work=$(mktemp -d /tmp/kiln_llm_carry.XXXXXX)
trap 'rm -rf "$work"' EXIT
export_llama=examples/llm_generate/export_llama.py
weights=examples/llm_generate/llm_weights.py

echo "== small, float32 -> $carry/llm/fp32"
rm -rf "$carry/llm/fp32" && mkdir -p "$carry/llm/fp32"
python3 "$export_llama" --size small --dtype float32 --logits --reference --external-weights --out "$work/fp32"
python3 "$weights" pack --ptd "$work/fp32/llama_small_float32.ptd" --size small --dtype float32 \
  --out "$carry/llm/fp32/recipe"
cp "$work"/fp32/{llama_small_float32.pte,manifest.json,prompt.txt,expected_tokens.txt,expected_logits.f32} \
  "$carry/llm/fp32/"

echo "== small, float32, dynamic prompt length (37 tokens as chunks 32 + 4 + 1) -> $carry/llm/fp32_dynamic"
rm -rf "$carry/llm/fp32_dynamic" && mkdir -p "$carry/llm/fp32_dynamic"
python3 "$export_llama" --size small --dtype float32 --prompt-len 37 --prefill-max 64 --logits --reference \
  --external-weights --out "$work/fp32_dynamic"
python3 "$weights" pack --ptd "$work/fp32_dynamic/llama_small_float32.ptd" --size small --dtype float32 \
  --out "$carry/llm/fp32_dynamic/recipe"
cp "$work"/fp32_dynamic/{llama_small_float32.pte,manifest.json,prompt.txt,expected_tokens.txt,expected_logits.f32} \
  "$carry/llm/fp32_dynamic/"

echo "== small, float16 -> $carry/llm/fp16"
rm -rf "$carry/llm/fp16" && mkdir -p "$carry/llm/fp16"
python3 "$export_llama" --size small --dtype float16 --logits --reference --out "$work/fp16"
xz -T2 -c "$work/fp16/llama_small_float16.pte" >"$carry/llm/fp16/llama_small_float16.pte.xz"
cp "$work"/fp16/{manifest.json,prompt.txt,expected_tokens.txt,expected_logits.f32} "$carry/llm/fp16/"

if [ "${1:-}" = "--bench" ]; then
  echo "== bench, bfloat16 -> $carry/llm_bench"
  rm -rf "$carry/llm_bench" && mkdir -p "$carry/llm_bench"
  python3 "$export_llama" --size bench --dtype bfloat16 --prompt-len 512 --new-tokens 256 --max-len 768 \
    --external-weights --out "$work/bench"
  python3 "$weights" pack --ptd "$work/bench/llama_bench_bfloat16.ptd" --size bench --dtype bfloat16 \
    --out "$carry/llm_bench/recipe"
  cp "$work"/bench/{llama_bench_bfloat16.pte,manifest.json,prompt.txt} "$carry/llm_bench/"
  # The same program with overlap_launches=False (same weights, same .ptd), for
  # gpu_llm.sh's A/B of programmatic dependent launch.
  python3 "$export_llama" --size bench --dtype bfloat16 --prompt-len 512 --new-tokens 256 --max-len 768 \
    --external-weights --no-overlap-launches --out "$work/bench_classic"
  mkdir -p "$carry/llm_bench/classic_launch"
  cp "$work/bench_classic/llama_bench_bfloat16.pte" "$carry/llm_bench/classic_launch/"
  # The same model with the decode layers as one persistent kernel (sm_90 only); same weights.
  python3 "$export_llama" --size bench --dtype bfloat16 --prompt-len 512 --new-tokens 256 --max-len 768 \
    --external-weights --persistent-decode --target-sms 90 --out "$work/bench_persistent"
  mkdir -p "$carry/llm_bench/persistent_decode"
  cp "$work/bench_persistent/llama_bench_bfloat16.pte" "$carry/llm_bench/persistent_decode/"
fi
du -sh "$carry"/llm/* ${1:+"$carry/llm_bench"}
