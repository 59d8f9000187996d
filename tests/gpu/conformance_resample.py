"""Resampling and padding conformance models for the GPU tests
(export_conformance.py exports each in float32, float16 and bfloat16;
run_gpu_tests.py compares Kiln with PyTorch computing in float32).
PyTorch only: imported on the CPU machine (export) and the GPU machine
(reference).

Every output is one op on its own (or after a conv, so the layout kernels
around it run too): nearest x2 and to a size, bilinear with align_corners
False and True at non-integer scales and sizes, constant padding with a
value and cropping, reflection padding 1-D and 2-D, replication padding."""

import torch
from torch import nn

F = nn.functional


class Upsampling(nn.Module):
    def forward(self, x):
        return (
            F.interpolate(x, scale_factor=2, mode="nearest"),                         # x2: dst >> 1
            F.interpolate(x, size=(17, 23), mode="nearest"),                          # to a size
            F.interpolate(x, scale_factor=1.7, mode="nearest"),                       # scale != in/out
            F.interpolate(x, scale_factor=1.7, mode="bilinear", align_corners=False),
            F.interpolate(x, scale_factor=(1.3, 2.6), mode="bilinear", align_corners=True),
            F.interpolate(x, size=(31, 17), mode="bilinear", align_corners=False),
            F.interpolate(x, size=(5, 7), mode="bilinear", align_corners=True),      # down
            F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=False),  # segmentation heads
        )


class Padding(nn.Module):
    def forward(self, x, y):
        return (
            F.pad(x, (1, 2, 3, 4), value=0.75),           # constant 2-D with a value
            F.pad(x, (2, -1, -2, 1)),                      # negative: cropping
            F.pad(x, (0, 0, 0, 0, 1, 2), value=-0.5),      # the channel dim
            F.pad(y, (3, 2), mode="reflect"),              # reflection 1-D
            F.pad(x, (1, 2, 3, 1), mode="reflect"),        # reflection 2-D
            F.pad(x, (2, 1, 0, 3), mode="replicate"),      # replication 2-D
            F.pad(y, (4, 1), mode="replicate"),            # replication 1-D
        )


class SegmentationHead(nn.Module):
    """fcn / deeplabv3 style: conv features, image pooling upsampled from
    1x1, concatenated, a classifier and bilinear upsampling (align_corners
    False) to the input size; reflection padding before a conv."""

    def __init__(self, c=8, classes=5):
        super().__init__()
        self.stem = nn.Conv2d(c, 16, 3, stride=2, padding=1)
        self.branch = nn.Conv2d(16, 16, 3, padding=2, dilation=2)
        self.pool_proj = nn.Conv2d(16, 16, 1)
        self.padded = nn.Sequential(nn.ReflectionPad2d(1), nn.Conv2d(32, 16, 3))
        self.cls = nn.Conv2d(16, classes, 1)

    def forward(self, x):
        f = torch.relu(self.stem(x))
        pooled = torch.relu(self.pool_proj(F.adaptive_avg_pool2d(f, 1)))
        y = torch.cat([torch.relu(self.branch(f)),
                       F.interpolate(pooled, size=f.shape[-2:], mode="bilinear", align_corners=False)], dim=1)
        y = torch.relu(self.padded(y))
        return F.interpolate(self.cls(y), size=x.shape[-2:], mode="bilinear", align_corners=False)


class Bicubic(nn.Module):
    """Bicubic upsampling, which export decomposes into clamped index gathers
    (x[:, :, iy, ix], index.Tensor with None before its index tensors) and
    weighted sums: the gathers' index placement on the GPU."""

    def forward(self, x):
        return (F.interpolate(x, scale_factor=2, mode="bicubic"),
                F.interpolate(x, size=(9, 14), mode="bicubic", align_corners=True))


FACTORIES = {"Upsampling": Upsampling, "Padding": Padding, "SegmentationHead": SegmentationHead,
             "Bicubic": Bicubic}
CASES = {
    "Bicubic": [[2, 3, 6, 7]],
    "Upsampling": [[2, 3, 10, 12]],
    "Padding": [[2, 3, 10, 12], [2, 3, 16]],
    "SegmentationHead": [[2, 8, 24, 20]],
}
