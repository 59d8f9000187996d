"""Conformance models for the elementwise ops added with the op registry
(softplus, mish, log1p, erf, pow, comparisons, where, masked_fill, ...), each
an output of one program; export_conformance.py exports them in float32,
float16 and bfloat16. PyTorch only."""

import torch
from torch import nn

F = torch.nn.functional


class MoreElementwise(nn.Module):
    def forward(self, x, y):
        small = x * 0.5
        positive = x.abs() + 0.25
        return (
            F.softplus(x), F.softplus(x, beta=2.0, threshold=1.0), F.mish(x), torch.log1p(positive),
            torch.expm1(small), torch.erf(x), F.leaky_relu(x, 0.1), F.elu(x), F.selu(x), F.celu(x, 0.5),
            positive ** 2, positive ** 0.5, positive ** 1.7, positive ** y.clamp(-1, 1), torch.square(x),
            torch.sin(x), torch.cos(x), torch.floor(x * 4), torch.ceil(x * 4), torch.round(x * 4), torch.trunc(x * 4),
            torch.sign(x), torch.log2(positive), torch.exp2(small),
        )


class MasksAndSelection(nn.Module):
    def forward(self, x, y):
        gt = x > y
        return (
            torch.where(gt, x, y), torch.where(x < 0.2, x * 2.0, -y), x.masked_fill(y > 0.5, -3.0),
            (x >= 0.0).float() + (y <= 0.1).float() + (x == x).float() - (x != y).float(),
            torch.where(gt & (y > 0), x, y) + torch.where(gt | (y > 1.0), x, 0.0),
            torch.where(~gt, x, y), (gt ^ (y > 0)).float(), (x == 0.5).float() + (x != 0.3).float(),
            torch.where(x >= y, x, y) + torch.where(x <= y, x, y) + torch.where(x < y, x, -y),
            torch.where(torch.logical_and(gt, y > 0) | torch.logical_or(gt, y < -1), x, y),
            torch.where(torch.logical_not(gt), x, y),
        )


FACTORIES = {"MoreElementwise": MoreElementwise, "MasksAndSelection": MasksAndSelection}
CASES = {"MoreElementwise": [[8, 64], [8, 64]], "MasksAndSelection": [[8, 64], [8, 64]]}
