#!/usr/bin/env python3
"""CPU machine: exports the Hugging Face models (tests/gpu/hf_models.py:
BertModel, LlamaForCausalLM) with Kiln and writes reference groups, the
.pte files with PyTorch's outputs for fixed trials of random inputs, for
tests/gpu/run_gpu_tests.py --reference-groups (the GPU machine has no
transformers, so the reference cannot be computed there).

    PYTHONPATH=python python3 tests/gpu/export_hf_models.py --out .gpu_carry \\
        [--groups hf_bert,hf_llama] [--trials 2] [--size full|tiny] [--keep-pte DIR]

Groups (one folder each under --out, independently runnable):

  hf_bert   BertModel (base) float32 and float16, batch 1 (2 trials) and
            batch 8 (1 trial: its float32 reference is 3 MiB a trial)
  hf_llama  LlamaForCausalLM (100M parameters) float32, float16, bfloat16,
            batch 1, 2 trials each

For each program:
  * the model is built with deterministic weights in the program's dtype,
    exported (torch.export, example inputs from seed 0) and compiled with
    kiln.compile(enabled_precisions={dtype}); every op must be inside Kiln
    engines (exit 1 naming the ops otherwise; --allow-cpu-fallback goes on);
  * each trial draws fresh inputs from a seed taken from os.urandom (recorded)
    and computes the reference in float32: for a float16/bfloat16 program,
    its own (rounded) weights evaluated in float32, so the GPU comparison
    measures Kiln's error alone;
  * checks on the CPU, recorded in the manifest and printed: the reference
    and inputs read back from their files equal the eager HF model's output
    (called directly, not through the export wrapper) on those inputs; the
    exported program (before Kiln) gives the eager model's output on those
    fresh inputs (nothing specialized on the example inputs); PyTorch's own
    error in the program's dtype against the reference (for scale); the
    largest |activation|, which must stay in float16's range.

Each (model, dtype) becomes one xz archive holding its .pte files (the batch
8 program's weights are the batch 1 program's, so a dictionary spanning both
makes the second nearly free) and its trials' .ktensors files; a group folder
holds its archives and manifest_reference.json. Sizes are printed at the end.
"""

from __future__ import annotations

import argparse
import copy
import json
import lzma
import os
import shutil
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import hf_models  # noqa: E402
import reference_groups  # noqa: E402

SHORT = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}
# Norm-relative tolerances on the GPU (issue 11): the reference is float32.
RTOL = {"float32": 1e-4, "float16": 1e-2, "bfloat16": 1e-2}
OUTPUTS = {"bert": ["last_hidden_state", "pooler_output"],
           "llama": [f"logits_last{hf_models.LLAMA_LOGITS}", "last_hidden_state"]}
FP16_MAX = 65504.0
# (model, dtype, batch, trials) per group.
GROUPS = {
    "hf_bert": [("bert", "float32", 1, 2), ("bert", "float32", 8, 1),
                ("bert", "float16", 1, 2), ("bert", "float16", 8, 1)],
    "hf_llama": [("llama", "float32", 1, 2), ("llama", "float16", 1, 2), ("llama", "bfloat16", 1, 2)],
}


def entry_name(model: str, dtype: str, batch: int) -> str:
    return f"hf_{model}_{SHORT[dtype]}_b{batch}"


def _as_list(out) -> list[torch.Tensor]:
    return [out] if isinstance(out, torch.Tensor) else list(out)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return reference_groups.norm_rel_err(out.detach().float().numpy(), ref.detach().float().numpy())


def eager_direct(name: str, model: torch.nn.Module, inputs) -> list[torch.Tensor]:
    """The HF model's outputs called directly (not through the wrapper that
    was exported), in the wrapper's output order."""
    with torch.no_grad():
        if name == "bert":
            out = model.bert(input_ids=inputs[0], attention_mask=inputs[1])
            return [out.last_hidden_state, out.pooler_output]
        lm = model.lm
        full = lm(input_ids=inputs[0], use_cache=False).logits  # every position
        hidden = lm.model(input_ids=inputs[0], use_cache=False).last_hidden_state
        return [full[:, -model.logits_to_keep:], hidden]


def export_program(name: str, dtype: str, batch: int, trials: int, size: str, out: Path, target_sms,
                   allow_cpu: bool, seed_source=os.urandom) -> dict:
    """Exports one program into `out` (its .pte and trial files); returns its
    manifest entry (without 'archive')."""
    import kiln

    ename = entry_name(name, dtype, batch)
    torch_dtype = hf_models.DTYPES[dtype]
    model, example = hf_models.build(name, torch_dtype, size, batch=batch)
    start = time.perf_counter()
    with torch.no_grad():
        exported = torch.export.export(model, example, strict=False)
    compiled = kiln.compile(exported, arg_inputs=example, enabled_precisions={torch_dtype}, min_block_size=1,
                            target_sms=target_sms)
    pte = kiln.save(compiled, out / f"{ename}.pte")
    export_s = time.perf_counter() - start
    cpu_ops = dict(compiled.summary.ops_on_cpu)
    n_cpu = sum(cpu_ops.values())
    print(f"{ename}: exported in {export_s:.1f} s, {pte.stat().st_size / 2**20:.1f} MiB, delegates "
          f"{compiled.delegates}, {n_cpu} ops on the CPU{': ' + str(cpu_ops) if cpu_ops else ''}", flush=True)
    if n_cpu or set(compiled.delegates) != {"KilnBackend"}:
        message = f"{ename}: {n_cpu} op(s) left to the CPU ({cpu_ops}); every op must be inside Kiln engines"
        if not allow_cpu:
            raise SystemExit(message + " (--allow-cpu-fallback to continue)")
        print("WARNING " + message, flush=True)

    # The reference model: the program's weights (rounded to its dtype) in float32.
    exact = model if torch_dtype == torch.float32 else copy.deepcopy(model).float()
    program_module = exported.module()
    entry_trials = []
    for i in range(trials):
        seed = int.from_bytes(seed_source(4), "little")
        inputs = hf_models.random_inputs(name, batch, torch.Generator().manual_seed(seed), size)
        t0 = time.perf_counter()
        peak = hf_models.activation_peak(exact, inputs)
        with torch.no_grad():
            reference = [t.float() for t in _as_list(exact(*inputs))]
        inputs_file, reference_file = f"{ename}.t{i}.inputs.ktensors", f"{ename}.t{i}.reference.ktensors"
        reference_groups.tensor_file.save(out / inputs_file, list(inputs))
        reference_groups.tensor_file.save(out / reference_file, reference)
        # Read back; compare with the HF model called directly.
        stored_in = [torch.from_numpy(a) for a in reference_groups.tensor_file.load(out / inputs_file)]
        stored_ref = [torch.from_numpy(a) for a in reference_groups.tensor_file.load(out / reference_file)]
        if any(not torch.equal(a, b) for a, b in zip(stored_in, inputs)):
            raise SystemExit(f"{ename} trial {i}: inputs read back from {inputs_file} differ")
        direct = [t.float() for t in eager_direct(name, exact, stored_in)]
        ref_vs_eager = max(rel_err(a, b) for a, b in zip(stored_ref, direct))
        # The exported program and the eager model in the program's dtype,
        # on these fresh inputs; the latter against the reference is
        # PyTorch's own low-precision error.
        with torch.no_grad():
            eager = _as_list(model(*inputs))
            via_export = _as_list(program_module(*inputs))
        export_vs_eager = max(rel_err(a, b) for a, b in zip(via_export, eager))
        torch_err = [rel_err(a, b) for a, b in zip(eager, reference)]
        trial = {"seed": seed, "inputs": inputs_file, "reference": reference_file,
                 "reference_vs_eager_hf": ref_vs_eager, "exported_vs_eager": export_vs_eager,
                 "torch_rel_err": torch_err, "max_abs_activation": peak}
        print(f"  trial {i} seed={seed}: reference vs eager HF {ref_vs_eager:.1e}, exported program vs eager "
              f"{export_vs_eager:.1e}, torch {dtype} rel_err {', '.join(f'{e:.2e}' for e in torch_err)}, "
              f"max |activation| {peak:.1f} ({time.perf_counter() - t0:.1f} s)", flush=True)
        bad = []
        if ref_vs_eager > 1e-6:
            bad.append(f"the stored reference differs from the eager HF model ({ref_vs_eager:.2e})")
        # float32 is the strict check (the same export path serves every
        # dtype); in float16/bfloat16 the exported graph may round in another
        # order, so only a gross difference (a specialization) counts.
        if export_vs_eager > (1e-5 if dtype == "float32" else 1e-1):
            bad.append(f"the exported program differs from the eager model on fresh inputs ({export_vs_eager:.2e})")
        if not peak < FP16_MAX / 4:
            bad.append(f"activations reach {peak:.0f}, too close to float16's range")
        if bad:
            raise SystemExit(f"{ename} trial {i}: " + "; ".join(bad))
        entry_trials.append(trial)
    return {
        "name": ename, "model": name, "size": size, "dtype": dtype, "batch": batch, "pte": pte.name,
        "rtol": RTOL[dtype], "outputs": OUTPUTS[name],
        "output_dtypes": [dtype] * len(OUTPUTS[name]),
        "output_shapes": [list(t.shape) for t in reference],
        "inputs": [[list(t.shape), str(t.dtype).replace("torch.", "")] for t in example],
        "reference": "float32: the program's weights (in its dtype) evaluated in float32, on the CPU",
        "trials": entry_trials,
        "weight_seed": hf_models.DEFAULT_SEED, "checksum": hf_models.checksum(model),
        "parameters": hf_models.parameter_count(model),
        "config": model_config(model),
        "delegates": list(compiled.delegates), "cpu_fallback_ops": n_cpu, "cpu_ops": cpu_ops,
        "export_s": round(export_s, 2), "pte_bytes": pte.stat().st_size, "target_sms": list(target_sms),
        "torch": torch.__version__, "transformers": _transformers_version(),
    }


def model_config(model: torch.nn.Module) -> dict:
    inner = model.bert if hasattr(model, "bert") else model.lm
    keys = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "intermediate_size",
            "vocab_size", "tie_word_embeddings", "_attn_implementation")
    return {k: getattr(inner.config, k) for k in keys if hasattr(inner.config, k)}


def _transformers_version() -> str:
    import transformers

    return transformers.__version__


def pack(archive: Path, members: list[Path]) -> int:
    """One xz'd tar of `members`; the dictionary spans the largest member
    (so a second program with the same weights costs almost nothing)."""
    largest = max(p.stat().st_size for p in members)
    dict_size = 1 << 23 if len(members) == 1 else max(1 << 23, largest + (16 << 20))
    filters = [{"id": lzma.FILTER_LZMA2, "preset": 6, "dict_size": min(dict_size, 1536 << 20)}]
    with lzma.open(archive, "wb", format=lzma.FORMAT_XZ, filters=filters) as raw:
        with tarfile.open(fileobj=raw, mode="w") as tar:
            for p in members:
                tar.add(p, arcname=p.name)
    return archive.stat().st_size


def write_group(group: str, programs, size: str, out: Path, trials: int | None, target_sms, allow_cpu: bool,
                keep_pte: Path | None = None) -> dict:
    """Exports `programs` [(model, dtype, batch, trials)] into out/<group>;
    returns {group, entries, bytes}."""
    folder = out / group
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    staging = Path(tempfile.mkdtemp(prefix=f"kiln_{group}_"))
    try:
        entries = [export_program(m, d, b, trials or n, size, staging, target_sms, allow_cpu)
                   for m, d, b, n in programs]
        by_archive: dict[str, list[dict]] = {}
        for e in entries:
            by_archive.setdefault(f"hf_{e['model']}_{SHORT[e['dtype']]}.tar.xz", []).append(e)
        for archive, members in by_archive.items():
            files = [staging / e["pte"] for e in members]  # programs first, the batch-1 one leading
            files += [staging / t[k] for e in members for t in e["trials"] for k in ("inputs", "reference")]
            t0 = time.perf_counter()
            packed = pack(folder / archive, files)
            raw = sum(p.stat().st_size for p in files)
            print(f"  {group}/{archive}: {raw / 2**20:.1f} MiB -> {packed / 2**20:.2f} MiB xz "
                  f"({time.perf_counter() - t0:.0f} s)", flush=True)
            for e in members:
                e["archive"] = archive
            if keep_pte:
                keep_pte.mkdir(parents=True, exist_ok=True)
                for p in files:
                    shutil.copy2(p, keep_pte / p.name)
        (folder / reference_groups.MANIFEST).write_text(json.dumps(entries, indent=1))
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return {"group": group, "entries": entries, "bytes": sum(p.stat().st_size for p in folder.iterdir())}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True,
                        help="carry folder (e.g. .gpu_carry); one subfolder per group")
    parser.add_argument("--groups", default=",".join(GROUPS), help=f"comma-separated, of {', '.join(GROUPS)}")
    parser.add_argument("--dtypes", default="", help="only these dtypes (e.g. float16,bfloat16); default all")
    parser.add_argument("--trials", type=int, help="trials per program (default: the group's, 2 or 1)")
    parser.add_argument("--size", choices=("full", "tiny"), default="full",
                        help="tiny: small configs through the same code (for tests)")
    parser.add_argument("--target-sms", default="90", help="SMs to build cubins for (default 90: the H200)")
    parser.add_argument("--allow-cpu-fallback", action="store_true",
                        help="development: continue when ops are left to the CPU (recorded in the manifest)")
    parser.add_argument("--keep-pte", type=Path, help="also keep the unpacked .pte and tensor files here")
    args = parser.parse_args(argv)
    groups = [g for g in args.groups.split(",") if g]
    for g in groups:
        if g not in GROUPS:
            parser.error(f"unknown group {g}; known: {', '.join(GROUPS)}")
    dtypes = {d for d in args.dtypes.split(",") if d}
    unknown = dtypes - set(SHORT)
    if unknown:
        parser.error(f"unknown dtype(s) {', '.join(sorted(unknown))}; float32, float16 or bfloat16")
    target_sms = tuple(int(s) for s in args.target_sms.split(",") if s)
    import transformers

    print(f"torch {torch.__version__}, transformers {transformers.__version__}; target SMs {target_sms}", flush=True)
    written = []
    for g in groups:
        programs = [p for p in GROUPS[g] if not dtypes or p[1] in dtypes]
        written.append(write_group(g, programs, args.size, args.out, args.trials, target_sms,
                                   args.allow_cpu_fallback, args.keep_pte))
    for w in written:
        names = ", ".join(f"{e['name']} ({e['export_s']:.0f} s, {e['pte_bytes'] / 2**20:.0f} MiB)"
                          for e in w["entries"])
        print(f"group {args.out / w['group']}: {w['bytes'] / 2**20:.2f} MiB: {names}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
