"""A Hugging Face LlamaForCausalLM as one forward that ExecuTorch and Kiln can
export for generation: a static KV cache (one k and one v buffer per layer,
updated in place at the positions given), rotary tables and the causal mask
read by position, and greedy argmax on the device.

The same wrapper takes the decoders built like Llama (ARCHITECTURES): Mistral,
Qwen2 (biased q/k/v), Qwen3 (per-head q/k RMSNorm, its own head_dim), Gemma
(scaled embedding, GELU MLP) and Phi-3 (one fused q|k|v projection). Anything
else, or a feature the wrapper does not reproduce (a sliding window shorter
than the cache, a partial rotary), is refused by name.

    forward(tokens int64 [1, T], positions int64 [T]) -> next token int64 [1]
                                                        (+ logits [1, vocab])

The same module exports as `prefill` (T = the prompt length, positions
0..T-1) and as `decode` (T = 1, the position of the new token); both update
the same cache buffers, which Kiln keeps on the GPU as engine state shared by
the two methods (docs/design_llm.md).

Grouped-query attention runs without repeating the cache: the query heads of
one key/value head are stacked as rows, q [1, kv_heads, group*T, head_dim],
so attention reads each cache once.

Weights: every floating tensor of the HF model is drawn from numpy's PCG64
stream (tests/gpu/hf_models.py init_weights): the same seed and config give
the same weights on any machine with torch + transformers + numpy, which is
how the benchmark's weights reach the GPU machine (llm_weights.py).
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "gpu"))
from hf_models import init_weights  # noqa: E402

DEFAULT_SEED = 20261203


# model_type -> the transformers config class (by name) of the decoders KVLlama takes.
ARCHITECTURES = {"llama": "LlamaConfig", "mistral": "MistralConfig", "qwen2": "Qwen2Config",
                 "qwen3": "Qwen3Config", "gemma": "GemmaConfig", "phi3": "Phi3Config"}


@dataclass(frozen=True)
class LlamaSize:
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int
    head_dim: int = 0          # 0: hidden // heads
    tied: bool = True          # the lm_head is the embedding
    llama3_rope: bool = False  # Llama 3.1's rope scaling (rope_type "llama3")

    def hf_config(self, arch: str = "llama"):
        import transformers

        if arch not in ARCHITECTURES:
            raise ValueError(f"architecture {arch!r}: the wrapper takes {', '.join(ARCHITECTURES)}")
        extra = {}
        if self.head_dim or arch in ("qwen3", "gemma"):
            extra["head_dim"] = self.head_dim or self.hidden // self.heads
        if arch == "phi3":
            extra["pad_token_id"] = 0  # Phi-3's default pad id is past a small vocabulary
        if self.llama3_rope:
            extra["rope_scaling"] = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                     "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
        return getattr(transformers, ARCHITECTURES[arch])(
            hidden_size=self.hidden, intermediate_size=self.intermediate, num_hidden_layers=self.layers,
            num_attention_heads=self.heads, num_key_value_heads=self.kv_heads, vocab_size=self.vocab,
            max_position_embeddings=4096, tie_word_embeddings=self.tied, attn_implementation="sdpa", **extra)


SIZES = {
    # CPU tests: seconds to export.
    "tiny": LlamaSize(hidden=64, intermediate=128, layers=2, heads=4, kv_heads=2, vocab=512),
    # The generation example's GPU token test: small enough to carry with its weights.
    "small": LlamaSize(hidden=384, intermediate=1024, layers=4, heads=6, kv_heads=2, vocab=4096),
    # The benchmark: 420M parameters (Llama architecture, tied embeddings).
    "bench": LlamaSize(hidden=1024, intermediate=4096, layers=24, heads=16, kv_heads=8, vocab=32000),
    # Shapes the others do not have: head_dim 128 wider than hidden / heads, four query heads a kv
    # head, an intermediate size and a vocabulary that are no multiple of 8, an lm_head of its own,
    # Llama 3.1's scaled rotary.
    "odd": LlamaSize(hidden=384, intermediate=1000, layers=3, heads=4, kv_heads=1, vocab=1003, head_dim=128,
                     tied=False, llama3_rope=True),
}


def build_hf(size: str, seed: int = DEFAULT_SEED, dtype: torch.dtype = torch.float32, arch: str = "llama"):
    """The causal LM of `arch` (LlamaForCausalLM by default) from the named size, seeded weights,
    eval mode."""
    from transformers import AutoModelForCausalLM

    lm = AutoModelForCausalLM.from_config(SIZES[size].hf_config(arch))
    return init_weights(lm.eval(), seed).to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class KVLlama(nn.Module):
    def __init__(self, lm: nn.Module, max_len: int, return_logits: bool = False):
        super().__init__()
        cfg = lm.config
        if cfg.model_type not in ARCHITECTURES:
            raise ValueError(f"{type(lm).__name__} (model_type {cfg.model_type!r}) is not one the wrapper takes: "
                             f"{', '.join(ARCHITECTURES)}")
        window = getattr(cfg, "sliding_window", None) if getattr(cfg, "use_sliding_window", True) else None
        if window is not None and window < max_len:
            raise ValueError(f"a sliding window of {window} positions is shorter than the cache's {max_len}; the "
                             "wrapper attends over the whole cache")
        self.lm = lm
        self.max_len = max_len
        self.return_logits = return_logits
        self.heads = cfg.num_attention_heads
        self.kv_heads = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        attn0 = lm.model.layers[0].self_attn
        self.scale = getattr(attn0, "scaling", 1.0 / math.sqrt(self.head_dim))
        dtype = lm.model.embed_tokens.weight.dtype
        for i in range(cfg.num_hidden_layers):
            shape = (1, self.kv_heads, max_len, self.head_dim)
            self.register_buffer(f"k_cache_{i}", torch.zeros(shape, dtype=dtype, device=lm.device))
            self.register_buffer(f"v_cache_{i}", torch.zeros(shape, dtype=dtype, device=lm.device))
        # HF's own rotary embedding gives the tables, so positions match its math.
        device = lm.model.embed_tokens.weight.device
        probe = torch.zeros(1, max_len, self.head_dim, dtype=torch.float32, device=device)
        cos, sin = lm.model.rotary_emb(probe, torch.arange(max_len, device=device)[None])
        if cos.shape[-1] != self.head_dim:
            raise ValueError(f"the rotary covers {cos.shape[-1]} of head_dim {self.head_dim} (a partial rotary); the "
                             "wrapper rotates whole heads")
        self.register_buffer("cos_table", cos[0].to(dtype))
        self.register_buffer("sin_table", sin[0].to(dtype))
        self.register_buffer("key_positions", torch.arange(max_len, device=device))

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor):
        t = tokens.shape[1]
        h, kv, hd = self.heads, self.kv_heads, self.head_dim
        group = h // kv
        x = self.lm.model.embed_tokens(tokens)
        cos = self.cos_table[positions][None, None]  # [1, 1, T, hd]
        sin = self.sin_table[positions][None, None]
        # Row g*T + i of a stacked head group is token i: it may see keys at
        # positions <= positions[i].
        allowed = self.key_positions[None, :] <= positions.repeat(group)[:, None]
        bias = torch.where(allowed, 0.0, float("-inf")).to(x.dtype)  # [group*T, max_len]
        for i, layer in enumerate(self.lm.model.layers):
            attn = layer.self_attn
            y = layer.input_layernorm(x)
            q, k, v = self._qkv(attn, y, t)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            k_cache = getattr(self, f"k_cache_{i}")
            v_cache = getattr(self, f"v_cache_{i}")
            k_cache.index_copy_(2, positions, k)
            v_cache.index_copy_(2, positions, v)
            qg = q.reshape(1, kv, group * t, hd)
            scores = (qg @ k_cache.transpose(-1, -2)) * self.scale + bias
            o = torch.softmax(scores.float(), dim=-1).to(qg.dtype) @ v_cache
            o = o.reshape(1, h, t, hd).transpose(1, 2).reshape(1, t, h * hd)
            x = x + attn.o_proj(o)
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        last = self.lm.model.norm(x[:, -1])
        logits = self.lm.lm_head(last)  # [1, vocab]
        token = torch.argmax(logits, dim=-1)  # [1]
        return (token, logits) if self.return_logits else token

    def _qkv(self, attn: nn.Module, y: torch.Tensor, t: int):
        """q [1, heads, T, hd], k and v [1, kv_heads, T, hd] of one layer, before the rotary."""
        h, kv, hd = self.heads, self.kv_heads, self.head_dim
        if hasattr(attn, "qkv_proj"):  # Phi-3: one projection, q | k | v
            q, k, v = attn.qkv_proj(y).split([h * hd, kv * hd, kv * hd], dim=-1)
        else:
            q, k, v = attn.q_proj(y), attn.k_proj(y), attn.v_proj(y)
        q, k, v = q.view(1, t, h, hd), k.view(1, t, kv, hd), v.view(1, t, kv, hd)
        if hasattr(attn, "q_norm"):  # Qwen3: RMSNorm over each head
            q, k = attn.q_norm(q), attn.k_norm(k)
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

    def reset(self) -> None:
        for name, buf in self.named_buffers():
            if "_cache_" in name:
                buf.zero_()


def hf_greedy(lm: nn.Module, prompt: torch.Tensor, new_tokens: int) -> list[int]:
    """Hugging Face's own greedy generation (generate, do_sample=False):
    the reference the example's tokens must equal."""
    with torch.no_grad():
        out = lm.generate(prompt, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                          num_beams=1, pad_token_id=0, eos_token_id=None)
    return out[0, prompt.shape[1]:].tolist()


def kv_greedy(model: KVLlama, prompt: torch.Tensor, new_tokens: int) -> tuple[list[int], list[torch.Tensor]]:
    """The export wrapper run eagerly: prefill, then one decode per token."""
    model.reset()
    logits_seen = []
    with torch.no_grad():
        p = prompt.shape[1]
        out = model(prompt, torch.arange(p))
        token = out[0] if isinstance(out, tuple) else out
        if isinstance(out, tuple):
            logits_seen.append(out[1])
        tokens = [int(token)]
        for step in range(new_tokens - 1):
            out = model(token.view(1, 1), torch.tensor([p + step]))
            token = out[0] if isinstance(out, tuple) else out
            if isinstance(out, tuple):
                logits_seen.append(out[1])
            tokens.append(int(token))
    return tokens, logits_seen


__all__ = ["ARCHITECTURES", "SIZES", "LlamaSize", "KVLlama", "build_hf", "hf_greedy", "kv_greedy", "DEFAULT_SEED"]
