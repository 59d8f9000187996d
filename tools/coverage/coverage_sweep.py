#!/usr/bin/env python3
"""Coverage sweep: exports every torchvision classification and segmentation
model with Kiln (random weights, batch 1, 224x224, float32 and float16) and
writes docs/coverage.md + docs/coverage.json (issue 10, section 4).

    PYTHONPATH=python nice -n 19 python3 tools/coverage/coverage_sweep.py \\
        [--models resnet18,alexnet] [--dtypes float32,float16] [--timeout 480] \\
        [--keep-pte out/coverage/pte] [--fresh]

Each (model, dtype) is exported in its own process (killed after --timeout
seconds) and recorded in --json as soon as it finishes; a second run skips
what the JSON already holds (so an interrupted sweep resumes; --fresh starts
over; --redo exports the --models again, replacing their records; --redo-over
SECONDS exports again those whose recorded export took over SECONDS of CPU). Models are taken in order of parameter count, every float32 export
before the float16 ones. Per export it records: the ops left to ExecuTorch's
CPU kernels (names and counts), the ops that fell back because their
partition failed to compile (each with its reason: before issue 10 those
exports aborted), export seconds (torch.export + kiln.compile + kiln.save),
.pte MiB, parameters, and a status:

  pass      exported, every op inside Kiln engines
  cpu       exported, some ops left to the CPU
  fail      torch.export or ExecuTorch itself could not take the model
  abort     Kiln raised (kiln.compile / kiln.save): must never happen
  timeout   over --timeout seconds
  skipped   over --max-params parameters (reason written)

float16 means model.half(), float16 input, enabled_precisions={torch.float16}
(as benchmarks/export_models.py). Engines are built for --target-sms (default
90, the H200, to keep the sweep short).

GPU check (tools/coverage/gpu_coverage.py on the GPU machine) compares each
kept .pte with PyTorch; --pack makes its carry groups, and --gpu-results
merges its JSON into the table (fp32 / fp16 error columns):

    python3 tools/coverage/coverage_sweep.py --pack .gpu_carry/coverage --keep-pte out/coverage/pte
    python3 tools/coverage/coverage_sweep.py --report --gpu-results out/gpu/coverage_gpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import traceback
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools" / "coverage"))
import zoo  # noqa: E402

SHORT = {"float32": "fp32", "float16": "fp16"}
RTOL = {"float32": 1e-4, "float16": 1e-2}
MARK = "COVERAGE_RESULT "


# ---- one export (child process) ----------------------------------------------


def _git_commit() -> str:
    """The short commit of this checkout, "+dirty" when its code differs from it."""
    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)

    head = git("rev-parse", "--short", "HEAD")
    if head.returncode != 0:
        return "unknown"
    dirty = git("diff", "--quiet", "HEAD", "--", "src", "python", "tools").returncode != 0
    return head.stdout.strip() + ("+dirty" if dirty else "")


def _cpu_seconds() -> float:
    """This process's user + system CPU seconds (NVRTC's threads included)."""
    import resource

    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime


def export_one(name: str, kind: str, dtype_name: str, pte_dir: Path | None, target_sms: list[int] | None) -> dict:
    """target_sms None: kiln's default targets."""
    import logging

    import torch

    sys.path.insert(0, str(ROOT / "python"))
    import kiln

    dtype = {"float32": torch.float32, "float16": torch.float16}[dtype_name]
    record = {"model": name, "kind": kind, "dtype": dtype_name, "seed": zoo.DEFAULT_SEED,
              "input": [1, 3, zoo.INPUT_SIZE, zoo.INPUT_SIZE],
              "target_sms": "default" if target_sms is None else list(target_sms)}
    lines: list[str] = []

    class Capture(logging.Handler):
        def emit(self, rec):
            lines.append(rec.getMessage())

    logger = logging.getLogger("kiln")
    capture, level = Capture(), logger.level
    logger.addHandler(capture)
    logger.setLevel(logging.INFO)
    stage = "build"
    try:
        torch.manual_seed(0)
        model, x = zoo.build(name, dtype)
        record["params"] = sum(p.numel() for p in model.parameters())
        record["checksum"] = zoo.checksum(model)
        with torch.no_grad():
            record["outputs"] = [list(t.shape) for t in zoo.flatten_outputs(model(x))]
        start, cpu_start = time.perf_counter(), _cpu_seconds()
        stage = "torch.export"
        exported = torch.export.export(model, (x,))
        stage = "kiln.compile"
        torch_export_s = time.perf_counter() - start
        compiled = kiln.compile(exported, arg_inputs=(x,), enabled_precisions={dtype}, min_block_size=1,
                                target_sms=None if target_sms is None else tuple(target_sms))
        stage = "kiln.save"
        out_dir = pte_dir or Path(os.environ.get("TMPDIR", "/tmp"))
        pte = kiln.save(compiled, out_dir / f"{name}_{SHORT[dtype_name]}.pte")
        record["export_s"] = round(time.perf_counter() - start, 2)
        record["commit"] = _git_commit()  # the code whose seconds these are
        record["export_cpu_s"] = round(_cpu_seconds() - cpu_start, 2)  # the machine is shared: wall varies
        phases = compiled.saved_phases
        record["phases"] = {"torch.export": round(torch_export_s, 2), **{k: round(v, 2) for k, v in phases.seconds.items()},
                            "kernels": round(phases.kernels, 2)}
        print(phases.line(torch_export_s=torch_export_s), file=sys.stderr, flush=True)
        record["pte_mib"] = round(pte.stat().st_size / 2**20, 2)
        if pte_dir is None:
            pte.unlink()
        else:
            record["pte"] = pte.name
        record["cpu_ops"] = dict(compiled.summary.ops_on_cpu)
        record["partitions"] = compiled.summary.partitions
        record["ops_taken"] = compiled.summary.ops_taken
        record["delegates"] = len(compiled.delegates)
        record["status"] = "cpu" if record["cpu_ops"] else "pass"
    except Exception as e:  # noqa: BLE001 - recorded
        tb = traceback.format_exc()
        kiln_frame = "/python/kiln/" in tb or type(e).__name__ == "CompileError"
        record["status"] = "abort" if stage.startswith("kiln") and kiln_frame else "fail"
        record["reason"] = f"{stage}: {type(e).__name__}: {str(e).strip().splitlines()[0][:300] if str(e).strip() else ''}"
        record["traceback_tail"] = tb.strip().splitlines()[-6:]
    finally:
        logger.removeHandler(capture)
        logger.setLevel(level)
    record["compile_fallbacks"] = [l.removeprefix("kiln: ") for l in lines if ") left to the CPU: " in l]
    record["relowered"] = [l.removeprefix("kiln: ") for l in lines if l.startswith("kiln: lowering again")]
    return record


# ---- the sweep (parent) -------------------------------------------------------


def load_results(path: Path) -> list[dict]:
    return json.loads(path.read_text()) if path.exists() else []


def save_results(path: Path, results: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(results, indent=1))
    tmp.replace(path)


def run_child(name: str, kind: str, dtype: str, args) -> dict:
    cmd = [sys.executable, __file__, "--worker", name, kind, dtype, "--target-sms", args.target_sms]
    if args.keep_pte:
        cmd += ["--keep-pte", str(args.keep_pte)]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "python"), env.get("PYTHONPATH", "")])
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return {"model": name, "kind": kind, "dtype": dtype, "status": "timeout",
                "reason": f"export took over {args.timeout} s on this machine"}
    for line in out.splitlines():
        if line.startswith(MARK):
            return json.loads(line[len(MARK):])
    tail = (err.strip().splitlines() or ["?"])[-1][:300]
    return {"model": name, "kind": kind, "dtype": dtype, "status": "abort" if proc.returncode < 0 else "fail",
            "reason": f"exporter process exited {proc.returncode} after {time.perf_counter() - start:.0f} s: {tail}"}


def sweep(args) -> None:
    results = [] if args.fresh else load_results(args.json)
    done = {(r["model"], r["dtype"]) for r in results}
    models = zoo.names()
    if args.models:
        wanted = [m for m in args.models.split(",") if m]
        # zoo models, and prefixes of them ("maxvit_t.stage2", zoo.py) when named
        models = [(n, k) for n, k in models if n in wanted]
        models += [(n, zoo.kind_of(n)) for n in wanted if zoo.PREFIX_SEP in n]
    if args.redo:  # export the chosen models again; their records are replaced in place
        done -= {(n, d) for n, _ in models for d in args.dtypes.split(",")}
    if args.redo_over is not None:  # and those whose recorded export took over that many CPU seconds
        done -= {(r["model"], r["dtype"]) for r in results
                 if r.get("export_cpu_s", 0) > args.redo_over and r["dtype"] in args.dtypes.split(",")}
    cache = ROOT / "out" / "coverage" / "params.json"
    params = json.loads(cache.read_text()) if cache.exists() else {}
    for n, _ in models:
        if n not in params:
            params[n] = zoo.parameters(n)
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps(params, indent=1))
    models.sort(key=lambda nk: params[nk[0]])
    dtypes = [d for d in args.dtypes.split(",") if d]
    for dtype in dtypes:
        for name, kind in models:
            if (name, dtype) in done:
                continue
            if params[name] > args.max_params:
                record = {"model": name, "kind": kind, "dtype": dtype, "params": params[name], "status": "skipped",
                          "reason": f"{params[name] / 1e6:.0f}M parameters (> {args.max_params / 1e6:.0f}M)"}
            else:
                print(f"[{time.strftime('%H:%M:%S')}] {name} {dtype} ({params[name] / 1e6:.1f}M params)", flush=True)
                record = run_child(name, kind, dtype, args)
                record.setdefault("params", params[name])
            print(f"    {record['status']}: " + (record.get("reason") or
                  f"{record.get('export_s')} s, {record.get('pte_mib')} MiB, cpu ops {record.get('cpu_ops')}"),
                  flush=True)
            at = next((i for i, r in enumerate(results) if (r["model"], r["dtype"]) == (name, dtype)), None)
            if at is None:
                results.append(record)
            else:
                results[at] = record
            save_results(args.json, results)
            write_doc(args.doc, results, load_gpu(args.gpu_results), planned=[(n, d) for d in dtypes for n, _ in models])


# ---- the report ---------------------------------------------------------------


def load_gpu(paths) -> dict:
    """{(model, dtype): gpu record} from gpu_coverage.py's JSON files (or
    folders of coverage_gpu_*.json)."""
    out = {}
    for path in map(Path, paths or []):
        files = sorted(path.glob("coverage_gpu_*.json")) if path.is_dir() else [path] if path.exists() else []
        for f in files:
            out.update({(r["model"], r["dtype"]): r for r in json.loads(f.read_text())})
    return out


def _cpu_cell(r: dict) -> str:
    if "cpu_ops" not in r:
        return ""
    if not r["cpu_ops"]:
        return "0"
    return "<br>".join(f"{op.removeprefix('aten.')} x{c}" for op, c in sorted(r["cpu_ops"].items()))


def _status_cell(r: dict) -> str:
    s = r["status"]
    if r.get("compile_fallbacks"):
        s += f" ({len(r['compile_fallbacks'])} compile fallback{'s' if len(r['compile_fallbacks']) > 1 else ''})"
    return s


def _seconds_cell(r: dict) -> str:
    if "export_s" not in r:
        return ""
    text = f"{r['export_s']:.1f}" + (f" ({r['export_cpu_s']:.1f})" if "export_cpu_s" in r else "")
    sms = r.get("target_sms", [90])  # records before the field were all sm_90
    if sms == "default":
        return text + " [default SMs]"
    return text if sms == [90] else text + " [" + ",".join(f"sm_{s}" for s in sms) + "]"


def within_torch_fp16(g: dict) -> bool:
    """A float16 result past 1e-2 that is still no farther from the float32
    reference than PyTorch's own float16 run of the model on the same inputs
    (gpu_coverage.py records it): the limit of float16 for that model, not a
    Kiln error (maxvit_t: Kiln 3.0e-2, PyTorch float16 9.2e-2). Reported
    apart from the strict count, never as a match."""
    return (not g.get("ok") and g.get("dtype") == "float16" and g.get("rel_err") is not None
            and g.get("torch_fp16_rel_err") is not None and g["rel_err"] <= g["torch_fp16_rel_err"])


def _err_cell(g: dict | None) -> str:
    if not g:
        return ""
    if g.get("error") is not None and g.get("rel_err") is None:
        return f"run failed: {g['error'][:60]}"
    if within_torch_fp16(g):
        return f"{g['rel_err']:.1e} over (PyTorch fp16 {g['torch_fp16_rel_err']:.1e})"
    mark = "ok" if g.get("ok") else "FAIL"
    return f"{g['rel_err']:.1e} {mark}"


def write_doc(doc: Path, results: list[dict], gpu: dict, planned=None) -> None:
    by = {(r["model"], r["dtype"]): r for r in results}
    models = []
    for r in results:
        if r["model"] not in [m for m, _ in models]:
            models.append((r["model"], r["kind"]))
    lines = [
        "# Coverage: the torchvision zoo through Kiln",
        "",
        "Written by `tools/coverage/coverage_sweep.py` (issue 10, section 4): every model of",
        "`torchvision.models` (classification) and `torchvision.models.segmentation`, random weights",
        "(seeded, nothing downloaded), batch 1, 3x224x224, exported with `kiln.compile(...,",
        "min_block_size=1, target_sms=(90,))` + `kiln.save` on the 2-core CPU machine (seconds: wall,",
        "torch.export to the written file, one export at a time; the commit that made each figure is in",
        "`docs/coverage.json`, and the summary names them; in parentheses the export's CPU seconds, user +",
        "system, NVRTC's threads included; \"[default SMs]\" marks an export with kiln's",
        "default target_sms, sm_80 to sm_120: cubins for sm_80/90/100/110/120 + PTX, `--target-sms default`).",
        "float16 = `model.half()` with",
        "`enabled_precisions={torch.float16}`. CPU ops: ops left to ExecuTorch's CPU kernels.",
        "Status: pass (0 CPU ops), cpu (exported, some ops on the CPU), fail (torch.export or",
        "ExecuTorch itself cannot take the model), abort (Kiln raised), timeout, skipped.",
        "\"compile fallback\": a node whose partition failed to compile and was left to the CPU by the",
        "partitioner's trial compile (such an export aborted before issue 10's fallback). GPU error:",
        "norm-relative error of kiln_runner's output against PyTorch on the H200 (the cov5 groups,",
        "2026-12-05: an H100) on fresh random",
        "inputs (`tools/coverage/gpu_coverage.py`; fp32 <= 1e-4, fp16 <= 1e-2), from the exports that",
        "`docs/coverage_gpu/*.json` name (not re-run with every re-timing); empty until that runs.",
        "\"over (PyTorch fp16 e)\": a float16 error above 1e-2 that is no larger than e, PyTorch's own",
        "float16 run's error against the same float32 reference: counted as not matching, shown apart.",
        "",
        "Reproduce: `PYTHONPATH=python nice -n 19 python3 tools/coverage/coverage_sweep.py --keep-pte",
        "out/coverage/pte` (resumes from `docs/coverage.json`; `--fresh` starts over). GPU errors:",
        "`python3 tools/coverage/coverage_sweep.py --pack .gpu_carry/coverage --keep-pte out/coverage/pte`,",
        "`bash scripts/make_executorch_sdk.sh .gpu_carry/executorch_sdk`, then on the GPU machine one call",
        "per group carrying `.gpu_carry/executorch_sdk` and `.gpu_carry/coverage/cov_NN`:",
        "`bash scripts/gpu_coverage.sh .gpu_carry/coverage/cov_NN`; copy `$OUT/coverage_gpu_cov_NN.json`",
        "into `docs/coverage_gpu/` and run `python3 tools/coverage/coverage_sweep.py --report`.",
        "",
    ]
    lines += _summary(results, by, gpu, planned)
    lines += ["", "## Per model", "",
              "| model | params | fp32 status | fp32 CPU ops | fp32 s (CPU s) | fp32 MiB | fp16 status | fp16 CPU ops | fp16 s (CPU s) | fp16 MiB | fp32 GPU err | fp16 GPU err |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, kind in models:
        row = [name + (" (seg)" if kind == "segmentation" else "")]
        params = next((by[(name, d)].get("params") for d in SHORT if (name, d) in by and by[(name, d)].get("params")), None)
        row.append(f"{params / 1e6:.1f}M" if params else "")
        for d in SHORT:
            r = by.get((name, d))
            if r is None:
                row += ["not reached", "", "", ""]
                continue
            row += [_status_cell(r), _cpu_cell(r), _seconds_cell(r),
                    f"{r['pte_mib']:.1f}" if "pte_mib" in r else ""]
        row += [_err_cell(gpu.get((name, d))) for d in SHORT]
        lines.append("| " + " | ".join(row) + " |")
    reasons = [r for r in results if r.get("reason")]
    if reasons:
        lines += ["", "## Reasons", ""]
        for r in reasons:
            lines.append(f"- {r['model']} {SHORT.get(r['dtype'], r['dtype'])}: {r['status']}: {r['reason']}")
    fallbacks = [r for r in results if r.get("compile_fallbacks")]
    if fallbacks:
        lines += ["", "## Compile fallbacks (these exports aborted before the fallback)", ""]
        for r in fallbacks:
            for f in r["compile_fallbacks"] + r.get("relowered", []):
                lines.append(f"- {r['model']} {SHORT[r['dtype']]}: {f[:400]}")
    notes = _notes_section(doc)
    if notes:
        lines += [""] + notes
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text("\n".join(lines) + "\n")


def _notes_section(doc: Path) -> list[str]:
    """The doc's hand-written "## Notes" section (to its end or the next
    "## " heading), kept when the table is rewritten."""
    if not doc.exists():
        return []
    out, inside = [], False
    for line in doc.read_text().splitlines():
        if line.startswith("## "):
            inside = line.strip() == "## Notes"
        if inside:
            out.append(line)
    while out and not out[-1].strip():
        out.pop()
    return out


def _summary(results, by, gpu, planned) -> list[str]:
    out = ["## Summary", ""]
    for d in SHORT:
        rs = [r for r in results if r["dtype"] == d]
        if not rs:
            continue
        count = Counter(r["status"] for r in rs)
        attempted = [r for r in rs if r["status"] != "skipped"]
        zero = sum(1 for r in attempted if r["status"] == "pass")
        fallback = sum(1 for r in rs if r.get("compile_fallbacks"))
        pct = 100.0 * zero / len(attempted) if attempted else 0.0
        out.append(f"- **{d}**: {len(rs)} models recorded: " + ", ".join(f"{v} {k}" for k, v in sorted(count.items()))
                   + f"; **{count.get('abort', 0)} aborted exports**; {zero}/{len(attempted)} = **{pct:.0f}% with 0 CPU ops**"
                   + f"; {fallback} with compile fallbacks (would have aborted before issue 10's fallback)")
        timed = [r for r in rs if "export_s" in r and r.get("params", 0) <= 100e6]
        if timed:
            slow = max(timed, key=lambda r: r["export_s"])
            over = sorted((r for r in timed if r["export_s"] > 30), key=lambda r: -r["export_s"])
            over_cpu = [r for r in over if r.get("export_cpu_s", 0) > 30]
            commits = Counter(r.get("commit", "not recorded") for r in timed)
            out.append(f"  - export time (<= 100M parameters, {len(timed)} exports): max {slow['export_s']:.1f} s wall"
                       f" ({slow['model']}); {len(over)} over 30 s wall, {len(over_cpu)} of them over 30 CPU s: "
                       + (", ".join(f"{r['model']} {r['export_s']:.0f} ({r.get('export_cpu_s', 0):.0f})"
                                    for r in over_cpu) or "none")
                       + "; measured at " + ", ".join(f"{c} ({n})" for c, n in commits.most_common()))
        g = [gpu[(r["model"], d)] for r in rs if (r["model"], d) in gpu]
        if g:
            ok = sum(1 for x in g if x.get("ok"))
            line = f"  - GPU: {ok}/{len(g)} match PyTorch (rtol {RTOL[d]})"
            limited = [x for x in g if within_torch_fp16(x)]
            if limited:
                line += ("; over the bar but no farther from float32 than PyTorch's own float16 run: "
                         + ", ".join(f"{x['model']} {x['rel_err']:.1e} (PyTorch fp16 {x['torch_fp16_rel_err']:.1e})"
                                     for x in limited))
            out.append(line)
    if planned:
        for d in SHORT:
            missing = [n for n, dd in planned if dd == d and (n, d) not in by]
            if missing:
                out.append(f"- {d} not reached yet ({len(missing)}): " + ", ".join(missing))
    ops: dict[str, set[str]] = defaultdict(set)
    for r in results:
        for op in r.get("cpu_ops") or {}:
            ops[op].add(r["model"])
    if ops:
        out += ["", "Ops left to the CPU, by number of models affected (either dtype):", "",
                "| op | models | which |", "|---|---|---|"]
        for op, ms in sorted(ops.items(), key=lambda kv: (-len(kv[1]), kv[0])):
            out.append(f"| {op} | {len(ms)} | {', '.join(sorted(ms))} |")
    return out


# ---- carry groups for the GPU check ---------------------------------------------


def pack(args) -> None:
    """xz archives of the kept .pte files (one per model, both dtypes; --xz-preset), in
    carry groups of at most --group-mib MiB, each with manifest_coverage.json."""
    import lzma
    import tarfile

    results = [r for r in load_results(args.json) if r.get("pte") and (args.keep_pte / r["pte"]).exists()]
    if args.models:
        wanted = set(args.models.split(","))
        results = [r for r in results if r["model"] in wanted]
    staging = args.pack / "_staging"
    staging.mkdir(parents=True, exist_ok=True)
    by_model: dict[str, list[dict]] = defaultdict(list)
    for r in results:
        by_model[r["model"]].append(r)
    sizes = {}
    for model, rs in by_model.items():
        archive = staging / f"{model}.tar.xz"
        if not archive.exists():
            filters = [{"id": lzma.FILTER_LZMA2, "preset": args.xz_preset}]
            with lzma.open(archive, "wb", format=lzma.FORMAT_XZ, filters=filters) as raw:
                with tarfile.open(fileobj=raw, mode="w") as tar:
                    for r in rs:
                        tar.add(args.keep_pte / r["pte"], arcname=r["pte"])
        sizes[model] = archive.stat().st_size
        print(f"  {model}: {sum(r['pte_mib'] for r in rs):.1f} MiB -> {sizes[model] / 2**20:.2f} MiB xz", flush=True)
    limit = args.group_mib * 2**20
    groups: list[dict] = []
    for model in sorted(sizes, key=lambda m: -sizes[m]):
        g = next((g for g in groups if g["bytes"] + sizes[model] <= limit), None)
        if g is None:
            g = {"name": f"{args.group_prefix}_{len(groups):02d}", "models": [], "bytes": 0}
            groups.append(g)
        g["models"].append(model)
        g["bytes"] += sizes[model]
    for g in groups:
        folder = args.pack / g["name"]
        folder.mkdir(parents=True, exist_ok=True)
        manifest = []
        for model in g["models"]:
            os.replace(staging / f"{model}.tar.xz", folder / f"{model}.tar.xz")
            for r in by_model[model]:
                manifest.append({k: r[k] for k in ("model", "kind", "dtype", "seed", "checksum", "pte", "input",
                                                   "outputs", "cpu_ops") if k in r} | {"archive": f"{model}.tar.xz"})
        (folder / "manifest_coverage.json").write_text(json.dumps(manifest, indent=1))
        print(f"{folder}: {len(g['models'])} models, {g['bytes'] / 2**20:.1f} MiB", flush=True)
    staging.rmdir()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--worker", nargs=3, metavar=("MODEL", "KIND", "DTYPE"), help=argparse.SUPPRESS)
    p.add_argument("--models", default="", help="comma-separated subset (default: the whole zoo)")
    p.add_argument("--dtypes", default="float32,float16")
    p.add_argument("--timeout", type=float, default=480.0, help="seconds per export")
    p.add_argument("--max-params", type=float, default=150e6)
    p.add_argument("--target-sms", default="90",
                   help="comma-separated SMs, or 'default' for kiln.compile's default targets (default: 90)")
    p.add_argument("--redo-over", type=float, metavar="SECONDS",
                   help="export again (replacing their records) the models whose recorded export took over "
                        "SECONDS of CPU time")
    p.add_argument("--keep-pte", type=Path, help="keep the .pte files here (for the GPU check)")
    p.add_argument("--json", type=Path, default=ROOT / "docs" / "coverage.json")
    p.add_argument("--doc", type=Path, default=ROOT / "docs" / "coverage.md")
    p.add_argument("--gpu-results", type=Path, nargs="*", default=[ROOT / "docs" / "coverage_gpu"],
                   help="gpu_coverage.py's JSON files or folders of them, merged into the table "
                        "(default docs/coverage_gpu/)")
    p.add_argument("--fresh", action="store_true", help="ignore the results already in --json")
    p.add_argument("--redo", action="store_true",
                   help="export --models (x --dtypes) again even if --json has them, replacing their records")
    p.add_argument("--report", action="store_true", help="only rewrite --doc from --json (+ --gpu-results)")
    p.add_argument("--pack", type=Path, help="write carry groups of the --keep-pte files here and stop")
    p.add_argument("--group-mib", type=float, default=46.0)
    p.add_argument("--group-prefix", default="cov",
                   help="carry groups are named <prefix>_NN (default cov); another prefix packs a second set "
                        "(e.g. re-exported models) without clashing with groups already run")
    p.add_argument("--xz-preset", type=int, default=2,
                   help="xz preset of the carried archives (2: ~3 CPU s per 100 MiB of .pte on the 2-core "
                        "machine, archives ~25%% larger than preset 6, which takes ~10x the CPU)")
    args = p.parse_args(argv)
    if args.worker:
        name, kind, dtype = args.worker
        if args.keep_pte:
            args.keep_pte.mkdir(parents=True, exist_ok=True)
        sms = None if args.target_sms == "default" else [int(s) for s in args.target_sms.split(",")]
        record = export_one(name, kind, dtype, args.keep_pte, sms)
        print(MARK + json.dumps(record), flush=True)
        return 0
    if args.pack:
        if not args.keep_pte:
            p.error("--pack needs --keep-pte (where the sweep kept the .pte files)")
        pack(args)
        return 0
    if args.report:
        dtypes = [d for d in args.dtypes.split(",") if d]
        write_doc(args.doc, load_results(args.json), load_gpu(args.gpu_results),
                  planned=[(n, d) for d in dtypes for n, _ in zoo.names()])
        return 0
    sweep(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
