"""Registers the Kiln delegate in this process's ExecuTorch runtime.

How it works: ExecuTorch's Python extension (_C) links libexecutorch.so, which
holds the backend registry. Loading libexecutorch_backend_kiln.so into the
same process afterwards makes the loader reuse that libexecutorch.so (same
soname), and the delegate's static initializer registers "KilnBackend" there.

Every check runs before anything is loaded, in the order a user can fix
them: ExecuTorch present, the same ExecuTorch build, a CUDA runtime, a GPU.
"""

from __future__ import annotations

import ctypes
import os
import threading
import warnings
from pathlib import Path
from types import ModuleType

from ._errors import (
    ExecuTorchMismatchError,
    ExecuTorchMissingError,
    KilnNotBuiltError,
    NoCudaGpuError,
    RegistrationError,
)
from ._paths import CALLER_STREAM_LIBRARY, delegate_library, library_dir

BACKEND_NAME = "KilnBackend"
_SKIP_HINT = "Set KILN_SKIP_DELEGATE_REGISTRATION=1 to import this package for its paths only"

_lock = threading.Lock()
_registered: list[str] | None = None
_handles: list[ctypes.CDLL] = []  # dlclose'ing a registered backend would leave a dangling entry


def _build_info() -> ModuleType:
    try:
        from . import _build_info as info
    except ImportError:
        raise KilnNotBuiltError(
            "kiln_executorch_runtime: no _build_info.py next to the package, so the delegate "
            "libraries were never built or installed here; build Kiln (bash scripts/setup.sh) "
            "or pip install the wheel"
        ) from None
    return info


def _check_executorch(info: ModuleType) -> str:
    """Returns the installed ExecuTorch version; raises if it is missing or
    is not the build Kiln was compiled against."""
    wanted = info.EXECUTORCH_BUILD_VERSION
    pin = wanted.split("+")[0]
    try:
        from executorch.version import __version__ as installed
    except ImportError as e:
        raise ExecuTorchMissingError(
            f"kiln_executorch_runtime: ExecuTorch is not installed ({e}); Kiln's delegate needs "
            f"ExecuTorch {wanted}: pip install executorch=={pin}"
        ) from None
    if installed != wanted:
        raise ExecuTorchMismatchError(
            f"kiln_executorch_runtime: Kiln was built against ExecuTorch {wanted}, but this Python "
            f"has ExecuTorch {installed}; the delegate uses ExecuTorch's C++ ABI, so the two must "
            f"be the same build: pip install executorch=={pin}, or rebuild Kiln against {installed}"
        )
    return installed


def _executorch_runtime():
    """Runtime.get(): imports ExecuTorch's extension, which loads libexecutorch.so."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the "experimental API" notice
            from executorch.runtime import Runtime

            return Runtime.get()
    except ImportError as e:
        raise ExecuTorchMissingError(
            f"kiln_executorch_runtime: ExecuTorch's Python runtime does not import ({e}); "
            "it needs the torch release it was built with (see requirements.txt)"
        ) from None


def _load_cudart(info: ModuleType) -> ctypes.CDLL:
    # Loaded globally first, so the delegate's own libcudart dependency binds
    # to this copy even when it is only found through the build's CUDA dir.
    tried = []
    for candidate in (info.CUDART_SONAME, os.path.join(info.CUDA_LIBRARY_DIR, info.CUDART_SONAME)):
        try:
            return ctypes.CDLL(candidate, mode=ctypes.RTLD_GLOBAL)
        except OSError as e:
            tried.append(f"{candidate}: {e}")
    raise NoCudaGpuError(
        f"kiln_executorch_runtime: the CUDA {info.CUDA_VERSION} runtime ({info.CUDART_SONAME}) "
        f"is not installed or not on the loader path ({'; '.join(tried)}); install the CUDA "
        f"runtime or add its lib directory to LD_LIBRARY_PATH. {_SKIP_HINT}"
    )


def _driver_loadable() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
        return True
    except OSError:
        return False


def _check_gpu(cudart: ctypes.CDLL) -> int:
    """Number of CUDA devices; raises NoCudaGpuError when there is none."""
    cudart.cudaGetErrorString.restype = ctypes.c_char_p
    cudart.cudaGetErrorName.restype = ctypes.c_char_p
    count = ctypes.c_int(0)
    status = cudart.cudaGetDeviceCount(ctypes.byref(count))
    if status != 0:
        name = cudart.cudaGetErrorName(status).decode()
        text = cudart.cudaGetErrorString(status).decode()
        if not _driver_loadable():
            cause = f"no NVIDIA driver is installed (libcuda.so.1 cannot be loaded; CUDA says: {text})"
        else:
            cause = f"cudaGetDeviceCount failed with {name}: {text}"
    elif count.value == 0:
        cause = "the CUDA runtime sees no GPU"
    else:
        return count.value
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        cause += f" (CUDA_VISIBLE_DEVICES={visible!r})"
    raise NoCudaGpuError(
        f"kiln_executorch_runtime: no usable CUDA GPU: {cause}. Kiln engines run only on an "
        f"NVIDIA GPU; this machine can still export them (import kiln). {_SKIP_HINT}"
    )


def _loaded_executorch_libraries() -> list[str]:
    try:
        maps = Path("/proc/self/maps").read_text().splitlines()
    except OSError:
        return []
    return sorted({line.split()[-1] for line in maps if line.endswith("/libexecutorch.so")})


def _load_libraries() -> Path:
    delegate = delegate_library()
    caller_stream = library_dir() / CALLER_STREAM_LIBRARY
    for path in (caller_stream, delegate):
        if not path.is_file():
            raise KilnNotBuiltError(f"kiln_executorch_runtime: {path} does not exist")
        try:
            _handles.append(ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL))
        except OSError as e:
            raise RegistrationError(
                f"kiln_executorch_runtime: cannot load {path}: {e}"
            ) from None
    return delegate


def kiln_backends() -> list[str]:
    """Names of the Kiln backends in ExecuTorch's registry (loads nothing new
    beyond ExecuTorch's own extension)."""
    names = _executorch_runtime().backend_registry.registered_backend_names
    return [n for n in names if n.startswith("Kiln")]


def register() -> list[str]:
    """Loads the delegate into this process and checks that ExecuTorch sees it;
    returns the registered Kiln backend names. Safe to call again.

    KILN_REGISTER_WITHOUT_GPU=1 skips the GPU check (for tests on machines
    without a GPU): the backend registers, reports itself unavailable, and
    loading a Kiln method fails with ExecuTorch's "not available" error."""
    global _registered
    with _lock:
        if _registered is not None:
            return list(_registered)
        info = _build_info()
        _check_executorch(info)
        runtime = _executorch_runtime()
        without_gpu = os.environ.get("KILN_REGISTER_WITHOUT_GPU") == "1"
        cudart = _load_cudart(info)
        if not without_gpu:
            _check_gpu(cudart)
        delegate = _load_libraries()
        registry = runtime.backend_registry
        names = [n for n in registry.registered_backend_names if n.startswith("Kiln")]
        if BACKEND_NAME not in names:
            raise RegistrationError(
                f"kiln_executorch_runtime: loaded {delegate}, but ExecuTorch's registry has no "
                f"{BACKEND_NAME}; the delegate probably bound to another libexecutorch.so than "
                f"ExecuTorch's Python extension (loaded: {', '.join(_loaded_executorch_libraries())})"
            )
        if not without_gpu and not registry.is_available(BACKEND_NAME):
            raise NoCudaGpuError(
                f"kiln_executorch_runtime: {BACKEND_NAME} is registered but reports no usable CUDA "
                f"GPU (its log line above says why). {_SKIP_HINT}"
            )
        _registered = names
        return list(names)


def is_registered() -> bool:
    """True once register() has succeeded in this process."""
    return _registered is not None
