"""CUDA-event timing of a PyTorch callable, the same method kiln_runner
--cuda_events uses: an event recorded on the current stream before and after
each call, then a wait on the second event, so each call is timed alone
(latency: launch overhead included, nothing pipelined). Median of `runs`
calls after `warmup` untimed ones."""

from __future__ import annotations

import statistics

import torch


def summarize(times_ms: list[float]) -> dict:
    s = sorted(times_ms)

    def pct(p):
        pos = p * (len(s) - 1)
        lo = int(pos)
        hi = min(lo + 1, len(s) - 1)
        return s[lo] * (1 - (pos - lo)) + s[hi] * (pos - lo)

    return {"median_ms": pct(0.5), "p10_ms": pct(0.1), "p90_ms": pct(0.9), "mean_ms": statistics.fmean(s),
            "min_ms": s[0], "max_ms": s[-1], "runs": len(s)}


def time_callable(fn, x, warmup: int, runs: int, before_call=None) -> dict:
    """`before_call` (e.g. torch.compiler.cudagraph_mark_step_begin) runs
    before each call, outside the timed region. `x`: the input, or a tuple of
    inputs."""
    args = x if isinstance(x, tuple) else (x,)
    for _ in range(warmup):
        if before_call:
            before_call()
        fn(*args)
    torch.cuda.synchronize()
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    stream = torch.cuda.current_stream()
    times = []
    for _ in range(runs):
        if before_call:
            before_call()
        start.record(stream)
        fn(*args)
        end.record(stream)
        end.synchronize()
        times.append(start.elapsed_time(end))
    return summarize(times)
