#!/usr/bin/env python3
"""GPU side of the coverage sweep (runs on the GPU machine: torch +
torchvision, no ExecuTorch, no Kiln Python package; scripts/gpu_coverage.sh
builds kiln_runner and calls this).

For each entry of the carried groups (manifest_coverage.json + xz archives,
written by `coverage_sweep.py --pack`): rebuilds the model with zoo.build
(same seeded weights; the state-dict checksum must match the manifest's),
draws FRESH random inputs on the GPU (seed from os.urandom), computes
PyTorch's output on the GPU (TF32 off), and runs the .pte with kiln_runner on
the same inputs, which reports the norm-relative error of each output. float32
reference: the model in float32; float16 reference: the float16 model's
weights and inputs evaluated in float32, cast to float16 (as
tests/gpu/run_gpu_tests.py does). Pass: every output within fp32 1e-4 /
fp16 1e-2. Writes OUT/coverage_gpu_<group>.json, which
`coverage_sweep.py --report --gpu-results ...` merges into docs/coverage.md.
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import os
import re
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools" / "coverage"))
import zoo  # noqa: E402

RTOL = {"float32": 1e-4, "float16": 1e-2}
DTYPES = {"float32": torch.float32, "float16": torch.float16}


def load_tensor_file_module():
    spec = importlib.util.spec_from_file_location("kiln_tensor_file", ROOT / "python/kiln/tensor_file.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


tensor_file = load_tensor_file_module()


def check(entry: dict, pte: Path, runner: Path, work: Path, log, trials: int, device: str = "cuda",
          replay: list[int] | None = None, dump: Path | None = None) -> dict:
    """Kiln against PyTorch on `trials` fresh input draws, or on the draws of
    `replay` (seeds a run recorded, to look at those draws again). With
    `dump`, each draw's tensors go to dump/<model>_<dtype>_<seed>.pt: the
    input, the float32 model's outputs (unrounded), PyTorch's own outputs in
    the model's dtype and Kiln's, to see where two results part."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dtype = DTYPES[entry["dtype"]]
    result = {"model": entry["model"], "dtype": entry["dtype"], "rtol": RTOL[entry["dtype"]]}
    try:
        model, _ = zoo.build(entry["model"], dtype, seed=entry["seed"])
    except Exception as e:  # noqa: BLE001 - a model this torchvision lacks
        return result | {"ok": False, "rel_err": None, "error": f"cannot build here: {type(e).__name__}: {e}"}
    got = zoo.checksum(model)
    if got != entry["checksum"]:
        return result | {"ok": False, "rel_err": None, "error": f"checksum {got[:12]} != manifest {entry['checksum'][:12]}"}
    model = model.to(device).eval()
    exact = model if dtype == torch.float32 else copy.deepcopy(model).float()
    worst, seeds, errors, torch_fp16 = 0.0, [], [], None
    per_trial = []  # (Kiln's error, PyTorch float16's) for each input draw
    for trial in range(len(replay) if replay else trials):
        seed = replay[trial] if replay else int.from_bytes(os.urandom(4), "little")
        seeds.append(seed)
        gen = torch.Generator(device=device).manual_seed(seed)
        x = torch.randn(entry["input"], generator=gen, device=device, dtype=dtype)
        trial_torch = None
        mine = None
        with torch.no_grad():
            exact_out = zoo.flatten_outputs(exact(x.float()))
            expected = [t.to(dtype) for t in exact_out]
            if dtype != torch.float32:
                mine = zoo.flatten_outputs(model(x))
                trial_torch = max(zoo.rel_err(a, b) for a, b in zip(mine, expected))
                torch_fp16 = max(torch_fp16 or 0.0, trial_torch)  # the worst trial, as Kiln's error is
        inp = work / f"{entry['model']}_{entry['dtype']}.inputs.ktensors"
        exp = work / f"{entry['model']}_{entry['dtype']}.expected.ktensors"
        tensor_file.save(inp, [x.cpu()])
        tensor_file.save(exp, [t.cpu() for t in expected])
        got = work / f"{entry['model']}_{entry['dtype']}.outputs.ktensors"
        cmd = [str(runner), f"--model_path={pte}", f"--inputs={inp}", f"--expected={exp}",
               f"--rtol={RTOL[entry['dtype']]}", "--num_runs=3", "--warmup=1"]
        if dump:
            cmd.append(f"--save_outputs={got}")
        proc = subprocess.run(cmd, capture_output=True, text=True)
        log.write("$ " + " ".join(cmd) + "\n" + proc.stdout + proc.stderr + f"[exit {proc.returncode}]\n\n")
        found = [float(v) for v in re.findall(r"rel_err=([0-9.eE+-]+|nan|inf)", proc.stdout)]
        if not found:
            errors.append((proc.stderr.strip().splitlines() or proc.stdout.strip().splitlines() or ["?"])[-1][:200])
            worst = float("nan")
            break
        worst = max(worst, max(found))
        if dump:
            dump.mkdir(parents=True, exist_ok=True)
            torch.save({"input": x.cpu(), "float32": [t.cpu() for t in exact_out],
                        "torch": [t.cpu() for t in mine] if mine is not None else None,
                        "kiln": [torch.as_tensor(t) for t in tensor_file.load(got)]},
                       dump / f"{entry['model']}_{entry['dtype']}_{seed}.pt")
        per_trial.append([max(found), trial_torch])
        if proc.returncode != 0 and proc.returncode != 1:
            errors.append(f"kiln_runner exit {proc.returncode}")
    del model, exact
    if device == "cuda":
        torch.cuda.empty_cache()
    ok = not errors and worst <= RTOL[entry["dtype"]]
    out = result | {"ok": ok, "rel_err": None if worst != worst else worst, "seeds": seeds}
    if errors:
        out["error"] = errors[0]
    if torch_fp16 is not None:
        out["torch_fp16_rel_err"] = torch_fp16
        out["trials"] = per_trial  # [Kiln, PyTorch float16] per input draw
    return out


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("groups", nargs="+", type=Path, help="carry groups (folders with manifest_coverage.json)")
    p.add_argument("--runner", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--work", type=Path, default=Path("/tmp/kiln_coverage_work"))
    p.add_argument("--trials", type=int, default=2)
    p.add_argument("--only", default="", help="comma-separated models")
    p.add_argument("--seeds", default="", help="comma-separated input seeds to use instead of --trials fresh draws")
    p.add_argument("--dump", type=Path, default=None,
                   help="folder for each draw's input and outputs (float32 model, PyTorch, Kiln) as .pt files")
    p.add_argument("--device", default="cuda", help=argparse.SUPPRESS)  # "cpu": plumbing test only
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    gpu = torch.cuda.get_device_name() if args.device == "cuda" else "none (--device cpu)"
    print(f"GPU: {gpu}  torch {torch.__version__}", flush=True)
    only = {m for m in args.only.split(",") if m}
    seeds = [int(v) for v in args.seeds.split(",") if v]
    failed = 0
    for group in args.groups:
        entries = json.loads((group / "manifest_coverage.json").read_text())
        results = []
        with open(args.out / f"coverage_gpu_{group.name}.log", "w") as log:
            for entry in entries:
                if only and entry["model"] not in only:
                    continue
                pte = args.work / entry["pte"]
                if not pte.exists():
                    with tarfile.open(group / entry["archive"], "r:xz") as tar:
                        try:
                            tar.extractall(args.work, filter="data")
                        except TypeError:  # Python without extraction filters
                            tar.extractall(args.work)
                start = time.time()
                r = check(entry, pte, args.runner, args.work, log, args.trials, args.device, seeds, args.dump)
                r["cpu_ops"] = entry.get("cpu_ops", {})
                results.append(r)
                failed += not r["ok"]
                err = "n/a" if r.get("rel_err") is None else f"{r['rel_err']:.2e}"
                extra = f" (torch fp16 {r['torch_fp16_rel_err']:.1e})" if "torch_fp16_rel_err" in r else ""
                print(f"{'PASS' if r['ok'] else 'FAIL'}  {entry['model']:<30} {entry['dtype']:<8} rel_err={err}{extra}"
                      f"  {r.get('error', '')}  [{time.time() - start:.0f} s]", flush=True)
                pte.unlink(missing_ok=True)
        (args.out / f"coverage_gpu_{group.name}.json").write_text(json.dumps(results, indent=1))
    print(f"{failed} failed", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
