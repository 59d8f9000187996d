"""The coverage sweep (tools/coverage/coverage_sweep.py) on a small, fast
subset: what CI runs of it (the full sweep is a documented command; its
results are docs/coverage.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools" / "coverage"))

torchvision = pytest.importorskip("torchvision")
import coverage_sweep  # noqa: E402
import zoo  # noqa: E402

pytestmark = pytest.mark.needs_compiler


def test_zoo_weights_are_seeded_and_reproducible():
    a, x = zoo.build("squeezenet1_1")
    b, _ = zoo.build("squeezenet1_1")
    assert zoo.checksum(a) == zoo.checksum(b)
    c, _ = zoo.build("squeezenet1_1", seed=1)
    assert zoo.checksum(c) != zoo.checksum(a)
    with torch.no_grad():
        out = a(x)
    assert torch.isfinite(out).all() and out.std() > 0
    assert zoo.parameters("squeezenet1_1") == sum(p.numel() for p in a.parameters())


def test_zoo_lists_classification_and_segmentation():
    names = dict(zoo.names())
    assert names["resnet18"] == "classification"
    assert names["fcn_resnet50"] == "segmentation"


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    pte_dir = tmp_path_factory.mktemp("pte")
    return [coverage_sweep.export_one("squeezenet1_1", "classification", d, pte_dir, [90])
            for d in ("float32", "float16")], pte_dir


def test_small_models_export_with_every_op_in_kiln(records):
    recs, pte_dir = records
    for r in recs:
        assert r["status"] == "pass", r
        assert r["cpu_ops"] == {} and r["partitions"] == 1
        assert r["compile_fallbacks"] == []
        assert r["pte_mib"] > 0 and (pte_dir / r["pte"]).exists()
        assert r["outputs"] == [[1, 1000]]
        assert r["target_sms"] == [90]
        # the code whose seconds these are: this checkout's commit
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
        if head.returncode == 0:
            assert r["commit"].removesuffix("+dirty") == head.stdout.strip()
        # where the seconds went, as kiln.save's last line says (plus torch.export)
        assert set(r["phases"]) == {"torch.export", "edge", "partition", "engine compile", "kernels", "serialize"}
        assert sum(v for k, v in r["phases"].items() if k != "kernels") <= r["export_s"] + 0.5


def test_redo_over_exports_only_the_slow_records_again(tmp_path, monkeypatch):
    slow = {"model": "resnet18", "kind": "classification", "dtype": "float32", "status": "pass", "params": 11e6,
            "export_s": 50.0, "export_cpu_s": 40.0, "cpu_ops": {}, "pte_mib": 1.0, "target_sms": [90]}
    fast = dict(slow, model="squeezenet1_1", params=1.2e6, export_s=5.0, export_cpu_s=4.0)
    json_path = tmp_path / "coverage.json"
    coverage_sweep.save_results(json_path, [slow, fast])
    called = []

    def fake_child(name, kind, dtype, args):
        called.append((name, dtype, args.target_sms))
        return dict(slow, export_s=20.0, export_cpu_s=15.0, target_sms="default")

    monkeypatch.setattr(coverage_sweep, "run_child", fake_child)
    doc = tmp_path / "coverage.md"
    coverage_sweep.main(["--models", "resnet18,squeezenet1_1", "--dtypes", "float32", "--redo-over", "30",
                         "--target-sms", "default", "--json", str(json_path), "--doc", str(doc),
                         "--gpu-results"])
    assert called == [("resnet18", "float32", "default")]
    records = {r["model"]: r for r in json.loads(json_path.read_text())}
    assert records["resnet18"]["export_cpu_s"] == 15.0 and records["squeezenet1_1"]["export_cpu_s"] == 4.0
    assert "20.0 (15.0) [default SMs]" in doc.read_text()


def test_report_and_carry_groups(records, tmp_path):
    recs, pte_dir = records
    fake = [
        {"model": "m_abort", "kind": "classification", "dtype": "float32", "status": "abort", "reason": "kiln.compile: boom"},
        {"model": "m_cpu", "kind": "segmentation", "dtype": "float32", "status": "cpu", "params": 3e6,
         "cpu_ops": {"aten.upsample_bilinear2d.vec": 2}, "export_s": 1.0, "pte_mib": 1.0,
         "compile_fallbacks": ["aten.mm.default ('mm') left to the CPU: x"]},
    ]
    results = recs + fake
    json_path = tmp_path / "coverage.json"
    coverage_sweep.save_results(json_path, results)
    gpu = tmp_path / "coverage_gpu_cov_00.json"
    # float16: over the 1e-2 bar; judged apart only when PyTorch's own float16
    # run is at least as far from float32 (never counted as a match)
    fp16 = {"model": "squeezenet1_1", "dtype": "float16", "ok": False, "rel_err": 3e-2, "torch_fp16_rel_err": 9.2e-2}
    gpu.write_text(json.dumps([{"model": "squeezenet1_1", "dtype": "float32", "ok": True, "rel_err": 3e-7}, fp16]))
    doc = tmp_path / "coverage.md"
    coverage_sweep.main(["--report", "--json", str(json_path), "--doc", str(doc), "--gpu-results", str(tmp_path)])
    text = doc.read_text()
    assert "**1 aborted exports**" in text
    assert "| aten.upsample_bilinear2d.vec | 1 | m_cpu |" in text
    assert "| squeezenet1_1 | 1.2M | pass | 0 |" in text and "3.0e-07 ok" in text
    assert "3.0e-02 over (PyTorch fp16 9.2e-02)" in text
    assert "GPU: 0/1 match PyTorch (rtol 0.01); over the bar but no farther from float32 than PyTorch's own " \
           "float16 run: squeezenet1_1 3.0e-02 (PyTorch fp16 9.2e-02)" in text
    assert not coverage_sweep.within_torch_fp16(dict(fp16, torch_fp16_rel_err=2e-2))  # Kiln worse: a failure
    assert not coverage_sweep.within_torch_fp16(dict(fp16, dtype="float32"))
    assert "m_cpu fp32: aten.mm.default ('mm') left to the CPU" in text
    assert f"measured at {recs[0]['commit']} (1), not recorded (1)" in text

    coverage_sweep.main(["--pack", str(tmp_path / "carry"), "--keep-pte", str(pte_dir), "--json", str(json_path)])
    (group,) = (tmp_path / "carry").iterdir()
    assert group.name == "cov_00"
    manifest = json.loads((group / "manifest_coverage.json").read_text())
    assert sorted(e["dtype"] for e in manifest) == ["float16", "float32"]
    assert all(e["checksum"] == recs[0]["checksum"] for e in manifest if e["dtype"] == "float32")
    assert (group / "squeezenet1_1.tar.xz").exists()


def test_gpu_driver_plumbing_on_the_cpu(records, tmp_path):
    """gpu_coverage.py end to end with --device cpu and a stand-in runner
    (prints the error kiln_runner would): unpacking, rebuilding the model from
    the manifest's seed and checksum, tensor files, parsing, the JSON."""
    import subprocess

    recs, pte_dir = records
    json_path = tmp_path / "coverage.json"
    coverage_sweep.save_results(json_path, recs)
    coverage_sweep.main(["--pack", str(tmp_path / "carry"), "--keep-pte", str(pte_dir), "--json", str(json_path)])
    (group,) = (tmp_path / "carry").iterdir()
    runner = tmp_path / "fake_runner.sh"
    # kiln_runner's --save_outputs, stood in for by the expected outputs themselves.
    runner.write_text("#!/bin/sh\nfor a in \"$@\"; do case $a in --expected=*) e=${a#--expected=};; "
                      "--save_outputs=*) o=${a#--save_outputs=};; esac; done\n"
                      "[ -n \"$o\" ] && cp \"$e\" \"$o\"\necho 'output 0: rel_err=2.5e-07 ok'\n")
    runner.chmod(0o755)
    out = tmp_path / "gpu"
    proc = subprocess.run([sys.executable, str(ROOT / "tools/coverage/gpu_coverage.py"), str(group), "--runner", str(runner),
                           "--out", str(out), "--work", str(tmp_path / "work"), "--trials", "1", "--device", "cpu"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = json.loads((out / f"coverage_gpu_{group.name}.json").read_text())
    assert sorted(r["dtype"] for r in results) == ["float16", "float32"]
    assert all(r["ok"] and r["rel_err"] == 2.5e-07 for r in results)
    # --seeds replays recorded draws instead of fresh ones.
    proc = subprocess.run([sys.executable, str(ROOT / "tools/coverage/gpu_coverage.py"), str(group), "--runner", str(runner),
                           "--out", str(out), "--work", str(tmp_path / "work"), "--seeds", "11,12", "--device", "cpu",
                           "--only", "squeezenet1_1"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = json.loads((out / f"coverage_gpu_{group.name}.json").read_text())
    assert all(r["seeds"] == [11, 12] for r in results) and len(results) == 2
    # --dump keeps each draw's tensors: the float32 outputs, PyTorch's and Kiln's.
    proc = subprocess.run([sys.executable, str(ROOT / "tools/coverage/gpu_coverage.py"), str(group), "--runner", str(runner),
                           "--out", str(out), "--work", str(tmp_path / "work"), "--seeds", "13", "--device", "cpu",
                           "--only", "squeezenet1_1", "--dump", str(tmp_path / "dump")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    dumped = torch.load(tmp_path / "dump" / "squeezenet1_1_float16_13.pt")
    assert dumped["input"].dtype == torch.float16 and dumped["float32"][0].dtype == torch.float32
    assert torch.equal(dumped["kiln"][0], dumped["float32"][0].to(torch.float16))
    assert dumped["torch"][0].shape == dumped["kiln"][0].shape


def test_zoo_prefix_is_the_seeded_model_cut_after_k_blocks():
    """"maxvit_t.stage1" (a stage prefix, to bisect a numerical difference): the
    whole model's seeded weights, run through its stem and first block."""
    whole, x = zoo.build("maxvit_t")
    prefix, _ = zoo.build("maxvit_t.stage1")
    assert zoo.kind_of("maxvit_t.stage1") == "classification"
    assert zoo.parameters("maxvit_t.stage1") == sum(p.numel() for p in prefix.parameters()) < zoo.parameters("maxvit_t")
    with torch.no_grad():
        want = whole.blocks[0](whole.stem(x))
        assert torch.equal(prefix(x), want)
    # "<model>.stage<k>.<j>": blocks before k whole, then j sub-layers of block k
    # (MaxVit: MBConv, window attention, grid attention, per layer).
    finer, _ = zoo.build("maxvit_t.stage2.2")
    with torch.no_grad():
        block = whole.blocks[1].layers[0].layers
        assert torch.equal(finer(x), block[1](block[0](want)))
    assert zoo.parameters("maxvit_t.stage1") < zoo.parameters("maxvit_t.stage2.2") < zoo.parameters("maxvit_t.stage2")
    for bad in ("resnet18.stage1", "maxvit_t.stage9", "maxvit_t.stagex", "nonesuch.stage1", "maxvit_t.stage1.7",
                "maxvit_t.stage1.0", "maxvit_t.stage1.x"):
        with pytest.raises(ValueError):
            zoo.build(bad) if bad != "nonesuch.stage1" else zoo.kind_of(bad)


def test_fp16_sensitivity_measures_rounding_without_float16_arithmetic(tmp_path, capsys):
    """tools/coverage/fp16_sensitivity.py: the float32 model with its leaf
    outputs rounded to float16 lands off the exact run, by more than zero and
    far less than the output itself, and the same draw gives the same figure."""
    import fp16_sensitivity

    first = fp16_sensitivity.sensitivity("squeezenet1_1", draws=2)
    again = fp16_sensitivity.sensitivity("squeezenet1_1", draws=1)
    assert [r["input_seed"] for r in first] == [1000, 1001]
    for r in first:
        assert 0 < r["rounded"] < 0.5 and 0 < r["input_ulp"] < 0.5, r
    assert again[0] == first[0]
    out = tmp_path / "s.json"
    assert fp16_sensitivity.main(["squeezenet1_1", "--draws", "1", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["draws"][0] == first[0]
    assert "of 1 draws over 1e-2" in capsys.readouterr().out
    assert fp16_sensitivity.main(["not_a_model"]) == 2
    assert "not_a_model" in capsys.readouterr().err


def test_propagate_error_carries_a_cut_through_the_exact_rest(tmp_path, capsys):
    """tools/coverage/propagate_error.py: a prefix's outputs carried through the
    exact rest of the model. An output equal to the float32 one stays at 0, a
    perturbed one stays off, and the carried float32 run equals the whole model."""
    import propagate_error

    name = "maxvit_t.stage4.5"
    prefix, _ = zoo.build(name, torch.float16)
    x = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(5)).half()
    with torch.no_grad():
        out = prefix.float()(x.float())
    noise = torch.randn(out.shape, generator=torch.Generator().manual_seed(6))
    dump = {"input": x, "float32": [out], "torch": [out.clone()],
            "kiln": [(out + noise * out.norm() / noise.norm() * 1e-3).flatten()]}
    path = tmp_path / f"{name}_float16_77.pt"
    torch.save(dump, path)
    assert propagate_error.parse_dump_name(path) == (name, "float16", 77)
    assert propagate_error.main([str(path)]) == 0
    printed = capsys.readouterr().out
    assert "stage4.6" in printed and "classifier" in printed
    rows = propagate_error.propagate(torch.load(path), name, "float16")
    assert [r["step"] for r in rows] == [f"{name} (the cut)", "stage4.6", "classifier"]
    assert abs(rows[0]["kiln"] - 1e-3) < 1e-5 and all(r["torch"] == 0.0 for r in rows)
    assert all(r["kiln"] > 1e-4 for r in rows) and rows[-1]["check"] < 1e-4
    with pytest.raises(ValueError):
        propagate_error.propagate(torch.load(path), "maxvit_t", "float16")
    with pytest.raises(ValueError):
        propagate_error.parse_dump_name(tmp_path / "maxvit_t.pt")
