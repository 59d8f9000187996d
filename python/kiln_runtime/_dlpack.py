"""DLPack through ctypes, with no array library imported: reading the
DLTensor of a producer's capsule (torch, cupy, jax... tensors given as inputs),
and lending an output as a capsule to any consumer (torch.from_dlpack,
cupy.from_dlpack, numpy.from_dlpack)."""

from __future__ import annotations

import ctypes

from . import _library

CPU, CUDA, CUDA_HOST, CUDA_MANAGED = 1, 2, 3, 13  # DLDeviceType
# DLPack's stream number for CUDA's per-thread default stream, where the Kiln
# delegate runs: a producer makes it wait for the work that writes the tensor.
PER_THREAD_DEFAULT_STREAM = 2
LEGACY_DEFAULT_STREAM = 1
# Offset of the DLTensor inside a DLManagedTensorVersioned (DLPack >= 1.0):
# version (2 x uint32), manager_ctx, deleter, flags (uint64).
_VERSIONED_TENSOR_OFFSET = 32

_LEGACY = b"dltensor"
_VERSIONED = b"dltensor_versioned"

_api = ctypes.pythonapi
_api.PyCapsule_IsValid.restype = ctypes.c_int
_api.PyCapsule_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_DESTRUCTOR_TYPE = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_api.PyCapsule_New.restype = ctypes.py_object
_api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, _DESTRUCTOR_TYPE]
# The destructor reads the capsule it is given by address (it is being freed).
_is_valid_raw = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)(("PyCapsule_IsValid", _api))
_get_pointer_raw = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)(("PyCapsule_GetPointer", _api))


def _destroy_capsule(capsule: int) -> None:
    # Per the DLPack protocol a consumer renames the capsule ("used_dltensor")
    # when it takes the tensor; a capsule still named "dltensor" was never
    # consumed, so its tensor is released here.
    if _is_valid_raw(capsule, _LEGACY):
        _library.lib().kiln_dlpack_delete(_get_pointer_raw(capsule, _LEGACY))


_DESTRUCTOR = _DESTRUCTOR_TYPE(_destroy_capsule)  # kept alive with the module


def device_of(obj) -> tuple[int, int]:
    """(DLDeviceType, device id) of an object with __dlpack_device__."""
    device = obj.__dlpack_device__()
    return int(device[0]), int(device[1])


def export(obj):
    """The producer's capsule and the address of its DLTensor. CUDA producers
    are asked to order their work before cudaStreamPerThread; the capsule
    keeps the tensor alive and is released by the caller dropping it."""
    device_type, _ = device_of(obj)
    if device_type in (CUDA, CUDA_MANAGED):
        try:
            capsule = obj.__dlpack__(stream=PER_THREAD_DEFAULT_STREAM)
        except BufferError:
            # torch (2.11) refuses the per-thread default stream ("not
            # supported"). Ordering before the legacy default stream is as
            # good: cudaStreamPerThread is a blocking stream, so its next
            # launch waits for what the legacy stream was given (the
            # producer's wait on its own stream).
            capsule = obj.__dlpack__(stream=LEGACY_DEFAULT_STREAM)
    else:
        capsule = obj.__dlpack__()
    if _api.PyCapsule_IsValid(capsule, _LEGACY):
        return capsule, _api.PyCapsule_GetPointer(capsule, _LEGACY)
    if _api.PyCapsule_IsValid(capsule, _VERSIONED):
        return capsule, _api.PyCapsule_GetPointer(capsule, _VERSIONED) + _VERSIONED_TENSOR_OFFSET
    raise TypeError(f"{type(obj).__name__}.__dlpack__() did not return a DLPack capsule")


def lend(managed_tensor: int):
    """A "dltensor" capsule owning `managed_tensor` (from kiln_method_output_dlpack)."""
    return _api.PyCapsule_New(managed_tensor, _LEGACY, _DESTRUCTOR)
