"""The benchmark models, with weights that are the same on every machine.

    build(name, batch, dtype) -> (module, example_inputs)

Models (torchvision definitions, eval mode, random weights):

  mlp_policy          MLP robot policy 512 -> 1024 -> 1024 -> 1024 -> 32, GELU
  resnet50            torchvision.models.resnet50
  mobilenet_v3_large  torchvision.models.mobilenet_v3_large
  efficientnet_b0     torchvision.models.efficientnet_b0
  resnet18_policy     torchvision resnet18 backbone (fc removed, 512 features)
                      + MLP head 512 -> 512 -> 512 -> 32 (GELU)
  convnext_tiny       torchvision.models.convnext_tiny (LayerNorm, 7x7 depthwise,
                      GELU MLPs, layer scale)
  lraspp_mobilenet_v3_large
                      torchvision.models.segmentation.lraspp_mobilenet_v3_large
                      (21 classes; returns the "out" map, bilinear upsampling)
  vit_b_16            torchvision.models.vit_b_16 (12 encoder blocks of
                      nn.MultiheadAttention, 12 heads of 64, 197 tokens)
  swin_t              torchvision.models.swin_t (shifted-window attention with
                      relative position bias and window masks, 49 tokens a window)
  bert_base           BERT-base (examples/bert_model.py: Hugging Face
                      BertModel's architecture in plain PyTorch), sequence 128;
                      inputs input_ids and attention_mask, int64 [batch, 128]

The conv models take [batch, 3, 224, 224], the MLP [batch, 512].

Deterministic weights (init_weights): the models are exported on the CPU
machine (torch 2.14 / torchvision 0.29) and rebuilt on the GPU machine (torch
2.11 / torchvision 0.26) to compute PyTorch's reference and run the PyTorch
peers, and both must hold the SAME weights without carrying them. torch's RNG
is not used: every state_dict entry, in state_dict order, is overwritten from
numpy's PCG64 (np.random.default_rng(seed)), whose streams numpy keeps stable
across versions. `checksum()` (sha256 over each entry's name, shape and
float32 bytes, in order) is stored in the manifest at export and verified
where the model is rebuilt.

Weight transport trick: weights (conv/linear) are Rademacher signs (+-1) times
the tensor's Kaiming std sqrt(2 / fan_in), so each weight tensor holds two
distinct values. The .pte files (which embed the weights) then compress about
10x with xz; without that, the fp32 resnet50 alone (~100 MB) would not fit the
64 MiB that can be carried to the GPU machine per call. Random-sign weights
with a Kaiming scale behave like Kaiming-normal ones for keeping activations
in range. Biases are small normals (std 0.02). BatchNorm is random per channel:
gamma U(0.5, 1.5), beta N(0, 0.1), running_mean N(0, 0.1), running_var
U(0.5, 2). The last BatchNorm of each residual branch gets gamma U(0.1, 0.3)
instead (in the spirit of torchvision's zero_init_residual), otherwise the
variance roughly doubles at every residual add and the ~16 blocks of resnet50
would push fp16 activations toward overflow. `activation_stats()` checks the
range on the CPU (tests/python/test_vision_models.py).
"""

from __future__ import annotations

import hashlib
import math

import numpy as np
import torch
from torch import nn

MODELS = ("mlp_policy", "resnet50", "mobilenet_v3_large", "efficientnet_b0", "resnet18_policy", "convnext_tiny",
          "lraspp_mobilenet_v3_large", "vit_b_16", "swin_t", "bert_base")
BERT_SEQ = 128
CONV_MODELS = ("resnet50", "mobilenet_v3_large", "efficientnet_b0", "resnet18_policy", "convnext_tiny",
               "lraspp_mobilenet_v3_large")
DEFAULT_SEED = 20261202
DTYPES = {"float32": torch.float32, "float16": torch.float16}


class MlpPolicy(nn.Sequential):
    def __init__(self, sizes=(512, 1024, 1024, 1024, 32)):
        layers: list[nn.Module] = []
        for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
            layers.append(nn.Linear(a, b))
            if i < len(sizes) - 2:
                layers.append(nn.GELU())
        super().__init__(*layers)


class ResNet18Policy(nn.Module):
    """Image -> action: torchvision resnet18 features (fc dropped) + MLP head."""

    def __init__(self, actions: int = 32):
        super().__init__()
        import torchvision

        self.backbone = torchvision.models.resnet18(weights=None)
        self.backbone.fc = nn.Identity()
        self.head = MlpPolicy((512, 512, 512, actions))

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(image))


class SegmentationOut(nn.Module):
    """A torchvision segmentation model returning its "out" map (the models
    return a dict) so it exports with one tensor output."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return self.model(image)["out"]


def _construct(name: str) -> nn.Module:
    if name == "mlp_policy":
        return MlpPolicy()
    if name == "bert_base":
        from bert_model import BertBase

        return BertBase()
    if name == "resnet18_policy":
        return ResNet18Policy()
    import torchvision

    if name in ("resnet50", "mobilenet_v3_large", "efficientnet_b0", "convnext_tiny", "vit_b_16", "swin_t"):
        return getattr(torchvision.models, name)(weights=None)
    if name == "lraspp_mobilenet_v3_large":
        return SegmentationOut(torchvision.models.segmentation.lraspp_mobilenet_v3_large(
            weights=None, weights_backbone=None))
    raise ValueError(f"unknown model {name!r}; known: {', '.join(MODELS)}")


def input_shape(name: str, batch: int) -> tuple[int, ...]:
    if name == "bert_base":
        return (batch, BERT_SEQ)
    return (batch, 512) if name == "mlp_policy" else (batch, 3, 224, 224)


def random_inputs(name: str, batch: int, dtype: torch.dtype, device="cpu", generator=None) -> tuple[torch.Tensor, ...]:
    """Fresh inputs: float ones from N(0, 1) in `dtype`; BERT's token ids over
    the whole vocabulary and an attention mask padding each row's tail."""
    shape = input_shape(name, batch)
    if name != "bert_base":
        return (torch.randn(shape, generator=generator, device=device, dtype=dtype),)
    ids = torch.randint(0, 30522, shape, generator=generator, device=device)
    lengths = torch.randint(BERT_SEQ // 2, BERT_SEQ + 1, (batch, 1), generator=generator, device=device)
    mask = (torch.arange(BERT_SEQ, device=device)[None, :] < lengths).long()
    return ids, mask


def _residual_last_bns(model: nn.Module) -> set[nn.Module]:
    """The last BatchNorm of each residual branch (its output is added to the
    block's input): torchvision's BasicBlock.bn2, Bottleneck.bn3, and the last
    BatchNorm of a MobileNetV3/EfficientNet inverted residual that uses its
    skip connection."""
    found: set[nn.Module] = set()
    for m in model.modules():
        kind = type(m).__name__
        if kind == "BasicBlock":
            found.add(m.bn2)
        elif kind == "Bottleneck":
            found.add(m.bn3)
        elif getattr(m, "use_res_connect", False) and hasattr(m, "block"):
            bns = [b for b in m.block.modules() if isinstance(b, nn.BatchNorm2d)]
            if bns:
                found.add(bns[-1])
    return found


def init_weights(model: nn.Module, seed: int = DEFAULT_SEED) -> nn.Module:
    """Overwrites every parameter and buffer, in state_dict order, from
    np.random.default_rng(seed) (see the module docstring). Same result on
    any torch/torchvision version that defines the same state_dict."""
    rng = np.random.default_rng(seed)
    owners = dict(model.named_modules())
    residual_bns = _residual_last_bns(model)
    with torch.no_grad():
        for key, tensor in model.state_dict(keep_vars=True).items():
            module_name, _, leaf = key.rpartition(".")
            owner = owners[module_name]
            shape = tuple(tensor.shape)
            if not tensor.is_floating_point():
                if leaf == "num_batches_tracked":
                    tensor.data.zero_()
                continue  # index buffers (Swin's relative_position_index) stay as built
            if isinstance(owner, nn.modules.batchnorm._BatchNorm):
                n = shape[0]
                if leaf == "weight":
                    lo, hi = (0.1, 0.3) if owner in residual_bns else (0.5, 1.5)
                    values = rng.uniform(lo, hi, n)
                elif leaf == "bias" or leaf == "running_mean":
                    values = rng.normal(0.0, 0.1, n)
                elif leaf == "running_var":
                    values = rng.uniform(0.5, 2.0, n)
                else:
                    raise ValueError(f"unexpected BatchNorm entry {key}")
            elif isinstance(owner, (nn.LayerNorm, nn.GroupNorm)) or type(owner).__name__ == "LayerNorm2d":
                values = rng.uniform(0.5, 1.5, shape) if leaf == "weight" else rng.normal(0.0, 0.1, shape)
            elif leaf == "layer_scale":  # ConvNeXt's per-channel residual scale
                values = rng.uniform(0.1, 0.3, shape)
            elif leaf in ("class_token", "pos_embedding", "relative_position_bias_table"):  # ViT/Swin tables
                values = rng.normal(0.0, 0.02, shape)
            elif leaf == "in_proj_weight":  # nn.MultiheadAttention's packed q/k/v projection
                std = math.sqrt(1.0 / shape[1])
                values = (rng.integers(0, 2, size=shape, dtype=np.int8) * 2 - 1).astype(np.float64) * std
            elif leaf == "in_proj_bias":
                values = rng.normal(0.0, 0.02, shape)
            elif leaf == "weight" and len(shape) >= 2:
                fan_in = math.prod(shape[1:])  # conv: in/groups * kh * kw; linear: in
                std = math.sqrt(2.0 / fan_in)
                values = (rng.integers(0, 2, size=shape, dtype=np.int8) * 2 - 1).astype(np.float64) * std
            elif leaf == "bias":
                values = rng.normal(0.0, 0.02, shape)
            else:
                raise ValueError(f"no init rule for {key} {shape} in {type(owner).__name__}")
            data = torch.from_numpy(np.asarray(values, dtype=np.float32).reshape(shape))
            tensor.data.copy_(data.to(tensor.dtype))
    return model


def checksum(model: nn.Module) -> str:
    """sha256 over each state_dict entry's name, shape and float32 bytes, in order."""
    h = hashlib.sha256()
    for key, tensor in model.state_dict().items():
        h.update(key.encode())
        h.update(repr(tuple(tensor.shape)).encode())
        h.update(tensor.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()


def example_inputs(name: str, batch: int, dtype: torch.dtype, seed: int = 0) -> tuple[torch.Tensor, ...]:
    if name == "bert_base":
        return random_inputs(name, batch, dtype, generator=torch.Generator().manual_seed(seed))
    rng = np.random.default_rng(seed)
    x = torch.from_numpy(rng.standard_normal(input_shape(name, batch)).astype(np.float32))
    return (x.to(dtype),)


def build(name: str, batch: int, dtype: torch.dtype | str = torch.float32, seed: int = DEFAULT_SEED):
    """(module in eval mode and `dtype`, on the CPU; example inputs)."""
    dtype = DTYPES[dtype] if isinstance(dtype, str) else dtype
    model = init_weights(_construct(name).eval(), seed)
    return model.to(dtype), example_inputs(name, batch, dtype)


def activation_stats(model: nn.Module, inputs) -> dict:
    """Largest |activation| over every leaf module's output, and the output's
    std: for checking that the weights keep activations in fp16's range."""
    peak = [0.0]

    def hook(_m, _i, out):
        if isinstance(out, torch.Tensor) and out.is_floating_point():
            peak[0] = max(peak[0], float(out.detach().abs().max()))

    handles = [m.register_forward_hook(hook) for m in model.modules() if not list(m.children())]
    try:
        with torch.no_grad():
            out = model(*inputs)
    finally:
        for h in handles:
            h.remove()
    return {"max_abs_activation": peak[0], "output_std": float(out.float().std()),
            "output_max_abs": float(out.float().abs().max()), "finite": bool(torch.isfinite(out).all())}


if __name__ == "__main__":
    import time

    for model_name in MODELS:
        t = time.time()
        m, x = build(model_name, 2)
        print(model_name, checksum(m)[:16], activation_stats(m, x), f"{time.time() - t:.1f}s")
