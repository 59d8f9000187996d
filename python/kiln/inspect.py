"""`kiln inspect model.pte`: what a Kiln program holds. Every Kiln engine is
parsed and validated in full (checksums included) on the way, so this is also
the check that a .pte is intact.

    python -m kiln inspect model.pte [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ._native import native


def delegate_blobs(data: bytes) -> list[dict]:
    """One dict per delegate call in the program: method, backend id, compile
    specs and the processed blob."""
    from executorch.exir._serialize._program import deserialize_pte_binary

    program = deserialize_pte_binary(data).program
    out = []
    for plan in program.execution_plan:
        for delegate in plan.delegates:
            out.append({
                "method": plan.name,
                "backend": delegate.id,
                "compile_specs": {s.key: bytes(s.value).decode(errors="replace") for s in delegate.compile_specs},
                "blob": bytes(program.backend_delegate_data[delegate.processed.index].data),
            })
    return out


def inspect_pte(path: str | Path) -> dict:
    """A JSON-ready description of the program at `path`. Raises ValueError
    naming the file and the delegate when a Kiln engine is corrupt."""
    path = Path(path)
    data = path.read_bytes()
    if data[4:8] != b"ET12":
        raise ValueError(f"{path}: not an ExecuTorch program (no 'ET12' identifier at bytes 4..8)")
    methods: dict[str, list[str]] = {}
    engines = []
    for index, d in enumerate(delegate_blobs(data)):
        methods.setdefault(d["method"], []).append(d["backend"])
        if d["backend"] != "KilnBackend":
            continue
        try:
            engine = native().inspect_engine(d["blob"])
        except ValueError as e:
            raise ValueError(f"{path}: delegate {index} ({d['backend']} in '{d['method']}'): {e}") from None
        for m in engine["modules"]:
            m.pop("source", None)
        engine.update(method=d["method"], delegate_index=index, bytes=len(d["blob"]),
                      compile_specs=d["compile_specs"])
        engines.append(engine)
    return {"file": str(path), "bytes": len(data), "delegates": methods, "engines": engines}


def _describe(info: dict) -> str:
    lines = [f"{info['file']}: {info['bytes']:,} bytes"]
    for method, backends in info["delegates"].items():
        lines.append(f"method '{method}': delegates {backends}")
    for e in info["engines"]:
        sms = sorted({sm for m in e["modules"] for sm in m["sms"]})
        ptx = sorted({m["ptx_sm"] for m in e["modules"] if m.get("ptx_sm")})
        meta = e["metadata"]
        lines.append(
            f"engine {e['delegate_index']} ({e['method']}): {e['bytes']:,} bytes, precision {meta.get('precision')}, "
            f"weights {e['weights_bytes']:,} B, arena {e['arena_bytes']:,} B, code for "
            f"{', '.join(f'sm_{s}' for s in sms) or 'no kernels'}{''.join(f' + PTX compute_{p}' for p in ptx)}, "
            f"use_cuda_graphs {meta.get('use_cuda_graphs', 'not baked')}")
        for s in e["steps"]:
            if s["kind"] == "gemm":
                lines.append(f"  gemm   {s['label']:<20} m={s['m']} n={s['n']} k={s['k']} epilogue={s['epilogue']}")
            else:
                lines.append(f"  kernel {s['label']:<20} {s['function']} grid={s['grid']} block={s['block']}")
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
    print(json.dumps(info, indent=1) if args.json else _describe(info))
    return 0
