"""Compiler failures surface as kiln.CompileError naming the node."""

import pytest
import torch
from executorch.exir import to_edge
from executorch.exir.backend.compile_spec_schema import CompileSpec

import kiln
from kiln._native import native
from kiln._compile import edge_compile_config
from kiln._options import validate_options

from _helpers import export

pytestmark = pytest.mark.needs_compiler


def test_compile_error_is_the_extension_class():
    assert kiln.CompileError is kiln._kiln_compiler.CompileError
    assert issubclass(kiln.CompileError, RuntimeError)


def test_unsupported_node_in_graph_names_the_node():
    g = kiln._kiln_compiler.Graph()
    x = g.add_input("x", "float32", [4, 8])
    (y,) = g.add_node("aten.flip.default", "my_flip", [x], {"dims": [-1]}, [("float32", [4, 8])])
    g.set_outputs([y])
    with pytest.raises(kiln.CompileError, match="my_flip"):
        kiln._kiln_compiler.compile(g, [90])


def test_preprocess_of_an_unsupported_program_names_the_node():
    """Bypassing the partitioner, a program Kiln cannot compile fails in
    preprocess with the FX node's name."""

    class M(torch.nn.Module):
        def forward(self, x):
            return torch.flip(torch.relu(x), dims=[0])

    edge = to_edge(export(M(), torch.randn(4, 4)), compile_config=edge_compile_config())
    specs = validate_options().to_compile_specs()
    with pytest.raises(kiln.CompileError, match="aten_flip_default"):
        kiln.KilnBackend.preprocess(edge.exported_program(), specs)


def test_preprocess_compiles_bounded_dynamic_inputs_and_refuses_unbounded_ones(capsys):
    class M(torch.nn.Module):
        def forward(self, x):
            return torch.relu(x)

    # A Dim with a max: one engine per size bucket (a variant set).
    batch = torch.export.Dim("batch", min=2, max=64)
    ep = torch.export.export(M(), (torch.randn(4, 8),), dynamic_shapes={"x": {0: batch}})
    edge = to_edge(ep, compile_config=edge_compile_config())
    blob = kiln.KilnBackend.preprocess(edge.exported_program(), validate_options().to_compile_specs()).processed_bytes
    assert [v[0] for v in native().unpack_variant_set(blob)["values"]] == [2, 4, 8, 16, 32, 64]
    # Without a max there is nothing to compile variants for.
    unbounded = torch.export.export(M(), (torch.randn(4, 8),), dynamic_shapes={"x": {0: torch.export.Dim("batch")}})
    edge = to_edge(unbounded, compile_config=edge_compile_config())
    with pytest.raises(kiln.CompileError, match="has no max"):
        kiln.KilnBackend.preprocess(edge.exported_program(), validate_options().to_compile_specs())
    # The partitioner leaves such nodes on the CPU instead of failing.
    capsys.readouterr()
    compiled = kiln.compile(unbounded)
    assert compiled.delegates == []
    assert compiled.summary.ops_on_cpu == {"aten.relu.default": 1}
    # ... and says why, in one line per op
    (line,) = [l for l in capsys.readouterr().err.splitlines() if " on the CPU: " in l]
    assert line.startswith("kiln: aten.relu.default x1 on the CPU: 'aten_relu_default': ")
    assert "dynamic shape [s" in line and "give each torch.export Dim a max" in line


def test_bad_compile_spec_in_preprocess():
    class M(torch.nn.Module):
        def forward(self, x):
            return torch.relu(x)

    edge = to_edge(export(M(), torch.randn(4, 4)), compile_config=edge_compile_config())
    with pytest.raises(ValueError, match="unknown compile spec key"):
        kiln.KilnBackend.preprocess(edge.exported_program(), [CompileSpec("bogus", b"1")])
