"""The common-subexpression pass (src/passes/common_subexpressions.cpp):
work a model repeats with the same inputs (Hugging Face BERT rebuilds its
additive attention mask in every layer, each from its own lifted scalar
constants) is computed once, and the result still matches PyTorch's graph."""

import torch
from torch import nn

import kiln

from _helpers import export


class RepeatedMask(nn.Module):
    def __init__(self, layers=3):
        super().__init__()
        self.linears = nn.ModuleList(nn.Linear(16, 16) for _ in range(layers))

    def forward(self, x, keep):
        for lin in self.linears:
            bias = (1.0 - (keep > 0).to(x.dtype)) * torch.finfo(x.dtype).min  # the same in every layer
            x = lin(x) + bias
        return x


def _pass_dump(tmp_path, name):
    dumps = sorted(tmp_path.glob(f"partition_*/*_{name}.txt"))
    assert dumps, f"no {name} dump under {tmp_path}"
    return dumps[-1].read_text()


def test_repeated_mask_is_computed_once(tmp_path):
    model = RepeatedMask().eval()
    x, keep = torch.randn(2, 16), torch.randn(2, 16)
    kiln.compile(export(model, x, keep), debug_dir=tmp_path)
    before = _pass_dump(tmp_path, "fold_constants")
    after = _pass_dump(tmp_path, "common_subexpressions")
    count = lambda text, op: sum(f"= {op}(" in line for line in text.splitlines())
    assert count(before, "aten.gt.Scalar") == 3 and count(before, "aten.mul.Tensor") == 3
    assert count(after, "aten.gt.Scalar") == 1 and count(after, "aten.mul.Tensor") == 1
    assert count(after, "aten.linear.default") == 3  # different weights: nothing merged


def test_different_attributes_are_not_merged(tmp_path):
    class TwoSums(nn.Module):
        def forward(self, x):
            return x.sum(dim=0) + x.sum(dim=1)

    x = torch.randn(8, 8)
    kiln.compile(export(TwoSums().eval(), x), debug_dir=tmp_path)
    after = _pass_dump(tmp_path, "common_subexpressions")
    assert sum("aten.sum.dim_IntList(" in line for line in after.splitlines()) == 2
