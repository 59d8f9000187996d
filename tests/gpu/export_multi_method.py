"""CPU side of the multi-method GPU test (tests/gpu/multi_method_test.py):
exports two models of the same architecture and state-dict names but other
weights (A and B, seeds 1 and 2), each as ONE .pte with the methods "prefill"
and "decode" sharing their weights, once with the weights inside and once
with them in a .ptd; and their state dicts, so the GPU machine rebuilds the
PyTorch models. Both are exported with the SAME model id, the worst case for
key collisions: only the content hash in the keys tells their weights apart
(and the runtime's size + hash check backs it).

    PYTHONPATH=python python3 tests/gpu/export_multi_method.py --out .gpu_carry/multi_method
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
from kiln.inspect import inspect_pte  # noqa: E402
import multi_method_models as mm  # noqa: E402

MODEL_ID = "mm-test"  # given to both models on purpose


def export_model(name: str, seed: int, out: Path) -> dict:
    block = mm.make_block(seed)
    programs = {method: torch.export.export(module, (torch.randn(*mm.SHAPES[method]),))
                for method, module in mm.methods(block).items()}
    compiled = kiln.compile(programs, model_id=MODEL_ID)
    kiln.save(compiled, out / f"{name}.pte")
    kiln.save(compiled, out / f"{name}_ext.pte", external_weights=out / f"{name}_ext.ptd")
    torch.save(block.state_dict(), out / f"{name}.pt")
    info = inspect_pte(out / f"{name}.pte")
    keys = {n["key"] for e in info["engines"] for n in e["named_weights"]}
    per_method = {m: len({n["key"] for e in info["engines"] if e["method"] == m for n in e["named_weights"]})
                  for m in programs}
    assert set(info["delegates"]) == set(programs), info["delegates"]
    assert all(d == ["KilnBackend"] for d in info["delegates"].values()), info["delegates"]
    return {"seed": seed, "keys": sorted(keys), "keys_per_method": per_method,
            "weight_bytes": sum(n["nbytes"] for n in {n["key"]: n for e in info["engines"]
                                                      for n in e["named_weights"]}.values())}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    manifest = {"model_id": MODEL_ID, "shapes": mm.SHAPES, "rtol": 1e-5,
                "models": {"a": export_model("a", 1, args.out), "b": export_model("b", 2, args.out)}}
    a, b = manifest["models"]["a"], manifest["models"]["b"]
    assert not set(a["keys"]) & set(b["keys"]), "A and B must not share a key"
    (args.out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    for p in sorted(args.out.iterdir()):
        print(f"{p.name}: {p.stat().st_size:,} bytes")


if __name__ == "__main__":
    main()
