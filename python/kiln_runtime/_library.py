"""Finding and binding libkiln_c_api.so (src/c_api) with ctypes.

Where the library is looked for, first match wins:
  1. $KILN_RUNTIME_LIBRARY: the full path of a libkiln_c_api.so;
  2. lib/ beside this package: where a build mirrors it
     (python/kiln_runtime/lib/, git-ignored) and where an install puts it;
  3. the checkout's build folders: build/src/c_api/, build-gpu/src/c_api/.
"""

from __future__ import annotations

import ctypes
import os
import threading
from pathlib import Path

from ._errors import LibraryNotFoundError, error_for

LIBRARY_NAME = "libkiln_c_api.so"
PACKAGE_DIR = Path(__file__).resolve().parent
_REPO = PACKAGE_DIR.parents[1]

_lock = threading.Lock()
_lib: ctypes.CDLL | None = None


class KilnTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("dtype", ctypes.c_int32), ("device_type", ctypes.c_int32),
                ("device_index", ctypes.c_int32), ("ndim", ctypes.c_int32),
                ("shape", ctypes.POINTER(ctypes.c_int64))]


class KilnTensorInfo(ctypes.Structure):
    _fields_ = [("is_tensor", ctypes.c_int32), ("dtype", ctypes.c_int32), ("device_type", ctypes.c_int32),
                ("device_index", ctypes.c_int32), ("ndim", ctypes.c_int32),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("nbytes", ctypes.c_size_t)]


def candidates() -> list[Path]:
    found = []
    env = os.environ.get("KILN_RUNTIME_LIBRARY")
    if env:
        found.append(Path(env))
    found.append(PACKAGE_DIR / "lib" / LIBRARY_NAME)
    for build in ("build", "build-gpu"):
        found.append(_REPO / build / "src" / "c_api" / LIBRARY_NAME)
    return found


def library_path() -> Path:
    """The libkiln_c_api.so this package uses; LibraryNotFoundError if none."""
    places = candidates()
    env = os.environ.get("KILN_RUNTIME_LIBRARY")
    if env and not Path(env).is_file():
        raise LibraryNotFoundError(f"KILN_RUNTIME_LIBRARY={env} is not a file")
    for path in places:
        if path.is_file():
            return path
    raise LibraryNotFoundError(
        f"{LIBRARY_NAME} not found; looked in: " + ", ".join(str(p) for p in places)
        + ". Build it (cmake --build build --target kiln_c_api, or scripts/setup.sh) or set KILN_RUNTIME_LIBRARY")


def _bind(lib: ctypes.CDLL) -> None:
    c = ctypes
    status, size_p, void_p = c.c_int, c.POINTER(c.c_size_t), c.c_void_p
    sigs = {
        "kiln_last_error": (c.c_char_p, []),
        "kiln_dtype_name": (c.c_char_p, [c.c_int32]),
        "kiln_gpu_available": (c.c_int, [c.POINTER(c.c_char_p)]),
        "kiln_program_load": (status, [c.c_char_p, c.c_char_p, c.POINTER(void_p)]),
        "kiln_program_destroy": (None, [void_p]),
        "kiln_program_set_state_scope": (status, [void_p, c.c_char_p]),
        "kiln_program_num_methods": (status, [void_p, size_p]),
        "kiln_program_method_name": (status, [void_p, c.c_size_t, c.POINTER(c.c_char_p)]),
        "kiln_method_open": (status, [void_p, c.c_char_p, c.POINTER(void_p)]),
        "kiln_method_destroy": (None, [void_p]),
        "kiln_method_num_inputs": (status, [void_p, size_p]),
        "kiln_method_num_outputs": (status, [void_p, size_p]),
        "kiln_method_input_info": (status, [void_p, c.c_size_t, c.POINTER(KilnTensorInfo)]),
        "kiln_method_output_info": (status, [void_p, c.c_size_t, c.POINTER(KilnTensorInfo)]),
        "kiln_method_uses_kiln": (c.c_int, [void_p]),
        "kiln_method_load": (status, [void_p]),
        "kiln_method_set_input": (status, [void_p, c.c_size_t, c.POINTER(KilnTensor)]),
        "kiln_method_set_output": (status, [void_p, c.c_size_t, c.POINTER(KilnTensor)]),
        "kiln_method_execute": (status, [void_p]),
        "kiln_method_output": (status, [void_p, c.c_size_t, c.POINTER(KilnTensor)]),
        "kiln_method_copy_output": (status, [void_p, c.c_size_t, void_p, c.c_size_t]),
        "kiln_method_set_input_dlpack": (status, [void_p, c.c_size_t, void_p]),
        "kiln_method_set_output_dlpack": (status, [void_p, c.c_size_t, void_p]),
        "kiln_method_output_dlpack": (status, [void_p, c.c_size_t, c.POINTER(void_p)]),
        "kiln_dlpack_delete": (None, [void_p]),
    }
    for name, (restype, argtypes) in sigs.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes


def lib() -> ctypes.CDLL:
    """The loaded, bound library (loaded once per process)."""
    global _lib
    with _lock:
        if _lib is None:
            path = library_path()
            try:
                loaded = ctypes.CDLL(str(path))
            except OSError as e:
                raise LibraryNotFoundError(f"cannot load {path}: {e}") from e
            _bind(loaded)
            _lib = loaded
        return _lib


def check(status: int) -> None:
    """Raises the KilnRuntimeError for a failed call, with the library's message."""
    if status != 0:
        message = (lib().kiln_last_error() or b"").decode(errors="replace")
        raise error_for(status, message or f"kiln_c_api call failed with status {status}")
