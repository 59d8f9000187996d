"""Shared fixtures (models and helpers live in _helpers.py).

Tests marked ``needs_compiler`` are skipped when the extension was never built
(no python/kiln/_kiln_compiler*.so). A built extension that fails to import is
a failure, not a skip, so a broken build is never hidden; set
KILN_REQUIRE_COMPILER=1 (CI) to turn the skip into a failure as well.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path

import pytest
import torch

from _helpers import MLP, CpuOpMLP, export

KILN_DIR = Path(__file__).resolve().parents[2] / "python" / "kiln"


def _compiler_state() -> tuple[bool, str]:
    built = sorted(KILN_DIR.glob("_kiln_compiler*.so")) + sorted(KILN_DIR.glob("_kiln_compiler*.pyd"))
    if not built and os.environ.get("KILN_REQUIRE_COMPILER") != "1":
        return False, (
            "kiln._kiln_compiler is not built (no python/kiln/_kiln_compiler*.so); build with "
            "cmake -S . -B build-py -G Ninja -DKILN_BUILD_RUNTIME=OFF -DKILN_BUILD_TESTS=OFF "
            "&& cmake --build build-py"
        )
    try:
        importlib.import_module("kiln._kiln_compiler")
    except ImportError as e:  # a broken (or required but missing) build fails loudly
        raise pytest.UsageError(f"kiln._kiln_compiler does not import: {e}") from e
    return True, ""


def pytest_collection_modifyitems(config, items):
    available, reason = _compiler_state()
    if available:
        return
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if "needs_compiler" in item.keywords:
            item.add_marker(skip)


# ---- fixtures ---------------------------------------------------------------


@pytest.fixture
def mlp_program():
    torch.manual_seed(0)
    return export(MLP(), torch.randn(8, 64))


@pytest.fixture
def cpu_op_program():
    torch.manual_seed(0)
    return export(CpuOpMLP(), torch.randn(8, 64))


@pytest.fixture(scope="session")
def compiled_mlp():
    """kiln.compile of the MLP with default options, shared to save time."""
    import kiln

    torch.manual_seed(0)
    return kiln.compile(export(MLP(), torch.randn(8, 64)))
