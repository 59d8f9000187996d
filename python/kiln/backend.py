"""KilnBackend: ExecuTorch's preprocess hook, compiling one partition into a
Kiln engine (the delegate blob the C++ runtime loads).

ExecuTorch finds backends by class name (``BackendDetails.__subclasses__()``
matched against the DelegationSpec's backend id), so the class must stay
named ``KilnBackend`` and this module must be imported before lowering.
"""

from __future__ import annotations

import logging
import os
from typing import List

from executorch.exir.backend.backend_details import BackendDetails, PreprocessResult
from executorch.exir.backend.compile_spec_schema import CompileSpec
from torch.export import ExportedProgram

from . import _fx_nodes
from ._logging import announce, progress
from ._native import native
from ._options import KilnOptions
from .graph_builder import build_graph

logger = logging.getLogger("kiln")


def _partition_debug_dir(root: str) -> str:
    """A fresh subfolder of `root` per partition (partition_0, partition_1, ...)."""
    if not root:
        return ""
    index = 0
    while os.path.exists(os.path.join(root, f"partition_{index}")):
        index += 1
    return os.path.join(root, f"partition_{index}")


def _progress(message: str) -> None:
    announce(f"kiln: {message}")


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
        progress.partition(nodes)
        graph = build_graph(edge_program)
        logger.debug("kiln: partition graph:\n%s", graph.describe())
        engine = native().compile(
            graph,
            target_sms=list(options.target_sms),
            emit_ptx=options.emit_ptx,
            enabled_precisions=list(options.enabled_precisions),
            use_cuda_graphs=options.use_cuda_graphs,
            progress=_progress,
            conv_gemm=options.conv_gemm,
            depthwise_kernels=options.depthwise_kernels,
            debug_dir=_partition_debug_dir(options.debug_dir),
        )
        engine = bytes(engine)
        progress.engine(len(engine))
        return PreprocessResult(processed_bytes=engine)
