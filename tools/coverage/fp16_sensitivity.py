"""How far can any float16 run of a coverage model land from its float32 reference?

The coverage's float16 bar (norm-relative error <= 1e-2 against PyTorch's float32 run of the
same float16 weights and inputs, tools/coverage/gpu_coverage.py) assumes the model tolerates
float16's rounding. This measures that on the CPU, with no float16 arithmetic at all: the
model runs in float32 on the coverage's seeded float16 weights, and

  * "rounded": every leaf module's output is rounded to float16 (the least rounding a float16
    run does: each stored activation), the rest exact;
  * "input ulp": the float16 input moved by one part in 2^11 (about one float16 ulp, random
    sign per element), nothing rounded.

Both are compared with the exact float32 output, over several input draws. A model whose
"rounded" error passes 1e-2 on some draws cannot meet the bar on them with any float16
implementation; "input ulp" shows how much the model amplifies a perturbation that size.

    PYTHONPATH=python python3 tools/coverage/fp16_sensitivity.py maxvit_t --draws 12
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import zoo  # noqa: E402


def sensitivity(name: str, draws: int, seed: int = zoo.DEFAULT_SEED, first_input_seed: int = 1000) -> list[dict]:
    model, _ = zoo.build(name, torch.float16, seed=seed)
    exact = copy.deepcopy(model).float().eval()
    del model
    rounding = {"on": False}

    def round_output(_module, _inputs, out):
        if rounding["on"] and torch.is_tensor(out) and out.is_floating_point():
            return out.half().float()
        return out

    for m in exact.modules():
        if next(m.children(), None) is None:
            m.register_forward_hook(round_output)
    results = []
    for d in range(draws):
        g = torch.Generator().manual_seed(first_input_seed + d)
        x = zoo.example_input(torch.float16, seed=first_input_seed + d).float()
        sign = torch.randint(0, 2, x.shape, generator=g).float() * 2 - 1
        with torch.no_grad():
            want = zoo.flatten_outputs(exact(x))
            rounding["on"] = True
            rounded = zoo.flatten_outputs(exact(x))
            rounding["on"] = False
            moved = zoo.flatten_outputs(exact(x * (1 + sign * 2.0**-11)))
        results.append({
            "input_seed": first_input_seed + d,
            "rounded": max(zoo.rel_err(a, b) for a, b in zip(rounded, want)),
            "input_ulp": max(zoo.rel_err(a, b) for a, b in zip(moved, want)),
        })
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", help="a coverage model name (tools/coverage/zoo.py), e.g. maxvit_t or maxvit_t.stage2")
    p.add_argument("--draws", type=int, default=6)
    p.add_argument("--seed", type=int, default=zoo.DEFAULT_SEED, help="weight seed (the coverage's default)")
    p.add_argument("--json", type=Path, help="also write the per-draw results here")
    a = p.parse_args(argv)
    try:
        zoo.kind_of(a.model)  # a zoo model, or a stage prefix of one
    except ValueError as e:
        print(f"fp16_sensitivity: {e}", file=sys.stderr)
        return 2
    results = sensitivity(a.model, a.draws, a.seed)
    for r in results:
        print(f"{a.model} input seed {r['input_seed']}: leaf outputs rounded to float16 {r['rounded']:.2e}, "
              f"input moved 2^-11 {r['input_ulp']:.2e}")
    rounded = [r["rounded"] for r in results]
    over = sum(v > 1e-2 for v in rounded)
    print(f"{a.model}: rounded median {statistics.median(rounded):.2e}, max {max(rounded):.2e}; "
          f"{over} of {len(rounded)} draws over 1e-2")
    if a.json:
        a.json.write_text(json.dumps({"model": a.model, "seed": a.seed, "draws": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
