#!/usr/bin/env bash
# The main job, end to end: set up, export the sample MLPs to .pte files
# (on any machine; no GPU needed), validate them, and, where a CUDA GPU is
# present, run them with kiln_runner and compare with PyTorch's outputs.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
out=${KILN_SAMPLE_DIR:-out/sample}
# setup.sh installed kiln into this interpreter: no PYTHONPATH needed.
python=${PYTHON:-python3}
$python examples/export_mlp.py --out "$out"
for pte in "$out"/*.pte; do
  $python -m kiln inspect "$pte" | head -3
done
runner=build/tools/kiln_runner/kiln_runner
if nvidia-smi -L >/dev/null 2>&1; then
  status=0
  for pte in "$out"/*.pte; do
    name=${pte%.pte}
    rtol=$($python -c "import glob, json; print({m['pte']: m['rtol'] for f in glob.glob('$out/manifest*.json') for m in json.load(open(f))}['$(basename "$pte")'])")
    echo "== $(basename "$pte")"
    "$runner" --model_path="$pte" --inputs="$name.inputs.ktensors" --expected="$name.expected.ktensors" \
      --rtol="$rtol" --num_runs=100 || status=1
  done
  exit $status
else
  echo
  echo "Exported and validated $(ls "$out"/*.pte | wc -l) programs in $out."
  echo "This machine has no CUDA GPU, so they were not run: running a Kiln engine needs an NVIDIA GPU"
  echo "(cubins for sm_80 to sm_120 are inside, plus PTX for newer GPUs). On a GPU machine this same command"
  echo "runs each one with $runner and compares with PyTorch."
fi
