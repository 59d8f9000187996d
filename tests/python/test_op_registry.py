"""The op registry, the partitioner's answer and the lowering agree: every
node the compiler's check accepts in these programs is compiled into an engine
(never promised and then refused), every op the registry offers is exercised
by one of them, and the partitioner asks the registry rather than a list of
its own."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import kiln
from kiln import _fx_nodes
from kiln._native import native

from _helpers import export

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpu"))
import conformance_elementwise  # noqa: E402 - the GPU conformance programs double as examples here
import conformance_gather  # noqa: E402
import conformance_scan  # noqa: E402

F = torch.nn.functional
pytestmark = pytest.mark.needs_compiler


class Elementwise(torch.nn.Module):
    def forward(self, x, y):
        a = (x + y) - y * 2.0 / (y.abs() + 1.0)
        a = -a + 1.5
        b = torch.relu(a) + F.gelu(a) + F.gelu(a, approximate="tanh") + torch.sigmoid(a) + torch.tanh(a)
        b = b + torch.exp(a.clamp(max=2.0)) + torch.sqrt(a.abs()) + torch.rsqrt(a.abs() + 1)
        b = b + torch.log(a.abs() + 1) + torch.reciprocal(a.abs() + 1) + F.hardtanh(a)
        b = torch.maximum(b, x) + torch.minimum(b, y)
        c = b.to(torch.float16).to(torch.float32) + b.clone()
        return c + x[:, :1].expand(4, 8)


class Matmuls(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 6)
        self.w = torch.nn.Parameter(torch.randn(6, 5))
        self.v = torch.nn.Parameter(torch.randn(5, 5))

    def forward(self, x, c):
        h = torch.relu(self.fc(x))                      # linear + relu epilogue
        g = torch.mm(h, self.w)                         # mm with a constant operand
        full = torch.addmm(c, g, self.v, beta=0.5)  # addmm with a full [m, n] addend
        b = torch.bmm(g.unsqueeze(0).expand(2, 4, 5), g.t().unsqueeze(0).expand(2, 5, 4))
        return full, b


class Layout(torch.nn.Module):
    def forward(self, x):
        p = x.permute(0, 2, 1).contiguous()
        t = x[0].t()
        s = x[:, 1:3, ::2]
        one = x.select(1, 2)
        parts = torch.split(x, [1, 3], dim=1)
        halves = x.split(2, dim=2)
        cat = torch.cat([parts[1], parts[0]], dim=1)
        v = cat.reshape(2, -1).view(2, 4, 6).squeeze(0).unsqueeze(1).squeeze(1)
        red = x.sum(dim=1) + x.mean(dim=(1, 2), keepdim=True).squeeze(-1) + x.amax(dim=1) + x.sum()
        return p, t, s, one, halves[0], v, red, x.mean()


class InPlaceWrites(torch.nn.Module):
    """Writes into a fresh tensor (BART's shift_tokens_right), which export
    functionalizes into copy and slice_scatter."""

    def forward(self, x):
        y = torch.zeros_like(x)
        y[:, 1:] = x[:, :-1]
        y[:, 0] = x[:, -1]
        return y * 2


class Vision(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.dw = torch.nn.Conv2d(8, 8, 3, padding=1, groups=8)

    def forward(self, x):
        y = torch.relu(self.bn(self.conv(x)))
        y = F.silu(self.dw(y))
        a = F.max_pool2d(y, 2) + F.avg_pool2d(y, 2)
        return F.adaptive_avg_pool2d(a, 2).flatten(1), F.hardswish(a) * F.hardsigmoid(a)


class Resample(torch.nn.Module):
    def forward(self, x, v):
        up = F.interpolate(x, scale_factor=2, mode="nearest") + F.interpolate(x, scale_factor=2, mode="bilinear")
        pads = (F.pad(x, (1, 2, 0, 1), value=0.5), F.pad(x, (1, 1, 2, 0), mode="reflect"),
                F.pad(x, (1, 1, 2, 0), mode="replicate"), F.pad(x[0], (1, 2), mode="reflect"),
                F.pad(x[0], (2, 0), mode="replicate"))
        volume = (F.pad(v, (1, 1, 0, 1, 1, 0), mode="reflect"), F.pad(v, (0, 1, 1, 1, 2, 0), mode="replicate"))
        return (up,) + pads + volume


class Norms(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = torch.nn.LayerNorm(8)
        self.gn = torch.nn.GroupNorm(2, 4)
        self.inorm = torch.nn.InstanceNorm2d(4, affine=True)

    def forward(self, x, nhwc):
        y = self.gn(x) + self.inorm(x)
        # Pooling a channels-last-strided tensor into a permute (ConvNeXt's
        # head) exports an as_strided_copy.
        pooled = F.adaptive_avg_pool2d(nhwc.permute(0, 3, 1, 2), 1).permute(0, 2, 3, 1)
        return self.ln(y), self.ln(pooled)


class Rows(torch.nn.Module):
    def forward(self, x, y):
        s = torch.softmax(x, -1) + torch.log_softmax(x, 0) + torch.fmod(x, 1.5) + torch.fmod(x, y.abs() + 1.0)
        flag = torch.any(x > 1.0, -1, keepdim=True)
        return torch.where(flag, torch.full_like(s, 0.5), s)


class CacheUpdate(torch.nn.Module):
    """index_put as the in-place update of a mutable buffer (engine state)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("cache", torch.zeros(1, 2, 8, 4))

    def forward(self, x, pos):
        self.cache.index_copy_(2, pos, x * 2)
        return self.cache.sum(2)


class GreedyToken(torch.nn.Module):
    """argmax: a decoder's greedy token choice on the GPU."""

    def forward(self, logits):
        return torch.argmax(logits * 2, dim=-1)


def _examples():
    torch.manual_seed(0)
    return {
        "state": (CacheUpdate(), (torch.randn(1, 2, 1, 4), torch.tensor([5]))),
        "argmax": (GreedyToken(), (torch.randn(2, 50),)),
        "elementwise": (Elementwise(), (torch.randn(4, 8), torch.randn(4, 8))),
        "matmuls": (Matmuls(), (torch.randn(4, 8), torch.randn(4, 5))),
        "layout": (Layout(), (torch.randn(2, 4, 6),)),
        "in_place_writes": (InPlaceWrites(), (torch.randn(3, 7),)),
        "vision": (Vision().eval(), (torch.randn(1, 3, 8, 8),)),
        "resample": (Resample(), (torch.randn(1, 2, 4, 5), torch.randn(1, 2, 3, 4, 5))),
        "norms": (Norms().eval(), (torch.randn(2, 4, 8, 8), torch.randn(2, 3, 3, 8))),
        "rows": (Rows(), (torch.randn(4, 8), torch.randn(4, 8))),
    } | {
        name: (factory(), tuple(torch.randn(shape) for shape in conformance_elementwise.CASES[name]))
        for name, factory in conformance_elementwise.FACTORIES.items()
    } | {
        f"gather_{name}": (factory().eval(), tuple(torch.randn(shape) for shape in conformance_gather.CASES[name]))
        for name, factory in conformance_gather.FACTORIES.items()
    } | {
        f"scan_{name}": (factory().eval(), tuple(torch.randn(shape) for shape in conformance_scan.CASES[name]))
        for name, factory in conformance_scan.FACTORIES.items()
    }


# Registered names that torch.export's edge dialect does not emit for these
# programs (the core-ATen spellings above are what reaches the partitioner);
# kept so graphs built directly in C++ and by passes (a view in
# split_reduce.cpp) use them. Each must still be registered.
NOT_IN_EDGE_PROGRAMS = {
    "aten.view.default", "aten.reshape.default", "aten.flatten.using_ints", "aten.permute.default",
    "aten.t.default", "aten.conv2d.default", "aten.adaptive_avg_pool2d.default", "aten._unsafe_view.default",
    "aten.alias_copy.default", "aten.add.Scalar", "aten.sub.Scalar", "aten.mul.Scalar", "aten.div.Scalar",
    "aten.squeeze_copy.default", "aten.mean.default", "aten.max_pool2d.default",
    # rewritten by the edge dialect (t/transpose -> permute_copy, split ->
    # split_with_sizes_copy, squeeze(dim) -> squeeze_copy.dims, sum() ->
    # sum.dim_IntList)
    "aten.t_copy.default", "aten.transpose_copy.int", "aten.split_copy.Tensor", "aten.squeeze_copy.dim",
    "aten.sum.default",
    # decomposed by to_edge (their decompositions are taken instead; the
    # attention's decomposition becomes kiln.attention, see test_attention.py)
    "aten.scaled_dot_product_attention.default",
    "aten.hardswish.default", "aten.hardsigmoid.default", "aten.silu.default", "aten.mish.default",
    "aten.softplus.default", "aten.square.default", "aten.masked_fill.Scalar",
    # F.interpolate calls the .vec overloads; the .default ones (explicit
    # output_size and scales_h/scales_w) only come from hand-written graphs
    "aten.upsample_nearest2d.default", "aten.upsample_bilinear2d.default",
}


@pytest.fixture(scope="module")
def compiled_examples():
    results = {}
    for name, (model, inputs) in _examples().items():
        program = export(model, *inputs)
        compiled = kiln.compile(program, arg_inputs=inputs, min_block_size=1)
        results[name] = compiled
    return results


def test_every_accepted_node_is_compiled(compiled_examples):
    for name, compiled in compiled_examples.items():
        # Whatever the check accepted was lowered into an engine: the only ops
        # on the CPU are ones the check refused (none in these programs).
        assert compiled.summary.ops_on_cpu == {}, f"{name}: {compiled.summary.ops_on_cpu}"
        assert compiled.delegates and set(compiled.delegates) == {"KilnBackend"}, name


def test_every_registered_op_is_exercised(compiled_examples):
    seen = set()
    for name, (model, inputs) in _examples().items():
        from executorch.exir import to_edge

        edge = to_edge(export(model, *inputs), compile_config=kiln._compile.edge_compile_config())
        seen |= {_fx_nodes.op_name(n.target) for n in edge.exported_program().graph.nodes
                 if n.op == "call_function" and not _fx_nodes.is_getitem(n)}
        seen.add("aten.linear.default")  # kept whole by the partitioner, decomposed by plain to_edge
        # so are the reflection/replication pads the resample example uses
        seen |= {_fx_nodes.op_name(op) for op in kiln.partitioner.KEPT_WHEN_TAKEN}
    registered = set(native().supported_ops())
    missing = registered - seen - NOT_IN_EDGE_PROGRAMS
    assert not missing, f"registered ops no example program exercises (add one): {sorted(missing)}"
    stale = NOT_IN_EDGE_PROGRAMS - registered
    assert not stale, f"NOT_IN_EDGE_PROGRAMS names ops the registry no longer has: {sorted(stale)}"


def test_refused_attributes_are_refused_not_thrown():
    # addmm with a bias row and beta != 1 cannot be lowered (a bias epilogue
    # adds the row once): the check refuses it, so it stays on the CPU and the
    # export succeeds.
    class BiasBeta(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(8, 5))
            self.b = torch.nn.Parameter(torch.randn(5))

        def forward(self, x):
            return torch.addmm(self.b, torch.relu(x), self.w, beta=0.5)

    x = torch.randn(4, 8)
    compiled = kiln.compile(export(BiasBeta(), x), arg_inputs=(x,), min_block_size=1)
    assert compiled.summary.ops_on_cpu == {"aten.addmm.default": 1}
    reason = native().check_support(
        "aten.addmm.default", [("float32", [5], True), ("float32", [4, 8], False), ("float32", [8, 5], True)],
        {"beta": 0.5, "alpha": 1.0}, [("float32", [4, 5])])
    assert reason is not None and "beta" in reason


def test_supported_ops_come_from_the_registry():
    ops = native().supported_ops()
    assert ops == sorted(ops)
    # Names the old hand-written list was missing are there, internal ops are not.
    for name in ("aten.reshape.default", "aten.conv2d.default", "aten.sum.default"):
        assert name in ops
    assert not [op for op in ops if op.startswith("kiln.")]
    # An op the registry lacks is refused by name.
    reason = native().check_support("aten.flip.default", [("float32", [4], False)], {"dims": [0]},
                                    [("float32", [4])])
    assert reason == "aten.flip.default is not implemented by the Kiln compiler"


def test_debug_dir_dumps_every_pass(tmp_path):
    x = torch.randn(4, 8)
    # (the sigmoid is a generated kernel: no GEMM epilogue has it)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4), torch.nn.Sigmoid())
    kiln.compile(export(model, x), arg_inputs=(x,), debug_dir=tmp_path / "dump")
    files = sorted(p.name for p in (tmp_path / "dump" / "partition_0").iterdir())
    passes = native().pass_names()
    expected = ["00_input.txt"] + [f"{i + 1:02d}_{p}.txt" for i, p in enumerate(passes)]
    # The CUDA source NVRTC compiled, then the engine's steps.
    expected += [f"{len(passes) + 1:02d}_kernels.cu", f"{len(passes) + 2:02d}_lower.txt"]
    assert files == expected
    source = (tmp_path / "dump" / "partition_0" / expected[-2]).read_text()
    assert "extern \"C\" __global__" in source
    fused = (tmp_path / "dump" / "partition_0" / f"{passes.index('fuse') + 1:02d}_fuse.txt").read_text()
    assert "# step plan" in fused and "linear+relu" in fused
    lowered = (tmp_path / "dump" / "partition_0" / expected[-1]).read_text()
    assert lowered.count("gemm") == 2


def test_compile_options_are_recorded_in_the_engine():
    x = torch.randn(1, 3, 8, 8)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 1), torch.nn.ReLU()).eval()
    compiled = kiln.compile(export(model, x), arg_inputs=(x,), conv_gemm="none", depthwise_kernels=False)
    lowered = compiled.edge_program_manager.exported_program().graph_module
    blobs = [getattr(lowered, n.args[0].target).processed_bytes for n in lowered.graph.nodes
             if n.op == "call_function" and "executorch_call_delegate" in str(n.target)]
    info = native().inspect_engine(blobs[0])
    assert info["metadata"]["conv_gemm"] == "none"
    assert info["metadata"]["depthwise_kernels"] == "false"
    assert any(step["kind"] == "conv" for step in info["steps"])
    with pytest.raises(ValueError, match="conv_gemm"):
        kiln.compile(export(model, x), conv_gemm="sometimes")


def _engine_info(compiled):
    lowered = compiled.edge_program_manager.exported_program().graph_module
    blobs = [getattr(lowered, n.args[0].target).processed_bytes for n in lowered.graph.nodes
             if n.op == "call_function" and "executorch_call_delegate" in str(n.target)]
    assert len(blobs) == 1
    return native().inspect_engine(blobs[0])


@pytest.mark.parametrize("rows,gemv_kernels,want", [(1, True, "kernel"), (4, True, "kernel"), (1, False, "gemm"),
                                                    (16, True, "gemm")])
def test_gemv_kernels_option_picks_the_products_step(rows, gemv_kernels, want):
    # A decode step's linear (a few rows of activations) is a generated
    # matrix-vector kernel unless gemv_kernels=False; many rows stay cuBLASLt.
    x = torch.randn(rows, 256)
    model = torch.nn.Linear(256, 96).eval()
    info = _engine_info(kiln.compile(export(model, x), arg_inputs=(x,), gemv_kernels=gemv_kernels))
    assert info["metadata"]["gemv_kernels"] == ("true" if gemv_kernels else "false")
    assert [step["kind"] for step in info["steps"]] == [want]
    with pytest.raises(TypeError, match="gemv_kernels"):
        kiln.compile(export(model, x), gemv_kernels="yes")


@pytest.mark.parametrize("overlap", [True, False])
def test_overlap_launches_option_is_recorded_and_changes_only_the_sm90_cubins(overlap):
    # overlap_launches (default on) is baked into the engine for the runtime
    # to read; the kernels of the sm_90+ cubins carry griddepcontrol (the
    # GPU suite runs them), the sm_80 cubin and the PTX stay the plain build.
    x = torch.randn(1, 256)
    model = torch.nn.Sequential(torch.nn.Linear(256, 96), torch.nn.GELU()).eval()
    kwargs = {} if overlap else {"overlap_launches": False}
    info = _engine_info(kiln.compile(export(model, x), arg_inputs=(x,), target_sms=[80, 90], **kwargs))
    assert info["metadata"]["overlap_launches"] == ("true" if overlap else "false")
    with pytest.raises(TypeError, match="overlap_launches"):
        kiln.compile(export(model, x), overlap_launches=1)
