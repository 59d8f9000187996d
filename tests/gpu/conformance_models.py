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


def _randomize_batch_norm(bn):
    """Non-trivial running statistics, so folding into the conv is tested."""
    with torch.no_grad():
        bn.running_mean.normal_(0.0, 0.5)
        bn.running_var.uniform_(0.5, 2.0)
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.normal_(0.0, 0.2)
    return bn


class ConvOps(nn.Module):
    """Convolutions on an [n, 16, 12, 12] input: groups, depthwise, stride 2,
    padding, dilation, bias/no bias, batch norm folding, residual + relu,
    1x1 (a GEMM) and conv + hardswish/silu (a kernel after the conv)."""

    def __init__(self, c=16):
        super().__init__()
        self.plain = nn.Conv2d(c, 24, 3, padding=1)
        self.no_bias_bn = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn = _randomize_batch_norm(nn.BatchNorm2d(c))
        self.grouped = nn.Conv2d(c, 32, 3, padding=1, groups=4)
        self.depthwise = nn.Conv2d(c, c, 3, padding=1, groups=c, bias=False)
        self.strided = nn.Conv2d(c, 8, 3, stride=2, padding=1)
        self.dilated = nn.Conv2d(c, 8, 3, padding=2, dilation=2)
        self.asym = nn.Conv2d(c, 8, (1, 5), stride=(2, 1), padding=(0, 2))
        self.pointwise = nn.Conv2d(c, c, 1)
        self.pointwise_strided = nn.Conv2d(c, 8, 1, stride=2, bias=False)
        self.res = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.res_bn = _randomize_batch_norm(nn.BatchNorm2d(c))
        self.lone_bn = _randomize_batch_norm(nn.BatchNorm2d(c))

    def forward(self, x):
        F = torch.nn.functional
        y = torch.relu(self.bn(self.no_bias_bn(x)))
        return (
            self.plain(x), y, self.grouped(x), torch.relu(self.depthwise(x)), self.strided(x),
            self.dilated(x), self.asym(x),
            torch.relu(self.pointwise(y) + x),                     # 1x1 gemm + residual + relu
            self.pointwise_strided(x),
            torch.relu(self.res_bn(self.res(y)) + y),              # conv + bn + residual + relu
            F.hardswish(self.plain(x)), F.silu(self.depthwise(x)),
            self.lone_bn(x * 2.0),                                 # batch norm without a conv
            self.plain(x).flatten(1),                              # a view that needs NCHW order
        )


class PoolOps(nn.Module):
    def forward(self, x):
        F = torch.nn.functional
        return (
            F.max_pool2d(x, 3, stride=2, padding=1), F.max_pool2d(x, 2, ceil_mode=True),
            F.max_pool2d(x, 3, stride=1, dilation=2, padding=1),
            F.avg_pool2d(x, 3, stride=2, padding=1), F.avg_pool2d(x, 3, stride=2, padding=1, count_include_pad=False),
            F.avg_pool2d(x, 2, ceil_mode=True), F.avg_pool2d(x, 3, stride=2, padding=1, ceil_mode=True,
                                                              count_include_pad=False),
            F.avg_pool2d(x, 2, divisor_override=3),
            F.adaptive_avg_pool2d(x, (1, 1)), F.adaptive_avg_pool2d(x, (2, 3)), F.adaptive_avg_pool2d(x, 5),
            x.mean(dim=[2, 3]), torch.amax(x, dim=[2, 3], keepdim=True),
        )


class BmmOps(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(4, 32, 16) * 0.2)

    def forward(self, a, b):
        return torch.bmm(a, b), torch.relu(torch.bmm(a, self.weight)), torch.matmul(a, b) * 0.5


class BatchedMatVec(nn.Module):
    """A bmm with one column a batch, its b viewed from a kernel result stored
    with other trailing dims (Mixtral's batched_mm experts)."""

    def forward(self, w, x):
        return torch.bmm(w, (x * 2.0).reshape(32, 128, 1))


class SqueezeExcitation(nn.Module):
    """MobileNetV3's block: expand 1x1 -> depthwise -> SE -> project 1x1 + residual."""

    def __init__(self, c=24, hidden=64, squeeze=16):
        super().__init__()
        self.expand = nn.Conv2d(c, hidden, 1, bias=False)
        self.bn1 = _randomize_batch_norm(nn.BatchNorm2d(hidden))
        self.dw = nn.Conv2d(hidden, hidden, 5, padding=2, groups=hidden, bias=False)
        self.bn2 = _randomize_batch_norm(nn.BatchNorm2d(hidden))
        self.fc1 = nn.Conv2d(hidden, squeeze, 1)
        self.fc2 = nn.Conv2d(squeeze, hidden, 1)
        self.project = nn.Conv2d(hidden, c, 1, bias=False)
        self.bn3 = _randomize_batch_norm(nn.BatchNorm2d(c))

    def forward(self, x):
        F = torch.nn.functional
        y = F.hardswish(self.bn1(self.expand(x)))
        y = F.hardswish(self.bn2(self.dw(y)))
        s = F.adaptive_avg_pool2d(y, 1)
        s = F.hardsigmoid(self.fc2(torch.relu(self.fc1(s))))
        y = y * s
        return self.bn3(self.project(y)) + x


class LargeMapReductions(nn.Module):
    """Spatial mean/sum/amax over 64x64 channels-last maps: few enough columns
    that the compiler splits them into chunked partial reductions."""

    def __init__(self, c=16, k=32):
        super().__init__()
        self.conv = nn.Conv2d(c, k, 3, padding=1)

    def forward(self, x):
        y = torch.relu(self.conv(x))
        gated = y * torch.sigmoid(y.mean(dim=[2, 3], keepdim=True))
        return gated, y.sum(dim=[2, 3]), torch.amax(y, dim=[2, 3])


FACTORIES = {"ElementwiseOps": ElementwiseOps, "ConvOps": ConvOps, "PoolOps": PoolOps, "BmmOps": BmmOps,
             "BatchedMatVec": BatchedMatVec,
             "SqueezeExcitation": SqueezeExcitation, "LargeMapReductions": LargeMapReductions}

# name -> input shapes, for export_conformance.py
CONV_CASES = {
    "ConvOps": [[2, 16, 12, 12]],
    "PoolOps": [[2, 8, 11, 11]],
    "BmmOps": [[4, 8, 32], [4, 32, 16]],
    "BatchedMatVec": [[32, 64, 128], [16, 2, 128]],
    "SqueezeExcitation": [[2, 24, 14, 14]],
    "LargeMapReductions": [[2, 16, 64, 64]],
}
