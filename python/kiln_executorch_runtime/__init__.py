"""Kiln's run side for Python: importing this package registers the Kiln
delegate ("KilnBackend") in the process's ExecuTorch runtime, so

    import kiln_executorch_runtime
    from executorch.runtime import Runtime
    program = Runtime.get().load_program("model.pte")

runs Kiln programs with no other step. `load_program` verifies the whole
program (`verification=Verification.InternalConsistency`, the Python default):
keep it so, as a damaged file is then refused instead of crashing the process
(docs/reliability.md). If the delegate cannot be registered,
the import raises at once a KilnRuntimeError (an ImportError) saying why: no
GPU or driver (NoCudaGpuError), another ExecuTorch build than the one Kiln was
built against (ExecuTorchMismatchError), no ExecuTorch (ExecuTorchMissingError),
or no built libraries (KilnNotBuiltError).

KILN_SKIP_DELEGATE_REGISTRATION=1 (and `python -m kiln_executorch_runtime`)
import it for its path queries only: cmake_prefix_path(), library_dir(),
include_dir(), cmake_dir(); nothing is loaded then.
"""

from __future__ import annotations

import os
import sys

from ._errors import (
    ExecuTorchMismatchError,
    ExecuTorchMissingError,
    KilnNotBuiltError,
    KilnRuntimeError,
    NoCudaGpuError,
    RegistrationError,
)
from ._paths import (
    cmake_dir,
    cmake_prefix_path,
    delegate_library,
    executorch_prefix,
    include_dir,
    library_dir,
    package_dir,
)
from ._register import BACKEND_NAME, is_registered, kiln_backends, register

__version__ = "0.1.0"

__all__ = [
    "BACKEND_NAME",
    "ExecuTorchMismatchError",
    "ExecuTorchMissingError",
    "KilnNotBuiltError",
    "KilnRuntimeError",
    "NoCudaGpuError",
    "RegistrationError",
    "__version__",
    "cmake_dir",
    "cmake_prefix_path",
    "delegate_library",
    "executorch_prefix",
    "include_dir",
    "is_registered",
    "kiln_backends",
    "library_dir",
    "package_dir",
    "register",
]


def _path_query_only() -> bool:
    if os.environ.get("KILN_SKIP_DELEGATE_REGISTRATION", "") not in ("", "0"):
        return True
    # `python -m kiln_executorch_runtime ...` prints paths; it must work on
    # machines without a GPU, so the package import it triggers loads nothing.
    argv = list(getattr(sys, "orig_argv", []))
    return "-m" in argv and argv[argv.index("-m") + 1 : argv.index("-m") + 2] == [__name__]


if not _path_query_only():
    register()
