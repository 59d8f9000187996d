"""kiln_runner's checking and reporting on a program with no Kiln partition
(ExecuTorch's portable CPU kernels run all of it), so that they run on a
machine without a GPU: the comparison against --expected (pass, a wrong value,
a wrong shape, a wrong count), --save_outputs, the summary without
--expected, and a bad input file. The GPU tests drive the same code with Kiln
engines."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import torch

from kiln import tensor_file

pytestmark = pytest.mark.needs_compiler  # kiln_runner is built with the extension

ROOT = Path(__file__).resolve().parents[2]
RUNNER = ROOT / os.environ.get("KILN_BUILD_DIR", "build") / "tools" / "kiln_runner" / "kiln_runner"


class _Small(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(16, 8)

    def forward(self, x):
        return torch.relu(self.fc(x)) * 2.0, x.sum(dim=1)


@pytest.fixture(scope="module")
def program(tmp_path_factory):
    """(.pte with no delegate, input file, the model's outputs on that input)."""
    from executorch.exir import to_edge

    if not RUNNER.exists():
        pytest.fail(f"kiln_runner not built at {RUNNER}; run scripts/setup.sh (or set KILN_BUILD_DIR)")
    folder = tmp_path_factory.mktemp("cpu_program")
    torch.manual_seed(0)
    model = _Small().eval()
    x = torch.randn(3, 16)
    pte = folder / "small.pte"
    pte.write_bytes(to_edge(torch.export.export(model, (x,))).to_executorch().buffer)
    inputs = tensor_file.save(folder / "in.ktensors", [x])
    with torch.no_grad():
        want = [t.clone() for t in model(x)]
    return pte, inputs, want


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(RUNNER), *args, "--num_runs=2", "--warmup=1"], capture_output=True, text=True,
                          timeout=120)


def test_matching_outputs_pass_and_are_saved(program, tmp_path):
    pte, inputs, want = program
    expected = tensor_file.save(tmp_path / "want.ktensors", want)
    saved = tmp_path / "got.ktensors"
    proc = _run(f"--model_path={pte}", f"--inputs={inputs}", f"--expected={expected}", f"--save_outputs={saved}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "delegates: none" in proc.stdout
    assert proc.stdout.count(" PASS") == 2 and proc.stdout.rstrip().endswith("PASS")
    got = [torch.as_tensor(t) for t in tensor_file.load(saved)]
    assert len(got) == 2 and all(torch.allclose(g, w, rtol=1e-5, atol=1e-6) for g, w in zip(got, want))


def test_a_wrong_value_fails_with_its_error(program, tmp_path):
    pte, inputs, want = program
    off = [want[0] * 1.01, want[1]]
    expected = tensor_file.save(tmp_path / "off.ktensors", off)
    proc = _run(f"--model_path={pte}", f"--inputs={inputs}", f"--expected={expected}")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    line = next(l for l in proc.stdout.splitlines() if l.startswith("output 0:"))
    assert "FAIL" in line and "rtol" in line
    rel = float(line.split("rel_err=")[1].split()[0])
    assert 5e-3 < rel < 2e-2  # the 1% the expected values were moved by
    assert "output 1:" in proc.stdout and proc.stdout.rstrip().endswith("FAIL")


def test_a_wrong_shape_or_count_fails_naming_both(program, tmp_path):
    pte, inputs, want = program
    expected = tensor_file.save(tmp_path / "shape.ktensors", [want[0].reshape(8, 3), want[1]])
    proc = _run(f"--model_path={pte}", f"--inputs={inputs}", f"--expected={expected}")
    assert proc.returncode == 1
    assert "float32 [3, 8], expected float32 [8, 3] FAIL" in proc.stdout
    expected = tensor_file.save(tmp_path / "count.ktensors", want[:1])
    proc = _run(f"--model_path={pte}", f"--inputs={inputs}", f"--expected={expected}")
    assert proc.returncode == 1
    assert "has 1 tensors but method 'forward' returned 2 outputs" in proc.stdout


def test_without_expected_outputs_are_summarized(program):
    pte, inputs, want = program
    proc = _run(f"--model_path={pte}", f"--inputs={inputs}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    line = next(l for l in proc.stdout.splitlines() if l.startswith("output 1:"))
    assert "(no --expected given)" in line
    printed, true = float(line.split("abs_max=")[1].split()[0]), float(want[1].abs().max())
    assert abs(printed - true) <= 1e-3 * true  # printed to 4 significant digits


def test_an_input_of_the_wrong_shape_is_refused(program, tmp_path):
    pte, _, _ = program
    bad = tensor_file.save(tmp_path / "bad.ktensors", [torch.randn(4, 16)])
    proc = _run(f"--model_path={pte}", f"--inputs={bad}")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    text = proc.stdout + proc.stderr
    assert "input 0" in text and "[3, 16]" in text and "[4, 16]" in text
