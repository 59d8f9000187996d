"""The user-facing examples run as documented (docs/user_guide.md).
examples/cpp_module_app is built and run by test_cmake_package.py."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from _helpers import engines_in_pte

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
HAS_GPU = shutil.which("nvidia-smi") is not None and subprocess.run(
    ["nvidia-smi", "-L"], capture_output=True).returncode == 0
RUNTIME_BUILT = (ROOT / "python" / "kiln_executorch_runtime" / "lib" / "libexecutorch_backend_kiln.so").is_file()


def run_example(name: str, *args, **env) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("KILN_")}
    environ["PYTHONPATH"] = str(ROOT / "python")
    environ.update(env)
    return subprocess.run([sys.executable, str(EXAMPLES / name), *map(str, args)], capture_output=True,
                          text=True, env=environ, cwd=ROOT, timeout=600)


@pytest.fixture(scope="module")
def static_export(tmp_path_factory) -> Path:
    pytest.importorskip("kiln._kiln_compiler", reason="the compiler extension is not built")
    out = tmp_path_factory.mktemp("static")
    result = run_example("export_static_shape.py", "--out", out)
    assert result.returncode == 0, result.stderr
    assert "delegates ['KilnBackend']" in result.stdout
    return out


@pytest.mark.needs_compiler
def test_export_static_shape_writes_program_and_references(static_export):
    data = (static_export / "model.pte").read_bytes()
    assert [backend for backend, _, _ in engines_in_pte(data)] == ["KilnBackend"]
    from kiln import tensor_file

    (x,) = tensor_file.load(static_export / "model.inputs.ktensors")
    (y,) = tensor_file.load(static_export / "model.expected.ktensors")
    assert x.shape == (4, 64) and y.shape == (4, 10)


@pytest.mark.needs_compiler
@pytest.mark.skipif(not RUNTIME_BUILT, reason="the Kiln runtime is not built; run bash scripts/setup.sh")
def test_run_pte(static_export):
    result = run_example("run_pte.py", static_export / "model.pte",
                         "--inputs", static_export / "model.inputs.ktensors",
                         "--expected", static_export / "model.expected.ktensors")
    if HAS_GPU:
        assert result.returncode == 0, result.stdout + result.stderr
        assert "PASS" in result.stdout
    else:
        assert result.returncode == 3, result.stdout + result.stderr
        assert "cannot run Kiln programs on this machine" in result.stderr
        assert "no usable CUDA GPU" in result.stderr


@pytest.mark.needs_compiler
@pytest.mark.skipif(HAS_GPU, reason="checks the no-GPU path")
@pytest.mark.skipif(not RUNTIME_BUILT, reason="the Kiln runtime is not built; run bash scripts/setup.sh")
def test_run_pte_registered_without_gpu_fails_at_load(static_export):
    result = run_example("run_pte.py", static_export / "model.pte",
                         "--inputs", static_export / "model.inputs.ktensors",
                         KILN_REGISTER_WITHOUT_GPU="1")
    assert result.returncode == 3, result.stdout + result.stderr
    assert "cannot load 'forward'" in result.stderr
    assert "Backend KilnBackend is not available" in result.stderr


def test_run_pte_reports_bad_files(tmp_path):
    (tmp_path / "in.ktensors").write_bytes(b"garbage-but-longer-than-the-magic")
    result = run_example("run_pte.py", tmp_path / "missing.pte", "--inputs", tmp_path / "in.ktensors")
    assert result.returncode == 2
    assert "not a Kiln tensor file" in result.stderr



def guide_blocks() -> list[str]:
    """The ```sh blocks of docs/user_guide.md: the commands it promises run on
    any machine (```bash blocks need a GPU or install software)."""
    text = (ROOT / "docs" / "user_guide.md").read_text()
    blocks, inside = [], None
    for line in text.splitlines():
        if inside is None and line.strip() == "```sh":
            inside = []
        elif inside is not None and line.strip() == "```":
            blocks.append("\n".join(inside))
            inside = None
        elif inside is not None:
            inside.append(line)
    return blocks


@pytest.mark.needs_compiler
@pytest.mark.skipif(not RUNTIME_BUILT, reason="the Kiln runtime is not built; run bash scripts/setup.sh")
def test_user_guide_commands_work_as_written():
    import cmake

    blocks = guide_blocks()
    assert len(blocks) >= 4
    environ = {k: v for k, v in os.environ.items() if not k.startswith("KILN_")}
    environ["PATH"] = os.pathsep.join([cmake.CMAKE_BIN_DIR, os.path.dirname(sys.executable), environ["PATH"]])
    for block in blocks:
        if "cmake --install build " in block and not (ROOT / "build" / "cmake_install.cmake").is_file():
            continue  # needs the build/ that scripts/setup.sh makes (CI has it)
        result = subprocess.run(["bash", "-euo", "pipefail", "-c", block], capture_output=True, text=True,
                                env=environ, cwd=ROOT, timeout=600)
        assert result.returncode == 0, f"{block}\n--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"
    assert (ROOT / "out" / "static" / "model.json").is_file()
    assert (ROOT / "out" / "cpp_module_app" / "cpp_module_app").is_file()


@pytest.mark.needs_compiler
def test_export_device_resident(tmp_path):
    import inspect as pyinspect

    import kiln

    if "backend_config" not in pyinspect.signature(kiln.save).parameters:
        pytest.skip("kiln.save has no backend_config yet")
    result = run_example("export_device_resident.py", "--out", tmp_path)
    assert result.returncode == 0, result.stderr
    assert "inputs and outputs stay on the GPU" in result.stdout

    from executorch.exir._serialize._program import deserialize_pte_binary

    program = deserialize_pte_binary((tmp_path / "model.pte").read_bytes()).program
    (plan,) = program.execution_plan
    specs = {s.key for d in plan.delegates for s in d.compile_specs}
    if "target_device" not in specs:
        pytest.xfail("the Kiln delegate declares no target_device compile spec, so ExecuTorch "
                     "keeps the method's inputs and outputs on the host")

    def device(index: int) -> str:
        info = plan.values[index].val.extra_tensor_info
        return info.device_type.name if info is not None else "CPU"

    assert [device(i) for i in list(plan.inputs) + list(plan.outputs)] == ["CUDA", "CUDA"]
