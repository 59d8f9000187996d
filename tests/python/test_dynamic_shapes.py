"""Dynamic shapes on the CPU side: a program exported with torch.export Dims
becomes one engine per shape bucket in one delegate blob (a variant set,
python/kiln/_dynamic.py), with the sizes, the range and the input dims the
delegate picks a variant by. The GPU side (running the variants against
PyTorch, refusing other sizes) is tests/gpu/dynamic_shapes_test.py."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.export import Dim

import kiln
from kiln import _dynamic
from kiln._native import native
from kiln.inspect import delegate_blobs, describe, inspect_pte

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpu"))
from export_dynamic_shapes import TableMix  # noqa: E402  (the GPU test's model)

pytestmark = pytest.mark.needs_compiler


class Causal(torch.nn.Module):
    """Causal attention: its mask (arange/full over the length) is computed per variant."""

    def __init__(self):
        super().__init__()
        self.qkv = torch.nn.Linear(32, 96)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = (z.view(b, t, 2, 16).transpose(1, 2) for z in self.qkv(x).split(d, dim=-1))
        return F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)


def export_table_mix(lo=8, hi=64):
    seq = Dim("seq", min=lo, max=hi)
    return torch.export.export(TableMix().eval(), (torch.randn(1, 8, 16), torch.arange(8)),
                               dynamic_shapes=({1: seq}, {0: seq}))


def variant_set(path):
    blobs = [d["blob"] for d in delegate_blobs(path.read_bytes(), path)]
    assert len(blobs) == 1
    assert native().is_variant_set(blobs[0])
    return native().unpack_variant_set(blobs[0])


def test_default_buckets_are_the_range_ends_and_powers_of_two():
    assert _dynamic.buckets(1, 512, ()) == [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
    assert _dynamic.buckets(3, 100, ()) == [3, 4, 8, 16, 32, 64, 100]
    assert _dynamic.buckets(8, 64, (1, 8, 40, 600)) == [8, 40]
    with pytest.raises(kiln.CompileError, match=r"no size inside the dim's range \[8, 64\]"):
        _dynamic.buckets(8, 64, (1, 100))


def test_one_engine_per_bucket_in_one_delegate(tmp_path, capsys):
    compiled = kiln.compile(export_table_mix(), target_sms=[90])
    assert compiled.summary.ops_left == 0
    path = tmp_path / "dyn.pte"
    kiln.save(compiled, path)
    parts = variant_set(path)
    (name, lo, hi), = parts["symbols"]
    assert (lo, hi) == (8, 64)
    assert sorted(parts["bindings"]) == [(0, 1, 0), (1, 0, 0)]  # x dim 1 and pos dim 0 are the same length
    assert [v[0] for v in parts["values"]] == [8, 16, 32, 64]
    for (size,), engine in zip(parts["values"], parts["engines"]):
        info = native().inspect_engine(engine)
        shapes = [info["tensors"][i]["shape"] for i in info["inputs"]]
        assert shapes == [[1, size, 16], [size]]
        assert [info["tensors"][i]["shape"] for i in info["outputs"]] == [[1, 32]]
    report = describe(inspect_pte(path))
    assert f"dynamic shapes, 4 variants" in report and f"{name} in [8, 64] at input 0 dim 1, input 1 dim 0" in report
    assert "variant 4/4 (" + name + "=64)" in report


def test_variants_share_one_copy_of_the_weights(tmp_path):
    compiled = kiln.compile(export_table_mix(), target_sms=[90], shape_buckets=[8, 24, 64])
    path = tmp_path / "dyn.pte"
    kiln.save(compiled, path)
    parts = variant_set(path)
    assert [v[0] for v in parts["values"]] == [8, 24, 64]
    info = inspect_pte(path)
    keys = [{n["key"] for n in e["named_weights"]} for e in info["engines"]]
    assert len(keys) == 3 and keys[0] == keys[1] == keys[2] and keys[0]
    assert info["named_data"]["in_file"]["entries"] == len(keys[0])  # stored once


def test_causal_mask_over_the_length_is_computed_per_variant(tmp_path):
    seq = Dim("seq", min=2, max=32)
    program = torch.export.export(Causal().eval(), (torch.randn(1, 8, 32),), dynamic_shapes=({1: seq},))
    compiled = kiln.compile(program, target_sms=[90], shape_buckets=[4, 32])
    assert compiled.summary.ops_left == 0, compiled.summary.line()
    path = tmp_path / "causal.pte"
    kiln.save(compiled, path)
    assert [v[0] for v in variant_set(path)["values"]] == [4, 32]


def test_shape_buckets_is_an_option_that_round_trips():
    options = kiln._options.validate_options(shape_buckets=[64, 1, 8])
    assert options.shape_buckets == (1, 8, 64)
    specs = {s.key: bytes(s.value) for s in options.to_compile_specs()}
    assert specs["shape_buckets"] == b"1,8,64"
    assert kiln._options.KilnOptions.from_compile_specs(options.to_compile_specs()) == options
    with pytest.raises(TypeError, match="shape_buckets"):
        kiln._options.validate_options(shape_buckets=[0, 4])


def test_too_many_variants_leaves_the_nodes_to_the_cpu_with_the_reason(capsys):
    class TwoDims(torch.nn.Module):
        def forward(self, x):
            return torch.relu(x) * 2

    a, b = Dim("a", min=1, max=512), Dim("b", min=1, max=512)
    program = torch.export.export(TwoDims(), (torch.randn(4, 4),), dynamic_shapes=({0: a, 1: b},))
    compiled = kiln.compile(program, target_sms=[90])  # 9 x 9 buckets (2..512): over the bound
    assert compiled.summary.ops_left > 0
    err = capsys.readouterr().err
    assert "81 shape variants" in err and "at most 64: pass fewer shape_buckets" in err
    assert "aten.relu.default" in err.splitlines()[-1], "relu is left to the CPU, not aborted"


def test_unbounded_dim_is_left_to_the_cpu_with_the_reason(capsys):
    class Double(torch.nn.Module):
        def forward(self, x):
            return torch.relu(x) * 2

    program = torch.export.export(Double(), (torch.randn(4, 8),), dynamic_shapes=({0: Dim("batch")},))
    compiled = kiln.compile(program, target_sms=[90])
    assert compiled.summary.ops_left > 0
    assert "max" in capsys.readouterr().err


def test_variant_set_blob_refuses_inconsistent_input():
    with pytest.raises(ValueError, match="outside"):
        native().pack_variant_set([("s0", 1, 8)], [(0, 0, 0)], [[9]], [b"x" * 16])
    with pytest.raises(ValueError, match="variant set"):
        native().unpack_variant_set(b"KILNVSET" + b"\0" * 3)


def test_two_dynamic_dims_give_every_combination(tmp_path):
    class Scale(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(8, 8)

        def forward(self, x):
            return torch.softmax(self.fc(x), dim=1)

    batch, seq = Dim("batch", min=1, max=4), Dim("seq", min=2, max=16)
    program = torch.export.export(Scale().eval(), (torch.randn(2, 4, 8),), dynamic_shapes=({0: batch, 1: seq},))
    compiled = kiln.compile(program, target_sms=[90], shape_buckets=[2, 4, 16])
    assert compiled.summary.ops_left == 0, compiled.summary.line()
    path = tmp_path / "two.pte"
    kiln.save(compiled, path)
    parts = variant_set(path)
    assert len(parts["symbols"]) == 2
    by_name = {name: k for k, (name, _lo, _hi) in enumerate(parts["symbols"])}
    dims = {d: s for _i, d, s in parts["bindings"]}
    b, t = dims[0], dims[1]
    assert {(v[b], v[t]) for v in parts["values"]} == {(x, y) for x in (2, 4) for y in (2, 4, 16)}
    for values, engine in zip(parts["values"], parts["engines"]):
        info = native().inspect_engine(engine)
        assert info["tensors"][info["inputs"][0]]["shape"] == [values[b], values[t], 8]
    assert set(by_name) == {parts["symbols"][b][0], parts["symbols"][t][0]}


def test_each_variant_is_built_once_per_compile(monkeypatch, tmp_path):
    """The partitioner's trial builds the largest variant for the key and
    each variant once to compile it; preprocess builds one variant for the
    key and takes the trial's engine (no second compile). Building every
    variant again only for a key cost the 410M Llama's export minutes."""
    import kiln.backend
    import kiln.partitioner

    calls = {"trial": 0, "preprocess": 0}

    def counting(where, real):
        def build(*args, **kwargs):
            calls[where] += 1
            return real(*args, **kwargs)
        return build

    monkeypatch.setattr(kiln._partition_trial, "build", counting("trial", kiln._partition_trial.build))
    monkeypatch.setattr(kiln.backend, "build", counting("preprocess", kiln.backend.build))
    compiled = kiln.compile(export_table_mix(8, 64), model_id="dyn-builds")
    sizes = _dynamic.buckets(8, 64, ())
    assert calls == {"trial": 1 + len(sizes), "preprocess": 1}, calls
    path = kiln.save(compiled, tmp_path / "builds.pte")
    assert len(variant_set(path)["values"]) == len(sizes)
