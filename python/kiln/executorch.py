"""The two-step ExecuTorch path: ``kiln.executorch.export`` returns the
EdgeProgramManager; the caller runs ``.to_executorch()`` and writes the .pte
(or adds more partitioners / passes first)."""

from __future__ import annotations

from typing import Any, Sequence

import torch
from executorch.exir import EdgeProgramManager
from torch.export import ExportedProgram

from ._compile import check_arg_inputs, check_exported_program, lower
from ._options import DEFAULT_TARGET_SMS, validate_options


def export(
    exported_program: ExportedProgram,
    arg_inputs: Sequence[torch.Tensor] | None = None,
    enabled_precisions: Any = frozenset({torch.float32}),
    min_block_size: int = 1,
    target_sms: Sequence[int] = DEFAULT_TARGET_SMS,
    use_cuda_graphs: bool | None = None,
) -> EdgeProgramManager:
    """Lowers `exported_program` with KilnPartitioner; same options as
    ``kiln.compile``. Returns the EdgeProgramManager."""
    check_exported_program(exported_program, "kiln.executorch.export")
    options = validate_options(
        enabled_precisions=enabled_precisions,
        min_block_size=min_block_size,
        target_sms=target_sms,
        use_cuda_graphs=use_cuda_graphs,
    )
    if arg_inputs is not None:
        check_arg_inputs(exported_program, arg_inputs)
    manager, _ = lower(exported_program, options)
    return manager
