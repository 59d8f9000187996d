"""CPU side of the kiln_runtime GPU test (tests/gpu/python_runtime_test.py):
exports the small models of tests/gpu/python_runtime_models.py (host I/O in
float32 and float16 engines, a Kiln + CPU + Kiln program, two inputs and two
outputs, device-resident I/O in float32 and float16, and a batch Dim compiled
to one engine per size bucket) with, for each,
its weights (.pt, so the GPU machine rebuilds it for fresh inputs) and
reference outputs PyTorch computed here on random inputs (.npz), listed in
manifest.json. About 1 MiB in all (target_sms=(90,): the H200's cubin only).

    PYTHONPATH=python python3 tests/gpu/export_python_runtime.py --out .gpu_carry/python_runtime
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(ROOT / "tests" / "gpu"))
sys.path.insert(0, str(ROOT / "examples"))
import kiln  # noqa: E402
from export_device_resident import device_resident_config  # noqa: E402
from python_runtime_models import CASES, DYNAMIC_CASES, build  # noqa: E402
from kiln import _dynamic  # noqa: E402

SETS = 2  # reference input sets per model


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--target-sms", default="90", help="comma-separated SMs (default: the H200's 90)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    sms = tuple(int(s) for s in args.target_sms.split(","))
    manifest = []
    for index, (name, (factory, kwargs, shapes, model_dtype, precision, device_io, rtol)) in enumerate(CASES.items()):
        torch.manual_seed(200 + index)
        dtype = getattr(torch, model_dtype)
        model = build(factory, **kwargs).eval()
        example = tuple(torch.randn(s).to(dtype) for s in shapes)
        compiled = kiln.compile(torch.export.export(model.to(dtype), example), arg_inputs=example,
                                enabled_precisions={getattr(torch, precision)}, target_sms=sms,
                                model_id=f"python-runtime-{index}")
        config = {"backend_config": device_resident_config()} if device_io else {}
        pte = kiln.save(compiled, args.out / f"{name}.pte", **config)
        torch.save(model.float().state_dict(), args.out / f"{name}.pt")
        reference = {}
        model = model.float()
        for k in range(SETS):
            inputs = [torch.randn(s).to(dtype) for s in shapes]
            with torch.no_grad():  # computed in float32 from the model's own weights
                outputs = model(*[t.float() for t in inputs])
            outputs = outputs if isinstance(outputs, tuple) else (outputs,)
            for i, t in enumerate(inputs):
                reference[f"set{k}_input{i}"] = t.numpy()
            for j, t in enumerate(outputs):
                reference[f"set{k}_output{j}"] = t.to(dtype).numpy()
        np.savez(args.out / f"{name}.npz", **reference)
        manifest.append({"name": name, "pte": pte.name, "weights": f"{name}.pt", "reference": f"{name}.npz",
                         "factory": factory, "kwargs": kwargs, "inputs": shapes, "model_dtype": model_dtype,
                         "device_io": device_io, "rtol": rtol, "sets": SETS,
                         "num_outputs": len(outputs), "delegates": compiled.delegates})
        print(f"{name}: {pte.stat().st_size:,} bytes, delegates {compiled.delegates}"
              f"{', device-resident I/O' if device_io else ''}")
    for index, (name, (factory, kwargs, features, (lo, hi), precision, rtol)) in enumerate(DYNAMIC_CASES.items()):
        torch.manual_seed(300 + index)
        model = build(factory, **kwargs).eval()
        batch = torch.export.Dim("batch", min=lo, max=hi)
        example = (torch.randn(hi, features),)
        program = torch.export.export(model, example, dynamic_shapes=({0: batch},))
        compiled = kiln.compile(program, enabled_precisions={getattr(torch, precision)}, target_sms=sms,
                                model_id=f"python-runtime-dynamic-{index}")
        pte = kiln.save(compiled, args.out / f"{name}.pte")
        torch.save(model.state_dict(), args.out / f"{name}.pt")
        compiled_sizes = _dynamic.buckets(lo, hi, ())
        between = next(b for b in range(lo, hi + 1) if b not in compiled_sizes)
        manifest.append({"name": name, "pte": pte.name, "weights": f"{name}.pt", "factory": factory,
                         "kwargs": kwargs, "features": features, "range": [lo, hi], "sizes": compiled_sizes,
                         "uncompiled": between, "rtol": rtol, "dynamic": True, "device_io": False,
                         "delegates": compiled.delegates})
        print(f"{name}: {pte.stat().st_size:,} bytes, delegates {compiled.delegates}, batch sizes {compiled_sizes}")
    (args.out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    total = sum(p.stat().st_size for p in args.out.iterdir())
    print(f"wrote {len(manifest)} models to {args.out} ({total / 2**20:.2f} MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
