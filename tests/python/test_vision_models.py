"""Vision models (convolutions, batch norm, pooling, squeeze-excitation) export
with every op inside Kiln engines, and conv ops Kiln cannot take are refused
with a reason. Engines are compiled for sm_90 only to keep CI time small; the
GPU conformance suite (tests/gpu) checks their numbers.

Each model takes under ~10 s on a 2-core CI machine (resnet50 ~7 s,
efficientnet_b0 ~10 s, convnext_tiny ~25 s); KILN_SKIP_SLOW_MODELS=1 skips
those three.
"""

from __future__ import annotations

import logging
import os

import pytest
import torch

import kiln

torchvision = pytest.importorskip("torchvision")

pytestmark = pytest.mark.needs_compiler

slow = pytest.mark.skipif(
    os.environ.get("KILN_SKIP_SLOW_MODELS") == "1", reason="KILN_SKIP_SLOW_MODELS=1"
)


def _resnet18_mlp() -> torch.nn.Module:
    backbone = torchvision.models.resnet18()
    backbone.fc = torch.nn.Identity()
    return torch.nn.Sequential(backbone, torch.nn.Linear(512, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))


def _compile(model: torch.nn.Module, batch: int = 1, size: int = 224, channels: int = 3, **options):
    torch.manual_seed(0)
    model = model.eval()
    x = torch.randn(batch, channels, size, size)
    exported = torch.export.export(model, (x,))
    return kiln.compile(exported, arg_inputs=(x,), min_block_size=1, target_sms=(90,), **options)


@pytest.mark.parametrize(
    "name, ops, precision, batch",
    [
        ("resnet18", 69, torch.float32, 1),
        ("resnet18_mlp", 71, torch.float16, 8),
        ("mobilenet_v3_large", 352, torch.float16, 1),
        pytest.param("resnet50", 175, torch.float32, 8, marks=slow),
        pytest.param("efficientnet_b0", 288, torch.float16, 1, marks=slow),
        pytest.param("convnext_tiny", 185, torch.float16, 1, marks=slow),
    ],
)
def test_torchvision_model_runs_entirely_in_kiln(name, ops, precision, batch):
    model = _resnet18_mlp() if name == "resnet18_mlp" else getattr(torchvision.models, name)()
    compiled = _compile(model, batch=batch, enabled_precisions={precision})
    summary = compiled.summary
    assert summary.ops_on_cpu == {}, summary.line()
    assert summary.partitions == 1
    assert summary.ops_taken == ops
    assert compiled.delegates == ["KilnBackend"]


class _TransposedConv(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = torch.nn.ConvTranspose2d(4, 4, 2, stride=2)
        self.conv = torch.nn.Conv2d(4, 4, 3, padding=1)

    def forward(self, x):
        return torch.relu(self.conv(self.up(x)))


def test_transposed_conv_is_taken():
    compiled = _compile(_TransposedConv(), size=8, channels=4)
    assert compiled.summary.ops_on_cpu == {}, compiled.summary.line()
    assert compiled.summary.ops_taken == 3  # the transposed conv, the conv and the relu
    assert compiled.summary.partitions == 1


class _Conv1d(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv1d(3, 4, 3)

    def forward(self, x):
        return torch.sigmoid(self.conv(x))


def test_conv1d_is_taken():
    torch.manual_seed(0)
    x = torch.randn(1, 3, 16)
    compiled = kiln.compile(torch.export.export(_Conv1d().eval(), (x,)), arg_inputs=(x,), target_sms=(90,))
    assert compiled.summary.ops_on_cpu == {}, compiled.summary.line()


class _WaveformConv(torch.nn.Module):
    """wav2vec2's first layer: a raw [batch, samples] waveform, unsqueezed to one channel."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv1d(1, 8, 10, stride=5)

    def forward(self, x):
        return torch.nn.functional.gelu(self.conv(x.unsqueeze(1)))


def test_conv_over_a_view_of_the_input_is_taken():
    # The conv reads the engine input itself ([1, 400] as [1, 1, 400, 1]); its step was
    # refused by validation (x's shape is not NHWC) and the conv left to the CPU.
    torch.manual_seed(0)
    x = torch.randn(1, 400)
    compiled = kiln.compile(torch.export.export(_WaveformConv().eval(), (x,)), arg_inputs=(x,), target_sms=(90,))
    assert compiled.summary.ops_on_cpu == {}, compiled.summary.line()


class _Conv3d(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv3d(3, 4, 3)

    def forward(self, x):
        return torch.sigmoid(self.conv(x))


def test_conv3d_is_refused_as_not_1d_or_2d(caplog):
    torch.manual_seed(0)
    x = torch.randn(1, 3, 6, 6, 6)
    with caplog.at_level(logging.DEBUG, logger="kiln"):
        compiled = kiln.compile(torch.export.export(_Conv3d().eval(), (x,)), arg_inputs=(x,), target_sms=(90,))
    assert compiled.summary.ops_on_cpu.get("aten.convolution.default") == 1
    assert any("only 1-D and 2-D convolutions" in r.getMessage() for r in caplog.records)


class _PoolIndices(torch.nn.Module):
    def forward(self, x):
        values, indices = torch.nn.functional.max_pool2d(x, 2, return_indices=True)
        return values * 2, indices


def test_max_pool_with_used_indices_stays_on_cpu(caplog):
    torch.manual_seed(0)
    x = torch.randn(1, 3, 8, 8)
    with caplog.at_level(logging.DEBUG, logger="kiln"):
        compiled = kiln.compile(torch.export.export(_PoolIndices(), (x,)), arg_inputs=(x,), target_sms=(90,))
    assert compiled.summary.ops_on_cpu.get("aten.max_pool2d_with_indices.default") == 1
    assert any("indices are used" in r.getMessage() for r in caplog.records)


class _Pools(torch.nn.Module):
    def forward(self, x):
        a = torch.nn.functional.avg_pool2d(x, 3, stride=2, padding=1, count_include_pad=False, ceil_mode=True)
        b = torch.nn.functional.adaptive_avg_pool2d(x, (2, 3))
        return torch.nn.functional.relu6(a), b.flatten(1)


def test_pooling_ops_are_taken():
    torch.manual_seed(0)
    x = torch.randn(2, 4, 9, 9)
    compiled = kiln.compile(torch.export.export(_Pools(), (x,)), arg_inputs=(x,), target_sms=(90,))
    assert compiled.summary.ops_on_cpu == {}, compiled.summary.line()
