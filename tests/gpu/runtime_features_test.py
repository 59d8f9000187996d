"""GPU test of KilnBackend's runtime features (CUDA graph replay, caller
streams from several threads, shared engines, shared activation scratch), run
on the GPU machine by scripts/gpu_check.sh.

For the MLP and the many-engine chain model of MODELS/manifest.json it draws
FRESH random inputs (seeded from os.urandom), computes PyTorch's outputs on
the GPU and hands both to build-gpu/.../kiln_runtime_features_test, which runs
the .pte through ExecuTorch's Module under each feature and compares.
"""

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT / "tests" / "gpu"))
import sample_models  # noqa: E402
from run_gpu_tests import DTYPES, tensor_file  # noqa: E402

SETS = 3
MODELS = ["mlp_fp32", "chain8_fp32"]  # first: graphs/threads/sharing; last: scratch


def make_case(entry, models_dir, work):
    torch.backends.cuda.matmul.allow_tf32 = False
    model = sample_models.build(entry["factory"], **entry.get("kwargs", {}))
    model.load_state_dict(torch.load(models_dir / entry["state_dict"], map_location="cpu"))
    model = model.to(DTYPES[entry["model_dtype"]]).cuda().eval()
    prefix = work / entry["name"]
    seed = int.from_bytes(os.urandom(4), "little")
    gen = torch.Generator(device="cuda").manual_seed(seed)
    for k in range(SETS):
        inputs = [torch.randn(shape, generator=gen, device="cuda", dtype=DTYPES[d]) for shape, d in entry["inputs"]]
        with torch.no_grad():
            expected = model(*inputs)
        tensor_file.save(f"{prefix}.{k}.inputs.ktensors", [t.cpu() for t in inputs])
        tensor_file.save(f"{prefix}.{k}.expected.ktensors", [expected.cpu()])
    print(f"{entry['name']}: {SETS} input sets, seed {seed}")
    return [entry["name"], str(models_dir / entry["pte"]), str(prefix), str(entry["rtol"])]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", type=Path, required=True)
    parser.add_argument("--binary", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    work = args.out / "features"
    work.mkdir(parents=True, exist_ok=True)
    manifest = {e["name"]: e for path in sorted(args.models.glob("manifest*.json"))
                for e in json.loads(path.read_text())}
    missing = [m for m in MODELS if m not in manifest]
    if missing:
        print(f"FAIL  models missing from the manifest: {missing}")
        sys.exit(1)
    argv = [str(args.binary), str(SETS)]
    for name in MODELS:
        argv += make_case(manifest[name], args.models, work)
    proc = subprocess.run(argv, capture_output=True, text=True)
    (args.out / "runtime_features.log").write_text(proc.stdout + proc.stderr)
    print(proc.stdout, end="")
    if proc.returncode != 0:
        print(proc.stderr[-3000:], end="")
    sys.exit(proc.returncode)


if __name__ == "__main__":
    main()
