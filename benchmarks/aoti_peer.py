#!/usr/bin/env python3
"""One AOTInductor measurement, in its own process (run_benchmarks.py starts
it): AOTInductor's loader segfaulted in _load_aoti with torch 2.11 on the
GPU machine before, and a crash here must not take the benchmark down.

Prints 'stage: NAME' before each stage (flushed), so the parent can say
where a crash happened, and writes the result JSON to --out when it gets
through. Loaders:
  package  torch._inductor.aoti_load_package (the documented Python path)
  runner   the C++ AOTIModelContainerRunnerCuda on the model .so extracted
           from the package (torch._C._aoti), a lower-level loader that skips
           the package loader; tried when 'package' fails
  cpp      AOTInductor's C++ package loader in a program of its own
           (benchmarks/aoti_cpp_loader.cpp, built here against torch's
           libtorch with g++), no Python in the loop; tried when both fail
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import zipfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT / "benchmarks"))


def stage(name: str) -> None:
    print(f"stage: {name}", flush=True)


def load_runner(package: Path, work: Path):
    """The model .so inside the .pt2, run by AOTIModelContainerRunnerCuda."""
    with zipfile.ZipFile(package) as z:
        sos = [n for n in z.namelist() if n.endswith(".so")]
        if not sos:
            raise RuntimeError(f"no .so inside {package}")
        z.extractall(work / "pt2")
    so = work / "pt2" / sos[0]
    runner = torch._C._aoti.AOTIModelContainerRunnerCuda(str(so), 1)

    def call(x):
        return runner.run([x])

    return call


def cuda_include_paths(ext) -> list[str]:
    try:
        return ext.include_paths(device_type="cuda")
    except TypeError:  # torch releases whose include_paths takes cuda=True
        return ext.include_paths(cuda=True)


def run_cpp_loader(package: Path, x: torch.Tensor, channels_last: bool, args) -> dict:
    """Builds benchmarks/aoti_cpp_loader.cpp (once per work folder) and times
    the package through it; the program prints one 'ms' line per run."""
    import subprocess

    import torch.utils.cpp_extension as ext
    from peer_timing import summarize

    binary = args.work / "aoti_cpp_loader"
    if not binary.exists():
        stage("build (cpp loader)")
        torch_lib = Path(torch.__file__).parent / "lib"
        cmd = ["g++", "-O2", "-std=c++20", str(ROOT / "benchmarks" / "aoti_cpp_loader.cpp"), "-o", str(binary),
               f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
               *[f"-I{p}" for p in cuda_include_paths(ext)],
               f"-I{ext.CUDA_HOME}/include", f"-L{torch_lib}", f"-Wl,-rpath,{torch_lib}", "-ltorch", "-ltorch_cpu", "-ltorch_cuda", "-lc10",
               "-lc10_cuda", f"-L{ext.CUDA_HOME}/lib64", "-lcudart"]
        subprocess.run(cmd, check=True)
    shape = ",".join(str(d) for d in x.shape)
    proc = subprocess.run([str(binary), str(package), shape, "1" if channels_last else "0", str(args.warmup),
                           str(args.runs)], capture_output=True, text=True)
    print(proc.stdout[-2000:] + proc.stderr[-2000:], flush=True)
    if proc.returncode != 0:
        raise SystemExit(proc.returncode if proc.returncode > 0 else 128 - proc.returncode)
    times = [float(line.split()[1]) for line in proc.stdout.splitlines() if line.startswith("ms ")]
    return summarize(times)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--dtype", default="float16")
    parser.add_argument("--channels-last", action="store_true")
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--loader", choices=("package", "runner", "cpp"), default="package")
    parser.add_argument("--package", type=Path, help="reuse this .pt2 (skip export and compile)")
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--checksum", help="expected state-dict checksum")
    args = parser.parse_args()
    import vision_models
    from peer_timing import time_callable

    args.work.mkdir(parents=True, exist_ok=True)
    result = {"loader": args.loader}
    stage("build")
    model, (x,) = vision_models.build(args.model, args.batch, args.dtype)
    if args.checksum and vision_models.checksum(model) != args.checksum:
        raise SystemExit("state-dict checksum differs from the manifest's")
    model = model.cuda()
    x = x.cuda()
    if args.channels_last:
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    package = args.package
    if package is None:
        stage("export")
        t = time.perf_counter()
        with torch.no_grad():
            ep = torch.export.export(model, (x,))
        stage("compile")
        package = args.work / f"{args.model}_b{args.batch}.pt2"
        with torch.no_grad():
            torch._inductor.aoti_compile_and_package(ep, package_path=str(package))
        result["compile_s"] = time.perf_counter() - t
    result["package"] = str(package)
    print(f"package: {package}", flush=True)
    del model
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    if args.loader == "cpp":
        result.update(run_cpp_loader(package, x, args.channels_last, args))
        result["memory_bytes"] = None  # another process: not measured
        result["status"] = "ok"
        args.out.write_text(json.dumps(result))
        stage("done")
        return 0
    stage(f"load ({args.loader})")
    if args.loader == "package":
        compiled = torch._inductor.aoti_load_package(str(package))
        fn = compiled
    else:
        fn = load_runner(package, args.work)
    stage("run")
    with torch.no_grad():
        result.update(time_callable(fn, x, args.warmup, args.runs))
    result["memory_bytes"] = torch.cuda.max_memory_allocated()
    result["status"] = "ok"
    args.out.write_text(json.dumps(result))
    stage("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
