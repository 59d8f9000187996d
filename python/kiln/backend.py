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

from ._logging import announce
from ._native import native
from ._options import KilnOptions
from .graph_builder import build_graph

logger = logging.getLogger("kiln")


def _progress(message: str) -> None:
    announce(f"kiln: {message}")


class KilnBackend(BackendDetails):
    @staticmethod
    def preprocess(
        edge_program: ExportedProgram, compile_specs: List[CompileSpec]
    ) -> PreprocessResult:
        options = KilnOptions.from_compile_specs(compile_specs)
        graph = build_graph(edge_program)
        logger.debug("kiln: partition graph:\n%s", graph.describe())
        engine = native().compile(
            graph,
            target_sms=list(options.target_sms),
            emit_ptx=options.emit_ptx,
            enabled_precisions=list(options.enabled_precisions),
            use_cuda_graphs=options.use_cuda_graphs,
            progress=_progress,
        )
        return PreprocessResult(processed_bytes=bytes(engine))
