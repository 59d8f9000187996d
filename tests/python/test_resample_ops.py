"""Resampling and padding: F.interpolate (nearest, bilinear with and without
align_corners, integer and non-integer scales, output sizes), constant /
reflection / replication padding and a small segmentation network in the
style of torchvision's fcn / deeplabv3 / lraspp heads export with every op
taken by Kiln; what the compiler cannot do stays on the CPU with a reason.
(Numerics: tests/cpp/compiler_resample_test.cpp on the CPU,
tests/gpu/conformance_resample.py on the GPU.)"""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

import kiln
from kiln._native import native

from _helpers import export

F = nn.functional
pytestmark = pytest.mark.needs_compiler


class Interpolations(nn.Module):
    def forward(self, x):
        return (
            F.interpolate(x, scale_factor=2, mode="nearest"),
            F.interpolate(x, size=(7, 9), mode="nearest"),
            F.interpolate(x, scale_factor=1.7, mode="nearest"),
            F.interpolate(x, scale_factor=0.5, mode="nearest"),
            F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=False),
            F.interpolate(x, scale_factor=1.5, mode="bilinear", align_corners=False),
            F.interpolate(x, scale_factor=(1.3, 2.6), mode="bilinear", align_corners=True),
            F.interpolate(x, size=(11, 13), mode="bilinear", align_corners=True),
            F.interpolate(x, size=(3, 4), mode="bilinear", align_corners=False),
            F.interpolate(x, scale_factor=1.5, mode="bilinear", recompute_scale_factor=True),
            nn.Upsample(scale_factor=2)(x), nn.UpsamplingBilinear2d(scale_factor=2)(x),
        )


class Pads(nn.Module):
    def forward(self, x, y):
        return (
            F.pad(x, (1, 2, 3, 4), value=0.5), F.pad(x, (1, -1, -2, 1)), F.pad(x, (0, 0, 0, 0, 1, 2), value=-1.0),
            F.pad(y, (2, 1)), nn.ZeroPad2d(1)(x), nn.ConstantPad1d(2, 3.0)(y),
            F.pad(y, (3, 2), mode="reflect"), F.pad(x, (1, 2, 3, 1), mode="reflect"), nn.ReflectionPad2d(2)(x),
            F.pad(x[0], (1, 1, 2, 2), mode="reflect"), F.pad(y, (4, 0), mode="replicate"),
            F.pad(x, (2, 1, 0, 3), mode="replicate"),
        )


def _randomize_bn(bn):
    with torch.no_grad():
        bn.running_mean.normal_(0.0, 0.5)
        bn.running_var.uniform_(0.5, 2.0)
    return bn


def _cbr(cin, cout, k=3, stride=1, dilation=1):
    return nn.Sequential(nn.Conv2d(cin, cout, k, stride=stride, padding=dilation * (k // 2), dilation=dilation,
                                   bias=False), _randomize_bn(nn.BatchNorm2d(cout)), nn.ReLU())


class TinySegmenter(nn.Module):
    """torchvision's segmentation heads in small: a strided backbone, an ASPP
    (dilated branches + image pooling upsampled from 1x1, concatenated), an
    LRASPP-style sigmoid gate upsampled and added, a classifier, and the
    final bilinear upsampling to the input size (align_corners=False)."""

    def __init__(self, classes=5):
        super().__init__()
        self.stem = _cbr(3, 16, stride=2)
        self.low = _cbr(16, 24, stride=2)
        self.high = _cbr(24, 32, stride=2)
        self.aspp = nn.ModuleList([_cbr(32, 16, k=1), _cbr(32, 16, dilation=2), _cbr(32, 16, dilation=3)])
        self.pool_proj = nn.Sequential(nn.Conv2d(32, 16, 1, bias=False), nn.ReLU())
        self.project = _cbr(64, 32, k=1)
        self.gate = nn.Conv2d(32, 32, 1)
        self.low_cls = nn.Conv2d(24, classes, 1)
        self.cls = nn.Conv2d(32, classes, 1)

    def forward(self, x):
        size = x.shape[-2:]
        low = self.low(self.stem(x))
        high = self.high(low)
        pooled = self.pool_proj(F.adaptive_avg_pool2d(high, 1))
        branches = [b(high) for b in self.aspp]
        branches.append(F.interpolate(pooled, size=high.shape[-2:], mode="bilinear", align_corners=False))
        y = self.project(torch.cat(branches, dim=1))
        y = y * torch.sigmoid(self.gate(F.adaptive_avg_pool2d(y, 1)))          # lraspp's scale branch
        y = F.interpolate(y, size=low.shape[-2:], mode="bilinear", align_corners=False)
        out = self.cls(y) + self.low_cls(low)
        return F.interpolate(out, size=size, mode="bilinear", align_corners=False)


def _compile(model, *inputs, **options):
    return kiln.compile(export(model, *inputs), arg_inputs=inputs, min_block_size=1, **options)


def test_interpolations_are_taken():
    x = torch.randn(2, 3, 5, 6)
    compiled = _compile(Interpolations(), x)
    assert compiled.summary.ops_on_cpu == {}
    assert set(compiled.delegates) == {"KilnBackend"}
    assert compiled.summary.ops_taken == 12


def test_pads_are_taken():
    x, y = torch.randn(2, 3, 6, 7), torch.randn(2, 3, 8)
    compiled = _compile(Pads(), x, y)
    assert compiled.summary.ops_on_cpu == {}
    assert set(compiled.delegates) == {"KilnBackend"}
    # one op per pad: the reflection/replication pads stay whole (not the index-gather decomposition)
    assert compiled.summary.ops_taken == 13  # + the select of x[0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_segmentation_style_model_is_one_engine(dtype):
    torch.manual_seed(0)
    model = TinySegmenter().eval()
    x = torch.randn(1, 3, 64, 48)
    compiled = _compile(model, x, enabled_precisions={dtype})
    assert compiled.summary.ops_on_cpu == {}
    assert compiled.delegates == ["KilnBackend"]


def test_upsampling_between_convs_in_half_precision_models():
    # A float16 model (weights and inputs in float16), as the conformance set exports.
    model = nn.Sequential(nn.Conv2d(4, 8, 3, padding=1), nn.ReflectionPad2d(1), nn.Upsample(scale_factor=2),
                          nn.Conv2d(8, 4, 3), nn.ReplicationPad2d((1, 0, 1, 0))).half().eval()
    x = torch.randn(1, 4, 8, 8, dtype=torch.float16)
    compiled = _compile(model, x, enabled_precisions={torch.float16})
    assert compiled.summary.ops_on_cpu == {}
    assert compiled.delegates == ["KilnBackend"]


class Refused(nn.Module):
    def forward(self, x):
        return (F.interpolate(x, scale_factor=2, mode="bilinear", antialias=True),
                F.interpolate(x, scale_factor=0.5, mode="bilinear", antialias=True))


def test_antialias_stays_on_the_cpu_with_its_reason(caplog):
    x = torch.randn(1, 2, 8, 8)
    with caplog.at_level(logging.DEBUG, logger="kiln"):
        compiled = _compile(Refused(), x)
    assert compiled.summary.ops_on_cpu == {"aten._upsample_bilinear2d_aa.default": 2}
    messages = [r.getMessage() for r in caplog.records if r.name == "kiln"]
    assert any("_upsample_bilinear2d_aa" in m and "not implemented" in m for m in messages), messages


def test_bicubic_decomposition_runs_in_kiln():
    # to_edge decomposes bicubic into index gathers (x[:, :, iy, ix]: index.Tensor with
    # None before its index tensors) and weighted sums; the gathers used to stay on the
    # CPU. The GPU conformance suite's Bicubic case checks the numbers.
    class Bicubic(nn.Module):
        def forward(self, x):
            return F.interpolate(x, scale_factor=2, mode="bicubic")

    x = torch.randn(1, 2, 6, 6)
    compiled = _compile(Bicubic(), x)
    assert compiled.summary.ops_on_cpu == {}, compiled.summary.line()


def _ask(op, in_shape, attrs, out_shape):
    return native().check_support(op, [("float32", in_shape, False)], attrs, [("float32", out_shape)])


def test_check_reasons():
    assert _ask("aten.upsample_bilinear2d.vec", [1, 2, 5, 6], {"align_corners": False, "scale_factors": [1.5, 1.5]},
                [1, 2, 7, 9]) is None
    # reflection padding as large as the dim: PyTorch refuses it too
    why = _ask("aten.reflection_pad1d.default", [2, 3, 4], {"padding": [4, 1]}, [2, 3, 9])
    assert why is not None and "smaller than the padded dimension" in why
    why = _ask("aten.reflection_pad2d.default", [2, 3, 5, 6], {"padding": [-1, 1, 0, 0]}, [2, 3, 5, 6])
    assert why is not None and "negative padding" in why
    why = _ask("aten.upsample_nearest2d.vec", [1, 2, 5, 6], {"output_size": [7, 8]}, [1, 2, 7, 9])
    assert why is not None and "output_size does not match" in why
    why = _ask("aten.constant_pad_nd.default", [2, 5], {"pad": [-3, -2], "value": 0.0}, [2, 0])
    assert why is not None


def test_min_block_size_above_one_still_exports():
    # Pads are kept whole only when every taken node is sure to be delegated
    # (min_block_size 1); otherwise they decompose as before and the export works.
    x = torch.randn(1, 2, 6, 6)
    model = nn.Sequential(nn.ReflectionPad2d(1), nn.ReLU())
    compiled = kiln.compile(export(model, x), arg_inputs=(x,), min_block_size=3)
    assert "aten.reflection_pad2d.default" not in compiled.summary.ops_on_cpu
