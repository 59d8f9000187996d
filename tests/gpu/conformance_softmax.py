"""Row-op conformance models for the GPU tests: softmax and log_softmax over
the last dim (warp rows, block rows, rows held in registers and streamed
ones up to 50k elements, 16-byte vector loads and the scalar lengths) and
over a non-last dim (strided rows), PyTorch's safe-softmax chain with whole
rows masked to -inf, attention through scaled_dot_product_attention, HF
Llama's RMSNorm and nn.RMSNorm (one row kernel each), and the small ops
around them (any.dim, full_like, fmod). Exported by export_conformance.py
in float32, float16 and bfloat16 and compared on the GPU against the
float32 model. PyTorch only."""

import torch
from torch import nn

F = nn.functional


class SoftmaxLast(nn.Module):
    """softmax and log_softmax over the last dim. The softmax input is scaled
    to logits beyond +-88, where exp overflows float unless the row max is
    subtracted; scaling by a power of two is exact in every dtype, so the
    scaled logits Kiln stores in float16/bfloat16 equal the reference's."""

    def forward(self, x):
        return torch.softmax(x * 32.0, -1), torch.log_softmax(x * 4.0, -1)


class SoftmaxDim(nn.Module):
    """Over dim 1 and dim 0 (strided rows) and dim -2."""

    def forward(self, x):
        return torch.softmax(x, 1), torch.log_softmax(x * 2.0, 0), torch.softmax(x, -2)


class SafeSoftmax(nn.Module):
    """The chain torch.export writes around _softmax for attention (the
    _safe_softmax decomposition) with rows that are all -inf (they give 0)
    and rows with some -inf."""

    def __init__(self, rows=6, cols=40):
        super().__init__()
        mask = torch.rand(rows, cols) > 0.3
        mask[1] = False  # a fully masked row
        mask[4] = False
        self.register_buffer("mask", mask)

    def forward(self, x):
        s = x.masked_fill(~self.mask, float("-inf"))
        p = torch.softmax(s, -1)
        all_masked = torch.logical_not(torch.any(torch.logical_not(s == float("-inf")), -1, keepdim=True))
        return torch.where(all_masked, torch.full_like(p, 0), p)


class Attention(nn.Module):
    """scaled_dot_product_attention with a boolean mask (no fully masked
    rows: the GPU reference's fused kernels may differ there): the fused
    attention step where the attention pass matches, else bmm, the safe
    softmax kernel, bmm."""

    def __init__(self, seq=20):
        super().__init__()
        mask = torch.rand(seq, seq) > 0.3
        mask.fill_diagonal_(True)
        self.register_buffer("mask", mask)

    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=self.mask)


class LlamaRMSNorm(nn.Module):
    """HF transformers' LlamaRMSNorm as written there."""

    def __init__(self, hidden=64, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.rand(hidden) + 0.5)
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


class LlamaRMSNorm4096(LlamaRMSNorm):
    def __init__(self):
        super().__init__(4096, 1e-5)


class TorchRMSNorm(nn.Module):
    """nn.RMSNorm (weight on the right, eps as a scalar)."""

    def __init__(self, hidden=96):
        super().__init__()
        self.norm = nn.RMSNorm(hidden, eps=1e-5)
        with torch.no_grad():
            self.norm.weight.uniform_(0.5, 1.5)

    def forward(self, x):
        return self.norm(x)


class RowSmallOps(nn.Module):
    """fmod (Scalar and Tensor), any over a bool dim, full_like, where."""

    def forward(self, x, y):
        r = torch.fmod(x * 5.0, 1.5) + torch.fmod(x * 3.0, y.abs() + 0.5)
        flag = torch.any(x > 1.0, -1, keepdim=True)
        return torch.where(flag, torch.full_like(r, 0.25), r)


FACTORIES = {
    "SoftmaxLast": SoftmaxLast,
    "SoftmaxLastShort": SoftmaxLast,
    "SoftmaxLast197": SoftmaxLast,
    "SoftmaxLast4096": SoftmaxLast,
    "SoftmaxLong": SoftmaxLast,
    "SoftmaxDim": SoftmaxDim,
    "SafeSoftmax": SafeSoftmax,
    "Attention": Attention,
    "LlamaRMSNorm": LlamaRMSNorm,
    "LlamaRMSNorm4096": LlamaRMSNorm4096,
    "TorchRMSNorm": TorchRMSNorm,
    "RowSmallOps": RowSmallOps,
}

# factory name -> input shapes
CASES = {
    "SoftmaxLast": [[4, 10, 64]],
    "SoftmaxLastShort": [[3, 7]],
    "SoftmaxLast197": [[2, 3, 197]],     # ViT's 197 tokens: scalar loads
    "SoftmaxLast4096": [[3, 4096]],      # one block a row, in registers
    "SoftmaxLong": [[2, 50000]],         # streamed
    "SoftmaxDim": [[3, 37, 5, 6]],
    "SafeSoftmax": [[6, 40]],
    "Attention": [[2, 4, 20, 16], [2, 4, 20, 16], [2, 4, 20, 16]],
    "LlamaRMSNorm": [[2, 7, 64]],
    "LlamaRMSNorm4096": [[1, 5, 4096]],
    "TorchRMSNorm": [[3, 5, 96]],
    "RowSmallOps": [[4, 33], [4, 33]],
}
