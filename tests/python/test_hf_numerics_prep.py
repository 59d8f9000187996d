"""The CPU side of the Hugging Face numerics check (issue 11): tiny BertModel
and LlamaForCausalLM configs go through the same export-and-reference code as
the real groups (tests/gpu/export_hf_models.py), and the GPU side's
comparison (tests/gpu/reference_groups.py, run_gpu_tests.py
--reference-groups) is exercised without a GPU: on numpy arrays, and through
check_entry with a stand-in for kiln_runner that writes chosen outputs.

Three tiny programs are compiled (sm_90 only): about 25 s on 2 cores.
"""

from __future__ import annotations

import json
import sys
import tarfile
import types
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "gpu"))
import reference_groups  # noqa: E402

tensor_file = reference_groups.tensor_file


# ---- the comparison (GPU side, pure numpy) ----------------------------------


def _ref(shape=(2, 16, 32), seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def test_compare_passes_a_matching_float16_output():
    ref = [_ref(), _ref((2, 32), 1)]
    ok, errors, detail = reference_groups.compare([r.astype(np.float16) for r in ref], ref, 1e-2,
                                                  ["float16", "float16"])
    assert ok, detail
    assert len(errors) == 2 and all(0 < e < 1e-3 for e in errors)  # fp16 rounding alone


def test_compare_fails_a_perturbed_output():
    ref = [_ref(), _ref((2, 32), 1)]
    noise = np.random.default_rng(2).standard_normal(ref[0].shape).astype(np.float32)
    bad = ref[0] + 0.03 * noise  # ~3e-2 norm-relative: over float16's 1e-2
    ok, errors, detail = reference_groups.compare([bad, ref[1]], ref, 1e-2)
    assert not ok
    assert 2e-2 < errors[0] < 4e-2 and errors[1] == 0.0
    assert "output 0" in detail and "rtol 0.01" in detail
    # float32's tolerance catches a much smaller error
    ok, errors, _ = reference_groups.compare([ref[0] * (1 + 3e-4), ref[1]], ref, 1e-4)
    assert not ok and 2.9e-4 < errors[0] < 3.1e-4


def test_compare_fails_nan_shape_dtype_and_count():
    ref = [_ref()]
    nan = ref[0].copy()
    nan[0, 0, 0] = np.nan
    assert not reference_groups.compare([nan], ref, 1e-2)[0]
    assert not reference_groups.compare([ref[0][:, :8]], ref, 1e-2)[0]
    ok, _, detail = reference_groups.compare([ref[0]], ref, 1e-2, ["float16"])
    assert not ok and "dtype float32, expected float16" in detail
    assert not reference_groups.compare([ref[0], ref[0]], ref, 1e-2)[0]
    zero = [np.zeros((3,), np.float32)]
    assert reference_groups.compare(zero, zero, 1e-4)[0]
    assert not reference_groups.compare([np.full((3,), 1e-9, np.float32)], zero, 1e-4)[0]


def test_compare_reads_bfloat16():
    ref = torch.randn(4, 64)
    ok, errors, _ = reference_groups.compare([ref.bfloat16()], [ref.numpy()], 1e-2, ["bfloat16"])
    assert ok and 1e-4 < errors[0] < 5e-3
    ok, _, _ = reference_groups.compare([(ref * 1.05).bfloat16()], [ref.numpy()], 1e-2, ["bfloat16"])
    assert not ok


def test_missing_group_is_reported(tmp_path):
    groups, missing = reference_groups.find_groups([tmp_path / "hf_bert", tmp_path])
    assert groups == [] and missing == [tmp_path / "hf_bert", tmp_path]
    import run_gpu_tests

    args = types.SimpleNamespace(reference_groups=[str(tmp_path / "hf_bert")], reference_only="",
                                 reference_work=tmp_path / "work", runner=Path("/nonexistent/kiln_runner"))
    summary: list = []
    with open(tmp_path / "log", "w") as log:
        assert run_gpu_tests.check_reference_groups(args, summary, log) == 1
    assert summary[0]["ok"] is False and summary[0]["detail"] == "not here"


# ---- the export (CPU side) and the GPU-side check with a stand-in runner -----

FAKE_RUNNER = """#!{python}
# Stands in for kiln_runner: writes the tensors of $FAKE_OUTPUTS to --save_outputs.
import os, shutil, sys
args = dict(a[2:].split("=", 1) for a in sys.argv[1:] if a.startswith("--") and "=" in a)
assert os.path.isfile(args["model_path"]) and os.path.isfile(args["inputs"]), args
if os.environ.get("FAKE_EXIT"):
    print("Error: this machine has no usable CUDA GPU")
    sys.exit(int(os.environ["FAKE_EXIT"]))
shutil.copy(os.environ["FAKE_OUTPUTS"], args["save_outputs"])
print("latency over 3 runs (wall): median 1.250 ms, p10 1.2 ms, p90 1.3 ms")
"""


@pytest.fixture(scope="module")
def tiny_groups(tmp_path_factory):
    pytest.importorskip("transformers")
    import export_hf_models

    out = tmp_path_factory.mktemp("carry")
    assert export_hf_models.main(["--out", str(out), "--size", "tiny", "--dtypes", "float16", "--trials", "1"]) == 0
    return out


@pytest.mark.needs_compiler
def test_tiny_groups_are_written_and_consistent(tiny_groups, tmp_path):
    import hf_models

    assert sorted(p.name for p in tiny_groups.iterdir()) == ["hf_bert", "hf_llama"]
    manifest = json.loads((tiny_groups / "hf_bert" / reference_groups.MANIFEST).read_text())
    assert [e["name"] for e in manifest] == ["hf_bert_fp16_b1", "hf_bert_fp16_b8"]
    assert sorted(p.name for p in (tiny_groups / "hf_bert").iterdir()) == ["hf_bert_fp16.tar.xz",
                                                                          reference_groups.MANIFEST]
    with tarfile.open(tiny_groups / "hf_bert" / "hf_bert_fp16.tar.xz", "r:xz") as tar:
        names = tar.getnames()
    assert names[:2] == ["hf_bert_fp16_b1.pte", "hf_bert_fp16_b8.pte"]  # the shared weights compress once
    for group in ("hf_bert", "hf_llama"):
        for e in reference_groups.load_group(tiny_groups / group, tmp_path):
            assert e["cpu_fallback_ops"] == 0 and e["delegates"] == ["KilnBackend"], e["name"]
            assert e["rtol"] == 1e-2 and e["output_dtypes"] == ["float16", "float16"]
            model, _ = hf_models.build(e["model"], "float16", "tiny", batch=e["batch"])
            assert hf_models.checksum(model) == e["checksum"]
            exact = model.float()  # the fp16 weights, evaluated in float32
            (trial,) = e["trials"]
            assert trial["reference_vs_eager_hf"] <= 1e-6 and trial["exported_vs_eager"] <= 1e-2
            inputs = [torch.from_numpy(a) for a in tensor_file.load(trial["inputs_path"])]
            assert [[list(t.shape), str(t.dtype)[6:]] for t in inputs] == e["inputs"]
            assert inputs[0].max() < hf_models.vocab_size(e["model"], "tiny")
            # the recorded seed reproduces the inputs
            redrawn = hf_models.random_inputs(e["model"], e["batch"], torch.Generator().manual_seed(trial["seed"]),
                                              "tiny")
            assert all(torch.equal(a, b) for a, b in zip(inputs, redrawn))
            reference = tensor_file.load(trial["reference_path"])
            assert [list(r.shape) for r in reference] == e["output_shapes"]
            assert all(r.dtype == np.float32 for r in reference)
            with torch.no_grad():
                again = [t.numpy() for t in exact(*inputs)]
            ok, errors, detail = reference_groups.compare(again, reference, 1e-6)
            assert ok, (e["name"], detail)
            if e["model"] == "bert":
                mask = inputs[1]
                assert (mask[:, : mask.shape[1] // 2] == 1).all()  # each row pads only its tail
                assert ((mask[:, 1:] <= mask[:, :-1])).all()
            else:
                assert e["output_shapes"][0] == [1, hf_models.LLAMA_LOGITS, hf_models.vocab_size("llama", "tiny")]


@pytest.mark.needs_compiler
def test_gpu_side_check_passes_matching_outputs_and_fails_perturbed_ones(tiny_groups, tmp_path, monkeypatch):
    runner = tmp_path / "fake_runner"
    runner.write_text(FAKE_RUNNER.format(python=sys.executable))
    runner.chmod(0o755)
    (entry,) = [e for e in reference_groups.load_group(tiny_groups / "hf_llama", tmp_path / "unpacked")]
    (trial,) = entry["trials"]
    reference = tensor_file.load(trial["reference_path"])
    outputs = tmp_path / "outputs.ktensors"
    monkeypatch.setenv("FAKE_OUTPUTS", str(outputs))
    log = open(tmp_path / "log", "w")

    tensor_file.save(outputs, [r.astype(np.float16) for r in reference])  # what a correct GPU run returns
    (result,) = reference_groups.check_entry(entry, runner, tmp_path / "work", log)
    assert result["ok"], result
    assert result["seed"] == trial["seed"] and result["median_ms"] == 1.25
    line = reference_groups.result_line(entry, result)
    assert line.startswith("PASS  hf_llama_fp16_b1") and "(torch float16 on the CPU: " in line

    wrong = [reference[0] * 1.05, reference[1]]  # 5% off: over 1e-2
    tensor_file.save(outputs, [r.astype(np.float16) for r in wrong])
    (result,) = reference_groups.check_entry(entry, runner, tmp_path / "work", log)
    assert not result["ok"] and 4e-2 < result["rel_err"][0] < 6e-2
    line = reference_groups.result_line(entry, result)
    assert line.startswith("FAIL") and "rtol 0.01" in line and "logits_last4" in line
    (result,) = reference_groups.check_entry(entry, runner, tmp_path / "work", log, rtol=0.1)  # --reference-rtol
    assert result["ok"] and result["rtol"] == 0.1

    tensor_file.save(outputs, reference)  # float32 where the program returns float16
    (result,) = reference_groups.check_entry(entry, runner, tmp_path / "work", log)
    assert not result["ok"] and "expected float16" in result["detail"]

    monkeypatch.setenv("FAKE_EXIT", "3")
    (result,) = reference_groups.check_entry(entry, runner, tmp_path / "work", log)
    assert not result["ok"] and "exit 3" in result["detail"] and "no usable CUDA GPU" in result["detail"]
    log.close()


@pytest.mark.needs_compiler
def test_broken_group_is_an_error_naming_the_file(tiny_groups, tmp_path):
    import shutil

    broken = tmp_path / "hf_llama"
    shutil.copytree(tiny_groups / "hf_llama", broken)
    (broken / "hf_llama_fp16.tar.xz").unlink()
    with pytest.raises(reference_groups.GroupError, match="hf_llama_fp16.tar.xz is not here"):
        reference_groups.load_group(broken, tmp_path / "unpacked")
