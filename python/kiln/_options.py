"""Kiln's user-facing options: validation and their compile-spec encoding.

The options travel from ``kiln.compile`` to ``KilnBackend.preprocess`` inside
ExecuTorch's ``CompileSpec`` list (key -> bytes), so they are encoded as short
ASCII strings that are also readable when inspecting a .pte.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

import torch

from executorch.exir.backend.compile_spec_schema import CompileSpec

# Dtypes the engine can compute in, in a stable order for encoding.
PRECISIONS: dict[torch.dtype, str] = {
    torch.float32: "float32",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
}
_PRECISION_BY_NAME = {name: dtype for dtype, name in PRECISIONS.items()}

CONV_GEMM_MODES = ("all", "unstrided", "none")
# The persistent decode kernel's tuning options (ops/decode_layers_kernel.h), all ints; the
# compiler checks their values.
PERSISTENT_DECODE_OPTIONS = ("a_tasks", "b_inflight", "counted_rows", "head_inflight", "kv_rows", "l2_prefetch", "max_inflight",
                             "release_inflight", "stages", "warp_norm", "warp_rotary")



def parse_persistent_decode_options(text: str) -> dict[str, int]:
    """"counted_rows=1,kv_rows=0" -> {"counted_rows": 1, "kv_rows": 0}: the compile spec's encoding,
    also what export_llama.py --decode-options takes. Names are checked by validate_options."""
    options: dict[str, int] = {}
    for item in filter(None, text.split(",")):
        name, sep, value = item.partition("=")
        try:
            if not sep or not name.strip():
                raise ValueError
            options[name.strip()] = int(value)
        except ValueError:
            raise ValueError(f"persistent_decode_options: expected name=int,... got {item!r} in {text!r}") from None
    return options


# NVRTC in CUDA 13 (what the compiler links) builds for sm_75 and newer.
MIN_SM = 75
# A cubin for each SM NVRTC 13 builds for from Ampere on (A100, RTX 30xx,
# Jetson Orin, RTX 40xx/L4, H100/H200, B200, Jetson Thor, RTX 50xx), plus PTX
# for the oldest, sm_80, which any newer GPU can JIT. Same list as
# CompileOptions::target_sms (src/compiler/compiler.h).
DEFAULT_TARGET_SMS = (80, 86, 87, 89, 90, 100, 110, 120)


def one_cubin_per_major(target_sms) -> tuple[int, ...]:
    """The oldest SM of each major in `target_sms`: cubins for these cover
    every SM listed, because CUDA runs sm_X.y machine code on sm_X.z for
    z >= y (the runtime picks that cubin: kernel_code_choice.h)."""
    oldest: dict[int, int] = {}
    for sm in target_sms:
        oldest[sm // 10] = min(sm, oldest.get(sm // 10, sm))
    return tuple(sorted(oldest.values()))


# The cubins the default targets get: one per major, sm_80 (serving sm_86,
# sm_87 and sm_89), sm_90, sm_100, sm_110 and sm_120, plus PTX compute_80.
# ptxas per SM dominated export time (densenet201: 8 assemblies of one large
# module); the three minor-version cubins were copies of sm_80's code paths
# anyway (kernels are chosen for the oldest SM: OpOptions::min_target_sm).
# An explicit target_sms list gets exactly the cubins it names.
DEFAULT_CUBIN_SMS = one_cubin_per_major(DEFAULT_TARGET_SMS)


@dataclass(frozen=True)
class KilnOptions:
    enabled_precisions: tuple[str, ...] = ("float32",)
    min_block_size: int = 1
    target_sms: tuple[int, ...] = DEFAULT_TARGET_SMS
    # The SMs that get a cubin; () = one for each of target_sms (an explicit
    # list). The default targets get DEFAULT_CUBIN_SMS.
    cubin_sms: tuple[int, ...] = DEFAULT_CUBIN_SMS
    use_cuda_graphs: int = -1  # -1: no choice baked in, 0: off, 1: on
    emit_ptx: bool = True
    # "" keeps the delegate's inputs and outputs on the host; "cuda:0" tells
    # ExecuTorch (its PropagateDevicePass reads the "target_device" compile
    # spec) that they live on that GPU, for device-resident programs.
    target_device: str = ""
    # How ops are planned (recorded in each engine's metadata; see
    # docs/user_guide.md): 1x1 convs as GEMMs ("all", "unstrided", "none")
    # and depthwise convs as generated kernels.
    conv_gemm: str = "all"
    depthwise_kernels: bool = True
    # Products of <= 4 activation rows (decode steps) as generated
    # matrix-vector kernels instead of cuBLASLt.
    gemv_kernels: bool = True
    # Programmatic dependent launch on sm_90+: generated kernels wait for
    # their predecessor on the GPU, so each launch overlaps the previous
    # kernel (codegen/grid_dependency.h); recorded, read by the runtime.
    overlap_launches: bool = True
    # A language model's decode layers as one persistent kernel (sm_90+
    # targets only; passes/fold_decode_layers.cpp); off by default.
    persistent_decode: bool = False
    # Its kernel's tuning options, (name, value) sorted by name
    # (PERSISTENT_DECODE_OPTIONS; () = the defaults).
    persistent_decode_options: tuple[tuple[str, int], ...] = ()
    # A folder for the IR after each compiler pass ("" = none); each
    # partition gets a subfolder. Not stored in the .pte.
    debug_dir: str = ""
    # "kiln/<model id>/": engines keep their weights in ExecuTorch named data
    # under this prefix + content hash (_weights.py), so weights that several
    # methods use are stored and uploaded once. "" keeps them inside each
    # engine (a KilnPartitioner used without kiln.compile).
    weights_prefix: str = ""
    # Sizes a dynamic dim (torch.export Dim) is compiled for: one engine
    # variant per size inside the Dim's range (_dynamic.py). () = the range's
    # min, its max and the powers of two between them.
    shape_buckets: tuple[int, ...] = ()

    # ---- compile specs ---------------------------------------------------
    def to_compile_specs(self) -> list[CompileSpec]:
        return [
            CompileSpec("enabled_precisions", ",".join(self.enabled_precisions).encode()),
            CompileSpec("target_sms", ",".join(str(sm) for sm in self.target_sms).encode()),
        ] + ([CompileSpec("cubin_sms", ",".join(str(sm) for sm in self.cubin_sms).encode())]
             if self.cubin_sms else []) + [
            CompileSpec("use_cuda_graphs", str(self.use_cuda_graphs).encode()),
            CompileSpec("min_block_size", str(self.min_block_size).encode()),
            CompileSpec("emit_ptx", b"1" if self.emit_ptx else b"0"),
            CompileSpec("conv_gemm", self.conv_gemm.encode()),
            CompileSpec("depthwise_kernels", b"1" if self.depthwise_kernels else b"0"),
            CompileSpec("gemv_kernels", b"1" if self.gemv_kernels else b"0"),
            CompileSpec("overlap_launches", b"1" if self.overlap_launches else b"0"),
        ] + ([CompileSpec("persistent_decode", b"1")] if self.persistent_decode else []) + (
            [CompileSpec("persistent_decode_options",
                         ",".join(f"{k}={v}" for k, v in self.persistent_decode_options).encode())]
            if self.persistent_decode_options else []) + ([CompileSpec("debug_dir", self.debug_dir.encode("utf-8"))] if self.debug_dir else []) + ([CompileSpec("target_device", self.target_device.encode())] if self.target_device else []) + ([CompileSpec("weights_prefix", self.weights_prefix.encode())] if self.weights_prefix else []) + ([CompileSpec("shape_buckets", ",".join(map(str, self.shape_buckets)).encode())] if self.shape_buckets else [])

    @staticmethod
    def from_compile_specs(specs: Iterable[CompileSpec]) -> "KilnOptions":
        """Inverse of to_compile_specs; unknown keys are an error so a typo in
        a hand-written spec is not silently ignored."""
        values: dict[str, Any] = {}
        for spec in specs:
            text = bytes(spec.value).decode("utf-8")
            if spec.key == "enabled_precisions":
                values["enabled_precisions"] = tuple(p for p in text.split(",") if p)
            elif spec.key == "target_sms":
                values["target_sms"] = tuple(int(s) for s in text.split(",") if s)
            elif spec.key == "cubin_sms":
                values["cubin_sms"] = tuple(int(s) for s in text.split(",") if s)
            elif spec.key == "use_cuda_graphs":
                values["use_cuda_graphs"] = int(text)
            elif spec.key == "min_block_size":
                values["min_block_size"] = int(text)
            elif spec.key == "emit_ptx":
                values["emit_ptx"] = text == "1"
            elif spec.key == "target_device":
                values["target_device"] = text
            elif spec.key == "conv_gemm":
                values["conv_gemm"] = text
            elif spec.key == "depthwise_kernels":
                values["depthwise_kernels"] = text == "1"
            elif spec.key == "gemv_kernels":
                values["gemv_kernels"] = text == "1"
            elif spec.key == "overlap_launches":
                values["overlap_launches"] = text == "1"
            elif spec.key == "persistent_decode":
                values["persistent_decode"] = text == "1"
            elif spec.key == "persistent_decode_options":
                values["persistent_decode_options"] = parse_persistent_decode_options(text)
            elif spec.key == "debug_dir":
                values["debug_dir"] = text
            elif spec.key == "weights_prefix":
                values["weights_prefix"] = text
            elif spec.key == "shape_buckets":
                values["shape_buckets"] = tuple(int(s) for s in text.split(",") if s)
            else:
                raise ValueError(f"KilnBackend: unknown compile spec key {spec.key!r}")
        return validate_options(
            enabled_precisions=values.get("enabled_precisions", ("float32",)),
            min_block_size=values.get("min_block_size", 1),
            target_sms=values.get("target_sms", DEFAULT_TARGET_SMS),
            cubin_sms=values.get("cubin_sms", ()),
            use_cuda_graphs={-1: None, 0: False, 1: True}.get(
                values.get("use_cuda_graphs", -1), "bad"
            ),
            emit_ptx=values.get("emit_ptx", True),
            target_device=values.get("target_device", ""),
            conv_gemm=values.get("conv_gemm", "all"),
            depthwise_kernels=values.get("depthwise_kernels", True),
            gemv_kernels=values.get("gemv_kernels", True),
            overlap_launches=values.get("overlap_launches", True),
            persistent_decode=values.get("persistent_decode", False),
            persistent_decode_options=values.get("persistent_decode_options"),
            debug_dir=values.get("debug_dir", ""),
            weights_prefix=values.get("weights_prefix", ""),
            shape_buckets=values.get("shape_buckets", None),
        )

    # ---- for messages and summaries -------------------------------------
    @property
    def cuda_graphs_choice(self) -> bool | None:
        return None if self.use_cuda_graphs < 0 else bool(self.use_cuda_graphs)


def _precision_name(value: Any) -> str:
    if isinstance(value, torch.dtype):
        if value not in PRECISIONS:
            raise ValueError(
                f"enabled_precisions: {value} is not supported; "
                f"use a subset of {{torch.float32, torch.float16, torch.bfloat16}}"
            )
        return PRECISIONS[value]
    if isinstance(value, str):
        name = value.removeprefix("torch.")
        name = {"half": "float16", "float": "float32"}.get(name, name)
        if name not in _PRECISION_BY_NAME:
            raise ValueError(
                f"enabled_precisions: {value!r} is not supported; "
                f"use a subset of {{torch.float32, torch.float16, torch.bfloat16}}"
            )
        return name
    raise TypeError(
        f"enabled_precisions: expected torch.dtype values, got {type(value).__name__} {value!r}"
    )


def validate_options(
    enabled_precisions: Any = (torch.float32,),
    min_block_size: Any = 1,
    target_sms: Any = None,
    use_cuda_graphs: Any = None,
    emit_ptx: Any = True,
    target_device: Any = "",
    conv_gemm: Any = "all",
    depthwise_kernels: Any = True,
    gemv_kernels: Any = True,
    debug_dir: Any = None,
    weights_prefix: Any = "",
    cubin_sms: Any = None,
    overlap_launches: Any = True,
    shape_buckets: Any = None,
    persistent_decode: Any = False,
    persistent_decode_options: Any = None,
) -> KilnOptions:
    """Checks every option and returns them normalized; raises TypeError or
    ValueError naming the argument.

    target_sms None: DEFAULT_TARGET_SMS with DEFAULT_CUBIN_SMS (one cubin
    per major). A list: a cubin for each SM named, unless `cubin_sms` (the
    round trip of compile specs; not a user option) says which."""
    if isinstance(enabled_precisions, (torch.dtype, str)):
        enabled_precisions = {enabled_precisions}
    if not isinstance(enabled_precisions, (set, frozenset, list, tuple)):
        raise TypeError(
            "enabled_precisions: expected a set of torch dtypes, e.g. {torch.float16}, "
            f"got {type(enabled_precisions).__name__}"
        )
    names = {_precision_name(p) for p in enabled_precisions}
    if not names:
        raise ValueError("enabled_precisions: must name at least one dtype")
    precisions = tuple(name for name in PRECISIONS.values() if name in names)

    if isinstance(min_block_size, bool) or not isinstance(min_block_size, int):
        raise TypeError(f"min_block_size: expected an int, got {type(min_block_size).__name__}")
    if min_block_size < 1:
        raise ValueError(f"min_block_size: must be >= 1, got {min_block_size}")

    default_targets = target_sms is None
    if default_targets:
        target_sms = DEFAULT_TARGET_SMS
    if isinstance(target_sms, int):
        target_sms = (target_sms,)
    if not isinstance(target_sms, (list, tuple, set, frozenset)):
        raise TypeError(
            f"target_sms: expected a sequence of ints such as (87, 90), "
            f"got {type(target_sms).__name__}"
        )
    sms: list[int] = []
    for sm in target_sms:
        if isinstance(sm, bool) or not isinstance(sm, int):
            raise TypeError(
                f"target_sms: each SM must be an int such as 87 or 90, got {type(sm).__name__} {sm!r}"
            )
        if sm < MIN_SM:
            raise ValueError(f"target_sms: SM {sm} is too old; Kiln needs SM {MIN_SM} or newer")
        if sm > 200:  # same bound as the compiler
            raise ValueError(f"target_sms: {sm} is not an SM number (write 90 for sm_90)")
        sms.append(sm)
    if not sms:
        raise ValueError("target_sms: must name at least one SM")
    if default_targets:
        cubins = DEFAULT_CUBIN_SMS
    elif cubin_sms:
        cubins = tuple(sorted(set(cubin_sms)))
        if set(cubins) == set(sms):
            cubins = ()  # the same as one cubin per target
        elif not set(cubins) <= set(sms) or one_cubin_per_major(sms) != one_cubin_per_major(cubins):
            raise ValueError(f"cubin_sms: {list(cubins)} must be target SMs covering every target SM "
                             f"{sorted(set(sms))} with one of its major and an older or equal minor")
    else:
        cubins = ()

    if use_cuda_graphs is None:
        cuda_graphs = -1
    elif isinstance(use_cuda_graphs, bool):
        cuda_graphs = int(use_cuda_graphs)
    else:
        raise TypeError(
            f"use_cuda_graphs: expected True, False or None, got {type(use_cuda_graphs).__name__}"
        )

    if not isinstance(emit_ptx, bool):
        raise TypeError(f"emit_ptx: expected a bool, got {type(emit_ptx).__name__}")

    if not isinstance(target_device, str) or (target_device and not re.fullmatch(r"cuda:\d+", target_device)):
        raise ValueError(f"target_device: expected '' (host I/O) or 'cuda:N', got {target_device!r}")
    if conv_gemm not in CONV_GEMM_MODES:
        raise ValueError(f"conv_gemm: expected one of {', '.join(map(repr, CONV_GEMM_MODES))}, got {conv_gemm!r}")
    if not isinstance(depthwise_kernels, bool):
        raise TypeError(f"depthwise_kernels: expected a bool, got {type(depthwise_kernels).__name__}")
    if not isinstance(gemv_kernels, bool):
        raise TypeError(f"gemv_kernels: expected a bool, got {type(gemv_kernels).__name__}")
    if not isinstance(overlap_launches, bool):
        raise TypeError(f"overlap_launches: expected a bool, got {type(overlap_launches).__name__}")
    if not isinstance(persistent_decode, bool):
        raise TypeError(f"persistent_decode: expected a bool, got {type(persistent_decode).__name__}")
    decode_options: tuple[tuple[str, int], ...] = ()
    if persistent_decode_options is not None:
        if not isinstance(persistent_decode_options, Mapping):
            raise TypeError(f"persistent_decode_options: expected a dict of option name -> int, "
                            f"got {type(persistent_decode_options).__name__}")
        if persistent_decode_options and not persistent_decode:
            raise ValueError("persistent_decode_options: they tune the persistent kernel, which needs persistent_decode=True")
        for name, value in persistent_decode_options.items():
            if name not in PERSISTENT_DECODE_OPTIONS:
                raise ValueError(f"persistent_decode_options: unknown option {name!r}; the options are "
                                 f"{', '.join(PERSISTENT_DECODE_OPTIONS)}")
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"persistent_decode_options: {name!r} takes an int, got {type(value).__name__} {value!r}")
        decode_options = tuple(sorted(persistent_decode_options.items()))
    if debug_dir is None:
        debug_dir = ""
    if not isinstance(debug_dir, (str, os.PathLike)):
        raise TypeError(f"debug_dir: expected a path or None, got {type(debug_dir).__name__}")
    debug_dir = os.fspath(debug_dir)
    if not isinstance(weights_prefix, str) or (
            weights_prefix and not re.fullmatch(r"kiln/[A-Za-z0-9._-]{1,64}/", weights_prefix)):
        raise ValueError(f"weights_prefix: expected '' or 'kiln/<model id>/', got {weights_prefix!r}")
    if shape_buckets is None:
        shape_buckets = ()
    if not isinstance(shape_buckets, (list, tuple, set, frozenset)) or any(
            isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in shape_buckets):
        raise TypeError(f"shape_buckets: expected a sequence of sizes >= 1 such as [1, 64, 512], got {shape_buckets!r}")
    return KilnOptions(
        enabled_precisions=precisions,
        min_block_size=min_block_size,
        target_sms=tuple(sorted(set(sms))),
        cubin_sms=cubins,
        use_cuda_graphs=cuda_graphs,
        emit_ptx=emit_ptx,
        target_device=target_device,
        conv_gemm=conv_gemm,
        depthwise_kernels=depthwise_kernels,
        gemv_kernels=gemv_kernels,
        overlap_launches=overlap_launches,
        persistent_decode=persistent_decode,
        persistent_decode_options=decode_options,
        debug_dir=debug_dir,
        weights_prefix=weights_prefix,
        shape_buckets=tuple(sorted(set(shape_buckets))),
    )
