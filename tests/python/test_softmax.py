"""Row ops export into Kiln engines: softmax and log_softmax over any dim (one
kernel each), the safe-softmax chain scaled_dot_product_attention exports
around _softmax (absorbed into that kernel), RMSNorm as HF Llama and
nn.RMSNorm write it (one row kernel), and the small ops around them (any.dim
over bool, full_like, fmod) when nothing fuses them. The kernels are
compiled for sm_90 at export; the GPU conformance suite
(tests/gpu/conformance_softmax.py) checks the numbers and
tests/cpp/compiler_rows_test.cpp runs the kernels on the CPU."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import kiln
from kiln._native import native

from _helpers import export, lowered_modules

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpu"))
import conformance_softmax as cs  # noqa: E402

pytestmark = pytest.mark.needs_compiler
ROOT = Path(__file__).resolve().parents[2]
F = nn.functional


def _compile(model, *inputs, **options):
    torch.manual_seed(0)
    return kiln.compile(export(model, *inputs), arg_inputs=inputs, min_block_size=1, target_sms=(90,), **options)


def _steps(compiled) -> list[str]:
    labels = []
    for module in lowered_modules(compiled.edge_program_manager):
        labels += [step["label"] for step in native().inspect_engine(module.processed_bytes)["steps"]]
    return labels


class Softmax(nn.Module):
    def __init__(self, dim, log):
        super().__init__()
        self.dim, self.log = dim, log

    def forward(self, x):
        return (torch.log_softmax if self.log else torch.softmax)(x, self.dim)


@pytest.mark.parametrize("shape,dim", [((4, 10, 64), -1), ((3, 7), 1), ((2, 50000), -1), ((3, 37, 5, 6), 1),
                                       ((40, 70), 0), ((2, 5, 6), -2)])
@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize("precision", [torch.float32, torch.float16])
def test_softmax_is_one_kernel(shape, dim, log, precision):
    compiled = _compile(Softmax(dim, log), torch.randn(shape), enabled_precisions={precision})
    assert compiled.summary.ops_on_cpu == {}, compiled.summary.line()
    steps = _steps(compiled)
    label = "log_softmax" if log else "softmax"
    assert steps.count(label) == 1, steps
    assert all(s == label or "to_copy" in s or s == "cast" for s in steps), steps


class Attention(nn.Module):
    def forward(self, q, k, v, mask):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_safe_softmax_chain_is_absorbed(dtype):
    model = cs.SafeSoftmax().to(dtype)
    compiled = _compile(model, torch.randn(6, 40, dtype=dtype), enabled_precisions={dtype})
    assert compiled.summary.ops_on_cpu == {}, compiled.summary.line()
    steps = _steps(compiled)
    assert steps.count("safe_softmax") == 1, steps
    # eq / logical_not / any / full_like / where are inside the softmax kernel
    assert not [s for s in steps if s == "any" or "full_like" in s or "logical_not" in s], steps


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_attention_takes_every_node(dtype):
    # SDPA's decomposition: the attention pass makes it one step where it
    # matches; otherwise the softmax kernel absorbs the safe chain.
    q = torch.randn(2, 4, 20, 16, dtype=dtype)
    mask = torch.rand(20, 20) > 0.3
    compiled = _compile(Attention(), q, q.clone(), q.clone(), mask, enabled_precisions={dtype})
    assert compiled.summary.ops_on_cpu == {}, compiled.summary.line()
    steps = _steps(compiled)
    assert [s for s in steps if s in ("sdpa", "attention", "safe_softmax")], steps
    assert not [s for s in steps if s == "any" or "full_like" in s or "logical_not" in s], steps


@pytest.mark.parametrize("factory,shape", [("LlamaRMSNorm", (2, 7, 64)), ("LlamaRMSNorm4096", (1, 5, 4096)),
                                           ("TorchRMSNorm", (3, 5, 96))])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_rms_norm_is_one_kernel(factory, shape, dtype):
    model = cs.FACTORIES[factory]().to(dtype)
    compiled = _compile(model, torch.randn(shape, dtype=dtype), enabled_precisions={dtype})
    assert compiled.summary.ops_on_cpu == {}, compiled.summary.line()
    assert _steps(compiled) == ["rms_norm"]


class RmsMeanReused(nn.Module):
    """The mean is read twice: no match, the ops compile one by one."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.rand(32) + 0.5)

    def forward(self, x):
        var = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(var + 1e-6)), var


class RmsNoWeight(nn.Module):
    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


def test_rms_norm_that_does_not_match_still_compiles():
    compiled = _compile(RmsMeanReused(), torch.randn(4, 32))
    assert compiled.summary.ops_on_cpu == {}, compiled.summary.line()
    steps = _steps(compiled)
    assert "rms_norm" not in steps and "mean" in steps, steps
    compiled = _compile(RmsNoWeight(), torch.randn(4, 32))
    assert compiled.summary.ops_on_cpu == {}
    assert _steps(compiled) == ["rms_norm"]


class RmsOfFusedValue(nn.Module):
    """The cast's input (y * 2) lives only inside the cast's fused kernel:
    the RMSNorm step must read the cast's result, not bypass it."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.rand(64) + 0.5)

    def forward(self, y):
        h = (y * 2.0).to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        return self.weight * h.to(y.dtype)


def test_rms_norm_reads_the_cast_when_its_input_is_not_stored():
    model = RmsOfFusedValue().half()
    compiled = _compile(model, torch.randn(3, 64).half(), enabled_precisions={torch.float16})
    assert compiled.summary.ops_on_cpu == {}, compiled.summary.line()
    steps = _steps(compiled)
    assert steps[-1] == "rms_norm" and len(steps) == 2, steps


def test_safe_softmax_pieces_and_fmod_compile_alone():
    compiled = _compile(cs.RowSmallOps(), torch.randn(4, 33), torch.randn(4, 33))
    assert compiled.summary.ops_on_cpu == {}, compiled.summary.line()
    steps = _steps(compiled)
    assert "any" in steps and any("fmod" in s and "full_like" in s for s in steps), steps


def test_checks_refuse_with_reasons():
    reason = native().check_support("aten.any.dim", [("float32", [4, 8], False)], {"dim": -1, "keepdim": True},
                                    [("float32", [4, 1])])
    assert reason is not None and "bool" in reason
    reason = native().check_support("aten._softmax.default", [("float32", [4, 8], False)],
                                    {"dim": 2, "half_to_float": False}, [("float32", [4, 8])])
    assert reason is not None and "out of range" in reason
    assert native().check_support("aten.any.dim", [("bool", [4, 8], False)], {"dim": 1, "keepdim": False},
                                  [("bool", [4])]) is None


def test_inspect_shows_the_row_kernels(tmp_path):
    compiled = _compile(cs.SafeSoftmax(), torch.randn(6, 40))
    pte = kiln.save(compiled, tmp_path / "safe_softmax.pte")
    environ = dict(os.environ, PYTHONPATH=str(ROOT / "python"))
    result = subprocess.run([sys.executable, "-m", "kiln", "inspect", str(pte)], capture_output=True, text=True,
                            env=environ, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "kernel safe_softmax" in result.stdout, result.stdout
    assert "sm_90" in result.stdout
