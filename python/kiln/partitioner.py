"""KilnPartitioner: hands the subgraphs Kiln's compiler supports to KilnBackend.

Support is decided by the C++ compiler (``check_support``), the one source of
truth, so the partitioner never promises a node the compiler will refuse.
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
from executorch.exir.backend.utils import tag_constant_data
from torch.export import ExportedProgram
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase

from . import _fx_nodes
from ._logging import announce, progress
from ._native import native
from ._options import KilnOptions, validate_options
from .backend import KilnBackend  # noqa: F401 - registers the backend class

logger = logging.getLogger("kiln")

BACKEND_ID = "KilnBackend"


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

    def final_line(self, engine_bytes: list[int]) -> str:
        """The one-line result, printed after the last engine is compiled."""
        cpu = f" ({self._cpu_ops()})" if self.ops_on_cpu else ""
        sizes = " + ".join(f"{n:,}" for n in engine_bytes)
        total = f" = {sum(engine_bytes):,}" if len(engine_bytes) > 1 else ""
        return f"kiln: done: {self._counts()}{cpu}; engines {sizes}{total} bytes"


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
        is_constant = arg.op == "placeholder" and arg.name in constant_names
        inputs.append((t.dtype, t.shape, is_constant))
    outputs = [(t.dtype, t.shape) for t in desc.outputs]
    return native().check_support(desc.op, inputs, desc.attrs, outputs)


class KilnOperatorSupport(OperatorSupportBase):
    """Asks the compiler about each call_function node; remembers the refusals
    so the partitioner can report them."""

    def __init__(self, program: ExportedProgram) -> None:
        super().__init__()
        self._constants = _fx_nodes.constant_placeholder_names(program)
        self.refusals: dict[torch.fx.Node, str] = {}
        self._taken: set[torch.fx.Node] = set()

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
        if node in self.refusals:
            return False
        reason = query_support(node, self._constants)
        if reason is not None:
            self.refusals[node] = reason
            return False
        self._taken.add(node)
        return True


def _compute_nodes(nodes) -> list[torch.fx.Node]:
    return [n for n in nodes if n.op == "call_function" and not _fx_nodes.is_getitem(n)]


class KilnPartitioner(Partitioner):
    """Tags the largest subgraphs Kiln supports for delegation to KilnBackend.

    Partitions with fewer than ``options.min_block_size`` operators stay on
    the CPU: a tiny delegate costs more in launches and copies than it saves.
    """

    def __init__(self, options: KilnOptions | None = None, **kwargs) -> None:
        if options is None:
            options = validate_options(**kwargs)
        elif kwargs:
            raise TypeError("KilnPartitioner: pass either options or keyword options, not both")
        self.options = options
        self.delegation_spec = DelegationSpec(BACKEND_ID, options.to_compile_specs())
        self.last_summary: PartitionSummary | None = None
        super().__init__()

    def ops_to_not_decompose(
        self, ep: ExportedProgram
    ) -> tuple[list[torch._ops.OpOverload], Optional[Callable[[torch.fx.Node], bool]]]:
        # Keep nn.Linear as one op when Kiln takes it: the compiler maps it
        # straight onto a GEMM with the weight in its stored [n, k] layout.
        # ExecuTorch has no CPU kernel for aten.linear, so only when every
        # supported node is sure to be delegated (min_block_size == 1);
        # otherwise it decomposes into permute_copy + addmm as usual.
        if self.options.min_block_size != 1:
            return [], None
        constants = _fx_nodes.constant_placeholder_names(ep)

        def keep(node: torch.fx.Node) -> bool:
            return query_support(node, constants) is None

        return [torch.ops.aten.linear.default], keep

    def partition(self, exported_program: ExportedProgram) -> PartitionResult:
        graph_module = exported_program.graph_module
        support = KilnOperatorSupport(exported_program)
        proposed = CapabilityBasedPartitioner(
            graph_module,
            support,
            allows_single_node_partition=True,
            # Merging unrelated nodes would make one delegate feed another
            # through the CPU (e.g. a weight transpose taken into an earlier
            # partition); keep partitions connected.
            skip_horizontal_fusion=True,
        ).propose_partitions()

        partition_tags: dict[str, DelegationSpec] = {}
        summary = PartitionSummary()
        kept = [
            p for p in proposed if len(_compute_nodes(p.nodes)) >= self.options.min_block_size
        ]
        # Tag in graph order so tags (and delegate order) follow the program.
        order = {node: i for i, node in enumerate(graph_module.graph.nodes)}
        kept.sort(key=lambda p: min(order[n] for n in p.nodes))
        for index, partition in enumerate(kept):
            tag = f"kiln_{index}"
            for node in partition.nodes:
                node.meta["delegation_tag"] = tag
            partition_tags[tag] = self.delegation_spec
            summary.partitions += 1
            summary.ops_taken += len(_compute_nodes(partition.nodes))
        tag_constant_data(exported_program)

        cpu_ops = Counter()
        for node in _compute_nodes(graph_module.graph.nodes):
            if "delegation_tag" not in node.meta:
                cpu_ops[_fx_nodes.op_name(node.target)] += 1
        summary.ops_on_cpu = dict(cpu_ops)
        if cpu_ops.get("aten.linear.default"):
            logger.warning(
                "kiln: aten.linear.default was kept whole for Kiln but left to the CPU, "
                "which has no kernel for it; the program will fail to load"
            )
        self._log_refusals(support, cpu_ops)
        self.last_summary = summary
        announce(summary.line())
        progress.start(summary)
        return PartitionResult(
            tagged_exported_program=exported_program, partition_tags=partition_tags
        )

    def _log_refusals(self, support: KilnOperatorSupport, cpu_ops: Counter) -> None:
        if not logger.isEnabledFor(logging.DEBUG):
            return
        reasons: dict[str, str] = {}
        for node, reason in support.refusals.items():
            reasons.setdefault(_fx_nodes.op_name(node.target), reason)
        for name, count in sorted(cpu_ops.items()):
            why = reasons.get(name, f"in a partition smaller than min_block_size={self.options.min_block_size}")
            logger.debug("kiln: %s x%d on the CPU: %s", name, count, why)
