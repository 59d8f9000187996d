"""Per-op conformance models for the GPU tests: every elementwise op and
layout op of the compiler's first slice, each as one output of a single
program, so one kiln_runner call compares every op against PyTorch.
PyTorch only: imported on the CPU machine (export) and the GPU machine
(reference)."""

import torch
from torch import nn


class ElementwiseOps(nn.Module):
    def __init__(self, features=64):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(features))
        self.scale = nn.Parameter(torch.rand(features) + 0.5)

    def forward(self, x, y):
        F = torch.nn.functional
        positive = x.abs() + 0.25
        return (
            x + y, x - 2.0 * y, x * y, x / (y.abs() + 0.5), -x,
            x + self.bias, (x - self.bias) * self.scale,          # broadcasting a [features] parameter
            x * 3.0 + 1.5, x / 4.0 - 0.5,                           # scalar operands
            torch.relu(x), F.gelu(x), F.gelu(x, approximate="tanh"), torch.sigmoid(x), torch.tanh(x),
            torch.exp(x * 0.5), F.hardswish(x * 4.0), F.hardsigmoid(x * 4.0), F.silu(x), F.relu6(x * 8.0),
            torch.clamp(x, -0.5, 0.25), torch.clamp(x, max=0.1), torch.sqrt(positive), torch.rsqrt(positive),
            torch.log(positive), torch.reciprocal(positive), torch.maximum(x, y), torch.minimum(x, y),
            torch.sigmoid(x + y) * torch.tanh(x - y) + F.gelu(x * y),  # one fused chain
            x.t(), x.reshape(4, -1, 8).permute(2, 0, 1),                # gathers
        ) + self.layout_and_reductions(x, y)

    def layout_and_reductions(self, x, y):
        a, b = torch.split(x, [24, 40], dim=1)
        images = x.reshape(2, 4, 8, 8)
        return (
            x[:, 3:17:2], x[2], x[:, -1], torch.cat([x, y * 2.0], dim=0), torch.cat([y, x], dim=1), a, b,
            x.narrow(1, 5, 10), x.unsqueeze(0).expand(3, 8, 64),
            x.mean(dim=[1], keepdim=True), x.sum(dim=-1), torch.amax(x, dim=0),
            images.mean(dim=[2, 3]), images.sum(dim=[1, 3], keepdim=True), torch.amax(images, dim=[0, 2]),
        )


FACTORIES = {"ElementwiseOps": ElementwiseOps}
