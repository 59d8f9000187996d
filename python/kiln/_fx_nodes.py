"""One FX node as Kiln sees it: op name, tensor inputs, attributes, outputs.

The partitioner (asking ``check_support``) and the backend (building the
graph) both describe nodes through ``describe_node`` so the compiler is asked
about exactly what it will later be given.

Normalization rules, following the op's schema:
  * op name: "<namespace>.<name>.<overload>", e.g. "aten.addmm.default";
  * tensor arguments become inputs, in schema order; an optional tensor that
    is None adds no input but the attribute "<argname>_absent" = True, so the
    inputs after it keep their meaning (layer_norm with a bias and no
    weight); a list of tensors (``cat``) adds every tensor and an int
    attribute "<argname>_count";
  * every other argument (given or defaulted, except None) becomes an
    attribute keyed by its schema name: bool/int/float/str/list of int or
    float; a torch.dtype becomes its Kiln dtype name ("float16");
  * outputs come from the fake-tensor metadata ``node.meta["val"]``.
"""

from __future__ import annotations

import contextlib
import contextvars
import operator
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping

import torch
import torch.fx

TORCH_TO_KILN_DTYPE: dict[torch.dtype, str] = {
    torch.float32: "float32",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.int64: "int64",
    torch.int32: "int32",
    torch.bool: "bool",
}


class UnsupportedNode(Exception):
    """The node cannot be described to Kiln at all (e.g. dynamic shapes)."""


@dataclass
class TensorType:
    dtype: str
    shape: list[int]


@dataclass
class NodeDescription:
    op: str
    name: str
    inputs: list[torch.fx.Node] = field(default_factory=list)
    attrs: dict[str, Any] = field(default_factory=dict)
    outputs: list[TensorType] = field(default_factory=list)


def op_name(target: Any) -> str:
    """"aten.addmm.default" for an ATen OpOverload or an edge-dialect op."""
    schema = getattr(target, "_schema", None)
    if schema is None:
        return getattr(target, "__name__", str(target))
    name = schema.name.replace("::", ".")
    return f"{name}.{schema.overload_name or 'default'}"


def is_getitem(node: torch.fx.Node) -> bool:
    return node.op == "call_function" and node.target is operator.getitem


# Sizes of the symbolic dims (torch.export Dims) while one shape variant of a
# dynamic program is described: sympy symbol name -> int. Kiln compiles static
# shapes; a dynamic partition is compiled once per variant (_dynamic.py).
_BINDINGS: contextvars.ContextVar[Mapping[str, int] | None] = contextvars.ContextVar("kiln_bindings", default=None)


@contextlib.contextmanager
def specialized(bindings: Mapping[str, int]) -> Iterator[None]:
    """Describes nodes with every symbolic size given its value in `bindings`."""
    token = _BINDINGS.set(dict(bindings))
    try:
        yield
    finally:
        _BINDINGS.reset(token)


def sizes_bound() -> bool:
    """True inside specialized(): symbolic sizes have values."""
    return _BINDINGS.get() is not None


def symbolic_int(value: Any) -> int:
    """The int a SymInt (or a node computing one, e.g. aten.sym_size) takes
    under the current bindings; UnsupportedNode outside specialized()."""
    if isinstance(value, torch.fx.Node):
        value = value.meta.get("val")
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if not isinstance(value, torch.SymInt):
        raise UnsupportedNode(f"{value!r} is not a size")
    bindings = _BINDINGS.get()
    expr = value.node.expr
    if bindings is None:
        raise UnsupportedNode(f"size {expr} is symbolic")
    import sympy

    substituted = sympy.sympify(expr).xreplace(
        {sym: sympy.Integer(bindings[sym.name]) for sym in expr.free_symbols if sym.name in bindings})
    if not getattr(substituted, "is_Integer", False):
        raise UnsupportedNode(f"size {expr} has symbols without a value ({sorted(map(str, expr.free_symbols))})")
    return int(substituted)


def is_size_node(node: Any) -> bool:
    """A node whose value is an int size (aten.sym_size.int, SymInt arithmetic),
    not a tensor: it has no IR value; its users read it as a constant."""
    return isinstance(node, torch.fx.Node) and isinstance(node.meta.get("val"), torch.SymInt)


def compute_nodes(nodes) -> list[torch.fx.Node]:
    """The nodes a partition computes (not getitems, not aten.sym_size: a
    partition of sizes alone is no partition)."""
    return [n for n in nodes if n.op == "call_function" and not is_getitem(n) and not is_size_node(n)]


def tensor_type(value: Any, what: str) -> TensorType:
    """TensorType of a (fake) tensor; UnsupportedNode for symbolic shapes
    (outside specialized()) or dtypes Kiln does not have."""
    if not isinstance(value, torch.Tensor):
        raise UnsupportedNode(f"{what} is not a tensor ({type(value).__name__})")
    if value.dtype not in TORCH_TO_KILN_DTYPE:
        raise UnsupportedNode(f"{what} has dtype {value.dtype}, which Kiln does not support")
    if not all(isinstance(dim, int) for dim in value.shape):
        if _BINDINGS.get() is None:
            raise UnsupportedNode(f"{what} has a dynamic shape {list(value.shape)} whose dims have no range "
                                  "Kiln can compile variants for (give each torch.export Dim a max)")
        try:
            shape = [symbolic_int(dim) for dim in value.shape]
        except UnsupportedNode as e:
            raise UnsupportedNode(f"{what}: {e}") from None
    else:
        shape = [int(dim) for dim in value.shape]
    return TensorType(TORCH_TO_KILN_DTYPE[value.dtype], shape)


def node_tensor_type(node: torch.fx.Node) -> TensorType:
    if "val" not in node.meta:
        raise UnsupportedNode(f"node '{node.name}' has no shape metadata")
    return tensor_type(node.meta["val"], f"node '{node.name}'")


def output_types(node: torch.fx.Node) -> list[TensorType]:
    val = node.meta.get("val")
    if val is None:
        raise UnsupportedNode(f"node '{node.name}' has no shape metadata")
    if isinstance(val, (list, tuple)):
        return [tensor_type(v, f"output {i} of '{node.name}'") for i, v in enumerate(val)]
    return [tensor_type(val, f"output of '{node.name}'")]


def _attr_value(value: Any, arg_name: str, node: torch.fx.Node) -> Any:
    if isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, torch.dtype):
        if value not in TORCH_TO_KILN_DTYPE:
            raise UnsupportedNode(f"argument '{arg_name}' is dtype {value}")
        return TORCH_TO_KILN_DTYPE[value]
    if isinstance(value, (torch.memory_format, torch.layout, torch.device)):
        return str(value).removeprefix("torch.")
    if isinstance(value, (list, tuple)) and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) for v in value
    ):
        return list(value)
    if isinstance(value, (list, tuple)) and all(
        (isinstance(v, int) and not isinstance(v, bool)) or isinstance(v, torch.SymInt) or is_size_node(v)
        for v in value
    ):  # a shape with symbolic sizes ([1, s0, 32]): its values in this variant
        try:
            return [symbolic_int(v) for v in value]
        except UnsupportedNode as e:
            raise UnsupportedNode(f"argument '{arg_name}' of '{node.name}': {e}") from None
    if isinstance(value, torch.SymInt) or is_size_node(value):
        try:
            return symbolic_int(value)
        except UnsupportedNode as e:
            raise UnsupportedNode(f"argument '{arg_name}' of '{node.name}': {e}") from None
    if isinstance(value, (torch.SymFloat, torch.SymBool)):
        raise UnsupportedNode(f"argument '{arg_name}' is symbolic")
    raise UnsupportedNode(
        f"argument '{arg_name}' of '{node.name}' has an unsupported value {type(value).__name__}"
    )


def _is_optional_tensor(arg: Any) -> bool:
    t = arg.type
    return isinstance(t, torch.OptionalType) and isinstance(t.getElementType(), torch.TensorType)


def _is_tensor_node(value: Any) -> bool:
    return isinstance(value, torch.fx.Node) and not is_size_node(value)


def describe_node(node: torch.fx.Node) -> NodeDescription:
    """Normalizes a call_function node; raises UnsupportedNode when it cannot
    be expressed in Kiln's IR."""
    schema = getattr(node.target, "_schema", None)
    if node.op != "call_function" or schema is None:
        raise UnsupportedNode(f"node '{node.name}' is not an operator call")
    desc = NodeDescription(op=op_name(node.target), name=node.name)
    positional = list(node.args)
    for index, arg in enumerate(schema.arguments):
        if not arg.kwarg_only and index < len(positional):
            value = positional[index]
        elif arg.name in node.kwargs:
            value = node.kwargs[arg.name]
        elif arg.has_default_value():
            value = arg.default_value
        else:
            raise UnsupportedNode(f"node '{node.name}' is missing argument '{arg.name}'")
        if value is None:
            if _is_optional_tensor(arg):
                desc.attrs[f"{arg.name}_absent"] = True
            continue
        if _is_tensor_node(value):
            node_tensor_type(value)  # validates dtype and static shape
            desc.inputs.append(value)
        elif (isinstance(value, (list, tuple)) and any(_is_tensor_node(v) for v in value)
              and all(v is None or _is_tensor_node(v) for v in value) and any(v is None for v in value)):
            # index_put's [None, None, pos]: the tensors, and the list
            # positions they stood at
            tensors = [v for v in value if v is not None]
            for v in tensors:
                node_tensor_type(v)
            desc.inputs.extend(tensors)
            desc.attrs[f"{arg.name}_count"] = len(tensors)
            desc.attrs[f"{arg.name}_positions"] = [i for i, v in enumerate(value) if v is not None]
        elif isinstance(value, (list, tuple)) and any(_is_tensor_node(v) for v in value):
            if not all(_is_tensor_node(v) for v in value):
                raise UnsupportedNode(
                    f"argument '{arg.name}' of '{node.name}' mixes tensors and other values"
                )
            for v in value:
                node_tensor_type(v)
            desc.inputs.extend(value)
            desc.attrs[f"{arg.name}_count"] = len(value)
        else:
            desc.attrs[arg.name] = _attr_value(value, arg.name, node)
    desc.outputs = output_types(node)
    return desc


def constant_placeholder_names(program: "torch.export.ExportedProgram") -> set[str]:
    """Placeholders whose data is known at export: parameters, buffers that are
    never mutated, and lifted tensor constants. Kiln bakes these into the
    engine's weights."""
    sig = program.graph_signature
    mutated = set(sig.buffers_to_mutate.values())
    names = set(sig.inputs_to_parameters) | set(sig.inputs_to_lifted_tensor_constants)
    names |= {name for name, target in sig.inputs_to_buffers.items() if target not in mutated}
    return names
