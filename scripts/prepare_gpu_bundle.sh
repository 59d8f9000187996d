#!/usr/bin/env bash
# On the CPU machine: gathers what the GPU machine needs and cannot make
# itself into .gpu_carry/ (git-ignored; pass it as a carried path): the
# ExecuTorch C++ SDK from the wheel, the exported sample models with their
# weights and a manifest, and the commit they came from.
set -euo pipefail
cd "$(dirname "$0")/.."
bundle=${1:-.gpu_carry}
rm -rf "$bundle"
mkdir -p "$bundle"
bash scripts/make_executorch_sdk.sh "$bundle/executorch_sdk"
python3 examples/export_mlp.py --out "$bundle/models" --batch "${KILN_SAMPLE_BATCH:-8}"
python3 tests/gpu/export_conformance.py --out "$bundle/models"
git rev-parse --short HEAD >"$bundle/COMMIT"
git diff --quiet HEAD || echo "+uncommitted" >>"$bundle/COMMIT"
echo "bundle: $bundle ($(du -sh "$bundle" | cut -f1))"
