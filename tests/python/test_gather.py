"""Gathers and integer tensors export into Kiln engines: embedding,
index_select, gather and index.Tensor as one generated gather kernel each;
int64 engine inputs (token ids, attention masks) and integer intermediates;
what Kiln cannot take (boolean-mask indexing, an integer result the
elementwise kernel does not compute exactly) stays on the CPU with a reason.
The kernels' numbers are checked on the CPU by tests/cpp/compiler_gather_test.cpp
(host shim) and on the GPU by tests/gpu/conformance_gather.py; the
transformer models by tools/coverage/probe_ops.py (small configs here)."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import kiln
from kiln._native import native

from _helpers import export, lowered_modules

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpu"))
import conformance_gather  # noqa: E402

pytestmark = pytest.mark.needs_compiler

# What attention leaves today (the lead's and another helper's work).
ATTENTION_OPS = {"aten._softmax.default", "aten.any.dim", "aten.full_like.default", "aten.eq.Scalar",
                 "aten.logical_not.default", "aten.where.self", "aten.scalar_tensor.default"}


def _compile(model, *inputs, **options):
    return kiln.compile(export(model, *inputs), arg_inputs=inputs, target_sms=(90,), **options)


def _engines(compiled) -> list[dict]:
    return [native().inspect_engine(m.processed_bytes) for m in lowered_modules(compiled.edge_program_manager)]


@pytest.mark.parametrize("name", sorted(conformance_gather.FACTORIES))
@pytest.mark.parametrize("precision", [torch.float32, torch.float16])
def test_conformance_models_run_entirely_in_kiln(name, precision):
    torch.manual_seed(0)
    model = conformance_gather.FACTORIES[name]().to(precision).eval()
    inputs = tuple(torch.randn(s, dtype=precision) for s in conformance_gather.CASES[name])
    compiled = _compile(model, *inputs, enabled_precisions={precision})
    assert compiled.summary.ops_on_cpu == {}, compiled.summary.line()
    assert set(compiled.delegates) == {"KilnBackend"}
    labels = [s["label"] for e in _engines(compiled) for s in e["steps"]]
    expected = {"Embedding": "embedding", "EmbeddingOddRow": "embedding", "IndexSelect": "index_select",
                "Gather": "gather", "AdvancedIndex": "index"}.get(name)
    if expected:
        assert expected in labels, labels


class Tokens(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(100, 32)
        self.fc = nn.Linear(32, 8)

    def forward(self, ids, mask):
        h = self.emb(ids) * (mask != 0).unsqueeze(-1).to(torch.float32)
        return self.fc(h), (mask.unsqueeze(1) * mask.unsqueeze(2)).to(torch.float32)


def test_int64_engine_inputs():
    ids = torch.randint(0, 100, (2, 10))
    mask = torch.randint(0, 2, (2, 10))
    compiled = _compile(Tokens(), ids, mask)
    assert compiled.summary.ops_on_cpu == {}, compiled.summary.line()
    engines = _engines(compiled)
    dtypes = [sorted(e["tensors"][i]["dtype"] for i in e["inputs"]) for e in engines]
    # ids and mask feed the embedding engine; the mask alone the other one.
    assert sorted(dtypes) == [["int64"], ["int64", "int64"]], dtypes
    embedding = next(e for e in engines if len(e["inputs"]) == 2)
    assert "embedding" in [s["label"] for s in embedding["steps"]]


def test_boolean_mask_indexing_stays_on_the_cpu():
    reason = native().check_support(
        "aten.index.Tensor", [("float32", [4, 5], False), ("bool", [4, 5], False)], {"indices_count": 1},
        [("float32", [7])])
    assert reason is not None and "int64 or int32" in reason


class IntegerClamp(nn.Module):
    def forward(self, ids):
        return torch.clamp(ids, max=5).to(torch.float32) + ids.to(torch.float32)


def test_an_integer_result_kiln_does_not_compute_stays_on_the_cpu(caplog):
    ids = torch.randint(0, 10, (4, 6))
    with caplog.at_level(logging.DEBUG, logger="kiln"):
        compiled = _compile(IntegerClamp(), ids)
    assert compiled.summary.ops_on_cpu == {"aten.clamp.default": 1}, compiled.summary.line()
    reason = native().check_support("aten.clamp.default", [("int64", [4, 6], False)], {"max": 5},
                                    [("int64", [4, 6])])
    assert reason is not None and "int64" in reason
    # A float result from integer operands is fine (they are converted, as torch promotes).
    assert native().check_support("aten.mul.Tensor", [("int64", [4], False), ("float32", [4], False)], {},
                                  [("float32", [4])]) is None


def test_gather_checks_refuse_bad_shapes():
    ok = native().check_support("aten.index_select.default", [("float32", [3, 8], False), ("int64", [5], False)],
                                {"dim": 1}, [("float32", [3, 5])])
    assert ok is None
    bad = native().check_support("aten.index_select.default", [("float32", [3, 8], False), ("int64", [5], False)],
                                 {"dim": 1}, [("float32", [3, 6])])
    assert bad is not None and "shape" in bad
    bad = native().check_support("aten.gather.default", [("float32", [3, 8], False), ("int64", [4, 8], False)],
                                 {"dim": 1}, [("float32", [4, 8])])
    assert bad is not None


transformers = pytest.importorskip("transformers")


def _left(compiled) -> set[str]:
    return set(compiled.summary.ops_on_cpu) - ATTENTION_OPS


def test_small_llama_leaves_only_attention_to_the_cpu():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=500, max_position_embeddings=64, use_cache=False)
    model = LlamaForCausalLM(config).eval()
    ids = torch.randint(0, 500, (1, 16))
    with torch.no_grad():
        compiled = kiln.compile(torch.export.export(model, (ids,), strict=False), target_sms=(90,))
    assert _left(compiled) == set(), compiled.summary.line()


def test_small_bert_with_a_padding_mask_leaves_only_attention_to_the_cpu():
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                        vocab_size=500, attn_implementation="sdpa")
    model = BertModel(config).eval()
    ids = torch.randint(0, 500, (1, 16))
    mask = torch.ones(1, 16, dtype=torch.int64)
    mask[0, 12:] = 0
    with torch.no_grad():
        compiled = kiln.compile(torch.export.export(model, (ids, mask), strict=False), target_sms=(90,))
    assert _left(compiled) == set(), compiled.summary.line()


def test_float32_model_gathers_in_a_float16_engine():
    # index_select reads the float32 graph input directly; the engine computes
    # in float16, so the gather kernel converts as it copies.
    torch.manual_seed(0)
    model = conformance_gather.IndexSelect().eval()
    inputs = tuple(torch.randn(s) for s in conformance_gather.CASES["IndexSelect"])
    compiled = _compile(model, *inputs, enabled_precisions={torch.float16})
    assert compiled.summary.ops_on_cpu == {}, compiled.summary.line()
