"""`kiln inspect model.pte [--json]`: the report, the JSON and the errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from _helpers import CpuOpMLP, engines_in_pte, export

pytestmark = pytest.mark.needs_compiler
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def pte(tmp_path_factory) -> Path:
    import kiln

    torch.manual_seed(0)
    # gemv_kernels=False: fc1 stays one cuBLASLt GEMM, an engine without generated code.
    compiled = kiln.compile(export(CpuOpMLP(), torch.randn(4, 64)), use_cuda_graphs=False, gemv_kernels=False)
    return kiln.save(compiled, tmp_path_factory.mktemp("inspect") / "cpu_op.pte")


def inspect(*args) -> tuple[int, str, str]:
    environ = dict(os.environ, PYTHONPATH=str(ROOT / "python"))
    result = subprocess.run([sys.executable, "-m", "kiln", "inspect", *map(str, args)],
                            capture_output=True, text=True, env=environ, timeout=300)
    return result.returncode, result.stdout, result.stderr


def test_report(pte):
    code, out, err = inspect(pte)
    assert code == 0, err
    assert "method 'forward': 2 delegate(s) ['KilnBackend', 'KilnBackend']" in out
    assert out.count("engine ") == 2
    assert "code for: none (library GEMMs only)" in out
    assert "code for: sm_80, sm_90, sm_100, sm_110, sm_120 + PTX compute_80" in out
    # Which code each target SM runs (the runtime's rule): sm_80's cubin serves its minors.
    assert ("target SMs covered: sm_80 (cubin), sm_86 (sm_80 cubin), sm_87 (sm_80 cubin), sm_89 (sm_80 cubin), "
            "sm_90 (cubin), sm_100 (cubin), sm_110 (cubin), sm_120 (cubin)") in out
    assert "use_cuda_graphs=false" in out and "precision=float32" in out
    assert "input 0: x float32 [4, 64]" in out
    assert "gemm   linear" in out and "m=4 n=32 k=64" in out  # fc1's GEMM
    assert "kernel sigmoid" in out and "grid=" in out and "block=" in out
    assert "memory plan: arena" in out and "arena offset" in out


def test_json_for_machines(pte):
    code, out, err = inspect(pte, "--json")
    assert code == 0, err
    info = json.loads(out)
    assert info["delegates"] == {"forward": ["KilnBackend", "KilnBackend"]}
    first, second = info["engines"]
    # relu(fc1) is one cuBLASLt GEMM (no generated code); sigmoid(fc2) needs a kernel.
    assert first["sms"] == [] and first["ptx_sms"] == []
    assert second["sms"] == [80, 90, 100, 110, 120] and second["ptx_sms"] == [80]
    assert {c["sm"]: c["code"] for c in second["coverage"]} == {
        80: "cubin sm_80", 86: "cubin sm_80", 87: "cubin sm_80", 89: "cubin sm_80",
        90: "cubin sm_90", 100: "cubin sm_100", 110: "cubin sm_110", 120: "cubin sm_120"}
    assert first["metadata"]["use_cuda_graphs"] == "false"
    assert first["compile_specs"]["target_sms"] == "80,86,87,89,90,100,110,120"
    assert first["compile_specs"]["cubin_sms"] == "80,90,100,110,120"
    assert [t["shape"] for t in first["io"]["inputs"]] == [[4, 64]]
    assert [t["shape"] for t in second["io"]["outputs"]] == [[4, 16]]
    for engine in info["engines"]:
        plan = engine["memory_plan"]
        assert plan["named_weights_bytes"] > 0 and plan["named_weight_tensors"] == 2
        for t in plan["arena_tensors"]:
            assert 0 <= t["offset"] and t["offset"] + t["nbytes"] <= plan["arena_bytes"]
        labels = [s["label"] for s in engine["steps"]]
        assert labels and all(labels)


def test_corrupt_files_give_one_clear_error(pte, tmp_path, capsys):
    from kiln.inspect import main

    data = pte.read_bytes()
    _, _, blob = engines_in_pte(data)[0]
    flipped = bytearray(data)
    flipped[data.index(blob) + len(blob) // 2] ^= 0xFF  # inside the first engine
    cases = {
        "random.pte": (os.urandom(4096), "not an ExecuTorch program"),
        "empty.pte": (b"", "not an ExecuTorch program"),
        "truncated.pte": (data[: len(data) // 3], "not a readable ExecuTorch program"),
        "flipped.pte": (bytes(flipped), "delegate 0 (KilnBackend in 'forward')"),
    }
    for name, (content, message) in cases.items():
        path = tmp_path / name
        path.write_bytes(content)
        assert main([str(path)]) == 1, name
        err = capsys.readouterr().err
        assert err.startswith(f"kiln inspect: {path}"), err
        assert message in err, (name, err)
        assert "Traceback" not in err
    assert main([str(tmp_path / "missing.pte")]) == 1
    assert "No such file" in capsys.readouterr().err


def test_command_line_errors():
    code, _, err = inspect(ROOT / "nonexistent.pte")
    assert code == 1 and "kiln inspect:" in err and "Traceback" not in err
    environ = dict(os.environ, PYTHONPATH=str(ROOT / "python"))
    usage = subprocess.run([sys.executable, "-m", "kiln"], capture_output=True, text=True, env=environ)
    assert usage.returncode == 2 and "usage: kiln inspect" in usage.stderr


def test_a_reader_that_stops_early_is_not_an_error(pte):
    # `kiln inspect m.pte | head -3` (as scripts/quickstart.sh does): the pipe
    # closes before the report is written; no traceback, exit 0.
    environ = dict(os.environ, PYTHONPATH=str(ROOT / "python"))
    proc = subprocess.Popen([sys.executable, "-m", "kiln", "inspect", str(pte), "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=environ)
    proc.stdout.read(10)
    proc.stdout.close()  # the reader goes away with most of the report unread
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=300) == 0, err
    assert "Traceback" not in err and "BrokenPipe" not in err, err


def test_report_shows_derived_weights_and_persistent_steps():
    # Format v6 parts (no exporter makes them yet): an engine dict as
    # inspect_engine returns it, through the same summary and report code.
    from kiln import inspect as kinspect

    def tensor(name, storage, io_index=0, shape=(4, 64)):
        return {"name": name, "dtype": "float16", "shape": list(shape), "storage": storage,
                "io_index": io_index, "offset": 0, "nbytes": 512}

    engine = {
        "tensors": [tensor("x", "input"), tensor("w", "named_weight"), tensor("w.packed", "derived_weight"),
                    tensor("y", "output")],
        "inputs": [0], "outputs": [3], "modules": [], "arena_bytes": 0, "weights_bytes": 0,
        "named_weights": [{"key": "kiln/m/abc-512", "nbytes": 512, "hash": 1}],
        "derived_weights": [{"name": "w.packed", "nbytes": 3 << 20, "copies": 77000, "copied_bytes": 3 << 20}],
        "steps": [{"label": "decode_layers", "kind": "kernel", "function": "kiln_decode_layers",
                   "grid": [264, 1, 1], "block": [256, 1, 1], "shared_bytes": 1024, "min_blocks": 128,
                   "args": []},
                  {"label": "copy", "kind": "kernel", "function": "kiln_copy", "grid": [8, 1, 1],
                   "block": [128, 1, 1], "shared_bytes": 0, "min_blocks": 0, "args": []}],
        "metadata": {}, "method": "decode", "delegate_index": 0, "backend": "KilnBackend", "bytes": 4096,
        "compile_specs": {}, "weights_stored": "file", "weights_shared_with": [],
    }
    kinspect._summarize(engine)
    plan = engine["memory_plan"]
    assert plan["derived_weights_bytes"] == 3 << 20
    assert plan["derived_weights"] == [{"name": "w.packed", "nbytes": 3 << 20, "copies": 77000}]
    assert engine["derived_weights"][0]["tensors"] == ["w.packed"]
    out = "\n".join(kinspect._describe_engine(engine))
    assert "derived weights (made on the GPU at load from the weights): 3.0 MiB (3,145,728 B)" in out
    assert "w.packed: 3,145,728 B from 77,000 copies" in out
    assert "kiln_decode_layers grid=<=264 (persistent, min 128) block=256x1x1 smem=1024" in out
    assert "kiln_copy grid=8x1x1 block=128x1x1" in out
