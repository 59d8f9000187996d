"""The errors `import kiln_executorch_runtime` raises. All are ImportError
subclasses, so `except ImportError` around an optional import still works;
`reason` says which case it is, for code that wants to branch."""

from __future__ import annotations


class KilnRuntimeError(ImportError):
    """The Kiln delegate could not be registered in this process."""

    reason = "unknown"


class NoCudaGpuError(KilnRuntimeError):
    """No NVIDIA driver, no CUDA runtime library, or no usable CUDA GPU."""

    reason = "no_cuda_gpu"


class ExecuTorchMismatchError(KilnRuntimeError):
    """The installed ExecuTorch is not the build Kiln was compiled against."""

    reason = "executorch_mismatch"


class ExecuTorchMissingError(KilnRuntimeError):
    """ExecuTorch (or its Python runtime extension) is not importable."""

    reason = "executorch_missing"


class KilnNotBuiltError(KilnRuntimeError):
    """The delegate library or its build info is not next to the package."""

    reason = "not_built"


class RegistrationError(KilnRuntimeError):
    """The library loaded but KilnBackend is not in ExecuTorch's registry."""

    reason = "registration_failed"


# Tracebacks name the public module, where users import these from.
for _cls in (KilnRuntimeError, NoCudaGpuError, ExecuTorchMismatchError, ExecuTorchMissingError,
             KilnNotBuiltError, RegistrationError):
    _cls.__module__ = "kiln_executorch_runtime"
