"""Per-kernel table of one run of a Kiln method from Nsight Compute's raw CSV:
how long each kernel family takes, how many DRAM bytes it reads, and the
bandwidth that gives. scripts/gpu_ncu.sh makes the CSV on the GPU machine:

    ncu --clock-control none --csv --page raw \
        --metrics gpu__time_duration.sum,dram__bytes_read.sum,launch__registers_per_thread \
        kiln_runner --model_path=m.pte --method=decode --use_cuda_graphs=false \
        --num_runs=1 --warmup=1 > decode.csv
    python3 tools/ncu_summary.py decode.csv --last 175 --overhead-us 2.5

ncu runs each kernel alone, caches flushed, so its duration carries a fixed
cost of its own (about 2.5 us on an H100, what a one-block kernel shows);
--overhead-us takes it off each kernel, and the table's total then estimates
what the kernels cost back to back in a CUDA-graph replay. --peak-gbs names
the GPU's bandwidth for the last column (the bytes alone at that rate).
"""

from __future__ import annotations

import argparse
import csv
import io
import re
import sys

_FAMILY = re.compile(r"_\d+$")  # kiln_gemv_12 -> kiln_gemv


def _number(text: str) -> float:
    return float(text.replace(",", ""))


def read_kernels(text: str) -> list[dict]:
    """The kernel rows of ncu's raw CSV (its log lines before the header and
    the units row after it dropped), in launch order."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        raise ValueError("no ncu CSV header (a line starting with \"ID\") in the input")
    rows = [r for r in csv.DictReader(io.StringIO("\n".join(lines[start:]))) if r.get("ID", "").isdigit()]
    for column in ("Kernel Name", "gpu__time_duration.sum"):
        if rows and column not in rows[0]:
            raise ValueError(f"ncu CSV has no column {column!r}: run ncu with --page raw and that metric")
    return rows


def summarize(rows: list[dict], overhead_us: float = 0.0) -> list[dict]:
    """One record a kernel family, largest total first: count, total and mean
    microseconds (each less `overhead_us`, never below 0), DRAM bytes a
    kernel, GB/s over the corrected time, and the last launch's shape."""
    fam = {}
    for r in rows:
        name = _FAMILY.sub("", r["Kernel Name"])
        us = max(0.0, _number(r["gpu__time_duration.sum"]) / 1e3 - overhead_us)
        by = _number(r["dram__bytes_read.sum"]) if r.get("dram__bytes_read.sum") else 0.0
        f = fam.setdefault(name, {"kernel": name, "count": 0, "us": 0.0, "bytes": 0.0})
        f["count"] += 1
        f["us"] += us
        f["bytes"] += by
        f["launch"] = f"{r.get('Grid Size', '?')} x {r.get('Block Size', '?')}"
        if r.get("launch__registers_per_thread"):
            f["launch"] += f", {r['launch__registers_per_thread']} regs"
    out = sorted(fam.values(), key=lambda f: -f["us"])
    for f in out:
        f["mean_us"] = f["us"] / f["count"]
        f["bytes_each"] = f["bytes"] / f["count"]
        f["gbs"] = f["bytes"] / (f["us"] * 1e3) if f["us"] > 0 else 0.0
    return out


def render(families: list[dict], peak_gbs: float | None = None) -> str:
    total = sum(f["us"] for f in families)
    head = ("| kernel | count | total us | us each | MB each | GB/s |" + (" bytes alone, us |" if peak_gbs else "")
            + " last launch |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for f in families:
        row = (f"| {f['kernel']} | {f['count']} | {f['us']:.1f} | {f['mean_us']:.2f} | "
               f"{f['bytes_each'] / 1e6:.2f} | {f['gbs']:.0f} |")
        if peak_gbs:
            row += f" {f['bytes_each'] / (peak_gbs * 1e3):.2f} |"
        row += f" {f['launch']} |"
        lines.append(row)
    lines.append(f"\ntotal {total:.1f} us over {sum(f['count'] for f in families)} kernels")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("csv", help="ncu --csv --page raw output ('-' for stdin)")
    p.add_argument("--last", type=int, default=0, help="only the last N kernels (one run after warm-up runs)")
    p.add_argument("--overhead-us", type=float, default=0.0, help="ncu's own cost to take off each kernel")
    p.add_argument("--peak-gbs", type=float, default=None, help="GPU bandwidth in GB/s, for the last column")
    a = p.parse_args(argv)
    text = sys.stdin.read() if a.csv == "-" else open(a.csv, encoding="utf-8", errors="replace").read()
    try:
        rows = read_kernels(text)
    except ValueError as e:
        print(f"ncu_summary: {a.csv}: {e}", file=sys.stderr)
        return 2
    if a.last:
        if a.last > len(rows):
            print(f"ncu_summary: {a.csv}: --last {a.last} but only {len(rows)} kernels", file=sys.stderr)
            return 2
        rows = rows[-a.last:]
    print(render(summarize(rows, a.overhead_us), a.peak_gbs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
