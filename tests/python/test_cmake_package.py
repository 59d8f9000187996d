"""The CMake package executorch_backend_kiln as a user consumes it: install
the build to a temporary prefix, build examples/cpp_module_app out of tree
with -Wl,--as-needed, and run it without LD_LIBRARY_PATH.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "python" / "kiln_executorch_runtime"
APP_SOURCE = ROOT / "examples" / "cpp_module_app"
HAS_GPU = shutil.which("nvidia-smi") is not None and subprocess.run(
    ["nvidia-smi", "-L"], capture_output=True).returncode == 0

# Exit codes documented in examples/cpp_module_app/main.cpp.
EXIT_OK, EXIT_NO_GPU = 0, 3


def build_dir() -> Path:
    info = PACKAGE / "_build_info.py"
    if not info.is_file():
        pytest.skip("the Kiln runtime is not built (no python/kiln_executorch_runtime/_build_info.py); "
                    "run bash scripts/setup.sh")
    namespace: dict = {}
    exec(info.read_text(), namespace)
    path = Path(namespace["BUILD_DIR"])
    if not (path / "cmake_install.cmake").is_file():
        pytest.skip(f"the build directory {path} that made the runtime package is gone")
    return path


def cmake_bin() -> str:
    import cmake

    return os.path.join(cmake.CMAKE_BIN_DIR, "cmake")


def run(cmd: list, **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=600, **kwargs)
    assert result.returncode == 0, f"{' '.join(map(str, cmd))}\n{result.stdout}\n{result.stderr}"
    return result


def clean_env() -> dict:
    """The environment minus loader paths, so the binary must find its
    libraries through its own RUNPATH."""
    return {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "LD_PRELOAD")}


def runpath(binary: Path) -> list[str]:
    out = run(["readelf", "-d", binary]).stdout
    for line in out.splitlines():
        if "(RUNPATH)" in line or "(RPATH)" in line:
            return line.split("[", 1)[1].rstrip("]").split(":")
    return []


def needed(binary: Path) -> list[str]:
    out = run(["readelf", "-d", binary]).stdout
    return [line.split("[", 1)[1].rstrip("]") for line in out.splitlines() if "(NEEDED)" in line]


@pytest.fixture(scope="module")
def prefix(tmp_path_factory) -> Path:
    dest = tmp_path_factory.mktemp("kiln-prefix")
    run([cmake_bin(), "--install", build_dir(), "--prefix", dest, "--component", "kiln_runtime"])
    return dest


@pytest.fixture(scope="module")
def tiny_pte(tmp_path_factory) -> Path:
    pytest.importorskip("kiln._kiln_compiler", reason="the compiler extension is not built")
    import torch

    import kiln

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    exported = torch.export.export(model.eval(), (torch.randn(2, 16),))
    return kiln.save(kiln.compile(exported), tmp_path_factory.mktemp("pte") / "tiny.pte")


def build_app(prefix: Path, dest: Path, *extra: str) -> Path:
    import executorch

    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    run([cmake_bin(), "-S", APP_SOURCE, "-B", dest, *generator, "-DCMAKE_BUILD_TYPE=Release",
         f"-DCMAKE_PREFIX_PATH={prefix};{list(executorch.__path__)[0]}",
         "-DCMAKE_EXE_LINKER_FLAGS=-Wl,--as-needed", *extra])
    run([cmake_bin(), "--build", dest])
    return dest / "cpp_module_app"


def test_install_layout(prefix):
    for relative in ("lib/libexecutorch_backend_kiln.so", "lib/libkiln_caller_stream.so",
                     "include/kiln/caller_stream.h",
                     "lib/cmake/executorch_backend_kiln/executorch_backend_kiln-config.cmake",
                     "lib/cmake/executorch_backend_kiln/executorch_backend_kiln-config-version.cmake"):
        assert (prefix / relative).is_file(), relative
    # The installed delegate finds ExecuTorch's runtime by itself.
    import executorch

    et_lib = str(Path(list(executorch.__path__)[0]).resolve() / "lib")
    assert et_lib in runpath(prefix / "lib" / "libexecutorch_backend_kiln.so")


@pytest.mark.needs_compiler
def test_out_of_tree_app_runs_without_library_path(prefix, tiny_pte, tmp_path):
    app = build_app(prefix, tmp_path / "app", "-DAPP_USE_CALLER_STREAM=ON")
    # --as-needed did not drop the registration-only library.
    assert "libexecutorch_backend_kiln.so" in needed(app)
    assert str(prefix / "lib") in runpath(app)
    result = subprocess.run([app, tiny_pte], capture_output=True, text=True, env=clean_env(), timeout=120)
    assert "error while loading shared libraries" not in result.stderr
    if HAS_GPU:
        assert result.returncode == EXIT_OK, result.stderr
        assert "KilnBackend: registered, CUDA GPU available" in result.stdout
    else:
        assert result.returncode == EXIT_NO_GPU, (result.stdout, result.stderr)
        assert "KilnBackend: registered, no usable CUDA GPU" in result.stdout
        assert "needs an NVIDIA GPU" in result.stderr


@pytest.mark.needs_compiler
def test_embed_runpath_off_leaves_deployment_to_the_user(prefix, tiny_pte, tmp_path):
    app = build_app(prefix, tmp_path / "app-norpath", "-DKILN_EMBED_RUNPATH=OFF")
    assert str(prefix / "lib") not in runpath(app)
    result = subprocess.run([app, tiny_pte], capture_output=True, text=True, env=clean_env(), timeout=120)
    assert result.returncode == 127 and "libexecutorch_backend_kiln.so" in result.stderr
    env = clean_env()
    env["LD_LIBRARY_PATH"] = str(prefix / "lib")
    result = subprocess.run([app, tiny_pte], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == (EXIT_OK if HAS_GPU else EXIT_NO_GPU), result.stderr


def test_cmake_prefix_path_command_finds_both_packages(tmp_path):
    """The printed prefix path is all a consumer's configure needs."""
    build_dir()  # skips when the runtime package is not built
    env = {k: v for k, v in os.environ.items() if not k.startswith("KILN_")}
    env["PYTHONPATH"] = str(ROOT / "python")
    printed = run([sys.executable, "-m", "kiln_executorch_runtime", "--cmake-prefix-path"], env=env).stdout.strip()
    project = tmp_path / "probe"
    project.mkdir()
    (project / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.28)\nproject(probe LANGUAGES CXX)\n"
        "find_package(executorch REQUIRED)\nfind_package(executorch_backend_kiln REQUIRED)\n"
        "foreach(t executorch::runtime executorch::backend_kiln kiln::caller_stream)\n"
        "  if(NOT TARGET ${t})\n    message(FATAL_ERROR \"no ${t}\")\n  endif()\nendforeach()\n"
        "message(STATUS \"kiln lib: ${executorch_backend_kiln_LIBRARY_DIR}\")\n")
    out = run([cmake_bin(), "-S", project, "-B", tmp_path / "b", f"-DCMAKE_PREFIX_PATH={printed}"]).stdout
    assert f"kiln lib: {PACKAGE / 'lib'}" in out
