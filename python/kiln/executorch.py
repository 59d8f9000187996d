"""The two-step ExecuTorch path: ``kiln.executorch.export`` returns the
EdgeProgramManager; the caller runs ``.to_executorch()`` and writes the .pte
(or adds more partitioners / passes first)."""

from __future__ import annotations

import os
from typing import Any, Mapping, Sequence

import torch
from executorch.exir import EdgeProgramManager
from torch.export import ExportedProgram

from ._compile import compile_as


def export(
    exported_program: ExportedProgram | dict[str, ExportedProgram],
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
) -> EdgeProgramManager:
    """Lowers `exported_program` (one ExportedProgram, or a dict method name
    -> ExportedProgram for a multi-method program) with KilnPartitioner; same
    options as ``kiln.compile``. Returns the EdgeProgramManager; its
    ``to_executorch()`` gives one program with every method, Kiln's weights
    in its named data (once each)."""
    return compile_as("kiln.executorch.export", exported_program, arg_inputs, enabled_precisions,
                      min_block_size, target_sms, use_cuda_graphs, conv_gemm=conv_gemm,
                      depthwise_kernels=depthwise_kernels, debug_dir=debug_dir,
                      model_id=model_id, constant_methods=constant_methods,
                      gemv_kernels=gemv_kernels, overlap_launches=overlap_launches,
                      shape_buckets=shape_buckets, persistent_decode=persistent_decode,
                      persistent_decode_options=persistent_decode_options).edge_program_manager
