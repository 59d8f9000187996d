"""Attention compiles into one Kiln step: scaled_dot_product_attention (as
torch.export decomposes it: scaled bmm, safe softmax, bmm), with masks, cross
and grouped-query attention, nn.MultiheadAttention, and attention written out
as matmul -> scale -> mask -> softmax -> matmul. The head split and merge
around it (views, permutes, slices of the fused qkv projection) are read and
written through strides, so no layout kernel is left. The kernel's source is
compiled by NVRTC for the targeted SMs here; the GPU conformance suite
(tests/gpu/conformance_attention.py) checks the numbers against PyTorch."""

from __future__ import annotations

import pytest
import torch

import kiln
from kiln._native import native

from _helpers import export, lowered_modules

pytestmark = pytest.mark.needs_compiler

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpu"))
import conformance_attention as ca  # noqa: E402


def _compile(model, *inputs, precision=torch.float32, **options):
    return kiln.compile(export(model.eval(), *inputs), arg_inputs=inputs, min_block_size=1,
                        enabled_precisions={precision}, **options)


def _steps(compiled) -> list[dict]:
    steps = []
    for module in lowered_modules(compiled.edge_program_manager):
        steps += native().inspect_engine(module.processed_bytes)["steps"]
    return steps


def _labels(compiled) -> list[str]:
    return [s["label"] for s in _steps(compiled)]


CASES = {
    "sdpa": (lambda: ca.SelfAttention(), [(2, 50, 64)]),
    "sdpa_mask": (ca.MaskedAttention, [(2, 50, 64), (2, 1, 50, 50)]),
    "sdpa_bool_mask": (ca.BoolMaskAttention, [(2, 40, 64)]),
    "cross": (ca.CrossAttention, [(2, 40, 64), (2, 24, 64)]),
    "gqa": (ca.GroupedQueryAttention, [(2, 30, 128)]),
    "eager": (ca.EagerAttention, [(2, 50, 64), (2, 1, 1, 50)]),
    "learned_keys": (ca.LearnedKeyAttention, [(1, 3, 64)]),
}


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("precision", [torch.float32, torch.float16])
def test_attention_is_one_step_with_no_layout_kernels(name, precision):
    factory, shapes = CASES[name]
    torch.manual_seed(0)
    compiled = _compile(factory(), *(torch.randn(s) for s in shapes), precision=precision)
    assert compiled.summary.ops_on_cpu == {}, compiled.summary.line()
    labels = _labels(compiled)
    assert labels.count("attention") == 1, labels
    # The projections, the attention (with its split-keys merge when few
    # queries meet many keys) and (float16) the casts at the edges: the head
    # split/merge costs no kernel.
    others = [s for s in labels if s not in ("attention", "attention_combine", "linear", "addmm", "cast")]
    assert others == [], labels


def test_multihead_attention_at_batch_2_launches_no_layout_copy():
    torch.manual_seed(0)
    compiled = _compile(ca.TorchMha(), torch.randn(2, 65, 96))
    # nn.MultiheadAttention works sequence-first: its batch-first transposes
    # move across the projections (passes/linear_permutes.cpp), the attention
    # reads q/k/v out of the [s, b, 3*e] projection through strides (a view
    # merging b and the heads: factored strides) and writes its output in the
    # order the output projection needs.
    assert _labels(compiled) == ["linear", "attention", "linear"], _labels(compiled)


def test_encoder_block_at_batch_3_fuses_its_residual_adds_into_the_gemms():
    torch.manual_seed(0)
    for block, shape in ((ca.MhaBlock(), (3, 41, 64)), (ca.MhaBlock(batch_first=False), (41, 3, 64))):
        labels = _labels(_compile(block, torch.randn(*shape)))
        assert labels == ["layer_norm", "linear", "attention", "linear+add", "layer_norm", "linear", "gelu",
                          "linear+add"], labels


@pytest.mark.parametrize("precision", [torch.float32, torch.float16])
def test_separate_query_key_value_linears_become_one_gemm(precision):
    torch.manual_seed(0)
    model = ca.SeparateQkv().to(precision)
    compiled = _compile(model, torch.randn(3, 48, 64, dtype=precision), torch.randn(3, 48, dtype=precision),
                        precision=precision)
    assert not compiled.summary.ops_on_cpu, compiled.summary
    labels = _labels(compiled)
    # passes/merge_linears.cpp: one GEMM over the stacked weights; the
    # attention reads its slices through strides.
    assert labels.count("linear") == 1 and labels.count("linear+add") == 1, labels
    assert not any(s.startswith(("slice", "permute")) for s in labels), labels


def test_float16_attention_uses_tensor_cores_and_float32_does_not():
    torch.manual_seed(0)
    half = _compile(ca.SelfAttention(), torch.randn(2, 50, 64), precision=torch.float16)
    full = _compile(ca.SelfAttention(), torch.randn(2, 50, 64))
    # The engine carries its kernels' CUDA source: the attention kernel's body
    # calls the mma helper in float16 only.
    source = lambda c: "".join(m.processed_bytes.decode("latin-1") for m in lowered_modules(c.edge_program_manager))
    assert "kiln_mma_f16(sc[j]" in source(half)
    assert "kiln_mma_f16(sc[j]" not in source(full)


def test_tensor_core_kernel_needs_sm80():
    # sm_75 has no bf16/f16 m16n8k16 mma: the SIMT kernel is planned instead,
    # and the engine still compiles for it.
    torch.manual_seed(0)
    compiled = _compile(ca.SelfAttention(), torch.randn(2, 50, 64), precision=torch.float16, target_sms=(75,))
    assert _labels(compiled).count("attention") == 1


def test_default_targets_keep_the_tensor_core_kernel_for_every_sm():
    # The default SMs start at sm_80, the oldest with the m16n8k16 mma,
    # cp.async and ldmatrix the fast kernel uses: every cubin (sm_90 included)
    # and the compute_80 PTX carry that kernel, not the SIMT fallback. No
    # generated kernel has a faster sm_90-only path, so one choice for all SMs
    # loses nothing.
    torch.manual_seed(0)
    compiled = _compile(ca.SelfAttention(), torch.randn(2, 50, 64), precision=torch.float16)
    (module,) = lowered_modules(compiled.edge_program_manager)
    info = native().inspect_engine(module.processed_bytes)
    (code,) = info["modules"]
    assert code["sms"] == [80, 90, 100, 110, 120] and code["ptx_sm"] == 80
    assert "kiln_mma_f16(sc[j]" in code["source"] and "cp.async" in code["source"]
    assert "__CUDA_ARCH__" not in code["source"]


def test_head_dim_over_the_kernel_limit_is_not_fused():
    # 2 heads of 160: the attention stays as its ops (or goes to the CPU);
    # the export still succeeds.
    torch.manual_seed(0)
    compiled = _compile(ca.SelfAttention(dim=320, heads=2), torch.randn(1, 20, 320))
    assert "attention" not in _labels(compiled)


def test_attention_inside_a_larger_shape_matches_operands_through_strides():
    # ViT-B/16's attention: 197 tokens, 12 heads of 64, from one qkv linear.
    torch.manual_seed(0)
    compiled = _compile(ca.VitAttention(), torch.randn(1, 197, 768), precision=torch.float16)
    steps = _steps(compiled)
    attention = [s for s in steps if s["label"] == "attention"]
    assert len(attention) == 1
    assert [s["label"] for s in steps if s["label"] not in ("cast",)] == ["linear", "attention", "linear"]


class ResidualProjection(torch.nn.Module):
    """A transformer block's output projection: x + proj(attention(x))."""

    def __init__(self):
        super().__init__()
        self.attn = ca.SelfAttention()

    def forward(self, x):
        return x + self.attn(x)


@pytest.mark.parametrize("precision", [torch.float32, torch.float16])
def test_residual_add_joins_the_projection_gemm(precision):
    # (a model in the precision it runs in: a float32 model computing in
    # float16 adds its float32 input, so that add stays a kernel of its own)
    torch.manual_seed(0)
    compiled = _compile(ResidualProjection().to(precision), torch.randn(2, 50, 64, dtype=precision),
                        precision=precision)
    labels = [s for s in _labels(compiled) if s != "cast"]
    assert labels == ["linear", "attention", "linear+add"], labels


class ResidualMha(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.mha = ca.TorchMha()

    def forward(self, x):
        return x + self.mha(x)


def test_residual_add_joins_the_gemm_through_reshapes_that_move_nothing():
    # Batch 1: nn.MultiheadAttention's sequence-first transposes only move a
    # dim of size 1, so they are no kernels and the residual reaches the GEMM.
    torch.manual_seed(0)
    compiled = _compile(ResidualMha().half(), torch.randn(1, 65, 96, dtype=torch.float16), precision=torch.float16)
    assert _labels(compiled) == ["linear", "attention", "linear+add"]
