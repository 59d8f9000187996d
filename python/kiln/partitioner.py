"""KilnPartitioner: hands the subgraphs Kiln's compiler supports to KilnBackend.

Support is decided by the C++ compiler (``check_support``), the one source of
truth, so the partitioner never promises a node the compiler will refuse.
Each proposed partition is then trial-compiled (``_partition_trial.py``, on
``_trial.py``'s compile and engine cache): a partition
that fails for any reason loses its failing node to ExecuTorch's CPU kernels
(one printed line names the op and the reason) and the partitions are proposed
again, so an export never aborts because of the engine compiler. The engines
that compiled are reused by ``KilnBackend.preprocess``.
"""

from __future__ import annotations

import functools
import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch
import torch.fx
from executorch.exir.backend.partitioner import (
    DelegationSpec,
    Partitioner,
    PartitionResult,
)
from executorch.exir.backend.utils import tag_constant_data, tag_mutated_buffer
from torch.export import ExportedProgram
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase

from . import _dynamic, _fx_nodes, _timing
from ._partition_trial import PartitionTrial, announce_fallback
from ._logging import announce, progress
from ._native import CompileError, native
from ._options import KilnOptions, validate_options
from .backend import KilnBackend  # noqa: F401 - registers the backend class

logger = logging.getLogger("kiln")

BACKEND_ID = "KilnBackend"
LINEAR = "aten.linear.default"
# Rounds of (propose partitions, trial-compile them, refuse the failing node).
MAX_TRIAL_ROUNDS = 64
# Failures of one op after which all its nodes stay on the CPU.
SYSTEMATIC_FAILURES = 8
# ops_to_not_decompose: decompose every aten.linear (see LinearLeftToCpu).
DECOMPOSE_ALL_LINEARS = "*"


class LinearLeftToCpu(CompileError):
    """An ``aten.linear`` kept whole for Kiln (``ops_to_not_decompose`` with
    min_block_size == 1) cannot be compiled, and ExecuTorch has no CPU kernel
    for it. ``kiln.compile`` catches this and lowers again with those linears
    decomposed (``KilnPartitioner(decompose_linear=...)``); `reasons` maps
    each linear's key (``linear_key``) to why it failed."""

    def __init__(self, reasons: dict[str, str]) -> None:
        self.reasons = dict(reasons)
        super().__init__(
            f"aten.linear.default cannot be compiled ({'; '.join(sorted(set(self.reasons.values())))}) and "
            f"ExecuTorch has no CPU kernel for it; lower again with "
            f"KilnPartitioner(decompose_linear={sorted(self.reasons)!r}) (kiln.compile does this itself)"
        )


def linear_key(node: torch.fx.Node) -> str:
    """Identifies an nn.Linear across the aten and edge programs: the name of
    its weight placeholder (stable through decomposition), else the node's."""
    weight = node.args[1] if len(node.args) > 1 else None
    if isinstance(weight, torch.fx.Node) and weight.op == "placeholder":
        return weight.name
    return node.name


@dataclass
class PartitionSummary:
    """What the partitioner decided for one program."""

    partitions: int = 0
    ops_taken: int = 0
    # op name -> count, for ops that stay on ExecuTorch's CPU kernels
    ops_on_cpu: dict[str, int] = field(default_factory=dict)

    @property
    def ops_left(self) -> int:
        return sum(self.ops_on_cpu.values())

    def _counts(self) -> str:
        return (
            f"{_plural(self.partitions, 'partition')}, "
            f"{_plural(self.ops_taken, 'op')} taken by {BACKEND_ID}, "
            f"{_plural(self.ops_left, 'op')} left to the CPU"
        )

    def _cpu_ops(self) -> str:
        return ", ".join(
            name if count == 1 else f"{name} (x{count})"
            for name, count in sorted(self.ops_on_cpu.items())
        )

    def line(self) -> str:
        """The plan, printed when partitioning is done."""
        text = f"kiln: {self._counts()}"
        return text + f": {self._cpu_ops()}" if self.ops_on_cpu else text

    def final_line(self, engine_bytes: list[int], named_weight_bytes: int = 0) -> str:
        """The one-line result, printed after the last engine is compiled:
        the delegate blobs' sizes, then the weights kept as named data."""
        cpu = f" ({self._cpu_ops()})" if self.ops_on_cpu else ""
        sizes = " + ".join(f"{n:,}" for n in engine_bytes)
        total = f" = {sum(engine_bytes):,}" if len(engine_bytes) > 1 else ""
        weights = f"; weights {named_weight_bytes:,} bytes as named data" if named_weight_bytes else ""
        return f"kiln: done: {self._counts()}{cpu}; engines {sizes}{total} bytes{weights}"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


@functools.lru_cache(maxsize=None)
def _first_output_only() -> dict[str, str]:
    """Multi-output ops of which the compiler computes only output 0, with the
    reason a node whose later outputs are used stays on the CPU (the op
    registry's OpDef::first_output_only)."""
    return dict(native().first_output_only())


def _uses_later_outputs(node: torch.fx.Node) -> bool:
    for user in node.users:
        if not _fx_nodes.is_getitem(user) or user.args[1] != 0:
            if not _fx_nodes.is_getitem(user) or user.users:
                return True
    return False


@functools.lru_cache(maxsize=None)
def _constant_view_ops() -> frozenset[str]:
    """Ops the compiler folds when their input is a constant (views, permutes)."""
    return frozenset(native().constant_view_ops())


def _is_constant(arg: torch.fx.Node, constant_names: set[str]) -> bool:
    """A constant placeholder, or a view or permute chain of one: the compiler
    folds the chain (Mamba's conv weight is unsqueeze(squeeze(weight)))."""
    while arg.op == "call_function" and _fx_nodes.op_name(arg.target) in _constant_view_ops():
        tensors = [a for a in arg.args if isinstance(a, torch.fx.Node)]
        if len(tensors) != 1:
            return False
        arg = tensors[0]
    return arg.op == "placeholder" and arg.name in constant_names


def query_support(
    node: torch.fx.Node, constant_names: set[str]
) -> Optional[str]:
    """None when Kiln takes `node`, else the reason it does not."""
    try:
        desc = _fx_nodes.describe_node(node)
    except _fx_nodes.UnsupportedNode as e:
        return str(e)
    first_only = _first_output_only()
    if desc.op in first_only and _uses_later_outputs(node):
        return first_only[desc.op]
    inputs = []
    for arg in desc.inputs:
        t = _fx_nodes.node_tensor_type(arg)
        inputs.append((t.dtype, t.shape, _is_constant(arg, constant_names)))
    outputs = [(t.dtype, t.shape) for t in desc.outputs]
    return native().check_support(desc.op, inputs, desc.attrs, outputs)


INDEX_PUT = "aten.index_put.default"


class KilnOperatorSupport(OperatorSupportBase):
    """Asks the compiler about each call_function node; remembers the refusals
    so the partitioner can report them."""

    def __init__(self, program: ExportedProgram) -> None:
        super().__init__()
        self._constants = _fx_nodes.constant_placeholder_names(program)
        sig = program.graph_signature
        mutated = set(sig.buffers_to_mutate.values())
        # Placeholders of buffers the program updates in place (KV caches).
        self._mutable = {name for name, target in sig.inputs_to_buffers.items() if target in mutated}
        self.refusals: dict[torch.fx.Node, str] = {}
        # nodes refused because their partition failed to compile (a subset
        # of refusals)
        self.compile_failures: dict[torch.fx.Node, str] = {}
        self._taken: set[torch.fx.Node] = set()
        self._size_constants: dict[torch.fx.Node, bool] = {}

    def refuse(self, node: torch.fx.Node, reason: str) -> None:
        """Leaves `node` to the CPU from now on (its partition failed)."""
        self._taken.discard(node)
        self.refusals[node] = reason
        self.compile_failures[node] = reason

    def _in_place_update(self, node: torch.fx.Node) -> Optional[str]:
        """Kiln takes index_put only as the in-place update of a mutable
        buffer that nothing else reads (the engine then owns the buffer)."""
        dst = node.args[0]
        if not (isinstance(dst, torch.fx.Node) and dst.op == "placeholder" and dst.name in self._mutable):
            return "index_put into a tensor that is not a mutable buffer of the program (Kiln updates caches in place only)"
        if len(dst.users) != 1:
            return f"the mutable buffer '{dst.name}' is also read before its update"
        return None

    def is_node_supported(self, submodules, node: torch.fx.Node) -> bool:
        if node.op != "call_function":
            return False
        if _fx_nodes.is_getitem(node):
            # Goes wherever its multi-output producer goes.
            producer = node.args[0]
            return isinstance(producer, torch.fx.Node) and self.is_node_supported(
                submodules, producer
            )
        if node in self._taken:
            return True
        if _fx_nodes.is_size_node(node):
            # aten.sym_size and SymInt arithmetic of a dynamic program: sizes
            # each shape variant knows as constants.
            return _fx_nodes.sizes_bound()
        if _fx_nodes.sizes_bound() and _dynamic.is_size_constant(
                node, lambda n: n.op == "placeholder" and n.name in self._constants, self._size_constants):
            self._taken.add(node)  # computed per variant at build (graph_builder)
            return True
        if node in self.refusals:
            return False
        reason = query_support(node, self._constants)
        if reason is None and _fx_nodes.op_name(node.target) == INDEX_PUT:
            reason = self._in_place_update(node)
        if reason is not None:
            self.refusals[node] = reason
            return False
        self._taken.add(node)
        return True


# Ops to_edge would otherwise decompose, kept as one node when the compiler
# takes it (KilnPartitioner.ops_to_not_decompose), as aten.linear is.
KEPT_WHEN_TAKEN = (
    torch.ops.aten.reflection_pad1d.default,
    torch.ops.aten.reflection_pad2d.default,
    torch.ops.aten.reflection_pad3d.default,
    torch.ops.aten.replication_pad1d.default,
    torch.ops.aten.replication_pad2d.default,
    torch.ops.aten.replication_pad3d.default,
)


class KilnPartitioner(Partitioner):
    """Tags the largest subgraphs Kiln supports for delegation to KilnBackend.

    Partitions with fewer than ``options.min_block_size`` operators stay on
    the CPU: a tiny delegate costs more in launches and copies than it saves.
    """

    def __init__(
        self,
        options: KilnOptions | None = None,
        *,
        decompose_linear: dict[str, str] | None = None,
        trial_compile: bool = True,
        **kwargs,
    ) -> None:
        """`decompose_linear`: linear keys (``linear_key``, or
        DECOMPOSE_ALL_LINEARS) -> reason; those linears are decomposed
        instead of kept whole, and their GEMM stays on the CPU.
        `trial_compile`: compile each partition while partitioning so a
        failing node falls back to the CPU (see the module docstring)."""
        if options is None:
            options = validate_options(**kwargs)
        elif kwargs:
            raise TypeError("KilnPartitioner: pass either options or keyword options, not both")
        self.options = options
        self.delegation_spec = DelegationSpec(BACKEND_ID, options.to_compile_specs())
        self.last_summary: PartitionSummary | None = None
        self.decompose_linear = dict(decompose_linear or {})
        self.trial_compile = trial_compile
        # ops_to_not_decompose's one-decomposition path (False: always give
        # ExecuTorch the check function; tests compare the two).
        self.single_decomposition = True
        # The real parameters, from the program ops_to_not_decompose sees
        # (partition() is handed a copy with fake ones).
        self._real_state_dict: dict | None = None
        super().__init__()

    def ops_to_not_decompose(
        self, ep: ExportedProgram
    ) -> tuple[list[torch._ops.OpOverload], Optional[Callable[[torch.fx.Node], bool]]]:
        # Keep nn.Linear as one op when Kiln takes it: the compiler maps it
        # straight onto a GEMM with the weight in its stored [n, k] layout.
        # ExecuTorch has no CPU kernel for aten.linear, so only when every
        # supported node is sure to be delegated (min_block_size == 1);
        # otherwise it decomposes into permute_copy + addmm as usual.
        # The same for reflection/replication pads (KEPT_WHEN_TAKEN): their
        # core-ATen decomposition is an index gather Kiln cannot take, and
        # to_edge refuses a kept op that ends up undelegated (a kept op whose
        # trial compile fails is decomposed on the next lowering, as a linear).
        # (lifted tensor constants too: a scale such as `/ math.sqrt(d)` may
        # become one, and the compiler reads its value)
        self._real_state_dict = {
            **{k: v for k, v in ep.constants.items() if isinstance(v, torch.Tensor)},
            **ep.state_dict,
        }
        if self.options.min_block_size != 1 or DECOMPOSE_ALL_LINEARS in self.decompose_linear:
            return [], None
        constants = _fx_nodes.constant_placeholder_names(ep)

        sizes = _dynamic.representative(ep)

        def keep(node: torch.fx.Node) -> bool:
            if linear_key(node) in self.decompose_linear:
                return False
            if sizes is None:
                return query_support(node, constants) is None
            with _fx_nodes.specialized(sizes):
                return query_support(node, constants) is None

        kept_ops = [torch.ops.aten.linear.default, *KEPT_WHEN_TAKEN]
        # With a check function ExecuTorch decomposes the program twice more
        # (tags the kept nodes that pass it, decomposes again, restores them):
        # each pass re-traces the whole graph, a third of a transformer's
        # export. When every kept-op node here passes the check (the usual
        # case; `ep` is functionalized, not yet decomposed), returning no
        # check function gives the same graph in one decomposition. A kept
        # op that a decomposition creates and Kiln then cannot take is still
        # caught: the partitioner raises LinearLeftToCpu and lower() retries
        # with decompose_linear set, which takes the checked path.
        if self.single_decomposition and not self.decompose_linear:
            targets = set(kept_ops)
            if all(keep(n) for n in ep.graph_module.graph.nodes
                   if n.op == "call_function" and n.target in targets):
                return kept_ops, None
        return kept_ops, keep

    def _propose(self, graph_module, support: KilnOperatorSupport, order) -> list:
        proposed = CapabilityBasedPartitioner(
            graph_module,
            support,
            allows_single_node_partition=True,
            # Merging unrelated nodes would make one delegate feed another
            # through the CPU (e.g. a weight transpose taken into an earlier
            # partition); keep partitions connected.
            skip_horizontal_fusion=True,
        ).propose_partitions()
        kept = [
            p for p in proposed if len(_fx_nodes.compute_nodes(p.nodes)) >= self.options.min_block_size
        ]
        # In graph order so tags (and delegate order) follow the program.
        kept.sort(key=lambda p: min(order[n] for n in p.nodes))
        return kept

    @staticmethod
    def _summarize(graph_module, kept) -> PartitionSummary:
        summary = PartitionSummary()
        taken = set()
        for partition in kept:
            summary.partitions += 1
            summary.ops_taken += len(_fx_nodes.compute_nodes(partition.nodes))
            taken.update(partition.nodes)
        summary.ops_on_cpu = dict(Counter(
            _fx_nodes.op_name(n.target) for n in _fx_nodes.compute_nodes(graph_module.graph.nodes) if n not in taken
        ))
        return summary

    def _prerefuse_decomposed_linears(self, graph_module, support: KilnOperatorSupport) -> None:
        """On a lowering with linears decomposed because they failed to
        compile: their weight transpose and GEMM stay on the CPU at once."""
        keys = {k for k in self.decompose_linear if k != DECOMPOSE_ALL_LINEARS}
        for node in graph_module.graph.nodes:
            if not (node.op == "call_function" and "permute" in _fx_nodes.op_name(node.target)):
                continue
            source = node.args[0] if node.args else None
            if not (isinstance(source, torch.fx.Node) and source.op == "placeholder" and source.name in keys):
                continue
            reason = f"{self.decompose_linear[source.name]} (as {LINEAR})"
            for user in node.users:
                if _fx_nodes.op_name(user.target) in ("aten.addmm.default", "aten.mm.default"):
                    support.refuse(user, reason)
                    announce_fallback(user, reason)
            support.refuse(node, reason)

    @staticmethod
    def _refuse_systematic_failures(graph_module, support, failed_ops: Counter, failures) -> None:
        """An op that failed SYSTEMATIC_FAILURES times is left to the CPU
        everywhere at once (one line), so a compiler that rejects, say, every
        conv of a model costs a few rounds, not one round per node."""
        last = {_fx_nodes.op_name(n.target): r for n, r in failures}
        for op, count in failed_ops.items():
            if count < SYSTEMATIC_FAILURES or op not in last:
                continue
            rest = [n for n in _fx_nodes.compute_nodes(graph_module.graph.nodes)
                    if _fx_nodes.op_name(n.target) == op and n not in support.refusals]
            if not rest:
                continue
            reason = f"{op} failed to compile {count} times (last: {last[op]})"
            for n in rest:
                support.refuse(n, reason)
            announce(f"kiln: {op} x{len(rest)} more left to the CPU: {reason}")

    def partition(self, exported_program: ExportedProgram) -> PartitionResult:
        # A dynamic program's nodes are asked about at their largest variant
        # (each variant is compiled by the trial and at preprocess).
        sizes = _dynamic.representative(exported_program)
        if sizes is None:
            return self._partition(exported_program)
        with _fx_nodes.specialized(sizes):
            return self._partition(exported_program)

    def _partition(self, exported_program: ExportedProgram) -> PartitionResult:
        edge_s = _timing.partition_started()
        if edge_s is not None and edge_s >= _timing.SLOW_PHASE_S:
            announce(f"kiln: edge program (ATen decomposition, constant folding) in {edge_s:.1f} s")
        graph_module = exported_program.graph_module
        support = KilnOperatorSupport(exported_program)
        if self.decompose_linear:
            self._prerefuse_decomposed_linears(graph_module, support)
        order = {node: i for i, node in enumerate(graph_module.graph.nodes)}
        kept = self._propose(graph_module, support, order)
        summary = self._summarize(graph_module, kept)
        announce(summary.line())
        if self.trial_compile:
            trial = PartitionTrial(self.options, self._real_state_dict, exported_program, order)
            failed_ops: Counter = Counter()
            for round_index in range(MAX_TRIAL_ROUNDS):
                failures, good = trial.run(kept)
                if not failures:
                    break
                for node, reason in failures:
                    support.refuse(node, reason)
                    announce_fallback(node, reason)
                    failed_ops[_fx_nodes.op_name(node.target)] += 1
                self._refuse_systematic_failures(graph_module, support, failed_ops, failures)
                if any(_fx_nodes.op_name(n.target) == LINEAR for n, _ in failures):
                    break  # lowered again with it decomposed (below): no use compiling the rest now
                if round_index == MAX_TRIAL_ROUNDS - 1:
                    kept = good  # give up on the partitions still failing
                    break
                kept = self._propose(graph_module, support, order)
        self._real_state_dict = None

        kept_whole = {LINEAR} | {_fx_nodes.op_name(op) for op in KEPT_WHEN_TAKEN}
        on_cpu_linears = {
            linear_key(n): support.refusals.get(n, "left to the CPU")
            for n in _fx_nodes.compute_nodes(graph_module.graph.nodes)
            if _fx_nodes.op_name(n.target) in kept_whole
            and (n in support.refusals or not any(n in p.nodes for p in kept))
        }
        if on_cpu_linears:
            raise LinearLeftToCpu(on_cpu_linears)
        revised = self._summarize(graph_module, kept)
        if revised.line() != summary.line():
            announce(revised.line())
        summary = revised

        partition_tags: dict[str, DelegationSpec] = {}
        for index, partition in enumerate(kept):
            tag = f"kiln_{index}"
            for node in partition.nodes:
                node.meta["delegation_tag"] = tag
            partition_tags[tag] = self.delegation_spec
        tag_constant_data(exported_program)
        # A buffer whose in-place update Kiln took moves into that engine.
        tag_mutated_buffer(exported_program)

        self._log_refusals(support, Counter(summary.ops_on_cpu))
        self.last_summary = summary
        progress.start(summary)
        return PartitionResult(
            tagged_exported_program=exported_program, partition_tags=partition_tags
        )

    def _log_refusals(self, support: KilnOperatorSupport, cpu_ops: Counter) -> None:
        """One line per op left to the CPU with the reason Kiln did not take
        it (the first node's; ops that failed to compile were announced as
        they fell back)."""
        reasons: dict[str, str] = {}
        for node, reason in support.refusals.items():
            if node not in support.compile_failures:
                reasons.setdefault(_fx_nodes.op_name(node.target), f"'{node.name}': {reason}")
        announced = {_fx_nodes.op_name(node.target) for node in support.compile_failures}
        for name, count in sorted(cpu_ops.items()):
            if name in announced and name not in reasons:
                continue
            why = reasons.get(name, f"in a partition smaller than min_block_size={self.options.min_block_size}")
            announce(f"kiln: {name} x{count} on the CPU: {why}")
