"""CPU side of the SM-targets GPU test (tests/gpu/sm_targets_test.py): the same
small models exported for different `target_sms`, so the GPU machine sees
each way an engine's kernels can load:

  cubin     default targets (sm_80 ... sm_120 + PTX compute_80): the GPU's own
            cubin loads, no JIT line
  jit       target_sms=(80,): an sm_80 cubin and compute_80 PTX; an sm_90 GPU
            cannot run sm_80 machine code, so it JIT-compiles the PTX (one log
            line) and must still match PyTorch
  refused   target_sms=(100, 120): cubins and PTX (compute_100) all newer than
            sm_90: the load is refused with an error naming the GPU's SM and
            the engine's SMs

Each model's weights are saved (.pt) so the GPU machine rebuilds it and
computes PyTorch's outputs on fresh random inputs; manifest.json says what
to expect. The float16 attention model (default targets) runs the
tensor-core kernel planned for sm_80 on the GPU's sm_90 cubin. The models
are in tests/gpu/sm_targets_models.py. About 1 MiB in all.

    PYTHONPATH=python python3 tests/gpu/export_sm_targets.py --out .gpu_carry/sm_targets
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(ROOT / "tests" / "gpu"))
import kiln  # noqa: E402
from kiln._options import DEFAULT_TARGET_SMS  # noqa: E402

from sm_targets_models import CASES, MODELS  # noqa: E402


def engine_code(path: Path) -> list[dict]:
    """Each kernel module's cubin SMs and PTX arch, from the file itself."""
    from kiln.inspect import inspect_pte

    info = inspect_pte(path)
    return [{"sms": e["sms"], "ptx_sms": e["ptx_sms"]} for e in info["engines"]]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    manifest = []
    for index, (name, (model_name, shape, precision, sms, expect)) in enumerate(CASES.items()):
        torch.manual_seed(100 + index)
        model = MODELS[model_name]().eval()
        x = torch.randn(shape)
        # None: kiln's default targets, as a user gets them (one cubin per major).
        sms = tuple(sms) if sms else None
        compiled = kiln.compile(torch.export.export(model, (x,)), arg_inputs=(x,),
                                enabled_precisions={getattr(torch, precision)}, target_sms=sms,
                                model_id=f"sm-targets-{index}")
        if compiled.summary.ops_on_cpu:
            raise SystemExit(f"{name}: ops left to the CPU: {compiled.summary.ops_on_cpu}")
        path = kiln.save(compiled, args.out / f"{name}.pte")
        code = engine_code(path)
        if not any(e["sms"] or e["ptx_sms"] for e in code):
            raise SystemExit(f"{name}: no engine carries a kernel module; the test would prove nothing")
        torch.save(model.state_dict(), args.out / f"{name}.pt")
        manifest.append({
            "name": name, "pte": path.name, "weights": f"{name}.pt", "model": model_name,
            "input_shape": list(shape), "target_sms": list(sms or DEFAULT_TARGET_SMS), "expect": expect,
            # float32 engines compute in float32 (no TF32); float16 ones round.
            "rtol": 1e-4 if precision == "float32" else 2e-2, "code": code,
        })
        print(f"{name}: target_sms={sms} expect={expect} code={code}")
    (args.out / "manifest.json").write_text(json.dumps({"cases": manifest}, indent=1) + "\n")
    total = sum(f.stat().st_size for f in args.out.iterdir())
    print(f"wrote {len(manifest)} cases to {args.out} ({total / 2**20:.2f} MiB)")


if __name__ == "__main__":
    main()
