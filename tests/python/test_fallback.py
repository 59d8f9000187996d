"""An export that never aborts (issue 10, section 2): a partition that fails to
compile, for any reason, loses the failing node to ExecuTorch's CPU kernels,
one line names the op and the reason, and the export succeeds. Failures are
injected (kiln._trial.INJECTED_FAILURES, or a patched compile) so these tests
do not depend on today's compiler bugs."""

from __future__ import annotations

import re

import pytest
import torch

import kiln
from kiln import _trial

from _helpers import MLP, CpuOpMLP, export, lowered_modules
from test_partitioner import _cpu_ops

pytestmark = pytest.mark.needs_compiler


def fallback_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if re.match(r"kiln: \S+ \('[^']+'\) left to the CPU: ", line)]


@pytest.fixture
def inject(monkeypatch):
    """inject({"aten.sigmoid.default": "named"}) makes compiles of graphs
    holding that op fail."""
    def set_failures(failures: dict[str, str]) -> None:
        monkeypatch.setattr(_trial, "INJECTED_FAILURES", dict(failures))
    return set_failures


@pytest.fixture
def count_compiles(monkeypatch):
    calls = []
    real = _trial.compile_graph

    def counting(built, options, progress=None, name_weights="", return_weights=False):
        calls.append([op for _, op in built.node_ops])
        return real(built, options, progress, name_weights, return_weights)

    monkeypatch.setattr(_trial, "compile_graph", counting)
    return calls


def _compile(program, **options):
    return kiln.compile(program, target_sms=(90,), **options)


class SigmoidMLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(64, 32)
        self.fc2 = torch.nn.Linear(32, 16)

    def forward(self, x):
        y = torch.sigmoid(torch.relu(self.fc1(x)) * 2.0)
        return torch.tanh(self.fc2(y))


@pytest.mark.parametrize("mode", ["named", "unnamed"])
def test_failing_op_goes_to_the_cpu_with_one_line(inject, capsys, mode, tmp_path):
    # "unnamed": the error names no node, so the partition is bisected.
    inject({"aten.sigmoid.default": mode})
    torch.manual_seed(0)
    compiled = _compile(export(SigmoidMLP(), torch.randn(4, 64)))
    assert compiled.summary.ops_on_cpu == {"aten.sigmoid.default": 1}
    assert _cpu_ops(compiled.edge_program_manager) == ["aten.sigmoid.default"]
    assert compiled.delegates == ["KilnBackend", "KilnBackend"]
    lines = fallback_lines(capsys.readouterr().err)
    assert len(lines) == 1, lines
    assert re.match(r"kiln: aten\.sigmoid\.default \('\w*sigmoid\w*'\) left to the CPU: ", lines[0]), lines
    assert "injected failure" in lines[0]
    # No engine holds the op, and the program still saves.
    for lowered in lowered_modules(compiled.edge_program_manager):
        info = kiln._kiln_compiler.inspect_engine(lowered.processed_bytes)
        assert info is not None
    assert kiln.save(compiled, tmp_path / "m.pte").stat().st_size > 0


def test_any_exception_from_the_compiler_is_a_fallback(monkeypatch, capsys):
    real = _trial.compile_graph

    def broken(built, options, progress=None, name_weights="", return_weights=False):
        if any(op == "aten.tanh.default" for _, op in built.node_ops):
            raise ValueError("something unexpected inside the compiler")
        return real(built, options, progress, name_weights, return_weights)

    monkeypatch.setattr(_trial, "compile_graph", broken)
    torch.manual_seed(0)
    compiled = _compile(export(SigmoidMLP(), torch.randn(4, 64)))
    # tanh is last: found by bisection (the message names no node).
    assert compiled.summary.ops_on_cpu == {"aten.tanh.default": 1}
    (line,) = fallback_lines(capsys.readouterr().err)
    assert re.fullmatch(r"kiln: aten\.tanh\.default \('\w*tanh\w*'\) left to the CPU: "
                        r"ValueError: something unexpected inside the compiler", line), line


def test_a_failing_graph_builder_is_a_fallback(monkeypatch, capsys):
    from kiln import graph_builder

    real = graph_builder._Builder.add_call

    def add_call(self, node):
        if "relu" in node.name:
            raise KeyError("builder bug")
        return real(self, node)

    monkeypatch.setattr(graph_builder._Builder, "add_call", add_call)
    torch.manual_seed(0)
    compiled = _compile(export(SigmoidMLP(), torch.randn(4, 64)))
    assert compiled.summary.ops_on_cpu == {"aten.relu.default": 1}
    (line,) = fallback_lines(capsys.readouterr().err)
    assert re.match(r"kiln: aten\.relu\.default \('\w*relu\w*'\) left to the CPU: KeyError", line), line


def test_failing_linear_is_decomposed_and_its_gemm_left_to_the_cpu(inject, capsys, tmp_path):
    # ExecuTorch has no CPU kernel for aten.linear (kept whole for Kiln with
    # min_block_size=1): the program is lowered again with that linear
    # decomposed, and only its GEMM (and weight transpose) stays on the CPU.
    inject({"aten.linear.default": "named"})
    torch.manual_seed(0)
    compiled = _compile(export(CpuOpMLP(), torch.randn(8, 64)))
    cpu = compiled.summary.ops_on_cpu
    assert "aten.linear.default" not in cpu
    assert cpu.get("aten.addmm.default") == 2 and cpu.get("aten.flip.default") == 1, cpu
    err = capsys.readouterr().err
    assert "kiln: lowering again with 2 aten.linear.default decomposed" in err
    assert kiln.save(compiled, tmp_path / "m.pte").stat().st_size > 0
    # relu and sigmoid still run in engines.
    assert compiled.summary.ops_taken == 2


def test_trial_engines_are_not_compiled_again(cpu_op_program, count_compiles, capsys):
    compiled = _compile(cpu_op_program)
    assert compiled.delegates == ["KilnBackend", "KilnBackend"]
    assert len(count_compiles) == 2  # one compile per partition, in the partitioner
    err = capsys.readouterr().err
    assert err.count("kiln: compiling partition") == 2
    assert len(_trial.ENGINE_CACHE) == 0  # preprocess took them all


def test_preprocess_compiles_when_the_partitioner_did_not(cpu_op_program, count_compiles):
    from executorch.exir import to_edge_transform_and_lower

    from kiln._compile import edge_compile_config

    partitioner = kiln.KilnPartitioner(trial_compile=False, target_sms=(90,))
    manager = to_edge_transform_and_lower(cpu_op_program, partitioner=[partitioner],
                                          compile_config=edge_compile_config())
    assert [m.backend_id for m in lowered_modules(manager)] == ["KilnBackend", "KilnBackend"]
    assert len(count_compiles) == 2


def test_engines_from_trial_and_preprocess_are_identical(cpu_op_program):
    # The cached engine is byte-identical to what preprocess would compile.
    torch.manual_seed(0)
    with_trial = _compile(cpu_op_program)
    from executorch.exir import to_edge_transform_and_lower

    from kiln._compile import edge_compile_config

    # Same options, the weights' named-data prefix included.
    partitioner = kiln.KilnPartitioner(trial_compile=False, target_sms=(90,),
                                       weights_prefix=with_trial.options.weights_prefix)
    manager = to_edge_transform_and_lower(
        cpu_op_program, partitioner=[partitioner], compile_config=edge_compile_config())
    a = [bytes(m.processed_bytes) for m in lowered_modules(with_trial.edge_program_manager)]
    b = [bytes(m.processed_bytes) for m in lowered_modules(manager)]
    assert a == b


def _run_on_cpu(pte, inputs):
    runtime = pytest.importorskip("executorch.runtime")
    program = runtime.Runtime.get().load_program(pte)
    return program.load_method("forward").execute(inputs)


@pytest.mark.parametrize("model, shape", [(MLP, (8, 64)), (CpuOpMLP, (8, 64))])
def test_everything_failing_leaves_a_cpu_program_that_matches_pytorch(inject, capsys, tmp_path, model, shape):
    # Every op fails to compile: the whole model stays on ExecuTorch's
    # portable CPU kernels, which can run here (the Kiln delegate needs a GPU).
    inject({"*": "named"})
    torch.manual_seed(0)
    module = model().eval()
    x = torch.randn(*shape)
    compiled = _compile(export(module, x))
    assert compiled.delegates == []
    assert compiled.summary.partitions == 0 and compiled.summary.ops_taken == 0
    assert "aten.linear.default" not in compiled.summary.ops_on_cpu
    assert fallback_lines(capsys.readouterr().err)
    pte = kiln.save(compiled, tmp_path / "cpu.pte")
    x2 = torch.randn(*shape)  # fresh inputs, not the example
    (out,) = _run_on_cpu(pte, (x2,))
    with torch.no_grad():
        ref = module(x2)
    assert torch.allclose(out, ref, rtol=1e-5, atol=1e-5), (out - ref).abs().max()


class CatPoolLinear(torch.nn.Module):
    """Today's real bug (issue 10): a reduction whose result reaches a linear
    through a view (cat -> adaptive_avg_pool2d(1) -> flatten -> linear, as in
    densenet/googlenet) made kiln.compile raise "serialize_engine: step N
    (gemm 'linear'): gemm a tensor ... has 16 elements (last dim 1), expected
    [1, 16]". The export must not abort, and since the GEMM validator checks
    rows on dim boundaries (not the storage root's last dim) it compiles whole."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.b = torch.nn.Conv2d(3, 8, 1)
        self.fc = torch.nn.Linear(16, 10)

    def forward(self, x):
        y = torch.cat([self.a(x), self.b(x)], 1)
        y = torch.nn.functional.adaptive_avg_pool2d(y, 1)
        return self.fc(torch.flatten(y, 1))


def test_reduction_view_linear_never_aborts(capsys, tmp_path):
    torch.manual_seed(0)
    x = torch.randn(1, 3, 8, 8)
    compiled = _compile(torch.export.export(CatPoolLinear().eval(), (x,)), arg_inputs=(x,))
    cpu = compiled.summary.ops_on_cpu
    assert "aten.linear.default" not in cpu
    assert "KilnBackend" in compiled.delegates
    assert cpu == {}, cpu
    assert fallback_lines(capsys.readouterr().err) == []
    assert kiln.save(compiled, tmp_path / "m.pte").stat().st_size > 0


class DeepSigmoid(torch.nn.Module):
    def forward(self, x):
        for _ in range(12):
            x = torch.sigmoid(x) * 1.5
        return x


def test_an_op_failing_everywhere_is_refused_in_bulk(inject, count_compiles, capsys):
    inject({"aten.sigmoid.default": "named"})
    compiled = _compile(export(DeepSigmoid(), torch.randn(4, 8)))
    assert compiled.summary.ops_on_cpu == {"aten.sigmoid.default": 12}
    err = capsys.readouterr().err
    assert len(fallback_lines(err)) == 8
    assert "kiln: aten.sigmoid.default x4 more left to the CPU: aten.sigmoid.default failed to compile 8 times" in err
    assert len(count_compiles) <= 60  # one round per node would be ~90


class ConvBn(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3)
        self.bn = torch.nn.BatchNorm2d(8)
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x):
        y = torch.relu(self.bn(self.conv(x))).mean((2, 3))
        return self.fc(y)


def test_trial_engines_with_parameters_and_buffers_are_reused(count_compiles):
    torch.manual_seed(0)
    module = ConvBn().eval()
    module.bn.running_mean.uniform_(-1, 1)
    module.bn.running_var.uniform_(0.5, 2)
    x = torch.randn(1, 3, 8, 8)
    compiled = _compile(torch.export.export(module, (x,)), enabled_precisions={torch.float16})
    assert compiled.delegates == ["KilnBackend"] and compiled.summary.ops_on_cpu == {}
    assert len(count_compiles) == 1


def test_preprocess_failure_without_trial_says_what_to_do(cpu_op_program, inject):
    from executorch.exir import to_edge_transform_and_lower

    from kiln._compile import edge_compile_config

    inject({"aten.relu.default": "named"})
    with pytest.raises(kiln.CompileError, match=r"injected failure(.|\n)*trial_compile=True"):
        to_edge_transform_and_lower(cpu_op_program, partitioner=[kiln.KilnPartitioner(trial_compile=False)],
                                    compile_config=edge_compile_config())


class ScaledScores(torch.nn.Module):
    """`q * d ** -0.5`: to_edge lifts the scalar into a 0-dim tensor constant
    that no state dict holds (Swin's attention scale)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(16, 16)

    def forward(self, x):
        q = self.fc(x) * (16 // 4) ** -0.5
        return torch.softmax(q @ x.transpose(-1, -2), -1)


def test_lifted_scalar_constant_compiles_once(count_compiles):
    # The trial must compile with the scalar's real value, so that
    # preprocess takes its engine instead of compiling the partition again.
    torch.manual_seed(0)
    x = torch.randn(2, 8, 16)
    compiled = _compile(export(ScaledScores(), x))
    assert compiled.summary.ops_on_cpu == {}
    assert len(count_compiles) == 1, f"{len(count_compiles)} compiles of {len(compiled.delegates)} partition(s)"
    assert len(_trial.ENGINE_CACHE) == 0
