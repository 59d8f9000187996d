"""Exports a Llama-architecture model (or, with --arch, a Mistral, Qwen2, Qwen3, Gemma
or Phi-3 of the same sizes) for examples/llm_generate: one .pte with
two methods, `prefill` (the prompt: a fixed length, or with --prefill-max a
dynamic one, compiled per size bucket) and `decode` (one token),
sharing weights and the KV cache (engine state on the GPU), plus the
constant methods `get_max_seq_len` and `get_prompt_len` that the C++ loop
reads. With --reference it also runs Hugging Face's greedy generation on the
same weights (float32, on this machine) and writes what the GPU test compares
against.

    PYTHONPATH=python python3 examples/llm_generate/export_llama.py --size small \\
        --dtype float32 --prompt-len 32 --new-tokens 64 --reference --out out/llm

Writes into --out:
  <arch>_<size>_<dtype>.pte    the program (weights inside, or in the .ptd); <arch> is llama
  <arch>_<size>_<dtype>.ptd    by default; with --external-weights
  prompt.txt                   the prompt's token ids, comma-separated
  expected_tokens.txt          (--reference) HF greedy's new tokens, float32
  expected_logits.f32          (--reference, --logits) the float32 logits of
                               every step along those tokens, [steps, vocab]
  manifest.json                what was exported (size, seed, lengths, files)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
import kiln  # noqa: E402
from kiln import _dynamic  # noqa: E402
from kiln._options import parse_persistent_decode_options  # noqa: E402
from export_device_resident import device_resident_config  # noqa: E402
from llama_kv import ARCHITECTURES, DEFAULT_SEED, SIZES, KVLlama, build_hf, hf_greedy, kv_greedy  # noqa: E402

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", choices=sorted(SIZES), default="small")
    p.add_argument("--arch", choices=sorted(ARCHITECTURES), default="llama",
                   help="the Hugging Face architecture (llama_kv.py ARCHITECTURES), random weights of --size's "
                        "dimensions; default llama")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--prefill-max", type=int, default=None,
                   help="export `prefill` with a dynamic prompt length (a torch.export Dim in [2, N]): one "
                        "engine per size 2, 4, 8, ..., N (get_prefill_sizes); llm_generate feeds any prompt "
                        "as chunks of those sizes (a last single token through `decode`). Default: the "
                        "prompt length is fixed at --prompt-len")
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--max-len", type=int, default=None,
                   help="KV cache length (default: prompt + new tokens, rounded up to 64)")
    p.add_argument("--seed", type=int, default=DEFAULT_SEED)
    p.add_argument("--logits", action="store_true", help="methods also return the logits [1, vocab]")
    p.add_argument("--reference", action="store_true", help="write HF greedy tokens (float32) to compare with")
    p.add_argument("--external-weights", action="store_true", help="weights to a .ptd beside the .pte")
    p.add_argument("--no-cuda-graphs", action="store_true", help="do not bake CUDA-graph replay into the engines")
    p.add_argument("--no-overlap-launches", action="store_true",
                   help="kiln.compile(overlap_launches=False): classic kernel launches (for an A/B)")
    p.add_argument("--target-sms", default="87,90")
    p.add_argument("--persistent-decode", action="store_true",
                   help="the decode layers as one persistent kernel (kiln.compile's persistent_decode; "
                        "needs --target-sms of sm_90 or newer only)")
    p.add_argument("--decode-options", default="",
                   help="with --persistent-decode: the kernel's tuning options as name=value,... "
                        "(kiln.compile's persistent_decode_options, e.g. counted_rows=1,kv_rows=0)")
    p.add_argument("--device-io", action="store_true",
                   help="methods take and return CUDA tensors (ExecuTorch's device-resident I/O): "
                        "llm_generate --device_io keeps the tokens on the GPU between steps")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    if args.prompt_len < 1 or args.new_tokens < 1:
        p.error("--prompt-len and --new-tokens must be >= 1")
    try:
        args.decode_options = parse_persistent_decode_options(args.decode_options)
    except ValueError as e:
        p.error(f"--decode-options: {e}")
    if args.decode_options and not args.persistent_decode:
        p.error("--decode-options needs --persistent-decode")
    if args.max_len is None:
        args.max_len = (args.prompt_len + args.new_tokens + 63) // 64 * 64
    if args.prefill_max is not None and args.prefill_max < 2:
        p.error("--prefill-max must be >= 2")
    if args.max_len < args.prompt_len + args.new_tokens:
        p.error(f"--max-len {args.max_len} is shorter than prompt + new tokens "
                f"({args.prompt_len + args.new_tokens})")
    return args


def prompt_ids(vocab: int, length: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed + 1)
    return torch.randint(1, vocab, (1, length), generator=gen)


def main(argv=None) -> None:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    size = SIZES[args.size]
    dtype = DTYPES[args.dtype]
    stem = f"{args.arch}_{args.size}_{args.dtype}"
    t0 = time.time()
    lm = build_hf(args.size, args.seed, dtype, arch=args.arch)
    params = sum(p.numel() for p in lm.parameters())
    model = KVLlama(lm, args.max_len, return_logits=args.logits).eval()
    p = args.prompt_len
    prompt = prompt_ids(size.vocab, p, args.seed)
    constants = {"get_max_seq_len": args.max_len, "get_prompt_len": p, "get_vocab_size": size.vocab}
    prefill_sizes = None
    if args.prefill_max is None:
        prefill = torch.export.export(model, (prompt, torch.arange(p)))
    else:  # the prompt length is a Dim: one engine per size bucket
        length = torch.export.Dim("prompt", min=2, max=args.prefill_max)
        example = prompt_ids(size.vocab, max(p, 2), args.seed)
        prefill = torch.export.export(model, (example, torch.arange(example.shape[1])),
                                      dynamic_shapes=({1: length}, {0: length}))
        prefill_sizes = _dynamic.buckets(2, args.prefill_max, ())
        constants["get_prefill_sizes"] = prefill_sizes
    programs = {
        "prefill": prefill,
        "decode": torch.export.export(model, (prompt[:, :1], torch.tensor([p]))),
    }
    print(f"export_llama: {args.arch} {args.size} ({params / 1e6:.1f}M parameters, {args.dtype}), torch.export "
          f"{time.time() - t0:.1f} s", flush=True)
    compiled = kiln.compile(
        programs, target_sms=[int(s) for s in args.target_sms.split(",")],
        use_cuda_graphs=not args.no_cuda_graphs, overlap_launches=not args.no_overlap_launches,
        persistent_decode=args.persistent_decode, persistent_decode_options=args.decode_options or None,
        model_id=f"{args.arch}-{args.size}-{args.dtype}-{args.seed}",
        shape_buckets=prefill_sizes, constant_methods=constants)
    if compiled.summary.ops_on_cpu:
        raise SystemExit(f"export_llama: ops left to the CPU: {compiled.summary.ops_on_cpu}")
    pte = args.out / f"{stem}.pte"
    ptd = args.out / f"{stem}.ptd" if args.external_weights else None
    kiln.save(compiled, pte, external_weights=ptd,
              backend_config=device_resident_config() if args.device_io else None)
    print(f"export_llama: wrote {pte} ({pte.stat().st_size / 2**20:.1f} MiB)"
          + (f" and {ptd} ({ptd.stat().st_size / 2**20:.1f} MiB)" if ptd else "")
          + f" in {time.time() - t0:.1f} s", flush=True)
    (args.out / "prompt.txt").write_text(",".join(str(int(t)) for t in prompt[0]) + "\n")
    manifest = {"arch": args.arch, "size": args.size, "config": asdict(size), "dtype": args.dtype, "seed": args.seed,
                "parameters": params, "prompt_len": p, "new_tokens": args.new_tokens, "max_len": args.max_len,
                "logits": args.logits, "pte": pte.name, "ptd": ptd.name if ptd else None,
                "prefill_sizes": prefill_sizes, "device_io": args.device_io}
    if args.reference:
        ref_lm = build_hf(args.size, args.seed, torch.float32, arch=args.arch)
        tokens = hf_greedy(ref_lm, prompt, args.new_tokens)
        # The export wrapper in float32 must agree with HF before anything is
        # compared on the GPU; its logits along HF's tokens are the reference.
        wrapper = KVLlama(ref_lm, args.max_len, return_logits=True).eval()
        mine, logits = kv_greedy(wrapper, prompt, args.new_tokens)
        if mine != tokens:
            raise SystemExit(f"export_llama: the KV-cache wrapper's greedy tokens differ from HF generate: "
                             f"{mine[:8]}... vs {tokens[:8]}...")
        (args.out / "expected_tokens.txt").write_text(",".join(map(str, tokens)) + "\n")
        np.stack([lg[0].float().numpy() for lg in logits]).astype(np.float32).tofile(args.out / "expected_logits.f32")
        manifest["reference"] = {"tokens": "expected_tokens.txt", "logits": "expected_logits.f32",
                                 "how": f"transformers {type(ref_lm).__name__}.generate, greedy, float32, CPU"}
        print(f"export_llama: HF greedy reference: {tokens[:12]}...", flush=True)
    (args.out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")


if __name__ == "__main__":
    main()
