"""Export-time constant folding: what a program computes from constants alone
is computed once, here, and becomes a constant.

Transformers build index tensors, masks and tables from constants at every
call: Llama's causal mask (arange, full, comparisons) and rotary cos/sin,
BERT's position and token-type ids, swin_t's relative position bias (a
gather of a parameter table by a buffer index) and shifted-window masks
(new_zeros + slice fills). None of it depends on the inputs, and most of it
is integer or boolean work the GPU engines should not spend launches on.

``fold_constants(program)`` returns a new ExportedProgram in which every
node whose tensor inputs are all constants (parameters, unmutated buffers,
lifted constants, or nodes folded before it), or that has no tensor input at
all (arange, full), is replaced by a lifted constant holding its value,
evaluated with PyTorch's own CPU kernels on the real tensors. The given
program is not changed. It runs on the edge program, before partitioning
(``FoldConstantsPass``, the transform pass ``kiln.compile`` hands
``to_edge_transform_and_lower``): that program is functional (in-place fills
of a fresh tensor, swin_t's masks, are slice_scatter) and decomposed (a
roll's index arithmetic, arange + fmod, is there to fold). The folded values
are lifted tensor constants (``program.constants``), which ExecuTorch keeps
real while the partitioner sees fake parameters.

Never folded: ops with side effects or a mutable schema, random ops (a
frozen draw would change the program), ``empty*`` (undefined contents), ops
whose result is not a tensor (or tuple of tensors) or does not match the
node's recorded dtype and shape, and nodes that feed the program's output
directly (kept as they are).

Layout-only chains of one constant (a weight's transpose, a view or cast
of a buffer: _LAYOUT_OPS) are evaluated (later nodes may need them) but not
turned into new constants: Kiln's compiler folds those itself, and copying
every linear's transposed weight here would double the export's memory.

Size bound: a folded value may be as large as the constants it is computed
from together, or MAX_FOLDED_BYTES (16 MiB), whichever is larger, so folding
never turns a small constant into a huge one (an expand of a scalar to a
[4096, 4096] float32 mask stops there: that node stays in the program).
Constants no node uses any more (a relative position table once its bias
is folded) are dropped from the program.
"""

from __future__ import annotations

import copy
import logging
import operator
from typing import Any, Optional

import torch
import torch.fx
from torch._guards import detect_fake_mode
from torch.export import ExportedProgram
from torch.export.graph_signature import ExportGraphSignature, InputKind, InputSpec, TensorArgument
from torch.utils import _pytree as pytree
from executorch.exir.pass_base import ExportedProgramPassBase, ExportedProgramPassResult
from executorch.exir.pass_manager import ExportedProgramPassManager

from . import _fx_nodes

logger = logging.getLogger("kiln")

# Folding is on by default; tools/coverage/probe_ops.py --no-fold turns it off.
ENABLED = True
MAX_FOLDED_BYTES = 16 << 20
_PREFIX = "_kiln_folded_"
# Ops that only move or reinterpret one constant's elements (or cast them):
# Kiln's compiler folds these itself (passes/fold_constants.cpp), so a chain
# of them on a parameter is left as it is rather than copied here (a weight
# transpose would otherwise duplicate every linear's weight at export).
_LAYOUT_OPS = {
    "view", "view_copy", "_unsafe_view", "reshape", "permute", "permute_copy", "t", "t_copy", "transpose",
    "transpose_copy", "unsqueeze", "unsqueeze_copy", "squeeze", "squeeze_copy", "expand", "expand_copy",
    "slice", "slice_copy", "select", "select_copy", "alias", "alias_copy", "clone", "_to_copy", "to",
    "contiguous", "detach", "lift_fresh_copy",
}


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _constant_tensors(program: ExportedProgram) -> dict[str, torch.Tensor]:
    """Placeholder name -> real tensor, for the placeholders that are constants."""
    sig = program.graph_signature
    names = _fx_nodes.constant_placeholder_names(program)
    out = {}
    for spec in sig.input_specs:
        name = getattr(spec.arg, "name", None)
        if name not in names or spec.target is None:
            continue
        value = program.state_dict.get(spec.target)
        if value is None:
            value = program.constants.get(spec.target)
        if isinstance(value, torch.Tensor):
            out[name] = value.detach()
    return out


def _aten_op(target: Any) -> Optional[torch._ops.OpOverload]:
    """The ATen overload of an ATen or edge-dialect op, else None."""
    if isinstance(target, torch._ops.OpOverload):
        return target
    op = getattr(target, "_op", None)  # EdgeOpOverload
    return op if isinstance(op, torch._ops.OpOverload) else None


def foldable_target(node: torch.fx.Node) -> bool:
    """A deterministic, side-effect-free op returning tensors: safe to evaluate at export."""
    if node.target is operator.getitem:
        return True
    target = _aten_op(node.target)
    if target is None:
        return False
    schema = target._schema
    if schema.is_mutable or node.is_impure():
        return False
    if torch.Tag.nondeterministic_seeded in target.tags:
        return False
    base = schema.name.split("::")[-1]
    if base.startswith(("empty", "new_empty")) or base in ("_assert_tensor_metadata", "dropout"):
        return False
    returns = [str(r.type) for r in schema.returns]
    return bool(returns) and all(r in ("Tensor", "List[Tensor]") for r in returns)


def _matches(value: Any, meta: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return (isinstance(meta, torch.Tensor) and value.dtype == meta.dtype
                and tuple(value.shape) == tuple(meta.shape))
    if isinstance(value, (tuple, list)):
        return (isinstance(meta, (tuple, list)) and len(value) == len(meta)
                and all(_matches(v, m) for v, m in zip(value, meta)))
    return False


def _evaluate(node: torch.fx.Node, values: dict[torch.fx.Node, Any],
              lazy: Optional[set] = None) -> Optional[Any]:
    """The node's value when every tensor argument is known, else None.
    Arguments in `lazy` (layout nodes of a constant, see fold_constants) are
    evaluated now, when a node needs them."""
    known = True

    def get(a):
        nonlocal known
        if isinstance(a, torch.fx.Node):
            if lazy is not None and a in lazy and a not in values:
                v = _evaluate(a, values, lazy)
                if v is not None:
                    values[a] = v
            if a not in values:
                known = False
                return None
            return values[a]
        return a

    args, kwargs = pytree.tree_map(get, (node.args, node.kwargs))
    if not known:
        return None
    try:
        with torch.no_grad():
            return node.target(*args, **kwargs)
    except Exception as e:  # an op PyTorch cannot run here: leave it in the program
        logger.debug("kiln: constant folding skips '%s': %s", node.name, e)
        return None


def _input_bytes(node: torch.fx.Node, values: dict[torch.fx.Node, Any]) -> int:
    total = 0
    for a in node.all_input_nodes:
        v = values.get(a)
        if isinstance(v, torch.Tensor):
            total += _nbytes(v)
    return total


def _own_storage(value: torch.Tensor, inputs: list[torch.Tensor]) -> torch.Tensor:
    """A contiguous tensor that shares no storage with the inputs (views and
    expands of parameters are copied)."""
    value = value.detach().contiguous()
    ptr = value.untyped_storage().data_ptr()
    if any(t.untyped_storage().data_ptr() == ptr for t in inputs):
        value = value.clone()
    return value


def fold_constants(program: ExportedProgram) -> ExportedProgram:
    """`program` with its constant subcomputations folded (see the module
    docstring); `program` itself when there is nothing to fold."""
    if not ENABLED or not _has_candidates(program):
        return program
    gm = copy.deepcopy(program.graph_module)
    graph = gm.graph
    real = _constant_tensors(program)
    placeholders = {n.name: n for n in graph.nodes if n.op == "placeholder"}
    values: dict[torch.fx.Node, Any] = {placeholders[k]: v for k, v in real.items() if k in placeholders}
    folded: list[torch.fx.Node] = []
    # Values that are a placeholder constant or layout ops of one (see
    # _LAYOUT_OPS): known, but never turned into new constants.
    trivial: set[torch.fx.Node] = set(values)
    lazy: set[torch.fx.Node] = set()
    for node in graph.nodes:
        if node.op != "call_function" or not foldable_target(node):
            continue
        if node.target is operator.getitem:
            source = node.args[0]
            if source in values and isinstance(values[source], (tuple, list)):
                values[node] = values[source][node.args[1]]
                folded.append(node)
                if source in trivial:
                    trivial.add(node)
            continue
        sources = node.all_input_nodes
        meta = node.meta.get("val")
        if (_aten_op(node.target)._schema.name.split("::")[-1] in _LAYOUT_OPS and len(sources) == 1
                and sources[0] in trivial and isinstance(meta, torch.Tensor)
                and (meta.dtype == sources[0].meta["val"].dtype or meta.dtype.is_floating_point)):
            # A layout node of one constant (a weight's transpose): never a new
            # constant, and evaluated only if a later node needs its value,
            # so export does not copy every weight. (A cast to an integer
            # dtype is folded: the compiler folds only casts to float dtypes.)
            trivial.add(node)
            lazy.add(node)
            continue
        value = _evaluate(node, values, lazy)
        if value is None or not _matches(value, meta):
            continue
        inputs = [values[a] for a in node.all_input_nodes if isinstance(values.get(a), torch.Tensor)]
        limit = max(MAX_FOLDED_BYTES, _input_bytes(node, values))
        flat = [value] if isinstance(value, torch.Tensor) else list(value)
        if sum(_nbytes(t) for t in flat) > limit:
            logger.debug("kiln: constant folding skips '%s': %d bytes over the bound", node.name,
                         sum(_nbytes(t) for t in flat))
            continue
        flat = [_own_storage(t, inputs) for t in flat]
        values[node] = flat[0] if isinstance(value, torch.Tensor) else type(value)(flat)
        folded.append(node)
    folded = [n for n in folded if n not in trivial]
    if not any(u not in folded and u.op != "output" for n in folded for u in n.users):
        return program  # nothing new would become a constant
    return _rebuild(program, gm, folded, values)


def _has_candidates(program: ExportedProgram) -> bool:
    """Cheap pre-check on the unfunctionalized graph: a call with no tensor
    input, or with only constant tensor inputs."""
    constants = _fx_nodes.constant_placeholder_names(program)
    for node in program.graph.nodes:
        op = _aten_op(node.target) if node.op == "call_function" else None
        if op is None or op._schema.is_mutable:
            continue
        if all(a.op == "placeholder" and a.name in constants for a in node.all_input_nodes):
            return True
    return False


def _rebuild(program: ExportedProgram, gm: torch.fx.GraphModule, folded: list[torch.fx.Node],
             values: dict[torch.fx.Node, Any]) -> ExportedProgram:
    graph = gm.graph
    folded_set = set(folded)
    fake_mode = detect_fake_mode(tuple(n.meta.get("val") for n in graph.nodes if n.op == "placeholder"))
    user_inputs = set(program.graph_signature.user_inputs)
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    first_user = next((n for n in placeholders if n.name in user_inputs), None)
    constants = dict(program.constants)
    state_dict = dict(program.state_dict)
    specs = {s.arg.name: s for s in program.graph_signature.input_specs}
    count = 0
    for node in folded:
        value = values[node]
        if not isinstance(value, torch.Tensor):
            continue
        outside = [u for u in node.users if u not in folded_set and u.op != "output"]
        if not outside:
            continue
        target = f"{_PREFIX}{count}"
        while target in constants or target in state_dict:
            count += 1
            target = f"{_PREFIX}{count}"
        count += 1
        constants[target] = value
        if first_user is not None:
            with graph.inserting_before(first_user):
                ph = graph.placeholder(target)
        else:
            with graph.inserting_after(placeholders[-1]):
                ph = graph.placeholder(target)
            placeholders.append(ph)
        ph.meta.update({k: v for k, v in node.meta.items() if k not in ("val", "tensor_meta")})
        ph.meta["val"] = fake_mode.from_tensor(value, static_shapes=True) if fake_mode else value
        specs[ph.name] = InputSpec(kind=InputKind.CONSTANT_TENSOR, arg=TensorArgument(name=ph.name),
                                   target=target, persistent=True)
        node.replace_all_uses_with(ph, delete_user_cb=lambda u: u.op != "output")
    graph.eliminate_dead_code()
    # Constant placeholders nothing uses any more (their data goes too).
    for ph in [n for n in graph.nodes if n.op == "placeholder"]:
        spec = specs.get(ph.name)
        if ph.users or spec is None or spec.kind == InputKind.USER_INPUT or ph.name in user_inputs:
            continue
        if spec.kind not in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
            continue
        if spec.target in program.graph_signature.buffers_to_mutate.values():
            continue
        graph.erase_node(ph)
        del specs[ph.name]
        still = {s.target for s in specs.values()}
        if spec.target not in still:
            state_dict.pop(spec.target, None)
            constants.pop(spec.target, None)
    gm.recompile()
    input_specs = [specs[n.name] for n in graph.nodes if n.op == "placeholder"]
    signature = ExportGraphSignature(input_specs=input_specs,
                                     output_specs=copy.deepcopy(program.graph_signature.output_specs))
    result = ExportedProgram(
        root=gm,
        graph=gm.graph,
        graph_signature=signature,
        state_dict=state_dict,
        range_constraints=copy.deepcopy(program.range_constraints),
        module_call_graph=copy.deepcopy(program.module_call_graph),
        example_inputs=program.example_inputs,
        constants=constants,
        verifiers=[program.verifier],
    )
    logger.debug("kiln: constant folding: %d nodes folded into %d constants", len(folded), count)
    return result


class FoldConstantsPass(ExportedProgramPassBase):
    """fold_constants as an ExecuTorch ExportedProgram pass (for
    ``to_edge_transform_and_lower(transform_passes=...)``)."""

    def call(self, exported_program: ExportedProgram) -> ExportedProgramPassResult:
        folded = fold_constants(exported_program)
        return ExportedProgramPassResult(folded, folded is not exported_program)


def transform_passes() -> Optional[ExportedProgramPassManager]:
    """What kiln.compile hands to_edge_transform_and_lower (None: folding off)."""
    return ExportedProgramPassManager([FoldConstantsPass()]) if ENABLED else None
