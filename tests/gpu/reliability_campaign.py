#!/usr/bin/env python3
"""Damaged-file campaign: makes damaged copies of each sample .pte (1, 8 and 64
random bit flips, truncations), runs each with kiln_runner against the
sample's expected outputs, and classifies every run:

  ok       exit 0: ran and matched the expected outputs (damage in bytes that
           do not matter, e.g. padding)
  refused  exit 2/3/4: a clean error
  wrong    exit 1: ran and answered wrong (must never happen)
  crash    killed by a signal, or any other exit status
  hang     did not finish within --timeout seconds

Prints a table (sample x damage kind) and a summary line, writes
results.json and table.md to --out, keeps every wrong/crash/hang copy in
--out/keep/, and exits 1 if any run was wrong, crashed or hung.

On a machine without a GPU every intact sample is 'refused' (the runner
exits 3: no GPU), so the damaged ones can be too; the campaign then checks
the parsing side only. Samples come from tests/fuzz/export_samples.py
(samples.json beside the .pte files). Standard library only: runs on the GPU
machine with its plain Python.

    python3 tests/gpu/reliability_campaign.py --samples DIR --runner build-gpu/tools/kiln_runner/kiln_runner \\
        --out out/reliability [--copies 50] [--seed 13] [--jobs 8]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

CLASSES = ("ok", "refused", "wrong", "crash", "hang")
KINDS = ("flip1", "flip8", "flip64", "truncate")


def damage(data: bytes, kind: str, rng: random.Random) -> bytes:
    b = bytearray(data)
    if kind == "truncate":
        return bytes(b[: rng.randrange(len(b))])
    flips = int(kind[len("flip"):])
    for _ in range(flips):
        b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
    return bytes(b)


def classify(returncode: int | None) -> str:
    if returncode is None:
        return "hang"
    if returncode == 0:
        return "ok"
    if returncode == 1:
        return "wrong"
    if returncode in (2, 3, 4):
        return "refused"
    return "crash"  # negative: killed by a signal; anything else is unexpected


def run_one(runner: Path, pte: Path, sample: dict, sample_dir: Path, timeout: float) -> tuple[str, int | None, str]:
    cmd = [str(runner), f"--model_path={pte}", f"--inputs={sample_dir / sample['inputs']}",
           f"--expected={sample_dir / sample['expected']}", f"--rtol={sample['rtol']}",
           "--warmup=0", "--num_runs=1"]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, errors="replace")
    except subprocess.TimeoutExpired:
        return "hang", None, ""
    tail = (done.stderr.strip().splitlines() or [""])[-1][:200]
    return classify(done.returncode), done.returncode, tail


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", required=True, type=Path, help="directory with samples.json")
    parser.add_argument("--runner", required=True, type=Path, help="kiln_runner binary")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--copies", type=int, default=50, help="damaged copies per sample and kind")
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--jobs", type=int, default=min(8, os.cpu_count() or 1))
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per run before 'hang'")
    args = parser.parse_args(argv)

    samples = json.loads((args.samples / "samples.json").read_text())
    work = args.out / "damaged"
    keep = args.out / "keep"
    work.mkdir(parents=True, exist_ok=True)
    keep.mkdir(parents=True, exist_ok=True)

    # Intact samples first: the baseline every damaged copy is judged against.
    baseline = {}
    for s in samples:
        cls, rc, tail = run_one(args.runner, args.samples / s["pte"], s, args.samples, args.timeout)
        baseline[s["name"]] = cls
        print(f"intact {s['name']}: {cls} (exit {rc}){'' if cls == 'ok' else ': ' + tail}")
    gpu = all(c == "ok" for c in baseline.values())
    if not gpu:
        print("not every intact sample runs here (no GPU?): damaged copies can only be refused, "
              "never ok; the campaign checks the parsing side")

    jobs = []
    for s in samples:
        data = (args.samples / s["pte"]).read_bytes()
        for kind in KINDS:
            for copy in range(args.copies):
                rng = random.Random(f"{args.seed}/{s['name']}/{kind}/{copy}")
                path = work / f"{s['name']}.{kind}.{copy}.pte"
                path.write_bytes(damage(data, kind, rng))
                jobs.append((s, kind, copy, path))

    start = time.monotonic()
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        results = list(pool.map(lambda j: (j, run_one(args.runner, j[3], j[0], args.samples, args.timeout)), jobs))
    seconds = time.monotonic() - start

    counts: dict[tuple[str, str], dict[str, int]] = {}
    records = []
    for (s, kind, copy, path), (cls, rc, tail) in results:
        counts.setdefault((s["name"], kind), dict.fromkeys(CLASSES, 0))[cls] += 1
        records.append({"sample": s["name"], "kind": kind, "copy": copy, "class": cls, "exit": rc, "stderr_tail": tail})
        if cls in ("wrong", "crash", "hang"):
            shutil.copy(path, keep / path.name)
            print(f"{cls.upper()}: {path.name} (exit {rc}) {tail}")
        path.unlink()

    header = "| sample | damage | " + " | ".join(CLASSES) + " |"
    lines = [header, "|" + "---|" * (len(CLASSES) + 2)]
    totals = dict.fromkeys(CLASSES, 0)
    for (name, kind), c in counts.items():
        lines.append(f"| {name} | {kind} | " + " | ".join(str(c[k]) for k in CLASSES) + " |")
        for k in CLASSES:
            totals[k] += c[k]
    lines.append("| **all** | | " + " | ".join(f"**{totals[k]}**" for k in CLASSES) + " |")
    table = "\n".join(lines)
    print(table)
    bad = totals["wrong"] + totals["crash"] + totals["hang"]
    summary = (f"reliability: {len(records)} damaged runs in {seconds:.0f} s ({'GPU' if gpu else 'no GPU'}): "
               + ", ".join(f"{totals[k]} {k}" for k in CLASSES))
    print(summary)
    (args.out / "table.md").write_text(table + "\n\n" + summary + "\n")
    (args.out / "results.json").write_text(json.dumps(
        {"seed": args.seed, "copies": args.copies, "gpu": gpu, "baseline": baseline,
         "totals": totals, "runs": records}, indent=1))
    shutil.rmtree(work, ignore_errors=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
