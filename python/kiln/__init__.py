"""Kiln: compile PyTorch models for NVIDIA GPUs into ExecuTorch programs.

    ep = torch.export.export(model, example_inputs)
    compiled = kiln.compile(ep, enabled_precisions={torch.float16})
    kiln.save(compiled, "model.pte")

Supported subgraphs become Kiln engines (delegate "KilnBackend", compiled at
export without a GPU); everything else runs on ExecuTorch's CPU kernels.
"""

from . import tensor_file
from ._native import CompileError
from ._compile import CompiledProgram, compile, save
from .backend import KilnBackend
from .partitioner import KilnPartitioner, PartitionSummary
from . import executorch

__version__ = "0.1.0"

__all__ = [
    "CompileError",
    "CompiledProgram",
    "KilnBackend",
    "KilnPartitioner",
    "PartitionSummary",
    "__version__",
    "compile",
    "executorch",
    "save",
    "tensor_file",
]
