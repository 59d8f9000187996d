"""KilnPartitioner: what gets delegated, what stays on the CPU, and the
summary line."""

import logging
import operator

import pytest
import torch

import kiln
from kiln import _fx_nodes

from _helpers import MLP, export, lowered_modules

pytestmark = pytest.mark.needs_compiler


def _cpu_ops(manager) -> list[str]:
    """Op names of the compute nodes outside the delegates."""
    ops = []
    for node in manager.exported_program().graph.nodes:
        if node.op != "call_function" or node.target is operator.getitem:
            continue
        if "executorch_call_delegate" in str(node.target):
            continue
        ops.append(_fx_nodes.op_name(node.target))
    return ops


def test_mlp_is_fully_delegated(mlp_program, capsys):
    compiled = kiln.compile(mlp_program)
    assert compiled.delegates == ["KilnBackend"]
    assert _cpu_ops(compiled.edge_program_manager) == []
    summary = compiled.summary
    assert summary.partitions == 1
    assert summary.ops_taken == 5  # 3 x linear, gelu, relu
    assert summary.ops_on_cpu == {}
    err = capsys.readouterr().err
    assert err.count("kiln: 1 partition, 5 ops taken by KilnBackend, 0 ops left to the CPU\n") == 1
    # The program still serializes with the delegate in it.
    program = compiled.edge_program_manager.to_executorch()
    assert len(program.buffer) > 0


def test_unsupported_op_splits_the_program(cpu_op_program, capsys):
    compiled = kiln.compile(cpu_op_program)
    assert compiled.delegates == ["KilnBackend", "KilnBackend"]
    assert _cpu_ops(compiled.edge_program_manager) == ["aten.flip.default"]
    assert compiled.summary.ops_on_cpu == {"aten.flip.default": 1}
    err = capsys.readouterr().err
    line = (
        "kiln: 2 partitions, 4 ops taken by KilnBackend, "
        "1 op left to the CPU: aten.flip.default\n"
    )
    assert err.count(line) == 1, err
    # The delegate call feeds the CPU op, whose output feeds the next delegate.
    graph = compiled.edge_program_manager.exported_program().graph
    order = [n for n in graph.nodes if n.op == "call_function" and n.target is not operator.getitem]
    assert ["executorch_call_delegate" in str(n.target) for n in order] == [True, False, True]


def test_refusal_reasons_are_logged_at_debug(cpu_op_program, caplog):
    with caplog.at_level(logging.DEBUG, logger="kiln"):
        kiln.compile(cpu_op_program)
    messages = [r.getMessage() for r in caplog.records if r.name == "kiln"]
    assert any(
        "aten.flip.default x1 on the CPU" in m and "not implemented" in m for m in messages
    ), messages
    assert any(m.startswith("kiln: 2 partitions") for m in messages)


def test_min_block_size_keeps_small_partitions_on_cpu(cpu_op_program, capsys):
    # With min_block_size > 1 linear is decomposed (ExecuTorch has no CPU
    # linear kernel): fc1 = permute+addmm+relu (3 ops), fc2 = permute+addmm+
    # sigmoid (3 ops).
    compiled = kiln.compile(cpu_op_program, min_block_size=4)
    assert compiled.delegates == []
    assert compiled.summary.partitions == 0
    assert compiled.summary.ops_taken == 0
    assert compiled.summary.ops_on_cpu["aten.flip.default"] == 1
    assert "aten.linear.default" not in compiled.summary.ops_on_cpu
    compiled = kiln.compile(cpu_op_program, min_block_size=3)
    assert compiled.delegates == ["KilnBackend", "KilnBackend"]
    assert compiled.summary.ops_taken == 6


def test_weight_transposes_stay_with_their_gemm():
    """A transposed weight (permute_copy of a constant) must be folded into
    the partition that uses it, not into an earlier one."""

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w1 = torch.nn.Parameter(torch.randn(32, 16))
            self.w2 = torch.nn.Parameter(torch.randn(8, 32))

        def forward(self, x):
            y = torch.flip(torch.tanh(x @ self.w1.t()), dims=[-1])
            return y @ self.w2.t()

    compiled = kiln.compile(export(M(), torch.randn(4, 16)))
    assert compiled.delegates == ["KilnBackend", "KilnBackend"]
    for lowered in lowered_modules(compiled.edge_program_manager):
        info = kiln._kiln_compiler.inspect_engine(lowered.processed_bytes)
        assert len(info["inputs"]) == 1  # only the activation, weights baked in
        assert any(t["storage"] == "named_weight" for t in info["tensors"])  # in named data


def test_unsupported_dtype_stays_on_cpu():
    class M(torch.nn.Module):
        def forward(self, x, n):
            return torch.relu(x) * 2.0, n.abs()

    # float64: Kiln engines have no such dtype (int64 ones they take, see test_gather.py)
    compiled = kiln.compile(export(M(), torch.randn(4, 4), torch.arange(4, dtype=torch.float64)))
    assert compiled.delegates == ["KilnBackend"]
    assert compiled.summary.ops_on_cpu == {"aten.abs.default": 1}


def test_partitioner_used_directly():
    from executorch.exir import to_edge_transform_and_lower

    partitioner = kiln.KilnPartitioner(enabled_precisions={torch.float16})
    assert partitioner.delegation_spec.backend_id == "KilnBackend"
    specs = {s.key: s.value for s in partitioner.delegation_spec.compile_specs}
    assert specs["enabled_precisions"] == b"float16"
    manager = to_edge_transform_and_lower(
        export(MLP(), torch.randn(2, 64)), partitioner=[partitioner]
    )
    assert [m.backend_id for m in lowered_modules(manager)] == ["KilnBackend"]
    assert partitioner.last_summary.ops_taken == 5


def test_two_step_executorch_export(cpu_op_program, tmp_path):
    manager = kiln.executorch.export(cpu_op_program, enabled_precisions={torch.float32})
    assert [m.backend_id for m in lowered_modules(manager)] == ["KilnBackend", "KilnBackend"]
    program = manager.to_executorch()
    assert program.buffer[4:8] == b"ET12"


def test_describe_node_normalizes_schema_arguments():
    class M(torch.nn.Module):
        def forward(self, a, b):
            return torch.cat([a, b], dim=1).to(torch.float16)

    from executorch.exir import to_edge

    from kiln._compile import edge_compile_config

    ep = to_edge(
        export(M(), torch.randn(2, 3), torch.randn(2, 5)), compile_config=edge_compile_config()
    ).exported_program()
    descs = {
        d.op: d
        for d in (_fx_nodes.describe_node(n) for n in ep.graph.nodes if n.op == "call_function")
    }
    cat = descs["aten.cat.default"]
    assert [n.name for n in cat.inputs] == ["a", "b"]
    assert cat.attrs == {"tensors_count": 2, "dim": 1}
    assert cat.outputs[0].shape == [2, 8]
    to_copy = descs["aten._to_copy.default"]
    assert to_copy.attrs["dtype"] == "float16"
    assert to_copy.attrs["non_blocking"] is False
    assert to_copy.outputs[0].dtype == "float16"


class _PadLinear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(36, 16)

    def forward(self, x):  # x: [2, 4, 6, 6]
        y = torch.nn.functional.pad(x, (1, 1, 1, 1), mode="reflect")[..., 1:7, 1:7]
        return torch.relu(self.fc(y.flatten(2)))


@pytest.mark.parametrize("model_fn,args", [
    (MLP, (torch.randn(8, 64),)),
    (_PadLinear, (torch.randn(2, 4, 6, 6),)),
])
def test_one_decomposition_gives_the_checked_paths_program(model_fn, args, tmp_path, monkeypatch):
    # When every kept op (linear, reflection/replication pads) passes Kiln's
    # check, ops_to_not_decompose gives ExecuTorch no check function and the
    # program is decomposed once instead of three times; the .pte must be
    # byte for byte the checked path's.
    from kiln import partitioner as P

    torch.manual_seed(0)
    program = export(model_fn().eval(), *args)
    seen = []
    real = P.KilnPartitioner.ops_to_not_decompose

    def spy(self, ep):
        ops, check = real(self, ep)
        seen.append((self.single_decomposition, check is None))
        return ops, check

    monkeypatch.setattr(P.KilnPartitioner, "ops_to_not_decompose", spy)
    fast = kiln.save(kiln.compile(program, target_sms=[90]), tmp_path / "fast.pte").read_bytes()
    assert seen and all(no_check for _, no_check in seen)
    real_init = P.KilnPartitioner.__init__

    def checked_init(self, *a, **k):
        real_init(self, *a, **k)
        self.single_decomposition = False

    monkeypatch.setattr(P.KilnPartitioner, "__init__", checked_init)
    seen.clear()
    checked = kiln.save(kiln.compile(program, target_sms=[90]), tmp_path / "checked.pte").read_bytes()
    assert seen and not any(no_check for _, no_check in seen)
    assert fast == checked


def test_a_kept_op_kiln_refuses_keeps_the_check_function():
    # A float64 linear is not Kiln's: ExecuTorch must get the check function
    # so that linear is decomposed (its GEMM to the CPU), not kept.
    from kiln import partitioner as P

    program = export(torch.nn.Linear(8, 4).double().eval(), torch.randn(3, 8, dtype=torch.float64))
    ops, check = P.KilnPartitioner(target_sms=[90]).ops_to_not_decompose(program.run_decompositions({}))
    assert torch.ops.aten.linear.default in ops and check is not None
