#!/usr/bin/env python3
"""The benchmark's results: merging runs, the ratio column, markdown + JSON.

Pure Python (no torch): run_benchmarks.py calls write_results() after each
measurement; on the CPU machine, results of runs split across several GPU
calls are merged with

    python benchmarks/results_table.py --merge A.json B.json [...] --out benchmarks/results

Results JSON: {"meta": {...}, "rows": [row, ...]} where a row is
  {"model", "batch", "dtype",
   "kiln": {"plain": RUN, "graphs": RUN},        # kiln_runner --use_cuda_graphs=false/true
   "peers": {PEER: RUN, ...},                      # see PEERS
   "export_s", "pte_bytes", "cpu_fallback_ops", "checksum_ok"}
and a RUN is {"status": "ok"|"failed"|"skipped", "median_ms", "p10_ms",
  "p90_ms", "mean_ms", "runs", "memory_bytes", "compile_s" / "load_ms",
  "error"}.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

PEERS = ("eager", "compile", "max_autotune", "reduce_overhead", "max_autotune_graphs", "aoti")
PEER_TITLES = {
    "eager": "eager",
    "compile": "compile",
    "max_autotune": "max-autotune-no-cg",
    "reduce_overhead": "reduce-overhead",
    "max_autotune_graphs": "max-autotune",
    "aoti": "AOTInductor",
}
KILN_MODES = ("plain", "graphs")
MODEL_ORDER = ("mlp_policy", "resnet18_policy", "resnet50", "mobilenet_v3_large", "efficientnet_b0", "convnext_tiny",
               "lraspp_mobilenet_v3_large", "vit_b_16", "bert_base")


def _ok_ms(run: dict | None) -> float | None:
    if not run or run.get("status") != "ok":
        return None
    ms = run.get("median_ms")
    return float(ms) if ms is not None and math.isfinite(ms) and ms > 0 else None


def kiln_best(row: dict) -> tuple[str | None, float | None]:
    """(mode, median ms) of the faster Kiln mode that ran."""
    runs = [(mode, _ok_ms(row.get("kiln", {}).get(mode))) for mode in KILN_MODES]
    runs = [(m, ms) for m, ms in runs if ms is not None]
    return min(runs, key=lambda r: r[1]) if runs else (None, None)


def best_peer(row: dict) -> tuple[str | None, float | None]:
    """(peer, median ms) of the fastest PyTorch peer that ran."""
    runs = [(p, _ok_ms(row.get("peers", {}).get(p))) for p in PEERS]
    runs = [(p, ms) for p, ms in runs if ms is not None]
    return min(runs, key=lambda r: r[1]) if runs else (None, None)


def ratio(row: dict) -> float | None:
    """Best peer latency / Kiln latency (Kiln = the faster of plain and
    graphs): > 1 means Kiln is faster. None when either side has no result."""
    _, kiln_ms = kiln_best(row)
    _, peer_ms = best_peer(row)
    if kiln_ms is None or peer_ms is None:
        return None
    return peer_ms / kiln_ms


def _merge_run(old: dict | None, new: dict | None) -> dict | None:
    """A successful run wins over a failed/skipped one; otherwise the newer."""
    if new is None:
        return old
    if old is None:
        return new
    if new.get("status") != "ok" and old.get("status") == "ok":
        return old
    return new


def merge(results: list[dict]) -> dict:
    """Merges results of several runs (rows keyed by model, batch, dtype)."""
    rows: dict[tuple, dict] = {}
    metas = []
    for res in results:
        metas.append(res.get("meta", {}))
        for row in res.get("rows", []):
            key = (row["model"], row["batch"], row.get("dtype", "float16"))
            have = rows.setdefault(key, {"model": row["model"], "batch": row["batch"],
                                         "dtype": row.get("dtype", "float16"), "kiln": {}, "peers": {}})
            for k, v in row.items():
                if k not in ("kiln", "peers") and v is not None:
                    have[k] = v
            for part in ("kiln", "peers"):
                for name, run in row.get(part, {}).items():
                    have[part][name] = _merge_run(have[part].get(name), run)
    meta = dict(metas[-1]) if metas else {}
    if len(metas) > 1:
        meta["merged_from"] = [{k: m.get(k) for k in ("date", "commit", "gpu", "args")} for m in metas]
    order = {m: i for i, m in enumerate(MODEL_ORDER)}
    return {"meta": meta, "rows": sorted(rows.values(), key=lambda r: (order.get(r["model"], 99), r["model"], r["batch"]))}


def _fmt_ms(run: dict | None) -> str:
    if not run:
        return "-"
    if run.get("status") == "ok":
        return f"{run['median_ms']:.3f}"
    return "fail" if run.get("status") == "failed" else "skip"


def _mib(nbytes) -> str:
    return "-" if nbytes is None else f"{nbytes / 2**20:.0f}"


def to_markdown(result: dict) -> str:
    meta = result.get("meta", {})
    lines = [f"# Kiln benchmark: {meta.get('date', '?')}, commit {meta.get('commit', '?')}", ""]
    lines.append(f"GPU: {meta.get('gpu', '?')} (driver {meta.get('driver', '?')}); torch {meta.get('torch', '?')}, "
                 f"CUDA {meta.get('cuda', '?')}; fp16; peers in {meta.get('peer_memory_format', '?')} for conv models; "
                 f"median of {meta.get('runs', '?')} CUDA-event-timed runs after {meta.get('warmup', '?')} warm-up runs, "
                 "each run synchronized (latency, not throughput). Times in ms.")
    lines.append("")
    head = ["model", "batch", "Kiln", "Kiln graphs"] + [PEER_TITLES[p] for p in PEERS] + ["best peer", "ratio"]
    lines.append("| " + " | ".join(head) + " |")
    lines.append("|" + "|".join("---" for _ in head) + "|")
    for row in result.get("rows", []):
        peer, _ = best_peer(row)
        r = ratio(row)
        cells = [row["model"], str(row["batch"])]
        cells += [_fmt_ms(row.get("kiln", {}).get(m)) for m in KILN_MODES]
        cells += [_fmt_ms(row.get("peers", {}).get(p)) for p in PEERS]
        cells += [PEER_TITLES.get(peer, "-") if peer else "-", f"**{r:.2f}x**" if r is not None else "-"]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "ratio = best peer latency / Kiln latency (Kiln = the faster of plain and CUDA-graph replay); "
              "above 1: Kiln is faster.", ""]
    lines.append("## Memory and build time")
    lines.append("")
    head = ["model", "batch", ".pte MiB", "export s", "Kiln load ms", "Kiln MiB (graphs)"] + \
           [f"{PEER_TITLES[p]} MiB / compile s" for p in PEERS]
    lines.append("| " + " | ".join(head) + " |")
    lines.append("|" + "|".join("---" for _ in head) + "|")
    for row in result.get("rows", []):
        kiln = row.get("kiln", {})
        kiln_run = kiln.get("plain") or kiln.get("graphs") or {}
        graphs = kiln.get("graphs") or {}
        cells = [row["model"], str(row["batch"]), _mib(row.get("pte_bytes")),
                 "-" if row.get("export_s") is None else f"{row['export_s']:.1f}",
                 "-" if kiln_run.get("load_ms") is None else f"{kiln_run['load_ms']:.0f}",
                 f"{_mib(kiln_run.get('memory_bytes'))} ({_mib(graphs.get('memory_bytes'))})"]
        for p in PEERS:
            run = row.get("peers", {}).get(p) or {}
            if run.get("status") != "ok":
                cells.append("-")
                continue
            comp = run.get("compile_s")
            cells.append(f"{_mib(run.get('memory_bytes'))} / {'-' if comp is None else f'{comp:.1f}'}")
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Kiln MiB: device memory in use after warm-up minus before loading (cudaMemGetInfo: weights, "
              "arenas, workspaces, I/O buffers, CUDA graphs). Peer MiB: torch.cuda.max_memory_allocated while "
              "that peer ran (weights included).", ""]
    failures = []
    for row in result.get("rows", []):
        for part in ("kiln", "peers"):
            for name, run in row.get(part, {}).items():
                if run and run.get("status") != "ok":
                    failures.append(f"- {row['model']} b{row['batch']} {part}/{name}: {run.get('status')}: "
                                    f"{str(run.get('error', '')).strip()[:400]}")
    if failures:
        lines += ["## Failed or skipped", ""] + failures + [""]
    return "\n".join(lines)


def write_results(result: dict, out_dir: Path, stem: str | None = None) -> tuple[Path, Path]:
    """Writes OUT/<date>_<commit>.{json,md} and OUT/latest.md; returns the two paths."""
    meta = result.get("meta", {})
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = stem or f"{meta.get('date', 'undated')}_{str(meta.get('commit', 'nocommit')).replace('+', '').split()[0]}"
    for row in result.get("rows", []):
        row["ratio"] = ratio(row)
        row["best_peer"] = best_peer(row)[0]
        row["kiln_best"] = kiln_best(row)[0]
    js = out_dir / f"{stem}.json"
    md = out_dir / f"{stem}.md"
    js.write_text(json.dumps(result, indent=1))
    text = to_markdown(result)
    md.write_text(text)
    (out_dir / "latest.md").write_text(text)
    return js, md


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="merge benchmark result JSONs and write the table")
    parser.add_argument("--merge", nargs="+", type=Path, required=True)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    parser.add_argument("--stem", help="file name stem (default <date>_<commit> of the last input)")
    args = parser.parse_args(argv)
    merged = merge([json.loads(p.read_text()) for p in args.merge])
    js, md = write_results(merged, args.out, args.stem)
    print(md.read_text())
    print(f"wrote {js} and {md}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
