"""Scan conformance models for the GPU tests: torch.cumsum over the last dim
and over a middle dim (float), and RoBERTa's position ids (an integer cumsum
of the padding mask, then the position embedding). Exported by
export_conformance.py in float32, float16 and bfloat16 and compared on the
GPU against the float32 model. PyTorch only.

Tolerances (export_conformance.py's: 1e-5 for float32, 1e-2 for float16
and bfloat16, as a relative error of the whole output; integer outputs must
match exactly). Kiln sums a float line in float in index order and rounds
each element once to the output dtype; the reference is the float32 model
on the same (rounded) inputs, rounded to the dtype at the end. So in
float32 the two differ by summation order alone, about sqrt(length) *
2^-24 relative (under 1e-6 for a line of 256); in float16/bfloat16 by that
plus the rounding of what Kiln stores between kernels (the cumsum's
output before the add after it): a step of the dtype on some elements, far
inside 1e-2. Lines are kept to 96 and 256 elements: short enough that float's own
rounding stays far from 1e-5, long enough that a kernel summing in the
storage dtype instead would fail in bfloat16 (8 significant bits: each of
256 additions rounds by up to 2^-9 of the running sum, adding up to a few
percent).
"""

import torch
from torch import nn


class CumsumLast(nn.Module):
    """cumsum over the last dim (lines of 256, one thread each), with
    elementwise work before and after it (separate fused kernels)."""

    def forward(self, x):
        return torch.cumsum(x * 0.5, dim=-1) + x


class CumsumMiddle(nn.Module):
    """cumsum over a middle dim (lines of 96, consecutive threads reading
    consecutive addresses) and over the same dim spelled negatively."""

    def forward(self, x):
        return torch.cumsum(x, dim=1), torch.cumsum(torch.relu(x), dim=-2)


class PositionIds(nn.Module):
    """RoBERTa's create_position_ids_from_input_ids and the position
    embedding it feeds. Token ids come from the float input as floor(4x)
    (exact in every dtype: a power-of-two scale, then floor), so about one
    position in ten is padding (id 1 = padding_idx). The position ids are
    returned as int64 (compared exactly) and through the embedding table."""

    def __init__(self, max_positions=160, dim=32, padding_idx=1):
        super().__init__()
        self.padding_idx = padding_idx
        self.positions = nn.Embedding(max_positions, dim, padding_idx=padding_idx)
        with torch.no_grad():
            self.positions.weight.normal_()

    def forward(self, x):
        input_ids = torch.floor(x * 4.0).to(torch.int64)
        mask = input_ids.ne(self.padding_idx).int()
        incremental = (torch.cumsum(mask, dim=1).type_as(mask)) * mask
        position_ids = incremental.long() + self.padding_idx
        return position_ids, self.positions(position_ids)


class CumsumToInteger(nn.Module):
    """cumsum's dtype conversions: a float mask counted into int32 (Mixtral's
    routing counts), and x * 2 truncated toward zero into int64 before the
    sum (exact in every dtype: a power-of-two scale of the rounded input),
    both compared exactly; the counts summed again as float32."""

    def forward(self, x):
        counts = torch.cumsum((x > 0).to(x.dtype), dim=-1, dtype=torch.int32)
        truncated = torch.cumsum(x * 2.0, dim=1, dtype=torch.int64)
        return counts, truncated, torch.cumsum(counts, dim=0, dtype=torch.float32)


FACTORIES = {
    "CumsumLast": CumsumLast,
    "CumsumMiddle": CumsumMiddle,
    "PositionIds": PositionIds,
    "CumsumToInteger": CumsumToInteger,
}

CASES = {
    "CumsumLast": [(6, 256)],
    "CumsumMiddle": [(3, 96, 20)],
    "PositionIds": [(2, 128)],
    "CumsumToInteger": [(4, 64)],
}
