"""1-D convolutions, transposed convolutions (1-D and 2-D) and 1-D pooling
through torch.export + kiln.compile: every op is taken by Kiln (nothing left
on the CPU), the engines compile (NVRTC runs at export), and what the check
refuses stays on the CPU with its reason."""

from __future__ import annotations

import pytest
import torch

import kiln
from kiln._native import native

from _helpers import export, lowered_modules

F = torch.nn.functional
pytestmark = pytest.mark.needs_compiler


class Conv1dStack(torch.nn.Module):
    """conv1d + bias + relu, batch-normed, depthwise, 1x1, strided, dilated,
    grouped, SiLU, residual, then a mean over the length."""

    def __init__(self, c=16):
        super().__init__()
        self.conv = torch.nn.Conv1d(c, 32, 3, padding=1)
        self.bn_conv = torch.nn.Conv1d(32, 32, 5, padding=2, bias=False)
        self.bn = torch.nn.BatchNorm1d(32)
        self.dw = torch.nn.Conv1d(32, 32, 7, padding=3, groups=32)
        self.pw = torch.nn.Conv1d(32, c, 1)
        self.strided = torch.nn.Conv1d(c, 24, 4, stride=2, padding=1, dilation=2, groups=4)

    def forward(self, x):
        y = torch.relu(self.conv(x))
        y = torch.relu(self.bn(self.bn_conv(y)))
        y = F.silu(self.dw(y))
        y = torch.relu(self.pw(y) + x)
        z = self.strided(y)
        return z, z.mean(dim=-1)


class ConvTransposeStack(torch.nn.Module):
    """2-D decoder: conv, transposed conv (stride 2, padding 1,
    output_padding 1) + batch norm + relu, grouped transposed conv with
    dilation, conv."""

    def __init__(self):
        super().__init__()
        self.enc = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.up = torch.nn.ConvTranspose2d(16, 8, 3, stride=2, padding=1, output_padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.up2 = torch.nn.ConvTranspose2d(8, 8, (3, 2), stride=(2, 1), padding=(1, 0), dilation=(1, 2), groups=2,
                                            bias=False)
        self.out = torch.nn.Conv2d(8, 2, 1)

    def forward(self, x):
        y = torch.relu(self.enc(x))
        y = torch.relu(self.bn(self.up(y)))
        return self.out(self.up2(y))


class ConvTranspose1dStack(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.ConvTranspose1d(8, 6, 3, stride=2, padding=1, groups=2, dilation=2)
        self.up2 = torch.nn.ConvTranspose1d(6, 4, 8, stride=4, padding=2)

    def forward(self, x):
        return self.up2(torch.relu(self.up(x)))


class Pool1d(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv1d(8, 8, 3, padding=1)

    def forward(self, x):
        y = self.conv(x)
        return (F.max_pool1d(y, 3, 2, 1), F.avg_pool1d(y, 3, 2, 1), F.adaptive_avg_pool1d(y, 4),
                F.adaptive_avg_pool1d(y, 1), F.max_pool1d(x, 2),
                F.avg_pool1d(x, 2, ceil_mode=True, count_include_pad=False))


def _compile(model, *inputs, **kwargs):
    compiled = kiln.compile(export(model, *inputs), arg_inputs=inputs, **kwargs)
    assert compiled.summary.ops_on_cpu == {}, compiled.summary.ops_on_cpu
    assert compiled.delegates and set(compiled.delegates) == {"KilnBackend"}
    return compiled


def _steps(compiled):
    steps = []
    for module in lowered_modules(compiled.edge_program_manager):
        steps += native().inspect_engine(module.processed_bytes)["steps"]
    return steps


def test_conv1d_stack_runs_on_conv_steps():
    torch.manual_seed(0)
    compiled = _compile(Conv1dStack().eval(), torch.randn(2, 16, 40))
    labels = [s["label"] for s in _steps(compiled)]
    kinds = [s["kind"] for s in _steps(compiled)]
    assert "conv+relu" in labels, labels           # conv1d + bias + relu: one cuDNN step
    assert any(label.startswith("dwconv") for label in labels), labels   # depthwise kernel
    assert any("1x1 gemm" in label for label in labels), labels          # 1x1 conv1d: a GEMM
    assert kinds.count("conv") == 3, labels
    assert labels.count("permute_copy") <= 3, labels  # the edges only


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_conv_transpose_2d_exports_without_cpu_ops(dtype):
    torch.manual_seed(0)
    model = ConvTransposeStack().eval()
    x = torch.randn(1, 3, 6, 7)
    compiled = _compile(model, x, enabled_precisions={dtype})
    labels = [s["label"] for s in _steps(compiled)]
    assert "conv_transpose+relu" in labels, labels  # batch norm folded, relu fused
    assert "conv_transpose" in labels, labels


def test_conv_transpose_1d_exports_without_cpu_ops():
    torch.manual_seed(0)
    compiled = _compile(ConvTranspose1dStack().eval(), torch.randn(2, 8, 20))
    labels = [s["label"] for s in _steps(compiled)]
    assert labels.count("conv_transpose+relu") == 1 and labels.count("conv_transpose") == 1, labels


def test_pool1d_exports_without_cpu_ops():
    compiled = _compile(Pool1d().eval(), torch.randn(2, 8, 20))
    labels = [s["label"] for s in _steps(compiled)]
    for name in ("max_pool2d_nhwc", "avg_pool2d_nhwc", "adaptive_avg_pool2d_nhwc"):
        assert name in labels, labels


def test_conv1d_fp16_keeps_float32_edges():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv1d(4, 8, 3, padding=1), torch.nn.ReLU(),
                                torch.nn.ConvTranspose1d(8, 4, 4, stride=2, padding=1)).eval()
    _compile(model, torch.randn(1, 4, 16), enabled_precisions={torch.float16})


def test_refused_convolutions_stay_on_the_cpu():
    class Conv3d(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv3d(2, 4, 3, padding=1)

        def forward(self, x):
            return torch.relu(self.conv(x)) + 1.0

    x = torch.randn(1, 2, 4, 4, 4)
    compiled = kiln.compile(export(Conv3d(), x), arg_inputs=(x,))
    assert compiled.summary.ops_on_cpu == {"aten.convolution.default": 1}
    reason = native().check_support(
        "aten.convolution.default",
        [("float32", [1, 2, 4, 4, 4], False), ("float32", [4, 2, 3, 3, 3], True), ("float32", [4], True)],
        {"stride": [1, 1, 1], "padding": [1, 1, 1], "dilation": [1, 1, 1], "transposed": False,
         "output_padding": [0, 0, 0], "groups": 1},
        [("float32", [1, 4, 4, 4, 4])])
    assert reason is not None and "1-D and 2-D" in reason

    class ComputedWeight(torch.nn.Module):
        def forward(self, x, w):
            return F.conv_transpose1d(x, w * 2.0, stride=2)

    x, w = torch.randn(1, 4, 10), torch.randn(4, 3, 3)
    compiled = kiln.compile(export(ComputedWeight(), x, w), arg_inputs=(x, w))
    assert compiled.summary.ops_on_cpu == {"aten.convolution.default": 1}
    reason = native().check_support(
        "aten.convolution.default", [("float32", [1, 4, 10], False), ("float32", [4, 3, 3], False)],
        {"stride": [2], "padding": [0], "dilation": [1], "transposed": True, "output_padding": [0], "groups": 1},
        [("float32", [1, 3, 21])])
    assert reason is not None and "constant" in reason
