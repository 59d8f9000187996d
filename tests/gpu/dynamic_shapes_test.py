"""GPU test of dynamic shapes, run on the GPU machine by scripts/gpu_check.sh
on the files of tests/gpu/export_dynamic_shapes.py (.gpu_carry/dynamic_shapes).

For each model and each sequence length it lists: kiln_runner runs the .pte
on that length's inputs and compares with PyTorch's float32 outputs
(rel_err <= 1e-5 float32, 1e-2 float16, the runner's defaults); a length
the manifest marks refused must fail with the message it names (a size no
shape variant was compiled for, one below the range, one above the planned
maximum). Prints one PASS/FAIL line per run; exits 1 on any FAIL.

    python3 tests/gpu/dynamic_shapes_test.py --files .gpu_carry/dynamic_shapes \\
        --runner build-gpu/tools/kiln_runner/kiln_runner
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=Path, required=True)
    parser.add_argument("--runner", required=True)
    args = parser.parse_args(argv)
    manifest = json.loads((args.files / "manifest.json").read_text())
    failed = 0
    for model in manifest:
        for run in model["runs"]:
            cmd = [args.runner, f"--model_path={args.files / model['pte']}",
                   f"--inputs={args.files / run['inputs']}", "--num_runs=3", "--warmup=1"]
            if run.get("expected"):
                cmd.append(f"--expected={args.files / run['expected']}")
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
            text = proc.stdout + proc.stderr
            what = f"{model['name']} length {run['length']}"
            if run.get("refused"):
                ok = proc.returncode != 0 and re.search(run["refused"], text) is not None
                why = next((line for line in text.splitlines() if re.search(run["refused"], line)), "")
                print(f"{'PASS' if ok else 'FAIL'}  {what}: refused (exit {proc.returncode}) {why.strip()[:200]}")
            else:
                err = re.search(r"rel_err=([0-9.eE+-]+|nan|inf)", text)  # kiln_runner's "rel_err=7.2e-07"
                ok = proc.returncode == 0
                print(f"{'PASS' if ok else 'FAIL'}  {what}: exit {proc.returncode}"
                      + (f", rel_err {err.group(1)}" if err else ""))
            if not ok:
                failed += 1
                print("\n".join("    | " + line for line in text.splitlines()[-15:]))
    print(f"dynamic shapes: {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
