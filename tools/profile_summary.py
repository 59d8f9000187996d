"""Sums a Kiln step profile (the "kiln profile:" lines that KILN_PROFILE_STEPS=1
makes the runtime print, see docs/user_guide.md) into buckets: gemm, conv,
attention, norm, softmax, elementwise, gather, layout, other. Also used by
benchmarks/profile_peer.py to bucket PyTorch's kernels the same way.

    KILN_PROFILE_STEPS=1 kiln_runner --model_path=m.pte ... 2>&1 | python3 tools/profile_summary.py
    python3 tools/profile_summary.py profile.txt [more.txt ...]
"""

from __future__ import annotations

import collections
import re
import sys

# First match wins; patterns see Kiln step summaries ("gemm m=.. n=..",
# "kernel kiln_<family>_..") and PyTorch/cuBLAS/Triton kernel names.
_BUCKETS = (
    ("attention", r"attention|flash|fmha|sdpa|efficient_attention"),
    # before norm/elementwise: Kiln's matrix-vector kernels carry their fused
    # prologue/epilogue in the label ("rms_norm+linear kernel kiln_gemv_5")
    ("gemm", r"^gemm |gemm|gemv|cutlass|xmma|sm90_|sm80_|ampere_|cublas|nvjet|matmul|bmm"),
    ("conv", r"^conv |conv|implicit|winograd|depthwise"),
    ("softmax", r"softmax"),
    ("norm", r"norm|rms|triton_red|triton_per"),
    ("gather", r"gather|embedding|index"),
    ("layout", r"copy|permute|transpose|cat|layout|slice"),
    ("elementwise", r"elementwise|vectorized|unrolled|triton_poi|gelu|add|mul|pointwise"),
)


def bucket_of(name: str) -> str:
    low = name.lower()
    for bucket, pattern in _BUCKETS:
        if re.search(pattern, low):
            return bucket
    return "other"


_LINE = re.compile(r"kiln profile:\s+([0-9.]+) us\s+[0-9.]+%\s+step\s+\d+\s+(.*)$")


def summarize(lines) -> tuple[collections.Counter, collections.Counter, float]:
    us_by_bucket, steps_by_bucket = collections.Counter(), collections.Counter()
    for line in lines:
        m = _LINE.search(line)
        if not m:
            continue
        b = bucket_of(m.group(2))
        us_by_bucket[b] += float(m.group(1))
        steps_by_bucket[b] += 1
    return us_by_bucket, steps_by_bucket, sum(us_by_bucket.values())


def main(argv: list[str]) -> int:
    sources = [open(p) for p in argv] if argv else [sys.stdin]
    for src in sources:
        us, n, total = summarize(src)
        if not total:
            print(f"{getattr(src, 'name', 'stdin')}: no 'kiln profile:' lines")
            continue
        print(f"kiln buckets ({getattr(src, 'name', 'stdin')}): {total:.1f} us in steps")
        for b, t in us.most_common():
            print(f"kiln bucket: {b:12s} {t:9.1f} us {100 * t / total:5.1f}%  {n[b]:4d} steps")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
