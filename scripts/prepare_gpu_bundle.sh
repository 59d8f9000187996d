#!/usr/bin/env bash
# On the CPU machine: gathers what the GPU machine needs and cannot make
# itself into .gpu_carry/ (git-ignored; pass it as a carried path): the
# ExecuTorch C++ SDK from the wheel, the exported sample models (models/) and
# op conformance models (conformance/) with their weights and manifests, the
# two-method models of the multi-method test (multi_method/), the SM-targets
# test's models (sm_targets/), the Python runtime test's models
# (python_runtime/), the
# commit they came from, and the benchmark models (benchmarks/export_models.py:
# xz archives in carry groups vision_a, vision_b, ...). Each carried call
# holds at most 64 MiB, so carry executorch_sdk + COMMIT with EITHER models/
# OR conformance/ + the vision groups; see docs/benchmarks.md.
#
# Environment:
#   KILN_SKIP_VISION=1         skip the vision export (it takes CPU minutes);
#                              vision groups already in the bundle are kept
#   KILN_VISION_MODELS=a,b     export only these models (default all five)
#   KILN_VISION_ALLOW_CPU=1    continue when ops are left to the CPU (development)
#   KILN_SAMPLE_BATCH=N        batch of the sample MLPs (default 8)
set -euo pipefail
cd "$(dirname "$0")/.."
bundle=${1:-.gpu_carry}
mkdir -p "$bundle"
rm -rf "$bundle/executorch_sdk" "$bundle/models" "$bundle/COMMIT"
bash scripts/make_executorch_sdk.sh "$bundle/executorch_sdk"
python3 examples/export_mlp.py --out "$bundle/models" --batch "${KILN_SAMPLE_BATCH:-8}"
rm -rf "$bundle/conformance"
python3 tests/gpu/export_conformance.py --out "$bundle/conformance"
# Several methods in one .pte, weights stored once (about 11 MB).
rm -rf "$bundle/multi_method"
PYTHONPATH=python python3 tests/gpu/export_multi_method.py --out "$bundle/multi_method"
# One model for several target_sms: cubin, PTX JIT and refusal (about 1 MB).
rm -rf "$bundle/sm_targets"
PYTHONPATH=python python3 tests/gpu/export_sm_targets.py --out "$bundle/sm_targets"
# kiln_runtime (the torch-free Python runtime): six small models with
# references, two with device-resident I/O (about 1.2 MiB).
rm -rf "$bundle/python_runtime"
PYTHONPATH=python python3 tests/gpu/export_python_runtime.py --out "$bundle/python_runtime"
if [ "${KILN_SKIP_VISION:-0}" = 1 ]; then
  echo "vision export skipped (KILN_SKIP_VISION=1); kept: $(ls -d "$bundle"/vision_* 2>/dev/null | tr '\n' ' ')"
else
  rm -rf "$bundle"/vision_*
  vision_args=(--out "$bundle")
  [ -n "${KILN_VISION_MODELS:-}" ] && vision_args+=(--models "$KILN_VISION_MODELS")
  [ "${KILN_VISION_ALLOW_CPU:-0}" = 1 ] && vision_args+=(--allow-cpu-fallback)
  PYTHONPATH=python python3 benchmarks/export_models.py "${vision_args[@]}"
fi
git rev-parse --short HEAD >"$bundle/COMMIT"
git diff --quiet HEAD || echo "+uncommitted" >>"$bundle/COMMIT"
for part in "$bundle"/*; do echo "  $(du -sh "$part" | cut -f1)	$part"; done
echo "bundle: $bundle ($(du -sh "$bundle" | cut -f1)); one carried call: <= 64 MiB including the repository"
