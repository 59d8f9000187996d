"""KilnBackend: ExecuTorch's preprocess hook, compiling one partition into a
Kiln engine (the delegate blob the C++ runtime loads).

ExecuTorch finds backends by class name (``BackendDetails.__subclasses__()``
matched against the DelegationSpec's backend id), so the class must stay
named ``KilnBackend`` and this module must be imported before lowering.
"""

from __future__ import annotations

import logging
from typing import List

from executorch.exir.backend.backend_details import BackendDetails, PreprocessResult
from executorch.exir.backend.compile_spec_schema import CompileSpec
from torch.export import ExportedProgram

from . import _dynamic, _fx_nodes, _trial, _weights
from ._logging import announce, progress
from ._native import CompileError, native
from ._options import KilnOptions
from .graph_builder import DEFAULT_STATE_PREFIX, build

logger = logging.getLogger("kiln")


def _progress(message: str) -> None:
    announce(f"kiln: {message}")


def engine_key(graph_key: str, options: KilnOptions) -> str:
    """Engine cache key: the built graph's key and the compile options."""
    return f"{graph_key}/{_trial.options_key(options)}"


class KilnBackend(BackendDetails):
    @staticmethod
    def preprocess(
        edge_program: ExportedProgram, compile_specs: List[CompileSpec]
    ) -> PreprocessResult:
        options = KilnOptions.from_compile_specs(compile_specs)
        nodes = sum(
            1 for n in edge_program.graph.nodes
            if n.op == "call_function" and not _fx_nodes.is_getitem(n)
        )
        prefix = options.weights_prefix or DEFAULT_STATE_PREFIX
        # One graph, or one per shape variant of a dynamic partition.
        built = _dynamic.build_program(edge_program, lambda: build(edge_program, state_prefix=prefix),
                                       options.shape_buckets)
        # The partitioner's trial compile already built this engine (same
        # graph, same constants, same options): take it instead of compiling
        # again. A miss (a partitioner that could not trial-compile with real
        # weights, or KilnBackend used without KilnPartitioner) compiles here.
        engine = _trial.ENGINE_CACHE.take(engine_key(built.key, options))
        if engine is None:
            progress.partition(nodes)
            if built.graph is not None:
                logger.debug("kiln: partition graph:\n%s", built.graph.graph.describe())
            try:
                engine = _dynamic.compile_program(built, _trial.engine_compiler(options, _progress),
                                                  options.weights_prefix,
                                                  _trial.fallback_compiler(options, _progress))
            except CompileError as e:
                # Too late to fall back: the partition is fixed by now.
                raise CompileError(
                    f"{e}\n(KilnBackend.preprocess: this partition was not compiled by KilnPartitioner's trial, "
                    "which would have left the failing node to the CPU; lower with KilnPartitioner("
                    "trial_compile=True), as kiln.compile does)"
                ) from e
        else:
            progress.partition(nodes, compiled_earlier=True)
        del built  # its constants: a copy of every weight
        if not options.weights_prefix:
            progress.engine(len(engine.blob))
            return PreprocessResult(processed_bytes=engine.blob)
        # Weights go to the program's named data, keyed by model and content,
        # so the engines of every method that use one share one copy.
        progress.engine(len(engine.blob), sum(len(data) for _key, _name, data in engine.weights))
        return PreprocessResult(processed_bytes=engine.blob, data_store_output=_weights.named_data(engine.weights))
