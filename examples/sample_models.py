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
    """An MLP with one op Kiln does not compile (flip) in the middle: it runs
    on ExecuTorch's CPU kernels between two Kiln engines."""

    def __init__(self, in_features=512, hidden=1024, out_features=32):
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden)
        self.fc2 = nn.Linear(hidden, out_features)

    def forward(self, x):
        x = torch.nn.functional.gelu(self.fc1(x))
        x = torch.flip(x, dims=[-1])
        return torch.relu(self.fc2(x))


class LinearCpuOpChain(nn.Module):
    """Linear -> GELU -> Linear blocks alternating with torch.flip (which Kiln
    leaves to the CPU), `depth` times: the program splits into `depth`+ Kiln
    engines, each with an activation arena (the GELU output), so it shows what
    one arena per engine costs vs the shared activation scratch. Small
    features keep the .pte light enough to carry to the GPU machine."""

    def __init__(self, features=256, depth=8):
        super().__init__()
        self.up = nn.ModuleList(nn.Linear(features, features) for _ in range(depth))
        self.down = nn.ModuleList(nn.Linear(features, features) for _ in range(depth))

    def forward(self, x):
        for up, down in zip(self.up, self.down):
            x = down(torch.nn.functional.gelu(up(x)))
            x = torch.flip(x, dims=[-1])
        return x


FACTORIES = {"Mlp": Mlp, "MlpWithCpuOp": MlpWithCpuOp, "LinearCpuOpChain": LinearCpuOpChain}


def build(factory, **kwargs):
    if factory not in FACTORIES:
        raise ValueError(f"unknown sample model {factory!r}; known: {sorted(FACTORIES)}")
    return FACTORIES[factory](**kwargs)
