"""GPU test of kiln_runtime (python/kiln_runtime over libkiln_c_api.so), run
on the GPU machine by scripts/gpu_check.sh on the files of
tests/gpu/export_python_runtime.py (.gpu_carry/python_runtime).

For each model: the reference sets PyTorch computed at export time, fed from
numpy (host I/O) or as torch CUDA tensors through DLPack (device-resident
I/O); then FRESH random inputs against PyTorch on this GPU (the model rebuilt
from its saved weights). Device-resident outputs come back as DeviceArrays,
read through torch.from_dlpack, .numpy() and into caller-given CUDA buffers.
Plus: the package runs a model with no torch imported, a CUDA tensor given to
a host-I/O program and a host array given to a device-resident one are
refused with messages naming the input, and a stale DeviceArray raises. A
program with a batch Dim (one engine per size bucket) runs every bucket, up
and back down, against PyTorch, and refuses a size with no engine. With
--state (tests/gpu/export_state_test.py's files): two Programs of one model
in different state scopes keep separate KV caches, and two in one scope share.
Tolerance: rel_err = ||out - ref|| / ||ref|| <= rtol (1e-5 float32, 1e-2 float16).

    python3 tests/gpu/python_runtime_test.py --files .gpu_carry/python_runtime
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(ROOT / "tests" / "gpu"))
import kiln_runtime as kr  # noqa: E402

FAILED: list[str] = []


def report(ok: bool, what: str) -> None:
    print(f"{'PASS' if ok else 'FAIL'}  {what}", flush=True)
    if not ok:
        FAILED.append(what)


def rel_err(out: np.ndarray, ref: np.ndarray) -> float:
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    if out.shape != ref.shape or not np.isfinite(out).all():
        return float("inf")
    return float(np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-30))


def compare(name: str, outs, refs, rtol: float) -> None:
    errs = [rel_err(o, r) for o, r in zip(outs, refs)]
    report(len(outs) == len(refs) and all(e <= rtol for e in errs),
           f"{name}: rel_err {', '.join(f'{e:.2e}' for e in errs)} (rtol {rtol:g})")


def to_numpy(value) -> np.ndarray:
    import torch

    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, kr.DeviceArray):
        return torch.from_dlpack(value).float().cpu().numpy()
    return value.float().cpu().numpy()


def check_torch_free(entry, files: Path) -> None:
    """A host-I/O model run from a process that never imports torch."""
    code = ("import sys, numpy as np, kiln_runtime as kr\n"
            f"ref = np.load({str(files / entry['reference'])!r})\n"
            f"m = kr.Program({str(files / entry['pte'])!r}).method()\n"
            "out = m.execute([ref['set0_input0']])[0]\n"
            "r = ref['set0_output0'].astype(np.float64)\n"
            "err = np.linalg.norm(out - r) / np.linalg.norm(r)\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\n"
            f"print(f'{{err:.2e}}'); sys.exit(0 if err <= {entry['rtol']} else 1)\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python"))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    report(proc.returncode == 0, f"{entry['name']}: numpy only, torch never imported: rel_err "
                                 f"{proc.stdout.strip() or proc.stderr[-800:]}")


def run_model(entry, files: Path) -> None:
    import torch
    from python_runtime_models import build

    name, rtol, device_io = entry["name"], entry["rtol"], entry["device_io"]
    dtype = getattr(torch, entry["model_dtype"])
    method = kr.Program(files / entry["pte"]).method()
    ref = np.load(files / entry["reference"])
    n_in = len(entry["inputs"])
    for k in range(entry["sets"]):
        inputs = [ref[f"set{k}_input{i}"] for i in range(n_in)]
        refs = [ref[f"set{k}_output{j}"] for j in range(entry["num_outputs"])]
        if device_io:
            cuda = [torch.from_numpy(a).cuda() for a in inputs]
            outs = method.execute(cuda)
            report(all(isinstance(o, kr.DeviceArray) and o.device == "cuda:0" for o in outs),
                   f"{name}: device-resident outputs are DeviceArrays on cuda:0 ({outs[0]!r})")
            compare(f"{name} export-time set {k} (torch CUDA in, torch.from_dlpack out)", [to_numpy(o) for o in outs],
                    refs, rtol)
            compare(f"{name} export-time set {k} (DeviceArray.numpy())", [o.numpy() for o in outs], refs, rtol)
        else:
            outs = method.execute(inputs)
            compare(f"{name} export-time set {k} (numpy in, numpy out)", outs, refs, rtol)
            cpu_torch = method.execute([torch.from_numpy(a) for a in inputs])
            compare(f"{name} export-time set {k} (torch CPU tensors via DLPack)", cpu_torch, refs, rtol)

    # Fresh inputs against PyTorch on this GPU.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model = build(entry["factory"], **entry["kwargs"])
    model.load_state_dict(torch.load(files / entry["weights"], map_location="cpu"))
    model = model.cuda().eval()
    seed = int.from_bytes(os.urandom(4), "little")
    gen = torch.Generator(device="cuda").manual_seed(seed)
    for k in range(3):
        xs = [torch.randn(s, generator=gen, device="cuda").to(dtype) for s in entry["inputs"]]
        with torch.no_grad():
            expected = model(*[x.float() for x in xs])
        expected = expected if isinstance(expected, tuple) else (expected,)
        refs = [e.to(dtype).float().cpu().numpy() for e in expected]
        outs = method.execute(xs if device_io else [x.cpu().numpy() for x in xs])
        compare(f"{name} fresh set {k} (seed {seed})", [to_numpy(o) for o in outs], refs, rtol)

    if device_io:
        xs = [torch.randn(s, device="cuda").to(dtype) for s in entry["inputs"]]
        first = method.execute(xs)
        with torch.no_grad():
            again = model(*[x.float() for x in xs])
        again = [e.to(dtype).float().cpu().numpy() for e in (again if isinstance(again, tuple) else (again,))]
        given = [torch.empty(r.shape, dtype=dtype, device="cuda") for r in again]
        outs = method.execute(xs, outputs=given)
        report(all(o is g for o, g in zip(outs, given)) and
               all(rel_err(to_numpy(g), r) <= rtol for g, r in zip(given, again)),
               f"{name}: outputs written into caller-given torch CUDA buffers")
        try:
            torch.from_dlpack(first[0])
            report(False, f"{name}: a DeviceArray from an earlier execute() must be refused")
        except kr.KilnRuntimeError as e:
            report("overwritten by a later" in str(e), f"{name}: stale DeviceArray refused: {e}")
        try:
            method.execute([x.cpu().numpy() for x in xs])
            report(False, f"{name}: host input to a device-resident program must be refused")
        except kr.KilnRuntimeError as e:
            report("on CUDA device 0, got" in str(e) and "on the CPU" in str(e), f"{name}: host input refused: {e}")
    else:
        try:
            method.execute([torch.randn(s, device="cuda") for s in entry["inputs"]])
            report(False, f"{name}: a CUDA tensor given to a host-I/O program must be refused")
        except kr.KilnRuntimeError as e:
            report("on the CPU, got" in str(e) and "on CUDA device 0" in str(e), f"{name}: CUDA input refused: {e}")


def run_dynamic(entry, files: Path) -> None:
    """A batch Dim compiled to one engine per bucket: every bucket's size runs
    and matches PyTorch on this GPU; a size in the range without an engine, and
    one past the range, are refused with an error, never a wrong answer."""
    import torch
    from python_runtime_models import build

    name, rtol, features = entry["name"], entry["rtol"], entry["features"]
    method = kr.Program(files / entry["pte"]).method()
    lo, hi = entry["range"]
    report(method.inputs[0].shape == (hi, features), f"{name}: input planned at the range's max {method.inputs[0].shape}")
    torch.backends.cuda.matmul.allow_tf32 = False
    model = build(entry["factory"], **entry["kwargs"])
    model.load_state_dict(torch.load(files / entry["weights"], map_location="cpu"))
    model = model.cuda().eval()
    gen = torch.Generator(device="cuda").manual_seed(int.from_bytes(os.urandom(4), "little"))
    for size in entry["sizes"] + list(reversed(entry["sizes"])):  # up and down again: variants switch back
        x = torch.randn(size, features, generator=gen, device="cuda")
        with torch.no_grad():
            expected = model(x).cpu().numpy()
        (out,) = method.execute([x.cpu().numpy()])
        report(out.shape == expected.shape and rel_err(out, expected) <= rtol,
               f"{name}: batch {size}: shape {tuple(out.shape)}, rel_err {rel_err(out, expected):.2e} (rtol {rtol:g})")
    for size, why in ((entry["uncompiled"], "inside the range, no engine"), (hi + 1, "past the range")):
        try:
            method.execute([np.random.default_rng(size).standard_normal((size, features), dtype=np.float32)])
            report(False, f"{name}: batch {size} ({why}) must be refused")
        except kr.KilnRuntimeError as e:
            report(True, f"{name}: batch {size} ({why}) refused: {e}")


def run_state_scopes(files: Path) -> None:
    """Program(state_scope=...): scope "a" runs every step of export_state_test's decoder, then
    scope "b" runs them from its own empty cache (a shared cache would hold a's rows, and every
    step reads the whole cache); a second Program in scope "a" sees a's cache (its rerun of the
    last step rewrites that slot with the same values)."""
    from reference_groups import tensor_file

    manifest = json.loads((files / "manifest.json").read_text())
    steps, rtol = manifest["steps"], manifest["rtol"]

    def run(method, t: int) -> float:
        inputs = [np.asarray(v) for v in tensor_file.load(files / f"step_{t}.inputs.ktensors")]
        (expected,) = tensor_file.load(files / f"step_{t}.expected.ktensors")
        return rel_err(method.execute(inputs)[0], np.asarray(expected))

    pte = files / manifest["pte"]
    a = kr.Program(pte, state_scope="py-scope-a").method()
    b = kr.Program(pte, state_scope="py-scope-b").method()
    errs_a = [run(a, t) for t in range(steps)]
    errs_b = [run(b, t) for t in range(steps)]
    report(max(errs_a) <= rtol, f"state scope a: {steps} steps match PyTorch (worst rel_err {max(errs_a):.2e})")
    report(max(errs_b) <= rtol, f"state scope b after a: {steps} steps from its own empty cache match PyTorch "
                                f"(worst rel_err {max(errs_b):.2e})")
    again = run(kr.Program(pte, state_scope="py-scope-a").method(), steps - 1)
    report(again <= rtol, f"a second Program in scope a shares a's cache (rel_err {again:.2e})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=Path, required=True)
    parser.add_argument("--state", type=Path, help="export_state_test.py's files: check Program(state_scope=...)")
    args = parser.parse_args()
    print(f"kiln_runtime library: {kr.library_path()}")
    available, reason = kr.gpu_available()
    report(available, f"KilnBackend sees a GPU{'' if available else ': ' + reason}")
    if not available:
        return 1
    manifest = json.loads((args.files / "manifest.json").read_text())
    host = [e for e in manifest if not e["device_io"] and not e.get("dynamic")]
    if host:
        check_torch_free(host[0], args.files)
    for entry in manifest:
        try:
            (run_dynamic if entry.get("dynamic") else run_model)(entry, args.files)
        except Exception as e:  # one model's failure is reported, the others still run
            report(False, f"{entry['name']}: {type(e).__name__}: {e}")
    if args.state is not None:
        try:
            run_state_scopes(args.state)
        except Exception as e:
            report(False, f"state scopes: {type(e).__name__}: {e}")
    print(f"python runtime: {len(FAILED)} failed" if FAILED else "python runtime: all passed")
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
