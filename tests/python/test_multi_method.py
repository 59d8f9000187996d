"""Several methods in one .pte with their weights stored once (CPU side):
kiln.compile / kiln.executorch.export / kiln.save with a dict of programs,
the named-data key scheme, the external .ptd, inspect, and bad input.
The GPU side (running both methods, uploads counted) is
tests/gpu/multi_method_test.py."""

from __future__ import annotations

import re

import pytest
import torch

import kiln
from kiln import _weights
from kiln.inspect import delegate_blobs, describe, inspect_pte, named_data_sizes

pytestmark = pytest.mark.needs_compiler


class Block(torch.nn.Module):
    """Two linears; `forward` runs them, a second method reuses the same ones."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(64, 96)
        self.fc2 = torch.nn.Linear(96, 32)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


class HalfStep(torch.nn.Module):
    """The second method: the same Linear weights, another batch and epilogue."""

    def __init__(self, block: Block) -> None:
        super().__init__()
        self.block = block

    def forward(self, x):
        return torch.sigmoid(self.block.fc2(torch.relu(self.block.fc1(x))))


def two_methods(block: Block):
    return {
        "forward": torch.export.export(block, (torch.randn(8, 64),)),
        "half_step": torch.export.export(HalfStep(block), (torch.randn(1, 64),)),
    }


@pytest.fixture(scope="module")
def block():
    torch.manual_seed(12)
    return Block().eval()


@pytest.fixture(scope="module")
def compiled(block):
    return kiln.compile(two_methods(block), model_id="test-block")


@pytest.fixture(scope="module")
def saved(compiled, tmp_path_factory):
    out = tmp_path_factory.mktemp("multi_method")
    pte = kiln.save(compiled, out / "two.pte")
    ext_pte = kiln.save(compiled, out / "two_ext.pte", external_weights=out / "two_ext.ptd")
    return pte, ext_pte, out / "two_ext.ptd"


def _bytes(t: torch.Tensor) -> bytes:
    return t.detach().contiguous().numpy().tobytes()


def test_both_methods_in_one_program(compiled, saved):
    from executorch.exir._serialize._program import deserialize_pte_binary

    assert compiled.methods == ["forward", "half_step"]
    assert compiled.delegates == {"forward": ["KilnBackend"], "half_step": ["KilnBackend"]}
    assert set(compiled.summaries) == {"forward", "half_step"}
    assert compiled.summary.partitions == 2
    pte, _, _ = saved
    program = deserialize_pte_binary(pte.read_bytes()).program
    assert sorted(plan.name for plan in program.execution_plan) == ["forward", "half_step"]
    assert {d["method"] for d in delegate_blobs(pte.read_bytes())} == {"forward", "half_step"}


def test_method_metadata_through_executorch(saved):
    """ExecuTorch's own runtime reads the program and both methods' signatures
    (loading a method would need the GPU delegate)."""
    from executorch.runtime import Runtime

    pte, ext_pte, ptd = saved
    for path, data in ((pte, None), (ext_pte, ptd)):
        program = Runtime.get().load_program(path, data_path=data)
        assert set(program.method_names) == {"forward", "half_step"}
        assert list(program.metadata("forward").input_tensor_meta(0).sizes()) == [8, 64]
        assert list(program.metadata("half_step").input_tensor_meta(0).sizes()) == [1, 64]


def test_shared_weights_are_stored_once(block, saved):
    pte, _, _ = saved
    data = pte.read_bytes()
    for name, tensor in block.state_dict().items():
        assert data.count(_bytes(tensor)) == 1, name
    # Two engines, five weight contents in all (fc1/fc2 weight and bias, plus
    # nothing else), each once in the named data.
    sizes = named_data_sizes(data)
    assert len(sizes) == 4 and all(k.startswith("kiln/test-block/") for k in sizes)
    assert sum(sizes.values()) == sum(t.numel() * 4 for t in block.state_dict().values())


def test_key_scheme(block, compiled):
    engines = [kiln._native.native().inspect_engine(m.processed_bytes)
               for m in kiln._compile._kiln_lowered_modules(compiled.edge_program_manager)]
    keys = [{n["key"] for n in e["named_weights"]} for e in engines]
    assert keys[0] == keys[1]  # both methods name the same four weights
    native = kiln._native.native()
    w = _bytes(block.fc1.weight)
    expected = f"kiln/test-block/{native.hash_bytes(w):016x}-{len(w)}"
    assert expected in keys[0]
    for key in keys[0]:
        assert re.fullmatch(r"kiln/test-block/[0-9a-f]{16}-\d+", key), key


def test_inspect_shows_the_methods_sharing_one_set_of_weights(saved):
    pte, ext_pte, _ = saved
    info = inspect_pte(pte)
    assert info["method_weights"]["forward"]["shared_with"] == {
        "half_step": {"tensors": 4, "bytes": info["method_weights"]["forward"]["weight_bytes"]}}
    text = describe(info)
    assert "method 'forward': 1 delegate(s) ['KilnBackend']; weights: 4 tensors" in text
    assert "shared with method 'half_step'" in text and "shared with method 'forward'" in text
    assert "named data (each stored once): 4 weights" in text and "in this file" in text
    ext = describe(inspect_pte(ext_pte))
    assert "in an external .ptd" in ext and "in this file" not in ext


def test_external_weights_go_to_the_ptd(block, saved):
    pte, ext_pte, ptd = saved
    assert ptd.exists()
    pte_bytes, ptd_bytes = ext_pte.read_bytes(), ptd.read_bytes()
    for name, tensor in block.state_dict().items():
        assert pte_bytes.count(_bytes(tensor)) == 0, name
        assert ptd_bytes.count(_bytes(tensor)) == 1, name
    assert named_data_sizes(pte_bytes) == {}
    assert len(pte_bytes) < len(pte.read_bytes()) - len(ptd_bytes) // 2


def test_two_models_with_the_same_names_never_share_keys(block):
    """The same architecture (same state-dict names) with other weights: the
    default model id differs, so no key is shared; with one model id forced on
    both, only identical contents share a key."""
    torch.manual_seed(99)
    other = Block().eval()
    other.fc2.bias.data.copy_(block.fc2.bias.data)  # one identical tensor
    progs_a, progs_b = two_methods(block), two_methods(other)
    id_a, id_b = _weights.default_model_id(progs_a), _weights.default_model_id(progs_b)
    assert id_a != id_b and re.fullmatch(r"[0-9a-f]{16}", id_a)
    assert id_a == _weights.default_model_id(two_methods(block))  # stable

    def keys(program, model_id):
        compiled = kiln.compile(program, model_id=model_id)
        return {n["key"] for m in kiln._compile._kiln_lowered_modules(compiled.edge_program_manager)
                for n in kiln._native.native().inspect_engine(m.processed_bytes)["named_weights"]}

    a = keys(progs_a["forward"], None)
    b = keys(progs_b["forward"], None)
    assert a and b and not (a & b)
    same_a, same_b = keys(progs_a["forward"], "shared-id"), keys(progs_b["forward"], "shared-id")
    assert len(same_a & same_b) == 1  # fc2.bias: the same bytes, so the same key


def test_single_program_calls_are_unchanged(block):
    compiled = kiln.compile(torch.export.export(block, (torch.randn(8, 64),)))
    assert compiled.delegates == ["KilnBackend"]
    assert compiled.methods == ["forward"]
    manager = kiln.executorch.export(torch.export.export(block, (torch.randn(8, 64),)))
    assert manager.methods == {"forward"}


def test_executorch_export_takes_a_dict(block):
    manager = kiln.executorch.export(two_methods(block), arg_inputs={"half_step": (torch.randn(1, 64),)})
    assert manager.methods == {"forward", "half_step"}
    program = manager.to_executorch()
    assert sorted(p.name for p in program.executorch_program.execution_plan) == ["forward", "half_step"]


def test_engine_format_version():
    assert kiln._native.native().ENGINE_FORMAT_VERSION == 6  # 6: derived weights, persistent kernel steps


# ---- bad input ------------------------------------------------------------------


def test_bad_method_dicts(block):
    ep = torch.export.export(block, (torch.randn(8, 64),))
    with pytest.raises(ValueError, match="dict of methods is empty"):
        kiln.compile({})
    with pytest.raises(TypeError, match="method 'decode': expected a torch.export.ExportedProgram"):
        kiln.compile({"forward": ep, "decode": block})
    for bad in ("bad name", "1st", "", "a" * 65):
        with pytest.raises(ValueError, match="is not valid"):
            kiln.compile({bad: ep})
    with pytest.raises(TypeError, match="method names must be str"):
        kiln.compile({3: ep})
    with pytest.raises(TypeError, match="per-method options are not supported"):
        kiln.compile({"forward": ep}, enabled_precisions={"forward": {torch.float16}})
    with pytest.raises(TypeError, match="arg_inputs must be a dict"):
        kiln.executorch.export({"forward": ep}, arg_inputs=(torch.randn(8, 64),))
    with pytest.raises(ValueError, match=r"arg_inputs names method\(s\) \['decode'\]"):
        kiln.compile({"forward": ep}, arg_inputs={"decode": (torch.randn(8, 64),)})
    with pytest.raises(ValueError, match="method 'forward': arg_inputs"):
        kiln.compile({"forward": ep}, arg_inputs={"forward": (torch.randn(2, 64),)})


def test_bad_model_ids(block):
    ep = torch.export.export(block, (torch.randn(8, 64),))
    for bad in ("", "has space", "a/b", "x" * 65):
        with pytest.raises(ValueError, match="model_id"):
            kiln.compile(ep, model_id=bad)
    with pytest.raises(TypeError, match="model_id"):
        kiln.compile(ep, model_id=7)


def test_bad_external_weights(compiled, tmp_path):
    with pytest.raises(ValueError, match="ending in .ptd"):
        kiln.save(compiled, tmp_path / "m.pte", external_weights=tmp_path / "m.bin")
    with pytest.raises(ValueError, match="must differ"):
        kiln.save(compiled, tmp_path / "m.ptd", external_weights=tmp_path / "m.ptd")
    with pytest.raises(TypeError, match="external_weights"):
        kiln.save(compiled, tmp_path / "m.pte", external_weights=3)
    assert not (tmp_path / "m.pte").exists()
