"""Export progress: the plan, one line per partition, one final summary."""

from __future__ import annotations

import logging
import re

import pytest

import kiln

from _helpers import lowered_modules

pytestmark = pytest.mark.needs_compiler


def kiln_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("kiln: ")]


def test_two_partitions(cpu_op_program, capsys, caplog):
    with caplog.at_level(logging.INFO, logger="kiln"):
        compiled = kiln.compile(cpu_op_program)
    lines = kiln_lines(capsys.readouterr().err)
    sizes = [len(bytes(m.processed_bytes)) for m in lowered_modules(compiled.edge_program_manager)]

    assert lines[0] == "kiln: 2 partitions, 4 ops taken by KilnBackend, 1 op left to the CPU: aten.flip.default"
    starts = [i for i, line in enumerate(lines) if line.startswith("kiln: compiling partition")]
    assert [lines[i] for i in starts] == [
        "kiln: compiling partition 1/2: 2 nodes",
        "kiln: compiling partition 2/2: 2 nodes",
    ]
    # The compiler's own lines for each partition follow its progress line.
    assert starts[1] - starts[0] > 1 and len(lines) - 1 - starts[1] > 1
    # Every parameter is delegated, so the named data holds all of them.
    weights = sum(t.numel() * t.element_size() for t in cpu_op_program.state_dict.values())
    assert lines[-1] == (
        "kiln: done: 2 partitions, 4 ops taken by KilnBackend, 1 op left to the CPU "
        f"(aten.flip.default); engines {sizes[0]:,} + {sizes[1]:,} = {sum(sizes):,} bytes; "
        f"weights {weights:,} bytes as named data"
    )
    # The same lines reach the "kiln" logger, for applications that log.
    logged = [r.getMessage() for r in caplog.records if r.name == "kiln"]
    assert lines[-1] in logged and "kiln: compiling partition 2/2: 2 nodes" in logged


def test_one_partition_and_a_fresh_count_per_lowering(mlp_program, capsys):
    for _ in range(2):  # the count restarts with each lowering
        compiled = kiln.compile(mlp_program)
        lines = kiln_lines(capsys.readouterr().err)
        (size,) = [len(bytes(m.processed_bytes)) for m in lowered_modules(compiled.edge_program_manager)]
        assert [l for l in lines if "compiling partition" in l] == ["kiln: compiling partition 1/1: 5 nodes"]
        weights = sum(t.numel() * t.element_size() for t in mlp_program.state_dict.values())
        assert lines[-1] == (
            "kiln: done: 1 partition, 5 ops taken by KilnBackend, 0 ops left to the CPU; "
            f"engines {size:,} bytes; weights {weights:,} bytes as named data"
        )
        assert sum(bool(re.match(r"kiln: done:", l)) for l in lines) == 1


def test_save_ends_with_the_export_phases(mlp_program, tmp_path, capsys):
    compiled = kiln.compile(mlp_program)
    assert compiled.saved_phases is None
    kiln.save(compiled, tmp_path / "m.pte")
    lines = kiln_lines(capsys.readouterr().err)
    number = r"\d+\.\d s"
    assert re.fullmatch(rf"kiln: export phases edge {number}, partition {number}, engine compile {number} "
                        rf"\(kernels {number}\), serialize {number}", lines[-1]), lines[-1]
    phases = compiled.saved_phases
    assert phases.line() == lines[-1]
    # The partitioner's trial compiled the one engine (a GELU kernel: NVRTC ran or hit its cache).
    assert phases.seconds["engine compile"] > 0 and phases.seconds["serialize"] > 0
    assert 0 <= phases.kernels <= phases.seconds["engine compile"]
    assert compiled.phases.seconds["serialize"] == 0  # kiln.compile's own phases are left as they were
    assert phases.line(torch_export_s=1.25).startswith("kiln: export phases torch.export 1.2 s, edge ")
