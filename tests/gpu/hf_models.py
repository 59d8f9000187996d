"""Hugging Face transformers models for the GPU numerics check (CPU side only:
needs `transformers`, which the GPU machine lacks).

    build(name, dtype, size="full") -> (module, example inputs)
    random_inputs(name, batch, generator, size="full") -> tuple of int64 tensors

Models, built from configs (nothing is downloaded), random weights:

  bert   BertModel(BertConfig()) (BERT-base: 12 layers, hidden 768, 12 heads,
         vocab 30522), attn_implementation "sdpa". Inputs input_ids and
         attention_mask, int64 [batch, 128], the mask padding each row's tail
         (lengths 64..128). Returns (last_hidden_state [b, 128, 768],
         pooler_output [b, 768]).
  llama  LlamaForCausalLM(LlamaConfig(hidden 768, 12 layers, 12 heads, 4
         key/value heads (grouped-query attention), intermediate 2048, vocab
         32000, tied embeddings)): 100.1M parameters. Input input_ids int64
         [1, 128] (a fixed-length prompt, no mask: causal attention over all
         of it). Returns (logits of the last LLAMA_LOGITS positions
         [1, 4, 32000], the final normed hidden state [1, 128, 768]).

Why the Llama returns what it does: the full logits [1, 128, 32000] are
16 MiB of float32 per trial, and references travel to the GPU machine in a
64 MiB carry. The last positions' logits check the head (a GEMM over the
whole vocabulary) as a prefill for generation uses it; the final hidden state
at every position checks the decoder at every position, so a wrong causal
mask (which the last position alone cannot reveal: it sees the whole prompt
either way) is caught. `logits_to_keep` is LlamaForCausalLM's own argument.

size="tiny" gives 2-layer models with small hidden sizes and vocabularies,
same code path, for the CPU tests (tests/python/test_hf_numerics_prep.py).

Weights (init_weights): as examples/vision_models.py, every floating
state_dict entry is overwritten from numpy's PCG64 stream
(np.random.default_rng(seed)) so the .pte compresses about 14x (fp16) to 27x
(fp32) with xz: embeddings are Rademacher signs times 0.02 (BERT's and
Llama's initializer_range), linear weights Rademacher signs times
sqrt(1 / fan_in) (variance preserving, so the residual streams stay in fp16's
range), norm weights U(0.5, 1.5), norm biases N(0, 0.1), linear biases
N(0, 0.02). A tied weight (Llama's lm_head is its embedding) is drawn once.
`checksum()` is recorded in the manifest.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from vision_models import checksum  # noqa: E402,F401  (the same sha256 the vision manifests record)

MODELS = ("bert", "llama")
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
DEFAULT_SEED = 20261203
SEQ = 128
LLAMA_LOGITS = 4  # logits of the last positions returned by the Llama wrapper


def _configs(size: str) -> dict:
    if size == "full":
        return {
            "bert": dict(),  # BertConfig() defaults: BERT-base
            "llama": dict(hidden_size=768, intermediate_size=2048, num_hidden_layers=12, num_attention_heads=12,
                          num_key_value_heads=4, vocab_size=32000, max_position_embeddings=2048,
                          tie_word_embeddings=True),
            "seq": SEQ,
        }
    if size == "tiny":
        return {
            "bert": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                         vocab_size=500, max_position_embeddings=64),
            "llama": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                          num_key_value_heads=2, vocab_size=500, max_position_embeddings=64,
                          tie_word_embeddings=True),
            "seq": 16,
        }
    raise ValueError(f"unknown size {size!r}: full or tiny")


def seq_len(size: str = "full") -> int:
    return _configs(size)["seq"]


def vocab_size(name: str, size: str = "full") -> int:
    return _configs(size)[name].get("vocab_size", 30522)


class BertOutputs(nn.Module):
    """BertModel returning (last_hidden_state, pooler_output) as a tuple."""

    def __init__(self, bert: nn.Module):
        super().__init__()
        self.bert = bert

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor):
        out = self.bert(input_ids=input_ids, attention_mask=attention_mask)
        return out.last_hidden_state, out.pooler_output


class LlamaOutputs(nn.Module):
    """LlamaForCausalLM over a prompt: (logits of the last `logits_to_keep`
    positions, final normed hidden state of every position)."""

    def __init__(self, lm: nn.Module, logits_to_keep: int = LLAMA_LOGITS):
        super().__init__()
        self.lm = lm
        self.logits_to_keep = logits_to_keep

    def forward(self, input_ids: torch.Tensor):
        out = self.lm(input_ids=input_ids, use_cache=False, logits_to_keep=self.logits_to_keep,
                      output_hidden_states=True)
        return out.logits, out.hidden_states[-1]


def construct(name: str, size: str = "full") -> nn.Module:
    """The wrapped HF model in eval mode, float32, default (torch) init."""
    cfg = _configs(size)
    if name == "bert":
        from transformers import BertConfig, BertModel

        return BertOutputs(BertModel(BertConfig(attn_implementation="sdpa", **cfg["bert"]))).eval()
    if name == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM

        config = LlamaConfig(attn_implementation="sdpa", use_cache=False, **cfg["llama"])
        return LlamaOutputs(LlamaForCausalLM(config)).eval()
    raise ValueError(f"unknown model {name!r}; known: {', '.join(MODELS)}")


def _rademacher(rng: np.random.Generator, shape, std: float) -> np.ndarray:
    return (rng.integers(0, 2, size=shape, dtype=np.int8) * 2 - 1).astype(np.float64) * std


def init_weights(model: nn.Module, seed: int = DEFAULT_SEED) -> nn.Module:
    """Overwrites every floating state_dict entry, in order, from
    np.random.default_rng(seed) (rules in the module docstring)."""
    rng = np.random.default_rng(seed)
    owners = dict(model.named_modules())
    seen: set[int] = set()
    with torch.no_grad():
        for key, tensor in model.state_dict(keep_vars=True).items():
            if not tensor.is_floating_point() or id(tensor) in seen:
                continue  # integer buffers (position ids); a tied weight already drawn
            seen.add(id(tensor))
            module_name, _, leaf = key.rpartition(".")
            owner = owners[module_name]
            shape = tuple(tensor.shape)
            kind = type(owner).__name__
            if isinstance(owner, nn.Embedding):
                values = _rademacher(rng, shape, 0.02)
            elif isinstance(owner, nn.LayerNorm) or kind.endswith("RMSNorm"):
                values = rng.uniform(0.5, 1.5, shape) if leaf == "weight" else rng.normal(0.0, 0.1, shape)
            elif isinstance(owner, nn.Linear) and leaf == "weight":
                values = _rademacher(rng, shape, math.sqrt(1.0 / shape[1]))
            elif isinstance(owner, nn.Linear) and leaf == "bias":
                values = rng.normal(0.0, 0.02, shape)
            else:
                raise ValueError(f"no init rule for {key} {shape} in {kind}")
            tensor.data.copy_(torch.from_numpy(np.asarray(values, dtype=np.float32).reshape(shape)).to(tensor.dtype))
    return model


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # tied weights once


def input_shape(name: str, batch: int, size: str = "full") -> tuple[int, int]:
    return (batch, seq_len(size))


def random_inputs(name: str, batch: int, generator: torch.Generator, size: str = "full") -> tuple[torch.Tensor, ...]:
    """Token ids over the whole vocabulary; BERT also gets an attention mask
    padding each row's tail (lengths seq/2 .. seq)."""
    seq = seq_len(size)
    ids = torch.randint(0, vocab_size(name, size), (batch, seq), generator=generator)
    if name != "bert":
        return (ids,)
    lengths = torch.randint(seq // 2, seq + 1, (batch, 1), generator=generator)
    mask = (torch.arange(seq)[None, :] < lengths).long()
    return ids, mask


def build(name: str, dtype: torch.dtype | str = torch.float32, size: str = "full", seed: int = DEFAULT_SEED,
          batch: int = 1):
    """(wrapped model in eval mode and `dtype`, example inputs for export:
    seed 0, independent of the trials' inputs)."""
    dtype = DTYPES[dtype] if isinstance(dtype, str) else dtype
    model = init_weights(construct(name, size), seed).to(dtype)
    return model, random_inputs(name, batch, torch.Generator().manual_seed(0), size)


def activation_peak(model: nn.Module, inputs) -> float:
    """Largest |value| over every leaf module's floating inputs and outputs (for
    checking that the weights keep activations in fp16's range)."""
    peak = [0.0]

    def hook(_m, args, out):
        outs = list(out) if isinstance(out, (tuple, list)) else [out]
        for t in list(args) + outs:  # inputs too: a norm's input is the residual stream
            if isinstance(t, torch.Tensor) and t.is_floating_point():
                peak[0] = max(peak[0], float(t.detach().float().abs().max()))

    handles = [m.register_forward_hook(hook) for m in model.modules() if not list(m.children())]
    try:
        with torch.no_grad():
            model(*inputs)
    finally:
        for h in handles:
            h.remove()
    return peak[0]
