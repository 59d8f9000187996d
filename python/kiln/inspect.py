"""`kiln inspect model.pte`: what a Kiln program holds. Every Kiln engine is
parsed and validated in full (checksums included) on the way, so this is also
the check that a .pte is intact.

    kiln inspect model.pte [--json]        (or: python -m kiln inspect ...)

Per method: its delegates in order. Per Kiln engine: the SMs it carries code
for, the options baked in, its inputs and outputs, each step (fused op group
label, GEMM shape or kernel launch shape), and the memory plan (arena size,
each arena tensor's offset and size, weights, weights derived at load). Weights kept in the program's
named data are listed per method, with the methods that share them and
whether the bytes are in this file or in an external .ptd. Exit status 1 on
any problem.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from ._native import native

KILN_BACKENDS = ("KilnBackend",)


def delegate_blobs(data: bytes, path: Path | str = "<bytes>") -> list[dict]:
    """One dict per delegate call in the program: method, backend id, compile
    specs and the processed blob. Raises ValueError if `data` does not parse."""
    return _read_program(data, path)[0]


def named_data_sizes(data: bytes, path: Path | str = "<bytes>") -> dict[str, int]:
    """Key -> byte size of the named data stored in the program file itself
    (not in an external .ptd)."""
    return _read_program(data, path)[1]


def _read_program(data: bytes, path: Path | str) -> tuple[list[dict], dict[str, int]]:
    from executorch.exir._serialize._program import deserialize_pte_binary

    try:
        pte = deserialize_pte_binary(data)
        program = pte.program
        named: dict[str, int] = {}
        if pte.named_data is not None:
            named = {key: len(pte.named_data.buffers[entry.buffer_index])
                     for key, entry in pte.named_data.pte_data.items()}
        out = []
        for plan in program.execution_plan:
            for delegate in plan.delegates:
                out.append({
                    "method": plan.name,
                    "backend": delegate.id,
                    "compile_specs": {s.key: bytes(s.value).decode(errors="replace")
                                      for s in delegate.compile_specs},
                    "blob": bytes(program.backend_delegate_data[delegate.processed.index].data),
                })
    except Exception as e:  # flatbuffer parsing fails in many ways on bad bytes
        raise ValueError(
            f"{path}: not a readable ExecuTorch program (truncated or corrupt: {type(e).__name__}: {e})"
        ) from None
    return out, named


def _tensor(info: dict, index: int) -> dict:
    t = info["tensors"][index]
    return {"index": index, "name": t["name"], "dtype": t["dtype"], "shape": t["shape"],
            "offset": t["offset"], "nbytes": t["nbytes"]}


def code_for_sm(module: dict, sm: int) -> str:
    """What a GPU of `sm` runs of `module`, by the runtime's rule
    (src/runtime/steps/kernel_code_choice.h): "cubin sm_90", "cubin sm_80"
    (same major, older minor), "PTX compute_80" (JIT-compiled at load), or
    "" (refused)."""
    same_major = [c for c in module["sms"] if c // 10 == sm // 10 and c <= sm]
    if same_major:
        return f"cubin sm_{max(same_major)}"
    if module.get("ptx_sm") and module["ptx_sm"] <= sm:
        return f"PTX compute_{module['ptx_sm']}"
    return ""


def _coverage(engine: dict) -> list[dict]:
    """For each SM of the engine's target_sms metadata: the code it runs
    (every module the same way, else the first module's choice with
    the others listed)."""
    modules = engine["modules"]
    targets = [int(s) for s in dict(engine["metadata"]).get("target_sms", "").split(",") if s]
    out = []
    for sm in targets:
        choices = sorted({code_for_sm(m, sm) for m in modules}) if modules else ["library code only"]
        out.append({"sm": sm, "code": " / ".join(c or "none" for c in choices)})
    return out


def _summarize(engine: dict) -> None:
    """Adds the derived views (code SMs, I/O, memory plan) to an engine dict."""
    modules = engine["modules"]
    engine["sms"] = sorted({sm for m in modules for sm in m["sms"]})
    engine["ptx_sms"] = sorted({m["ptx_sm"] for m in modules if m.get("ptx_sm")})
    engine["coverage"] = _coverage(engine)
    engine["io"] = {"inputs": [_tensor(engine, i) for i in engine["inputs"]],
                    "outputs": [_tensor(engine, i) for i in engine["outputs"]]}
    arena = [_tensor(engine, i) for i, t in enumerate(engine["tensors"]) if t["storage"] == "arena"]
    weights = [t for t in engine["tensors"] if t["storage"] == "weight"]
    named = engine["named_weights"]
    derived = engine.setdefault("derived_weights", [])
    for t in engine["tensors"]:
        if t["storage"] == "named_weight":
            named[t["io_index"]].setdefault("tensors", []).append(t["name"])
        elif t["storage"] == "derived_weight":
            derived[t["io_index"]].setdefault("tensors", []).append(t["name"])
    engine["memory_plan"] = {
        "arena_bytes": engine["arena_bytes"],
        "arena_tensors": sorted(arena, key=lambda t: (t["offset"], t["index"])),
        "weights_bytes": engine["weights_bytes"],
        "weight_tensors": len(weights),
        "named_weights_bytes": sum(n["nbytes"] for n in named),
        "named_weight_tensors": len(named),
        "derived_weights_bytes": sum(d["nbytes"] for d in derived),
        "derived_weights": [{"name": d["name"], "nbytes": d["nbytes"], "copies": d["copies"]} for d in derived],
    }


def _share(engines: list[dict], in_file: dict[str, int]) -> dict:
    """Per method: its named weights (each key once), bytes, and which other
    methods use the same keys. Marks each engine's weights with where they
    are stored and the other methods sharing them."""
    keys: dict[str, dict[str, int]] = {}  # method -> key -> nbytes
    for e in engines:
        for n in e["named_weights"]:
            keys.setdefault(e["method"], {})[n["key"]] = n["nbytes"]
    methods = {}
    for method, mine in keys.items():
        shared = {}
        for other, theirs in keys.items():
            common = set(mine) & set(theirs)
            if other != method and common:
                shared[other] = {"tensors": len(common), "bytes": sum(mine[k] for k in common)}
        methods[method] = {"weight_tensors": len(mine), "weight_bytes": sum(mine.values()),
                           "shared_with": shared}
    for e in engines:
        mine = {n["key"] for n in e["named_weights"]}
        e["weights_shared_with"] = sorted(m for m, theirs in keys.items()
                                          if m != e["method"] and mine & set(theirs))
        stored = {"file" if n["key"] in in_file else "external" for n in e["named_weights"]}
        e["weights_stored"] = "+".join(sorted(stored)) if stored else ""
    return methods


def _variants(blob: bytes) -> list[tuple[dict | None, bytes]]:
    """[(None, engine)] for one engine; for a dynamic partition's variant set,
    each engine with its variant: index, count, sizes and the shape model."""
    if not native().is_variant_set(blob):
        return [(None, blob)]
    parts = native().unpack_variant_set(blob)
    symbols = [{"name": n, "min": lo, "max": hi,
                "dims": [{"input": i, "dim": d} for i, d, s in parts["bindings"] if s == k]}
               for k, (n, lo, hi) in enumerate(parts["symbols"])]
    count = len(parts["engines"])
    values = parts["values"]
    # Equal values: alternatives for one shape, in order of preference (variant_set.h).
    alternative = [0] * count
    for v in range(1, count):
        if values[v] == values[v - 1]:
            alternative[v] = alternative[v - 1] + 1
    return [({"index": v, "count": count, "symbols": symbols, "alternative": alternative[v],
              "sizes": {sym["name"]: value for sym, value in zip(symbols, values[v])}}, engine)
            for v, engine in enumerate(parts["engines"])]


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def inspect_pte(path: str | Path) -> dict:
    """A JSON-ready description of the program at `path`. Raises ValueError
    naming the file (and the delegate) when it is not a valid Kiln program,
    OSError when it cannot be read."""
    path = Path(path)
    data = path.read_bytes()
    if len(data) < 8 or data[4:8] != b"ET12":
        raise ValueError(f"{path}: not an ExecuTorch program (no 'ET12' identifier at bytes 4..8)")
    methods: dict[str, list[str]] = {}
    engines = []
    blobs, in_file = _read_program(data, path)
    for index, d in enumerate(blobs):
        methods.setdefault(d["method"], []).append(d["backend"])
        if d["backend"] not in KILN_BACKENDS:
            continue
        try:
            variants = _variants(d["blob"])
            for variant, blob in variants:
                engine = native().inspect_engine(blob)
                for m in engine["modules"]:
                    m.pop("source", None)
                engine.update(method=d["method"], delegate_index=index, backend=d["backend"],
                              bytes=len(blob), compile_specs=d["compile_specs"])
                if variant is not None:
                    engine["variant"] = variant
                _summarize(engine)
                engines.append(engine)
        except ValueError as e:
            raise ValueError(f"{path}: delegate {index} ({d['backend']} in '{d['method']}'): {e}") from None
    weights = _share(engines, in_file)
    used = {n["key"]: n["nbytes"] for e in engines for n in e["named_weights"]}
    named_data = {
        "in_file": {"entries": sum(1 for k in used if k in in_file),
                    "bytes": sum(n for k, n in used.items() if k in in_file)},
        "external": {"entries": sum(1 for k in used if k not in in_file),
                     "bytes": sum(n for k, n in used.items() if k not in in_file)},
    }
    return {"file": str(path), "bytes": len(data), "delegates": methods, "engines": engines,
            "method_weights": weights, "named_data": named_data}


def _shape(t: dict) -> str:
    return f"{t['dtype']} [{', '.join(map(str, t['shape']))}]"


def _step_line(number: int, s: dict) -> str:
    if s["kind"] == "gemm":
        return f"    {number:>3} gemm   {s['label']:<24} m={s['m']} n={s['n']} k={s['k']} epilogue={s['epilogue']}"
    if s["kind"] == "conv":
        return f"    {number:>3} conv   {s['label']:<24} {s.get('summary', '')}"
    grid = "x".join(map(str, s["grid"]))
    block = "x".join(map(str, s["block"]))
    smem = f" smem={s['shared_bytes']}" if s.get("shared_bytes") else ""
    if s.get("min_blocks"):
        # A persistent kernel: the runtime launches what is co-resident on the GPU, up to grid[0].
        grid = f"<={s['grid'][0]} (persistent, min {s['min_blocks']})"
    return f"    {number:>3} kernel {s['label']:<24} {s['function']} grid={grid} block={block}{smem}"


def _describe_engine(e: dict) -> list[str]:
    code = ", ".join(f"sm_{s}" for s in e["sms"]) or "none (library GEMMs only)"
    code += "".join(f" + PTX compute_{p}" for p in e["ptx_sms"])
    meta = dict(e["metadata"])
    meta.setdefault("use_cuda_graphs", "not baked (runtime decides)")
    plan = e["memory_plan"]
    v = e.get("variant")
    title = f"engine {e['delegate_index']} ({e['backend']} in '{e['method']}')"
    lines = []
    if v is not None and v["symbols"]:
        if v["index"] == 0:
            dims = "; ".join(f"{s['name']} in [{s['min']}, {s['max']}] at "
                             + ", ".join(f"input {b['input']} dim {b['dim']}" for b in s["dims"])
                             for s in v["symbols"])
            lines.append(f"{title}: dynamic shapes, {v['count']} variants (one engine per size; other sizes "
                         f"are refused): {dims}")
        title += f" variant {v['index'] + 1}/{v['count']} (" + ", ".join(f"{k}={n}" for k, n in v["sizes"].items()) + ")"
    if v is not None and v.get("alternative", 0) > 0:
        title += (f" fallback {v['alternative']} (runs where the engine before it cannot: a GPU or stream too small"
                  " for its persistent kernel)")
    lines += [
        f"{title}: {e['bytes']:,} bytes",
        f"  code for: {code}",
    ]
    if e["modules"] and e["coverage"]:
        def how(c: dict) -> str:
            if c["code"] == f"cubin sm_{c['sm']}":
                return "cubin"
            if c["code"].startswith("cubin "):
                return c["code"].removeprefix("cubin ") + " cubin"
            return c["code"] + (" JIT at load" if c["code"].startswith("PTX") else "")
        lines.append("  target SMs covered: " + ", ".join(f"sm_{c['sm']} ({how(c)})" for c in e["coverage"]))
    lines += [
        "  options baked in: " + ", ".join(f"{k}={v}" for k, v in sorted(meta.items()) if k != "input_bounds"),
        "  compile specs: " + ", ".join(f"{k}={v}" for k, v in sorted(e["compile_specs"].items())),
    ]
    # Index inputs (engine_format/input_bounds.h): "<input> <lo> <hi> <what>" a line.
    bounds = {}
    for line in meta.get("input_bounds", "").splitlines():
        i, lo, hi, what = line.split(" ", 3)
        bounds[int(i)] = f" indexes {what}: values in [{lo}, {hi}), checked before each run when passed from host memory"
    for kind in ("inputs", "outputs"):
        for i, t in enumerate(e["io"][kind]):
            lines.append(f"  {kind[:-1]} {i}: {t['name']} {_shape(t)}" + (bounds.get(i, "") if kind == "inputs" else ""))
    lines.append(f"  steps ({len(e['steps'])}; label = the fused op group):")
    lines += [_step_line(n, s) for n, s in enumerate(e["steps"], 1)]
    lines.append(f"  memory plan: arena {plan['arena_bytes']:,} B, weights {plan['weights_bytes']:,} B "
                 f"in {plan['weight_tensors']} tensors inside the engine")
    if plan["named_weight_tensors"]:
        where = {"file": "in this file", "external": "in an external .ptd",
                 "external+file": "in this file and an external .ptd"}[e["weights_stored"]]
        shared = e["weights_shared_with"]
        lines.append(f"  weights: {plan['named_weight_tensors']} tensors, {_size(plan['named_weights_bytes'])} "
                     f"({plan['named_weights_bytes']:,} B) as named data {where}"
                     + (", shared with " + ", ".join(f"method '{m}'" for m in shared) if shared else ""))
    if plan["derived_weights"]:
        lines.append(f"  derived weights (made on the GPU at load from the weights): "
                     f"{_size(plan['derived_weights_bytes'])} ({plan['derived_weights_bytes']:,} B)")
        for d in plan["derived_weights"]:
            lines.append(f"    {d['name']}: {d['nbytes']:,} B from {d['copies']:,} copies")
    for t in plan["arena_tensors"]:
        lines.append(f"    arena offset {t['offset']:>10,} size {t['nbytes']:>10,}  {t['name']} {_shape(t)}")
    return lines


def describe(info: dict) -> str:
    """The human-readable report of an inspect_pte() result."""
    lines = [f"{info['file']}: {info['bytes']:,} bytes, {len(info['delegates'])} method(s) with delegates"]
    for method, backends in info["delegates"].items():
        line = f"method '{method}': {len(backends)} delegate(s) {backends}"
        w = info.get("method_weights", {}).get(method)
        if w:
            line += f"; weights: {w['weight_tensors']} tensors, {_size(w['weight_bytes'])}"
            line += "".join(f", {s['tensors']} ({_size(s['bytes'])}) shared with method '{other}'"
                            for other, s in sorted(w["shared_with"].items()))
        lines.append(line)
    nd = info.get("named_data")
    if nd and (nd["in_file"]["entries"] or nd["external"]["entries"]):
        parts = []
        if nd["in_file"]["entries"]:
            parts.append(f"{nd['in_file']['entries']} weights, {_size(nd['in_file']['bytes'])} in this file")
        if nd["external"]["entries"]:
            parts.append(f"{nd['external']['entries']} weights, {_size(nd['external']['bytes'])} in an "
                         "external .ptd (load with data_path)")
        lines.append("named data (each stored once): " + "; ".join(parts))
    if not info["delegates"]:
        lines.append("no delegates: everything runs on ExecuTorch's CPU kernels")
    for e in info["engines"]:
        lines += _describe_engine(e)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kiln inspect", description="Describe and validate a Kiln .pte")
    parser.add_argument("pte", type=Path)
    parser.add_argument("--json", action="store_true", help="print JSON for machines")
    args = parser.parse_args(argv)
    try:
        info = inspect_pte(args.pte)
    except (OSError, ValueError) as e:
        print(f"kiln inspect: {e}", file=sys.stderr)
        return 1
    try:
        print(json.dumps(info, indent=1) if args.json else describe(info))
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader stopped early (`kiln inspect m.pte | head`): not an error.
        # Point stdout at devnull so the interpreter's final flush stays quiet.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0
