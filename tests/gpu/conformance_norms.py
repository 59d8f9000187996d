"""Normalization conformance models for the GPU tests (layer norm, group norm,
instance norm, ConvNeXt's channels-last layer norm), exported by
export_conformance.py in float32, float16 and bfloat16 and compared on the
GPU against the float32 model. Affine parameters are drawn away from their
(1, 0) initial values so the scale and shift are tested. PyTorch only."""

import torch
from torch import nn


def _randomize(norm):
    """Weight near 1 and bias near 0, but not exactly (the defaults would
    hide a wrong parameter index)."""
    with torch.no_grad():
        if getattr(norm, "weight", None) is not None:
            norm.weight.uniform_(0.5, 1.5)
        if getattr(norm, "bias", None) is not None:
            norm.bias.normal_(0.0, 0.5)
    return norm


class LayerNormLast(nn.Module):
    """Over the last dim, with weight and bias."""

    def __init__(self, features=64):
        super().__init__()
        self.norm = _randomize(nn.LayerNorm(features))

    def forward(self, x):
        return self.norm(x)


class LayerNormPlain(nn.Module):
    """Over the last dim, no affine parameters."""

    def __init__(self, features=64):
        super().__init__()
        self.norm = nn.LayerNorm(features, elementwise_affine=False)

    def forward(self, x):
        return self.norm(x)


class LayerNormTwoDims(nn.Module):
    """Over the two trailing dims, per-element weight and bias."""

    def __init__(self, shape=(10, 64)):
        super().__init__()
        self.norm = _randomize(nn.LayerNorm(list(shape)))

    def forward(self, x):
        return self.norm(x)


class LayerNorm768(nn.Module):
    """A transformer's [b, seq, 768] rows (one 128-thread block a row)."""

    def __init__(self):
        super().__init__()
        self.norm = _randomize(nn.LayerNorm(768, eps=1e-6))

    def forward(self, x):
        return self.norm(x)


class GroupNorm4(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = _randomize(nn.GroupNorm(4, 16))

    def forward(self, x):
        return self.norm(x)


class GroupNormLarge(nn.Module):
    """16 channels a group over 48x48 maps: 36864 elements a row, streamed
    (Welford) by one 1024-thread block."""

    def __init__(self):
        super().__init__()
        self.norm = _randomize(nn.GroupNorm(4, 64))

    def forward(self, x):
        return self.norm(x) + 0.5 * self.norm(x * 3.0 + 2.0)  # shifted, scaled rows


class InstanceNormAffine(nn.Module):
    """nn.InstanceNorm2d exports as batch norm on batch statistics over a
    [1, n*c, h, w] view with repeated affine parameters."""

    def __init__(self):
        super().__init__()
        self.norm = _randomize(nn.InstanceNorm2d(8, affine=True))

    def forward(self, x):
        return self.norm(x)


class ConvNextLayerNorm(nn.Module):
    """conv -> permute to NHWC -> layer norm over channels -> permute back ->
    conv: the permutes cancel against the channels-last layout."""

    def __init__(self, c=48):
        super().__init__()
        self.conv = nn.Conv2d(3, c, 4, stride=2, padding=1)
        self.norm = _randomize(nn.LayerNorm(c, eps=1e-6))
        self.out = nn.Conv2d(c, 16, 3, padding=1)

    def forward(self, x):
        y = self.conv(x).permute(0, 2, 3, 1)
        y = self.norm(y).permute(0, 3, 1, 2)
        return self.out(y)


class ConvNextBlock(nn.Module):
    """torchvision's CNBlock written out: depthwise 7x7 conv, permute, layer
    norm, Linear-GELU-Linear on NHWC rows, permute back, layer scale,
    residual."""

    def __init__(self, c=32):
        super().__init__()
        self.stem = nn.Conv2d(3, c, 1)
        self.dw = nn.Conv2d(c, c, 7, padding=3, groups=c)
        self.norm = _randomize(nn.LayerNorm(c, eps=1e-6))
        self.fc1 = nn.Linear(c, 4 * c)
        self.fc2 = nn.Linear(4 * c, c)
        self.layer_scale = nn.Parameter(torch.rand(c, 1, 1) + 0.5)

    def forward(self, x):
        x = self.stem(x)
        y = self.dw(x).permute(0, 2, 3, 1)
        y = self.fc2(nn.functional.gelu(self.fc1(self.norm(y))))
        return self.layer_scale * y.permute(0, 3, 1, 2) + x


class GroupNormAfterConv(nn.Module):
    """conv -> group norm -> SiLU -> conv: the group norm reads the conv's
    NHWC output with NHWC strides."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 32, 3, padding=1)
        self.norm = _randomize(nn.GroupNorm(8, 32))
        self.out = nn.Conv2d(32, 8, 3, padding=1)

    def forward(self, x):
        return self.out(nn.functional.silu(self.norm(self.conv(x))))


FACTORIES = {
    "LayerNormLast": LayerNormLast,
    "LayerNormPlain": LayerNormPlain,
    "LayerNormTwoDims": LayerNormTwoDims,
    "LayerNorm768": LayerNorm768,
    "GroupNorm4": GroupNorm4,
    "GroupNormLarge": GroupNormLarge,
    "InstanceNormAffine": InstanceNormAffine,
    "ConvNextLayerNorm": ConvNextLayerNorm,
    "ConvNextBlock": ConvNextBlock,
    "GroupNormAfterConv": GroupNormAfterConv,
}

# factory name -> input shapes
CASES = {
    "LayerNormLast": [[4, 10, 64]],
    "LayerNormPlain": [[4, 10, 64]],
    "LayerNormTwoDims": [[4, 10, 64]],
    "LayerNorm768": [[2, 50, 768]],
    "GroupNorm4": [[2, 16, 12, 12]],
    "GroupNormLarge": [[1, 64, 48, 48]],
    "InstanceNormAffine": [[2, 8, 10, 10]],
    "ConvNextLayerNorm": [[2, 3, 32, 32]],
    "ConvNextBlock": [[2, 3, 14, 14]],
    "GroupNormAfterConv": [[2, 3, 16, 16]],
}
