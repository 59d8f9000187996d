#!/usr/bin/env python3
"""Exports what the GPU reliability test program (tests/gpu/reliability_test.cpp,
run by scripts/gpu_reliability_tests.sh) needs, on the CPU machine:

  tiny_mlp.pte              Linear/GELU/Linear (fp32), host I/O; + inputs/expected .ktensors
  tiny_mlp.engine           its engine's bytes, cut out of the .pte (the OOM test raises
                            the arena past the GPU's memory and loads it)
  tiny_mlp_device_io.pte    the same with device-resident inputs/outputs
  tiny_mlp_sm87.pte         the same built for sm_87 only, no PTX (refused on an sm_90 GPU)
  deep_mlp.pte              6 x (Linear 256->256 + GELU) on [256, 256], fp32, host I/O
  deep_mlp_device_io.pte    the same with device-resident I/O (alternating caller streams)
  split_attention.pte       two query rows a head over 1024 keys (fp32): the keys split
                            over 16 blocks a head and merged (flash-decoding), run by 8
                            threads at once on one shared engine

Deterministic (fixed seed); about 3.5 MB in all (the deep MLP twice).

    PYTHONPATH=python python3 tests/gpu/export_reliability_tests.py --out .gpu_carry/reliability_tests
"""

from __future__ import annotations

import argparse
import json
import struct
import sys
from pathlib import Path

import torch
from executorch.exir import ExecutorchBackendConfig
from executorch.exir.passes import MemoryPlanningPass
from executorch.exir.passes.propagate_device_config import PropagateDeviceConfig

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))
import kiln  # noqa: E402
from kiln._compile import lower  # noqa: E402
from kiln._options import validate_options  # noqa: E402


class TinyMlp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 32)
        self.fc2 = torch.nn.Linear(32, 8)

    def forward(self, x):
        return self.fc2(torch.nn.functional.gelu(self.fc1(x)))


class DeepMlp(torch.nn.Module):
    """Small weights (1.5 MB), activations large enough that two runs overlap on the GPU."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(256, 256) for _ in range(6))

    def forward(self, x):
        for layer in self.layers:
            x = torch.nn.functional.gelu(layer(x))
        return x


class SplitAttention(torch.nn.Module):
    """Decode-shaped attention: 4 heads x 2 query rows over 1024 keys. The keys and values
    depend on the input, so export keeps the attention whole (constant ones are folded)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("k", torch.randn(1, 4, 1024, 64))
        self.register_buffer("v", torch.randn(1, 4, 1024, 64))

    def forward(self, x):
        q = x.view(1, 4, 2, 64)
        s = x.mean()
        return torch.nn.functional.scaled_dot_product_attention(q, self.k + s, self.v - s).reshape(8, 64)


def device_resident_config() -> ExecutorchBackendConfig:
    return ExecutorchBackendConfig(
        propagate_device_config=PropagateDeviceConfig(
            skip_h2d_for_method_inputs=True, skip_d2h_for_method_outputs=True),
        enable_non_cpu_memory_planning=True,
        memory_planning_pass=MemoryPlanningPass(alloc_graph_input=False, alloc_graph_output=False),
    )


def engine_bytes(pte: Path) -> bytes:
    """The first Kiln engine stored in `pte` (magic "KILNENG\\0", total size at offset 16)."""
    data = pte.read_bytes()
    start = data.find(b"KILNENG\0")
    if start < 0:
        raise SystemExit(f"{pte}: no Kiln engine inside")
    (total,) = struct.unpack_from("<Q", data, start + 16)
    if start + total > len(data):
        raise SystemExit(f"{pte}: engine at {start} claims {total} bytes past the end")
    return data[start:start + total]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args(argv)
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(13)
    manifest = {}

    tiny = TinyMlp().eval()
    x = torch.randn(4, 16)
    exported = torch.export.export(tiny, (x,))
    compiled = kiln.compile(exported, arg_inputs=(x,), min_block_size=1)
    kiln.save(compiled, out / "tiny_mlp.pte")
    kiln.save(compiled, out / "tiny_mlp_device_io.pte", backend_config=device_resident_config())
    (out / "tiny_mlp.engine").write_bytes(engine_bytes(out / "tiny_mlp.pte"))
    with torch.no_grad():
        kiln.tensor_file.save(out / "tiny_mlp.inputs.ktensors", [x])
        kiln.tensor_file.save(out / "tiny_mlp.expected.ktensors", [tiny(x)])
    manifest["tiny_mlp"] = {"delegates": compiled.delegates, "rtol": 1e-5}

    # sm_87 machine code only, no PTX: an sm_90 GPU has nothing it can run.
    options = validate_options(enabled_precisions={torch.float32}, min_block_size=1,
                               target_sms=(87,), emit_ptx=False)
    manager, _ = lower(exported, options)
    with open(out / "tiny_mlp_sm87.pte", "wb") as f:
        manager.to_executorch().write_to_file(f)

    deep = DeepMlp().eval()
    xd = torch.randn(256, 256)
    exported = torch.export.export(deep, (xd,))
    compiled = kiln.compile(exported, arg_inputs=(xd,), min_block_size=1)
    kiln.save(compiled, out / "deep_mlp.pte")
    kiln.save(compiled, out / "deep_mlp_device_io.pte", backend_config=device_resident_config())
    manifest["deep_mlp"] = {"delegates": compiled.delegates}

    attention = SplitAttention().eval()
    xa = torch.randn(8, 64)
    exported = torch.export.export(attention, (xa,))
    compiled = kiln.compile(exported, arg_inputs=(xa,), min_block_size=1)
    kiln.save(compiled, out / "split_attention.pte")
    manifest["split_attention"] = {"delegates": compiled.delegates}

    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    for p in sorted(out.iterdir()):
        print(f"{p.name}: {p.stat().st_size:,} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
