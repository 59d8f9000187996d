"""GPU conformance for 1-D convolutions, transposed convolutions and 1-D
pooling (tests/gpu/export_conformance.py exports each case in float32,
float16 and bfloat16; run_gpu_tests.py compares with PyTorch in float32).
PyTorch only: imported on the CPU machine (export) and the GPU machine
(reference)."""

import torch
from torch import nn

F = nn.functional


class Conv1dBiasRelu(nn.Module):
    """conv1d + bias + relu (one cuDNN step with its epilogue), strided and
    dilated grouped conv1d, a 1x1 conv1d (a GEMM) with a residual."""

    def __init__(self, c=16):
        super().__init__()
        self.conv = nn.Conv1d(c, 32, 5, padding=2)
        self.strided = nn.Conv1d(32, 24, 4, stride=2, padding=3, dilation=2, groups=4)
        self.pw = nn.Conv1d(32, c, 1)

    def forward(self, x):
        y = torch.relu(self.conv(x))
        return y, self.strided(y), torch.relu(self.pw(y) + x)


class DepthwiseConv1d(nn.Module):
    """Depthwise conv1d (the generated depthwise kernel) with SiLU and ReLU
    epilogues, stride 2 and dilation."""

    def __init__(self, c=32):
        super().__init__()
        self.dw = nn.Conv1d(c, c, 7, padding=3, groups=c)
        self.dw_strided = nn.Conv1d(c, c, 3, stride=2, padding=2, dilation=2, groups=c, bias=False)

    def forward(self, x):
        return F.silu(self.dw(x)), torch.relu(self.dw_strided(x))


class ConvTranspose2d(nn.Module):
    """ConvTranspose2d stride 2, padding 1, output_padding 1 (+ relu fused),
    between two convolutions, and one with batch norm folded in."""

    def __init__(self):
        super().__init__()
        self.enc = nn.Conv2d(8, 16, 3, padding=1)
        self.up = nn.ConvTranspose2d(16, 12, 3, stride=2, padding=1, output_padding=1)
        self.out = nn.Conv2d(12, 4, 3, padding=1)
        self.up_bn = nn.ConvTranspose2d(8, 8, 4, stride=2, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(8)
        with torch.no_grad():
            self.bn.running_mean.normal_(0.0, 0.5)
            self.bn.running_var.uniform_(0.5, 2.0)
            self.bn.weight.uniform_(0.5, 1.5)
            self.bn.bias.normal_(0.0, 0.2)

    def forward(self, x):
        y = torch.relu(self.up(torch.relu(self.enc(x))))
        return self.out(y), self.bn(self.up_bn(x))


class GroupedConvTranspose1d(nn.Module):
    """Grouped ConvTranspose1d with dilation and stride, and a stride-4 one."""

    def __init__(self):
        super().__init__()
        self.up = nn.ConvTranspose1d(16, 12, 3, stride=2, padding=1, groups=4, dilation=2)
        self.up4 = nn.ConvTranspose1d(12, 8, 8, stride=4, padding=2, output_padding=1)

    def forward(self, x):
        y = self.up(x)
        return y, self.up4(torch.relu(y))


class Pool1d(nn.Module):
    """max/avg pool 1-D (padding, stride, ceil_mode, count_include_pad),
    adaptive average pool 1-D, after a conv1d and on the input."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(8, 8, 3, padding=1)

    def forward(self, x):
        y = self.conv(x)
        return (F.max_pool1d(y, 3, 2, 1), F.avg_pool1d(y, 3, 2, 1), F.adaptive_avg_pool1d(y, 5),
                F.adaptive_avg_pool1d(y, 1), F.max_pool1d(x, 2),
                F.avg_pool1d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False))


FACTORIES = {
    "Conv1dBiasRelu": Conv1dBiasRelu,
    "DepthwiseConv1d": DepthwiseConv1d,
    "ConvTranspose2d": ConvTranspose2d,
    "GroupedConvTranspose1d": GroupedConvTranspose1d,
    "Pool1d": Pool1d,
}

CASES = {
    "Conv1dBiasRelu": [[2, 16, 50]],
    "DepthwiseConv1d": [[2, 32, 41]],
    "ConvTranspose2d": [[2, 8, 7, 9]],
    "GroupedConvTranspose1d": [[2, 16, 19]],
    "Pool1d": [[2, 8, 21]],
}
