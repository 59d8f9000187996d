"""The `kiln` command (also `python -m kiln`):

    kiln inspect model.pte [--json]
"""

from __future__ import annotations

import sys

USAGE = "usage: kiln inspect model.pte [--json]"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    if not args or args[0] != "inspect":
        print(USAGE, file=sys.stderr)
        return 2
    from .inspect import main as inspect_main

    return inspect_main(args[1:])


if __name__ == "__main__":
    sys.exit(main())
