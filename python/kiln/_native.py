"""Access to the compiled extension ``kiln._kiln_compiler``.

Imported lazily so the pure-Python parts of the package (``kiln.tensor_file``,
option validation) work on a checkout where the extension is not built yet.
"""

from __future__ import annotations

import importlib
from types import ModuleType

_BUILD_HINT = (
    "build it with: cmake -S . -B build-py -G Ninja -DKILN_BUILD_RUNTIME=OFF "
    "-DKILN_BUILD_TESTS=OFF && cmake --build build-py (it lands in python/kiln/)"
)

_module: ModuleType | None = None
_import_error: ImportError | None = None


def _try_import() -> ModuleType | None:
    global _module, _import_error
    if _module is None and _import_error is None:
        try:
            _module = importlib.import_module("kiln._kiln_compiler")
        except ImportError as e:  # not built, or built for another Python
            _import_error = e
    return _module


def available() -> bool:
    """True when the extension imports."""
    return _try_import() is not None


def native() -> ModuleType:
    """The extension module; raises ImportError with a build hint if missing."""
    module = _try_import()
    if module is None:
        raise ImportError(
            f"kiln._kiln_compiler is not importable ({_import_error}); {_BUILD_HINT}"
        ) from _import_error
    return module


def _fallback_compile_error() -> type:
    class CompileError(RuntimeError):
        """Raised when Kiln cannot compile a partition (extension not built)."""

    CompileError.__module__ = "kiln"
    CompileError.__qualname__ = "CompileError"
    return CompileError


# The extension's class when it is built, so errors raised in C++ and errors
# raised by the Python layer are the same type.
CompileError: type = (
    _try_import().CompileError if available() else _fallback_compile_error()
)
