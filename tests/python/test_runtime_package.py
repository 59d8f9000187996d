"""kiln_executorch_runtime: import-time registration and its error messages.

Each case runs in a fresh interpreter (registration is per process). The
failure cases go through the real checks: CUDA_VISIBLE_DEVICES="" hides every
GPU (so the no-GPU test means the same on a GPU machine), a directory earlier
on sys.path supplies another executorch.version, and sys.modules blocks
ExecuTorch entirely.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "python" / "kiln_executorch_runtime"
BUILT = (PACKAGE / "lib" / "libexecutorch_backend_kiln.so").is_file() and (
    PACKAGE / "_build_info.py"
).is_file()
needs_runtime = pytest.mark.skipif(
    not BUILT,
    reason="the Kiln runtime is not built (no python/kiln_executorch_runtime/lib/); "
    "run bash scripts/setup.sh",
)
HAS_GPU = shutil.which("nvidia-smi") is not None and subprocess.run(
    ["nvidia-smi", "-L"], capture_output=True).returncode == 0


def run_python(code: str, *, pythonpath: list[Path] | None = None, **env: str):
    """Runs `code` in a fresh interpreter with PYTHONPATH=python (plus any
    extra entries first); returns the CompletedProcess."""
    environ = {k: v for k, v in os.environ.items()
               if not k.startswith(("KILN_SKIP_", "KILN_REGISTER_"))}
    paths = [str(p) for p in (pythonpath or [])] + [str(ROOT / "python")]
    environ["PYTHONPATH"] = os.pathsep.join(paths)
    environ.update(env)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, env=environ, cwd=ROOT, timeout=300)


CATCH = """
try:
    import kiln_executorch_runtime
except ImportError as e:
    print("ERROR", type(e).__name__, e.reason)
    print(e)
else:
    print("IMPORTED")
"""


@needs_runtime
def test_import_without_gpu_raises_naming_the_cause():
    result = run_python(CATCH, CUDA_VISIBLE_DEVICES="")
    assert result.returncode == 0, result.stderr
    assert "ERROR NoCudaGpuError no_cuda_gpu" in result.stdout
    assert "no usable CUDA GPU" in result.stdout
    assert "KILN_SKIP_DELEGATE_REGISTRATION=1" in result.stdout
    # Nothing of Kiln was loaded before the error.
    assert "libexecutorch_backend_kiln" not in result.stdout


@needs_runtime
def test_uncaught_import_error_is_one_clear_line():
    result = run_python("import kiln_executorch_runtime", CUDA_VISIBLE_DEVICES="")
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("kiln_executorch_runtime.NoCudaGpuError: kiln_executorch_runtime: no usable CUDA GPU")


@needs_runtime
def test_other_executorch_build_is_refused(tmp_path):
    # executorch is a namespace package: an earlier path entry's version.py wins.
    fake = tmp_path / "executorch"
    fake.mkdir()
    (fake / "version.py").write_text('__version__ = "1.4.0+cpu"\ngit_version = None\n')
    result = run_python(CATCH, pythonpath=[tmp_path], KILN_REGISTER_WITHOUT_GPU="1")
    assert "ERROR ExecuTorchMismatchError executorch_mismatch" in result.stdout, result.stderr
    assert "built against ExecuTorch 1.5.1+cpu" in result.stdout
    assert "this Python has ExecuTorch 1.4.0+cpu" in result.stdout
    assert "pip install executorch==1.5.1" in result.stdout


@needs_runtime
def test_missing_executorch_is_named():
    result = run_python("import sys; sys.modules['executorch'] = None\n" + CATCH)
    assert "ERROR ExecuTorchMissingError executorch_missing" in result.stdout, result.stderr
    assert "ExecuTorch is not installed" in result.stdout
    assert "pip install executorch==1.5.1" in result.stdout


def test_unbuilt_package_says_how_to_build(tmp_path):
    # Only the sources, as in a fresh checkout.
    copy = tmp_path / "kiln_executorch_runtime"
    copy.mkdir()
    for source in PACKAGE.glob("*.py"):
        if source.name != "_build_info.py":
            shutil.copy(source, copy)
    result = run_python(CATCH, pythonpath=[tmp_path])
    assert "ERROR KilnNotBuiltError not_built" in result.stdout, result.stderr
    assert "scripts/setup.sh" in result.stdout


@needs_runtime
def test_skip_registration_is_a_path_query_only():
    result = run_python("""
        import sys
        import kiln_executorch_runtime as k
        print(k.cmake_prefix_path())
        print(k.library_dir()); print(k.include_dir()); print(k.cmake_dir())
        maps = open("/proc/self/maps").read()
        print("loaded" if "libexecutorch_backend_kiln" in maps or "libexecutorch.so" in maps else "nothing loaded")
        print(k.is_registered())
    """, KILN_SKIP_DELEGATE_REGISTRATION="1", CUDA_VISIBLE_DEVICES="")
    assert result.returncode == 0, result.stderr
    prefix, lib, include, cmake, loaded, registered = result.stdout.strip().splitlines()
    kiln_prefix, et_prefix = prefix.split(";")
    assert Path(kiln_prefix) == PACKAGE
    assert (Path(et_prefix) / "share" / "cmake" / "executorch-config.cmake").is_file()
    assert (Path(lib) / "libexecutorch_backend_kiln.so").is_file()
    assert (Path(include) / "kiln" / "caller_stream.h").is_file()
    assert (Path(cmake) / "executorch_backend_kiln-config.cmake").is_file()
    assert loaded == "nothing loaded"
    assert registered == "False"


@needs_runtime
def test_cli_prints_cmake_prefix_path_without_loading():
    environ = {k: v for k, v in os.environ.items() if not k.startswith("KILN_")}
    environ.update(PYTHONPATH=str(ROOT / "python"), CUDA_VISIBLE_DEVICES="")
    result = subprocess.run([sys.executable, "-m", "kiln_executorch_runtime", "--cmake-prefix-path"],
                            capture_output=True, text=True, env=environ, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().split(";")[0] == str(PACKAGE)
    check = subprocess.run([sys.executable, "-m", "kiln_executorch_runtime", "--check"],
                           capture_output=True, text=True, env=environ, cwd=ROOT)
    assert check.returncode == 1
    assert "no usable CUDA GPU" in check.stderr


@needs_runtime
def test_registers_once_however_often_imported():
    result = run_python("""
        import importlib
        import kiln_executorch_runtime
        import kiln_executorch_runtime as again
        importlib.reload(kiln_executorch_runtime)
        print(kiln_executorch_runtime.register(), kiln_executorch_runtime.register())
        from executorch.runtime import Runtime
        registry = Runtime.get().backend_registry
        print(registry.registered_backend_names.count("KilnBackend"), registry.is_available("KilnBackend"))
    """, KILN_REGISTER_WITHOUT_GPU="1", CUDA_VISIBLE_DEVICES="")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert lines[-2] == "['KilnBackend'] ['KilnBackend']"
    # Registered once; unavailable because no GPU is visible.
    assert lines[-1] == "1 False"
    assert "register_backend failed" not in result.stderr


@pytest.fixture(scope="module")
def tiny_pte(tmp_path_factory):
    pytest.importorskip("kiln._kiln_compiler", reason="the compiler extension is not built")
    import torch

    import kiln

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    exported = torch.export.export(model.eval(), (torch.randn(2, 16),))
    return kiln.save(kiln.compile(exported), tmp_path_factory.mktemp("pte") / "tiny.pte")


@needs_runtime
@pytest.mark.needs_compiler
def test_loading_a_kiln_program_without_gpu_fails_cleanly(tiny_pte):
    result = run_python(f"""
        import kiln_executorch_runtime
        from executorch.runtime import Runtime
        program = Runtime.get().load_program({str(tiny_pte)!r})
        try:
            program.load_method("forward")
        except RuntimeError as e:
            print("load_method failed:", e)
        else:
            print("loaded")
    """, KILN_REGISTER_WITHOUT_GPU="1", CUDA_VISIBLE_DEVICES="")
    assert result.returncode == 0, result.stderr  # an error, not a crash
    assert "load_method failed" in result.stdout
    assert "Backend KilnBackend is not available" in result.stderr
