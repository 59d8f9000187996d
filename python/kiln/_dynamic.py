"""Dynamic shapes: a partition whose inputs carry torch.export Dims.

Kiln's engines have static shapes (every size a constant in the generated
kernels and library descriptors, which is where the batch-1 speed comes
from). A dynamic partition is therefore compiled once per *shape variant*:
each symbol (torch.export's s0, s1, ...) takes each of its bucket sizes
(``shape_buckets``, default the range's min, max and the powers of two
between), and the engines go into one delegate blob, a variant set
(src/engine_format/variant_set.h) that also holds the symbols' ranges and
which input dim each symbol is. At execute the delegate runs the variant
whose sizes equal the inputs' and refuses any other size with
InvalidArgument naming the input, the dim and the sizes it has.

Cost (docs/design_llm.md, "Dynamic shapes"): export time and the blob grow
with the number of variants (weights are named data, stored once); load
time grows by one algorithm choice per GEMM per variant; each variant gets
its own activation arena and CUDA graph.
"""

from __future__ import annotations

import hashlib
import itertools
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind

from . import _fx_nodes
from ._native import CompileError, native

@dataclass
class ShapeModel:
    """The symbols of a program's user inputs and where they are."""

    symbols: list[tuple[str, int, int]] = field(default_factory=list)  # (name, min, max)
    bindings: list[tuple[int, int, int]] = field(default_factory=list)  # (input, dim, symbol index)

    @property
    def dynamic(self) -> bool:
        return bool(self.symbols)


def _user_inputs(program: ExportedProgram) -> list[torch.fx.Node]:
    kinds = {spec.arg.name: spec.kind for spec in program.graph_signature.input_specs}
    return [n for n in program.graph.nodes
            if n.op == "placeholder" and kinds.get(n.name) == InputKind.USER_INPUT]


def _range(program: ExportedProgram, symbol) -> tuple[int, int]:
    for key, value_range in program.range_constraints.items():
        if str(key) == symbol.name:
            lo, hi = value_range.lower, value_range.upper
            if not (getattr(lo, "is_integer", False) or isinstance(lo, int)):
                break
            if not getattr(hi, "is_finite", True) or str(hi) in ("oo", "int_oo"):
                raise CompileError(f"dynamic dim {symbol.name} has no max (range [{lo}, {hi}]): give its "
                                   "torch.export Dim a max, e.g. Dim('seq', min=1, max=512); Kiln compiles "
                                   "one engine per size bucket inside the range")
            return int(lo), int(hi)
    raise CompileError(f"dynamic dim {symbol.name} has no range in the program's range_constraints")


def shape_model(program: ExportedProgram) -> ShapeModel:
    """The symbols that user-input dims are (a dim that is an expression such
    as 2*s0 is derived, not bound); CompileError for a symbol without a
    finite range or one that no input dim is on its own."""
    model = ShapeModel()
    index: dict[str, int] = {}
    derived: set[str] = set()
    for i, node in enumerate(_user_inputs(program)):
        value = node.meta.get("val")
        if not isinstance(value, torch.Tensor):
            continue
        for d, dim in enumerate(value.shape):
            if not isinstance(dim, torch.SymInt):
                continue
            expr = dim.node.expr
            if expr.is_Symbol:
                if expr.name not in index:
                    index[expr.name] = len(model.symbols)
                    model.symbols.append((expr.name, *_range(program, expr)))
                model.bindings.append((i, d, index[expr.name]))
            else:
                derived.update(s.name for s in expr.free_symbols)
    unbound = sorted(derived - set(index))
    if unbound:
        raise CompileError(f"dynamic dims {unbound} appear only inside size expressions of the inputs; Kiln binds "
                           "each dynamic dim to an input dim that is that symbol alone")
    return model


def buckets(lo: int, hi: int, requested: tuple[int, ...]) -> list[int]:
    """The sizes a symbol with range [lo, hi] is compiled for."""
    if requested:
        inside = sorted({b for b in requested if lo <= b <= hi})
        if not inside:
            raise CompileError(f"shape_buckets {list(requested)} has no size inside the dim's range [{lo}, {hi}]")
        return inside
    sizes = {lo, hi}
    p = 1
    while p <= hi:
        if p >= lo:
            sizes.add(p)
        p *= 2
    return sorted(sizes)


def variants(model: ShapeModel, requested: tuple[int, ...]) -> list[dict[str, int]]:
    """Each variant's {symbol name: size}: the product of the symbols' buckets."""
    names = [name for name, _lo, _hi in model.symbols]
    per_symbol = [buckets(lo, hi, requested) for _name, lo, hi in model.symbols]
    count = 1
    for sizes in per_symbol:
        count *= len(sizes)
    limit = native().MAX_SHAPE_VARIANTS  # the variant set's bound (engine_format/variant_set.h)
    if count > limit:
        raise CompileError(f"the dynamic dims give {count} shape variants ({', '.join(f'{n}: {len(s)}' for n, s in zip(names, per_symbol))}); "
                           f"at most {limit}: pass fewer shape_buckets")
    return [dict(zip(names, combo)) for combo in itertools.product(*per_symbol)]


def representative(program: ExportedProgram) -> Optional[dict[str, int]]:
    """The sizes the partitioner asks the compiler about (each symbol's max,
    the largest variant); None for a static program or one whose dims have
    no usable range (its nodes are then refused with that reason)."""
    try:
        model = shape_model(program)
    except CompileError:
        return None
    return {name: hi for name, _lo, hi in model.symbols} if model.dynamic else None


def is_size_constant(node: torch.fx.Node, is_constant: Callable[[torch.fx.Node], bool],
                     memo: dict[torch.fx.Node, bool]) -> bool:
    """True for a node each shape variant can compute at export: a
    deterministic op (_constant_fold's rules) whose tensor inputs are
    constants or such nodes, reading at least one size (aten.sym_size) or
    such node. A causal mask built from arange/full over the dynamic length
    is one; a weight's transpose (constants only) is not: the compiler takes
    that itself. Static programs fold these before partitioning
    (_constant_fold.py); a dynamic program's sizes are known per variant."""
    if node in memo:
        return memo[node]
    from ._constant_fold import foldable_target

    memo[node] = False  # a cycle cannot happen in a graph; this bounds recursion on bad input
    if node.op != "call_function" or _fx_nodes.is_size_node(node) or not foldable_target(node):
        return False
    reads_size = False
    for source in node.all_input_nodes:
        if _fx_nodes.is_size_node(source):
            reads_size = True
        elif source.op == "call_function" and is_size_constant(source, is_constant, memo):
            reads_size = True
        elif not is_constant(source):
            return False
    memo[node] = reads_size
    return reads_size


@dataclass
class BuiltProgram:
    """A partition built for each of its shape variants. Only a static
    program keeps its graph: a dynamic one is rebuilt variant by variant when
    it is compiled, so one variant's graph (with its copy of the weights) is
    in memory at a time, whatever the number of variants."""

    model: ShapeModel
    sizes: list[dict[str, int]]  # per variant ({} for a static program)
    key: str
    exact: bool
    node_ops: list[tuple[str, str]]
    build_variant: Callable[[dict[str, int]], object]
    graph: object = None  # the static program's graph_builder.BuiltGraph


def build_program(program: ExportedProgram, build: Callable[[], object], requested: tuple[int, ...]) -> BuiltProgram:
    """`build()` (graph_builder.build on `program`) once: a static program
    under its own key; a dynamic one at its largest variant, whose key (the
    graph and its constants) with the FX graph's nodes (every size expression
    is a node there), the symbols, their bindings and the variants' sizes
    names every variant's graph. The variants themselves are built when they
    are compiled (compile_program), so the partitioner's trial and
    preprocess build each once, not once more each for the key."""
    model = shape_model(program)

    def build_variant(sizes: dict[str, int]):
        with _fx_nodes.specialized(sizes):
            return build()

    if not model.dynamic:
        built = build()
        return BuiltProgram(model, [{}], built.key, built.exact, built.node_ops, lambda _sizes: built, built)
    all_sizes = variants(model, requested)
    largest = build_variant({name: hi for name, _lo, hi in model.symbols})
    key = hashlib.sha256(repr(model.symbols).encode() + repr(model.bindings).encode())
    for node in program.graph.nodes:  # arguments name their nodes: size expressions included
        key.update(f"{node.op} {node.name} {node.target} {node.args} {node.kwargs}\n".encode())
    key.update(repr([sorted(sizes.items()) for sizes in all_sizes]).encode())
    key.update(largest.key.encode())
    exact, node_ops = largest.exact, largest.node_ops
    del largest
    return BuiltProgram(model, all_sizes, key.hexdigest(), exact, node_ops, build_variant)


def has_persistent_step(engine: bytes) -> bool:
    """True when the engine has a persistent kernel step (min_blocks > 0):
    one whose blocks must all be resident at once."""
    return any(step.get("min_blocks", 0) > 0 for step in native().inspect_engine(engine)["steps"])


def compile_program(built: BuiltProgram, compile_one: Callable[..., object], weights_prefix: str = "",
                    fallback_one: Optional[Callable[..., object]] = None):
    """A _trial.CompiledEngine: one engine for a static program; for a
    dynamic one, a variant set of one engine per variant, built and compiled
    one at a time. `compile_one(graph, name_weights="", return_weights=False)`
    compiles one graph (_trial.compile_graph). With a weights prefix
    (kiln.compile's named weights) every engine names its weights and leaves
    them out; the weights come back beside the blob, each key once (variants
    share theirs: the keys are content hashes). `fallback_one` (same
    signature; _trial.fallback_compiler): an engine with a persistent kernel
    step gets a second engine of the same graph compiled by it, as its
    alternative in the variant set (variant_set.h), which the delegate runs
    where the first cannot."""
    from ._trial import CompiledEngine

    weights, seen = [], set()

    def one(graph, compile_with=compile_one) -> bytes:
        if not weights_prefix:
            return compile_with(graph)
        blob, named = compile_with(graph, weights_prefix, True)
        for entry in named:
            if entry[0] not in seen:
                seen.add(entry[0])
                weights.append(entry)
        return blob

    def alternatives(graph) -> list[bytes]:
        blob = one(graph)
        if fallback_one is None or not has_persistent_step(blob):
            return [blob]
        return [blob, one(graph, fallback_one)]

    if not built.model.dynamic:
        engines = alternatives(built.graph)
        if len(engines) == 1:
            return CompiledEngine(engines[0], weights)
        return CompiledEngine(native().pack_variant_set([], [], [[] for _ in engines], engines), weights)
    names = [name for name, _lo, _hi in built.model.symbols]
    engines, values = [], []
    for sizes in built.sizes:
        alts = alternatives(built.build_variant(sizes))
        engines += alts
        values += [[sizes[name] for name in names]] * len(alts)
    return CompiledEngine(native().pack_variant_set(built.model.symbols, built.model.bindings, values, engines),
                          weights)
