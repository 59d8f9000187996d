"""The compiler's layers include one way only (src/*/README.md):
ir <- codegen <- ops <- passes <- compiler, and the engine format below them all."""

import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"

# folder -> the project folders its sources may include
ALLOWED = {
    "ir": {"ir", "engine_format", "common"},
    "codegen": {"codegen", "ir", "engine_format", "common"},
    "ops": {"ops", "codegen", "ir", "engine_format", "common"},
    "passes": {"passes", "ops", "codegen", "ir", "engine_format", "common"},
    "compiler": {"compiler", "passes", "ops", "codegen", "ir", "engine_format", "common"},
}


def test_compiler_layers_include_one_way():
    include = re.compile(r'#include "([a-z_]+)/')
    wrong = []
    for folder, allowed in ALLOWED.items():
        for path in sorted((SRC / folder).glob("*.[ch]*")):
            for line_no, line in enumerate(path.read_text().splitlines(), 1):
                m = include.match(line.strip())
                if m and m.group(1) not in allowed:
                    wrong.append(f"{path.relative_to(SRC)}:{line_no} includes {m.group(1)}/")
    assert not wrong, "layering broken:\n" + "\n".join(wrong)
    # The check sees real files (a moved tree would make it vacuous).
    assert list((SRC / "ops").glob("*_ops.cpp")), "no op files found under src/ops"
