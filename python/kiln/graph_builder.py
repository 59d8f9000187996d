"""ExportedProgram (one delegated partition) -> Kiln IR graph.

Placeholders that are user inputs become graph inputs, in the program's
argument order (the order ExecuTorch passes them to the delegate);
parameters, buffers and lifted constants become constants with their bytes;
call_function nodes become IR nodes described by ``_fx_nodes.describe_node``;
the output node sets the graph outputs.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch
import torch.fx
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, OutputKind

from torch.utils import _pytree as pytree

from . import _dynamic, _fx_nodes
from ._native import CompileError, native


def tensor_bytes(tensor: torch.Tensor) -> bytes:
    """Contiguous row-major bytes of a CPU tensor; bfloat16 goes through an
    int16 view because numpy has no bfloat16."""
    t = tensor.detach().to("cpu").contiguous()
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return t.numpy().tobytes()


def _constant_tensor(program: ExportedProgram, node: torch.fx.Node, spec) -> tuple[str, torch.Tensor]:
    """The state-dict key and tensor of constant placeholder `node`, whose
    input spec is `spec` (looked up once by the caller: the signature's
    inputs_to_* properties rebuild a dict on every access)."""
    if spec is None or spec.target is None:
        raise CompileError(f"constant '{node.name}' is not an input of the program's signature")
    key = spec.target
    if spec.kind == InputKind.PARAMETER:
        value = program.state_dict.get(key)
    elif spec.kind == InputKind.BUFFER:
        value = program.state_dict.get(key)
        if value is None:  # non-persistent buffers live in constants
            value = program.constants.get(key)
    else:
        value = program.constants.get(key)
    if not isinstance(value, torch.Tensor):
        raise CompileError(f"constant '{node.name}' ({key}) has no tensor data in the program")
    return key, value


def _getitem_source(node: torch.fx.Node) -> tuple[torch.fx.Node, int]:
    source, index = node.args[0], node.args[1]
    if not isinstance(source, torch.fx.Node) or not isinstance(index, int):
        raise CompileError(f"node '{node.name}': unexpected getitem arguments {node.args}")
    return source, index


# (state-dict key, tensor in the program) -> the tensor whose bytes to use, or
# None when the real data is not known (the partitioner's fake parameters).
ConstantResolver = Callable[[str, torch.Tensor], Optional[torch.Tensor]]


@dataclass
class BuiltGraph:
    """A built IR graph and what identifies it."""

    graph: Any
    # sha256 over every call made to build the graph (inputs, constants with
    # a hash of their bytes, nodes with their attributes, outputs): two
    # programs with the same key give the same engine for the same options.
    key: str
    # (node name, op) of every IR node, in order
    node_ops: list[tuple[str, str]] = field(default_factory=list)
    # False when some constant's real bytes were unknown (zeros were used)
    exact: bool = True


# Key prefix of the program's mutable buffers (engine states) when the
# options give no model prefix: "kiln/state/<buffer>".
DEFAULT_STATE_PREFIX = "kiln/"


class _Builder:
    def __init__(self, program: ExportedProgram, resolve: Optional[ConstantResolver] = None,
                 state_prefix: str = DEFAULT_STATE_PREFIX) -> None:
        self.program = program
        self.resolve = resolve
        self.state_prefix = state_prefix
        self.states: dict[str, int] = {}  # buffer target -> state value id
        self.graph = native().Graph()
        self.hash = hashlib.sha256()
        self.node_ops: list[tuple[str, str]] = []
        self.exact = True
        # FX node -> value ids (one per output of the node)
        self.values: dict[torch.fx.Node, list[int]] = {}
        self.input_names: list[str] = []
        self.output_names: list[str] = []
        # Constant placeholders' tensors and the size constants computed from
        # them (dynamic programs: _dynamic.is_size_constant).
        self.known: dict[torch.fx.Node, torch.Tensor] = {}
        self._size_constants: dict[torch.fx.Node, bool] = {}

    def value_of(self, node: torch.fx.Node, user: torch.fx.Node) -> int:
        ids = self.values.get(node)
        if ids is None:
            raise CompileError(f"node '{user.name}': input '{node.name}' is not a tensor Kiln has")
        if len(ids) != 1:
            raise CompileError(
                f"node '{user.name}': input '{node.name}' has {len(ids)} outputs; expected a getitem"
            )
        return ids[0]

    def add_placeholders(self) -> None:
        kinds = {spec.arg.name: spec for spec in self.program.graph_signature.input_specs}
        constants = _fx_nodes.constant_placeholder_names(self.program)
        for node in self.program.graph.nodes:
            if node.op != "placeholder":
                continue
            spec = kinds.get(node.name)
            t = self._type(node)
            if node.name in constants:
                key, tensor = _constant_tensor(self.program, node, spec)
                if self.resolve is not None:
                    real = self.resolve(key, tensor)
                    if real is None:  # data unknown here: same size, zeros
                        self.exact = False
                        real = torch.zeros(tensor.shape, dtype=tensor.dtype)
                    tensor = real
                self.known[node] = tensor
                data = tensor_bytes(tensor)
                self._record("constant", node.name, t.dtype, t.shape, hashlib.sha256(data).hexdigest())
                self.values[node] = [self.graph.add_constant(node.name, t.dtype, t.shape, data)]
            elif spec is not None and spec.kind == InputKind.BUFFER and spec.target in mutated_buffers(self.program):
                # A buffer the program updates in place (a KV cache): engine
                # state, kept on the GPU across runs under a per-model key.
                init = self.program.state_dict.get(spec.target)
                if init is None:
                    init = self.program.constants.get(spec.target)
                if init is None and self.resolve is None:
                    raise CompileError(f"mutable buffer '{spec.target}' has no initial value in the program")
                if self.resolve is not None and init is not None:
                    init = self.resolve(spec.target, init)
                data = b"" if init is None or not bool(torch.count_nonzero(init)) else tensor_bytes(init)
                key = f"{self.state_prefix}state/{spec.target}"
                self._record("state", node.name, t.dtype, t.shape, key, hashlib.sha256(data).hexdigest())
                self.values[node] = [self.graph.add_state(node.name, t.dtype, t.shape, key, data)]
                self.states[spec.target] = self.values[node][0]
            elif spec is not None and spec.kind == InputKind.USER_INPUT:
                self._record("input", node.name, t.dtype, t.shape)
                self.values[node] = [self.graph.add_input(node.name, t.dtype, t.shape)]
                self.input_names.append(node.name)
            else:
                kind = spec.kind.name if spec is not None else "unknown"
                raise CompileError(
                    f"input '{node.name}' is a {kind} input; Kiln takes user inputs and "
                    "constant parameters/buffers only (no mutable state)"
                )

    def add_call(self, node: torch.fx.Node) -> None:
        if _fx_nodes.is_size_node(node):
            # aten.sym_size / SymInt arithmetic: no IR value; its users read
            # the size this shape variant gives it (_fx_nodes.specialized).
            self._record("size", node.name, _fx_nodes.symbolic_int(node))
            return
        if _fx_nodes.sizes_bound() and _dynamic.is_size_constant(node, self.known.__contains__, self._size_constants):
            self._add_size_constant(node)
            return
        if _fx_nodes.is_getitem(node):
            source, index = _getitem_source(node)
            ids = self.values.get(source)
            if ids is None or not 0 <= index < len(ids):
                raise CompileError(f"node '{node.name}': getitem {index} of '{source.name}' is out of range")
            self.values[node] = [ids[index]]
            return
        try:
            desc = _fx_nodes.describe_node(node)
        except _fx_nodes.UnsupportedNode as e:
            raise CompileError(f"node '{node.name}' ({_fx_nodes.op_name(node.target)}): {e}") from None
        inputs = [self.value_of(arg, node) for arg in desc.inputs]
        outputs = [(t.dtype, t.shape) for t in desc.outputs]
        self._record("node", desc.op, desc.name, inputs, sorted(desc.attrs.items()), outputs)
        self.node_ops.append((desc.name, desc.op))
        self.values[node] = list(self.graph.add_node(desc.op, desc.name, inputs, desc.attrs, outputs))

    def _add_size_constant(self, node: torch.fx.Node) -> None:
        """Evaluates a node of this shape variant's sizes and constants (a
        causal mask over the dynamic length) with PyTorch's CPU kernels and
        adds its value as a constant."""
        def value(a: Any) -> Any:
            if isinstance(a, torch.fx.Node):
                return self.known[a] if a in self.known else _fx_nodes.symbolic_int(a)
            return a

        args, kwargs = pytree.tree_map(value, (node.args, node.kwargs))
        try:
            with torch.no_grad():
                result = node.target(*args, **kwargs)
        except Exception as e:
            raise CompileError(f"node '{node.name}': cannot compute it for this shape variant: {e}") from None
        t = self._type(node)
        if not isinstance(result, torch.Tensor) or list(result.shape) != t.shape or \
                _fx_nodes.TORCH_TO_KILN_DTYPE.get(result.dtype) != t.dtype:
            raise CompileError(f"node '{node.name}': its value for this shape variant is not {t.dtype} {t.shape}")
        result = result.contiguous()
        self.known[node] = result
        data = tensor_bytes(result)
        self._record("size_constant", node.name, t.dtype, t.shape, hashlib.sha256(data).hexdigest())
        self.values[node] = [self.graph.add_constant(node.name, t.dtype, t.shape, data)]

    def set_outputs(self, node: torch.fx.Node) -> None:
        out_specs = self.program.graph_signature.output_specs
        results = node.args[0]
        if not isinstance(results, (list, tuple)):
            results = (results,)
        if len(results) != len(out_specs):
            raise CompileError(f"program has {len(results)} outputs but {len(out_specs)} output specs")
        ids = []
        for value, spec in zip(results, out_specs):
            if not isinstance(value, torch.fx.Node):
                raise CompileError(f"program output {value!r} is not a tensor")
            if spec.kind == OutputKind.BUFFER_MUTATION and spec.target in self.states:
                # Updated in place by the engine; not a delegate output.
                self._record("state_update", spec.target, self.value_of(value, node))
                self.graph.set_state_update(self.states[spec.target], self.value_of(value, node))
                continue
            if spec.kind != OutputKind.USER_OUTPUT:
                raise CompileError(f"output '{spec.arg}' is a {spec.kind.name}; Kiln engines return user outputs "
                                   "and update their own mutable buffers only")
            ids.append(self.value_of(value, node))
            self.output_names.append(value.name)
        self._record("outputs", ids)
        self.graph.set_outputs(ids)

    def _record(self, *call: Any) -> None:
        self.hash.update(repr(call).encode())
        self.hash.update(b"\n")

    def _type(self, node: torch.fx.Node) -> _fx_nodes.TensorType:
        try:
            return _fx_nodes.node_tensor_type(node)
        except _fx_nodes.UnsupportedNode as e:
            raise CompileError(str(e)) from None


def build_graph(program: ExportedProgram) -> Any:
    """The Kiln IR ``Graph`` for `program`; raises CompileError naming the
    node it cannot express."""
    return build(program).graph


def mutated_buffers(program: ExportedProgram) -> set[str]:
    """Buffers (state-dict targets) the program updates in place."""
    return set(program.graph_signature.buffers_to_mutate.values())


def build(program: ExportedProgram, resolve: Optional[ConstantResolver] = None,
          state_prefix: str = DEFAULT_STATE_PREFIX) -> BuiltGraph:
    """``build_graph`` with the graph's key; `resolve` supplies the real
    tensor of a constant (see ConstantResolver); mutable buffers become
    engine states keyed "<state_prefix>state/<buffer>" (state_prefix is the
    weights' "kiln/<model id>/")."""
    builder = _Builder(program, resolve, state_prefix)
    builder.add_placeholders()
    for node in program.graph.nodes:
        if node.op == "call_function":
            builder.add_call(node)
        elif node.op == "output":
            builder.set_outputs(node)
        elif node.op != "placeholder":
            raise CompileError(f"node '{node.name}': unexpected FX op '{node.op}'")
    builder.graph.verify()
    return BuiltGraph(builder.graph, builder.hash.hexdigest(), builder.node_ops, builder.exact)
