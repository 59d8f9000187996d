#!/usr/bin/env bash
# CPU machine: exports the generation example's programs for the GPU machine
# (each call there carries at most 64 MiB), with this checkout's compiler:
#   $carry/llm/fp32   small Llama (7.9M), float32, logits, HF greedy reference,
#                     weights as a recipe rebuilt from the seed on the GPU machine
#   $carry/llm/fp32_dynamic  the same with a dynamic prompt length (prefill
#                     compiled per size 2..64; a 37-token prompt in chunks)
#   $carry/llm/fp32_device  the float32 program with device-resident I/O
#                     (export_llama.py --device-io; run with llm_generate --device_io)
#   $carry/llm/qwen3_fp32, phi3_fp32  the small model's dimensions as a Qwen3 and a Phi-3
#                     (export_llama.py --arch), float32, as fp32
#   $carry/llm/odd_fp32  a Llama of the shapes the others lack (size odd: head_dim 128,
#                     4 query heads a kv head, vocabulary 1003, untied head, scaled rotary)
#   $carry/llm/fp16   the same in float16, weights inside the .pte (xz)
#   $carry/llm_bench  (with --bench) the 410M benchmark model, bfloat16,
#                     prompt 512 + 256 new tokens, weights as a recipe;
#                     llm_bench/classic_launch/ the same with overlap_launches=False,
#                     llm_bench/persistent_decode/ with persistent_decode (sm_90 only)
#                     llm_bench/persistent_decode_LABEL/ (with --decode-variants) the same
#                     with the kernel options OPTS (options.txt), for llm_bench's A/B
#                     llm_bench/device_io/, persistent_device_io/ (with --device-io) the
#                     usual and persistent programs with device-resident I/O, for
#                     llm_bench's kiln_device and kiln_persistent_device peers
# Then, on the GPU machine: scripts/gpu_check.sh runs tests/gpu/llm_generate_test.py
# on $carry/llm; scripts/gpu_llm.sh benchmarks $carry/llm_bench.
# Usage: bash scripts/prepare_llm_carry.sh [--bench [--device-io] [--decode-variants "LABEL:OPTS LABEL:OPTS ..."]]
#   (KILN_GPU_BUNDLE, default .gpu_carry), e.g. --decode-variants "kv0:kv_rows=0 l2:l2_prefetch=16"
set -euo pipefail
cd "$(dirname "$0")/.."
bench=0
device_io=0
variants=()
while [ $# -gt 0 ]; do
  case $1 in
    --bench) bench=1 ;;
    --device-io) device_io=1 ;;
    --decode-variants)
      [ $# -ge 2 ] || { echo "prepare_llm_carry.sh: --decode-variants needs \"LABEL:OPTS ...\"" >&2; exit 2; }
      read -r -a variants <<<"$2"
      shift ;;
    *) echo "prepare_llm_carry.sh: unknown argument '$1' (--bench, --device-io, --decode-variants \"LABEL:OPTS ...\")" >&2
       exit 2 ;;
  esac
  shift
done
for v in "${variants[@]}"; do  # checked before the long exports start
  label=${v%%:*}
  if [ "$label" = "$v" ] || [ -z "$label" ] || [ -z "${v#*:}" ] || [[ ! $label =~ ^[A-Za-z0-9_]+$ ]]; then
    echo "prepare_llm_carry.sh: --decode-variants item '$v': expected LABEL:name=int,... (LABEL of letters, digits, _)" >&2
    exit 2
  fi
  if [ "$label" = device ]; then  # kiln_persistent_device is llm_bench's persistent_device_io/ peer
    echo "prepare_llm_carry.sh: --decode-variants label 'device' is taken (llm_bench's kiln_persistent_device)" >&2
    exit 2
  fi
done
[ ${#variants[@]} -eq 0 ] || [ $bench = 1 ] || { echo "prepare_llm_carry.sh: --decode-variants needs --bench" >&2; exit 2; }
[ $device_io = 0 ] || [ $bench = 1 ] || { echo "prepare_llm_carry.sh: --device-io needs --bench" >&2; exit 2; }
if [ ${#variants[@]} -gt 0 ]; then  # the options' names and syntax, before the exports
  PYTHONPATH=python${PYTHONPATH:+:$PYTHONPATH} python3 - "${variants[@]}" <<'EOF' || exit 2
import sys
from kiln._options import PERSISTENT_DECODE_OPTIONS, parse_persistent_decode_options
for item in sys.argv[1:]:
    label, text = item.split(":", 1)
    try:
        for name in parse_persistent_decode_options(text):
            if name not in PERSISTENT_DECODE_OPTIONS:
                raise ValueError(f"unknown option {name!r}; the options are {', '.join(PERSISTENT_DECODE_OPTIONS)}")
    except ValueError as e:
        sys.exit(f"prepare_llm_carry.sh: --decode-variants {label}: {e}")
EOF
fi
carry=${KILN_GPU_BUNDLE:-.gpu_carry}
export PYTHONPATH=python${PYTHONPATH:+:$PYTHONPATH}
work=$(mktemp -d /tmp/kiln_llm_carry.XXXXXX)
trap 'rm -rf "$work"' EXIT
export_llama=examples/llm_generate/export_llama.py
weights=examples/llm_generate/llm_weights.py

# [SIZE=s] small_fp32 NAME TITLE ARCH EXPORT_ARGS...: the model of ARCH (llama_kv.py ARCHITECTURES)
# and SIZE (default small) in float32 with logits and HF's reference, its weights as a recipe
# -> $carry/llm/NAME
small_fp32() {
  local name=$1 title=$2 arch=$3 size=${SIZE:-small}
  shift 3
  echo "== $size $arch, float32$title -> $carry/llm/$name"
  rm -rf "$carry/llm/$name" && mkdir -p "$carry/llm/$name"
  python3 "$export_llama" --arch "$arch" --size "$size" --dtype float32 --logits --reference --external-weights "$@" \
    --out "$work/$name"
  python3 "$weights" pack --ptd "$work/$name/${arch}_${size}_float32.ptd" --arch "$arch" --size "$size" \
    --dtype float32 --out "$carry/llm/$name/recipe"
  cp "$work/$name"/{"${arch}_${size}"_float32.pte,manifest.json,prompt.txt,expected_tokens.txt,expected_logits.f32} \
    "$carry/llm/$name/"
}
small_fp32 fp32 "" llama
small_fp32 fp32_dynamic ", dynamic prompt length (37 tokens as chunks 32 + 4 + 1)" llama --prompt-len 37 --prefill-max 64
small_fp32 fp32_device ", device-resident I/O (llm_generate --device_io)" llama --device-io
# Architectures beside Llama's, through the same wrapper (Qwen3: per-head q/k norms; Phi-3: fused q|k|v).
small_fp32 qwen3_fp32 "" qwen3
small_fp32 phi3_fp32 "" phi3
# Shapes beyond the others (llama_kv.py SIZES["odd"]): head_dim 128, four query heads a kv head, odd
# intermediate and vocabulary sizes, an untied lm_head, Llama 3.1's scaled rotary.
SIZE=odd small_fp32 odd_fp32 ", head_dim 128, 4 query heads a kv head, vocabulary 1003" llama

echo "== small, float16 -> $carry/llm/fp16"
rm -rf "$carry/llm/fp16" && mkdir -p "$carry/llm/fp16"
python3 "$export_llama" --size small --dtype float16 --logits --reference --out "$work/fp16"
xz -T2 -c "$work/fp16/llama_small_float16.pte" >"$carry/llm/fp16/llama_small_float16.pte.xz"
cp "$work"/fp16/{manifest.json,prompt.txt,expected_tokens.txt,expected_logits.f32} "$carry/llm/fp16/"

if [ $bench = 1 ]; then
  bench_args=(--size bench --dtype bfloat16 --prompt-len 512 --new-tokens 256 --max-len 768 --external-weights)
  echo "== bench, bfloat16 -> $carry/llm_bench"
  rm -rf "$carry/llm_bench" && mkdir -p "$carry/llm_bench"
  python3 "$export_llama" "${bench_args[@]}" --out "$work/bench"
  python3 "$weights" pack --ptd "$work/bench/llama_bench_bfloat16.ptd" --size bench --dtype bfloat16 \
    --out "$carry/llm_bench/recipe"
  cp "$work"/bench/{llama_bench_bfloat16.pte,manifest.json,prompt.txt} "$carry/llm_bench/"
  # bench_program DIR EXPORT_ARGS...: the same model exported otherwise, its program alone (same
  # weights, same .ptd) -> $carry/llm_bench/DIR
  bench_program() {
    local dir=$1
    shift
    echo "== bench, $* -> $carry/llm_bench/$dir"
    python3 "$export_llama" "${bench_args[@]}" "$@" --out "$work/bench_$dir"
    mkdir -p "$carry/llm_bench/$dir"
    cp "$work/bench_$dir/llama_bench_bfloat16.pte" "$carry/llm_bench/$dir/"
  }
  # overlap_launches=False, for gpu_llm.sh's A/B of programmatic dependent launch
  bench_program classic_launch --no-overlap-launches
  # the decode layers as one persistent kernel (sm_90 only)
  bench_program persistent_decode --persistent-decode --target-sms 90
  if [ $device_io = 1 ]; then
    bench_program device_io --device-io
    bench_program persistent_device_io --device-io --persistent-decode --target-sms 90
  fi
  for v in "${variants[@]}"; do
    label=${v%%:*} opts=${v#*:}
    bench_program "persistent_decode_$label" --persistent-decode --target-sms 90 --decode-options "$opts"
    echo "$opts" >"$carry/llm_bench/persistent_decode_$label/options.txt"
  done
fi
du -sh "$carry"/llm/* $([ $bench = 1 ] && echo "$carry/llm_bench")
