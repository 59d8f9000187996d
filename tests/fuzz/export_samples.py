#!/usr/bin/env python3
"""Exports the small .pte files that the reliability tests damage on purpose:

  tiny_mlp        Linear/GELU/Linear, one engine
  tiny_two_engine Linear/ReLU, flip (left on the CPU), Linear/sigmoid: two engines
  tiny_conv       Conv2d+BN+ReLU, depthwise conv, pooling, Linear: one engine with cuDNN
                  and generated kernels
  tiny_mlp_fp16   tiny_mlp computing in float16 inside the engine

For each NAME it writes DIR/NAME.pte, DIR/NAME.inputs.ktensors and
DIR/NAME.expected.ktensors (PyTorch's CPU output) and DIR/samples.json listing
them with the tolerance to compare with. Used by the CPU fuzz harness
(scripts/fuzz.sh, tests/fuzz/) and by the GPU campaign
(scripts/gpu_reliability.sh, tests/gpu/reliability_campaign.py). Runs without a
GPU; weights are small so the files stay a few tens of KiB. Deterministic
(fixed seed), so the fuzz cases are the same from run to run.

    PYTHONPATH=python python3 tests/fuzz/export_samples.py --out build-fuzz/samples
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))
import kiln  # noqa: E402


class TinyMlp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 32)
        self.fc2 = torch.nn.Linear(32, 8)

    def forward(self, x):
        return self.fc2(torch.nn.functional.gelu(self.fc1(x)))


class TinyTwoEngine(torch.nn.Module):
    """flip is not taken by the compiler: engine, CPU op, engine."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 24)
        self.fc2 = torch.nn.Linear(24, 8)

    def forward(self, x):
        x = torch.relu(self.fc1(x))
        x = torch.flip(x, dims=[-1])
        return torch.sigmoid(self.fc2(x))


class TinyConv(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.dw = torch.nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x):
        x = torch.relu(self.bn(self.conv(x)))
        x = torch.nn.functional.silu(self.dw(x))
        x = torch.nn.functional.max_pool2d(x, 2)
        x = torch.nn.functional.adaptive_avg_pool2d(x, 1).flatten(1)
        return self.fc(x)


def samples():
    """(name, model, input, enabled precisions, rtol) for each sample."""
    f32, f16 = {torch.float32}, {torch.float16}
    yield "tiny_mlp", TinyMlp(), torch.randn(4, 16), f32, 1e-5
    yield "tiny_two_engine", TinyTwoEngine(), torch.randn(4, 16), f32, 1e-5
    yield "tiny_conv", TinyConv(), torch.randn(2, 3, 8, 8), f32, 1e-4
    yield "tiny_mlp_fp16", TinyMlp(), torch.randn(4, 16), f16, 1e-2


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path, help="output directory")
    parser.add_argument("--only", nargs="*", help="names to export (default: all)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(13)
    listed = []
    for name, model, x, precisions, rtol in samples():
        if args.only and name not in args.only:
            continue
        model = model.eval()
        if hasattr(model, "bn"):  # non-trivial running statistics, folded at export
            with torch.no_grad():
                model.bn.running_mean.uniform_(-0.5, 0.5)
                model.bn.running_var.uniform_(0.5, 2.0)
        exported = torch.export.export(model, (x,))
        compiled = kiln.compile(exported, arg_inputs=(x,), enabled_precisions=precisions,
                                min_block_size=1)
        pte = kiln.save(compiled, args.out / f"{name}.pte")
        with torch.no_grad():
            expected = model(x)
        kiln.tensor_file.save(args.out / f"{name}.inputs.ktensors", [x])
        kiln.tensor_file.save(args.out / f"{name}.expected.ktensors", [expected])
        listed.append({"name": name, "pte": pte.name, "inputs": f"{name}.inputs.ktensors",
                       "expected": f"{name}.expected.ktensors", "rtol": rtol,
                       "delegates": compiled.delegates})
        print(f"{name}: delegates {compiled.delegates}; {pte} ({pte.stat().st_size:,} bytes)")
    (args.out / "samples.json").write_text(json.dumps(listed, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
