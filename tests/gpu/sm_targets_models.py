"""The models of the SM-targets GPU test (torch only: the GPU machine imports
this without ExecuTorch). Each case names a model, its input shape and the
precision the engine computes in; tests/gpu/export_sm_targets.py exports
them, tests/gpu/sm_targets_test.py rebuilds them from their weights."""

from __future__ import annotations

import torch

import conformance_attention as ca


class GatedMlp(torch.nn.Module):
    """Two GEMMs around an elementwise chain (a generated kernel)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(64, 128)
        self.fc2 = torch.nn.Linear(128, 16)

    def forward(self, x):
        h = self.fc1(x)
        h = torch.nn.functional.silu(h) * torch.tanh(h) + 0.5 * h
        return torch.sigmoid(self.fc2(h))


MODELS = {"gated_mlp": GatedMlp, "self_attention": ca.SelfAttention}

# name -> (model, input shape, engine precision, target_sms (None: the
# default list), what the GPU test expects: "cubin", "jit" or "refused")
CASES = {
    "mlp_default": ("gated_mlp", (8, 64), "float32", None, "cubin"),
    "mlp_ptx_only_sm80": ("gated_mlp", (8, 64), "float32", (80,), "jit"),
    "mlp_sm100_sm120": ("gated_mlp", (8, 64), "float32", (100, 120), "refused"),
    "attention_fp16_default": ("self_attention", (2, 50, 64), "float16", None, "cubin"),
}
