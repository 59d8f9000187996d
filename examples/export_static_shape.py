#!/usr/bin/env python3
"""The minimal Kiln export: one static-shape model to one .pte, plus the
inputs and PyTorch's outputs to check it against on a GPU machine. Runs on
any machine (no GPU needed to export).

    PYTHONPATH=python python3 examples/export_static_shape.py --out out/static

writes out/static/model.pte, model.inputs.ktensors, model.expected.ktensors;
run it with examples/run_pte.py or kiln_runner.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
import kiln  # noqa: E402


class Classifier(torch.nn.Module):
    """Linear -> GELU -> Linear -> ReLU -> Linear: all taken by Kiln."""

    def __init__(self, features: int = 64, hidden: int = 128, classes: int = 10) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(features, hidden)
        self.fc2 = torch.nn.Linear(hidden, hidden)
        self.head = torch.nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.nn.functional.gelu(self.fc1(x))
        return self.head(torch.relu(self.fc2(x)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("out/static"), help="output directory")
    parser.add_argument("--batch", type=int, default=4, help="batch size baked into the program")
    parser.add_argument("--fp16", action="store_true", help="let the engine compute in float16")
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    model = Classifier().eval()
    x = torch.randn(args.batch, 64)
    # Static shapes: the engine is compiled for exactly this input shape.
    exported = torch.export.export(model, (x,))
    precisions = {torch.float16} if args.fp16 else {torch.float32}
    compiled = kiln.compile(exported, arg_inputs=(x,), enabled_precisions=precisions)
    pte = kiln.save(compiled, args.out / "model.pte")
    with torch.no_grad():
        expected = model(x)
    kiln.tensor_file.save(args.out / "model.inputs.ktensors", [x])
    kiln.tensor_file.save(args.out / "model.expected.ktensors", [expected])
    print(f"wrote {pte} ({pte.stat().st_size:,} bytes), delegates {compiled.delegates}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
