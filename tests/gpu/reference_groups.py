"""Reference groups: programs whose PyTorch reference travels with them.

Some models cannot be rebuilt on the GPU machine (Hugging Face transformers
is not installed there), so the CPU machine computes PyTorch's outputs for a
few fixed trials of random inputs and carries them beside the .pte. A group
is one folder (written by tests/gpu/export_hf_models.py):

    GROUP/manifest_reference.json   list of entries (below)
    GROUP/<archive>.tar.xz          the .pte files and the trials' tensor files

An entry: name, pte, archive, dtype (the program's), rtol, outputs (names),
output_dtypes, and trials: [{seed, inputs, reference}], where `inputs` and
`reference` are .ktensors files in the archive (docs/tensor_file_format.md);
references are float32 (for a float16/bfloat16 program: its weights
evaluated in float32), so the comparison measures Kiln's error alone.

On the GPU machine (tests/gpu/run_gpu_tests.py --reference-groups) each
trial runs the .pte with kiln_runner on the carried inputs, the runner writes
its outputs (--save_outputs) and `compare()` measures each output's
norm-relative error ||out - ref|| / ||ref|| in float64 against the entry's
tolerance. Pure Python + numpy (torch only to read bfloat16 tensor files);
no ExecuTorch, no transformers.
"""

from __future__ import annotations

import importlib.util
import json
import math
import re
import subprocess
import tarfile
from pathlib import Path

import numpy as np

MANIFEST = "manifest_reference.json"
ROOT = Path(__file__).resolve().parents[2]


def _tensor_file_module():
    # kiln/__init__ imports ExecuTorch, which the GPU machine lacks; the
    # tensor file module itself needs only numpy.
    spec = importlib.util.spec_from_file_location("kiln_tensor_file_ref", ROOT / "python/kiln/tensor_file.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


tensor_file = _tensor_file_module()


class GroupError(Exception):
    """A reference group (or one of its files) is missing or inconsistent."""


def dtype_name(value) -> str:
    """'float32', 'float16', 'bfloat16', 'int64', ... of a numpy array or torch tensor."""
    name = str(value.dtype)
    return name.replace("torch.", "")


def as_float64(value) -> np.ndarray:
    """A numpy array or torch tensor (bfloat16 included) as float64 numpy."""
    if isinstance(value, np.ndarray):
        return value.astype(np.float64)
    return value.detach().to("cpu").double().numpy()  # torch.Tensor (bfloat16 from tensor_file.load)


def norm_rel_err(out, ref) -> float:
    """||out - ref||_2 / ||ref||_2 in float64. Any NaN/Inf in either is inf;
    a zero reference gives 0 only for an exactly zero output, else inf."""
    o, r = as_float64(out), as_float64(ref)
    if not (np.isfinite(o).all() and np.isfinite(r).all()):
        return math.inf
    diff = float(np.linalg.norm((o - r).ravel()))
    norm = float(np.linalg.norm(r.ravel()))
    if norm == 0.0:
        return 0.0 if diff == 0.0 else math.inf
    return diff / norm


def compare(outputs, references, rtol: float, output_dtypes=None) -> tuple[bool, list[float], str]:
    """(ok, norm-relative error per output, '' or what was wrong). The count
    and every shape must match; with `output_dtypes`, so must each output's
    dtype; each error must be <= rtol."""
    if len(outputs) != len(references):
        return False, [], f"{len(outputs)} outputs, the reference has {len(references)}"
    errors, problems = [], []
    for i, (out, ref) in enumerate(zip(outputs, references)):
        if tuple(out.shape) != tuple(ref.shape):
            problems.append(f"output {i}: shape {list(out.shape)} != reference {list(ref.shape)}")
            errors.append(math.inf)
            continue
        if output_dtypes is not None and dtype_name(out) != output_dtypes[i]:
            problems.append(f"output {i}: dtype {dtype_name(out)}, expected {output_dtypes[i]}")
        err = norm_rel_err(out, ref)
        errors.append(err)
        if not err <= rtol:
            problems.append(f"output {i}: rel_err {err:.3e} > rtol {rtol:g}")
    return not problems, errors, "; ".join(problems)


def find_groups(paths) -> tuple[list[Path], list[Path]]:
    """(group folders, paths that hold none): each path is a group (it holds
    manifest_reference.json) or a folder of groups (e.g. .gpu_carry)."""
    groups, missing = [], []
    for p in map(Path, paths):
        if (p / MANIFEST).is_file():
            groups.append(p)
            continue
        found = sorted(q.parent for q in p.glob(f"*/{MANIFEST}")) if p.is_dir() else []
        if found:
            groups += found
        else:
            missing.append(p)
    return groups, missing


def load_group(group: Path, unpack_dir: Path) -> list[dict]:
    """The group's entries with 'pte_path' and each trial's 'inputs_path' and
    'reference_path' set, the archives unpacked under unpack_dir/<group>.
    Raises GroupError naming the missing or broken file."""
    try:
        entries = json.loads((group / MANIFEST).read_text())
    except (OSError, ValueError) as e:
        raise GroupError(f"{group / MANIFEST}: cannot be read: {e}") from e
    target = Path(unpack_dir) / group.name
    target.mkdir(parents=True, exist_ok=True)
    unpacked: set[str] = set()
    out = []
    for e in entries:
        archive = group / e["archive"]
        if e["archive"] not in unpacked:
            if not archive.is_file():
                raise GroupError(f"{e['name']}: archive {archive} is not here")
            try:
                with tarfile.open(archive, "r:xz") as tar:
                    try:
                        tar.extractall(target, filter="data")
                    except TypeError:  # Python without extraction filters
                        tar.extractall(target)
            except (tarfile.TarError, OSError, EOFError) as e2:
                raise GroupError(f"{archive}: cannot be unpacked: {e2}") from e2
            unpacked.add(e["archive"])
        entry = {**e, "group": group.name, "pte_path": str(target / e["pte"]), "trials": []}
        for t in e["trials"]:
            entry["trials"].append({**t, "inputs_path": str(target / t["inputs"]),
                                    "reference_path": str(target / t["reference"])})
        for path in [entry["pte_path"]] + [p for t in entry["trials"] for p in (t["inputs_path"], t["reference_path"])]:
            if not Path(path).is_file():
                raise GroupError(f"{e['name']}: {Path(path).name} is not in {archive.name}")
        out.append(entry)
    return out


def check_entry(entry: dict, runner, work: Path, log, runner_args=("--num_runs=10", "--warmup=2"),
                rtol: float | None = None) -> list[dict]:
    """Runs every trial of `entry` with kiln_runner on its carried inputs and
    compares the saved outputs with the carried reference, within `rtol`
    (default the entry's). One result per trial: {seed, ok, rel_err (per
    output), detail, median_ms, rtol, torch_rel_err (PyTorch's own error in
    the program's dtype, measured on the CPU at export, for scale)}."""
    rtol = entry["rtol"] if rtol is None else rtol
    work.mkdir(parents=True, exist_ok=True)
    results = []
    for i, trial in enumerate(entry["trials"]):
        saved = work / f"{entry['name']}.{i}.outputs.ktensors"
        saved.unlink(missing_ok=True)
        cmd = [str(runner), f"--model_path={entry['pte_path']}", f"--inputs={trial['inputs_path']}",
               f"--save_outputs={saved}", *runner_args, *entry.get("runner_args", [])]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        log.write("$ " + " ".join(cmd) + "\n" + proc.stdout + proc.stderr + f"[exit {proc.returncode}]\n\n")
        m = re.search(r"median ([0-9.]+) ms", proc.stdout)
        result = {"seed": trial["seed"], "ok": False, "rel_err": [], "detail": "",
                  "median_ms": float(m.group(1)) if m else float("nan"), "rtol": rtol,
                  "torch_rel_err": trial.get("torch_rel_err", [])}
        if proc.returncode != 0 or not saved.is_file():
            last = (proc.stdout + proc.stderr).strip().splitlines() or ["no output"]
            result["detail"] = f"kiln_runner exit {proc.returncode}: {last[-1][:200]}"
        else:
            ok, errors, detail = compare(tensor_file.load(saved), tensor_file.load(trial["reference_path"]),
                                         rtol, entry.get("output_dtypes"))
            result.update(ok=ok, rel_err=errors, detail=detail)
        results.append(result)
    return results


def result_line(entry: dict, result: dict) -> str:
    """PASS/FAIL line of one trial."""
    names = entry.get("outputs") or [str(i) for i in range(len(result["rel_err"]))]
    errs = ", ".join(f"{n} {e:.2e}" for n, e in zip(names, result["rel_err"])) or "-"
    line = (f"{'PASS' if result['ok'] else 'FAIL'}  {entry['name']:<24} seed={result['seed']:<11} "
            f"rel_err: {errs} (rtol {result['rtol']:g})")
    if entry.get("dtype", "float32") != "float32" and result.get("torch_rel_err"):
        line += f" (torch {entry['dtype']} on the CPU: {', '.join(f'{e:.2e}' for e in result['torch_rel_err'])})"
    line += f"  kiln_runner median {result['median_ms']:.3f} ms"
    return line + (f"  [{result['detail']}]" if result["detail"] else "")
