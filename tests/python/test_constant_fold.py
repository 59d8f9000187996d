"""Export-time constant folding (python/kiln/_constant_fold.py): what a
program computes from constants alone becomes a constant, the folded program
computes what the model does (checked on the CPU with PyTorch's kernels on
random inputs), random ops, mutated buffers and values over the size bound
are left alone, and the given program is never changed."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from executorch.exir import to_edge
from torch import nn

import kiln
from kiln import _compile, _constant_fold, _fx_nodes

from _helpers import export


def _edge(model, *inputs):
    return to_edge(export(model, *inputs), compile_config=_compile.edge_compile_config()).exported_program()


def _ops(program) -> Counter:
    return Counter(_fx_nodes.op_name(n.target) for n in program.graph.nodes
                   if n.op == "call_function" and not _fx_nodes.is_getitem(n))


def _run(program, *inputs):
    with torch.no_grad():
        return program.module()(*inputs)


class CausalMask(nn.Module):
    """Llama-style: a causal mask and rotary tables from arange/full and a
    buffer, added to an input; nothing but the add depends on the input."""

    def __init__(self, n=16, d=8):
        super().__init__()
        self.register_buffer("inv_freq", 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d)), persistent=False)
        self.n = n

    def forward(self, x):
        pos = torch.arange(self.n)
        mask = torch.full((self.n, self.n), float("-inf")).triu(1)
        ang = pos[:, None].float() * self.inv_freq[None, :]
        table = torch.cat([ang.cos(), ang.sin()], dim=-1)
        return x + mask[: x.shape[-2], : x.shape[-1]] + table.sum(-1, keepdim=True)


class RelativeBias(nn.Module):
    """swin-style: a parameter table gathered by a buffer index."""

    def __init__(self, heads=3, w=4):
        super().__init__()
        self.table = nn.Parameter(torch.randn((2 * w - 1) ** 2, heads))
        coords = torch.stack(torch.meshgrid(torch.arange(w), torch.arange(w), indexing="ij")).flatten(1)
        rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0) + (w - 1)
        self.register_buffer("index", (rel[..., 0] * (2 * w - 1) + rel[..., 1]).flatten())
        self.heads, self.w = heads, w

    def forward(self, x):
        n = self.w * self.w
        bias = self.table[self.index].view(n, n, self.heads).permute(2, 0, 1)
        return x + bias


def test_causal_mask_and_rotary_tables_fold_and_compute_the_same():
    model = CausalMask().eval()
    x = torch.randn(2, 16, 16)
    program = _edge(model, x)
    folded = _constant_fold.fold_constants(program)
    ops = _ops(folded)
    for op in ("aten.arange.start_step", "aten.arange.default", "aten.full.default", "aten.cos.default",
               "aten.sin.default", "aten.cat.default"):
        assert op not in ops, ops
    assert set(ops) <= {"aten.add.Tensor"}, ops
    torch.testing.assert_close(_run(folded, x), model(x), rtol=1e-6, atol=1e-6)
    assert "aten.arange.start_step" in _ops(program) or "aten.arange.default" in _ops(program)  # unchanged


def test_relative_position_bias_folds_and_its_table_is_dropped():
    model = RelativeBias().eval()
    x = torch.randn(1, 3, 16, 16)
    program = _edge(model, x)
    assert "aten.index.Tensor" in _ops(program)
    folded = _constant_fold.fold_constants(program)
    assert "aten.index.Tensor" not in _ops(folded)
    torch.testing.assert_close(_run(folded, x), model(x))
    # The table (a parameter nothing uses any more) and the index buffer are gone.
    assert not folded.graph_signature.parameters
    assert "index" not in folded.graph_signature.buffers
    assert "table" in program.state_dict  # the given program keeps its own


class BigExpand(nn.Module):
    def forward(self, x):
        return x + torch.ones(()).expand(64, 64).contiguous() * 2.0


def test_values_over_the_bound_stay_in_the_program(monkeypatch):
    x = torch.randn(64, 64)
    program = _edge(BigExpand(), x)
    monkeypatch.setattr(_constant_fold, "MAX_FOLDED_BYTES", 1024)  # 64*64 floats are 16 KiB
    folded = _constant_fold.fold_constants(program)
    assert sum(_ops(folded).values()) > 1, _ops(folded)
    torch.testing.assert_close(_run(folded, x), BigExpand()(x))
    monkeypatch.setattr(_constant_fold, "MAX_FOLDED_BYTES", 16 << 20)
    folded = _constant_fold.fold_constants(program)
    assert set(_ops(folded)) == {"aten.add.Tensor"}, _ops(folded)


class RandomAndMutated(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("count", torch.zeros(4))

    def forward(self, x):
        self.count.add_(1.0)
        return x + torch.rand(4) * 0.0 + self.count * 2.0


def test_random_ops_and_mutated_buffers_are_not_folded():
    x = torch.randn(4)
    program = _edge(RandomAndMutated(), x)
    folded = _constant_fold.fold_constants(program)
    ops = _ops(folded)
    assert any("rand" in op for op in ops), ops
    assert ops["aten.mul.Tensor"] + ops.get("aten.mul.Scalar", 0) >= 2, ops  # count * 2 stays


def test_nothing_to_fold_returns_the_program_itself():
    program = _edge(nn.Linear(4, 4), torch.randn(2, 4))
    assert _constant_fold.fold_constants(program) is program


class TokenModel(nn.Module):
    """int64 ids and an int64 padding mask in; embedding, position ids from a
    buffer, a mask built with integer compares and casts."""

    def __init__(self, vocab=50, d=16, n=12):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(32, d)
        self.register_buffer("position_ids", torch.arange(32)[None, :], persistent=False)
        self.fc = nn.Linear(d, d)
        self.n = n

    def forward(self, ids, mask):
        h = self.tok(ids) + self.pos(self.position_ids[:, : self.n])
        keep = (mask.unsqueeze(-1) != 0) & (ids.unsqueeze(-1) >= 0)
        causal = torch.arange(self.n)[None, :] <= torch.arange(self.n)[:, None]
        scores = self.fc(h) @ h.transpose(-1, -2)
        scores = scores.masked_fill(~causal, -1e4) + (1.0 - mask[:, None, :].float()) * -1e4
        return scores, h * keep.float()


def test_token_model_runs_entirely_in_kiln():
    ids = torch.randint(0, 50, (2, 12))
    mask = torch.ones(2, 12, dtype=torch.int64)
    mask[1, 8:] = 0
    compiled = kiln.compile(export(TokenModel().eval(), ids, mask), arg_inputs=(ids, mask), target_sms=(90,))
    assert compiled.summary.ops_on_cpu == {}, compiled.summary.line()
    assert compiled.delegates == ["KilnBackend"]


def test_folding_off_leaves_the_mask_ops(monkeypatch):
    ids = torch.randint(0, 50, (2, 12))
    mask = torch.ones(2, 12, dtype=torch.int64)
    monkeypatch.setattr(_constant_fold, "ENABLED", False)
    assert _constant_fold.transform_passes() is None
    program = _edge(TokenModel().eval(), ids, mask)
    assert _constant_fold.fold_constants(program) is program


class IntegerCastOfBuffer(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("ids", torch.arange(6) * 3)

    def forward(self, x):
        return x[self.ids.to(torch.int32)] + self.ids.to(torch.float32)[:, None]


def test_an_integer_cast_of_a_buffer_is_folded_and_the_model_compiles():
    x = torch.randn(20, 4)
    program = _edge(IntegerCastOfBuffer(), x)
    folded = _constant_fold.fold_constants(program)
    assert "aten._to_copy.default" in _ops(folded)  # the float cast: the compiler folds it
    kinds = [n.meta["val"].dtype for n in folded.graph.nodes if n.op == "placeholder"]
    assert torch.int32 in kinds, kinds  # the int32 cast became a constant
    torch.testing.assert_close(_run(folded, x), IntegerCastOfBuffer()(x))
    compiled = kiln.compile(export(IntegerCastOfBuffer(), x), arg_inputs=(x,), target_sms=(90,))
    assert compiled.summary.ops_on_cpu == {}, compiled.summary.line()
