"""CPU side of the engine-state GPU test (tests/gpu/state_test.cpp): a model
with a KV-cache-like buffer updated in place at a position input is exported
(fp32) and PyTorch runs the same sequence of steps on the CPU, writing each
step's inputs and expected output (.ktensors). Every step's output reads the
whole cache, so it depends on every earlier step's update: the test fails
unless the engine keeps its state on the GPU between executions and updates
it in place.

    PYTHONPATH=python python3 tests/gpu/export_state_test.py --out .gpu_carry/state
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
from kiln import tensor_file  # noqa: E402

STEPS = 12


class Decoder(torch.nn.Module):
    """One attention head over a 32-slot cache: writes k/v at `pos`, attends
    over every slot (empty slots hold zeros, as the cache starts)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("k_cache", torch.zeros(1, 4, 32, 16))
        self.register_buffer("v_cache", torch.zeros(1, 4, 32, 16))
        self.qkv = torch.nn.Linear(16, 48)

    def forward(self, x, pos):
        q, k, v = self.qkv(x).split(16, dim=-1)
        self.k_cache.index_copy_(2, pos, k)
        self.v_cache[:, :, pos] = v
        scores = q @ self.k_cache.transpose(-1, -2) * 0.25
        return torch.softmax(scores, -1) @ self.v_cache


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(7)
    model = Decoder().eval()
    example = (torch.randn(1, 4, 1, 16), torch.tensor([0]))
    exported = torch.export.export(model, example)
    compiled = kiln.compile(exported, arg_inputs=example, model_id="state-test")
    if compiled.summary.ops_on_cpu:
        raise SystemExit(f"ops left to the CPU: {compiled.summary.ops_on_cpu}")
    kiln.save(compiled, args.out / "decoder.pte")
    # The exported program does not mutate `model`'s buffers: run the eager
    # model (fresh caches) through the same steps.
    reference = Decoder().eval()
    reference.load_state_dict({k: v for k, v in model.state_dict().items() if "cache" not in k}, strict=False)
    positions = [0, 1, 2, 5, 3, 31, 1, 7, 8, 9, 2, 30][:STEPS]
    generator = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for t, p in enumerate(positions):
            x = torch.randn(1, 4, 1, 16, generator=generator)
            pos = torch.tensor([p])
            y = reference(x, pos)
            tensor_file.save(args.out / f"step_{t}.inputs.ktensors", [x, pos])
            tensor_file.save(args.out / f"step_{t}.expected.ktensors", [y])
    (args.out / "manifest.json").write_text(json.dumps({"pte": "decoder.pte", "steps": len(positions),
                                                        "rtol": 1e-5}, indent=1))
    print(f"wrote {args.out}: decoder.pte and {len(positions)} steps")


if __name__ == "__main__":
    main()
