"""kiln_runtime: run Kiln .pte files from Python with no torch and no
ExecuTorch Python: numpy arrays and DLPack tensors in, numpy arrays (host
outputs) and DLPack-capable DeviceArrays (device-resident outputs) out.

    import numpy as np
    import kiln_runtime

    program = kiln_runtime.Program("model.pte")
    method = program.method("forward")
    print(method.inputs)                    # (TensorInfo(dtype='float32', shape=(8, 512), device='cpu', ...),)
    (y,) = method.execute([np.random.rand(8, 512).astype(np.float32)])

CUDA tensors of torch, cupy or jax are passed as they are (through
__dlpack__, with no import of those libraries here). A thin ctypes binding over
libkiln_c_api.so (src/c_api, include/kiln/c_api.h); where the library is
found: kiln_runtime._library (library_path()).
"""

from __future__ import annotations

from ._errors import KilnRuntimeError, LibraryNotFoundError, NoCudaGpuError
from ._library import library_path
from ._program import DeviceArray, Method, Program, TensorInfo, gpu_available

__version__ = "0.1.0"

__all__ = ["DeviceArray", "KilnRuntimeError", "LibraryNotFoundError", "Method", "NoCudaGpuError", "Program",
           "TensorInfo", "__version__", "gpu_available", "library_path"]
