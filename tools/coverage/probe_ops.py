#!/usr/bin/env python3
"""Probe: which ops of the transformer models Kiln leaves to the CPU.

    PYTHONPATH=python nice python3 tools/coverage/probe_ops.py [--models swin_t,bert,llama]
        [--edge-only] [--no-fold] [--cache /tmp/kiln_probe]

Exports each model (random weights, nothing downloaded) with kiln.compile and
prints the ops left to ExecuTorch's CPU kernels with the compiler's reason
for each op (the first refusal seen). --edge-only stops after the edge
conversion and prints the op histogram of the program Kiln partitions;
--no-fold skips Kiln's export-time constant folding (to see what it folds).

Models:
  swin_t  torchvision swin_t, input float32 [1, 3, 224, 224]
  bert    transformers BertModel(BertConfig()), attn_implementation="sdpa",
          input_ids and attention_mask int64 [1, 128]
  llama   transformers LlamaForCausalLM (hidden 768, 4 layers, 12 heads,
          4 kv heads, vocab 32000, use_cache=False), input_ids int64 [1, 64]
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections import Counter

import torch

MODELS = ("swin_t", "bert", "llama")


def build(name: str, seed: int = 0):
    """(model in eval mode, example inputs)."""
    torch.manual_seed(seed)
    if name == "swin_t":
        import torchvision

        model = torchvision.models.swin_t(weights=None).eval()
        return model, (torch.randn(1, 3, 224, 224),)
    if name == "bert":
        from transformers import BertConfig, BertModel

        model = BertModel(BertConfig(attn_implementation="sdpa")).eval()
        ids = torch.randint(0, 30522, (1, 128), dtype=torch.int64)
        mask = torch.ones(1, 128, dtype=torch.int64)
        mask[0, 100:] = 0  # padding, so the mask is not all ones
        return model, (ids, mask)
    if name == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM

        config = LlamaConfig(hidden_size=768, intermediate_size=2048, num_hidden_layers=4,
                             num_attention_heads=12, num_key_value_heads=4, vocab_size=32000,
                             max_position_embeddings=512, use_cache=False)
        model = LlamaForCausalLM(config).eval()
        return model, (torch.randint(0, 32000, (1, 64), dtype=torch.int64),)
    raise ValueError(f"unknown model {name!r}; choose from {', '.join(MODELS)}")


def export(name: str, cache: str = ""):
    """(exported program, model, inputs); with `cache`, the program is saved
    there (torch.export.save) and loaded on later runs."""
    model, inputs = build(name)
    path = os.path.join(cache, f"{name}.pt2") if cache else ""
    if path and os.path.exists(path):
        return torch.export.load(path), model, inputs
    with torch.no_grad():
        ep = torch.export.export(model, inputs, strict=False)
    if path:
        os.makedirs(cache, exist_ok=True)
        torch.export.save(ep, path)
    return ep, model, inputs


class _Reasons(logging.Handler):
    """Collects the partitioner's debug lines "kiln: <op> xN on the CPU: why"."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        if " on the CPU: " in msg:
            self.lines.append(msg)


def probe(name: str, edge_only: bool, fold: bool, cache: str = "") -> dict[str, int]:
    import kiln
    from kiln import _compile, _constant_fold

    t0 = time.time()
    ep, _, _ = export(name, cache)
    if edge_only:
        from executorch.exir import to_edge

        program = to_edge(ep, compile_config=_compile.edge_compile_config()).exported_program()
        if fold:
            program = _constant_fold.fold_constants(program)
        ops = Counter(
            kiln.partitioner._fx_nodes.op_name(n.target)
            for n in program.graph.nodes if n.op == "call_function")
        print(f"== {name}: {sum(ops.values())} edge ops ({time.time() - t0:.0f} s)")
        for op, count in sorted(ops.items()):
            print(f"   {op} x{count}")
        return dict(ops)
    handler = _Reasons()
    log = logging.getLogger("kiln")
    log.addHandler(handler)
    log.setLevel(logging.DEBUG)
    propagate, log.propagate = log.propagate, False
    saved = _constant_fold.ENABLED
    _constant_fold.ENABLED = fold
    try:
        compiled = kiln.compile(ep, target_sms=(90,))
    finally:
        _constant_fold.ENABLED = saved
        log.removeHandler(handler)
        log.propagate = propagate
    summary = compiled.summary
    print(f"== {name}: {summary.line()} ({time.time() - t0:.0f} s)")
    for line in handler.lines:
        print("   " + line)
    return dict(summary.ops_on_cpu)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--edge-only", action="store_true")
    parser.add_argument("--no-fold", action="store_true")
    parser.add_argument("--cache", default="", help="folder for the exported programs (reused)")
    args = parser.parse_args()
    for name in filter(None, args.models.split(",")):
        probe(name, args.edge_only, not args.no_fold, args.cache)
    return 0


if __name__ == "__main__":
    sys.exit(main())
