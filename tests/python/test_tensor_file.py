"""kiln.tensor_file: round trips and strict rejection of bad files."""

import struct

import numpy as np
import pytest
import torch

from kiln import tensor_file
from kiln.tensor_file import TensorFileError


def test_round_trip_every_dtype(tmp_path):
    tensors = [
        np.arange(6, dtype=np.float32).reshape(2, 3),
        np.array([1.5, -2.25], dtype=np.float16),
        torch.tensor([[1.0, -3.5]], dtype=torch.bfloat16),
        np.array([1, -(2**40)], dtype=np.int64),
        torch.arange(4, dtype=torch.int32).reshape(2, 2),
        np.array([True, False, True]),
        np.array(2.5, dtype=np.float32),  # rank 0
        np.zeros((0, 3), dtype=np.float32),  # empty
        np.arange(12, dtype=np.float32).reshape(3, 4).T,  # not contiguous
    ]
    path = tensor_file.save(tmp_path / "sub" / "t.ktensors", tensors)
    loaded = tensor_file.load(path)
    assert len(loaded) == len(tensors)
    for original, got in zip(tensors, loaded):
        if isinstance(original, torch.Tensor) and original.dtype == torch.bfloat16:
            assert isinstance(got, torch.Tensor) and got.dtype == torch.bfloat16
            assert torch.equal(got, original)
            continue
        want = original.numpy() if isinstance(original, torch.Tensor) else original
        assert got.dtype == want.dtype
        assert got.shape == want.shape
        np.testing.assert_array_equal(got, want)


def test_layout_matches_the_spec(tmp_path):
    path = tensor_file.save(tmp_path / "t.ktensors", [np.array([[1.0, 2.0]], dtype=np.float32)])
    data = path.read_bytes()
    assert data[:8] == b"KILNTNS1"
    assert struct.unpack_from("<I", data, 8) == (1,)
    assert struct.unpack_from("<BBH", data, 12) == (0, 2, 0)
    assert struct.unpack_from("<2q", data, 16) == (1, 2)
    assert struct.unpack_from("<Q", data, 32) == (8,)
    assert data[40:] == np.array([1.0, 2.0], dtype="<f4").tobytes()


def test_rejects_unstorable_values(tmp_path):
    with pytest.raises(TensorFileError, match="tensor 1: dtype float64"):
        tensor_file.save(tmp_path / "x", [np.zeros(2, np.float32), np.zeros(2, np.float64)])
    with pytest.raises(TypeError, match="tensor 0"):
        tensor_file.save(tmp_path / "x", [[1.0, 2.0]])
    with pytest.raises(TypeError, match="list of tensors"):
        tensor_file.save(tmp_path / "x", np.zeros(2, np.float32))


@pytest.fixture
def good_file(tmp_path):
    return tensor_file.save(
        tmp_path / "good.ktensors",
        [np.ones((2, 2), np.float32), np.arange(3, dtype=np.int64)],
    )


def _corrupt(path, offset, new_bytes):
    data = bytearray(path.read_bytes())
    data[offset : offset + len(new_bytes)] = new_bytes
    path.write_bytes(bytes(data))
    return path


# Offsets in good_file: magic 0, count 8, tensor 0 header 12 (dims 16, nbytes
# 32, data 40..56), tensor 1 header 56 (dims 60, nbytes 68, data 76..100).
@pytest.mark.parametrize(
    "offset, new_bytes, message",
    [
        (0, b"KILNTNS2", "not a Kiln tensor file"),
        (8, struct.pack("<I", 1000), "tensor count 1000"),
        (12, bytes([9]), "tensor 0: unknown dtype code 9"),
        (13, bytes([9]), "tensor 0: rank 9 exceeds 8"),
        (14, struct.pack("<H", 1), "tensor 0: reserved field"),
        (16, struct.pack("<q", -2), "tensor 0: negative dimension"),
        (32, struct.pack("<Q", 12), "tensor 0: size 12 does not match"),
        (68, struct.pack("<Q", 16), "tensor 1: size 16 does not match"),
    ],
)
def test_rejects_corruption(good_file, offset, new_bytes, message):
    _corrupt(good_file, offset, new_bytes)
    with pytest.raises(TensorFileError, match=message) as info:
        tensor_file.load(good_file)
    assert "good.ktensors" in str(info.value)


def test_rejects_truncation_and_trailing_bytes(good_file):
    data = good_file.read_bytes()
    for cut, what in [(4, "magic"), (10, "tensor count"), (50, "tensor 0 data"), (90, "tensor 1 data")]:
        good_file.write_bytes(data[:cut])
        with pytest.raises(TensorFileError, match=f"ends early reading {what}"):
            tensor_file.load(good_file)
    good_file.write_bytes(data + b"\0")
    with pytest.raises(TensorFileError, match="1 unexpected bytes"):
        tensor_file.load(good_file)
