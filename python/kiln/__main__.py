"""`python -m kiln <command>`: inspect."""

import sys


def main() -> int:
    commands = {"inspect"}
    if len(sys.argv) < 2 or sys.argv[1] not in commands:
        print(f"usage: python -m kiln {{{','.join(sorted(commands))}}} ...", file=sys.stderr)
        return 2
    from .inspect import main as inspect_main

    return inspect_main(sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
