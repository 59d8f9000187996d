"""Patch-embedding conformance models for the GPU tests: convolutions whose
kernel equals their stride, which Kiln compiles to one patch gather and one
GEMM (src/passes/patchify_conv.cpp), and the layout chains around them that
fusion reads as one kernel or none (src/ops/layout_ops.cpp). Exported by
export_conformance.py in float32, float16 and bfloat16 and compared on the
GPU against the float32 model. PyTorch only."""

import torch
from torch import nn


def _randomize_bias(conv):
    """A bias away from PyTorch's small uniform init, so a missing or
    misplaced bias shows."""
    if conv.bias is not None:
        with torch.no_grad():
            conv.bias.normal_(0.0, 0.5)
    return conv


class PatchEmbed16(nn.Module):
    """vit_b_16's patch embedding, 64 channels: 16x16 patches of a 224x224
    image, a GEMM with k = 768."""

    def __init__(self):
        super().__init__()
        self.proj = _randomize_bias(nn.Conv2d(3, 64, 16, stride=16))

    def forward(self, x):
        return self.proj(x)


class PatchEmbed4(nn.Module):
    """4x4 patches of 8 channels into 16, with a bias."""

    def __init__(self):
        super().__init__()
        self.proj = _randomize_bias(nn.Conv2d(8, 16, 4, stride=4))

    def forward(self, x):
        return self.proj(x)


class PatchEmbedCrop(nn.Module):
    """Non-square 4x3 patches of an 18x17 image: the last 2 rows and columns
    are dropped, as PyTorch's floor rule does; no bias."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Conv2d(3, 8, (4, 3), stride=(4, 3), bias=False)

    def forward(self, x):
        return self.proj(x)


class VitTokens(nn.Module):
    """torchvision's ViT input: patches -> [n, 16, d] tokens -> class token
    prepended -> position embedding. The permutes back to NCHW and to tokens
    cost no kernel: the concatenation reads the GEMM's output."""

    def __init__(self, d=32):
        super().__init__()
        self.proj = _randomize_bias(nn.Conv2d(3, d, 8, stride=8))
        self.cls = nn.Parameter(torch.randn(1, 1, d))
        self.pos = nn.Parameter(torch.randn(1, 17, d))

    def forward(self, x):
        t = self.proj(x).flatten(2).transpose(1, 2)
        return torch.cat([self.cls.expand(x.shape[0], -1, -1), t], dim=1) + self.pos


class ConvNextStemDown(nn.Module):
    """ConvNeXt's stem (4x4 patches), LayerNorm2d and downsampling (2x2
    patches of the channels-last norm output), then a 3x3 conv and ReLU."""

    def __init__(self, c=16):
        super().__init__()
        self.stem = _randomize_bias(nn.Conv2d(3, c, 4, stride=4))
        self.norm = nn.LayerNorm(c, eps=1e-6)  # over channels, as torchvision's LayerNorm2d
        with torch.no_grad():
            self.norm.weight.uniform_(0.5, 1.5)
            self.norm.bias.normal_(0.0, 0.5)
        self.down = _randomize_bias(nn.Conv2d(c, 2 * c, 2, stride=2))
        self.conv = nn.Conv2d(2 * c, 2 * c, 3, padding=1)

    def forward(self, x):
        y = self.norm(self.stem(x).permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        return torch.relu(self.conv(torch.relu(self.down(y))))


class TokensToImageConv(nn.Module):
    """Tokens back to an image for a conv (PVT, SegFormer): linear ->
    transpose -> view -> 3x3 conv. The transpose and the conv's channels-last
    input are one layout kernel."""

    def __init__(self, d=16):
        super().__init__()
        self.fc = nn.Linear(d, d)
        self.conv = nn.Conv2d(d, d, 3, padding=1)

    def forward(self, x):  # [n, 64, d]
        t = self.fc(x).transpose(1, 2)
        return self.conv(t.reshape(x.shape[0], -1, 8, 8)).flatten(2).transpose(1, 2)


FACTORIES = {
    "PatchEmbed16": PatchEmbed16,
    "PatchEmbed16Batch2": PatchEmbed16,
    "PatchEmbed4": PatchEmbed4,
    "PatchEmbed4Batch2": PatchEmbed4,
    "PatchEmbedCrop": PatchEmbedCrop,
    "VitTokens": VitTokens,
    "ConvNextStemDown": ConvNextStemDown,
    "TokensToImageConv": TokensToImageConv,
}

# factory name -> input shapes
CASES = {
    "PatchEmbed16": [[1, 3, 224, 224]],
    "PatchEmbed16Batch2": [[2, 3, 224, 224]],
    "PatchEmbed4": [[1, 8, 32, 32]],
    "PatchEmbed4Batch2": [[2, 8, 32, 32]],
    "PatchEmbedCrop": [[2, 3, 18, 17]],
    "VitTokens": [[2, 3, 32, 32]],
    "ConvNextStemDown": [[2, 3, 32, 32]],
    "TokensToImageConv": [[2, 64, 16]],
}
