"""Installs this checkout's Python packages, `kiln`,
`kiln_executorch_runtime` and `kiln_runtime`, into the interpreter running
this script, in place: the installed distribution is a .pth file naming this
checkout's python/ folder (what the build fills: the compiler extension in
python/kiln, the delegate libraries in python/kiln_executorch_runtime/lib,
libkiln_c_api.so in python/kiln_runtime/lib), plus the
`kiln` command. Edits and rebuilds need no reinstall; `pip uninstall kiln`
removes it. Called by scripts/setup.sh after the build.

pip installs it from a small wheel written here (build/editable/): the same
thing a PEP 660 editable install puts in site-packages, without running the
CMake build a second time as `pip install -e .` would. No network is used.

    python3 scripts/install_editable.py [--check]

--check only reports whether the interpreter already imports kiln from this
checkout (exit 0) or not (exit 1).
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import importlib.metadata
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYTHON_DIR = ROOT / "python"
PTH_NAME = "__editable__.kiln.pth"


def project_version() -> str:
    text = (ROOT / "pyproject.toml").read_text()
    match = re.search(r'^version\s*=\s*"([^"]+)"', text, re.MULTILINE)
    if not match:
        raise SystemExit("install_editable: no version in pyproject.toml")
    return match.group(1)


def installed_here() -> bool:
    """True when the installed `kiln` distribution is this checkout's .pth."""
    try:
        dist = importlib.metadata.distribution("kiln")
    except importlib.metadata.PackageNotFoundError:
        return False
    for file in dist.files or []:
        if file.name == PTH_NAME:
            try:
                return Path(file.locate()).read_text().strip() == str(PYTHON_DIR)
            except OSError:
                return False
    return False


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def write_wheel(folder: Path, version: str) -> Path:
    dist_info = f"kiln-{version}.dist-info"
    files = {
        PTH_NAME: (str(PYTHON_DIR) + "\n").encode(),
        f"{dist_info}/METADATA": (
            "Metadata-Version: 2.1\n"
            "Name: kiln\n"
            f"Version: {version}\n"
            "Summary: Kiln from the checkout at " + str(ROOT) + " (in place: scripts/install_editable.py)\n"
        ).encode(),
        f"{dist_info}/WHEEL": (
            "Wheel-Version: 1.0\n"
            "Generator: kiln scripts/install_editable.py\n"
            "Root-Is-Purelib: true\n"
            "Tag: py3-none-any\n"
        ).encode(),
        f"{dist_info}/entry_points.txt": b"[console_scripts]\nkiln = kiln.__main__:main\n",
        f"{dist_info}/top_level.txt": b"kiln\nkiln_executorch_runtime\nkiln_runtime\n",
    }
    record = [_record_line(name, data) for name, data in files.items()] + [f"{dist_info}/RECORD,,"]
    files[f"{dist_info}/RECORD"] = ("\n".join(record) + "\n").encode()
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / f"kiln-{version}-0editable-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in files.items():
            z.writestr(name, data)
    return wheel


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only say whether it is installed from here")
    args = parser.parse_args()
    if args.check:
        ok = installed_here()
        print(f"kiln {'is' if ok else 'is not'} installed from {PYTHON_DIR} in {sys.executable}")
        return 0 if ok else 1
    if not (PYTHON_DIR / "kiln" / "__init__.py").is_file():
        raise SystemExit(f"install_editable: {PYTHON_DIR}/kiln is missing; run from a Kiln checkout")
    if installed_here():
        print(f"install_editable: kiln already installed from {PYTHON_DIR}")
        return 0
    wheel = write_wheel(ROOT / "build" / "editable", project_version())
    # Replaces any other kiln (another checkout's, or a wheel) in this interpreter.
    command = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps",
               "--no-index", "--force-reinstall", str(wheel)]
    env = dict(os.environ, PIP_NO_INPUT="1")
    result = subprocess.run(command, env=env)
    if result.returncode != 0:
        raise SystemExit(f"install_editable: pip could not install {wheel} into {sys.executable} "
                         f"(exit {result.returncode}); see pip's message above")
    if not installed_here():
        raise SystemExit(f"install_editable: pip installed {wheel}, but {sys.executable} does not see it")
    print(f"install_editable: kiln, kiln_executorch_runtime and kiln_runtime installed in place from {PYTHON_DIR}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
