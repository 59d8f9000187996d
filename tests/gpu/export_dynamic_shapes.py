"""CPU side of the dynamic-shapes GPU test (tests/gpu/dynamic_shapes_test.py):
exports small models with a torch.export Dim on the sequence, each compiled
by Kiln as one engine per shape bucket (python/kiln/_dynamic.py), and writes
for several sequence lengths the inputs and PyTorch's outputs (fresh random
inputs, float32 references) as .ktensors for kiln_runner, plus the lengths
that must be refused: one inside the range that no variant was compiled for,
one below the range's min, one above its max (the planned shape: kiln_runner refuses it).

    PYTHONPATH=python python3 tests/gpu/export_dynamic_shapes.py --out .gpu_carry/dynamic_shapes
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.export import Dim

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))
import kiln  # noqa: E402
from kiln import tensor_file  # noqa: E402


class TableMix(torch.nn.Module):
    """Linear, a head split and merge, a gather from a position table, softmax,
    and the last row: every size op reads the dynamic length."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(16, 32)
        self.register_buffer("table", torch.randn(64, 32))

    def forward(self, x, pos):
        t = x.shape[1]
        y = self.proj(x).view(1, t, 4, 8).transpose(1, 2).reshape(1, t, 32)
        y = y + self.table[pos][None]
        return torch.softmax(y, -1)[:, -1]


class CausalBlock(torch.nn.Module):
    """A pre-norm transformer block with causal attention over the length."""

    def __init__(self, d=64, heads=4):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.qkv, self.out = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.up, self.down = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.out(a.transpose(1, 2).reshape(b, t, d))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


# Past the max, the runner refuses the input before ExecuTorch sees it: the
# program planned it at the max (kiln_runner names the planned shape and the file's).
PAST_PLANNED = r"input 0 is float16 \[1, 128, 64\], the file has float16 \[1, 200, 64\]"

# name: (model, dtype, (min, max), buckets, example builder, lengths run, lengths refused {length: why})
CASES = {
    "table_mix_fp32": (TableMix, torch.float32, (8, 64), None,
                       lambda t: (torch.randn(1, t, 16), torch.randint(0, 64, (t,))),
                       [8, 16, 64], {24: "was not compiled", 4: "outside the exported range"}),
    "causal_block_fp16": (CausalBlock, torch.float16, (2, 128), [2, 16, 48, 128],
                          lambda t: (torch.randn(1, t, 64),),
                          [2, 16, 48, 128], {32: "was not compiled", 200: PAST_PLANNED}),
}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--target-sms", default="90")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    sms = tuple(int(s) for s in args.target_sms.split(","))
    manifest = []
    for index, (name, (factory, dtype, (lo, hi), buckets, make, lengths, refused)) in enumerate(CASES.items()):
        torch.manual_seed(300 + index)
        model = factory().eval()
        example = make(hi)
        seq = Dim("seq", min=lo, max=hi)
        dims = tuple({1: seq} if t.dim() == 3 else {0: seq} for t in example)
        cast = lambda ts: tuple(t.to(dtype) if t.is_floating_point() else t for t in ts)  # noqa: E731
        program = torch.export.export(model.to(dtype), cast(example), dynamic_shapes=dims)
        compiled = kiln.compile(program, enabled_precisions={dtype}, target_sms=sms, shape_buckets=buckets,
                                model_id=f"dynamic-{index}")
        kiln.save(compiled, args.out / f"{name}.pte")
        runs = []
        for t in lengths + sorted(refused):
            inputs = cast(make(t))
            files = {"inputs": f"{name}_t{t}_in.ktensors"}
            tensor_file.save(args.out / files["inputs"], list(inputs))
            if t not in refused:
                with torch.no_grad():  # float32 reference from the same weights
                    ref = model.float()(*[x.float() if x.is_floating_point() else x for x in inputs])
                model.to(dtype)
                files["expected"] = f"{name}_t{t}_ref.ktensors"
                tensor_file.save(args.out / files["expected"], [ref.to(dtype)])
            runs.append({"length": t, **files, "refused": refused.get(t)})
        manifest.append({"name": name, "pte": f"{name}.pte", "dtype": str(dtype).removeprefix("torch."),
                         "range": [lo, hi], "runs": runs})
        print(f"{name}: {len(runs)} runs", flush=True)
    (args.out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
