"""Kiln's user-visible messages: the "kiln" logger at INFO, and stderr, so
they show up in a plain script without any logging configuration."""

from __future__ import annotations

import logging
import sys

logger = logging.getLogger("kiln")


def announce(line: str) -> None:
    """Logs `line` (already prefixed "kiln: ") and prints it to stderr."""
    logger.info("%s", line)
    print(line, file=sys.stderr, flush=True)
