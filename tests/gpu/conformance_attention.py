"""Attention conformance models for the GPU tests: scaled_dot_product_attention
(plain, causal, additive and boolean masks, cross attention, grouped-query,
several head dims), nn.MultiheadAttention, and attention written out as ops
(matmul -> scale -> mask -> softmax -> matmul, as Hugging Face eager
attention does). Each becomes one fused attention step (src/ops/attention_ops.h);
exported by export_conformance.py in float32, float16 and bfloat16 and
compared on the GPU against the float32 model. PyTorch only."""

import math

import torch
from torch import nn
from torch.nn import functional as F


class SelfAttention(nn.Module):
    """qkv projection -> heads -> SDPA -> merge heads -> output projection."""

    def __init__(self, dim=64, heads=4, causal=False, head_dim=None):
        super().__init__()
        self.heads, self.causal = heads, causal
        self.head_dim = head_dim or dim // heads
        self.qkv = nn.Linear(dim, 3 * heads * self.head_dim)
        self.out = nn.Linear(heads * self.head_dim, dim)

    def forward(self, x):
        b, n, _ = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return self.out(o.transpose(1, 2).reshape(b, n, self.heads * self.head_dim))


class MaskedAttention(nn.Module):
    """An additive float mask given as an input ([b, 1, n, n], broadcast over heads)."""

    def __init__(self, dim=64, heads=4):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)

    def forward(self, x, mask):
        b, n, d = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return o.transpose(1, 2).reshape(b, n, d)


class BoolMaskAttention(nn.Module):
    """A constant boolean mask (True = attend), every row keeping its diagonal."""

    def __init__(self, dim=64, heads=4, n=40):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        keep = torch.rand(1, 1, n, n) > 0.4
        keep |= torch.eye(n, dtype=torch.bool)
        self.register_buffer("keep", keep)

    def forward(self, x):
        b, n, d = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=self.keep)
        return o.transpose(1, 2).reshape(b, n, d)


class CausalBufferAttention(nn.Module):
    """A causal mask as a tensor computed at run time (additive 0/-inf, or bool),
    as a KV-cache model builds it from positions: whole key tiles are hidden
    from whole row blocks, which the tensor-core kernel skips. (A constant
    tril mask would be recognized as causal at export; tying it to the input
    keeps it a mask.)"""

    def __init__(self, dim=128, heads=2, n=300, additive=True):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        keep = torch.ones(n, n, dtype=torch.bool).tril()[None, None]
        if additive:
            self.register_buffer("mask", torch.zeros(1, 1, n, n).masked_fill(~keep, float("-inf")))
        else:
            self.register_buffer("mask", keep)

    def forward(self, x):
        b, n, d = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        first = x[:, :1, :1].unsqueeze(1)  # [b, 1, 1, 1]
        mask = self.mask & (first == first) if self.mask.dtype == torch.bool else self.mask + first * 0.0
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return o.transpose(1, 2).reshape(b, n, d)


class CrossAttention(nn.Module):
    """Queries from x, keys and values from y (rows != keys), an explicit scale."""

    def __init__(self, dim=64, heads=4):
        super().__init__()
        self.heads = heads
        self.q = nn.Linear(dim, dim)
        self.kv = nn.Linear(dim, 2 * dim)

    def forward(self, x, y):
        b, n, d = x.shape
        m = y.shape[1]
        q = self.q(x).view(b, n, self.heads, d // self.heads).transpose(1, 2)
        k, v = self.kv(y).view(b, m, 2, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        o = F.scaled_dot_product_attention(q, k, v, scale=0.3)
        return o.transpose(1, 2).reshape(b, n, d)


class LearnedKeyAttention(nn.Module):
    """Few queries over learned keys and values (cross-attention to latents, query slots):
    export folds K^T into a constant, which the compiler stores as key rows; 3 queries a
    head over 256 keys is decode-shaped, so the keys also split over blocks."""

    def __init__(self, dim=64, heads=4, keys=256):
        super().__init__()
        self.heads = heads
        self.q = nn.Linear(dim, dim)
        self.k = nn.Parameter(torch.randn(1, heads, keys, dim // heads))
        self.v = nn.Parameter(torch.randn(1, heads, keys, dim // heads))

    def forward(self, x):
        b, n, d = x.shape
        q = self.q(x).view(b, n, self.heads, d // self.heads).transpose(1, 2)
        o = F.scaled_dot_product_attention(q, self.k.expand(b, -1, -1, -1), self.v.expand(b, -1, -1, -1))
        return o.transpose(1, 2).reshape(b, n, d)


class GroupedQueryAttention(nn.Module):
    """8 query heads sharing 2 key/value heads (enable_gqa)."""

    def __init__(self, dim=128, heads=8, kv_heads=2):
        super().__init__()
        self.heads, self.kv_heads, self.hd = heads, kv_heads, dim // heads
        self.q = nn.Linear(dim, dim)
        self.kv = nn.Linear(dim, 2 * kv_heads * self.hd)

    def forward(self, x):
        b, n, _ = x.shape
        q = self.q(x).view(b, n, self.heads, self.hd).transpose(1, 2)
        k, v = self.kv(x).view(b, n, 2, self.kv_heads, self.hd).permute(2, 0, 3, 1, 4)
        o = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        return o.transpose(1, 2).reshape(b, n, self.heads * self.hd)


class TorchMha(nn.Module):
    """nn.MultiheadAttention, self-attention, batch first (as ViT blocks use it)."""

    def __init__(self, dim=96, heads=6):
        super().__init__()
        self.mha = nn.MultiheadAttention(dim, heads, batch_first=True)

    def forward(self, x):
        return self.mha(x, x, x, need_weights=False)[0]


class MhaBlock(nn.Module):
    """A pre-norm encoder block around nn.MultiheadAttention (ViT's), at
    batch > 1: the batch-first transposes around the projections move
    elements, and the residual adds follow the output projections."""

    def __init__(self, dim=64, heads=4, batch_first=True):
        super().__init__()
        self.batch_first = batch_first
        self.ln1 = nn.LayerNorm(dim)
        self.mha = nn.MultiheadAttention(dim, heads, batch_first=batch_first)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, x):
        y = self.ln1(x)
        x = x + self.mha(y, y, y, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class SeparateQkv(nn.Module):
    """BERT's self-attention: separate query/key/value linears, heads split
    by view + permute, an additive mask from a 0/1 attention mask, the
    output linear and the residual."""

    def __init__(self, dim=64, heads=4):
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.o = (nn.Linear(dim, dim) for _ in range(4))

    def forward(self, x, keep):
        b, n, d = x.shape
        hd = d // self.heads

        def split(t):
            return t.view(b, n, self.heads, hd).permute(0, 2, 1, 3)

        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        keep01 = (keep > 0).to(x.dtype)[:, None, None, :]  # the input is random: keep where positive
        bias = (1.0 - keep01) * torch.finfo(x.dtype).min
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(hd) + bias
        o = torch.matmul(torch.softmax(scores, dim=-1), v).permute(0, 2, 1, 3).reshape(b, n, d)
        return x + self.o(o)


class EagerAttention(nn.Module):
    """Attention written out as Hugging Face eager attention does: matmul,
    scale, additive mask, softmax, matmul."""

    def __init__(self, dim=64, heads=4):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)

    def forward(self, x, mask):
        b, n, d = x.shape
        hd = d // self.heads
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, hd).permute(2, 0, 3, 1, 4)
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(hd) + mask
        p = torch.softmax(scores, dim=-1)
        return torch.matmul(p, v).transpose(1, 2).reshape(b, n, d)


class VitAttention(nn.Module):
    """ViT-B/16's attention shape: 197 tokens, 12 heads of 64."""

    def __init__(self):
        super().__init__()
        self.attn = SelfAttention(dim=768, heads=12)

    def forward(self, x):
        return self.attn(x)


FACTORIES = {
    "SdpaPlain": lambda: SelfAttention(),
    "SdpaCausal": lambda: SelfAttention(causal=True),
    "SdpaHeadDim128": lambda: SelfAttention(dim=256, heads=2),
    "SdpaHeadDim40": lambda: SelfAttention(dim=80, heads=2),
    "SdpaMask": MaskedAttention,
    "SdpaBoolMask": BoolMaskAttention,
    "SdpaCross": CrossAttention,
    "SdpaGqa": GroupedQueryAttention,
    "TorchMha": TorchMha,
    "MhaBlock": MhaBlock,
    "MhaBlockSeqFirst": lambda: MhaBlock(batch_first=False),
    "SeparateQkv": SeparateQkv,
    "BertAttention": lambda: SeparateQkv(dim=768, heads=12),
    "SdpaCausalLong": lambda: SelfAttention(dim=128, heads=2, causal=True),
    "SdpaCausalTensorLong": lambda: CausalBufferAttention(additive=True),
    "SdpaCausalBoolLong": lambda: CausalBufferAttention(additive=False),
    "EagerAttention": EagerAttention,
    "VitAttention": VitAttention,
    "LearnedKeys": LearnedKeyAttention,
}

# factory name -> input shapes
CASES = {
    "SdpaPlain": [[2, 50, 64]],
    "SdpaCausal": [[2, 70, 64]],
    "SdpaHeadDim128": [[2, 33, 256]],
    "SdpaHeadDim40": [[2, 37, 80]],
    "SdpaMask": [[2, 50, 64], [2, 1, 50, 50]],
    "SdpaBoolMask": [[2, 40, 64]],
    "SdpaCross": [[2, 40, 64], [2, 24, 64]],
    "SdpaGqa": [[2, 30, 128]],
    "TorchMha": [[2, 65, 96]],
    "MhaBlock": [[3, 41, 64]],
    "MhaBlockSeqFirst": [[41, 3, 64]],
    "SeparateQkv": [[3, 48, 64], [3, 48]],
    "BertAttention": [[1, 128, 768], [1, 128]],  # few heads x rows: keys split over warps
    "SdpaCausalLong": [[1, 300, 128]],
    "SdpaCausalTensorLong": [[1, 300, 128]],
    "SdpaCausalBoolLong": [[1, 300, 128]],
    "EagerAttention": [[2, 50, 64], [2, 1, 1, 50]],
    "VitAttention": [[1, 197, 768]],
    "LearnedKeys": [[1, 3, 64]],
}
