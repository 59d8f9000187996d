"""Where PyTorch's time goes on a benchmark model: runs torch.profiler over the
eager (or torch.compile) peer of examples/vision_models.py and prints its CUDA
kernels grouped into the same buckets as tools/profile_summary.py prints for a
Kiln step profile (gemm, attention, norm, elementwise, other), so the two can be
read side by side.

    python3 benchmarks/profile_peer.py --model vit_b_16 --batch 8 --dtype float16 \
        [--mode eager|reduce_overhead] [--runs 20] [--top 15]

GPU only (it exits with a message on a machine without CUDA).
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import vision_models  # noqa: E402
from profile_summary import bucket_of  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--mode", default="eager", choices=("eager", "reduce_overhead"))
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--top", type=int, default=15)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("profile_peer.py: no CUDA device; this profiles PyTorch on the GPU machine")
        return 2
    dtype = getattr(torch, args.dtype)
    model, _ = vision_models.build(args.model, args.batch, dtype)
    model = model.cuda().eval()
    inputs = tuple(t.cuda() for t in vision_models.random_inputs(args.model, args.batch, dtype))
    fn = model if args.mode == "eager" else torch.compile(model, mode="reduce-overhead")
    with torch.no_grad():
        for _ in range(5):
            fn(*inputs)
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(args.runs):
                fn(*inputs)
            torch.cuda.synchronize()
    kernels = collections.Counter()
    counts = collections.Counter()
    for ev in prof.key_averages():
        if ev.device_type != torch.autograd.DeviceType.CUDA:
            continue
        us = ev.self_device_time_total / args.runs
        if us <= 0:
            continue
        kernels[ev.key] += us
        counts[ev.key] += ev.count / args.runs
    total = sum(kernels.values())
    buckets = collections.Counter()
    for name, us in kernels.items():
        buckets[bucket_of(name)] += us
    print(f"torch profile: {args.model} b{args.batch} {args.dtype} {args.mode}: {total:.1f} us of kernels per run")
    for b, us in buckets.most_common():
        print(f"torch bucket: {b:12s} {us:9.1f} us {100 * us / total:5.1f}%")
    for name, us in kernels.most_common(args.top):
        print(f"torch kernel: {us:9.1f} us x{counts[name]:5.1f}  {name[:140]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
