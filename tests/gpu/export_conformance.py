"""CPU machine: exports tests/gpu/conformance_models.py (fp32 and fp16) with
Kiln into DIR, with weights and DIR/manifest_ops.json for run_gpu_tests.py."""

import argparse
import importlib
import json
import os
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import kiln  # noqa: E402
import conformance_models  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--families", help="comma-separated op families (conformance_<family>.py) to export "
                        "alone, without the base sets: e.g. --families norms")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    seed = int.from_bytes(os.urandom(4), "little")
    torch.manual_seed(seed)
    print(f"seed: {seed}")
    manifest = []
    if args.families:
        manifest = export_op_family_cases(args.out, set(args.families.split(",")))
        (args.out / "manifest_ops.json").write_text(json.dumps(manifest, indent=1))
        return
    for dtype, rtol in ((torch.float32, 1e-5), (torch.float16, 1e-2)):
        name = f"elementwise_ops_{str(dtype).replace('torch.', '')}"
        model = conformance_models.ElementwiseOps().to(dtype).eval()
        inputs = (torch.randn(8, 64, dtype=dtype), torch.randn(8, 64, dtype=dtype))
        compiled = kiln.compile(torch.export.export(model, inputs), arg_inputs=inputs, enabled_precisions={dtype})
        # Independent outputs become separate engines (the partitioner merges
        # connected nodes only); every op must still be taken by Kiln.
        if compiled.summary.ops_on_cpu or set(compiled.delegates) != {"KilnBackend"}:
            raise SystemExit(f"{name}: ops left to the CPU: {compiled.summary.ops_on_cpu}")
        kiln.save(compiled, args.out / f"{name}.pte")
        torch.save(model.state_dict(), args.out / f"{name}.state_dict.pt")
        manifest.append({"name": name, "pte": f"{name}.pte", "state_dict": f"{name}.state_dict.pt",
                         "module": "conformance_models", "factory": "ElementwiseOps",
                         "model_dtype": str(dtype).replace("torch.", ""), "rtol": rtol,
                         "inputs": [[list(t.shape), str(dtype).replace("torch.", "")] for t in inputs],
                         "delegates": compiled.delegates})
    manifest += export_conv_cases(args.out)
    manifest += export_op_family_cases(args.out)
    manifest.append(export_device_resident(args.out))
    (args.out / "manifest_ops.json").write_text(json.dumps(manifest, indent=1))


def export_conv_cases(out: Path) -> list:
    """Convolution, pooling, bmm and squeeze-excitation models, fp32 and fp16:
    every op must be taken by Kiln."""
    entries = []
    for factory, shapes in conformance_models.CONV_CASES.items():
        for dtype, rtol in ((torch.float32, 1e-5), (torch.float16, 1e-2)):
            dname = str(dtype).replace("torch.", "")
            name = f"{factory.lower()}_{dname}"
            model = conformance_models.FACTORIES[factory]().to(dtype).eval()
            inputs = tuple(torch.randn(shape, dtype=dtype) for shape in shapes)
            compiled = kiln.compile(torch.export.export(model, inputs), arg_inputs=inputs, enabled_precisions={dtype})
            if compiled.summary.ops_on_cpu or set(compiled.delegates) != {"KilnBackend"}:
                raise SystemExit(f"{name}: ops left to the CPU: {compiled.summary.ops_on_cpu}")
            kiln.save(compiled, out / f"{name}.pte")
            torch.save(model.state_dict(), out / f"{name}.state_dict.pt")
            entries.append({"name": name, "pte": f"{name}.pte", "state_dict": f"{name}.state_dict.pt",
                            "module": "conformance_models", "factory": factory, "model_dtype": dname,
                            # cuDNN/cuBLASLt sum in another order than PyTorch; the H200
                            # measured 5e-8..3e-7 in fp32, well inside 1e-5.
                            "rtol": rtol,
                            "inputs": [[list(t.shape), dname] for t in inputs],
                            "delegates": compiled.delegates})
    return entries


def export_op_family_cases(out: Path, families: set | None = None) -> list:
    """The op families' conformance modules (tests/gpu/conformance_<family>.py,
    each with CASES = {factory name: [input shapes]} and FACTORIES), in
    float32, float16 and bfloat16. Every op must be taken by Kiln. The GPU
    reference runs the float32 model on the same inputs and rounds to the
    dtype, so the tolerance measures Kiln's error alone."""
    entries = []
    for path in sorted(Path(__file__).parent.glob("conformance_*.py")):
        module_name = path.stem
        if module_name == "conformance_models":
            continue
        if families is not None and module_name.removeprefix("conformance_") not in families:
            continue
        module = importlib.import_module(module_name)
        for factory, shapes in module.CASES.items():
            for dtype, rtol in ((torch.float32, 1e-5), (torch.float16, 1e-2), (torch.bfloat16, 1e-2)):
                dname = str(dtype).replace("torch.", "")
                name = f"{module_name.removeprefix('conformance_')}_{factory.lower()}_{dname}"
                model = module.FACTORIES[factory]().to(dtype).eval()
                inputs = tuple(torch.randn(shape, dtype=dtype) for shape in shapes)
                compiled = kiln.compile(torch.export.export(model, inputs), arg_inputs=inputs,
                                        enabled_precisions={dtype})
                if compiled.summary.ops_on_cpu or set(compiled.delegates) != {"KilnBackend"}:
                    raise SystemExit(f"{name}: ops left to the CPU: {compiled.summary.ops_on_cpu}")
                kiln.save(compiled, out / f"{name}.pte")
                torch.save(model.float().state_dict(), out / f"{name}.state_dict.pt")
                entries.append({"name": name, "pte": f"{name}.pte", "state_dict": f"{name}.state_dict.pt",
                                "module": module_name, "factory": factory, "model_dtype": dname,
                                "reference_dtype": "float32", "rtol": rtol,
                                "inputs": [[list(t.shape), dname] for t in inputs],
                                "delegates": compiled.delegates})
                print(f"{name}: {len(compiled.delegates)} engine(s)", flush=True)
    return entries


def export_device_resident(out: Path) -> dict:
    """The sample MLP exported with its inputs and outputs on the GPU: the GPU
    test runs it with kiln_runner --device_io=true and expects no host copies."""
    from executorch.exir import ExecutorchBackendConfig
    from executorch.exir.passes import MemoryPlanningPass
    from executorch.exir.passes.propagate_device_config import PropagateDeviceConfig

    sys.path.insert(0, str(ROOT / "examples"))
    import sample_models

    name = "mlp_fp32_device_io"
    kwargs = {"in_features": 256, "hidden": 512, "out_features": 32}  # small: the carried bundle is size-limited
    model = sample_models.Mlp(**kwargs).eval()
    x = torch.randn(8, 256)
    config = ExecutorchBackendConfig(
        propagate_device_config=PropagateDeviceConfig(skip_h2d_for_method_inputs=True,
                                                      skip_d2h_for_method_outputs=True),
        enable_non_cpu_memory_planning=True,
        memory_planning_pass=MemoryPlanningPass(alloc_graph_input=False, alloc_graph_output=False))
    compiled = kiln.compile(torch.export.export(model, (x,)), arg_inputs=(x,))
    kiln.save(compiled, out / f"{name}.pte", backend_config=config)
    torch.save(model.state_dict(), out / f"{name}.state_dict.pt")
    return {"name": name, "pte": f"{name}.pte", "state_dict": f"{name}.state_dict.pt", "module": "sample_models",
            "factory": "Mlp", "kwargs": kwargs, "model_dtype": "float32", "rtol": 1e-5,
            "inputs": [[[8, 256], "float32"]],
            "delegates": compiled.delegates, "runner_args": ["--device_io=true"],
            "expect_output": "0 host-to-device copies, 0 device-to-host copies"}


if __name__ == "__main__":
    main()
