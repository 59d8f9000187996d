"""kiln.save: writes one ExecuTorch .pte whose delegates are Kiln engines."""

import pytest
import torch

import kiln

from _helpers import MLP, engines_in_pte, export

pytestmark = pytest.mark.needs_compiler

# ExecuTorch's flatbuffer file identifier (schema/program.fbs), bytes 4..8.
PTE_IDENTIFIER = b"ET12"


def test_save_writes_a_pte(compiled_mlp, tmp_path):
    path = kiln.save(compiled_mlp, tmp_path / "nested" / "dir" / "mlp.pte")
    assert path == tmp_path / "nested" / "dir" / "mlp.pte"
    data = path.read_bytes()
    assert data[4:8] == PTE_IDENTIFIER
    engines = engines_in_pte(data)
    assert [backend for backend, _, _ in engines] == ["KilnBackend"]
    backend, specs, blob = engines[0]
    assert blob[:8] == b"KILNENG\0"
    assert specs["target_sms"] == b"80,86,87,89,90,100,110,120"
    info = kiln._kiln_compiler.inspect_engine(blob)
    # The fp32 MLP's weights all live in the program's named data, once each.
    assert info["weights_bytes"] == 0
    assert sum(n["nbytes"] for n in info["named_weights"]) >= (64 * 128 + 128 * 128 + 128 * 16) * 4
    from kiln.inspect import named_data_sizes
    assert set(named_data_sizes(data)) == {n["key"] for n in info["named_weights"]}


def test_save_accepts_str_path(compiled_mlp, tmp_path):
    path = kiln.save(compiled_mlp, str(tmp_path / "mlp.pte"))
    assert path.exists()


def test_bad_output_format(compiled_mlp, tmp_path):
    with pytest.raises(ValueError, match="output_format 'torchscript' is not supported"):
        kiln.save(compiled_mlp, tmp_path / "x.pte", output_format="torchscript")
    assert not (tmp_path / "x.pte").exists()


def test_bad_save_arguments(compiled_mlp, tmp_path):
    with pytest.raises(TypeError, match="use_cuda_graphs"):
        kiln.save(compiled_mlp, tmp_path / "x.pte", use_cuda_graphs="on")
    with pytest.raises(TypeError, match="path"):
        kiln.save(compiled_mlp, 42)


def _cuda_graphs_metadata(path):
    (_, specs, blob), = engines_in_pte(path.read_bytes())
    metadata = kiln._kiln_compiler.inspect_engine(blob)["metadata"]
    return specs["use_cuda_graphs"], metadata.get("use_cuda_graphs")


def test_use_cuda_graphs_from_compile_and_from_save(tmp_path):
    ep = export(MLP(), torch.randn(2, 64))
    baked = kiln.compile(ep, use_cuda_graphs=True)
    assert _cuda_graphs_metadata(kiln.save(baked, tmp_path / "a.pte")) == (b"1", "true")
    # save() overrides by re-lowering; the compiled program is unchanged.
    assert _cuda_graphs_metadata(
        kiln.save(baked, tmp_path / "b.pte", use_cuda_graphs=False)
    ) == (b"0", "false")
    assert _cuda_graphs_metadata(kiln.save(baked, tmp_path / "c.pte")) == (b"1", "true")

    unset = kiln.compile(ep)
    assert _cuda_graphs_metadata(kiln.save(unset, tmp_path / "d.pte")) == (b"-1", None)
    assert _cuda_graphs_metadata(
        kiln.save(unset, tmp_path / "e.pte", use_cuda_graphs=True)
    ) == (b"1", "true")
