"""Program, Method, TensorInfo and DeviceArray: the Python face of
libkiln_c_api.so (include/kiln/c_api.h)."""

from __future__ import annotations

import ctypes
import os
import threading
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from . import _dlpack, _errors, _library
from ._errors import KilnRuntimeError

# kiln_dtype (ExecuTorch ScalarType numbers) <-> names and numpy dtypes.
_DTYPE_NAMES = {0: "uint8", 1: "int8", 2: "int16", 3: "int32", 4: "int64", 5: "float16", 6: "float32",
                7: "float64", 11: "bool", 15: "bfloat16"}
_NUMPY = {"uint8": np.uint8, "int8": np.int8, "int16": np.int16, "int32": np.int32, "int64": np.int64,
          "float16": np.float16, "float32": np.float32, "float64": np.float64, "bool": np.bool_}
_FROM_NUMPY = {np.dtype(_NUMPY[name]): code for code, name in _DTYPE_NAMES.items() if name in _NUMPY}
_CPU, _CUDA = 0, 1


def gpu_available() -> tuple[bool, str]:
    """(True, "") when the Kiln delegate can run here, else (False, why)."""
    reason = ctypes.c_char_p()
    ok = bool(_library.lib().kiln_gpu_available(ctypes.byref(reason)))
    return ok, (reason.value or b"").decode()


@dataclass(frozen=True)
class TensorInfo:
    """One input or output of a method's signature. `device` is "cpu" or
    "cuda:N" (device-resident I/O); `is_tensor` is False for a non-tensor value,
    which this package does not feed."""

    dtype: str
    shape: tuple[int, ...]
    device: str
    nbytes: int
    is_tensor: bool = True

    @property
    def numpy_dtype(self):
        """The numpy dtype, or None for bfloat16 (numpy has none)."""
        return _NUMPY.get(self.dtype)


def _info(raw: _library.KilnTensorInfo) -> TensorInfo:
    device = f"cuda:{raw.device_index}" if raw.device_type == _CUDA else "cpu"
    return TensorInfo(dtype=_DTYPE_NAMES.get(raw.dtype, f"scalar_type_{raw.dtype}"),
                      shape=tuple(raw.shape[d] for d in range(raw.ndim)), device=device,
                      nbytes=int(raw.nbytes), is_tensor=bool(raw.is_tensor))


class Program:
    """A loaded .pte (memory-mapped and verified; no GPU needed to load it or
    read its methods' signatures). `data_path`: the .ptd of a program saved
    with external weights.

    `state_scope`: where the program's mutable state (a language model's KV
    cache) lives. The cache is one buffer per GPU, model and scope: Programs
    of one model in the same scope ("" by default) share it, so two concurrent
    generations each need a scope of their own ("session-1", "session-2");
    the weights are shared whatever the scope. At most 255 printable ASCII
    characters."""

    def __init__(self, path: str | os.PathLike, data_path: str | os.PathLike | None = None, *,
                 state_scope: str = ""):
        self._lib = _library.lib()
        self.path = str(path)
        handle = ctypes.c_void_p()
        _library.check(self._lib.kiln_program_load(os.fsencode(path),
                                                   None if data_path is None else os.fsencode(data_path),
                                                   ctypes.byref(handle)))
        self._handle = handle
        self.state_scope = state_scope
        if state_scope:
            if not isinstance(state_scope, str) or "\0" in state_scope:
                raise KilnRuntimeError(f"state_scope must be a str without NUL characters, got {state_scope!r}",
                                               _errors.INVALID_ARGUMENT)
            _library.check(self._lib.kiln_program_set_state_scope(handle, state_scope.encode("utf-8")))
        count = ctypes.c_size_t()
        _library.check(self._lib.kiln_program_num_methods(handle, ctypes.byref(count)))
        names = []
        for i in range(count.value):
            name = ctypes.c_char_p()
            _library.check(self._lib.kiln_program_method_name(handle, i, ctypes.byref(name)))
            names.append(name.value.decode())
        self._method_names = tuple(names)
        self._methods: dict[str, Method] = {}
        self._lock = threading.Lock()

    @property
    def method_names(self) -> tuple[str, ...]:
        """The program's method names, sorted."""
        return self._method_names

    def method(self, name: str = "forward") -> "Method":
        """The method `name` (one object per name); nothing is loaded until
        Method.load() or the first execute()."""
        with self._lock:
            if name not in self._methods:
                self._methods[name] = Method(self, name)
            return self._methods[name]

    def __del__(self):
        handle = getattr(self, "_handle", None)
        if handle:
            self._lib.kiln_program_destroy(handle)
            self._handle = None

    def __repr__(self) -> str:
        return f"kiln_runtime.Program({self.path!r}, methods={list(self._method_names)})"


class Method:
    """One method of a Program. Not for concurrent use from several threads
    (execute() serializes calls on one Method with a lock)."""

    def __init__(self, program: Program, name: str):
        self._lib = program._lib
        self.program_path = program.path
        self.name = name
        handle = ctypes.c_void_p()
        _library.check(self._lib.kiln_method_open(program._handle, name.encode(), ctypes.byref(handle)))
        self._handle = handle
        count_in, count_out = ctypes.c_size_t(), ctypes.c_size_t()
        _library.check(self._lib.kiln_method_num_inputs(handle, ctypes.byref(count_in)))
        _library.check(self._lib.kiln_method_num_outputs(handle, ctypes.byref(count_out)))
        raw = _library.KilnTensorInfo()
        inputs, outputs = [], []
        for i in range(count_in.value):
            _library.check(self._lib.kiln_method_input_info(handle, i, ctypes.byref(raw)))
            inputs.append(_info(raw))
        for i in range(count_out.value):
            _library.check(self._lib.kiln_method_output_info(handle, i, ctypes.byref(raw)))
            outputs.append(_info(raw))
        self.inputs: tuple[TensorInfo, ...] = tuple(inputs)
        self.outputs: tuple[TensorInfo, ...] = tuple(outputs)
        self.uses_gpu = bool(self._lib.kiln_method_uses_kiln(handle))
        self._generation = 0  # executions so far: a DeviceArray of an older one is stale
        self._lock = threading.Lock()

    def load(self) -> None:
        """Loads the method now (Kiln engines initialized, weights uploaded);
        NoCudaGpuError if it runs Kiln engines and there is no usable GPU."""
        _library.check(self._lib.kiln_method_load(self._handle))

    def _set_input(self, index: int, value, keep: list) -> None:
        if isinstance(value, np.ndarray) or not hasattr(value, "__dlpack__"):
            array = self._as_numpy(index, value)
            keep.append(array)
            tensor = _library.KilnTensor(
                array.ctypes.data, _FROM_NUMPY[array.dtype], _CPU, 0, array.ndim,
                (ctypes.c_int64 * max(1, array.ndim))(*array.shape))
            _library.check(self._lib.kiln_method_set_input(self._handle, index, ctypes.byref(tensor)))
            return
        capsule, dl_tensor = _dlpack.export(value)
        keep.append(capsule)
        _library.check(self._lib.kiln_method_set_input_dlpack(self._handle, index, dl_tensor))

    def _as_numpy(self, index: int, value) -> np.ndarray:
        info = self.inputs[index]
        if isinstance(value, np.ndarray):
            array = value
        else:  # a list, a scalar, a buffer: converted to the dtype the method takes
            if info.numpy_dtype is None:
                raise KilnRuntimeError(f"method '{self.name}': input {index}: takes {info.dtype}, which numpy cannot "
                                       f"hold; pass a DLPack tensor (e.g. a torch.bfloat16 tensor)")
            array = np.asarray(value, dtype=info.numpy_dtype)
        if array.dtype not in _FROM_NUMPY:
            raise KilnRuntimeError(f"method '{self.name}': input {index}: expected "
                                   f"{info.dtype} {list(info.shape)}, got numpy {array.dtype} {list(array.shape)}")
        return np.ascontiguousarray(array)

    def execute(self, inputs: Sequence = (), outputs: Sequence | None = None) -> list:
        """Runs the method. `inputs`: one per method input, each a numpy array
        (or a list/scalar, converted to the input's dtype) or any object with
        __dlpack__ (a torch or cupy tensor, on the CPU or a CUDA device; it is
        not copied when it lives where the program expects it). Returns one
        object per output: a new numpy array for an output in host memory, a
        DeviceArray (DLPack-capable, no copy) for a device-resident output,
        valid until this method executes again. `outputs`: for device-resident
        outputs, DLPack CUDA tensors (or None) to write into instead."""
        if isinstance(inputs, (np.ndarray,)) or hasattr(inputs, "__dlpack__"):
            inputs = (inputs,)
        inputs = list(inputs)
        if len(inputs) != len(self.inputs):
            expected = ", ".join(f"{t.dtype} {list(t.shape)}" for t in self.inputs)
            raise KilnRuntimeError(f"method '{self.name}' takes {len(self.inputs)} inputs ({expected}), "
                                   f"got {len(inputs)}")
        if outputs is not None and len(outputs) != len(self.outputs):
            raise KilnRuntimeError(f"method '{self.name}' has {len(self.outputs)} outputs, "
                                   f"got {len(outputs)} output buffers")
        with self._lock:
            keep: list = []  # capsules and arrays alive until execute returns
            for i, value in enumerate(inputs):
                self._set_input(i, value, keep)
            given = [None] * len(self.outputs) if outputs is None else list(outputs)
            for i, info in enumerate(self.outputs):
                if not info.device.startswith("cuda"):
                    if given[i] is not None:
                        raise KilnRuntimeError(f"method '{self.name}': output {i} is placed by the program "
                                               f"(host memory); pass None for it")
                    continue
                if given[i] is None:
                    _library.check(self._lib.kiln_method_set_output(self._handle, i, None))
                else:
                    capsule, dl_tensor = _dlpack.export(given[i])
                    keep.append(capsule)
                    _library.check(self._lib.kiln_method_set_output_dlpack(self._handle, i, dl_tensor))
            _library.check(self._lib.kiln_method_execute(self._handle))
            self._generation += 1
            results = []
            for i in range(len(self.outputs)):
                results.append(given[i] if given[i] is not None else self._output(i))
            del keep
            return results

    __call__ = lambda self, *inputs: self.execute(inputs)  # noqa: E731

    def _output(self, index: int):
        view = _library.KilnTensor()
        _library.check(self._lib.kiln_method_output(self._handle, index, ctypes.byref(view)))
        shape = tuple(view.shape[d] for d in range(view.ndim))
        dtype = _DTYPE_NAMES.get(view.dtype, f"scalar_type_{view.dtype}")
        if view.device_type == _CUDA:
            return DeviceArray(self, index, self._generation, dtype, shape, view.device_index, view.data or 0)
        if dtype not in _NUMPY:
            raise KilnRuntimeError(f"method '{self.name}': output {index} is {dtype}, which numpy cannot hold")
        array = np.empty(shape, dtype=_NUMPY[dtype])
        _library.check(self._lib.kiln_method_copy_output(self._handle, index, array.ctypes.data, array.nbytes))
        return array

    def __del__(self):
        handle = getattr(self, "_handle", None)
        if handle:
            self._lib.kiln_method_destroy(handle)
            self._handle = None

    def __repr__(self) -> str:
        ins = ", ".join(f"{t.dtype}{list(t.shape)}@{t.device}" for t in self.inputs)
        outs = ", ".join(f"{t.dtype}{list(t.shape)}@{t.device}" for t in self.outputs)
        return f"kiln_runtime.Method({self.name!r}: ({ins}) -> ({outs}))"


class DeviceArray:
    """A device-resident output: CUDA memory the method owns, lent without a
    copy through DLPack (torch.from_dlpack(a), cupy.from_dlpack(a)) or
    __cuda_array_interface__. The next execute() of the method overwrites it;
    using an older DeviceArray then raises, and a tensor already made from it
    sees the new values: copy what must outlive the next execution."""

    def __init__(self, method: Method, index: int, generation: int, dtype: str, shape: tuple, device_index: int,
                 data_ptr: int):
        self._method = method
        self._index = index
        self._generation = generation
        self.dtype = dtype
        self.shape = shape
        self.device = f"cuda:{device_index}"
        self.device_index = device_index
        self.data_ptr = data_ptr

    def _check_current(self) -> None:
        if self._method._generation != self._generation:
            raise KilnRuntimeError(f"output {self._index} of method '{self._method.name}' was overwritten by a later "
                                   f"execute(); copy outputs that must outlive the next execution")

    def __dlpack_device__(self) -> tuple[int, int]:
        return (_dlpack.CUDA, self.device_index)

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        # The outputs are complete when execute() returns (it synchronizes),
        # so no stream needs to wait.
        if copy:
            raise BufferError("kiln_runtime.DeviceArray lends its memory; copy=True is not supported")
        self._check_current()
        managed = ctypes.c_void_p()
        with self._method._lock:
            _library.check(self._method._lib.kiln_method_output_dlpack(self._method._handle, self._index,
                                                                      ctypes.byref(managed)))
        return _dlpack.lend(managed.value)

    @property
    def __cuda_array_interface__(self) -> dict:
        self._check_current()
        if self.dtype not in _NUMPY:
            raise TypeError(f"{self.dtype} has no __cuda_array_interface__ typestr; use DLPack")
        return {"shape": self.shape, "typestr": np.dtype(_NUMPY[self.dtype]).str, "data": (self.data_ptr, False),
                "version": 3, "strides": None, "stream": None}

    def numpy(self) -> np.ndarray:
        """A host copy."""
        self._check_current()
        if self.dtype not in _NUMPY:
            raise KilnRuntimeError(f"{self.dtype} cannot be held by numpy")
        array = np.empty(self.shape, dtype=_NUMPY[self.dtype])
        with self._method._lock:
            _library.check(self._method._lib.kiln_method_copy_output(self._method._handle, self._index,
                                                                    array.ctypes.data, array.nbytes))
        return array

    def __repr__(self) -> str:
        return f"kiln_runtime.DeviceArray({self.dtype}, shape={list(self.shape)}, device={self.device!r})"
