#!/usr/bin/env python3
"""Splits a carried test folder (manifest*.json + the files its entries name)
into parts of at most --mib MiB each, so that each part fits one GPU-machine
call (64 MiB with the repository and the ExecuTorch SDK). Each part is a folder
with the same manifest file names holding its share of the entries; files are
hard links (no copy). tests/gpu/run_gpu_tests.py takes the parts like the
whole folder (--models PART ...).

    python3 tools/carry_split.py .gpu_carry/conformance --mib 28 --out .gpu_carry/conformance_parts
    # -> .gpu_carry/conformance_parts/part_00, part_01, ...
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path


def entry_files(entry: dict, folder: Path) -> list[str]:
    """The names of the files in `folder` that an entry's string fields name."""
    return sorted({v for v in entry.values() if isinstance(v, str) and v and "/" not in v and (folder / v).is_file()})


def split(folder: Path, out: Path, mib: float) -> list[Path]:
    manifests = sorted(folder.glob("manifest*.json"))
    if not manifests:
        raise SystemExit(f"carry_split: {folder} has no manifest*.json")
    limit = mib * 2**20
    items = []  # (manifest name, entry, files, bytes)
    for m in manifests:
        for entry in json.loads(m.read_text()):
            files = entry_files(entry, folder)
            if not files:
                raise SystemExit(f"carry_split: {m.name}: entry {entry.get('name', entry)!r} names no file in {folder}")
            items.append((m.name, entry, files, sum((folder / f).stat().st_size for f in files)))
    for name, entry, _, size in items:
        if size > limit:
            raise SystemExit(f"carry_split: {name}: entry {entry.get('name')!r} alone is {size / 2**20:.1f} MiB > --mib {mib}")
    parts: list[list] = []
    sizes: list[int] = []
    for item in sorted(items, key=lambda i: -i[3]):  # first fit, largest first
        for k, s in enumerate(sizes):
            if s + item[3] <= limit:
                parts[k].append(item)
                sizes[k] += item[3]
                break
        else:
            parts.append([item])
            sizes.append(item[3])
    if out.exists():
        shutil.rmtree(out)
    folders = []
    for k, part in enumerate(parts):
        d = out / f"part_{k:02d}"
        d.mkdir(parents=True)
        by_manifest: dict[str, list] = {}
        for name, entry, files, _ in part:
            by_manifest.setdefault(name, []).append(entry)
            for f in files:
                if not (d / f).exists():
                    os.link(folder / f, d / f)
        for name, entries in by_manifest.items():
            (d / name).write_text(json.dumps(entries, indent=1))
        print(f"{d}: {sum(len(v) for v in by_manifest.values())} entries, {sizes[k] / 2**20:.1f} MiB")
        folders.append(d)
    return folders


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder", type=Path)
    p.add_argument("--mib", type=float, default=28.0)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    split(args.folder, args.out, args.mib)
    return 0


if __name__ == "__main__":
    sys.exit(main())
