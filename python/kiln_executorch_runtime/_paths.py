"""Where the Kiln runtime's files are. Nothing here loads a library, so these
work on any machine (and under KILN_SKIP_DELEGATE_REGISTRATION=1).

The package directory is itself a CMake prefix (cmake/install.cmake):
lib/ holds the delegate, the caller-stream library and the CMake config,
include/ holds <kiln/caller_stream.h>.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from ._errors import ExecuTorchMissingError, KilnNotBuiltError

DELEGATE_LIBRARY = "libexecutorch_backend_kiln.so"
CALLER_STREAM_LIBRARY = "libkiln_caller_stream.so"

_BUILD_HINT = (
    "build Kiln first (bash scripts/setup.sh, or cmake --build <build dir>: the build "
    "copies the libraries into python/kiln_executorch_runtime/lib/), or pip install the wheel"
)


def package_dir() -> Path:
    """This package's directory, which is also Kiln's CMake prefix."""
    return Path(__file__).resolve().parent


def library_dir() -> Path:
    """Directory of libexecutorch_backend_kiln.so and libkiln_caller_stream.so."""
    return package_dir() / "lib"


def include_dir() -> Path:
    """Directory holding kiln/caller_stream.h."""
    return package_dir() / "include"


def cmake_dir() -> Path:
    """Directory of executorch_backend_kiln-config.cmake."""
    return library_dir() / "cmake" / "executorch_backend_kiln"


def delegate_library() -> Path:
    """Path of the delegate library; raises KilnNotBuiltError if it is missing."""
    path = library_dir() / DELEGATE_LIBRARY
    if not path.is_file():
        raise KilnNotBuiltError(f"kiln_executorch_runtime: {path} does not exist; {_BUILD_HINT}")
    return path


def executorch_prefix() -> Path:
    """The installed executorch package directory (its CMake prefix), found
    without importing ExecuTorch. executorch is a namespace package, so this
    looks through __path__ for the entry that holds the CMake config."""
    try:
        spec = importlib.util.find_spec("executorch")
    except (ImportError, ValueError):
        spec = None
    locations = list(spec.submodule_search_locations or []) if spec else []
    for location in locations:
        if (Path(location) / "share" / "cmake" / "executorch-config.cmake").is_file():
            return Path(location)
    raise ExecuTorchMissingError(
        "kiln_executorch_runtime: ExecuTorch is not installed in this Python "
        f"({'no executorch package' if not locations else 'no executorch-config.cmake under ' + ', '.join(locations)}); "
        "pip install executorch==1.5.1"
    )


def cmake_prefix_path() -> str:
    """The CMAKE_PREFIX_PATH that finds both executorch and executorch_backend_kiln
    (semicolon-separated, as CMake wants)."""
    if not (cmake_dir() / "executorch_backend_kiln-config.cmake").is_file():
        raise KilnNotBuiltError(
            f"kiln_executorch_runtime: no CMake package at {cmake_dir()}; {_BUILD_HINT}"
        )
    return f"{package_dir()};{executorch_prefix()}"
