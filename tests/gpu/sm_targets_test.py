"""GPU test of how an engine's kernels load on the GPU it meets (issue 14),
run on the GPU machine:

    python3 tests/gpu/sm_targets_test.py --files .gpu_carry/sm_targets \
        --runner build-gpu/tools/kiln_runner/kiln_runner --out out/gpu

The files come from tests/gpu/export_sm_targets.py on the CPU machine: the
same models exported for different target_sms. Per case this rebuilds the
PyTorch model from its weights on the GPU, draws FRESH random inputs (seeded
from os.urandom), computes PyTorch's outputs (fp32, TF32 off) and runs
kiln_runner on the .pte, then checks what the manifest expects:

  cubin    the GPU's SM is among the engine's cubins: exit 0 (outputs match),
           and no JIT line
  jit      no cubin for this GPU, PTX older than it: exit 0 (outputs match)
           and exactly one "JIT-compiling its PTX" line per kernel module
  refused  neither: exit 3 (not loadable), the error names this GPU's SM and
           every SM the engine carries; no output compared
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "gpu"))
from run_gpu_tests import tensor_file  # noqa: E402  (kiln/tensor_file.py alone: no ExecuTorch there)
from sm_targets_models import MODELS  # noqa: E402

JIT_LINE = "JIT-compiling its PTX"


def write_case(files: Path, work: Path, case: dict, seed: int) -> tuple[Path, Path]:
    model = MODELS[case["model"]]()
    model.load_state_dict(torch.load(files / case["weights"], map_location="cpu"))
    model = model.cuda().eval()
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(*case["input_shape"], generator=gen, device="cuda")
    with torch.no_grad():
        y = model(x)
    inputs, expected = work / f"{case['name']}.inputs.ktensors", work / f"{case['name']}.expected.ktensors"
    tensor_file.save(inputs, [x.cpu()])
    tensor_file.save(expected, [y.float().cpu()])
    return inputs, expected


def check(case: dict, run: subprocess.CompletedProcess, gpu_sm: int) -> list[str]:
    """What is wrong with this run (empty: it passed)."""
    text = run.stdout + run.stderr
    jit_lines = [l for l in text.splitlines() if JIT_LINE in l]
    engine_sms = sorted({sm for e in case["code"] for sm in e["sms"]})
    ptx_sms = sorted({p for e in case["code"] for p in e["ptx_sms"]})
    modules = sum(1 for e in case["code"] if e["sms"] or e["ptx_sms"])
    problems = []
    expect = case["expect"]
    if expect == "cubin" and gpu_sm not in engine_sms:
        return [f"this GPU (sm_{gpu_sm}) is not among the engine's cubins {engine_sms}: "
                "the case cannot test the cubin path here"]
    if expect == "jit" and (gpu_sm in engine_sms or not ptx_sms or min(ptx_sms) > gpu_sm):
        return [f"engine cubins {engine_sms}, PTX {ptx_sms}: not a JIT case on sm_{gpu_sm}"]
    if expect in ("cubin", "jit"):
        if run.returncode != 0:
            problems.append(f"kiln_runner exit {run.returncode}, expected 0")
        want = 0 if expect == "cubin" else modules
        if len(jit_lines) != want:
            problems.append(f"{len(jit_lines)} JIT line(s), expected {want}: {jit_lines}")
        for line in jit_lines:
            if f"sm_{gpu_sm}" not in line or f"compute_{min(ptx_sms)}" not in line:
                problems.append(f"the JIT line does not name sm_{gpu_sm} and compute_{min(ptx_sms)}: {line}")
    elif expect == "refused":
        if run.returncode != 3:
            problems.append(f"kiln_runner exit {run.returncode}, expected 3 (model could not be loaded)")
        refusal = [l for l in text.splitlines() if "no code this GPU can run" in l]
        if not refusal:
            problems.append("no line saying the engine has no code this GPU can run")
        else:
            line = refusal[0]
            missing = [f"sm_{s}" for s in [gpu_sm] + engine_sms if f"sm_{s}" not in line]
            missing += [f"compute_{p}" for p in ptx_sms if f"compute_{p}" not in line]
            if missing:
                problems.append(f"the refusal does not name {missing}: {line}")
        if jit_lines:
            problems.append(f"a refused engine logged a JIT line: {jit_lines}")
    else:
        problems.append(f"unknown expectation {expect!r}")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--files", type=Path, required=True)
    parser.add_argument("--runner", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    major, minor = torch.cuda.get_device_capability()
    gpu_sm = major * 10 + minor
    cases = json.loads((args.files / "manifest.json").read_text())["cases"]
    work = args.out / "sm_targets"
    work.mkdir(parents=True, exist_ok=True)
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"sm_targets: GPU sm_{gpu_sm}, {len(cases)} cases, input seed {seed}")
    failures = 0
    for case in cases:
        inputs, expected = write_case(args.files, work, case, seed)
        command = [str(args.runner), f"--model_path={args.files / case['pte']}", f"--inputs={inputs}",
                   f"--expected={expected}", f"--rtol={case['rtol']}", "--num_runs=5", "--warmup=1"]
        run = subprocess.run(command, capture_output=True, text=True, timeout=300)
        (work / f"{case['name']}.log").write_text(" ".join(command) + "\n" + run.stdout + run.stderr)
        problems = check(case, run, gpu_sm)
        jit = next((l for l in (run.stdout + run.stderr).splitlines() if JIT_LINE in l or "no code this GPU" in l),
                   "")
        if problems:
            failures += 1
            print(f"FAIL  sm_targets {case['name']} ({case['expect']}): " + "; ".join(problems))
            print("      log: " + str(work / f"{case['name']}.log"))
        else:
            detail = re.sub(r"^.*?kiln: ", "", jit.strip())[:200]
            print(f"PASS  sm_targets {case['name']} ({case['expect']})" + (f": {detail}" if detail else ""))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
