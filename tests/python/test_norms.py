"""Normalizations export into Kiln engines: layer norm (over the last dim or
several, with and without weight/bias), group norm (affine or not), instance
norm (what torch.export + to_edge make of it: a [1, n*c, h, w] view, batch
norm on batch statistics, repeated affine parameters), and ConvNeXt's
LayerNorm2d (permute, layer norm over channels, permute back) between
convolutions with no layout kernel inside the engine. Nodes whose saved
statistics are used stay on the CPU with the registry's reason. The GPU
conformance suite (tests/gpu/conformance_norms.py) checks the numbers."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

import kiln
from kiln import _fx_nodes
from kiln._native import native

from _helpers import export, lowered_modules

pytestmark = pytest.mark.needs_compiler

torchvision = pytest.importorskip("torchvision")
from torchvision.models.convnext import CNBlock, LayerNorm2d  # noqa: E402


class BiasOnlyLayerNorm(nn.Module):
    def __init__(self, features=32):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(features))

    def forward(self, x):
        return nn.functional.layer_norm(x, (x.shape[-1],), None, self.bias)


class ConvLayerNorm2d(nn.Module):
    """conv -> LayerNorm2d -> conv, ConvNeXt's stem and downsampling."""

    def __init__(self, c=32):
        super().__init__()
        self.stem = nn.Conv2d(3, c, 4, stride=4)
        self.norm = LayerNorm2d(c)
        self.down = nn.Conv2d(c, 2 * c, 2, stride=2)

    def forward(self, x):
        return self.down(self.norm(self.stem(x)))


def _compile(model, *inputs, **options):
    torch.manual_seed(0)
    return kiln.compile(export(model, *inputs), arg_inputs=inputs, min_block_size=1, target_sms=(90,), **options)


def _assert_layout_only_at_edges(steps: list[str]) -> None:
    convs = [i for i, s in enumerate(steps) if s.startswith(("conv", "dwconv"))]
    permutes = [i for i, s in enumerate(steps) if s.startswith("permute")]
    # The output's NHWC -> NCHW permute may be read through strides by a
    # last elementwise kernel (a cast), so it need not be a kernel of its own.
    assert 1 <= len(permutes) <= 2, steps
    assert all(i < convs[0] or i > convs[-1] for i in permutes), steps
    assert permutes[0] < convs[0], steps


def _engine_steps(compiled) -> list[str]:
    labels = []
    for module in lowered_modules(compiled.edge_program_manager):
        labels += [step["label"] for step in native().inspect_engine(module.processed_bytes)["steps"]]
    return labels


CASES = {
    "layer_norm": (lambda: nn.LayerNorm(64), (4, 10, 64), "layer_norm"),
    "layer_norm_plain": (lambda: nn.LayerNorm(64, elementwise_affine=False), (4, 10, 64), "layer_norm"),
    "layer_norm_no_bias": (lambda: nn.LayerNorm(64, bias=False), (4, 10, 64), "layer_norm"),
    "layer_norm_bias_only": (lambda: BiasOnlyLayerNorm(32), (6, 32), "layer_norm"),
    "layer_norm_two_dims": (lambda: nn.LayerNorm([10, 64]), (4, 10, 64), "layer_norm"),
    "group_norm": (lambda: nn.GroupNorm(4, 16), (2, 16, 12, 12), "group_norm"),
    "group_norm_plain": (lambda: nn.GroupNorm(4, 16, affine=False), (2, 16, 12, 12), "group_norm"),
    "instance_norm": (lambda: nn.InstanceNorm2d(8, affine=True), (2, 8, 10, 10), "batch_norm_stats"),
    "instance_norm_plain": (lambda: nn.InstanceNorm2d(8), (2, 8, 10, 10), "batch_norm_stats"),
}


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("precision", [torch.float32, torch.float16])
def test_norm_runs_in_one_kiln_kernel(name, precision):
    factory, shape, label = CASES[name]
    compiled = _compile(factory().eval(), torch.randn(shape), enabled_precisions={precision})
    assert compiled.summary.ops_on_cpu == {}, compiled.summary.line()
    assert compiled.delegates == ["KilnBackend"]
    steps = _engine_steps(compiled)
    # One normalization kernel; float16 adds casts at the engine's edges.
    assert steps.count(label) == 1, steps
    assert all(s == label or "to_copy" in s or s == "cast" for s in steps), steps


def test_instance_norm_exports_as_batch_norm_on_batch_statistics():
    # The decomposition this support relies on; if torch changes it the
    # registry needs the new op.
    from executorch.exir import to_edge

    program = to_edge(export(nn.InstanceNorm2d(8, affine=True), torch.randn(2, 8, 4, 4)),
                      compile_config=kiln._compile.edge_compile_config())
    ops = {_fx_nodes.op_name(n.target) for n in program.exported_program().graph.nodes
           if n.op == "call_function" and not _fx_nodes.is_getitem(n)}
    assert "aten._native_batch_norm_legit.no_stats" in ops
    assert "aten.repeat.default" in ops  # the affine parameters, folded at export


def test_absent_optional_tensors_are_named():
    program = export(BiasOnlyLayerNorm(32), torch.randn(6, 32))
    node = next(n for n in program.graph.nodes if n.op == "call_function")
    desc = _fx_nodes.describe_node(node)
    assert len(desc.inputs) == 2  # the input and the bias
    assert desc.attrs.get("weight_absent") is True
    assert "bias_absent" not in desc.attrs


class StatsUsed(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x):
        y, mean, rstd = torch.native_layer_norm(self.fc(x), [16], None, None, 1e-5)
        return y + mean * rstd


def test_used_statistics_stay_on_the_cpu_with_the_registry_reason(caplog):
    with caplog.at_level(logging.DEBUG, logger="kiln"):
        compiled = _compile(StatsUsed(), torch.randn(4, 16))
    assert compiled.summary.ops_on_cpu.get("aten.native_layer_norm.default") == 1, compiled.summary.line()
    reason = native().first_output_only()["aten.native_layer_norm.default"]
    assert "saved mean/rstd are used" in reason
    assert any(reason in r.getMessage() for r in caplog.records)


def test_first_output_only_comes_from_the_registry():
    first = native().first_output_only()
    for op in ("aten.native_layer_norm.default", "aten.native_group_norm.default",
               "aten._native_batch_norm_legit.no_stats", "aten.max_pool2d_with_indices.default",
               "aten._native_batch_norm_legit_no_training.default"):
        assert op in first and first[op], op


@pytest.mark.parametrize("precision", [torch.float32, torch.float16])
def test_convnext_layernorm2d_between_convs_has_no_layout_kernels(precision):
    # conv_gemm="unstrided" keeps the stem and downsampling on cuDNN; by default
    # they are patch gathers and GEMMs (tests/python/test_patchify.py).
    compiled = _compile(ConvLayerNorm2d().eval(), torch.randn(2, 3, 32, 32), enabled_precisions={precision},
                        conv_gemm="unstrided")
    assert compiled.summary.ops_on_cpu == {}, compiled.summary.line()
    steps = _engine_steps(compiled)
    assert steps.count("layer_norm") == 1, steps
    # The permutes around the layer norm cancel against the channels-last
    # layout: layout kernels remain only at the engine's input and output.
    _assert_layout_only_at_edges(steps)


def test_convnext_block_runs_channels_last_throughout():
    block = CNBlock(32, layer_scale=1e-6, stochastic_depth_prob=0.0).eval()
    with torch.no_grad():
        block.layer_scale.normal_()
    model = nn.Sequential(nn.Conv2d(3, 32, 1), block, nn.Conv2d(32, 8, 1))
    compiled = _compile(model.eval(), torch.randn(1, 3, 14, 14))
    assert compiled.summary.ops_on_cpu == {}, compiled.summary.line()
    steps = _engine_steps(compiled)
    assert "layer_norm" in steps and "dwconv" in steps
    _assert_layout_only_at_edges(steps)


def test_group_norm_after_a_conv_reads_the_nhwc_output():
    model = nn.Sequential(nn.Conv2d(3, 64, 3, padding=1), nn.GroupNorm(32, 64), nn.SiLU(), nn.Conv2d(64, 16, 3, padding=1))
    compiled = _compile(model.eval(), torch.randn(1, 3, 28, 28))
    assert compiled.summary.ops_on_cpu == {}, compiled.summary.line()
    steps = _engine_steps(compiled)
    assert steps.count("group_norm") == 1
    _assert_layout_only_at_edges(steps)


class PooledLayerNorm2d(nn.Module):
    """ConvNeXt's head: adaptive average pooling of a channels-last-strided
    tensor (an as_strided_copy after export) into LayerNorm2d."""

    def __init__(self):
        super().__init__()
        self.norm = LayerNorm2d(16)

    def forward(self, y):
        x = y.permute(0, 3, 1, 2)
        return self.norm(nn.functional.adaptive_avg_pool2d(x, 1)).flatten(1)


def test_convnext_head_as_strided_is_taken():
    compiled = _compile(PooledLayerNorm2d().eval(), torch.randn(2, 5, 5, 16))
    assert compiled.summary.ops_on_cpu == {}, compiled.summary.line()
    assert "as_strided_copy" not in _engine_steps(compiled)  # a view: it keeps the element order
