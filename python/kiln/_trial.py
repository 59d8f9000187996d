"""Trial compilation: the guard that keeps an export from aborting.

``KilnPartitioner.partition`` compiles every proposed partition right away,
through ExecuTorch's own partition -> submodule machinery run on a copy of
the tagged program, so each trial graph is exactly the one
``KilnBackend.preprocess`` will later be handed. When a partition fails for
any reason (a ``CompileError``, or any other exception from the graph builder
or the native compiler), the failing node is found (the error names it:
``node 'xyz': ...`` or ``(gemm 'xyz')``; otherwise the partition is bisected
over its topologically ordered prefixes), it is left to ExecuTorch's CPU
kernels with one printed line naming the op and the reason, and the
partitions are proposed again (a bounded number of rounds).

Engines that compiled are kept in ``ENGINE_CACHE`` keyed by a hash of the
graph as built (nodes, attributes, shapes, constant bytes) and the compile
options, and ``preprocess`` takes them from there instead of compiling again.

Partition time sees ExecuTorch's "fake" program (FakeTensor parameters). The
real tensors come from the program ``ops_to_not_decompose`` was given (the
same tensor objects, keyed by state-dict name); when one is not known the
trial compiles with zero bytes for it, which still finds failures, but its
engine is not cached (``preprocess`` compiles again).

Testing aid (private, changes no engine): ``INJECTED_FAILURES`` maps an op
name to "named" or "unnamed"; compiling a graph holding that op then raises a
CompileError that names the node, or does not (forcing the bisection); the
op "*" stands for every op. The
environment variable ``KILN_TEST_FAIL_OPS="aten.mean.dim,aten.addmm.default:unnamed"``
fills it at import.
"""

from __future__ import annotations

import dataclasses

import copy
import logging
import os
import re
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional

import torch
import torch.fx

from . import _fx_nodes
from ._native import CompileError, native

logger = logging.getLogger("kiln")

# ---- the engine cache --------------------------------------------------------


@dataclass
class CompiledEngine:
    """A partition's delegate blob and, when its weights are named
    (kiln.compile's weights prefix), the weights the compiler left out of it:
    ``[(key, tensor name, bytes)]``, each key once. preprocess hands them to
    ExecuTorch's named data as they are (no second parse of the engine)."""

    blob: bytes
    weights: list = field(default_factory=list)


class EngineCache:
    """Compiled engines by graph key; preprocess takes (and removes) them.
    Weights are kept once per key however many engines use them (a
    language model's methods share theirs). Bounded by total size (engines
    plus distinct weights), oldest dropped first, so a lowering that never
    reaches preprocess cannot hold memory forever (None: no bound, while
    kiln.compile lowers: it clears the cache when done)."""

    def __init__(self, max_bytes: Optional[int] = 4 << 30) -> None:
        self._entries: OrderedDict[str, CompiledEngine] = OrderedDict()
        self._weights: dict[str, list] = {}  # key -> [bytes, engines using it]
        self._bytes = 0
        self.max_bytes = max_bytes
        self.hits = 0
        self.misses = 0

    def put(self, key: str, engine: CompiledEngine) -> None:
        if key in self._entries:
            return
        shared = []
        for wkey, name, data in engine.weights:
            held = self._weights.get(wkey)
            if held is None:
                held = self._weights[wkey] = [data, 0]
                self._bytes += len(data)
            held[1] += 1
            shared.append((wkey, name, held[0]))  # one bytes object per key
        self._entries[key] = CompiledEngine(engine.blob, shared)
        self._bytes += len(engine.blob)
        while self.max_bytes is not None and self._bytes > self.max_bytes and len(self._entries) > 1:
            self._release(self._entries.popitem(last=False)[1])

    def get(self, key: str) -> Optional[CompiledEngine]:
        return self._entries.get(key)

    def take(self, key: str) -> Optional[CompiledEngine]:
        engine = self._entries.pop(key, None)
        if engine is None:
            self.misses += 1
            return None
        self._release(engine)
        self.hits += 1
        return engine

    def _release(self, engine: CompiledEngine) -> None:
        self._bytes -= len(engine.blob)
        for wkey, _name, _data in engine.weights:
            held = self._weights[wkey]
            held[1] -= 1
            if held[1] == 0:
                self._bytes -= len(held[0])
                del self._weights[wkey]

    @property
    def nbytes(self) -> int:
        return self._bytes

    def clear(self) -> None:
        self._entries.clear()
        self._weights.clear()
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._entries)


ENGINE_CACHE = EngineCache()


def options_key(options) -> str:
    """The compile options as they reach preprocess (compile specs)."""
    return ";".join(f"{s.key}={bytes(s.value).decode()}" for s in options.to_compile_specs())


# ---- injected failures (tests) -----------------------------------------------


def _parse_injection(text: str) -> dict[str, str]:
    out = {}
    for item in filter(None, (s.strip() for s in text.split(","))):
        op, _, mode = item.partition(":")
        out[op] = mode or "named"
    return out


INJECTED_FAILURES: dict[str, str] = _parse_injection(os.environ.get("KILN_TEST_FAIL_OPS", ""))


def check_injected(node_ops: Iterable[tuple[str, str]]) -> None:
    """Raises the injected CompileError if the graph (its (node name, op)
    pairs) holds an op named in INJECTED_FAILURES."""
    if not INJECTED_FAILURES:
        return
    for name, op in node_ops:
        mode = INJECTED_FAILURES.get(op, INJECTED_FAILURES.get("*"))
        if mode == "unnamed":
            raise CompileError(f"injected failure for {op} (KILN_TEST_FAIL_OPS)")
        if mode is not None:
            raise CompileError(f"node '{name}' ({op}): injected failure (KILN_TEST_FAIL_OPS)")


# ---- compiling one partition program ------------------------------------------


# A compile that takes this long gets a "compiled partition i/N in X s" line
# (when it is an announced one: not the bisection's prefixes).
SLOW_COMPILE_S = 3.0


def compile_graph(built, options, progress: Optional[Callable[[str], None]] = None, name_weights: str = "",
                  return_weights: bool = False):
    """Compiles a graph_builder.BuiltGraph with `options`; every compile of
    the front end goes through here. `name_weights`: a key prefix; the
    engine names its weights with it and does not store them. Returns the
    engine bytes, or with `return_weights` (bytes, [(key, tensor name,
    weight bytes)]): the weights it left out."""
    from ._logging import progress as lowering_progress

    from . import _timing

    check_injected(built.node_ops)
    start = time.perf_counter()
    try:
        engine = _native_compile(built, options, progress, name_weights, return_weights)
    finally:
        _timing.compiled(time.perf_counter() - start)
    if progress is not None:
        lowering_progress.compiled(time.perf_counter() - start, SLOW_COMPILE_S)
    return engine


def engine_compiler(options, progress: Optional[Callable[[str], None]] = None):
    """compile_graph with `options` as a _dynamic.compile_program `compile_one`."""
    return lambda graph, name_weights="", return_weights=False: compile_graph(
        graph, options, progress, name_weights, return_weights)


def fallback_compiler(options, progress: Optional[Callable[[str], None]] = None):
    """With persistent_decode, the usual engine's compiler: an engine whose
    decode layers became a persistent kernel keeps the usual engine beside it
    as its fallback (for a GPU or a stream where the kernel's grid does not
    fit); None otherwise."""
    if not options.persistent_decode:
        return None
    return engine_compiler(dataclasses.replace(options, persistent_decode=False, persistent_decode_options=()), progress)


def _native_compile(built, options, progress, name_weights="", return_weights=False):
    return native().compile(
        built.graph,
        target_sms=list(options.target_sms),
        cubin_sms=list(options.cubin_sms),
        emit_ptx=options.emit_ptx,
        enabled_precisions=list(options.enabled_precisions),
        use_cuda_graphs=options.use_cuda_graphs,
        progress=progress or (lambda _m: None),
        conv_gemm=options.conv_gemm,
        depthwise_kernels=options.depthwise_kernels,
        gemv_kernels=options.gemv_kernels,
        overlap_launches=options.overlap_launches,
        persistent_decode=options.persistent_decode,
        persistent_decode_options=dict(options.persistent_decode_options),
        debug_dir=_compile_debug_dir(options.debug_dir),
        name_weights=name_weights,
        return_weights=return_weights,
    )


def _compile_debug_dir(root: str) -> str:
    """A fresh subfolder of `root` per compile (partition_0, partition_1, ...;
    a partition the fallback re-proposes is compiled, and dumped, again)."""
    if not root:
        return ""
    index = 0
    while os.path.exists(os.path.join(root, f"partition_{index}")):
        index += 1
    return os.path.join(root, f"partition_{index}")


def first_line(error: BaseException, limit: int = 300) -> str:
    text = str(error).strip().splitlines()
    line = text[0] if text else type(error).__name__
    if not isinstance(error, CompileError):
        line = f"{type(error).__name__}: {line}"
    return line if len(line) <= limit else line[: limit - 3] + "..."


def named_nodes(message: str) -> list[str]:
    """Every quoted name in a compiler message, in order ("node 'xyz'",
    "(gemm 'linear')")."""
    return re.findall(r"'([^'\s]+)'", message)


# ---- partition programs built the way ExecuTorch builds them ------------------


def _copy_program(program):
    from torch.export import ExportedProgram

    gm = copy.deepcopy(program.graph_module)
    return ExportedProgram(
        root=gm,
        graph=gm.graph,
        graph_signature=copy.deepcopy(program.graph_signature),
        state_dict=dict(program.state_dict),
        range_constraints=copy.deepcopy(program.range_constraints),
        module_call_graph=copy.deepcopy(program.module_call_graph),
        constants=dict(program.constants),
        verifiers=[program.verifier],
    )


def partition_programs(program, partitions: list[list[str]]) -> list:
    """The ExportedProgram ExecuTorch would hand preprocess for each partition
    (lists of node names, in the order tags are given), made with its own
    machinery on a copy of `program`."""
    from executorch.exir.backend.backend_api import _create_partitions
    from executorch.exir.backend.partitioner import DelegationSpec, PartitionResult
    from executorch.exir.backend.utils import (_maybe_duplicate_constant_nodes, tag_constant_data,
                                               tag_mutated_buffer)

    work = _copy_program(program)
    by_name = {n.name: n for n in work.graph_module.graph.nodes}
    for node in by_name.values():
        node.meta.pop("delegation_tag", None)
    tags = {}
    for index, names in enumerate(partitions):
        tag = f"kiln_{index}"
        for name in names:
            by_name[name].meta["delegation_tag"] = tag
        tags[tag] = DelegationSpec("KilnTrial", [])
    tag_constant_data(work)
    tag_mutated_buffer(work)
    for tag in tags:
        _maybe_duplicate_constant_nodes(work, tag)
    created = _create_partitions(work.graph_module, PartitionResult(work, tags), work)
    calls = created.get("KilnTrial", [])
    programs = {}
    for call in calls:
        tag = str(call.target).removeprefix("fused_")
        programs[tag] = call.meta["submodule_program"]
    return [programs[f"kiln_{i}"] for i in range(len(partitions))]


class RealTensors:
    """Maps the partitioner's fake parameters back to real tensors, by state
    dict name (and by object identity for ExecuTorch's constant copies)."""

    def __init__(self, real_state_dict: dict | None, fake_program) -> None:
        self._real = dict(real_state_dict or {})
        self._by_id = {}
        if real_state_dict is not None:
            for key, value in fake_program.state_dict.items():
                real = self._real.get(key)
                if real is not None:
                    self._by_id[id(value)] = real

    def resolve(self, key: str, value: torch.Tensor) -> Optional[torch.Tensor]:
        from torch._subclasses.fake_tensor import FakeTensor

        if not isinstance(value, FakeTensor):
            return value
        real = self._real.get(key)
        if real is None:
            real = self._by_id.get(id(value))
        if real is None:
            # A scalar that to_edge lifted into a tensor constant (a softmax
            # scale such as Swin's 0.1768) is in no state dict; the fake tensor
            # keeps its real value. Without it the trial compiled zeros and
            # preprocess had to compile the partition again.
            constant = getattr(value, "constant", None)
            if isinstance(constant, torch.Tensor) and not isinstance(constant, FakeTensor):
                real = constant
        if real is None or tuple(real.shape) != tuple(value.shape) or real.dtype != value.dtype:
            return None
        return real
