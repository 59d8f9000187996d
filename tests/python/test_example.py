"""examples/export_mlp.py runs on a CPU-only machine and writes what
kiln_runner needs."""

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from kiln import tensor_file

from _helpers import engines_in_pte

pytestmark = pytest.mark.needs_compiler

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "export_mlp.py"


def _load_example():
    spec = importlib.util.spec_from_file_location("export_mlp", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_export_mlp(tmp_path, capsys):
    assert _load_example().main(["--out", str(tmp_path), "--batch", "2"]) == 0
    out = capsys.readouterr()
    assert "seed:" in out.out
    assert "1 op left to the CPU: aten.flip.default" in out.err

    expected_delegates = {"mlp_fp32": 1, "mlp_fp16": 1, "mlp_fp32_in_fp16": 1, "mlp_cpu_op_fp32": 2}
    for name, delegates in expected_delegates.items():
        pte = (tmp_path / f"{name}.pte").read_bytes()
        assert pte[4:8] == b"ET12"
        assert [b for b, _, _ in engines_in_pte(pte)] == ["KilnBackend"] * delegates
        (x,) = tensor_file.load(tmp_path / f"{name}.inputs.ktensors")
        (y,) = tensor_file.load(tmp_path / f"{name}.expected.ktensors")
        dtype = np.float16 if name == "mlp_fp16" else np.float32
        assert x.dtype == dtype and x.shape == (2, 512)
        assert y.dtype == dtype and y.shape == (2, 32)
        assert np.isfinite(y).all()

    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert [m["name"] for m in manifest] == list(expected_delegates)
    for m in manifest:
        assert (tmp_path / m["state_dict"]).exists()
        assert len(m["delegates"]) == expected_delegates[m["name"]]


def test_fp16_reference_is_computed_in_fp32():
    example = _load_example()
    torch.manual_seed(0)
    model = example.sample_models.Mlp().half()
    x = torch.randn(2, 512).half()
    got = example.reference(model, x)
    want = model.float()(x.float()).half()
    assert got.dtype == torch.float16
    assert torch.equal(got, want)
