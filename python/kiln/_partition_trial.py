"""Trial compiles for KilnPartitioner: each proposed partition is compiled
before ExecuTorch is told about it (``_trial.py`` holds the compile and its
engine cache); a partition that fails gives up the node to blame, found from
the error message or by bisecting the partition, and the partitioner proposes
again without it (partitioner.py).
"""

from __future__ import annotations

import logging
import re
from typing import Optional

import torch
import torch.fx
from torch.export import ExportedProgram

from . import _dynamic, _fx_nodes, _trial
from ._logging import announce, progress
from .backend import _progress, engine_key
from . import graph_builder
from .graph_builder import build

logger = logging.getLogger("kiln")

# Ops that run as a GEMM step; a failing GEMM step that names its input or
# output tensor is blamed on the GEMM node, not on the tensor's producer.
_GEMM_OPS = {"aten.linear.default", "aten.addmm.default", "aten.mm.default", "aten.bmm.default",
             "aten.convolution.default"}


def announce_fallback(node: torch.fx.Node, reason: str) -> None:
    """The one line printed for a node left to the CPU because it failed to
    compile."""
    announce(f"kiln: {_fx_nodes.op_name(node.target)} ('{node.name}') left to the CPU: {reason}")


class PartitionTrial:
    """Trial-compiles the partitions KilnPartitioner proposes for `program`
    (`order`: node -> position), with the export's options and real weights."""

    def __init__(self, options, real_state_dict, program: ExportedProgram, order) -> None:
        self.options = options
        self.program = program
        self.order = order
        self.real = _trial.RealTensors(real_state_dict, program)
        self.enabled = True

    def _names(self, nodes) -> list[str]:
        return [n.name for n in sorted(nodes, key=self.order.__getitem__)]

    def _compile(self, program, announce_as: Optional[tuple[int, int, int]]) -> Optional[BaseException]:
        """None when `program` compiles (its engine cached when its constants
        are the real ones), else the exception."""
        try:
            prefix = self.options.weights_prefix or graph_builder.DEFAULT_STATE_PREFIX
            built = _dynamic.build_program(program, lambda: build(program, self.real.resolve, prefix),
                                           self.options.shape_buckets)
            key = engine_key(built.key, self.options)
            if _trial.ENGINE_CACHE.get(key) is not None:
                return None
            if announce_as is not None:
                progress.trial(*announce_as)
            announce = _progress if announce_as else None
            engine = _dynamic.compile_program(built, _trial.engine_compiler(self.options, announce),
                                              self.options.weights_prefix,
                                              _trial.fallback_compiler(self.options, announce))
            if built.exact:
                _trial.ENGINE_CACHE.put(key, engine)
            return None
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as e:  # anything from the builder or the native compiler
            return e

    def run(self, kept) -> tuple[list[tuple[torch.fx.Node, str]], list]:
        """Compiles each partition of `kept`; returns ([(failing node,
        reason)], the partitions that compiled)."""
        if not self.enabled or not kept:
            return [], kept
        try:
            programs = _trial.partition_programs(self.program, [self._names(p.nodes) for p in kept])
        except Exception as e:  # ExecuTorch internals changed: compile at preprocess as before
            logger.warning("kiln: cannot trial-compile partitions (%s: %s); compiling them at preprocess",
                           type(e).__name__, e)
            self.enabled = False
            return [], kept
        failures, good = [], []
        for index, (partition, program) in enumerate(zip(kept, programs)):
            nodes = len(_fx_nodes.compute_nodes(partition.nodes))
            error = self._compile(program, (index + 1, len(kept), nodes))
            if error is None:
                good.append(partition)
                continue
            reason = _trial.first_line(error)
            logger.debug("kiln: partition %d/%d failed to compile: %s", index + 1, len(kept), error)
            failures.append((self._culprit(partition, error), reason))
        return failures, good

    def _gemm_consumer(self, node: torch.fx.Node, members: set, hops: int = 4) -> Optional[torch.fx.Node]:
        """The first GEMM-family node in the partition reached from `node`
        through at most `hops` users (views and layout ops in between)."""
        frontier, seen = [node], {node}
        for _ in range(hops):
            nxt = []
            for n in frontier:
                for u in sorted(n.users, key=self.order.__getitem__):
                    if u in members and u not in seen:
                        if _fx_nodes.op_name(u.target) in _GEMM_OPS:
                            return u
                        seen.add(u)
                        nxt.append(u)
            frontier = nxt
        return None

    def _culprit(self, partition, error: BaseException) -> torch.fx.Node:
        """The node the error names, else the first node whose addition makes
        a topologically ordered prefix of the partition fail (bisection)."""
        by_name = {n.name: n for n in partition.nodes}
        message = str(error)
        gemm_step = re.search(r"\(gemm '", message) is not None
        for name in _trial.named_nodes(message):
            node = by_name.get(name)
            if node is None:
                continue
            node = node.args[0] if _fx_nodes.is_getitem(node) else node
            if gemm_step and re.search(rf"tensor \d+ '{re.escape(name)}'", message) and \
                    _fx_nodes.op_name(node.target) not in _GEMM_OPS:
                # "(gemm 'label'): gemm a tensor 7 'x' ...": x is the GEMM's
                # operand; the GEMM consuming it is what failed.
                gemm = self._gemm_consumer(node, set(partition.nodes))
                if gemm is not None:
                    return gemm
            return node
        compute = sorted(_fx_nodes.compute_nodes(partition.nodes), key=self.order.__getitem__)
        getitems = [n for n in partition.nodes if _fx_nodes.is_getitem(n)]

        def fails(k: int) -> bool:
            prefix = set(compute[:k])
            prefix.update(g for g in getitems if g.args[0] in prefix)
            try:
                (program,) = _trial.partition_programs(self.program, [self._names(prefix)])
            except Exception:
                return True
            return self._compile(program, None) is not None

        lo, hi = 1, len(compute)  # prefix hi fails
        while lo < hi:
            mid = (lo + hi) // 2
            if fails(mid):
                hi = mid
            else:
                lo = mid + 1
        return compute[lo - 1]
