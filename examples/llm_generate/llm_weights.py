"""Gets a large model's weights to a machine that cannot receive them (the GPU
machine takes 64 MiB a call) by rebuilding them there from their seed.

The .ptd that `kiln.save(..., external_weights=...)` writes holds each
weight's bytes as Kiln stored them (a merged q/k/v weight is its parts one
after another). `pack` (which needs ExecuTorch, to read the .ptd's segments)
finds every weight of the seeded Hugging Face model in the segments, byte
for byte, and writes a recipe (where each weight goes)
and the .ptd with those bytes zeroed (the skeleton, which compresses to
almost nothing). `unpack`, on the other machine, builds the same seeded model
(tests/gpu/hf_models.py init_weights: numpy's PCG64 stream, same values on
any machine), writes its weights back into the skeleton and checks the
result's sha256 against the original's, so a .ptd that differs by one byte
is refused rather than loaded.

    python3 examples/llm_generate/llm_weights.py pack --ptd out/llm/llama_bench_bfloat16.ptd \\
        --size bench --dtype bfloat16 --out .gpu_carry/llm_bench/recipe
    python3 examples/llm_generate/llm_weights.py unpack --recipe DIR --out DIR/llama_bench_bfloat16.ptd

unpack needs torch, transformers and numpy only (no ExecuTorch, no Kiln).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import lzma
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from llama_kv import ARCHITECTURES, DEFAULT_SEED, SIZES, build_hf  # noqa: E402

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
MIN_BYTES = 4096  # smaller weights stay in the skeleton as they are


def weight_bytes(size: str, seed: int, dtype: str, arch: str = "llama") -> dict[str, bytes]:
    """Each distinct floating tensor of the seeded model, as raw bytes."""
    lm = build_hf(size, seed, DTYPES[dtype], arch=arch)
    out, seen = {}, set()
    for key, t in lm.state_dict(keep_vars=True).items():
        if not t.is_floating_point() or t.data_ptr() in seen:
            continue
        seen.add(t.data_ptr())
        out[key] = t.detach().contiguous().view(torch.uint8).numpy().tobytes()
    return out


def segments(data: bytes) -> list[tuple[int, int]]:
    """(offset, size) of every data segment of a .ptd (ExecuTorch's FlatTensor
    format; read with ExecuTorch's own deserializer, so pack needs it)."""
    from executorch.extension.flat_tensor.serialize.serialize import (
        _deserialize_to_flat_tensor,
        _get_extended_header,
    )

    header = _get_extended_header(data)
    if header is None:
        sys.exit("llm_weights: not an ExecuTorch .ptd (no FlatTensor header)")
    flat = _deserialize_to_flat_tensor(data)
    return [(header.segment_base_offset + seg.offset, seg.size) for seg in flat.segments]


def pack(args: argparse.Namespace) -> None:
    t0 = time.time()
    data = bytearray(args.ptd.read_bytes())
    digest = hashlib.sha256(data).hexdigest()
    weights = weight_bytes(args.size, args.seed, args.dtype, args.arch)
    # A segment is one weight or several one after another (merged
    # projections): match from its start, weight by weight, by a 64-byte
    # prefix and then in full.
    by_prefix: dict[bytes, list[str]] = {}
    for key, b in weights.items():
        if len(b) >= MIN_BYTES:
            by_prefix.setdefault(b[:64], []).append(key)
    view = memoryview(data)
    regions, covered, found = [], 0, set()
    for offset, size in segments(bytes(data)):
        at, end = offset, offset + size
        while at + 64 <= end:
            match = next((k for k in by_prefix.get(bytes(view[at:at + 64]), [])
                          if at + len(weights[k]) <= end and view[at:at + len(weights[k])] == weights[k]), None)
            if match is None:
                break
            regions.append({"key": match, "offset": at, "nbytes": len(weights[match])})
            found.add(match)
            at += len(weights[match])
    for key, b in weights.items():
        if len(b) >= MIN_BYTES and key not in found:
            print(f"llm_weights: {key} ({len(b)} bytes) is not in the .ptd as is; it stays in the skeleton")
    for r in regions:
        data[r["offset"]:r["offset"] + r["nbytes"]] = bytes(r["nbytes"])
        covered += r["nbytes"]
    args.out.mkdir(parents=True, exist_ok=True)
    with lzma.open(args.out / "skeleton.ptd.xz", "wb", preset=6) as f:
        f.write(data)
    recipe = {"arch": args.arch, "size": args.size, "seed": args.seed, "dtype": args.dtype, "ptd_bytes": len(data),
              "ptd_sha256": digest, "regions": regions}
    (args.out / "recipe.json").write_text(json.dumps(recipe, indent=0) + "\n")
    packed = (args.out / "skeleton.ptd.xz").stat().st_size
    print(f"llm_weights: {len(regions)} regions, {covered / len(data):.1%} of {len(data) / 2**20:.1f} MiB rebuilt "
          f"from the seed; skeleton {packed / 2**20:.2f} MiB ({time.time() - t0:.0f} s)")


def unpack(args: argparse.Namespace) -> None:
    t0 = time.time()
    recipe = json.loads((args.recipe / "recipe.json").read_text())
    with lzma.open(args.recipe / "skeleton.ptd.xz") as f:
        data = bytearray(f.read())
    if len(data) != recipe["ptd_bytes"]:
        sys.exit(f"llm_weights: skeleton has {len(data)} bytes, recipe says {recipe['ptd_bytes']}")
    weights = weight_bytes(recipe["size"], recipe["seed"], recipe["dtype"], recipe.get("arch", "llama"))
    for r in recipe["regions"]:
        b = weights.get(r["key"])
        if b is None or len(b) != r["nbytes"]:
            sys.exit(f"llm_weights: weight {r['key']} is {'missing' if b is None else f'{len(b)} bytes'} here; "
                     f"the recipe wants {r['nbytes']} bytes (another transformers version?)")
        data[r["offset"]:r["offset"] + r["nbytes"]] = b
    digest = hashlib.sha256(data).hexdigest()
    if digest != recipe["ptd_sha256"]:
        sys.exit(f"llm_weights: rebuilt .ptd sha256 {digest[:16]}... differs from the exported "
                 f"{recipe['ptd_sha256'][:16]}...: the seeded weights came out differently here")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_bytes(data)
    print(f"llm_weights: wrote {args.out} ({len(data) / 2**20:.1f} MiB, sha256 matches) in {time.time() - t0:.0f} s")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("pack")
    a.add_argument("--ptd", type=Path, required=True)
    a.add_argument("--size", choices=sorted(SIZES), required=True)
    a.add_argument("--arch", choices=sorted(ARCHITECTURES), default="llama")
    a.add_argument("--dtype", choices=sorted(DTYPES), required=True)
    a.add_argument("--seed", type=int, default=DEFAULT_SEED)
    a.add_argument("--out", type=Path, required=True)
    b = sub.add_parser("unpack")
    b.add_argument("--recipe", type=Path, required=True)
    b.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    pack(args) if args.cmd == "pack" else unpack(args)


if __name__ == "__main__":
    main()
