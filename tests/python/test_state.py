"""Mutable buffers (a KV cache) owned by the engine (issue 12, item 3), CPU
side: a buffer the forward updates in place with index_copy_ / slice
assignment at a position input is taken by Kiln with its update (0 ops on
the CPU, the buffer gone from the top-level program), and the engine records
it as a state with a per-model key, updated by an in-place scatter step."""

from __future__ import annotations

import pytest
import torch

import kiln

from _helpers import lowered_modules

pytestmark = pytest.mark.needs_compiler


class Cache(torch.nn.Module):
    def __init__(self, slice_assign: bool = False) -> None:
        super().__init__()
        self.register_buffer("k", torch.zeros(1, 4, 32, 16))
        self.proj = torch.nn.Linear(16, 16)
        self.slice_assign = slice_assign

    def forward(self, x, pos):
        if self.slice_assign:
            self.k[:, :, pos] = self.proj(x)
        else:
            self.k.index_copy_(2, pos, self.proj(x))
        return self.k.sum(2) * 2


@pytest.mark.parametrize("slice_assign", [False, True], ids=["index_copy", "slice_assign"])
def test_cache_update_is_an_engine_state(slice_assign):
    args = (torch.randn(1, 4, 1, 16), torch.tensor([3]))
    ep = torch.export.export(Cache(slice_assign).eval(), args)
    compiled = kiln.compile(ep, arg_inputs=args, model_id="cache-test")
    assert compiled.summary.ops_on_cpu == {}
    top = compiled.edge_program_manager.exported_program()
    assert [s.arg.name for s in top.graph_signature.input_specs] == ["x", "pos"]  # the buffer moved inside
    (blob,) = [bytes(m.processed_bytes) for m in lowered_modules(compiled.edge_program_manager)]
    info = kiln._kiln_compiler.inspect_engine(blob)
    states = [t for t in info["tensors"] if t["storage"] == "state"]
    assert len(states) == 1 and states[0]["shape"] == [1, 4, 32, 16]
    assert any(s["label"] == "state_update" for s in info["steps"])


def test_functional_index_put_stays_on_the_cpu():
    class Scatter(torch.nn.Module):
        def forward(self, x, pos, v):
            return torch.index_put(x * 2, [pos], v)

    args = (torch.randn(8, 4), torch.tensor([1, 5]), torch.randn(2, 4))
    compiled = kiln.compile(torch.export.export(Scatter(), args), arg_inputs=args)
    assert compiled.summary.ops_on_cpu == {"aten.index_put.default": 1}
