"""inspect_engine on the engines KilnBackend.preprocess produced."""

import pytest
import torch

import kiln

from _helpers import CpuOpMLP, export, lowered_modules

pytestmark = pytest.mark.needs_compiler


def _engines(compiled):
    return [
        kiln._kiln_compiler.inspect_engine(m.processed_bytes)
        for m in lowered_modules(compiled.edge_program_manager)
    ]


def test_engine_contents(compiled_mlp):
    (info,) = _engines(compiled_mlp)
    # One input (x [8, 64]), one output ([8, 16]), both float32.
    inputs = [info["tensors"][i] for i in info["inputs"]]
    outputs = [info["tensors"][i] for i in info["outputs"]]
    assert [(t["dtype"], t["shape"], t["storage"]) for t in inputs] == [("float32", [8, 64], "input")]
    assert [(t["dtype"], t["shape"], t["storage"]) for t in outputs] == [("float32", [8, 16], "output")]

    gemms = [s for s in info["steps"] if s["kind"] == "gemm"]
    assert [(g["m"], g["n"], g["k"]) for g in gemms] == [(8, 128, 64), (8, 128, 128), (8, 16, 128)]
    assert all(g["b_transposed"] for g in gemms)  # nn.Linear weights used as stored

    # GELU needs a generated kernel: the default SMs get one cubin per major
    # (sm_80's serves sm_86/87/89) plus PTX for the oldest.
    assert info["modules"], info["steps"]
    for module in info["modules"]:
        assert module["sms"] == [80, 90, 100, 110, 120]
        assert all(size > 0 for size in module["cubin_bytes"])
        assert module["ptx_sm"] == 80
        assert module["ptx_bytes"] > 0
    kernels = [s for s in info["steps"] if s["kind"] == "kernel"]
    assert kernels and all(k["block"][0] > 0 and k["function"] for k in kernels)
    assert all(k["min_blocks"] == 0 for k in kernels)  # fixed grids (format v6 field)
    assert info["derived_weights"] == []

    assert info["metadata"]["precision"] == "float32"
    assert info["metadata"]["target_sms"] == "80,86,87,89,90,100,110,120"
    assert "use_cuda_graphs" not in info["metadata"]  # no choice baked in
    # kiln.compile keeps weights in the program's named data, not the engine.
    assert info["weights_bytes"] == 0 and info["arena_bytes"] >= 0
    assert info["named_weights"] and all(n["key"].startswith("kiln/") and n["nbytes"] > 0
                                         for n in info["named_weights"])


def test_an_explicit_sm_list_gets_exactly_its_cubins():
    # The full default list named by hand: a cubin for each SM, as before.
    compiled = kiln.compile(export(CpuOpMLP(), torch.randn(4, 64)),
                            target_sms=[80, 86, 87, 89, 90, 100, 110, 120])
    for info in _engines(compiled):
        assert info["metadata"]["target_sms"] == "80,86,87,89,90,100,110,120"
        for module in info["modules"]:
            assert module["sms"] == [80, 86, 87, 89, 90, 100, 110, 120]


def test_options_reach_the_engine():
    compiled = kiln.compile(
        export(CpuOpMLP(), torch.randn(4, 64)),
        target_sms=[90, 100],
        use_cuda_graphs=False,
    )
    engines = _engines(compiled)
    assert len(engines) == 2
    for info in engines:
        assert info["metadata"]["target_sms"] == "90,100"
        assert info["metadata"]["use_cuda_graphs"] == "false"
        for module in info["modules"]:
            assert module["sms"] == [90, 100]
            assert module["ptx_sm"] == 90  # the oldest: every newer GPU can JIT it


def test_inspect_rejects_bad_bytes(compiled_mlp):
    (lowered,) = lowered_modules(compiled_mlp.edge_program_manager)
    blob = bytes(lowered.processed_bytes)
    with pytest.raises(ValueError, match="not a valid Kiln engine"):
        kiln._kiln_compiler.inspect_engine(b"not an engine at all")
    with pytest.raises(ValueError, match="truncated"):
        kiln._kiln_compiler.inspect_engine(blob[: len(blob) // 2])
    flipped = bytearray(blob)
    flipped[len(blob) // 2] ^= 0xFF
    with pytest.raises(ValueError, match="not a valid Kiln engine"):
        kiln._kiln_compiler.inspect_engine(bytes(flipped))
