#!/usr/bin/env python3
"""The reference runner in Python: runs a .pte through ExecuTorch's Python
runtime with the Kiln delegate and compares with expected outputs.

    PYTHONPATH=python python3 examples/run_pte.py out/static/model.pte \
        --inputs out/static/model.inputs.ktensors --expected out/static/model.expected.ktensors

Tensor files are .ktensors (kiln.tensor_file); --rtol bounds
||out - ref||_2 / ||ref||_2 (default 1e-5 for float32, 1e-2 for 16-bit).
exit codes: 0 ok, 1 output mismatch, 2 usage or bad file,
            3 cannot run here (no usable CUDA GPU, or the runtime cannot load)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
from kiln import tensor_file  # noqa: E402

EXIT_OK, EXIT_MISMATCH, EXIT_USAGE, EXIT_CANNOT_RUN = 0, 1, 2, 3
DEFAULT_RTOL = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 1e-2}


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.double(), ref.double()
    return float(torch.linalg.vector_norm(out - ref) / max(torch.linalg.vector_norm(ref), 1e-30))


def compare(outputs, expected, rtol: float | None) -> bool:
    if len(outputs) != len(expected):
        print(f"run_pte: {len(outputs)} outputs, but {len(expected)} expected", file=sys.stderr)
        return False
    ok = True
    for i, (out, ref) in enumerate(zip(outputs, expected)):
        if out.dtype != ref.dtype or out.shape != ref.shape:
            print(f"output {i}: got {out.dtype} {list(out.shape)}, expected {ref.dtype} {list(ref.shape)} FAIL")
            ok = False
            continue
        if not ref.is_floating_point():
            good = bool(torch.equal(out, ref))
            print(f"output {i}: exact match {'PASS' if good else 'FAIL'}")
        else:
            tolerance = rtol if rtol is not None else DEFAULT_RTOL.get(ref.dtype, 1e-5)
            err = relative_error(out, ref)
            good = bool(torch.isfinite(out).all()) and err <= tolerance
            print(f"output {i}: {str(out.dtype).replace('torch.', '')} {list(out.shape)} "
                  f"rel_err={err:.2e} (rtol {tolerance:g}) {'PASS' if good else 'FAIL'}")
        ok = ok and good
    return ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pte", type=Path)
    parser.add_argument("--inputs", type=Path, required=True, help=".ktensors, one tensor per input")
    parser.add_argument("--expected", type=Path, help=".ktensors, one tensor per output")
    parser.add_argument("--method", default="forward")
    parser.add_argument("--rtol", type=float)
    args = parser.parse_args(argv)
    try:
        inputs = [torch.as_tensor(t) for t in tensor_file.load(args.inputs)]
        expected = [torch.as_tensor(t) for t in tensor_file.load(args.expected)] if args.expected else None
        if not args.pte.is_file():
            raise OSError(f"{args.pte}: no such file")
    except (OSError, ValueError) as e:
        print(f"run_pte: {e}", file=sys.stderr)
        return EXIT_USAGE

    try:
        import kiln_executorch_runtime  # noqa: F401 - registers KilnBackend
    except ImportError as e:
        print(f"run_pte: cannot run Kiln programs on this machine: {e}", file=sys.stderr)
        return EXIT_CANNOT_RUN
    from executorch.runtime import Runtime, Verification

    try:
        # InternalConsistency (ExecuTorch's Python default, stated so it stays):
        # every flatbuffer offset is checked, so a damaged file fails here.
        program = Runtime.get().load_program(args.pte, verification=Verification.InternalConsistency)
        method = program.load_method(args.method)
    except (RuntimeError, ValueError) as e:
        print(f"run_pte: cannot load '{args.method}' from {args.pte}: {e} "
              "(ExecuTorch's log above names the cause)", file=sys.stderr)
        return EXIT_CANNOT_RUN
    outputs = method.execute(inputs)
    print(f"{args.pte}: '{args.method}' ran, {len(outputs)} output(s)")
    if expected is None:
        return EXIT_OK
    ok = compare(list(outputs), expected, args.rtol)
    print("PASS" if ok else "FAIL")
    return EXIT_OK if ok else EXIT_MISMATCH


if __name__ == "__main__":
    sys.exit(main())
