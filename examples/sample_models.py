"""The sample models Kiln's examples and GPU tests use (PyTorch only, no Kiln
import, so the GPU machine can build the same modules to compute references)."""

import torch
from torch import nn


class Mlp(nn.Module):
    """Linear -> GELU -> Linear -> ReLU -> Linear."""

    def __init__(self, in_features=512, hidden=1024, out_features=32):
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.fc3 = nn.Linear(hidden, out_features)

    def forward(self, x):
        x = torch.nn.functional.gelu(self.fc1(x))
        x = torch.relu(self.fc2(x))
        return self.fc3(x)


class MlpWithCpuOp(nn.Module):
    """An MLP with one op Kiln does not compile (cumsum) in the middle: it runs
    on ExecuTorch's CPU kernels between two Kiln engines."""

    def __init__(self, in_features=512, hidden=1024, out_features=32):
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden)
        self.fc2 = nn.Linear(hidden, out_features)

    def forward(self, x):
        x = torch.nn.functional.gelu(self.fc1(x))
        x = torch.cumsum(x, dim=-1) * (1.0 / 32.0)
        return torch.relu(self.fc2(x))


FACTORIES = {"Mlp": Mlp, "MlpWithCpuOp": MlpWithCpuOp}


def build(factory, **kwargs):
    if factory not in FACTORIES:
        raise ValueError(f"unknown sample model {factory!r}; known: {sorted(FACTORIES)}")
    return FACTORIES[factory](**kwargs)
