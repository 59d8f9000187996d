#!/usr/bin/env python3
"""Export for device-resident inputs and outputs: the program's method takes
CUDA tensors and returns CUDA tensors, and the Kiln delegate reads and writes
them in place (no host round trip). Runs on any machine (no GPU to export).

    PYTHONPATH=python python3 examples/export_device_resident.py --out out/device

The caller must then pass tensors that already live on the GPU; see
docs/user_guide.md, "Keeping inputs and outputs on the GPU".
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from executorch.exir import ExecutorchBackendConfig
from executorch.exir.passes import MemoryPlanningPass
from executorch.exir.passes.propagate_device_config import PropagateDeviceConfig

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "python"))
sys.path.insert(0, str(HERE))
import kiln  # noqa: E402
from export_static_shape import Classifier  # noqa: E402


def device_resident_config() -> ExecutorchBackendConfig:
    """Skip ExecuTorch's host<->device copies at the method boundary, and do
    not plan host buffers for the inputs and outputs the caller owns."""
    return ExecutorchBackendConfig(
        propagate_device_config=PropagateDeviceConfig(
            skip_h2d_for_method_inputs=True, skip_d2h_for_method_outputs=True),
        enable_non_cpu_memory_planning=True,
        memory_planning_pass=MemoryPlanningPass(alloc_graph_input=False, alloc_graph_output=False),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("out/device"), help="output directory")
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    model = Classifier().eval()
    x = torch.randn(4, 64)
    compiled = kiln.compile(torch.export.export(model, (x,)), arg_inputs=(x,))
    pte = kiln.save(compiled, args.out / "model.pte", backend_config=device_resident_config())
    with torch.no_grad():
        expected = model(x)
    kiln.tensor_file.save(args.out / "model.inputs.ktensors", [x])
    kiln.tensor_file.save(args.out / "model.expected.ktensors", [expected])
    print(f"wrote {pte} ({pte.stat().st_size:,} bytes), delegates {compiled.delegates}; "
          "inputs and outputs stay on the GPU")
    return 0


if __name__ == "__main__":
    sys.exit(main())
