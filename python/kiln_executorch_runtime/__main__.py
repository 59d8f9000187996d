"""`python -m kiln_executorch_runtime`: where Kiln's runtime files are.

    python -m kiln_executorch_runtime --cmake-prefix-path   # for CMake consumers
    python -m kiln_executorch_runtime --library-dir | --include-dir | --cmake-dir
    python -m kiln_executorch_runtime --check               # register, report

Path queries load nothing (no GPU needed); --check registers the delegate as
`import kiln_executorch_runtime` does and exits 1 with its message on failure.
"""

from __future__ import annotations

import argparse
import sys

from . import (
    KilnRuntimeError,
    cmake_dir,
    cmake_prefix_path,
    include_dir,
    library_dir,
    package_dir,
    register,
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kiln_executorch_runtime",
                                     description="Kiln runtime paths and checks")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--cmake-prefix-path", action="store_true",
                       help="print the CMAKE_PREFIX_PATH that finds executorch and executorch_backend_kiln")
    group.add_argument("--library-dir", action="store_true", help="print the delegate's directory")
    group.add_argument("--include-dir", action="store_true", help="print the directory of kiln/caller_stream.h")
    group.add_argument("--cmake-dir", action="store_true", help="print the CMake config's directory")
    group.add_argument("--check", action="store_true",
                       help="register the delegate here and report (exit 1 with the reason if it cannot)")
    args = parser.parse_args(argv)
    try:
        if args.cmake_prefix_path:
            print(cmake_prefix_path())
        elif args.library_dir:
            print(library_dir())
        elif args.include_dir:
            print(include_dir())
        elif args.cmake_dir:
            print(cmake_dir())
        elif args.check:
            names = register()
            print(f"registered in ExecuTorch: {', '.join(names)}")
        else:
            print(f"package: {package_dir()}\nCMAKE_PREFIX_PATH: {cmake_prefix_path()}")
    except KilnRuntimeError as e:
        print(e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
