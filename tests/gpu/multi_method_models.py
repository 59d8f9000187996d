"""The two-method models of the multi-method GPU test (torch only, so the GPU
machine rebuilds them without Kiln or ExecuTorch): a residual MLP block run
as "prefill" on 16 rows and as "decode" on one row (with a tanh head), both
methods on the same weights."""

from __future__ import annotations

import torch
import torch.nn.functional as F

D, H = 256, 1024
PREFILL_ROWS, DECODE_ROWS = 16, 1


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(D)
        self.up = torch.nn.Linear(D, H)
        self.down = torch.nn.Linear(H, D)

    def forward(self, x):
        return x + self.down(F.gelu(self.up(self.norm(x))))


class Decode(torch.nn.Module):
    """The decode method: the same Block weights, one row, another head."""

    def __init__(self, block: Block) -> None:
        super().__init__()
        self.block = block

    def forward(self, x):
        return torch.tanh(self.block(x))


def methods(block: Block) -> dict[str, torch.nn.Module]:
    return {"prefill": block, "decode": Decode(block)}


SHAPES = {"prefill": (PREFILL_ROWS, D), "decode": (DECODE_ROWS, D)}


def make_block(seed: int) -> Block:
    torch.manual_seed(seed)
    block = Block().eval()
    with torch.no_grad():  # non-trivial norm parameters, so they matter
        block.norm.weight.uniform_(0.5, 1.5)
        block.norm.bias.normal_(0, 0.1)
    return block
