"""The torchvision zoo as the coverage sweep uses it, the same on the CPU
machine (torch 2.14 / torchvision 0.29, export) and the GPU machine (torch
2.11 / torchvision 0.26, PyTorch reference): pure torch + numpy, no Kiln, no
ExecuTorch.

    names()                      classification + segmentation model names
    parameters(name)             parameter count (built on the meta device)
    build(name, dtype, seed)     (model in eval mode, example input [1, 3, 224, 224])
    checksum(model)              sha256 over the state dict (names, shapes, float32 bytes)

Weights are random (weights=None, weights_backbone=None: nothing is
downloaded) and set from numpy's PCG64 (np.random.default_rng(seed)), in
state-dict order, so both machines hold the same model without carrying
weights (the idea of examples/vision_models.py, generalized to every module
type of the zoo):
  * BatchNorm: gamma U(0.5, 1.5), beta N(0, 0.1), running_mean N(0, 0.1),
    running_var U(0.5, 2); gamma U(0.1, 0.3) on the last BatchNorm of a
    residual branch (torchvision's BasicBlock/Bottleneck/inverted residuals);
  * weights with >= 2 dims (conv, linear, embeddings, attention in_proj_weight): Rademacher signs times
    the Kaiming std sqrt(2 / fan_in), so the .pte files compress ~10x with xz;
  * other 1-D "weight"s (LayerNorm, GroupNorm gammas): U(0.5, 1.5); biases
    N(0, 0.02); layer scales U(0.1, 0.3) (residual branches, as above);
  * anything else (class tokens, position embeddings, relative position bias
    tables, ...): N(0, 0.02); integer buffers (indices, counters) are kept
    as the module built them (they are deterministic).
"""

from __future__ import annotations

import hashlib
import math

import numpy as np
import torch
from torch import nn

DEFAULT_SEED = 20261203
INPUT_SIZE = 224


def names() -> list[tuple[str, str]]:
    """[(name, kind)] for kind in ("classification", "segmentation")."""
    import torchvision.models as models

    out = [(n, "classification") for n in models.list_models(module=models)]
    out += [(n, "segmentation") for n in models.list_models(module=models.segmentation)]
    return out


# "<model>.stage<k>": the model's stem and first k of its `blocks` (MaxVit's
# stages), with the full model's seeded weights: a prefix to bisect a
# numerical difference by stage (docs/coverage.md, "Bisecting").
# "<model>.stage<k>.<j>" cuts finer: the first k-1 blocks whole, then the
# first j sub-layers of block k (its nested `layers`, flattened: MaxVit's
# MBConv, window attention, grid attention, per layer). The name goes into
# file names, so it keeps to letters, digits, "_" and ".".
PREFIX_SEP = ".stage"


def _sublayers(block: nn.Module) -> list[nn.Module]:
    """A block's layers, each opened one level (its own `layers`), in order:
    MaxVit's MBConv, window attention, grid attention, per layer. (MBConv has
    `layers` of its own; they are not opened.)"""
    out: list[nn.Module] = []
    for layer in getattr(block, "layers", [block]):
        inner = getattr(layer, "layers", None)
        out += list(inner) if isinstance(inner, (nn.ModuleList, nn.Sequential)) else [layer]
    return out


class _Prefix(nn.Module):
    def __init__(self, model: nn.Module, stages: int, sublayers: int = 0) -> None:
        super().__init__()
        if not hasattr(model, "stem") or not isinstance(getattr(model, "blocks", None), nn.ModuleList):
            raise ValueError(f"{type(model).__name__} has no stem + blocks to take a prefix of")
        if not 1 <= stages <= len(model.blocks):
            raise ValueError(f"{type(model).__name__} has {len(model.blocks)} blocks, not {stages}")
        self.stem = model.stem
        kept = list(model.blocks)[:stages]
        if sublayers:
            leaves = _sublayers(kept[-1])
            if not 1 <= sublayers <= len(leaves):
                raise ValueError(f"block {stages} of {type(model).__name__} has {len(leaves)} sub-layers, "
                                 f"not {sublayers}")
            kept[-1] = nn.Sequential(*leaves[:sublayers])
        self.blocks = nn.ModuleList(kept)

    def forward(self, x):
        x = self.stem(x)
        for block in self.blocks:
            x = block(x)
        return x


def suffix_steps(model: nn.Module, stages: int, sublayers: int = 0) -> list[tuple[str, nn.Module]]:
    """What follows the prefix "<model>.stage<k>[.<j>]" in the whole model, as
    named steps: the rest of block k's sub-layers, the later blocks' sub-layers,
    then the classifier. Running them on the prefix's output gives the model's."""
    if not hasattr(model, "stem") or not isinstance(getattr(model, "blocks", None), nn.ModuleList) or \
            not hasattr(model, "classifier"):
        raise ValueError(f"{type(model).__name__} has no stem + blocks + classifier to continue a prefix with")
    steps: list[tuple[str, nn.Module]] = []
    for b in range(stages - 1 if sublayers else stages, len(model.blocks)):
        leaves = _sublayers(model.blocks[b])
        first = sublayers if sublayers and b == stages - 1 else 0
        steps += [(f"stage{b + 1}.{i + 1}", leaf) for i, leaf in enumerate(leaves) if i >= first]
    return steps + [("classifier", model.classifier)]


def split_prefix(name: str) -> tuple[str, int, int]:
    """("maxvit_t", 2, 0) for "maxvit_t.stage2", ("maxvit_t", 4, 3) for
    "maxvit_t.stage4.3", (name, 0, 0) for a whole model."""
    base, sep, cut = name.partition(PREFIX_SEP)
    if not sep:
        return name, 0, 0
    k, dot, j = cut.partition(".")
    if not k.isdigit() or int(k) < 1 or (dot and (not j.isdigit() or int(j) < 1)):
        raise ValueError(f"'{name}': expected <model>{PREFIX_SEP}<number of blocks>[.<number of sub-layers>]")
    return base, int(k), int(j) if dot else 0


def kind_of(name: str) -> str:
    """A zoo model's kind, prefixes included; ValueError when it is none."""
    base = split_prefix(name)[0]
    kinds = dict(names())
    if base not in kinds:
        raise ValueError(f"'{base}' is not a torchvision classification or segmentation model")
    return kinds[base]


def _construct(name: str) -> nn.Module:
    import torchvision.models as models

    kwargs = {"weights": None}
    if name in models.list_models(module=models.segmentation):
        kwargs["weights_backbone"] = None
    return models.get_model(name, **kwargs)


def parameters(name: str) -> int:
    base, stages, sublayers = split_prefix(name)
    try:
        with torch.device("meta"):  # no memory, no init
            model = _construct(base)
    except Exception:  # a builder that computes on tensors (regnet)
        model = _construct(base)
    if stages:
        model = _Prefix(model, stages, sublayers)
    return sum(p.numel() for p in model.parameters())


def _residual_last_norms(model: nn.Module) -> set[nn.Module]:
    found: set[nn.Module] = set()
    for m in model.modules():
        kind = type(m).__name__
        if kind == "BasicBlock" and hasattr(m, "bn2"):
            found.add(m.bn2)
        elif kind == "Bottleneck" and hasattr(m, "bn3"):
            found.add(m.bn3)
        elif kind == "ResBottleneckBlock" and hasattr(m, "f"):  # regnet
            bns = [b for b in m.f.modules() if isinstance(b, nn.BatchNorm2d)]
            if bns:
                found.add(bns[-1])
        elif getattr(m, "use_res_connect", False) and hasattr(m, "block"):
            bns = [b for b in m.block.modules() if isinstance(b, nn.BatchNorm2d)]
            if bns:
                found.add(bns[-1])
        elif getattr(m, "use_res_connect", False) and hasattr(m, "conv"):  # mobilenet_v2
            bns = [b for b in m.conv.modules() if isinstance(b, nn.BatchNorm2d)]
            if bns:
                found.add(bns[-1])
    return found


def init_weights(model: nn.Module, seed: int = DEFAULT_SEED) -> nn.Module:
    rng = np.random.default_rng(seed)
    owners = dict(model.named_modules())
    residual = _residual_last_norms(model)
    with torch.no_grad():
        for key, tensor in model.state_dict(keep_vars=True).items():
            module_name, _, leaf = key.rpartition(".")
            owner = owners.get(module_name)
            shape = tuple(tensor.shape)
            if not tensor.is_floating_point():
                continue  # num_batches_tracked, relative position indices: deterministic
            if isinstance(owner, nn.modules.batchnorm._BatchNorm):
                n = shape[0]
                if leaf == "weight":
                    lo, hi = (0.1, 0.3) if owner in residual else (0.5, 1.5)
                    values = rng.uniform(lo, hi, n)
                elif leaf in ("bias", "running_mean"):
                    values = rng.normal(0.0, 0.1, n)
                elif leaf == "running_var":
                    values = rng.uniform(0.5, 2.0, n)
                else:
                    values = rng.normal(0.0, 0.02, shape)
            elif leaf in ("weight", "in_proj_weight") and len(shape) >= 2:
                fan_in = math.prod(shape[1:])
                std = math.sqrt(2.0 / fan_in)
                values = (rng.integers(0, 2, size=shape, dtype=np.int8) * 2 - 1).astype(np.float64) * std
            elif leaf == "weight":
                values = rng.uniform(0.5, 1.5, shape)
            elif leaf == "bias":
                values = rng.normal(0.0, 0.02, shape)
            elif "layer_scale" in leaf or "layer_scale" in key:
                values = rng.uniform(0.1, 0.3, shape)
            else:
                values = rng.normal(0.0, 0.02, shape)
            data = torch.from_numpy(np.asarray(values, dtype=np.float32).reshape(shape))
            tensor.data.copy_(data.to(tensor.dtype))
    return model


def checksum(model: nn.Module) -> str:
    h = hashlib.sha256()
    for key, tensor in model.state_dict().items():
        h.update(key.encode())
        h.update(repr(tuple(tensor.shape)).encode())
        h.update(tensor.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()


def example_input(dtype: torch.dtype, seed: int = 0, size: int = INPUT_SIZE) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    return torch.from_numpy(rng.standard_normal((1, 3, size, size)).astype(np.float32)).to(dtype)


def build(name: str, dtype: torch.dtype = torch.float32, seed: int = DEFAULT_SEED):
    """(model in eval mode and `dtype` on the CPU, example input). A prefix
    name ("maxvit_t.stage2") is seeded as its whole model, then cut."""
    base, stages, sublayers = split_prefix(name)
    model = init_weights(_construct(base).eval(), seed)
    if stages:
        model = _Prefix(model, stages, sublayers).eval()
    return model.to(dtype), example_input(dtype)


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    """Norm-relative distance of `got` from `want`, in float64: the coverage's error measure."""
    want = want.double()
    return float((got.double() - want).norm() / want.norm().clamp_min(1e-300))


def flatten_outputs(out) -> list[torch.Tensor]:
    """Model outputs in the order the exported program returns them (a
    segmentation model's dict flattens in insertion order)."""
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict):
        return [t for v in out.values() for t in flatten_outputs(v)]
    return [t for v in out for t in flatten_outputs(v)]
