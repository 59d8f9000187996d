#!/usr/bin/env python3
"""Is a float16 difference made where it shows, or carried in and amplified?

Takes draws that `gpu_coverage.py --dump` kept for a prefix model ("<model>.stage<k>[.<j>]",
docs/coverage.md, "Bisecting"): the input, the float32 model's output, PyTorch's float16
output and Kiln's. Runs the rest of the whole model EXACTLY (float32, on the float16 weights,
as the coverage's reference does) on each of those outputs, sub-layer by sub-layer, and prints
each one's norm-relative distance from the float32 run after every step. When Kiln's prefix
output, carried through the exact rest, already lands as far off as Kiln's whole-model run
did, the rest of the model amplified a difference that was there at the cut; Kiln's own
arithmetic after the cut is not the cause.

    python3 tools/coverage/propagate_error.py dump/maxvit_t.stage3_float16_3853808784.pt
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import zoo  # noqa: E402

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


def parse_dump_name(path: Path) -> tuple[str, str, int]:
    """("maxvit_t.stage3", "float16", 3853808784) for maxvit_t.stage3_float16_3853808784.pt."""
    parts = path.stem.rsplit("_", 2)
    if len(parts) != 3 or parts[1] not in DTYPES or not parts[2].isdigit():
        raise ValueError(f"{path.name}: expected <model>_<dtype>_<input seed>.pt (gpu_coverage.py --dump)")
    return parts[0], parts[1], int(parts[2])


def propagate(dump: dict, name: str, dtype: str, weight_seed: int = zoo.DEFAULT_SEED) -> list[dict]:
    """[{step, kiln, torch, check}] after each step of the exact rest of the
    model: the distance of Kiln's and PyTorch's carried outputs from the carried
    float32 one; `check` (last row) is the carried float32 output's distance from
    the whole model run on the dumped input, which should be ~0."""
    base, stages, sublayers = zoo.split_prefix(name)
    if not stages:
        raise ValueError(f"'{name}' is a whole model; propagate a prefix (<model>{zoo.PREFIX_SEP}<k>)")
    model, _ = zoo.build(base, DTYPES[dtype], seed=weight_seed)
    model = model.float().eval()
    ref = dump["float32"][0].float()
    carried = {"kiln": dump["kiln"][0].float().reshape(ref.shape)}
    if dump.get("torch"):
        carried["torch"] = dump["torch"][0].float()
    rows = [{"step": f"{name} (the cut)"} | {k: zoo.rel_err(v, ref) for k, v in carried.items()}]
    with torch.no_grad():
        for step, module in zoo.suffix_steps(model, stages, sublayers):
            ref = module(ref)
            carried = {k: module(v) for k, v in carried.items()}
            rows.append({"step": step} | {k: zoo.rel_err(v, ref) for k, v in carried.items()})
        whole = model(dump["input"].float())
    rows[-1]["check"] = zoo.rel_err(ref, whole)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dumps", nargs="+", type=Path, help="files from gpu_coverage.py --dump, of prefix models")
    p.add_argument("--weight-seed", type=int, default=zoo.DEFAULT_SEED, help="the manifest's model seed")
    args = p.parse_args(argv)
    for path in args.dumps:
        name, dtype, input_seed = parse_dump_name(path)
        rows = propagate(torch.load(path), name, dtype, args.weight_seed)
        print(f"== {name} {dtype}, input seed {input_seed}: distance from the float32 run, "
              f"each result carried through the exact rest of {zoo.split_prefix(name)[0]}")
        for r in rows:
            torch_part = f"  PyTorch {dtype} {r['torch']:.3e}" if "torch" in r else ""
            print(f"  {r['step']:<28} Kiln {r['kiln']:.3e}{torch_part}")
        print(f"  (check: the carried float32 run against the whole model: {rows[-1]['check']:.1e})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
