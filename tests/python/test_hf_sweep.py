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
