"""Where an export's seconds go: one line at the end of every kiln.save,

    kiln: export phases edge 4.1 s, partition 2.0 s, engine compile 20.3 s (kernels 15.2 s), serialize 1.2 s

(tools/coverage/export_time.py and the coverage sweep print it with
torch.export's seconds in front). Phases, wall seconds:

- edge: ExecuTorch's edge program (the ATen decomposition, Kiln's constant
  folding), up to the partitioner's first call;
- partition: the partitioner and ExecuTorch's delegation around it (the
  proposals, partition programs, preprocess) without the engine compiles;
- engine compile: Kiln's compiler on every partition (trials included),
  and within it "kernels", NVRTC + nvJitLink (``nvrtc_cache_stats``);
- serialize: kiln.save's to_executorch and the file write (a re-lowering
  in save counts in the phases above).

Each CompiledProgram keeps its own ExportPhases; lower() records into
the one `recording()` names.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field

PHASES = ("edge", "partition", "engine compile", "serialize")

# A phase that takes this long says so when it ends (a progress line), so a
# long export is never silent for more than a phase.
SLOW_PHASE_S = 3.0


def kernel_seconds() -> float:
    """Wall seconds the kernel compiler spent so far in this process."""
    from ._native import available, native

    if not available():
        return 0.0
    stats = getattr(native(), "nvrtc_cache_stats", None)
    return float(stats()["seconds"]) if stats else 0.0


@dataclass
class ExportPhases:
    seconds: dict = field(default_factory=lambda: {p: 0.0 for p in PHASES})
    kernels: float = 0.0

    def add(self, phase: str, s: float) -> None:
        self.seconds[phase] += max(0.0, s)

    def copy(self) -> "ExportPhases":
        return ExportPhases(dict(self.seconds), self.kernels)

    def line(self, torch_export_s: float | None = None) -> str:
        parts = [] if torch_export_s is None else [f"torch.export {torch_export_s:.1f} s"]
        for phase in PHASES:
            text = f"{phase} {self.seconds[phase]:.1f} s"
            if phase == "engine compile":
                text += f" (kernels {self.kernels:.1f} s)"
            parts.append(text)
        return "kiln: export phases " + ", ".join(parts)


_current: ExportPhases | None = None


@contextlib.contextmanager
def recording(phases: ExportPhases):
    """lower() and the compiles inside it add to `phases`."""
    global _current
    previous, _current = _current, phases
    try:
        yield phases
    finally:
        _current = previous


class _Lowering:
    """The clock of one lower(): edge until the first partitioner call."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.partition_start: float | None = None
        self.compile_s = 0.0
        self.kernels0 = kernel_seconds()


_lowering: _Lowering | None = None


@contextlib.contextmanager
def lowering():
    """Wraps one to_edge_transform_and_lower: splits its time into edge,
    partition and engine compile."""
    global _lowering
    previous, _lowering = _lowering, _Lowering()
    state = _lowering
    try:
        yield
    finally:
        _lowering = previous
        end = time.perf_counter()
        if _current is not None:
            split = state.partition_start if state.partition_start is not None else end
            _current.add("edge", split - state.start)
            _current.add("partition", end - split - state.compile_s)
            _current.add("engine compile", state.compile_s)
            _current.kernels += kernel_seconds() - state.kernels0


def partition_started() -> float | None:
    """The partitioner begins (the edge phase ends); returns the edge phase's
    seconds the first time in a lowering, else None."""
    if _lowering is None or _lowering.partition_start is not None:
        return None
    _lowering.partition_start = time.perf_counter()
    return _lowering.partition_start - _lowering.start


def compiled(seconds: float) -> None:
    """One engine compile took `seconds`."""
    if _lowering is not None:
        _lowering.compile_s += seconds
    elif _current is not None:  # a compile outside lower() (KilnBackend used directly)
        _current.add("engine compile", seconds)
