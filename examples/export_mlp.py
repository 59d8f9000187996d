#!/usr/bin/env python3
"""Exports three small MLPs to Kiln .pte files, with inputs and PyTorch
reference outputs for kiln_runner:

  mlp_fp32         Linear/GELU/Linear/ReLU/Linear, fully delegated
  mlp_fp16         the same in float16
  mlp_cumsum_fp32  cumsum between two Linears: two delegates around a CPU op

For each NAME it writes DIR/NAME.pte, DIR/NAME.inputs.ktensors and
DIR/NAME.expected.ktensors. Runs on a machine without a GPU.

    PYTHONPATH=python python examples/export_mlp.py --out /tmp/kiln-mlp [--batch 8]
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "python"))
import kiln  # noqa: E402


class MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(512, 1024)
        self.fc2 = torch.nn.Linear(1024, 1024)
        self.fc3 = torch.nn.Linear(1024, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.nn.functional.gelu(self.fc1(x))
        x = torch.relu(self.fc2(x))
        return self.fc3(x)


class CumsumMLP(torch.nn.Module):
    """cumsum is not supported by Kiln, so it stays on ExecuTorch's CPU
    kernels and splits the model into two Kiln delegates."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(512, 256)
        self.fc2 = torch.nn.Linear(256, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.fc1(x))
        x = torch.cumsum(x, dim=-1)
        return self.fc2(x)


def reference(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """PyTorch CPU output. Low-precision models are evaluated in float32 on
    their (already rounded) weights and inputs, then cast back, so the
    reference is not itself degraded by CPU fp16 arithmetic."""
    with torch.no_grad():
        if x.dtype == torch.float32:
            return model(x)
        exact = copy.deepcopy(model).float()(x.float())
        return exact.to(x.dtype)


def export_one(out: Path, name: str, model: torch.nn.Module, x: torch.Tensor, precisions) -> None:
    model.eval()
    ep = torch.export.export(model, (x,))
    compiled = kiln.compile(ep, arg_inputs=(x,), enabled_precisions=precisions)
    pte = kiln.save(compiled, out / f"{name}.pte")
    expected = reference(model, x)
    kiln.tensor_file.save(out / f"{name}.inputs.ktensors", [x])
    kiln.tensor_file.save(out / f"{name}.expected.ktensors", [expected])
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

    x32 = torch.randn(args.batch, 512)
    export_one(args.out, "mlp_fp32", MLP(), x32, {torch.float32})

    # Same input distribution, rounded to fp16 for the fp16 model.
    x16 = torch.randn(args.batch, 512).half()
    export_one(args.out, "mlp_fp16", MLP().half(), x16, {torch.float16})

    xc = torch.randn(args.batch, 512)
    export_one(args.out, "mlp_cumsum_fp32", CumsumMLP(), xc, {torch.float32})
    return 0


if __name__ == "__main__":
    sys.exit(main())
