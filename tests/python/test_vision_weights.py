"""The benchmark models' seeded weights (examples/vision_models.py): the GPU
machine rebuilds each model from the seed and checks the checksum, so the
init must depend on numpy's generator alone, and keep fp16 activations sane."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

torchvision = pytest.importorskip("torchvision")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import vision_models  # noqa: E402


def test_same_seed_same_checksum_whatever_torch_rng_state():
    torch.manual_seed(1)
    a, _ = vision_models.build("resnet18_policy", 1)
    torch.manual_seed(2)
    b, _ = vision_models.build("resnet18_policy", 1)
    assert vision_models.checksum(a) == vision_models.checksum(b)
    c, _ = vision_models.build("resnet18_policy", 1, seed=vision_models.DEFAULT_SEED + 1)
    assert vision_models.checksum(c) != vision_models.checksum(a)


def test_weights_are_signs_times_kaiming_std():
    model, _ = vision_models.build("mobilenet_v3_large", 1)
    conv = model.features[1].block[0][0]  # depthwise 3x3, fan_in 9
    w = conv.weight.detach().abs().unique()
    assert len(w) == 1 and abs(float(w[0]) - (2.0 / 9) ** 0.5) < 1e-6
    signs = torch.sign(conv.weight.detach())
    assert (signs != 0).all() and 0.2 < float((signs > 0).float().mean()) < 0.8


@pytest.mark.parametrize("name", ["resnet18_policy", "mobilenet_v3_large"])
def test_fp16_activations_stay_finite_and_not_degenerate(name):
    model, inputs = vision_models.build(name, 2, torch.float32)
    stats = vision_models.activation_stats(model.half(), tuple(x.half() for x in inputs))
    assert stats["finite"], stats
    assert stats["max_abs_activation"] < 6e4, stats  # fp16 max is 65504
    assert stats["output_std"] > 1e-3, stats
