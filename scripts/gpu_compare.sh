#!/usr/bin/env bash
# Runs on the GPU machine: measures a second export of the vision models (made
# with other KILN_* compiler switches, e.g. the opt-in paths; see
# docs/benchmarks.md, "Measuring an opt-in compiler path") beside the default
# export, before a default is flipped:
#   1. scripts/gpu_check.sh (build, GPU ctest, conformance numerics) unless
#      KILN_COMPARE_SKIP_CHECK=1;
#   2. numerics of every program of the variant set against PyTorch (1 trial);
#   3. Kiln-only timings of both sets (benchmarks/run_benchmarks.py --peers kiln);
#   4. per-step GPU profiles (KILN_PROFILE_STEPS=1) of the named programs in
#      both sets.
# Usage: bash scripts/gpu_compare.sh VARIANT_DIR [PROGRAM,PROGRAM...]
#   e.g. bash scripts/gpu_compare.sh .gpu_carry/variant mobilenet_v3_large_fp16_b8
# Logs stay in /tmp/kiln_compare; a few summary files go to $OUT (only 8 come
# back from the GPU machine).
set -uo pipefail
cd "$(dirname "$0")/.."
variant=${1:?usage: gpu_compare.sh VARIANT_DIR [PROGRAMS]}
profiles=${2:-}
bundle=${KILN_GPU_BUNDLE:-.gpu_carry}
out=${OUT:-out/gpu}
work=/tmp/kiln_compare
runner=build-gpu/tools/kiln_runner/kiln_runner
mkdir -p "$out" "$work"
[ -d "$variant" ] || { echo "gpu_compare.sh: no variant set at $variant"; exit 2; }
status=0

if [ "${KILN_COMPARE_SKIP_CHECK:-0}" != 1 ]; then
  echo "== build, GPU ctest, conformance"
  KILN_SKIP_VISION=1 OUT="$work/check" bash scripts/gpu_check.sh --trials 1 || status=1
  cp "$work/check/gpu_tests.json" "$out/check_gpu_tests.json" 2>/dev/null
fi
[ -x "$runner" ] || { echo "gpu_compare.sh: $runner was not built"; exit 1; }

echo "== numerics of the variant set ($variant)"
PYTHONUNBUFFERED=1 python3 tests/gpu/run_gpu_tests.py --vision "$variant" --vision-work "$work/variant_work" \
  --runner "$runner" --out "$work/variant_numerics" --trials 1 || status=1
cp "$work/variant_numerics/gpu_tests.json" "$out/variant_gpu_tests.json" 2>/dev/null

echo "== Kiln timings: default set, then variant set"
for set in default variant; do
  carry=$bundle
  [ "$set" = variant ] && carry=$variant
  PYTHONUNBUFFERED=1 python3 benchmarks/run_benchmarks.py --carry "$carry" --runner "$runner" --peers kiln \
    --results-dir "$work/bench" --stem "kiln_$set" 2>&1 | grep -vE "^\s*$" | tail -n 25
  cp "$work/bench/kiln_$set.json" "$out/" 2>/dev/null
done

if [ -n "$profiles" ]; then
  echo "== per-step profiles: $profiles"
  PYTHONPATH=benchmarks python3 - "$bundle" "$variant" "$work" "$profiles" >"$work/profile_paths.txt" <<'EOF'
import sys
from pathlib import Path
import vision_bundle
bundle, variant, work, names = sys.argv[1], sys.argv[2], Path(sys.argv[3]), sys.argv[4].split(",")
for label, carry in (("default", bundle), ("variant", variant)):
    for e in vision_bundle.load_entries([carry], unpack_dir=work / f"profile_{label}"):
        if e["name"] in names:
            print(label, e["name"], e["pte_path"])
EOF
  while read -r label name pte; do
    echo "-- $label $name"
    KILN_PROFILE_STEPS=1 "$runner" --model_path="$pte" --device_io=true --num_runs=35 --warmup=5 2>&1 |
      grep -E "kiln profile|latency" | head -n 60
  done <"$work/profile_paths.txt" >"$out/profiles.txt"
  grep -E "^--|steps,|latency" "$out/profiles.txt"
fi
exit $status
