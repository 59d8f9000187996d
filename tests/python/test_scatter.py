"""Functionalized in-place writes into a fresh tensor, as BART-family models
build their decoder inputs (shift_tokens_right: y[:, 1:] = ids[:, :-1];
y[:, 0] = start): export turns them into copy and slice_scatter, which Kiln
takes as layout pieces. The CPU machine checks what is taken; the layout
pieces' element placement is checked by kiln_compiler_tests
(Patchify.SliceScatterAndCopyAreLayoutPieces)."""

from __future__ import annotations

import pytest
import torch

import kiln

pytestmark = pytest.mark.needs_compiler


class ShiftRight(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(100, 16)

    def forward(self, ids):
        shifted = ids.new_zeros(ids.shape)
        shifted[:, 1:] = ids[:, :-1].clone()
        shifted[:, 0] = 2
        return self.embed(shifted)


def test_shift_tokens_right_runs_entirely_in_kiln():
    ids = torch.randint(0, 100, (2, 12))
    compiled = kiln.compile(torch.export.export(ShiftRight().eval(), (ids,)), arg_inputs=(ids,),
                            min_block_size=1, target_sms=(90,))
    assert compiled.summary.ops_on_cpu == {}, compiled.summary.line()


def test_refusals_name_the_problem():
    kc = kiln._kiln_compiler
    f32 = lambda shape: ("float32", shape, False)  # noqa: E731
    reason = kc.check_support("aten.slice_scatter.default", [f32([4, 8]), f32([4, 4])],
                              {"dim": 1, "start": 0, "end": 8, "step": 2}, [("float32", [4, 8])])
    assert "step other than 1" in reason
    reason = kc.check_support("aten.slice_scatter.default", [f32([4, 8]), f32([4, 3])],
                              {"dim": 1, "start": 2, "end": 6, "step": 1}, [("float32", [4, 8])])
    assert "does not match the slice" in reason
    reason = kc.check_support("aten.copy.default", [f32([4, 8]), f32([3])], {}, [("float32", [4, 8])])
    assert "does not broadcast" in reason
    assert kc.check_support("aten.copy.default", [f32([4, 8]), f32([8])], {}, [("float32", [4, 8])]) is None
