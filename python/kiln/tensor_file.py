"""Kiln tensor files (.ktensors): the inputs/expected outputs that
``kiln_runner`` reads and writes. Format: docs/tensor_file_format.md.

    save(path, [tensor_or_array, ...])
    load(path) -> [numpy.ndarray, ...]   (bfloat16 comes back as torch.Tensor,
                                          numpy has no bfloat16)
"""

from __future__ import annotations

import math
import os
import struct
from pathlib import Path
from typing import Any, Sequence

import numpy as np

MAGIC = b"KILNTNS1"
MAX_RANK = 8

# The engine's DType values: (name, numpy dtype or None, element size).
_DTYPES: dict[int, tuple[str, Any, int]] = {
    0: ("float32", np.dtype("<f4"), 4),
    1: ("float16", np.dtype("<f2"), 2),
    2: ("bfloat16", None, 2),
    3: ("int64", np.dtype("<i8"), 8),
    4: ("int32", np.dtype("<i4"), 4),
    5: ("bool", np.dtype("bool"), 1),
}
_CODE_BY_NAME = {name: code for code, (name, _, _) in _DTYPES.items()}

_COUNT = struct.Struct("<I")
_TENSOR_HEADER = struct.Struct("<BBH")  # dtype, rank, reserved
_U64 = struct.Struct("<Q")


class TensorFileError(ValueError):
    """A .ktensors file (or a tensor given to save) is not valid."""


def _to_numpy(value: Any, index: int) -> tuple[int, np.ndarray]:
    """(dtype code, contiguous little-endian array) for a tensor or array;
    bfloat16 tensors are carried as their int16 bit patterns."""
    try:
        import torch
    except ImportError:  # numpy-only use
        torch = None
    if torch is not None and isinstance(value, torch.Tensor):
        t = value.detach().to("cpu").contiguous()
        if t.dtype == torch.bfloat16:
            return _CODE_BY_NAME["bfloat16"], t.view(torch.int16).numpy()
        value = t.numpy()
    if not isinstance(value, np.ndarray):
        raise TypeError(
            f"tensor {index}: expected a torch.Tensor or numpy.ndarray, got {type(value).__name__}"
        )
    name = value.dtype.name
    if name not in _CODE_BY_NAME or name == "bfloat16":
        raise TensorFileError(
            f"tensor {index}: dtype {value.dtype} is not storable "
            f"(use float32, float16, bfloat16, int64, int32 or bool)"
        )
    code = _CODE_BY_NAME[name]
    # (not ascontiguousarray: it turns 0-d arrays into 1-d ones)
    return code, np.array(value, dtype=_DTYPES[code][1], order="C", copy=True)


def save(path: str | os.PathLike, tensors: Sequence[Any]) -> Path:
    """Writes `tensors` (torch tensors or numpy arrays) to `path`."""
    if not isinstance(tensors, (list, tuple)):
        raise TypeError(f"tensors: expected a list of tensors, got {type(tensors).__name__}")
    chunks = [MAGIC, _COUNT.pack(len(tensors))]
    for index, value in enumerate(tensors):
        code, array = _to_numpy(value, index)
        if array.ndim > MAX_RANK:
            raise TensorFileError(f"tensor {index}: rank {array.ndim} exceeds {MAX_RANK}")
        chunks.append(_TENSOR_HEADER.pack(code, array.ndim, 0))
        chunks.append(struct.pack(f"<{array.ndim}q", *array.shape))
        data = array.tobytes()
        chunks.append(_U64.pack(len(data)))
        chunks.append(data)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(chunks))
    return path


class _Reader:
    def __init__(self, data: bytes, path: Path) -> None:
        self.data = data
        self.pos = 0
        self.path = path

    def fail(self, what: str) -> TensorFileError:
        return TensorFileError(f"{self.path}: {what}")

    def take(self, size: int, what: str) -> bytes:
        if size > len(self.data) - self.pos:
            raise self.fail(
                f"file ends early reading {what} (need {size} bytes at offset {self.pos}, "
                f"{len(self.data) - self.pos} left)"
            )
        chunk = self.data[self.pos : self.pos + size]
        self.pos += size
        return chunk


def _read_tensor(reader: _Reader, index: int) -> Any:
    where = f"tensor {index}"
    code, rank, reserved = _TENSOR_HEADER.unpack(reader.take(_TENSOR_HEADER.size, f"{where} header"))
    if code not in _DTYPES:
        raise reader.fail(f"{where}: unknown dtype code {code}")
    if rank > MAX_RANK:
        raise reader.fail(f"{where}: rank {rank} exceeds {MAX_RANK}")
    if reserved != 0:
        raise reader.fail(f"{where}: reserved field is {reserved}, expected 0")
    dims = struct.unpack(f"<{rank}q", reader.take(8 * rank, f"{where} dims"))
    if any(d < 0 for d in dims):
        raise reader.fail(f"{where}: negative dimension in {list(dims)}")
    name, np_dtype, elem_size = _DTYPES[code]
    (nbytes,) = _U64.unpack(reader.take(_U64.size, f"{where} size"))
    expected = math.prod(dims) * elem_size
    if nbytes != expected:
        raise reader.fail(
            f"{where}: size {nbytes} does not match {name} {list(dims)} ({expected} bytes)"
        )
    raw = reader.take(nbytes, f"{where} data")
    if np_dtype is None:  # bfloat16
        import torch

        bits = np.frombuffer(raw, dtype="<i2").reshape(dims).copy()
        return torch.from_numpy(bits).view(torch.bfloat16)
    return np.frombuffer(raw, dtype=np_dtype).reshape(dims).copy()


def load(path: str | os.PathLike) -> list[Any]:
    """Reads every tensor in `path`; raises TensorFileError naming the file and
    the tensor on any inconsistency."""
    path = Path(path)
    reader = _Reader(path.read_bytes(), path)
    magic = reader.take(len(MAGIC), "magic")
    if magic != MAGIC:
        raise reader.fail(f"not a Kiln tensor file (magic {magic!r}, expected {MAGIC!r})")
    (count,) = _COUNT.unpack(reader.take(_COUNT.size, "tensor count"))
    # Each tensor needs at least its header and size field.
    min_tensor = _TENSOR_HEADER.size + _U64.size
    if count > (len(reader.data) - reader.pos) // min_tensor:
        raise reader.fail(f"tensor count {count} is more than the file can hold")
    tensors = [_read_tensor(reader, i) for i in range(count)]
    if reader.pos != len(reader.data):
        raise reader.fail(
            f"{len(reader.data) - reader.pos} unexpected bytes after the last of {count} tensors"
        )
    return tensors
