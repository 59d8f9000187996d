"""Half-precision exports: an fp16 model, and fp32 models computing in
fp16/bf16 inside the engine."""

import pytest
import torch

import kiln

from _helpers import MLP, engines_in_pte, export, lowered_modules

pytestmark = pytest.mark.needs_compiler


def _engine(compiled):
    (lowered,) = lowered_modules(compiled.edge_program_manager)
    return kiln._kiln_compiler.inspect_engine(lowered.processed_bytes)


def test_fp16_model(tmp_path):
    model = MLP().half()
    x = torch.randn(8, 64).half()
    compiled = kiln.compile(export(model, x), arg_inputs=(x,), enabled_precisions={torch.float16})
    assert compiled.delegates == ["KilnBackend"]
    info = _engine(compiled)
    assert info["metadata"]["precision"] == "float16"
    io = [info["tensors"][i] for i in info["inputs"] + info["outputs"]]
    assert [t["dtype"] for t in io] == ["float16", "float16"]
    weights = [t for t in info["tensors"] if t["storage"] in ("weight", "named_weight")]
    assert weights and all(t["dtype"] == "float16" for t in weights)
    path = kiln.save(compiled, tmp_path / "mlp_fp16.pte")
    assert [b for b, _, _ in engines_in_pte(path.read_bytes())] == ["KilnBackend"]


@pytest.mark.parametrize("precision, name", [(torch.float16, "float16"), (torch.bfloat16, "bfloat16")])
def test_fp32_model_computing_in_lower_precision(precision, name):
    compiled = kiln.compile(export(MLP(), torch.randn(4, 64)), enabled_precisions={precision})
    info = _engine(compiled)
    assert info["metadata"]["precision"] == name
    # The engine's edges keep the program's dtypes.
    io = [info["tensors"][i] for i in info["inputs"] + info["outputs"]]
    assert [t["dtype"] for t in io] == ["float32", "float32"]


def test_bf16_model_constants():
    model = MLP().to(torch.bfloat16)
    x = torch.randn(2, 64).to(torch.bfloat16)
    compiled = kiln.compile(export(model, x), enabled_precisions={torch.bfloat16})
    info = _engine(compiled)
    weights = [t for t in info["tensors"] if t["storage"] in ("weight", "named_weight")]
    assert weights and all(t["dtype"] == "bfloat16" for t in weights)
    expected = sum(p.numel() * 2 for p in model.parameters())
    assert sum(t["nbytes"] for t in weights) == expected
