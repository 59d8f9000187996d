"""kiln_runner on a machine without a CUDA GPU: the program loads, the Kiln
delegate reports itself unavailable, and the runner says so plainly with its
documented exit status (3) instead of crashing. Skipped where a GPU is present
(the GPU tests cover that machine)."""

import os
import subprocess
from pathlib import Path

import pytest
import torch

import kiln
from _helpers import MLP, export, has_gpu

pytestmark = pytest.mark.needs_compiler

ROOT = Path(__file__).resolve().parents[2]
RUNNER = ROOT / os.environ.get("KILN_BUILD_DIR", "build") / "tools" / "kiln_runner" / "kiln_runner"


@pytest.mark.skipif(has_gpu(), reason="a CUDA GPU is present: the GPU tests (scripts/gpu_check.sh) run the model")
def test_runner_reports_missing_gpu(tmp_path):
    if not RUNNER.exists():
        pytest.fail(f"kiln_runner not built at {RUNNER}; run scripts/setup.sh (or set KILN_BUILD_DIR)")
    x = torch.randn(2, 64)
    pte = kiln.save(kiln.compile(export(MLP(), x)), tmp_path / "mlp.pte")
    proc = subprocess.run([str(RUNNER), f"--model_path={pte}", "--num_runs=1"], capture_output=True, text=True,
                          timeout=120)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 3, text
    assert "no usable CUDA GPU" in text
    assert "KilnBackend" in text


def test_runner_rejects_missing_model(tmp_path):
    if not RUNNER.exists():
        pytest.fail(f"kiln_runner not built at {RUNNER}; run scripts/setup.sh (or set KILN_BUILD_DIR)")
    proc = subprocess.run([str(RUNNER), f"--model_path={tmp_path / 'nope.pte'}"], capture_output=True, text=True)
    assert proc.returncode == 2
    assert "nope.pte" in proc.stdout + proc.stderr
