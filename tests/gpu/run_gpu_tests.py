"""GPU tests, run on the GPU machine by scripts/gpu_check.sh (torch there, no
ExecuTorch Python package, no Kiln Python package).

Vision models (--vision: carry groups written by benchmarks/export_models.py,
manifest_vision.json + xz archives): each entry's module is rebuilt from
examples/vision_models.py with its deterministic weights, the state-dict
checksum is compared with the manifest's, fresh random inputs are drawn on the
GPU, and the .pte runs with kiln_runner --device_io=true against PyTorch's
output on the GPU (TF32 off). float32 reference: the model in float32.
float16 reference: the float16 model's weights and inputs evaluated in
float32, cast to float16 (so the reference is not itself degraded by fp16
arithmetic); PyTorch's own float16 error against it is printed beside
Kiln's, for scale.

Reference groups (--reference-groups: folders written by
tests/gpu/export_hf_models.py, manifest_reference.json + xz archives): models
that cannot be rebuilt here (Hugging Face transformers is not installed), so
the CPU machine carried PyTorch's float32 outputs for fixed trials of random
inputs beside each .pte; kiln_runner runs the carried inputs and
reference_groups.compare() measures each output's norm-relative error
against the entry's tolerance. A group named but not here is a FAIL line
saying so.

For each model in MODELS/manifest.json (written at export time by
examples/export_mlp.py --gpu-bundle), it rebuilds the PyTorch module from
examples/sample_models.py with the exported weights, draws FRESH random inputs
on the GPU (seeded from os.urandom), computes PyTorch's output on the GPU, and
runs the exported .pte through kiln_runner, which compares the outputs. It
also checks that bad input gets a clear error: a corrupted engine, a wrong
input shape. Prints a table; exits 1 if anything failed.
"""

import argparse
import copy
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT / "tests" / "gpu"))
sys.path.insert(0, str(ROOT / "benchmarks"))
import conformance_models  # noqa: E402
import reference_groups  # noqa: E402
import sample_models  # noqa: E402

MODULES = {"sample_models": sample_models, "conformance_models": conformance_models}


tensor_file = reference_groups.tensor_file  # loaded without kiln/__init__ (no ExecuTorch here)
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def run(cmd, log):
    proc = subprocess.run(cmd, capture_output=True, text=True)
    log.write("$ " + " ".join(map(str, cmd)) + "\n" + proc.stdout + proc.stderr + f"[exit {proc.returncode}]\n\n")
    return proc


def median_ms(text):
    m = re.search(r"median ([0-9.]+) ms", text)
    return float(m.group(1)) if m else float("nan")


def run_trial(entry, pte, reference, runner, work, log, trial, rtol, run_args):
    """One trial: fresh inputs from an os.urandom seed, the PyTorch reference
    (`reference(inputs)` -> (expected outputs, extra error notes)), the runner
    on the same inputs; returns (seed, runner process, rel_err strings)."""
    seed = int.from_bytes(os.urandom(4), "little")
    gen = torch.Generator(device="cuda").manual_seed(seed)
    if entry.get("module") == "vision_models":  # the benchmark models draw their own (token ids, masks)
        import vision_models

        inputs = list(vision_models.random_inputs(entry["model"], entry["batch"], DTYPES[entry["dtype"]], "cuda", gen))
    else:
        inputs = [torch.randn(shape, generator=gen, device="cuda", dtype=DTYPES[d]) for shape, d in entry["inputs"]]
    with torch.no_grad():
        expected, notes = reference(inputs)
    inp = work / f"{entry['name']}.{trial}.inputs.ktensors"
    exp = work / f"{entry['name']}.{trial}.expected.ktensors"
    tensor_file.save(inp, [t.cpu() for t in inputs])
    tensor_file.save(exp, [t.cpu() for t in expected])
    proc = run([runner, f"--model_path={pte}", f"--inputs={inp}", f"--expected={exp}", f"--rtol={rtol}", *run_args,
                *entry.get("runner_args", [])], log)
    return seed, proc, re.findall(r"rel_err=([0-9.eE+-]+|nan|inf)", proc.stdout) + notes


def check_model(entry, models_dir, runner, work, log, trials):
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    name = entry.get("module", "sample_models")
    module = MODULES[name] if name in MODULES else importlib.import_module(name)  # conformance_<family>
    model = module.FACTORIES[entry["factory"]](**entry.get("kwargs", {}))
    model.load_state_dict(torch.load(models_dir / entry["state_dict"], map_location="cpu"))
    dtype = DTYPES[entry["model_dtype"]]
    # reference_dtype float32: PyTorch computes in float32 and rounds to the
    # dtype, so a float16/bfloat16 tolerance measures Kiln's error alone.
    exact = entry.get("reference_dtype") == "float32"
    model = model.to(dtype).cuda().eval()
    fp32 = copy.deepcopy(model).float() if exact else None

    def as_list(out):
        return [out] if isinstance(out, torch.Tensor) else list(out)

    def reference(inputs):
        expected = as_list(model(*inputs))
        if exact:  # the float32 result, in the dtypes the program returns
            expected = [r.to(t.dtype) for r, t in zip(as_list(fp32(*[t.float() for t in inputs])), expected)]
        return expected, []

    results = []
    for trial in range(trials):
        seed, proc, errors = run_trial(entry, models_dir / entry["pte"], reference, runner, work, log, trial,
                                       entry["rtol"], ["--num_runs=100", "--warmup=10"])
        if len(errors) > 4:  # many outputs: report the worst
            errors = [max(errors, key=lambda e: float(e))]
        ok = proc.returncode == 0 and entry.get("expect_output", "") in proc.stdout
        results.append({"seed": seed, "ok": ok, "rel_err": errors, "median_ms": median_ms(proc.stdout)})
    return results


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    ref = ref.double()
    return float((out.double() - ref).norm() / ref.norm().clamp_min(1e-300))


def check_vision_model(entry, runner, work, log, trials, rtol_override=None):
    """One manifest_vision.json entry; the same result records as check_model."""
    import vision_models

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dtype = DTYPES[entry["dtype"]]
    model, _ = vision_models.build(entry["model"], entry["batch"], dtype, seed=entry.get("seed", vision_models.DEFAULT_SEED))
    got = vision_models.checksum(model)
    if got != entry["checksum"]:
        return [{"seed": 0, "ok": False, "rel_err": [f"checksum {got[:12]} != manifest {entry['checksum'][:12]}"],
                 "median_ms": float("nan")}]
    model = model.cuda().eval()
    exact = model.float() if dtype == torch.float32 else copy.deepcopy(model).float()
    rtol = rtol_override.get(entry["dtype"]) if rtol_override and rtol_override.get(entry["dtype"]) else entry["rtol"]

    def reference(inputs):
        expected = exact(*[t.float() if t.is_floating_point() else t for t in inputs]).to(dtype)
        if dtype == torch.float32:
            return [expected], []
        return [expected], [f"(torch fp16 {rel_err(model(*inputs), expected):.2e})"]

    results = []
    for trial in range(trials):
        seed, proc, errors = run_trial(entry, entry["pte_path"], reference, runner, work, log, trial, rtol,
                                       ["--num_runs=10", "--warmup=2"])
        if proc.returncode != 0 and not errors:
            errors = [(proc.stderr.strip().splitlines() or ["?"])[-1][:200]]
        results.append({"seed": seed, "ok": proc.returncode == 0, "rel_err": errors, "median_ms": median_ms(proc.stdout),
                        "rtol": rtol})
    del model, exact
    torch.cuda.empty_cache()
    return results


def check_bad_inputs(entry, models_dir, runner, work, log):
    """A corrupted engine and a wrong-shaped input must fail with clear errors."""
    out = []
    data = bytearray((models_dir / entry["pte"]).read_bytes())
    marker = data.find(b"KILNENG\0")
    if marker >= 0:
        # The engine's last byte: inside its last section (named_weights), so
        # the section checksum catches it. (Weights are named data now, outside
        # the engine, so a fixed offset may miss the engine.)
        total = int.from_bytes(data[marker + 16:marker + 24], "little")
        data[marker + total - 1 if 0 < total <= len(data) - marker else marker + 40] ^= 0x10
        bad = work / "corrupt.pte"
        bad.write_bytes(bytes(data))
        proc = run([runner, f"--model_path={bad}", "--num_runs=1"], log)
        text = proc.stdout + proc.stderr
        out.append(("corrupt engine is refused", proc.returncode == 3 and "checksum" in text.lower(), text.strip().splitlines()[-1:] ))
    # Every input the method takes, the first one a size too big in each dim
    # (a model of two inputs given one would fail for its count instead).
    shape, d = entry["inputs"][0]
    wrong = [s + 1 for s in shape]
    inp = work / "wrong_shape.inputs.ktensors"
    tensor_file.save(inp, [torch.randn(wrong, dtype=DTYPES[d])] +
                     [torch.randn(s, dtype=DTYPES[t]) for s, t in entry["inputs"][1:]])
    proc = run([runner, f"--model_path={models_dir / entry['pte']}", f"--inputs={inp}", "--num_runs=1"], log)
    text = proc.stdout + proc.stderr
    out.append(("wrong input shape is refused", proc.returncode == 2 and str(wrong[0]) in text, text.strip().splitlines()[-1:]))
    return out


def check_reference_groups(args, summary, log) -> int:
    """--reference-groups: every trial of every entry; returns the failures."""
    if not args.reference_groups:
        return 0
    failed = 0
    groups, missing = reference_groups.find_groups(args.reference_groups)
    for path in missing:
        failed += 1
        summary.append({"check": f"reference group {path}", "ok": False, "detail": "not here"})
        print(f"FAIL  reference group {path}: not here (no {reference_groups.MANIFEST} in it or in its subfolders); "
              "export it on the CPU machine with tests/gpu/export_hf_models.py --out .gpu_carry and carry it",
              flush=True)
    only = {s for s in args.reference_only.split(",") if s}
    override = {}
    for item in getattr(args, "reference_rtol", []):
        dtype, _, value = item.partition("=")
        override[dtype] = float(value)
    for group in groups:
        try:
            entries = reference_groups.load_group(group, args.reference_work)
        except reference_groups.GroupError as e:
            failed += 1
            summary.append({"check": f"reference group {group}", "ok": False, "detail": str(e)})
            print(f"FAIL  reference group {group}: {e}", flush=True)
            continue
        for entry in entries:
            if only and entry["name"] not in only:
                continue
            for r in reference_groups.check_entry(entry, args.runner, args.reference_work / "outputs", log,
                                                  rtol=override.get(entry["dtype"])):
                failed += not r["ok"]
                summary.append({"model": entry["name"], "group": group.name, **r})
                print(reference_groups.result_line(entry, r), flush=True)
    return failed


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", type=Path, nargs="*", default=[],
                        help="folders with manifest*.json (sample models, conformance models); absent ones are skipped")
    parser.add_argument("--vision", nargs="*", default=[],
                        help="carry groups (or folders of them) with manifest_vision.json: the benchmark models")
    parser.add_argument("--vision-only", default="", help="comma-separated entry names or models to check (default all)")
    parser.add_argument("--vision-work", type=Path, default=ROOT / "out" / "vision_work",
                        help="where vision programs are unpacked and their tensor files written")
    parser.add_argument("--vision-rtol-fp32", type=float, help="override the manifest's float32 tolerance")
    parser.add_argument("--reference-groups", nargs="*", default=[],
                        help="reference groups (or folders of them) with manifest_reference.json: programs whose "
                             "float32 reference was carried (tests/gpu/export_hf_models.py)")
    parser.add_argument("--reference-only", default="", help="comma-separated entry names to check (default all)")
    parser.add_argument("--reference-rtol", nargs="*", default=[], metavar="DTYPE=X",
                        help="override the manifest's tolerance for programs of DTYPE, e.g. bfloat16=2e-2")
    parser.add_argument("--reference-work", type=Path, default=ROOT / "out" / "reference_work",
                        help="where reference groups are unpacked and outputs written (not under --out)")
    parser.add_argument("--runner", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--trials", type=int, default=3)
    args = parser.parse_args()
    for item in args.reference_rtol:
        dtype, _, value = item.partition("=")
        try:
            ok = dtype in DTYPES and float(value) > 0
        except ValueError:
            ok = False
        if not ok:
            parser.error(f"--reference-rtol {item!r}: expected DTYPE=X with DTYPE one of {', '.join(DTYPES)}")
    args.out.mkdir(parents=True, exist_ok=True)
    work = args.out / "work"
    work.mkdir(exist_ok=True)
    manifest = []
    for folder in args.models:
        if not folder.is_dir():
            print(f"note: {folder} is not here; its models are skipped")
            continue
        for path in sorted(folder.glob("manifest*.json")):
            manifest += [dict(entry, _dir=folder) for entry in json.loads(path.read_text())]
    vision = []
    if args.vision:
        import vision_bundle

        # Unpacked programs and the (large) input/reference files stay out of
        # --out, which travels back from the GPU machine.
        vision = vision_bundle.load_entries(args.vision, unpack_dir=args.vision_work / "pte")
        only = {s for s in args.vision_only.split(",") if s}
        vision = [e for e in vision if not only or e["name"] in only or e["model"] in only]
    failed = 0
    summary = []
    with open(args.out / "gpu_tests.log", "w") as log:
        print(f"GPU: {torch.cuda.get_device_name()}  torch {torch.__version__}")
        for entry in manifest:
            results = check_model(entry, entry["_dir"], args.runner, work, log, args.trials)
            for r in results:
                failed += not r["ok"]
                summary.append({"model": entry["name"], **r})
                print(f"{'PASS' if r['ok'] else 'FAIL'}  {entry['name']:<22} seed={r['seed']:<11} "
                      f"rel_err={','.join(r['rel_err'])}  kiln_runner median {r['median_ms']:.4f} ms")
        for entry in vision:
            args.vision_work.mkdir(parents=True, exist_ok=True)
            results = check_vision_model(entry, args.runner, args.vision_work, log, args.trials,
                                         {"float32": args.vision_rtol_fp32})
            for r in results:
                failed += not r["ok"]
                summary.append({"model": entry["name"], **r})
                print(f"{'PASS' if r['ok'] else 'FAIL'}  {entry['name']:<26} seed={r['seed']:<11} "
                      f"rel_err={','.join(r['rel_err'])} (rtol {r.get('rtol')})  kiln_runner median {r['median_ms']:.4f} ms",
                      flush=True)
        failed += check_reference_groups(args, summary, log)
        for name, ok, detail in (check_bad_inputs(manifest[0], manifest[0]["_dir"], args.runner, work, log) if manifest else []):
            failed += not ok
            summary.append({"check": name, "ok": ok, "detail": detail})
            print(f"{'PASS' if ok else 'FAIL'}  {name}: {detail}")
    (args.out / "gpu_tests.json").write_text(json.dumps(summary, indent=1))
    passed = sum(1 for s in summary if s["ok"])
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
