#!/usr/bin/env python3
"""Exports three small MLPs to Kiln .pte files, with inputs and PyTorch
reference outputs for kiln_runner:

  mlp_fp32          Linear/GELU/Linear/ReLU/Linear, fully delegated
  mlp_fp16          the same model in float16
  mlp_fp32_in_fp16  the float32 model compiled with enabled_precisions={float16}
                    (float32 inputs/outputs, float16 inside the engine)
  mlp_cpu_op_fp32   flip in the middle: two delegates around a CPU op
  chain8_fp32       Linear/GELU/Linear and flip, 8 times: 8+ engines
                    (batch 2048, so each engine's arena is big enough to see
                    what the shared activation scratch saves)

For each NAME it writes DIR/NAME.pte, DIR/NAME.inputs.ktensors and
DIR/NAME.expected.ktensors, plus DIR/NAME.state_dict.pt and DIR/manifest.json
(chain8_fp32: DIR/manifest_runtime.json) so the GPU tests
(tests/gpu/run_gpu_tests.py) can rebuild the same PyTorch
module and compare on fresh inputs. Runs on a machine without a GPU.

    PYTHONPATH=python python examples/export_mlp.py --out /tmp/kiln-mlp [--batch 8]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "python"))
sys.path.insert(0, str(HERE))
import kiln  # noqa: E402
import sample_models  # noqa: E402


def reference(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """PyTorch CPU output. Low-precision models are evaluated in float32 on
    their (already rounded) weights and inputs, then cast back, so the
    reference is not itself degraded by CPU fp16 arithmetic."""
    with torch.no_grad():
        if x.dtype == torch.float32:
            return model(x)
        exact = copy.deepcopy(model).float()(x.float())
        return exact.to(x.dtype)


def export_one(out: Path, name: str, factory: str, model_dtype: torch.dtype, x: torch.Tensor,
               precisions, rtol: float, manifest: list, weights_of: str | None = None) -> None:
    """`weights_of`: reuse the weights (and the saved state dict) of an
    earlier model of the same architecture, so the GPU bundle stays small."""
    model = sample_models.build(factory).to(model_dtype).eval()
    if weights_of is not None:
        model.load_state_dict(torch.load(out / f"{weights_of}.state_dict.pt"))
    ep = torch.export.export(model, (x,))
    compiled = kiln.compile(ep, arg_inputs=(x,), enabled_precisions=precisions)
    pte = kiln.save(compiled, out / f"{name}.pte")
    expected = reference(model, x)
    kiln.tensor_file.save(out / f"{name}.inputs.ktensors", [x])
    kiln.tensor_file.save(out / f"{name}.expected.ktensors", [expected])
    state_dict = f"{weights_of or name}.state_dict.pt"
    if weights_of is None:
        torch.save(model.state_dict(), out / state_dict)
    dtype_name = str(model_dtype).replace("torch.", "")
    manifest.append({
        "name": name, "pte": pte.name, "state_dict": state_dict, "factory": factory,
        "model_dtype": dtype_name, "inputs": [[list(x.shape), str(x.dtype).replace("torch.", "")]],
        "rtol": rtol, "delegates": compiled.delegates,
    })
    # (the partition summary line was already printed by the partitioner)
    print(f"{name}: delegates {compiled.delegates}; wrote {pte} ({pte.stat().st_size:,} bytes)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path, help="output directory")
    parser.add_argument("--batch", type=int, default=8, help="batch size (default 8)")
    args = parser.parse_args(argv)
    if args.batch < 1:
        parser.error("--batch must be >= 1")
    args.out.mkdir(parents=True, exist_ok=True)

    # A fresh seed each run (printed, so a failing run can be reproduced).
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"seed: {seed}")
    torch.manual_seed(seed)

    manifest: list = []
    f32, f16 = {torch.float32}, {torch.float16}
    export_one(args.out, "mlp_fp32", "Mlp", torch.float32, torch.randn(args.batch, 512), f32, 1e-5, manifest)
    export_one(args.out, "mlp_fp16", "Mlp", torch.float16, torch.randn(args.batch, 512).half(), f16, 1e-2,
               manifest)
    export_one(args.out, "mlp_fp32_in_fp16", "Mlp", torch.float32, torch.randn(args.batch, 512), f16, 1e-2,
               manifest,
               weights_of="mlp_fp32")
    export_one(args.out, "mlp_cpu_op_fp32", "MlpWithCpuOp", torch.float32, torch.randn(args.batch, 512), f32,
               1e-5, manifest)
    (args.out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    # The runtime-feature models get a manifest of their own
    # (tests/gpu/runtime_features_test.py; run_gpu_tests.py reads manifest*.json).
    runtime_manifest: list = []
    export_one(args.out, "chain8_fp32", "LinearCpuOpChain", torch.float32, torch.randn(2048, 256),
               f32, 1e-4, runtime_manifest)
    (args.out / "manifest_runtime.json").write_text(json.dumps(runtime_manifest, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
