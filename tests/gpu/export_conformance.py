"""CPU machine: exports tests/gpu/conformance_models.py (fp32 and fp16) with
Kiln into DIR, with weights and DIR/manifest_ops.json for run_gpu_tests.py."""

import argparse
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
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    seed = int.from_bytes(os.urandom(4), "little")
    torch.manual_seed(seed)
    print(f"seed: {seed}")
    manifest = []
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
    (args.out / "manifest_ops.json").write_text(json.dumps(manifest, indent=1))


if __name__ == "__main__":
    main()
