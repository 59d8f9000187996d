"""kiln._edge: ExecuTorch's to_edge_transform_and_lower with fewer re-traces
must give the same program. Each case exports with both paths and compares
the .pte bytes; the models exercise what the fused passes rewrite (scalar
arguments, mixed dtypes, transposes, views), a KV-cache update, several
methods, and a program that needs ExecuTorch's own path."""

from __future__ import annotations

import math

import pytest
import torch

import kiln
from kiln import _compile, _edge

from _helpers import MLP, export

pytestmark = pytest.mark.needs_compiler


class _Scalars(torch.nn.Module):
    """Scalar operands (ScalarToTensorPass), .t() (NormalizeTransposePass),
    views and a softmax attention (view -> view_copy)."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = torch.nn.Linear(16, 48)
        self.w = torch.nn.Parameter(torch.randn(16, 16))
        self.norm = torch.nn.LayerNorm(16)

    def forward(self, x):  # [2, 5, 16]
        q, k, v = self.qkv(self.norm(x)).chunk(3, dim=-1)
        a = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(16.0), dim=-1)
        y = (a @ v) * 0.5 + 1.0
        return (y.reshape(10, 16) @ self.w.t()).view(2, 5, 16) - 2


class _MixedTypes(torch.nn.Module):
    """float16 activations with float32 and integer operands
    (RemoveMixedTypeOperators inserts casts)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 8).half()
        self.register_buffer("scale", torch.tensor(0.25))

    def forward(self, x):  # float16 [4, 8]
        return torch.relu(self.fc(x)) * self.scale + 3


class _Cache(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("k", torch.zeros(1, 4, 32, 16))
        self.proj = torch.nn.Linear(16, 16)

    def forward(self, x, pos):
        self.k.index_copy_(2, pos, self.proj(x))
        return self.k.sum(2) * 2


def _both(tmp_path, monkeypatch, make, **options) -> tuple[bytes, bytes]:
    out = []
    for stock in (False, True):
        monkeypatch.setattr(_compile, "STOCK_EDGE", stock)
        program, args = make()
        compiled = kiln.compile(program, arg_inputs=args, target_sms=[90], **options)
        out.append(kiln.save(compiled, tmp_path / f"{'stock' if stock else 'kiln'}.pte").read_bytes())
    return out[0], out[1]


@pytest.mark.parametrize("model", ["mlp", "scalars", "mixed_types", "cache"])
def test_same_program_as_executorchs_path(model, tmp_path, monkeypatch):
    def make():
        torch.manual_seed(0)
        if model == "mlp":
            args = (torch.randn(8, 64),)
            return export(MLP().eval(), *args), args
        if model == "scalars":
            args = (torch.randn(2, 5, 16),)
            return export(_Scalars().eval(), *args), args
        if model == "mixed_types":
            args = (torch.randn(4, 8, dtype=torch.float16),)
            return export(_MixedTypes().eval(), *args), args
        args = (torch.randn(1, 4, 1, 16), torch.tensor([3]))
        return torch.export.export(_Cache().eval(), args), args

    options = {"model_id": "edge-test"} if model == "cache" else {}
    if model == "mixed_types":
        options["enabled_precisions"] = {torch.float16}
    ours, stock = _both(tmp_path, monkeypatch, make, **options)
    assert ours == stock


def test_several_methods(tmp_path, monkeypatch):
    def make():
        torch.manual_seed(1)
        block = MLP().eval()
        a, b = torch.randn(8, 64), torch.randn(2, 64)
        return {"big": export(block, a), "small": export(block, b)}, None

    ours, stock = _both(tmp_path, monkeypatch, make, model_id="edge-multi")
    assert ours == stock


def test_fewer_traces_and_the_fallback_to_executorchs_path(monkeypatch):
    from executorch.exir.pass_base import ExportPass

    traced = []
    real = ExportPass.call

    def spy(self, graph_module):
        traced.append(type(self).__name__)
        return real(self, graph_module)

    monkeypatch.setattr(ExportPass, "call", spy)
    args = (torch.randn(2, 5, 16),)
    kiln.compile(export(_Scalars().eval(), *args), arg_inputs=args, target_sms=[90])
    # the per-node passes ran fused, in two runs (before and after the
    # in-place no-op removals), each once
    fused = [t for t in traced if t.startswith("Fused_")]
    assert fused == ["Fused_ViewToViewCopyPass_NormalizeTransposePass_ReplaceBrokenOpsWithFunctionalOpsPass_"
                     "ScalarToTensorPass_SymToTensorPass", "Fused_RemoveMixedTypeOperators_OpReplacePass"], traced
    assert "OpReplacePass" not in traced

    # A float64 linear is not Kiln's: the partitioner needs ExecuTorch's
    # per-node check, so ExecuTorch's own path runs (no fused pass).
    traced.clear()
    x = torch.randn(3, 8, dtype=torch.float64)
    kiln.compile(export(torch.nn.Linear(8, 4).double().eval(), x), arg_inputs=(x,), target_sms=[90])
    assert "OpReplacePass" in traced and not any(t.startswith("Fused_") for t in traced)


def test_fuse_keeps_the_order_of_the_other_passes():
    from executorch.exir.passes import base_pre_op_replace_passes
    from executorch.exir.passes.remove_mixed_type_operators import RemoveMixedTypeOperators
    from executorch.exir.passes import OpReplacePass

    passes = list(base_pre_op_replace_passes) + [RemoveMixedTypeOperators(), OpReplacePass()]
    fused = _edge.fuse_per_node_passes(passes)
    names = [type(getattr(p, "__wrapped__", p)).__name__ for p in fused]
    assert names == ["ReplaceSymSizeOpPass",
                     "Fused_NormalizeTransposePass_ReplaceBrokenOpsWithFunctionalOpsPass_ScalarToTensorPass_"
                     "SymToTensorPass",
                     "RemoveNoopPass", "PruneEmptyTensorsPass", "RemoveToCopyPass",
                     "FoldRedundantDequantizeQuantizePass",
                     "Fused_RemoveMixedTypeOperators_OpReplacePass"]


class _TwoOutputs(torch.nn.Module):
    """A dict output of a permuted (non-contiguous) and a plain tensor."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(16, 16)

    def forward(self, x):  # [2, 5, 16]
        y = self.fc(x)
        return {"t": y.permute(0, 2, 1), "s": y.sum(-1)}


@pytest.mark.parametrize("model", ["two_outputs", "cache", "methods"])
def test_shape_only_delegates_write_the_same_program(model, tmp_path, monkeypatch):
    """kiln.save with the delegates' outputs built from recorded shapes
    (_delegate_meta) writes the bytes torch's fake run of each partition
    gives, and never unlifts a Kiln partition's program to do it."""
    import contextlib

    from kiln import _delegate_meta

    torch.manual_seed(2)
    options: dict = {"target_sms": [90]}
    if model == "two_outputs":
        program = export(_TwoOutputs().eval(), torch.randn(2, 5, 16))
    elif model == "cache":
        program = torch.export.export(_Cache().eval(), (torch.randn(1, 4, 1, 16), torch.tensor([3])))
        options["model_id"] = "meta-test"
    else:
        block = MLP().eval()
        program = {"big": export(block, torch.randn(8, 64)), "small": export(block, torch.randn(2, 64))}
        options["model_id"] = "meta-multi"
    compiled = kiln.compile(program, **options)

    unlifted = []
    real_module = torch.export.ExportedProgram.module

    def spy(self, *args, **kwargs):
        unlifted.append(self)
        return real_module(self, *args, **kwargs)

    given = []
    real_context = _delegate_meta.shape_only_delegates

    def record(modules):
        given.extend(modules)
        return real_context(modules)

    monkeypatch.setattr(torch.export.ExportedProgram, "module", spy)
    monkeypatch.setattr(_delegate_meta, "shape_only_delegates", record)
    fast = kiln.save(compiled, tmp_path / "fast.pte").read_bytes()
    partitions = [m.original_module for m in given]
    assert len(partitions) == (2 if model == "methods" else 1)
    assert not any(p is u for p in partitions for u in unlifted)
    assert not any("module" in vars(p) for p in partitions)  # the stand-ins are gone

    unlifted.clear()
    monkeypatch.setattr(_delegate_meta, "shape_only_delegates", lambda modules: contextlib.nullcontext())
    assert kiln.save(compiled, tmp_path / "slow.pte").read_bytes() == fast
    assert unlifted  # torch's own path unlifts each partition
