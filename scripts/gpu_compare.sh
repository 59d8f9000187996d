#!/usr/bin/env bash
# Runs on the GPU machine: measures other exports of the vision models (made
# with other KILN_* compiler switches or at another commit; see
# docs/benchmarks.md, "Comparing compiler paths") beside
# the default export, before a default is flipped:
#   1. scripts/gpu_check.sh (build, GPU ctest, conformance numerics) unless
#      KILN_COMPARE_SKIP_CHECK=1;
#   2. numerics of every program of each variant set against PyTorch (1 trial);
#   3. Kiln-only timings of every set (benchmarks/run_benchmarks.py --peers kiln);
#   4. per-step GPU profiles (KILN_PROFILE_STEPS=1) of the named programs in
#      every set.
# Usage: bash scripts/gpu_compare.sh VARIANT_DIR[,VARIANT_DIR...] [PROGRAM,PROGRAM...]
#   e.g. bash scripts/gpu_compare.sh .gpu_carry/variant mobilenet_v3_large_fp16_b8
# A set's label is its folder's name; the default set is $KILN_GPU_BUNDLE.
# Logs stay in /tmp/kiln_compare; a few summary files go to $OUT (only 8 come
# back from the GPU machine).
set -uo pipefail
cd "$(dirname "$0")/.."
IFS=, read -r -a variants <<<"${1:?usage: gpu_compare.sh VARIANT_DIR[,VARIANT_DIR...] [PROGRAMS]}"
profiles=${2:-}
bundle=${KILN_GPU_BUNDLE:-.gpu_carry}
out=${OUT:-out/gpu}
work=/tmp/kiln_compare
runner=build-gpu/tools/kiln_runner/kiln_runner
mkdir -p "$out" "$work"
for v in "${variants[@]}"; do [ -d "$v" ] || { echo "gpu_compare.sh: no variant set at $v"; exit 2; }; done
status=0

if [ "${KILN_COMPARE_SKIP_CHECK:-0}" != 1 ]; then
  echo "== build, GPU ctest, conformance"
  KILN_SKIP_VISION=1 OUT="$work/check" bash scripts/gpu_check.sh --trials 1 || status=1
  cp "$work/check/gpu_tests.json" "$out/check_gpu_tests.json" 2>/dev/null
fi
[ -x "$runner" ] || { echo "gpu_compare.sh: $runner was not built"; exit 1; }

for v in "${variants[@]}"; do
  name=$(basename "$v")
  echo "== numerics of $v"
  PYTHONUNBUFFERED=1 python3 tests/gpu/run_gpu_tests.py --vision "$v" --vision-work "$work/${name}_work" \
    --runner "$runner" --out "$work/${name}_numerics" --trials 1 | grep -E "PASS|FAIL|passed" || status=1
done

echo "== Kiln timings: the default set, then each variant"
for carry in "$bundle" "${variants[@]}"; do
  name=default
  [ "$carry" = "$bundle" ] || name=$(basename "$carry")
  PYTHONUNBUFFERED=1 python3 benchmarks/run_benchmarks.py --carry "$carry" --runner "$runner" --peers kiln \
    --results-dir "$work/bench" --stem "kiln_$name" >"$work/bench_$name.log" 2>&1
  echo "-- $name"
  grep -E "^\| [a-z]" "$work/bench/kiln_$name.md" | head -n 12
  cp "$work/bench/kiln_$name.json" "$out/" 2>/dev/null
done

if [ -n "$profiles" ]; then
  echo "== per-step profiles: $profiles"
  PYTHONPATH=benchmarks python3 - "$work" "$profiles" "$bundle" "${variants[@]}" >"$work/profile_paths.txt" <<'EOF'
import sys
from pathlib import Path
import vision_bundle
work, names, sets = Path(sys.argv[1]), sys.argv[2].split(","), sys.argv[3:]
for i, carry in enumerate(sets):
    label = "default" if i == 0 else Path(carry).name
    # The numerics step unpacked the variant sets there already.
    for e in vision_bundle.load_entries([carry], unpack_dir=work / f"{label}_work" / "pte"):
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
