"""kiln_runtime (python/kiln_runtime over src/c_api's libkiln_c_api.so) on
this machine: real exported programs load, their signatures read right
(dtype, shape, device), a program with no Kiln engine runs end to end from
numpy and from DLPack, and every bad input gets a KilnRuntimeError naming
the problem: missing or damaged file, unknown method, wrong dtype, shape,
count, device or layout, and no GPU for a Kiln method. Running Kiln engines
needs a GPU: tests/gpu/python_runtime_test.py does it on the GPU machine."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import kiln_runtime as kr
from _helpers import MLP, export, has_gpu

ROOT = Path(__file__).resolve().parents[2]
NO_GPU_REASON = "a CUDA GPU is present: tests/gpu/python_runtime_test.py covers this machine"
GPU_ONLY_REASON = ("running Kiln engines needs a CUDA GPU; tests/gpu/python_runtime_test.py runs them on the GPU "
                   "machine (scripts/gpu_check.sh)")


class AddAndReduce(torch.nn.Module):
    def forward(self, x, y):
        return x * 2 + y, (x - y).sum(dim=1)


@pytest.fixture(scope="module")
def library():
    try:
        return kr.library_path()
    except kr.LibraryNotFoundError as e:  # the runtime build is part of scripts/setup.sh: a failure, not a skip
        pytest.fail(str(e))


@pytest.fixture(scope="module")
def cpu_pte(tmp_path_factory, library):
    """A plain ExecuTorch program (no delegate): it runs here, on ExecuTorch's CPU kernels."""
    from executorch.exir import to_edge

    x, y = torch.randn(3, 4), torch.randn(3, 4)
    path = tmp_path_factory.mktemp("kr") / "add_reduce.pte"
    path.write_bytes(to_edge(export(AddAndReduce(), x, y)).to_executorch().buffer)
    return path


@pytest.fixture(scope="module")
def kiln_ptes(tmp_path_factory, library):
    """A Kiln program with host I/O and one with device-resident I/O."""
    pytest.importorskip("kiln._kiln_compiler", reason="kiln._kiln_compiler is not built")
    import kiln

    sys.path.insert(0, str(ROOT / "examples"))
    from export_device_resident import device_resident_config

    folder = tmp_path_factory.mktemp("kiln")
    torch.manual_seed(0)
    x = torch.randn(8, 64)
    compiled = kiln.compile(export(MLP(), x), arg_inputs=(x,), target_sms=(90,))
    host = kiln.save(compiled, folder / "mlp.pte")
    device = kiln.save(compiled, folder / "mlp_device.pte", backend_config=device_resident_config())
    return host, device


# ---- loading and metadata ----------------------------------------------------


def test_kiln_program_metadata(kiln_ptes):
    host, device = kiln_ptes
    program = kr.Program(host)
    assert program.method_names == ("forward",)
    method = program.method("forward")
    assert method is program.method()  # one object per name
    assert method.uses_gpu
    assert method.inputs == (kr.TensorInfo("float32", (8, 64), "cpu", 8 * 64 * 4),)
    assert method.outputs == (kr.TensorInfo("float32", (8, 16), "cpu", 8 * 16 * 4),)
    dev = kr.Program(device).method()
    assert [t.device for t in dev.inputs + dev.outputs] == ["cuda:0", "cuda:0"]
    assert dev.inputs[0].shape == (8, 64) and dev.inputs[0].numpy_dtype is np.float32


def test_cpu_program_metadata(cpu_pte):
    method = kr.Program(cpu_pte).method()
    assert not method.uses_gpu
    assert [(t.dtype, t.shape, t.device) for t in method.inputs] == [("float32", (3, 4), "cpu")] * 2
    assert [(t.dtype, t.shape) for t in method.outputs] == [("float32", (3, 4)), ("float32", (3,))]


# ---- running a program here (no Kiln engine) ----------------------------------


def test_cpu_program_runs_from_numpy_lists_and_dlpack(cpu_pte):
    method = kr.Program(cpu_pte).method()
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((3, 4), dtype=np.float32), rng.standard_normal((3, 4), dtype=np.float32)
    a, b = method.execute([x, y])
    np.testing.assert_allclose(a, 2 * x + y, rtol=1e-6)
    np.testing.assert_allclose(b, (x - y).sum(1), rtol=1e-5, atol=1e-6)
    # a non-contiguous array is copied; a list takes the input's dtype
    a2, _ = method(np.asfortranarray(x), y.tolist())
    np.testing.assert_array_equal(a2, a)
    assert a2 is not a and not np.shares_memory(a, a2)  # outputs are fresh arrays
    # CPU tensors of another library through DLPack
    t, u = torch.from_numpy(x), torch.from_numpy(y)
    a3, b3 = method.execute((t, u))
    np.testing.assert_array_equal(a3, a)
    np.testing.assert_array_equal(b3, b)


def test_runtime_imports_no_torch(cpu_pte, library):
    code = ("import sys, numpy as np, kiln_runtime as kr\n"
            f"m = kr.Program({str(cpu_pte)!r}).method()\n"
            "a, b = m.execute([np.ones((3, 4), np.float32), np.full((3, 4), 2.0, np.float32)])\n"
            "assert (a == 4).all() and (b == -4).all(), (a, b)\n"
            "assert 'torch' not in sys.modules and 'executorch' not in sys.modules, 'imported torch'\n"
            "print('ok')\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python"))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stdout + proc.stderr


# ---- errors --------------------------------------------------------------------


def test_missing_and_damaged_files(tmp_path, kiln_ptes):
    with pytest.raises(kr.KilnRuntimeError, match="no such file"):
        kr.Program(tmp_path / "absent.pte")
    junk = tmp_path / "junk.pte"
    junk.write_bytes(b"not a program" * 50)
    with pytest.raises(kr.KilnRuntimeError, match="cannot load program .*junk.pte"):
        kr.Program(junk)
    cut = tmp_path / "cut.pte"
    cut.write_bytes(kiln_ptes[0].read_bytes()[:2000])
    with pytest.raises(kr.KilnRuntimeError, match="cannot load program"):
        kr.Program(cut)
    with pytest.raises(kr.KilnRuntimeError, match="no such data file"):
        kr.Program(kiln_ptes[0], data_path=tmp_path / "absent.ptd")


def test_unknown_method(cpu_pte):
    with pytest.raises(kr.KilnRuntimeError, match=r"has no method 'decode' \(it has: forward\)"):
        kr.Program(cpu_pte).method("decode")


def test_state_scope_is_checked_and_fixed_once_a_method_loads(cpu_pte):
    """Program(state_scope=...) (kiln_program_set_state_scope, the KilnBackend load option
    state_scope): a bad scope is refused naming the problem; once a method is loaded the scope
    cannot change. That scopes keep caches apart runs on the GPU (tests/gpu/state_test.cpp,
    tests/gpu/python_runtime_test.py --state)."""
    assert kr.Program(cpu_pte, state_scope="session-1").state_scope == "session-1"
    assert kr.Program(cpu_pte, state_scope="z" * 255).state_scope == "z" * 255
    bad = {"a\nb": "byte 0x0a at 1; a scope is printable ASCII",
           "z" * 300: "at most 255 characters, got 300",
           "caf\u00e9": "byte 0xc3 at 3",
           "a\0b": "without NUL characters"}
    for scope, message in bad.items():
        with pytest.raises(kr.KilnRuntimeError, match=re.escape(message)) as e:
            kr.Program(cpu_pte, state_scope=scope)
        assert e.value.status == 1  # KILN_ERROR_INVALID_ARGUMENT
    program = kr.Program(cpu_pte)
    program.method().load()
    lib = program._lib
    assert lib.kiln_program_set_state_scope(program._handle, b"") == 0  # the scope it has: fine
    assert lib.kiln_program_set_state_scope(program._handle, b"later") == 1
    assert re.search(r"method 'forward' of '.*add_reduce.pte' is loaded in state scope '' already",
                     lib.kiln_last_error().decode())


def test_wrong_count_dtype_shape(cpu_pte, kiln_ptes):
    for path in (cpu_pte, kiln_ptes[0]):  # checked before anything is loaded: no GPU needed
        method = kr.Program(path).method()
        shape = method.inputs[0].shape
        good = np.zeros(shape, np.float32) + 0.5
        with pytest.raises(kr.KilnRuntimeError, match=rf"takes {len(method.inputs)} inputs .* got 3"):
            method.execute([good] * 3)
        with pytest.raises(kr.KilnRuntimeError,
                           match=r"input 0: expected float32 \[.*\] on the CPU, got float64 \[.*\] on the CPU"):
            method.execute([good.astype(np.float64)] + [good] * (len(method.inputs) - 1))
        bad = np.zeros((shape[0] + 1,) + shape[1:], np.float32)
        with pytest.raises(kr.KilnRuntimeError, match=rf"input 0: expected float32 \[{shape[0]}, .*got float32 "
                                                      rf"\[{shape[0] + 1}, "):
            method.execute([bad] + [good] * (len(method.inputs) - 1))
        with pytest.raises(kr.KilnRuntimeError, match=r"input 0: expected float32 .* got float16"):
            method.execute([torch.zeros(shape, dtype=torch.float16)] + [good] * (len(method.inputs) - 1))
        with pytest.raises(kr.KilnRuntimeError, match="not contiguous"):
            method.execute([torch.zeros(shape[::-1]).T] + [good] * (len(method.inputs) - 1))


def test_dynamic_program_takes_each_size_up_to_its_planned_one(tmp_path, cpu_pte, library):
    """A program exported with a Dim plans its inputs at the largest size; any
    size in the range runs (here on ExecuTorch's CPU kernels: the Kiln
    variants of such a program run in tests/gpu/dynamic_shapes_test.py), a
    static program refuses a smaller input."""
    from executorch.exir import to_edge

    rows = torch.export.Dim("rows", min=2, max=16)
    program = torch.export.export(AddAndReduce(), (torch.randn(5, 4), torch.randn(5, 4)),
                                  dynamic_shapes=({0: rows}, {0: rows}))
    path = tmp_path / "dynamic.pte"
    path.write_bytes(to_edge(program).to_executorch().buffer)
    method = kr.Program(path).method()
    assert method.inputs[0].shape == (16, 4)  # planned at the max
    for n in (16, 3, 9, 3):
        x, y = torch.randn(n, 4), torch.randn(n, 4)
        got = method.execute([x.numpy(), y.numpy()])
        want = AddAndReduce()(x, y)
        assert [g.shape for g in got] == [(n, 4), (n,)]
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w.numpy(), rtol=1e-6, atol=1e-6)
    with pytest.raises(kr.KilnRuntimeError, match=r"input 0: expected float32 \[16, 4\].*got float32 \[17, 4\]"):
        method.execute([np.zeros((17, 4), np.float32), np.zeros((17, 4), np.float32)])
    static = kr.Program(cpu_pte).method()
    with pytest.raises(kr.KilnRuntimeError, match="input 0: ExecuTorch refused it"):
        static.execute([np.zeros((2, 4), np.float32), np.zeros((2, 4), np.float32)])


def test_host_input_to_device_resident_program(kiln_ptes):
    method = kr.Program(kiln_ptes[1]).method()
    with pytest.raises(kr.KilnRuntimeError, match=r"input 0: expected float32 \[8, 64\] on CUDA device 0, got "
                                                  r"float32 \[8, 64\] on the CPU \(.*device-resident"):
        method.execute([np.ones((8, 64), np.float32)])


@pytest.mark.skipif(has_gpu(), reason=NO_GPU_REASON)
def test_no_gpu_error(kiln_ptes):
    available, reason = kr.gpu_available()
    assert not available and reason
    method = kr.Program(kiln_ptes[0]).method()
    with pytest.raises(kr.NoCudaGpuError, match=r"method 'forward' runs on the GPU \(KilnBackend\), but this machine "
                                                r"has no usable CUDA GPU \(.+\)"):
        method.execute([np.ones((8, 64), np.float32)])
    with pytest.raises(kr.NoCudaGpuError):
        method.load()
    assert issubclass(kr.NoCudaGpuError, kr.KilnRuntimeError)


@pytest.mark.skipif(not has_gpu(), reason=GPU_ONLY_REASON)
def test_kiln_program_runs_on_gpu(kiln_ptes):
    torch.manual_seed(0)
    x = torch.randn(8, 64)
    (y,) = kr.Program(kiln_ptes[0]).method().execute([x.numpy()])
    assert y.shape == (8, 16) and np.isfinite(y).all()


def test_library_not_found_is_clear(tmp_path):
    code = "import kiln_runtime as kr\ntry:\n kr.Program('x.pte')\nexcept kr.LibraryNotFoundError as e:\n print(e)\n"
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python"), KILN_RUNTIME_LIBRARY=str(tmp_path / "none.so"))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert "KILN_RUNTIME_LIBRARY=" in proc.stdout and "is not a file" in proc.stdout, proc.stdout + proc.stderr


def test_c_header_is_plain_c(tmp_path):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler on PATH to check include/kiln/c_api.h as C")
    source = tmp_path / "use.c"
    source.write_text('#include "kiln/c_api.h"\nint main(void) { kiln_program* p = 0; '
                      'return kiln_program_load("m.pte", 0, &p) == KILN_OK; }\n')
    proc = subprocess.run([cc, "-std=c99", "-Wall", "-Werror", "-fsyntax-only",
                           f"-I{ROOT / 'src' / 'c_api' / 'include'}", str(source)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_cuda_producer_refusing_the_per_thread_stream_is_asked_for_the_legacy_one():
    # torch 2.11's CUDA tensors raise BufferError for __dlpack__(stream=2) (the
    # per-thread default stream, where Kiln runs): the export asks again with
    # stream=1 (legacy default; cudaStreamPerThread waits for its work). A
    # stand-in producer that says it lives on CUDA and lends numpy's memory
    # records the streams it was asked for.
    from kiln_runtime import _dlpack

    class Producer:
        def __init__(self, refuse):
            self.data, self.refuse, self.asked = np.arange(6, dtype=np.float32), refuse, []

        def __dlpack_device__(self):
            return (_dlpack.CUDA, 0)

        def __dlpack__(self, stream=None):
            self.asked.append(stream)
            if stream in self.refuse:
                raise BufferError("per-thread default stream is not supported.")
            return self.data.__dlpack__()

    torch_like = Producer(refuse={2})
    capsule, tensor = _dlpack.export(torch_like)
    assert torch_like.asked == [2, 1] and tensor
    cupy_like = Producer(refuse=set())
    _dlpack.export(cupy_like)
    assert cupy_like.asked == [2]
    with pytest.raises(BufferError):
        _dlpack.export(Producer(refuse={1, 2}))
