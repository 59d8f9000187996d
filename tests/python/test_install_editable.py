"""scripts/setup.sh's last step, scripts/install_editable.py: into a fresh
virtual environment (seeing this interpreter's torch and ExecuTorch), kiln
and kiln_executorch_runtime are installed in place from this checkout's
python/ folder, so they import from any folder without PYTHONPATH, the
`kiln` command runs, and a second run changes nothing. Real venv and pip,
no network (pip gets --no-index)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "install_editable.py"


def _run(args, cwd, env):
    return subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_install_editable_points_the_interpreter_at_this_checkout(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["KILN_SKIP_DELEGATE_REGISTRATION"] = "1"  # no GPU needed to import the runtime package
    venv = tmp_path / "venv"
    made = _run([sys.executable, "-m", "venv", "--system-site-packages", venv], tmp_path, env)
    assert made.returncode == 0, made.stderr
    python = venv / "bin" / "python"

    # setup.sh may already have installed this checkout into the base
    # interpreter (CI does, before the tests), which the venv sees.
    base_here = _run([sys.executable, SCRIPT, "--check"], tmp_path, env).returncode == 0
    assert _run([python, SCRIPT, "--check"], tmp_path, env).returncode == (0 if base_here else 1)
    first = _run([python, SCRIPT], tmp_path, env)
    assert first.returncode == 0, first.stdout + first.stderr
    expected = "already installed from " if base_here else "installed in place from "
    assert expected + str(ROOT / "python") in first.stdout, first.stdout
    again = _run([python, SCRIPT], tmp_path, env)
    assert again.returncode == 0 and "already installed" in again.stdout, again.stdout + again.stderr
    assert _run([python, SCRIPT, "--check"], tmp_path, env).returncode == 0

    # From a folder outside the checkout, without PYTHONPATH.
    where = _run([python, "-c", "import kiln, kiln_executorch_runtime, kiln_runtime; "
                  "print(kiln.__file__); print(kiln_executorch_runtime.__file__); print(kiln_runtime.__file__)"],
                 tmp_path, env)
    assert where.returncode == 0, where.stderr
    assert where.stdout.split() == [str(ROOT / "python" / "kiln" / "__init__.py"),
                                    str(ROOT / "python" / "kiln_executorch_runtime" / "__init__.py"),
                                    str(ROOT / "python" / "kiln_runtime" / "__init__.py")]
    # The command lives where the install happened: the venv, or the base interpreter's bin.
    command = (Path(sys.executable).parent if base_here else venv / "bin") / "kiln"
    usage = _run([command, "--help"], tmp_path, env)
    assert usage.returncode == 0 and "kiln inspect" in usage.stdout, usage.stderr
    usage = _run([python, "-m", "kiln", "--help"], tmp_path, env)
    assert usage.returncode == 0 and "kiln inspect" in usage.stdout, usage.stderr
