"""GPU test of several methods in one .pte with weights stored and loaded
once (issue 12), run on the GPU machine:

    python3 tests/gpu/multi_method_test.py --files .gpu_carry/multi_method \
        --binary build-gpu/tests/cpp/kiln_multi_method_test --out out/gpu

The files (two models A and B, each a "prefill" + "decode" .pte, also with a
.ptd) come from tests/gpu/export_multi_method.py on the CPU machine. This
rebuilds both PyTorch models from their state dicts on the GPU, draws FRESH
random inputs (seeded from os.urandom), computes PyTorch's outputs in fp32
(TF32 off) and runs build-gpu/.../kiln_multi_method_test, which loads the
.pte files through ExecuTorch's Module, compares, and checks the delegate's
named-weight counters (uploaded once, shared by both methods, never between
A and B).
"""

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "gpu"))
import multi_method_models as mm  # noqa: E402
from run_gpu_tests import tensor_file  # noqa: E402  (kiln/tensor_file.py alone: no ExecuTorch there)

SETS = 3


def write_cases(files: Path, work: Path, name: str) -> None:
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    block = mm.Block()
    block.load_state_dict(torch.load(files / f"{name}.pt", map_location="cpu"))
    block = block.cuda().eval()
    seed = int.from_bytes(os.urandom(4), "little")
    gen = torch.Generator(device="cuda").manual_seed(seed)
    for method, module in mm.methods(block).items():
        for k in range(SETS):
            x = torch.randn(*mm.SHAPES[method], generator=gen, device="cuda")
            with torch.no_grad():
                y = module(x)
            tensor_file.save(work / f"{name}.{method}.{k}.inputs.ktensors", [x.cpu()])
            tensor_file.save(work / f"{name}.{method}.{k}.expected.ktensors", [y.cpu()])
    print(f"{name}: {SETS} input sets per method, seed {seed}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--files", type=Path, required=True)
    parser.add_argument("--binary", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    manifest = json.loads((args.files / "manifest.json").read_text())
    work = args.out / "multi_method"
    work.mkdir(parents=True, exist_ok=True)
    for name in ("a", "b"):
        write_cases(args.files, work, name)
    keys = [str(len(manifest["models"][n]["keys"])) for n in ("a", "b")]
    argv = [str(args.binary), str(args.files), str(work), *keys, str(manifest["rtol"]), str(SETS)]
    proc = subprocess.run(argv, capture_output=True, text=True)
    (args.out / "multi_method.log").write_text(proc.stdout + proc.stderr)
    print(proc.stdout, end="")
    if proc.returncode != 0:
        print(proc.stderr[-4000:], end="")
    else:  # the delegate's load lines: named weights uploaded vs already on the GPU
        for line in proc.stderr.splitlines():
            if "named weights:" in line:
                print("LOG   " + line.strip())
    sys.exit(proc.returncode)


if __name__ == "__main__":
    main()
