"""tools/coverage/hf_sweep.py on the models whose gaps it found: Falcon's rotary
tables (index.Tensor with None before the index tensor), wav2vec2's first
conv over the raw waveform (a conv reading a view of the engine input),
BART's shift_tokens_right (copy + slice_scatter) and Mamba's depthwise conv
(its weight reached through squeeze/unsqueeze of the parameter) each left
ops on the CPU; all now run entirely in Kiln engines."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.needs_compiler

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools" / "coverage"))
import hf_sweep  # noqa: E402


@pytest.mark.parametrize("name", ["falcon", "wav2vec2", "bart", "mamba"])
def test_model_runs_entirely_in_kiln(name):
    row = hf_sweep.sweep_one(name, hf_sweep.cases()[name], (90,))
    assert row["status"] == "pass", row


def test_markdown_names_each_cpu_op_with_its_reason():
    rows = [{"model": "m", "status": "cpu", "cpu_ops": {"aten.flip.default": 1},
             "reasons": {"aten.flip.default": "not implemented"}, "delegates": 2, "seconds": 1.0}]
    text = hf_sweep.markdown(rows, "abc1234")
    assert "| m | cpu | 2 | `aten.flip.default` x1 (not implemented) | 1.0 |" in text
    assert "0/1 models with every op in Kiln engines" in text


def test_unknown_model_is_refused_with_the_known_names(capsys):
    with pytest.raises(SystemExit):
        hf_sweep.main(["--models", "nope"])
    assert "unknown models ['nope']" in capsys.readouterr().err


def test_reasons_include_nodes_refused_after_a_failed_compile():
    # A node left to the CPU because its partition failed to compile is
    # announced by _partition_trial.py, not by the partitioner's "on the
    # CPU" line; the table must still give its reason.
    import logging
    collected = hf_sweep._CpuReasons()
    for message in ["kiln: aten.bmm.default ('aten_bmm_default_2') left to the CPU: engine failed validation",
                    "kiln: aten.topk.default x2 on the CPU: not implemented",
                    "kiln: 7 partitions, 211 ops taken by KilnBackend, 6 ops left to the CPU: aten.bmm.default (x4)"]:
        collected.emit(logging.LogRecord("kiln", logging.INFO, __file__, 0, message, None, None))
    assert collected.reasons == {"aten.bmm.default": "engine failed validation",
                                 "aten.topk.default": "not implemented"}
