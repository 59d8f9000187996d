"""Models and helpers shared by the tests."""

from __future__ import annotations

import torch


# ---- models -----------------------------------------------------------------


class MLP(torch.nn.Module):
    """Linear/GELU/Linear/ReLU/Linear: everything in Kiln's first slice."""

    def __init__(self, d_in: int = 64, hidden: int = 128, d_out: int = 16) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(d_in, hidden)
        self.fc2 = torch.nn.Linear(hidden, hidden)
        self.fc3 = torch.nn.Linear(hidden, d_out)

    def forward(self, x):
        x = torch.nn.functional.gelu(self.fc1(x))
        x = torch.relu(self.fc2(x))
        return self.fc3(x)


class CpuOpMLP(torch.nn.Module):
    """An op Kiln leaves to the CPU (flip) between two supported blocks."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(64, 32)
        self.fc2 = torch.nn.Linear(32, 16)

    def forward(self, x):
        x = torch.relu(self.fc1(x))
        x = torch.flip(x, dims=[-1])
        return torch.sigmoid(self.fc2(x))


def export(model: torch.nn.Module, *inputs: torch.Tensor):
    return torch.export.export(model.eval(), tuple(inputs))


# ---- helpers ----------------------------------------------------------------


def lowered_modules(edge_program_manager) -> list:
    """The LoweredBackendModules of an EdgeProgramManager, in graph order."""
    gm = edge_program_manager.exported_program().graph_module
    out = []
    for node in gm.graph.nodes:
        if node.op == "call_function" and "executorch_call_delegate" in str(node.target):
            out.append(getattr(gm, node.args[0].target))
    return out


def engines_in_pte(data: bytes) -> list[tuple[str, dict, bytes]]:
    """(backend id, compile specs, blob) for each delegate in a .pte."""
    from executorch.exir._serialize._program import deserialize_pte_binary

    program = deserialize_pte_binary(data).program
    blobs = []
    for plan in program.execution_plan:
        for delegate in plan.delegates:
            specs = {spec.key: bytes(spec.value) for spec in delegate.compile_specs}
            blob = program.backend_delegate_data[delegate.processed.index].data
            blobs.append((delegate.id, specs, bytes(blob)))
    return blobs


def has_gpu() -> bool:
    """Whether nvidia-smi lists a GPU (tests that check the no-GPU answers skip there)."""
    import shutil
    import subprocess

    smi = shutil.which("nvidia-smi")
    return bool(smi) and subprocess.run([smi, "-L"], capture_output=True).returncode == 0
