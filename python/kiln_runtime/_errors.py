"""Exceptions of kiln_runtime: every failure of the C library arrives as a
KilnRuntimeError carrying the library's message (which names the method and
tensor, and says what was expected against what was given)."""

from __future__ import annotations

# kiln_status codes of include/kiln/c_api.h
OK = 0
INVALID_ARGUMENT = 1
NOT_FOUND = 2
LOAD = 3
NO_GPU = 4
EXECUTE = 5
CUDA = 6
NOT_SUPPORTED = 7


class KilnRuntimeError(RuntimeError):
    """A call into libkiln_c_api.so failed; `status` is its kiln_status code."""

    def __init__(self, message: str, status: int = 0):
        super().__init__(message)
        self.status = status


class NoCudaGpuError(KilnRuntimeError):
    """The method runs Kiln engines, and this machine has no usable CUDA GPU
    (the message says why: no driver, no device...)."""


class LibraryNotFoundError(KilnRuntimeError, ImportError):
    """libkiln_c_api.so was not found (the message lists where it was looked for)."""


def error_for(status: int, message: str) -> KilnRuntimeError:
    if status == NO_GPU:
        return NoCudaGpuError(message, status)
    return KilnRuntimeError(message, status)
