"""The models of the kiln_runtime GPU test (PyTorch only, no Kiln import), so
the GPU machine rebuilds them from their saved weights and computes PyTorch's
outputs on fresh inputs. Small on purpose: the whole exported set is < 5 MiB."""

import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from sample_models import Mlp, MlpWithCpuOp  # noqa: E402


class TwoHeads(nn.Module):
    """Two inputs, two outputs: fc(x) + y and relu(fc2(x))."""

    def __init__(self, features=64, out_features=32):
        super().__init__()
        self.fc = nn.Linear(features, out_features)
        self.fc2 = nn.Linear(features, 16)

    def forward(self, x, y):
        return self.fc(x) + y, torch.relu(self.fc2(x))


FACTORIES = {"Mlp": Mlp, "MlpWithCpuOp": MlpWithCpuOp, "TwoHeads": TwoHeads}

# name -> (factory, kwargs, input shapes, model dtype, enabled precision, device-resident I/O, rtol)
CASES = {
    "mlp_fp32": ("Mlp", {"in_features": 64, "hidden": 128, "out_features": 16}, [[4, 64]], "float32",
                 "float32", False, 1e-5),
    "mlp_fp16": ("Mlp", {"in_features": 64, "hidden": 128, "out_features": 16}, [[4, 64]], "float32",
                 "float16", False, 1e-2),
    "cpu_op_fp32": ("MlpWithCpuOp", {"in_features": 64, "hidden": 128, "out_features": 16}, [[4, 64]],
                    "float32", "float32", False, 1e-5),
    "two_heads_fp32": ("TwoHeads", {}, [[8, 64], [8, 32]], "float32", "float32", False, 1e-5),
    "mlp_device_fp32": ("Mlp", {"in_features": 64, "hidden": 128, "out_features": 16}, [[4, 64]], "float32",
                        "float32", True, 1e-5),
    "mlp_device_fp16": ("Mlp", {"in_features": 64, "hidden": 128, "out_features": 16}, [[4, 64]], "float16",
                        "float16", True, 1e-2),
}


# Dynamic batch (issue 12): name -> (factory, kwargs, features, batch range
# (min, max), precision, rtol). The engines hold one variant per bucket of the
# range (2, 4, 8; torch.export takes no Dim min below 2); the test feeds every
# bucket, one size between and one past the max.
DYNAMIC_CASES = {
    "mlp_dynamic_fp32": ("Mlp", {"in_features": 64, "hidden": 128, "out_features": 16}, 64, (2, 8), "float32", 1e-5),
}


def build(factory, **kwargs):
    return FACTORIES[factory](**kwargs)
