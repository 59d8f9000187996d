"""kiln.compile / kiln.save and the CompiledProgram they pass between them."""

from __future__ import annotations

import copy
import logging
import os
import re
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch
from executorch.exir import (
    EdgeCompileConfig,
    EdgeProgramManager,
    ExecutorchBackendConfig,
)
from torch.export import ExportedProgram

from . import _constant_fold, _delegate_meta, _edge, _timing, _trial, _weights
from ._logging import announce, progress
from ._options import KilnOptions, validate_options
from .partitioner import DECOMPOSE_ALL_LINEARS, KilnPartitioner, LinearLeftToCpu, PartitionSummary

logger = logging.getLogger("kiln")

OUTPUT_FORMATS = ("executorch",)

# True: ExecuTorch's own to_edge_transform_and_lower instead of _edge.lower's
# fewer re-traces (the same program; tests compare the two).
STOCK_EDGE = False


def check_exported_program(exported_program: Any, func: str) -> ExportedProgram:
    if not isinstance(exported_program, ExportedProgram):
        raise TypeError(
            f"{func}: expected a torch.export.ExportedProgram, got "
            f"{type(exported_program).__module__}.{type(exported_program).__qualname__}; "
            "call torch.export.export(model, example_inputs) first"
        )
    return exported_program


# ExecuTorch looks methods up by name from C++ and Python; keep them identifiers.
METHOD_NAME_PATTERN = r"[A-Za-z_][A-Za-z0-9_]{0,63}"

Programs = dict  # method name -> ExportedProgram


def check_programs(programs: Any, func: str) -> tuple[dict[str, ExportedProgram], bool]:
    """One ExportedProgram (method "forward") or a dict of method name ->
    ExportedProgram. Returns (dict, whether a dict was given); raises naming
    the first problem."""
    if not isinstance(programs, dict):
        return {"forward": check_exported_program(programs, func)}, False
    if not programs:
        raise ValueError(f"{func}: the dict of methods is empty; give at least one "
                         "name -> torch.export.ExportedProgram")
    for name, program in programs.items():
        if not isinstance(name, str):
            raise TypeError(f"{func}: method names must be str, got {type(name).__name__} {name!r}")
        if not re.fullmatch(METHOD_NAME_PATTERN, name):
            raise ValueError(f"{func}: method name {name!r} is not valid; use a Python identifier "
                             "of at most 64 characters (letters, digits, _; not starting with a digit)")
        if not isinstance(program, ExportedProgram):
            raise TypeError(
                f"{func}: method {name!r}: expected a torch.export.ExportedProgram, got "
                f"{type(program).__module__}.{type(program).__qualname__}; "
                "call torch.export.export(model, example_inputs) first"
            )
    return dict(programs), True


def check_not_per_method(func: str, **options: Any) -> None:
    """Options apply to every method; a dict given for one is refused."""
    for name, value in options.items():
        if isinstance(value, dict):
            raise TypeError(f"{func}: {name} applies to every method; per-method options are not "
                            f"supported (give one value, not a dict)")


_CONSTANT_TYPES = (bool, int, float, str)


def check_constant_methods(func: str, constant_methods: Any, programs: dict) -> dict[str, Any]:
    """{} for None; else checks names (not a program's method) and values."""
    if constant_methods is None:
        return {}
    if not isinstance(constant_methods, dict):
        raise TypeError(f"{func}: constant_methods must be a dict method name -> value, got "
                        f"{type(constant_methods).__name__}")
    for name, value in constant_methods.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"{func}: constant method name {name!r} must be an identifier")
        if name in programs:
            raise ValueError(f"{func}: constant method {name!r} has the name of a program's method")
        items = value if isinstance(value, (list, tuple)) else [value]
        if not items or any(not isinstance(v, _CONSTANT_TYPES) for v in items):
            raise TypeError(f"{func}: constant method {name!r}: value {value!r} is not an int, float, bool or "
                            "str, or a non-empty list of those")
    return dict(constant_methods)


def check_arg_inputs(program: ExportedProgram, arg_inputs: Any) -> None:
    """Checks `arg_inputs` against the program's user inputs (count, dtype,
    shape); raises naming the first one that differs."""
    if not isinstance(arg_inputs, (list, tuple)):
        raise TypeError(
            f"arg_inputs: expected a tuple or list of tensors, got {type(arg_inputs).__name__}"
        )
    names = program.graph_signature.user_inputs
    placeholders = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    if len(arg_inputs) != len(names):
        raise ValueError(
            f"arg_inputs: the exported program takes {len(names)} input(s) "
            f"({', '.join(map(str, names))}), got {len(arg_inputs)}"
        )
    for i, (name, given) in enumerate(zip(names, arg_inputs)):
        expected = placeholders[name].meta.get("val") if name in placeholders else None
        if not isinstance(expected, torch.Tensor):
            continue  # a non-tensor input: nothing to compare
        if not isinstance(given, torch.Tensor):
            raise TypeError(
                f"arg_inputs[{i}] ('{name}'): expected a torch.Tensor, got {type(given).__name__}"
            )
        if given.dtype != expected.dtype:
            raise ValueError(
                f"arg_inputs[{i}] ('{name}'): dtype {given.dtype} does not match the "
                f"exported program's {expected.dtype}"
            )
        if tuple(given.shape) != tuple(expected.shape):
            raise ValueError(
                f"arg_inputs[{i}] ('{name}'): shape {list(given.shape)} does not match the "
                f"exported program's {list(expected.shape)}"
            )


def edge_compile_config() -> EdgeCompileConfig:
    return EdgeCompileConfig(
        # Kept ops (aten.linear) are not core ATen; the edge verifier would
        # reject them although the backend consumes them.
        _check_ir_validity=False,
        # Keep aten._to_copy / aten.clone (the names the compiler knows)
        # rather than ExecuTorch's dim_order_ops variants; Kiln tensors are
        # always contiguous, so dim order carries nothing for it.
        _skip_dim_order=True,
    )


def lower(exported_program: ExportedProgram | dict[str, ExportedProgram],
          options: KilnOptions, constant_methods: dict[str, Any] | None = None,
          ) -> tuple[EdgeProgramManager, dict[str, PartitionSummary]]:
    """Edge conversion + partitioning (with trial compiles) + preprocess.

    An ``aten.linear`` kept whole for Kiln that then fails to compile has no
    CPU kernel to fall back on; the partitioner says so (LinearLeftToCpu) and
    the program is lowered again with those linears decomposed (their GEMM
    on the CPU), and, should one still be left, with every linear decomposed.
    Engines compiled by the first attempt's trials are reused when unchanged.

    A dict of programs is lowered in one call (one EdgeProgramManager, one
    named data store: weights the methods share are stored once), each
    method with its own partitioner; returns the summary per method.
    """
    programs = exported_program if isinstance(exported_program, dict) else {"forward": exported_program}
    decompose: dict[str, str] = {}
    # Every engine the trials compile is taken by its preprocess or cleared
    # below, so the cache needs no bound here: with one, a model whose
    # weights exceed it would compile its first partitions twice.
    bound, _trial.ENGINE_CACHE.max_bytes = _trial.ENGINE_CACHE.max_bytes, None
    try:
        for attempt in range(3):
            progress.reset()
            partitioners = {name: KilnPartitioner(options, decompose_linear=decompose) for name in programs}
            try:
                with _timing.lowering():
                    manager = _edge.lower(
                        programs if isinstance(exported_program, dict) else exported_program,
                        partitioner={name: [p] for name, p in partitioners.items()}
                        if isinstance(exported_program, dict) else [partitioners["forward"]],
                        compile_config=edge_compile_config(),
                        # export-time constant folding of the edge program (_constant_fold.py)
                        transform_passes=_constant_fold.transform_passes(),
                        constant_methods=constant_methods or None,
                        stock=STOCK_EDGE,
                    )
            except LinearLeftToCpu as e:
                if attempt == 2:
                    raise
                if attempt == 0:
                    decompose.update(e.reasons)
                else:
                    decompose[DECOMPOSE_ALL_LINEARS] = "; ".join(sorted(set(e.reasons.values())))
                announce(f"kiln: lowering again with {len(e.reasons)} aten.linear.default decomposed "
                         f"({'every linear' if attempt else ', '.join(sorted(e.reasons))}): "
                         "ExecuTorch has no CPU kernel for aten.linear")
                continue
            return manager, {name: p.last_summary or PartitionSummary() for name, p in partitioners.items()}
    finally:
        _trial.ENGINE_CACHE.clear()  # engines preprocess did not take
        _trial.ENGINE_CACHE.max_bytes = bound
    raise AssertionError("unreachable")


def delegate_ids(manager: EdgeProgramManager, method: str = "forward") -> list[str]:
    """Backend ids of the lowered calls of `method`, in graph order."""
    graph_module = manager.exported_program(method).graph_module
    ids = []
    for node in graph_module.graph.nodes:
        if node.op == "call_function" and getattr(node.target, "__name__", "") == "executorch_call_delegate":
            lowered = getattr(graph_module, node.args[0].target)
            ids.append(lowered.backend_id)
    return ids


def merge_summaries(summaries: dict[str, PartitionSummary]) -> PartitionSummary:
    total = PartitionSummary()
    for s in summaries.values():
        total.partitions += s.partitions
        total.ops_taken += s.ops_taken
        for op, n in s.ops_on_cpu.items():
            total.ops_on_cpu[op] = total.ops_on_cpu.get(op, 0) + n
    return total


@dataclass
class CompiledProgram:
    """A program lowered for Kiln: the edge program manager (with its Kiln
    delegates already compiled), the options used and the partition summary
    (over every method; per method in `summaries`).

    One ExportedProgram gives one method, "forward"; a dict gives one method
    per key, all in one EdgeProgramManager (and so one .pte)."""

    edge_program_manager: EdgeProgramManager
    options: KilnOptions
    summary: PartitionSummary
    # kept so save() can re-lower: the ExportedProgram, or the dict given
    exported_program: ExportedProgram | dict[str, ExportedProgram]
    summaries: dict[str, PartitionSummary] = field(default_factory=dict)
    model_id: str = ""
    constant_methods: dict[str, Any] = field(default_factory=dict)
    # Seconds of kiln.compile's phases (kiln.save adds its own and prints them).
    phases: _timing.ExportPhases = field(default_factory=_timing.ExportPhases)
    # kiln.compile's phases plus the last kiln.save's (None before a save).
    saved_phases: _timing.ExportPhases | None = None

    @property
    def methods(self) -> list[str]:
        return sorted(self.edge_program_manager.methods)

    @property
    def delegates(self) -> list[str] | dict[str, list[str]]:
        """Backend ids in graph order: a list for a single program, a dict
        method -> list when kiln.compile was given a dict."""
        if isinstance(self.exported_program, dict):
            return {m: delegate_ids(self.edge_program_manager, m) for m in self.methods}
        return delegate_ids(self.edge_program_manager)

    def __repr__(self) -> str:
        methods = f" methods {self.methods}" if isinstance(self.exported_program, dict) else ""
        return f"<kiln.CompiledProgram{methods} {self.summary.line().removeprefix('kiln: ')}>"


def compile(  # noqa: A001 - mirrors torch_tensorrt.compile
    exported_program: ExportedProgram,
    arg_inputs: Sequence[torch.Tensor] | None = None,
    enabled_precisions: Any = frozenset({torch.float32}),
    min_block_size: int = 1,
    target_sms: Sequence[int] | None = None,
    use_cuda_graphs: bool | None = None,
    conv_gemm: str = "all",
    depthwise_kernels: bool = True,
    gemv_kernels: bool = True,
    debug_dir: str | os.PathLike | None = None,
    model_id: str | None = None,
    constant_methods: dict[str, Any] | None = None,
    overlap_launches: bool = True,
    shape_buckets: Sequence[int] | None = None,
    persistent_decode: bool = False,
    persistent_decode_options: Mapping[str, int] | None = None,
) -> CompiledProgram:
    """Partitions `exported_program` and compiles the supported subgraphs into
    Kiln engines (no GPU needed); the rest stays on ExecuTorch CPU kernels.

    Args:
      exported_program: from ``torch.export.export``, or a
        dict method name -> ExportedProgram (e.g. {"prefill": ..., "decode":
        ...}): all methods go into one program, and weights they share are
        stored once and loaded once on the GPU. Options apply to every method.
      arg_inputs: optional example inputs, checked against the program (for a
        dict of programs: a dict method name -> inputs, for some or all).
      enabled_precisions: dtypes engines may compute in, a subset of
        {torch.float32, torch.float16, torch.bfloat16}.
      min_block_size: partitions with fewer ops stay on the CPU.
      target_sms: GPU architectures the engines run on without a JIT (75 or
        newer). None (default): every SM from 80 to 120 that CUDA 13 builds
        for (DEFAULT_TARGET_SMS), covered by one cubin per major (sm_80,
        sm_90, sm_100, sm_110, sm_120: an sm_80 cubin runs on sm_86/87/89).
        A list: a cubin for each SM named, exactly. PTX for the oldest is
        added so a GPU with no cubin here can JIT it.
      use_cuda_graphs: baked into the engines; None leaves it to the runtime.
      conv_gemm: 1x1 convolutions as cuBLASLt GEMMs: "all" (strided ones
        through a gather kernel, and so are convolutions whose kernel equals
        their stride, e.g. ViT's patch embedding), "unstrided" or "none" (all
        on cuDNN).
      depthwise_kernels: depthwise convolutions as generated kernels with the
        activation after them fused in (False: cuDNN).
      gemv_kernels: products of at most 4 activation rows with a weight
        (a decode step's linears) as generated matrix-vector kernels (False:
        cuBLASLt for every product).
      overlap_launches: on sm_90 and newer GPUs, launch each generated kernel
        while the previous one still runs; it waits for its predecessor on
        the GPU (programmatic dependent launch), which hides the few
        microseconds of launch latency per kernel that dominate a decode
        step. A kernel may then start on what does not depend on its
        predecessor before it waits: a matrix-vector product loads its first
        weights, a decode attention prefetches its KV-cache rows into L2.
        False: classic launches (and kernels without the wait).
      persistent_decode: a Llama-style language model's decode layers (batch
        1, one new token, bf16 or fp16, hidden size 1024, head_dim 64, two
        query heads a kv head) become ONE persistent kernel instead of six
        kernels a layer: clusters of 8 blocks do the attention half, every
        block the MLP half, with two grid-wide dependencies a layer; the
        layers' weights are repacked into a second copy at load. Needs every
        target SM to be sm_90 or newer, and a GPU where the kernel's grid is
        co-resident (the load says so otherwise). What it cannot fold keeps
        the usual plan, with the reason in the progress log. Default False
        (docs/design_llm.md).
      persistent_decode_options: with persistent_decode=True, the kernel's
        tuning options by name (ints; the rest keep their measured
        defaults): a_tasks (the MLP tasks of a block with attention work,
        even, 2-16), counted_rows (0: arrival counters after each phase;
        1: the rows count their own contributions, no arrivals; 2: as 1,
        one thread polling first), kv_rows (the attention's cached rows a
        stage: 64, 128, or 0 by position), l2_prefetch (stages prefetched
        into L2 ahead of the ring's copies, 0-64; 0 none), max_inflight /
        release_inflight / head_inflight / b_inflight (the weight
        stream's copies in flight a block: throughout / before the
        previous phase's arrival / for the lm_head / of a block without
        attention work, 0 for max_inflight's), stages (the shared-memory
        ring's 16 KB stages, 4-13), warp_rotary (1: each warp computes a
        q|k|v column and its rotary partner and pushes them, no block
        barrier before the rotary),
        warp_norm (1: each warp normalizes its share of a phase's row
        itself, one block barrier a phase instead of three).
        Unknown names and values out of range are errors; the engine's
        metadata records the values used (kiln inspect).
      debug_dir: when given, the IR after every compiler pass is written to
        <debug_dir>/partition_<i>/<NN>_<pass>.txt (see docs/user_guide.md).
      model_id: names this model in its weights' keys in the program's named
        data ("kiln/<model_id>/<content hash>-<size>"); 1-64 characters of
        A-Z a-z 0-9 . _ -. Default: a hash of the model's weights.
      constant_methods: extra methods that take no input and return a
        constant (ExecuTorch's constant methods), e.g. {"get_max_seq_len":
        512} for a generation loop to read from the .pte; values are int,
        float, bool or str, or a list of those.
      shape_buckets: for a program exported with dynamic shapes (torch.export
        Dims, each with a max): the sizes each dynamic dim is compiled for,
        one engine variant per size inside the dim's range; the delegate runs
        the variant whose sizes equal the inputs' and refuses other sizes
        with InvalidArgument naming the input, the dim and the compiled
        sizes. None: the range's min and max and the powers of two between
        (1..512: 1, 2, 4, ..., 512, ten variants). See docs/user_guide.md.
    """
    return compile_as("kiln.compile", exported_program, arg_inputs, enabled_precisions, min_block_size,
                      target_sms, use_cuda_graphs, conv_gemm=conv_gemm, depthwise_kernels=depthwise_kernels,
                      debug_dir=debug_dir, model_id=model_id, constant_methods=constant_methods,
                      gemv_kernels=gemv_kernels, overlap_launches=overlap_launches,
                      shape_buckets=shape_buckets, persistent_decode=persistent_decode,
                      persistent_decode_options=persistent_decode_options)


def compile_as(caller: str, exported_program, arg_inputs, enabled_precisions, min_block_size, target_sms,
               use_cuda_graphs, conv_gemm="all", depthwise_kernels=True, debug_dir=None,
               model_id=None, constant_methods=None, gemv_kernels=True, overlap_launches=True,
               shape_buckets=None, persistent_decode=False, persistent_decode_options=None) -> CompiledProgram:
    """kiln.compile's body; `caller` names the public function in errors."""
    programs, given_dict = check_programs(exported_program, caller)
    constant_methods = check_constant_methods(caller, constant_methods, programs)
    check_not_per_method(caller, enabled_precisions=enabled_precisions, min_block_size=min_block_size,
                         target_sms=target_sms, use_cuda_graphs=use_cuda_graphs, conv_gemm=conv_gemm,
                         depthwise_kernels=depthwise_kernels, gemv_kernels=gemv_kernels, debug_dir=debug_dir,
                         overlap_launches=overlap_launches, persistent_decode=persistent_decode,
                         model_id=model_id)
    model_id = _weights.check_model_id(model_id) if model_id is not None else _weights.default_model_id(programs)
    options = validate_options(
        enabled_precisions=enabled_precisions,
        min_block_size=min_block_size,
        target_sms=target_sms,
        use_cuda_graphs=use_cuda_graphs,
        conv_gemm=conv_gemm,
        depthwise_kernels=depthwise_kernels,
        gemv_kernels=gemv_kernels,
        overlap_launches=overlap_launches,
        persistent_decode=persistent_decode,
        persistent_decode_options=persistent_decode_options,
        debug_dir=debug_dir,
        weights_prefix=_weights.key_prefix(model_id),
        shape_buckets=shape_buckets,
    )
    if arg_inputs is not None:
        if given_dict:
            if not isinstance(arg_inputs, dict):
                raise TypeError(f"{caller}: with a dict of programs, arg_inputs must be a dict "
                                f"method name -> inputs, got {type(arg_inputs).__name__}")
            unknown = sorted(set(arg_inputs) - set(programs), key=str)
            if unknown:
                raise ValueError(f"{caller}: arg_inputs names method(s) {unknown} that are not in "
                                 f"the programs ({sorted(programs)})")
            for name, inputs in arg_inputs.items():
                try:
                    check_arg_inputs(programs[name], inputs)
                except (TypeError, ValueError) as e:
                    raise type(e)(f"method {name!r}: {e}") from None
        else:
            check_arg_inputs(programs["forward"], arg_inputs)
    phases = _timing.ExportPhases()
    with _timing.recording(phases):
        manager, summaries = lower(programs if given_dict else programs["forward"], options, constant_methods)
    return CompiledProgram(manager, options, merge_summaries(summaries),
                           programs if given_dict else programs["forward"], summaries, model_id,
                           constant_methods, phases)


def _device_io_requested(backend_config: ExecutorchBackendConfig | None) -> bool:
    """True when `backend_config` asks ExecuTorch to skip the host copies at
    the method boundary (inputs and/or outputs stay on the GPU)."""
    propagate = getattr(backend_config, "propagate_device_config", None)
    return bool(propagate is not None and (getattr(propagate, "skip_h2d_for_method_inputs", False)
                                           or getattr(propagate, "skip_d2h_for_method_outputs", False)))


def _kiln_lowered_modules(manager: EdgeProgramManager) -> list:
    modules = []
    for method in manager.methods:
        for module in manager.exported_program(method).graph_module.modules():
            if type(module).__name__ == "LoweredBackendModule" and module.backend_id == "KilnBackend":
                modules.append(module)
    return modules


def _retag_target_device(manager: EdgeProgramManager, options: KilnOptions, target_device: str) -> bool:
    """Gives `manager`'s Kiln delegates the compile specs a lowering with
    `target_device` would have given them (the engine bytes do not depend on
    it: it only tells ExecuTorch where a delegate's inputs and outputs live).
    False, changing nothing, when a delegate's specs are not the ones
    `options` made (then the caller lowers again)."""
    old = [(s.key, bytes(s.value)) for s in options.to_compile_specs()]
    modules = _kiln_lowered_modules(manager)
    if any([(s.key, bytes(s.value)) for s in m.compile_specs] != old for m in modules):
        return False
    new_specs = replace(options, target_device=target_device).to_compile_specs()
    for module in modules:
        module._compile_specs = list(new_specs)
    return True


def save(
    compiled: CompiledProgram,
    path: str | os.PathLike,
    output_format: str = "executorch",
    use_cuda_graphs: bool | None = None,
    backend_config: ExecutorchBackendConfig | None = None,
    external_weights: str | os.PathLike | None = None,
) -> Path:
    """Writes `compiled` as one ExecuTorch .pte; returns the path.

    ``external_weights`` (a path ending in ``.ptd``): Kiln's weights go to that
    ExecuTorch data file instead of the .pte (the .pte then holds only the
    program and its engines); load both, e.g. ``Runtime.get().load_program(
    pte, data_path=ptd)`` or ``kiln_runner --data_path=ptd``. The .ptd is
    written next to nothing else: only the given path. Weights shared by
    several methods are in it once.

    ``backend_config`` is passed to ``to_executorch`` as is, e.g.
    ``ExecutorchBackendConfig(propagate_device_config=PropagateDeviceConfig(
    skip_h2d_for_method_inputs=True, skip_d2h_for_method_outputs=True),
    memory_planning_pass=MemoryPlanningPass(alloc_graph_input=False,
    alloc_graph_output=False))`` for CUDA inputs and outputs at the method
    boundary (the Kiln delegate then reads and writes them in place).

    ``use_cuda_graphs`` (when not None and different from what was given to
    ``kiln.compile``) re-lowers the program, because the choice is baked into
    each engine's metadata at compile time. Device-resident I/O alone does
    not: the engines are the same, only the delegates' ``target_device``
    compile spec changes (for this save; ``compiled`` is left as it was).
    """
    if not isinstance(compiled, CompiledProgram):
        raise TypeError(
            f"kiln.save: expected a kiln.CompiledProgram (from kiln.compile), "
            f"got {type(compiled).__name__}"
        )
    if output_format not in OUTPUT_FORMATS:
        raise ValueError(
            f"kiln.save: output_format {output_format!r} is not supported; "
            f"use one of {', '.join(OUTPUT_FORMATS)}"
        )
    if use_cuda_graphs is not None and not isinstance(use_cuda_graphs, bool):
        raise TypeError(
            f"use_cuda_graphs: expected True, False or None, got {type(use_cuda_graphs).__name__}"
        )
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"kiln.save: path must be a str or os.PathLike, got {type(path).__name__}")
    if backend_config is not None and not isinstance(backend_config, ExecutorchBackendConfig):
        raise TypeError(
            f"kiln.save: backend_config must be an executorch.exir.ExecutorchBackendConfig, "
            f"got {type(backend_config).__name__}"
        )

    ptd_path = None
    if external_weights is not None:
        if not isinstance(external_weights, (str, os.PathLike)):
            raise TypeError(f"kiln.save: external_weights must be a path (str or os.PathLike) ending in "
                            f".ptd, or None; got {type(external_weights).__name__}")
        ptd_path = Path(external_weights)
        if ptd_path.suffix != ".ptd" or ptd_path.name == ".ptd":
            raise ValueError(f"kiln.save: external_weights {str(external_weights)!r} must name a file "
                             "ending in .ptd (ExecuTorch's data file)")
        if not compiled.options.weights_prefix:
            raise ValueError("kiln.save: external_weights needs engines whose weights are named data; "
                             "this program was lowered without (compile it with kiln.compile)")
        if ptd_path.resolve() == Path(path).resolve():
            raise ValueError("kiln.save: external_weights must differ from the .pte path")

    phases = compiled.phases.copy()
    with _timing.recording(phases):
        path = _save(compiled, path, use_cuda_graphs, backend_config, ptd_path, phases)
    compiled.saved_phases = phases
    announce(phases.line())
    return path


def _save(compiled: CompiledProgram, path, use_cuda_graphs, backend_config, ptd_path, phases) -> Path:
    """save()'s body; records its seconds in `phases`."""
    manager = compiled.edge_program_manager
    cuda_graphs = compiled.options.cuda_graphs_choice if use_cuda_graphs is None else use_cuda_graphs
    # Device-resident I/O: the delegates must declare their GPU so ExecuTorch
    # tags the method's inputs/outputs as CUDA tensors; that is decided at
    # partitioning, so a config asking for it re-lowers.
    device = _device_io_requested(backend_config)
    target_device = "cuda:0" if device else compiled.options.target_device
    # to_executorch leaves its memory plan on the program it is given, and a
    # second save with another config would trip over it: save a copy, so
    # `compiled` stays as kiln.compile made it.
    copy_start = time.perf_counter()
    manager = copy.deepcopy(manager)
    phases.add("serialize", time.perf_counter() - copy_start)
    retagged = False
    if cuda_graphs is compiled.options.cuda_graphs_choice and target_device != compiled.options.target_device:
        # Only the delegates' target_device compile spec differs, and no
        # engine depends on it: re-tag them instead of lowering again.
        retagged = _retag_target_device(manager, compiled.options, target_device)
    if not retagged and (cuda_graphs is not compiled.options.cuda_graphs_choice
                         or target_device != compiled.options.target_device):
        reasons = []
        if cuda_graphs is not compiled.options.cuda_graphs_choice:
            reasons.append(f"use_cuda_graphs={use_cuda_graphs} (compile() had {compiled.options.cuda_graphs_choice}; "
                           "pass it to kiln.compile to avoid this)")
        if target_device != compiled.options.target_device:
            reasons.append("inputs and outputs on the GPU (backend_config skips the method-boundary copies)")
        announce("kiln: re-lowering for " + " and ".join(reasons))
        options = validate_options(
            enabled_precisions=set(compiled.options.enabled_precisions),
            min_block_size=compiled.options.min_block_size,
            target_sms=compiled.options.target_sms,
            cubin_sms=compiled.options.cubin_sms,
            use_cuda_graphs=cuda_graphs,
            emit_ptx=compiled.options.emit_ptx,
            target_device=target_device,
            conv_gemm=compiled.options.conv_gemm,
            depthwise_kernels=compiled.options.depthwise_kernels,
            gemv_kernels=compiled.options.gemv_kernels,
            overlap_launches=compiled.options.overlap_launches,
            persistent_decode=compiled.options.persistent_decode,
            persistent_decode_options=dict(compiled.options.persistent_decode_options),
            debug_dir=compiled.options.debug_dir,
            weights_prefix=compiled.options.weights_prefix,
            shape_buckets=compiled.options.shape_buckets,
        )
        manager, _ = lower(compiled.exported_program, options, compiled.constant_methods)

    start = time.perf_counter()
    if ptd_path is not None:
        _weights.move_to_external_file(manager, ptd_path.name)
    # to_executorch re-traces the top-level graph: let the delegate calls
    # there take their outputs' shapes from the partition's graph instead of
    # running the whole partition on fake tensors each time.
    with _delegate_meta.shape_only_delegates(_kiln_lowered_modules(manager)):
        program = manager.to_executorch(backend_config) if backend_config is not None else manager.to_executorch()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        program.write_to_file(f)
    logger.info("kiln: wrote %s (%d bytes)", path, path.stat().st_size)
    if ptd_path is not None:
        _write_ptd(program, ptd_path)
    phases.add("serialize", time.perf_counter() - start)
    return path


def _write_ptd(program, ptd_path: Path) -> None:
    """Writes the external data file `ptd_path` (ExecuTorch names it by its
    tag, the file name). A program with no Kiln weights has none to write:
    refused, so a missing .ptd is never mistaken for a written one."""
    ptd_path.parent.mkdir(parents=True, exist_ok=True)
    data = getattr(program, "_tensor_data", None) or {}
    if ptd_path.name not in data:
        raise RuntimeError(f"kiln.save: ExecuTorch produced no data file {ptd_path.name!r} "
                           f"(it produced {sorted(data)})")
    program.write_tensor_data_to_file(str(ptd_path.parent))
    logger.info("kiln: wrote %s (%d bytes)", ptd_path, ptd_path.stat().st_size)
