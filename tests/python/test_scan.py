"""torch.cumsum exports into Kiln engines (src/ops/scan_ops.cpp): RoBERTa's
position ids (an integer cumsum of the padding mask, from int64 token ids)
and float cumsums over any dim, and cumsum's dtype conversions (a float
routing mask counted into int32, as Mixtral's router does), with nothing left
on the CPU. The kernel's
numbers are checked on the CPU by tests/cpp/compiler_scan_test.cpp (host
shim) and on the GPU by tests/gpu/conformance_scan.py."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import kiln
from kiln._native import native

from _helpers import export, lowered_modules

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpu"))
import conformance_scan  # noqa: E402

pytestmark = pytest.mark.needs_compiler


def _compile(model, *inputs, **options):
    return kiln.compile(export(model, *inputs), arg_inputs=inputs, target_sms=(90,), **options)


def _labels(compiled) -> list[str]:
    return [s["label"] for m in lowered_modules(compiled.edge_program_manager)
            for s in native().inspect_engine(m.processed_bytes)["steps"]]


class RobertaPositions(nn.Module):
    """transformers' create_position_ids_from_input_ids and the position
    embedding, as RobertaEmbeddings runs them on int64 token ids."""

    def __init__(self, padding_idx=1, max_positions=40, dim=16):
        super().__init__()
        self.padding_idx = padding_idx
        self.positions = nn.Embedding(max_positions, dim, padding_idx=padding_idx)

    def forward(self, input_ids):
        mask = input_ids.ne(self.padding_idx).int()
        incremental_indices = (torch.cumsum(mask, dim=1).type_as(mask) * mask).long()
        position_ids = incremental_indices + self.padding_idx
        return position_ids, self.positions(position_ids)


def test_roberta_position_ids_run_entirely_in_kiln():
    torch.manual_seed(0)
    ids = torch.randint(0, 50, (2, 24))
    ids[:, -5:] = 1  # right padding, as a batch of uneven sentences has
    ids[0, 3] = 1
    compiled = _compile(RobertaPositions().eval(), ids)
    assert compiled.summary.ops_on_cpu == {}, compiled.summary.line()
    assert compiled.delegates == ["KilnBackend"]
    assert "cumsum" in _labels(compiled)


class FloatScans(nn.Module):
    def forward(self, x):
        return torch.cumsum(x, dim=1) * 0.5, torch.cumsum(torch.tanh(x), dim=-1), torch.cumsum(x, dim=0)


@pytest.mark.parametrize("precision", [torch.float32, torch.float16, torch.bfloat16])
def test_float_cumsum_over_any_dim_runs_entirely_in_kiln(precision):
    x = torch.randn(3, 40, 6, dtype=precision)
    compiled = _compile(FloatScans(), x, enabled_precisions={precision})
    assert compiled.summary.ops_on_cpu == {}, compiled.summary.line()
    assert set(compiled.delegates) == {"KilnBackend"}
    assert _labels(compiled).count("cumsum") == 3


@pytest.mark.parametrize("name", sorted(conformance_scan.FACTORIES))
def test_conformance_models_run_entirely_in_kiln(name):
    torch.manual_seed(0)
    model = conformance_scan.FACTORIES[name]().eval()
    inputs = tuple(torch.randn(s) for s in conformance_scan.CASES[name])
    compiled = _compile(model, *inputs)
    assert compiled.summary.ops_on_cpu == {}, compiled.summary.line()
    assert set(compiled.delegates) == {"KilnBackend"}
    assert "cumsum" in _labels(compiled)


def test_cumsum_dtype_conversions_run_entirely_in_kiln():
    """cumsum(x, dtype=...) converts x first, as PyTorch does: a float mask
    counted into int32 (Mixtral's expert routing), fractional floats
    truncated into int64, integers summed as floats."""

    class Conversions(nn.Module):
        def forward(self, x):
            counts = torch.cumsum((x > 0).to(x.dtype), dim=-1, dtype=torch.int32)
            truncated = torch.cumsum(x * 2.0, dim=1, dtype=torch.int64) + 1
            as_float = torch.cumsum(counts, dim=0, dtype=torch.float32) * x
            return counts, truncated, as_float

    compiled = _compile(Conversions(), torch.randn(4, 8), min_block_size=1)
    assert compiled.summary.ops_on_cpu == {}, compiled.summary.line()
    assert _labels(compiled).count("cumsum") == 3, _labels(compiled)
