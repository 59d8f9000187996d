"""Export-time work that must not change what is exported: kiln.save with
device-resident I/O re-tags the delegates instead of lowering again (same
.pte bytes as a program lowered for the GPU from the start), engines do not
depend on how many threads NVRTC used, and long compiles say where they are.
No timings are asserted (the machine is shared)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import kiln
from kiln import _compile
from kiln._options import validate_options

from _helpers import MLP, CpuOpMLP, engines_in_pte, export

pytestmark = pytest.mark.needs_compiler

ROOT = Path(__file__).resolve().parents[2]


def device_resident_config():
    from executorch.exir import ExecutorchBackendConfig
    from executorch.exir.passes import MemoryPlanningPass
    from executorch.exir.passes.propagate_device_config import PropagateDeviceConfig

    return ExecutorchBackendConfig(
        propagate_device_config=PropagateDeviceConfig(skip_h2d_for_method_inputs=True,
                                                      skip_d2h_for_method_outputs=True),
        enable_non_cpu_memory_planning=True,
        memory_planning_pass=MemoryPlanningPass(alloc_graph_input=False, alloc_graph_output=False))


def lowered_for_gpu(ep, compiled) -> _compile.CompiledProgram:
    """What save() used to do for device I/O: lower with target_device set
    (and the same weights key prefix as `compiled`, so the named data match)."""
    options = validate_options(enabled_precisions={torch.float32}, min_block_size=1,
                               target_sms=compiled.options.target_sms, cubin_sms=compiled.options.cubin_sms,
                               use_cuda_graphs=None, target_device="cuda:0",
                               weights_prefix=compiled.options.weights_prefix)
    manager, summary = _compile.lower(ep, options)
    return _compile.CompiledProgram(manager, options, summary, ep)


@pytest.mark.parametrize("model", [MLP, CpuOpMLP], ids=["one_delegate", "two_delegates_and_cpu_op"])
def test_device_io_save_retags_instead_of_relowering(model, tmp_path, monkeypatch, capsys):
    torch.manual_seed(0)
    ep = export(model(), torch.randn(8, 64))
    compiled = kiln.compile(ep)
    host_pte = kiln.save(compiled, tmp_path / "host.pte").read_bytes()
    reference = kiln.save(lowered_for_gpu(ep, compiled), tmp_path / "ref.pte", backend_config=device_resident_config())

    lowerings = []
    real_lower = _compile.lower
    monkeypatch.setattr(_compile, "lower", lambda *a, **k: lowerings.append(1) or real_lower(*a, **k))
    capsys.readouterr()
    path = kiln.save(compiled, tmp_path / "device.pte", backend_config=device_resident_config())
    assert lowerings == [] and "re-lowering" not in capsys.readouterr().err
    assert path.read_bytes() == reference.read_bytes()
    specs = [s for _, s, _ in engines_in_pte(path.read_bytes())]
    assert specs and all(s["target_device"] == b"cuda:0" for s in specs)

    # `compiled` is unchanged: a plain save afterwards is the host program.
    assert kiln.save(compiled, tmp_path / "host2.pte").read_bytes() == host_pte
    assert all("target_device" not in s for _, s, _ in engines_in_pte(host_pte))


def test_hand_edited_specs_fall_back_to_relowering(tmp_path, monkeypatch):
    torch.manual_seed(0)
    ep = export(MLP(), torch.randn(8, 64))
    compiled = kiln.compile(ep)
    # Delegates whose specs are not the ones the options make: re-tagging
    # would guess, so save() lowers again.
    (module,) = _compile._kiln_lowered_modules(compiled.edge_program_manager)
    module._compile_specs = module._compile_specs[:-1]
    lowerings = []
    real_lower = _compile.lower
    monkeypatch.setattr(_compile, "lower", lambda *a, **k: lowerings.append(1) or real_lower(*a, **k))
    path = kiln.save(compiled, tmp_path / "device.pte", backend_config=device_resident_config())
    assert lowerings == [1]
    assert all(s["target_device"] == b"cuda:0" for _, s, _ in engines_in_pte(path.read_bytes()))


ENGINE_SCRIPT = """
import sys, torch, kiln
sys.path.insert(0, {tests!r})
from _helpers import CpuOpMLP, export, engines_in_pte
torch.manual_seed(0)
ep = export(CpuOpMLP(), torch.randn(8, 64))
for backend, specs, blob in engines_in_pte(kiln.save(kiln.compile(ep), {out!r}).read_bytes()):
    print(blob.hex())
"""


def test_engines_do_not_depend_on_nvrtc_threads(tmp_path):
    """Serial (KILN_NVRTC_THREADS=1) and threaded NVRTC make the same engines."""
    engines = []
    for threads in ("1", "3"):
        env = dict(os.environ, KILN_NVRTC_THREADS=threads,
                   PYTHONPATH=os.pathsep.join([str(ROOT / "python"), os.environ.get("PYTHONPATH", "")]))
        script = ENGINE_SCRIPT.format(tests=str(ROOT / "tests" / "python"), out=str(tmp_path / f"t{threads}.pte"))
        result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                                timeout=600)
        assert result.returncode == 0, result.stderr
        engines.append(result.stdout.split())
    assert len(engines[0]) == 2 and engines[0] == engines[1]


def test_long_partitions_report_their_compile_time(monkeypatch, capsys):
    """A partition whose compile takes SLOW_COMPILE_S or more gets a line with
    its time (0 here, so every announced compile counts as long)."""
    from kiln import _trial

    torch.manual_seed(0)
    ep = export(CpuOpMLP(), torch.randn(8, 64))
    kiln.compile(ep)
    assert "kiln: compiled partition" not in capsys.readouterr().err  # fast: no extra lines
    monkeypatch.setattr(_trial, "SLOW_COMPILE_S", 0.0)
    kiln.compile(ep)
    lines = [l for l in capsys.readouterr().err.splitlines() if l.startswith("kiln: compiled partition")]
    assert [l.split(" in ")[0] for l in lines] == ["kiln: compiled partition 1/2", "kiln: compiled partition 2/2"]
    assert all(l.endswith(" s") for l in lines)


def _sweep():
    pytest.importorskip("torchvision")
    sys.path.insert(0, str(ROOT / "tools" / "coverage"))
    import coverage_sweep

    return coverage_sweep


def test_sweep_redo_replaces_records_and_keeps_the_notes(tmp_path):
    """--redo exports a model again in place of its record (with CPU seconds);
    the doc's hand-written "## Notes" section survives the rewrite."""
    sweep = _sweep()
    stale = {"model": "squeezenet1_1", "kind": "classification", "dtype": "float16", "status": "timeout",
             "reason": "stale"}
    other = {"model": "alexnet", "kind": "classification", "dtype": "float16", "status": "skipped", "reason": "kept"}
    json_path, doc = tmp_path / "coverage.json", tmp_path / "coverage.md"
    json_path.write_text(__import__("json").dumps([stale, other]))
    doc.write_text("# old\n\n## Per model\n\n| x |\n\n## Notes\n\nExport times: measured by hand.\n| a | b |\n")
    sweep.main(["--models", "squeezenet1_1", "--dtypes", "float16", "--json", str(json_path), "--doc", str(doc),
                "--gpu-results", "--redo"])
    records = __import__("json").loads(json_path.read_text())
    assert [(r["model"], r["status"]) for r in records] == [("squeezenet1_1", "pass"), ("alexnet", "skipped")]
    assert records[0]["export_cpu_s"] > 0 and records[0]["export_s"] > 0
    text = doc.read_text()
    assert text.endswith("## Notes\n\nExport times: measured by hand.\n| a | b |\n")
    assert text.count("## Notes") == 1 and "| squeezenet1_1 |" in text
