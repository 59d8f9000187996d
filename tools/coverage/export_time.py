#!/usr/bin/env python3
"""Times one export (torch.export + kiln.compile + kiln.save) of a zoo model,
the way a user exports it: default target SMs (sm_80 ... sm_120: cubins for
sm_80, sm_90, sm_100, sm_110, sm_120 + PTX compute_80), batch 1,
float32 or float16 (model.half(), enabled_precisions={float16}). Prints one
JSON line with wall seconds and this process's CPU seconds (user + sys,
children included: NVRTC runs in-process), so runs on a shared machine can
be compared by CPU time. It also prints short sha256s of each engine and of
the .pte, so two builds of the compiler can be checked to make the same
bytes.

    PYTHONPATH=python python3 tools/coverage/export_time.py resnet50 float16 \\
        [--profile out.prof] [--target-sms 87,90 (default: kiln's)] [--device-io]

--profile writes a cProfile of the export (read it with
``python3 -m pstats``); --device-io saves with
benchmarks/export_models.py's device-resident backend config.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools" / "coverage"))


def cpu_seconds() -> float:
    usage = [resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    return sum(u.ru_utime + u.ru_stime for u in usage)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("dtype", choices=("float32", "float16"))
    parser.add_argument("--target-sms", default="", help="comma-separated SMs; default: kiln's default list")
    parser.add_argument("--profile", type=Path)
    parser.add_argument("--device-io", action="store_true")
    args = parser.parse_args(argv)

    import torch

    import kiln
    import zoo

    dtype = {"float32": torch.float32, "float16": torch.float16}[args.dtype]
    torch.manual_seed(0)
    model, x = zoo.build(args.model, dtype)
    config = None
    if args.device_io:
        sys.path.insert(0, str(ROOT / "benchmarks"))
        sys.path.insert(0, str(ROOT / "examples"))
        from export_models import device_resident_config

        config = device_resident_config()

    # None: kiln's default targets (one cubin per major); a list: exactly those.
    sms = tuple(int(s) for s in args.target_sms.split(",")) if args.target_sms else None
    profiler = None
    if args.profile:
        import cProfile

        profiler = cProfile.Profile()
    cpu0, wall0 = cpu_seconds(), time.perf_counter()
    if profiler:
        profiler.enable()
    exported = torch.export.export(model, (x,))
    cpu1, wall1 = cpu_seconds(), time.perf_counter()
    compiled = kiln.compile(exported, arg_inputs=(x,), enabled_precisions={dtype}, target_sms=sms)
    cpu2, wall2 = cpu_seconds(), time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        pte = kiln.save(compiled, Path(tmp) / "model.pte", backend_config=config)
        size = pte.stat().st_size
        pte_sha = hashlib.sha256(pte.read_bytes()).hexdigest()[:16]
    cpu3, wall3 = cpu_seconds(), time.perf_counter()
    # kiln.save printed its phases; this line adds torch.export's seconds.
    print(compiled.saved_phases.line(torch_export_s=wall1 - wall0), file=sys.stderr, flush=True)
    engines = [hashlib.sha256(bytes(m.processed_bytes)).hexdigest()[:16]
               for m in compiled.edge_program_manager.exported_program().graph_module.modules()
               if type(m).__name__ == "LoweredBackendModule"]
    if profiler:
        profiler.disable()
        profiler.dump_stats(args.profile)
    print(json.dumps({
        "model": args.model, "dtype": args.dtype, "target_sms": list(sms) if sms else "default",
        "device_io": args.device_io,
        "wall_s": round(wall3 - wall0, 2), "cpu_s": round(cpu3 - cpu0, 2),
        "torch_export": [round(wall1 - wall0, 2), round(cpu1 - cpu0, 2)],
        "kiln_compile": [round(wall2 - wall1, 2), round(cpu2 - cpu1, 2)],
        "kiln_save": [round(wall3 - wall2, 2), round(cpu3 - cpu2, 2)],
        "phases": {**{k: round(v, 2) for k, v in compiled.saved_phases.seconds.items()},
                   "kernels": round(compiled.saved_phases.kernels, 2)},
        "partitions": compiled.summary.partitions, "cpu_ops": dict(compiled.summary.ops_on_cpu),
        "pte_bytes": size, "pte_sha": pte_sha, "engines": engines,
    }), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
