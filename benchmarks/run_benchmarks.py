#!/usr/bin/env python3
"""GPU machine: Kiln against PyTorch, in one run, fp16, batch 1 and 8.

For each selected model and batch (entries of the carried manifest_vision.json,
dtype float16): rebuilds the model from examples/vision_models.py (checksum
checked against the manifest), then times

  kiln plain / kiln graphs  kiln_runner on the carried .pte, --device_io=true
                            (inputs and outputs stay on the GPU), --cuda_events=true,
                            --use_cuda_graphs=false / true, --timing_json
  eager                     the nn.Module
  compile                   torch.compile(model)
  max_autotune              torch.compile(model, mode="max-autotune-no-cudagraphs")
  reduce_overhead           torch.compile(model, mode="reduce-overhead") (CUDA graphs)
  max_autotune_graphs       torch.compile(model, mode="max-autotune") (autotuned kernels and
                            CUDA graphs; opt in, its autotuning takes minutes a model)
  aoti                      torch._inductor.aoti_compile_and_package + aoti_load_package,
                            in a subprocess (benchmarks/aoti_peer.py); when the package
                            loader fails, the lower-level AOTIModelContainerRunnerCuda

Conv models run the peers in channels_last (model and input), which is what a
PyTorch user does for fp16 convnets on tensor cores; the MLP is 2-D. All
timing: CUDA events around each call, a wait after each (latency), median of
--runs runs after --warmup. One peer failing (exception, time budget, crash)
is recorded with its reason and never stops the run. Results are written after
every measurement: benchmarks/results/<date>_<commit>.{json,md} and latest.md
(--results-dir). Runs split over several calls merge with
benchmarks/results_table.py --merge.

    PYTHONUNBUFFERED=1 python3 benchmarks/run_benchmarks.py --carry .gpu_carry \\
        --runner build-gpu/tools/kiln_runner/kiln_runner [--models resnet50,mlp_policy] \\
        [--batches 1,8] [--peers kiln,eager,compile,max_autotune,reduce_overhead,aoti] \\
        [--runs 200] [--warmup 20] [--peer-budget-s 240] [--deadline-s 560]
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT / "benchmarks"))
import results_table  # noqa: E402
import vision_bundle  # noqa: E402
import vision_models  # noqa: E402
from peer_timing import time_callable  # noqa: E402

ALL_PEERS = ("kiln",) + results_table.PEERS
# Cheapest first: peers run in the order given, one peer across all models at
# a time, so a deadline drops the costliest compiles, not whole models.
DEFAULT_PEERS = ("kiln", "eager", "reduce_overhead", "compile", "max_autotune", "aoti")
COMPILE_MODES = {"compile": None, "max_autotune": "max-autotune-no-cudagraphs", "reduce_overhead": "reduce-overhead",
                 "max_autotune_graphs": "max-autotune"}


class BudgetExceeded(Exception):
    pass


def _alarm(_signum, _frame):
    raise BudgetExceeded("time budget exceeded")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def gpu_meta(args) -> dict:
    meta = {"date": datetime.date.today().isoformat(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "gpu": torch.cuda.get_device_name(), "runs": args.runs, "warmup": args.warmup,
            "peer_memory_format": "channels_last" if not args.no_channels_last else "contiguous",
            "kiln_runner_flags": "--device_io=true --cuda_events=true", "args": " ".join(sys.argv[1:])}
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout.strip().splitlines()[0]
        meta["gpu"], meta["driver"] = [s.strip() for s in smi.split(",")][:2]
    except Exception as e:  # noqa: BLE001
        meta["driver"] = f"unknown ({e})"
    commit = args.commit
    if not commit:
        for p in (Path(args.carry) / "COMMIT",):
            if p.is_file():
                commit = " ".join(p.read_text().split())
        if not commit:
            commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                    cwd=ROOT).stdout.strip() or "unknown"
    meta["commit"] = commit
    return meta


def run_kiln(entry: dict, args, graphs: bool, work: Path) -> dict:
    timing = work / f"{entry['name']}.{'graphs' if graphs else 'plain'}.timing.json"
    cmd = [str(args.runner), f"--model_path={entry['pte_path']}", "--device_io=true", "--cuda_events=true",
           f"--use_cuda_graphs={'true' if graphs else 'false'}", f"--num_runs={args.runs}",
           f"--warmup={args.warmup}", f"--timing_json={timing}", "--seed=1"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.peer_budget_s)
    except subprocess.TimeoutExpired:
        return {"status": "failed", "error": f"kiln_runner timed out after {args.peer_budget_s} s"}
    if proc.returncode != 0 or not timing.exists():
        return {"status": "failed", "error": f"kiln_runner exit {proc.returncode}: "
                + (proc.stderr.strip() or proc.stdout.strip())[-600:]}
    t = json.loads(timing.read_text())
    return {"status": "ok", **{k: t[k] for k in ("median_ms", "p10_ms", "p90_ms", "mean_ms", "min_ms", "max_ms",
                                                 "load_ms", "counters")},
            "runs": t["num_runs"], "memory_bytes": t.get("gpu_memory_used_bytes"), "delegates": t.get("delegates")}


def run_compiled_peer(name: str, model, x, args) -> dict:
    torch._dynamo.reset()
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    before = None
    if name == "eager":
        fn = model
    else:
        fn = torch.compile(model, mode=COMPILE_MODES[name])
        if name in ("reduce_overhead", "max_autotune_graphs"):
            before = torch.compiler.cudagraph_mark_step_begin
    result = {}
    signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(int(args.peer_budget_s))
    try:
        with torch.no_grad():
            t = time.perf_counter()
            if before:
                before()
            fn(*x)  # compiles
            torch.cuda.synchronize()
            if name != "eager":
                result["compile_s"] = time.perf_counter() - t
            result.update(time_callable(fn, x, args.warmup, args.runs, before_call=before))
    finally:
        signal.alarm(0)
    result["memory_bytes"] = torch.cuda.max_memory_allocated()
    result["status"] = "ok"
    return result


def run_aoti(entry: dict, args, work: Path, channels_last: bool) -> dict:
    """AOTInductor in a child process: package loader first, then the
    container runner, then the C++ package loader on the same package, each
    tried when the ones before it fail."""
    attempts = []
    package = None
    for loader in ("package", "runner", "cpp"):
        out = work / f"{entry['name']}.aoti.{loader}.json"
        cmd = [sys.executable, str(ROOT / "benchmarks" / "aoti_peer.py"), "--model", entry["model"],
               "--batch", str(entry["batch"]), "--dtype", entry["dtype"], "--runs", str(args.runs),
               "--warmup", str(args.warmup), "--loader", loader, "--work", str(work / "aoti"),
               "--out", str(out), "--checksum", entry["checksum"]]
        if channels_last:
            cmd.append("--channels-last")
        if package:
            cmd += ["--package", package]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.peer_budget_s,
                                  env={**os.environ, "PYTHONUNBUFFERED": "1"})
        except subprocess.TimeoutExpired as e:
            text = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
            stages = [l for l in text.splitlines() if l.startswith("stage:")]
            attempts.append(f"{loader}: timed out after {args.peer_budget_s} s in {stages[-1] if stages else '?'}")
            break
        text = proc.stdout + proc.stderr
        for line in proc.stdout.splitlines():
            if line.startswith("package: "):
                package = line.split(": ", 1)[1]
        if proc.returncode == 0 and out.exists():
            result = json.loads(out.read_text())
            if attempts:
                result["note"] = "; ".join(attempts)
            return result
        stages = [l for l in proc.stdout.splitlines() if l.startswith("stage:")]
        how = f"killed by signal {-proc.returncode} ({signal.Signals(-proc.returncode).name})" \
            if proc.returncode < 0 else f"exit {proc.returncode}"
        tail = " | ".join(l for l in text.strip().splitlines()[-6:])
        attempts.append(f"{loader} loader: {how} in '{stages[-1] if stages else '?'}': {tail[-500:]}")
        log(f"  aoti ({loader}) failed: {attempts[-1][:300]}")
        if package is None:
            break  # export/compile failed: no package to retry with
    return {"status": "failed", "error": "; ".join(attempts)}


def build_peer_model(model_name: str, batch: int, args):
    """The fp16 model on the GPU with the export's weights (checksum returned
    for checking), a fresh random input, channels_last for convnets."""
    model, _ = vision_models.build(model_name, batch, torch.float16)
    checksum = vision_models.checksum(model)
    channels_last = model_name in vision_models.CONV_MODELS and not args.no_channels_last
    model = model.cuda()
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    x = vision_models.random_inputs(model_name, batch, torch.float16, "cuda")
    if channels_last:
        x = tuple(t.contiguous(memory_format=torch.channels_last) for t in x)
    return model, x, checksum, channels_last


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--carry", default=".gpu_carry", help="carry folder holding vision_* groups (or one group)")
    parser.add_argument("--runner", type=Path, default=ROOT / "build-gpu/tools/kiln_runner/kiln_runner")
    parser.add_argument("--models", default=",".join(vision_models.MODELS))
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--peers", default=",".join(DEFAULT_PEERS),
                        help=f"subset of {','.join(ALL_PEERS)}, run in this order (kiln always first)")
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--peer-budget-s", type=float, default=240, help="time budget of one peer (compile included)")
    parser.add_argument("--deadline-s", type=float, default=0,
                        help="skip what is left once this many seconds have passed (0: none)")
    parser.add_argument("--no-channels-last", action="store_true")
    parser.add_argument("--results-dir", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--stem", help="results file stem (default <date>_<commit>)")
    parser.add_argument("--commit")
    args = parser.parse_args()
    t0 = time.perf_counter()
    models = [m for m in args.models.split(",") if m]
    batches = [int(b) for b in args.batches.split(",") if b]
    peers = [p for p in args.peers.split(",") if p]
    bad = [p for p in peers if p not in ALL_PEERS]
    if bad:
        parser.error(f"unknown peers {bad}; known: {','.join(ALL_PEERS)}")
    if not torch.cuda.is_available():
        print("run_benchmarks.py: no CUDA GPU here (torch.cuda.is_available() is False); "
              "run it on the GPU machine (scripts/gpu_bench.sh)", file=sys.stderr)
        return 2
    torch.backends.cudnn.benchmark = True  # what a PyTorch user benchmarking a convnet sets
    meta = gpu_meta(args)
    log(f"GPU {meta['gpu']} driver {meta.get('driver')} torch {meta['torch']} commit {meta['commit']}")
    work = Path(tempfile.mkdtemp(prefix="kiln_bench_"))
    # The manifest gives the .pte, the export time and the checksum to verify.
    entries = vision_bundle.load_entries([args.carry], unpack_dir=work / "pte")
    log(f"{len(entries)} carried programs ({sum(e['dtype'] == 'float16' for e in entries)} float16)")
    by_key = {(e["model"], e["batch"]): e for e in entries if e["dtype"] == "float16"}
    result = {"meta": meta, "rows": []}

    def save():
        results_table.write_results(result, args.results_dir, args.stem)

    def late():
        return args.deadline_s and time.perf_counter() - t0 > args.deadline_s

    rows = []
    for model_name in models:
        for batch in batches:
            entry = by_key.get((model_name, batch))
            row = {"model": model_name, "batch": batch, "dtype": "float16", "kiln": {}, "peers": {}}
            if entry:
                row.update({k: entry.get(k) for k in ("export_s", "pte_bytes", "cpu_fallback_ops")})
            result["rows"].append(row)
            rows.append((row, entry))

    # Kiln first (seconds per model), then one peer at a time across every
    # model, in the order --peers gives: a deadline then drops the last
    # (costliest) peers, never whole models.
    if "kiln" in peers:
        for row, entry in rows:
            for mode, graphs in (("plain", False), ("graphs", True)):
                if entry is None:
                    row["kiln"][mode] = {"status": "skipped", "error": "no float16 entry in the carried manifest"}
                elif late():
                    row["kiln"][mode] = {"status": "skipped", "error": "deadline"}
                else:
                    log(f"{row['model']} b{row['batch']}: kiln {mode}")
                    row["kiln"][mode] = run_kiln(entry, args, graphs, work)
                    log(f"  -> {results_table._fmt_ms(row['kiln'][mode])} ms {row['kiln'][mode].get('error', '')[:300]}")
                save()
    for p in [p for p in peers if p in results_table.PEERS]:
        for row, entry in rows:
            model_name, batch = row["model"], row["batch"]
            if late():
                row["peers"][p] = {"status": "skipped", "error": "deadline"}
                continue
            try:
                model, x, checksum, channels_last = build_peer_model(model_name, batch, args)
                row["checksum_ok"] = entry is None or checksum == entry["checksum"]
                if not row["checksum_ok"]:
                    log(f"WARNING {model_name}: state-dict checksum differs from the exported model's")
            except Exception as e:  # noqa: BLE001
                row["peers"][p] = {"status": "failed", "error": f"model build: {e!r}"}
                save()
                continue
            log(f"{model_name} b{batch}: {p}")
            try:
                if p == "aoti":
                    row["peers"][p] = run_aoti(entry or {"name": f"{model_name}_fp16_b{batch}", "model": model_name,
                                                         "batch": batch, "dtype": "float16", "checksum": checksum},
                                               args, work, channels_last)
                else:
                    row["peers"][p] = run_compiled_peer(p, model, x, args)
            except BaseException as e:  # noqa: BLE001 - a peer never stops the run
                if isinstance(e, KeyboardInterrupt):
                    raise
                row["peers"][p] = {"status": "failed", "error": f"{type(e).__name__}: {e}"[:800],
                                   "traceback": traceback.format_exc()[-2000:]}
            run = row["peers"][p]
            extra = f" (compile {run['compile_s']:.1f} s)" if run.get("compile_s") else ""
            log(f"  -> {results_table._fmt_ms(run)} ms{extra} {str(run.get('error', ''))[:300]}")
            save()
            del model, x
            torch._dynamo.reset()
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
    for row, _ in rows:
        r = results_table.ratio(row)
        log(f"{row['model']} b{row['batch']}: ratio best peer / Kiln = {'-' if r is None else f'{r:.2f}x'}")
    js, md = results_table.write_results(result, args.results_dir, args.stem)
    print(md.read_text())
    log(f"wrote {js} and {md} in {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
