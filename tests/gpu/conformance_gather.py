"""Gather and integer conformance models for the GPU tests (embedding,
index_select, gather, index.Tensor, integer compare / cast / bitwise chains,
a constant-folded causal mask), exported by export_conformance.py in
float32, float16 and bfloat16 and compared on the GPU against the float32
model. PyTorch only.

The suite draws float inputs (randn), so the indices are computed inside the
model from them with comparisons (exact in every dtype: the same input
value lands on the same side of a threshold in the reference and in Kiln):
  ids = (x > t0) + 2 (x > t1) + 4 (x < t2) ...  (bool -> int64 casts, integer adds)
which keeps them in range (PyTorch raises on an out-of-range index; Kiln
clamps, see src/ops/gather_ops.h). Every index tensor therefore lives inside
the engine as an int64 (or int32) intermediate; tests/python/test_gather.py
covers int64 engine inputs (token ids, an attention mask) at compile level.
"""

import torch
from torch import nn


def _bucket(x, thresholds):
    """int64 in [0, 2 ** len(thresholds)): bit k is (x > thresholds[k])."""
    ids = (x > thresholds[0]).to(torch.int64)
    for k, t in enumerate(thresholds[1:], start=1):
        ids = ids + (x > t).to(torch.int64) * (1 << k)
    return ids


class Embedding(nn.Module):
    """Token ids of shape [2, 24] into a [16, 64] table: rows of 256 bytes
    (float32) or 128 bytes (float16, bfloat16), copied in 16-byte vectors."""

    def __init__(self, vocab=16, dim=64):
        super().__init__()
        self.table = nn.Embedding(vocab, dim)
        with torch.no_grad():
            self.table.weight.normal_()

    def forward(self, x):
        ids = _bucket(x, (0.0, -0.7, 0.7, 1.2))
        return self.table(ids)


class EmbeddingOddRow(nn.Module):
    """A row of 5 elements (20 bytes in float32, 10 in float16): the kernel
    falls back from 16-byte vectors to 4-byte units or single elements."""

    def __init__(self):
        super().__init__()
        self.table = nn.Embedding(8, 5)
        with torch.no_grad():
            self.table.weight.normal_()

    def forward(self, x):
        return self.table(_bucket(x, (0.0, 1.0, -1.0))) * 2.0


class IndexSelect(nn.Module):
    """index_select along a middle dim with a computed 1-D index, and the
    same along the last dim (no contiguous block: element by element)."""

    def forward(self, x, y):
        idx = _bucket(y, (0.0, 0.5, -0.5))  # [12] in [0, 8)
        last = _bucket(y[:5], (0.0, 0.5))     # [5] in [0, 4)
        return torch.index_select(x, 1, idx) + 1.0, torch.index_select(x, 2, last)


class Gather(nn.Module):
    """torch.gather along dim 1 and dim 0 (index smaller than the input)."""

    def forward(self, x, y):
        rows = _bucket(y, (0.0, 0.6, -0.6))  # [4, 6, 5] in [0, 8)
        batch = _bucket(y, (0.3, -0.3))      # [4, 6, 5] in [0, 4)
        return torch.gather(x, 1, rows), torch.gather(x, 0, batch)


class AdvancedIndex(nn.Module):
    """x[i, j] with two broadcast index tensors, and a parameter table read
    by a computed index (a relative position bias whose index is not
    constant)."""

    def __init__(self):
        super().__init__()
        self.table = nn.Parameter(torch.randn(8, 3))

    def forward(self, x, y):
        i = _bucket(y[:, :1], (0.0, -0.8))           # [5, 1] in [0, 4)
        j = _bucket(y[0], (0.0, 0.5, -0.5))          # [6] in [0, 8)
        picked = x[i, j]                              # [5, 6, 7]
        bias = self.table[j]                          # [6, 3]
        return picked * 0.5, bias


class IntegerChain(nn.Module):
    """Integer arithmetic, bitwise ops, exact integer comparisons, casts
    int -> float -> bool -> int, where and masked_fill on int64."""

    def forward(self, x, y):
        a = _bucket(x, (0.0, 0.5, -0.5, 1.0))        # [0, 16)
        b = _bucket(y, (0.0, -1.0, 1.0))             # [0, 8)
        s = a * 3 - b + 7                            # int64 arithmetic
        bits = (a & b) | (a ^ (b + 5))
        keep = (s >= b) & (bits != 3) | (a == b)
        picked = torch.where(keep, s, -s)
        masked = picked.masked_fill(a > 12, 100)
        return masked.to(x.dtype) * 0.25 + x, (masked.float() > 4.0).to(torch.int64).to(x.dtype)


class CausalMask(nn.Module):
    """A causal mask built from arange and compare (folded at export into a
    constant) applied with where, as decoder attention does."""

    def forward(self, x):
        n = x.shape[-1]
        positions = torch.arange(n, device=x.device)  # the GPU reference runs on cuda
        causal = positions[None, :] <= positions[:, None]
        return x.masked_fill(~causal, -3.0)


FACTORIES = {
    "Embedding": Embedding,
    "EmbeddingOddRow": EmbeddingOddRow,
    "IndexSelect": IndexSelect,
    "Gather": Gather,
    "AdvancedIndex": AdvancedIndex,
    "IntegerChain": IntegerChain,
    "CausalMask": CausalMask,
}

CASES = {
    "Embedding": [(2, 24)],
    "EmbeddingOddRow": [(3, 7)],
    "IndexSelect": [(4, 8, 6), (12,)],
    "Gather": [(4, 8, 5), (4, 6, 5)],
    "AdvancedIndex": [(4, 8, 7), (5, 6)],
    "IntegerChain": [(6, 9), (6, 9)],
    "CausalMask": [(2, 3, 16, 16)],
}
