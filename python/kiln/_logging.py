"""Kiln's user-visible messages: the "kiln" logger at INFO, and stderr, so
they show up in a plain script without any logging configuration.

Export prints, in order: the partitioner's plan (one line), then per
partition "compiling partition i/N: K nodes" followed by the compiler's own
lines (the partitioner's trial compile, see _trial.py), one line per op left
to the CPU because its partition failed to compile (and the revised plan),
then one final summary with the engine sizes."""

from __future__ import annotations

import logging
import sys

logger = logging.getLogger("kiln")


def announce(line: str) -> None:
    """Logs `line` (already prefixed "kiln: ") and prints it to stderr."""
    logger.info("%s", line)
    print(line, file=sys.stderr, flush=True)


class LoweringProgress:
    """Counts the partitions of one lowering. The partitioner calls start()
    with its summary; ExecuTorch then calls KilnBackend.preprocess once per
    partition, in tag order, which calls partition() and engine(). With
    several methods ExecuTorch partitions every method first, then
    preprocesses them in the same order: summaries wait in a queue."""

    def __init__(self) -> None:
        self._summary = None  # the PartitionSummary whose partitions preprocess is reaching
        self._pending: list = []  # summaries of methods partitioned but not yet preprocessed
        self._started = 0
        self._engine_bytes: list[int] = []
        self._named_bytes = 0  # weights of this method's engines kept as named data
        self._current = ""  # "i/N" of the partition being compiled

    def reset(self) -> None:
        """A new lowering begins: forget what an interrupted one left."""
        self._summary, self._pending, self._started, self._engine_bytes = None, [], 0, []
        self._named_bytes = 0

    def start(self, summary) -> None:
        if summary.partitions == 0:
            return  # nothing of this method reaches preprocess
        self._pending.append(summary)
        if self._summary is None:
            self._next()

    def _next(self) -> None:
        self._summary = self._pending.pop(0) if self._pending else None
        self._started, self._engine_bytes, self._named_bytes = 0, [], 0

    def partition(self, nodes: int, compiled_earlier: bool = False) -> None:
        """preprocess reached a partition; `compiled_earlier`: its engine was
        built by the partitioner's trial compile (nothing to announce)."""
        self._started += 1
        if compiled_earlier:
            return
        of = f"/{self._summary.partitions}" if self._summary is not None else ""
        self._current = f"{self._started}{of}"
        announce(f"kiln: compiling partition {self._started}{of}: {nodes} node{'' if nodes == 1 else 's'}")

    def trial(self, index: int, total: int, nodes: int) -> None:
        """The partitioner compiles partition `index` (1-based) of `total`."""
        self._current = f"{index}/{total}"
        announce(f"kiln: compiling partition {index}/{total}: {nodes} node{'' if nodes == 1 else 's'}")

    def compiled(self, seconds: float, slow_s: float) -> None:
        """The partition announced last compiled in `seconds`; said only when
        that took `slow_s` or more (so at most a line every few seconds)."""
        if seconds >= slow_s:
            announce(f"kiln: compiled partition {self._current} in {seconds:.1f} s")

    def engine(self, size: int, named_weight_bytes: int = 0) -> None:
        """One partition's engine is done: `size` bytes in the delegate blob,
        `named_weight_bytes` of its weights in the program's named data."""
        self._engine_bytes.append(size)
        self._named_bytes += named_weight_bytes
        summary = self._summary
        if summary is not None and len(self._engine_bytes) == summary.partitions:
            announce(summary.final_line(self._engine_bytes, self._named_bytes))
            self._next()


progress = LoweringProgress()
