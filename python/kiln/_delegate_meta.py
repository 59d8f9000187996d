"""Shape-only delegate calls while ExecuTorch serializes a lowered program.

``to_executorch`` re-traces each method's top-level graph twice (spec
propagation and one more pass). A Kiln delegate is one node there, but
torch's fake implementation of ``executorch_call_delegate`` finds its
outputs by unlifting the partition's whole original program
(``original_module.module()``) and running it on fake tensors: for a
4,000-node partition (swin_v2_b) that is ~1 s per re-trace on the 2-core
machine, to learn outputs the partition's graph already records.

``shape_only_delegates`` makes, for the duration of a ``with`` block,
``original_module.module()`` of each Kiln delegate return a callable that
builds those outputs directly (``torch.empty_strided`` with the recorded
shape, stride and dtype, under whatever fake mode is active), with the
original module's output structure. Only when every output is a plain
tensor of static shape; otherwise that delegate keeps torch's path. The
program written is the same, byte for byte (tests/python/test_edge_conversion.py).
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch
import torch.utils._pytree as pytree
from torch.export.graph_signature import OutputKind


def _output_builder(program: torch.export.ExportedProgram):
    """A stand-in for ``program.module()`` that returns outputs shaped as
    the program's user outputs, or None when they cannot be built exactly."""
    output_node = next(n for n in reversed(program.graph.nodes) if n.op == "output")
    values = list(output_node.args[0])
    specs = program.graph_signature.output_specs
    if len(specs) != len(values):
        return None
    metas = []
    for spec, value in zip(specs, values):
        if spec.kind != OutputKind.USER_OUTPUT:
            continue
        val = value.meta.get("val") if isinstance(value, torch.fx.Node) else None
        if not isinstance(val, torch.Tensor) or not all(isinstance(d, int) for d in (*val.shape, *val.stride())):
            return None
        metas.append((tuple(val.shape), tuple(val.stride()), val.dtype, val.device))
    out_spec = program.call_spec.out_spec
    if out_spec is None:
        return None

    def build(*args: Any, **kwargs: Any):
        outputs = [torch.empty_strided(shape, stride, dtype=dtype, device=device)
                   for shape, stride, dtype, device in metas]
        return pytree.tree_unflatten(outputs, out_spec)

    return build


@contextlib.contextmanager
def shape_only_delegates(lowered_modules: list) -> Iterator[None]:
    """See the module docstring; `lowered_modules`: LoweredBackendModules."""
    patched = []
    try:
        for module in lowered_modules:
            program = module.original_module
            builder = _output_builder(program)
            if builder is None:
                continue
            program.module = lambda builder=builder: builder  # shadows the method on this object
            patched.append(program)
        yield
    finally:
        for program in patched:
            del program.module
