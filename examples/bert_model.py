"""BERT-base in plain PyTorch, for the benchmark: the architecture of Hugging
Face's BertModel with the default BertConfig (12 layers, hidden 768, 12 heads,
intermediate 3072, GELU, LayerNorm eps 1e-12, 30522-token vocabulary, 512
positions, 2 token types), with `scaled_dot_product_attention` as
transformers' "sdpa" attention, returning the last hidden state.

Why not transformers itself: the GPU machine has torch and torchvision but
no transformers and no network, and the PyTorch peers of the benchmark must
run the same model there. State-dict names follow BertModel's, so
`BertBase().load_state_dict(hf_model.state_dict(), strict=False)` loads a
Hugging Face checkpoint (the pooler is not part of this module).

Inputs: input_ids and attention_mask, int64 [batch, seq] (mask 0 = padding,
anything else attends); token_type_ids are all 0 and positions 0..seq-1.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


class BertEmbeddings(nn.Module):
    def __init__(self, vocab: int, hidden: int, positions: int, types: int, eps: float):
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab, hidden)
        self.position_embeddings = nn.Embedding(positions, hidden)
        self.token_type_embeddings = nn.Embedding(types, hidden)
        self.LayerNorm = nn.LayerNorm(hidden, eps=eps)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        seq = input_ids.shape[1]
        positions = torch.arange(seq, device=input_ids.device)
        types = torch.zeros(seq, dtype=torch.long, device=input_ids.device)
        x = self.word_embeddings(input_ids) + self.position_embeddings(positions) + self.token_type_embeddings(types)
        return self.LayerNorm(x)


class BertLayer(nn.Module):
    def __init__(self, hidden: int, heads: int, intermediate: int, eps: float):
        super().__init__()
        self.heads = heads
        self.query = nn.Linear(hidden, hidden)
        self.key = nn.Linear(hidden, hidden)
        self.value = nn.Linear(hidden, hidden)
        self.attention_dense = nn.Linear(hidden, hidden)
        self.attention_norm = nn.LayerNorm(hidden, eps=eps)
        self.intermediate = nn.Linear(hidden, intermediate)
        self.output = nn.Linear(intermediate, hidden)
        self.output_norm = nn.LayerNorm(hidden, eps=eps)

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        split = lambda t: t.view(b, n, self.heads, d // self.heads).transpose(1, 2)
        a = F.scaled_dot_product_attention(split(self.query(x)), split(self.key(x)), split(self.value(x)),
                                           attn_mask=keep)
        x = self.attention_norm(self.attention_dense(a.transpose(1, 2).reshape(b, n, d)) + x)
        return self.output_norm(self.output(F.gelu(self.intermediate(x))) + x)


class BertBase(nn.Module):
    def __init__(self, vocab: int = 30522, hidden: int = 768, layers: int = 12, heads: int = 12,
                 intermediate: int = 3072, positions: int = 512, types: int = 2, eps: float = 1e-12):
        super().__init__()
        self.embeddings = BertEmbeddings(vocab, hidden, positions, types, eps)
        self.layers = nn.ModuleList(BertLayer(hidden, heads, intermediate, eps) for _ in range(layers))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        # [b, 1, 1, seq] boolean: which keys each query attends to.
        keep = (attention_mask != 0)[:, None, None, :]
        x = self.embeddings(input_ids)
        for layer in self.layers:
            x = layer(x, keep)
        return x
