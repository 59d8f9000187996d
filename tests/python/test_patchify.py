"""Convolutions whose kernel equals their stride (ViT's patch embedding,
ConvNeXt's stem and downsampling) compile to one gather kernel and one GEMM
(passes/patchify_conv.cpp), checked on the step plan kiln.compile writes to
debug_dir; no GPU needed. The numbers are checked on the GPU by the
"patchify" conformance family (tests/gpu/conformance_patchify.py)."""

import pytest
import torch
from torch import nn

import kiln
from _helpers import export

pytestmark = pytest.mark.needs_compiler


def _steps(model, x, tmp_path, **options) -> list[tuple[str, str, list[str]]]:
    """(label, the value it writes, the values it reads) of each step of the
    one engine."""
    debug = tmp_path / "dump"
    compiled = kiln.compile(export(model.eval(), x), arg_inputs=(x,), min_block_size=1, target_sms=(90,),
                            debug_dir=debug, **options)
    assert compiled.summary.ops_on_cpu == {}, compiled.summary.line()
    parts = sorted(debug.iterdir())
    assert [p.name for p in parts] == ["partition_0"]
    dumps = sorted(p for p in parts[0].iterdir() if p.suffix == ".txt")  # not NN_kernels.cu
    assert dumps[-1].name.endswith("_lower.txt")
    plan = dumps[-2].read_text().split("# step plan\n")[1]  # "step 0 label: out <- reads"
    steps = []
    for line in plan.splitlines():
        if not line.startswith("step "):
            continue
        head, _, flow = line.partition(": ")
        out, _, reads = flow.partition(" <-")
        steps.append((head.split(" ", 2)[2], out, reads.split()))
    return steps


def _labels(steps) -> list[str]:
    return [step[0] for step in steps]


def _small_vit():
    from torchvision.models.vision_transformer import VisionTransformer

    torch.manual_seed(0)
    return VisionTransformer(image_size=32, patch_size=8, num_layers=1, num_heads=2, hidden_dim=32, mlp_dim=64)


@pytest.mark.parametrize("batch", [1, 4])
@pytest.mark.parametrize("precision", [torch.float32, torch.float16])
def test_vit_patch_embedding_is_a_gather_and_a_gemm(batch, precision, tmp_path):
    steps = _steps(_small_vit(), torch.randn(batch, 3, 32, 32), tmp_path, enabled_precisions={precision})
    labels = _labels(steps)
    assert not any(label.startswith("conv") for label in labels), labels
    # The gather reads the image itself (float32 in, the compute dtype out);
    # the permute back to NCHW, the model's view [n, 32, 16] and permute to
    # tokens [n, 16, 32] are the GEMM's own row order: no kernel until the
    # class token is concatenated. The class token expanded over the batch
    # is a constant (folded at export: passes/fold_constants.cpp).
    assert steps[0][0] == "permute_copy" and steps[0][2] == ["x"], steps
    assert labels[: labels.index("layer_norm")] == ["permute_copy", "linear", "cat", "cat", "add"]
    assert steps[3][2] == [steps[1][1]], "the tokens' piece of the cat reads the GEMM's output"


def test_bare_patch_conv(tmp_path):
    model = nn.Conv2d(3, 16, 4, stride=4)
    steps = _steps(model, torch.randn(2, 3, 16, 24), tmp_path)
    # the patch gather, the GEMM (its bias fused), the NCHW result
    assert _labels(steps) == ["permute_copy", "linear", "permute_copy"], steps
    assert len(steps[1][2]) == 3, "the GEMM reads the patches, the weight and the bias"


def test_leftover_rows_and_columns_are_cropped(tmp_path):
    model = nn.Conv2d(4, 8, (2, 3), stride=(2, 3), bias=False)
    assert _labels(_steps(model, torch.randn(1, 4, 9, 10), tmp_path)) == ["permute_copy", "linear", "permute_copy"]


@pytest.mark.parametrize("model,shape,options", [
    (nn.Conv2d(3, 16, 4, stride=2), (1, 3, 16, 16), {}),
    (nn.Conv2d(3, 16, 4, stride=4, padding=1), (1, 3, 16, 16), {}),
    (nn.Conv2d(4, 16, 4, stride=4, groups=2), (1, 4, 16, 16), {}),
    (nn.Conv2d(3, 16, 2, stride=2, dilation=2), (1, 3, 16, 16), {}),
    # their patches can be the input's own order, which a GEMM cannot read
    # from its storage (passes/patchify_conv.cpp)
    (nn.Conv2d(3, 16, (1, 4), stride=(1, 4)), (1, 3, 16, 16), {}),
    (nn.Conv1d(4, 8, 3, stride=3), (2, 4, 12), {}),
    (nn.Conv2d(3, 16, 4, stride=4), (1, 3, 16, 16), {"conv_gemm": "unstrided"}),
    (nn.Conv2d(3, 16, 4, stride=4), (1, 3, 16, 16), {"conv_gemm": "none"}),
], ids=["stride", "padding", "groups", "dilation", "height1", "conv1d", "unstrided", "none"])
def test_other_convolutions_stay_on_cudnn(model, shape, options, tmp_path):
    labels = _labels(_steps(model, torch.randn(*shape), tmp_path, **options))
    assert "conv" in labels and "linear" not in labels, labels


class ConvNeXtStemAndDownsampling(nn.Module):
    def __init__(self, c=32):
        super().__init__()
        from torchvision.models.convnext import LayerNorm2d

        self.stem = nn.Conv2d(3, c, 4, stride=4)
        self.norm = LayerNorm2d(c)
        self.down = nn.Conv2d(c, 2 * c, 2, stride=2)

    def forward(self, x):
        return self.down(self.norm(self.stem(x)))


def test_convnext_downsampling_gathers_from_channels_last(tmp_path):
    steps = _steps(ConvNeXtStemAndDownsampling(), torch.randn(2, 3, 32, 32), tmp_path)
    # the stem's gather of the image, its GEMM, the layer norm on its
    # channels-last rows, the downsampling's gather of those, its GEMM, NCHW
    assert _labels(steps) == ["permute_copy", "linear", "layer_norm", "permute_copy", "linear", "permute_copy"], steps
    assert steps[3][2] == [steps[2][1]], "the gather reads the layer norm's channels-last output"
