"""Reads the carried vision models: the manifest_vision.json of each carry
group (written by benchmarks/export_models.py) and the xz archives beside it,
unpacked on first use. Pure Python (no torch, no ExecuTorch): used by
tests/gpu/run_gpu_tests.py and benchmarks/run_benchmarks.py on the GPU machine.
"""

from __future__ import annotations

import json
import tarfile
from pathlib import Path


def find_groups(paths) -> list[Path]:
    """Carry group folders: each path is a group (it holds
    manifest_vision.json) or a folder of groups (e.g. .gpu_carry)."""
    groups = []
    for p in map(Path, paths):
        if (p / "manifest_vision.json").is_file():
            groups.append(p)
        elif p.is_dir():
            groups += sorted(q.parent for q in p.glob("*/manifest_vision.json"))
    return groups


def load_entries(paths, unpack_dir: Path | None = None) -> list[dict]:
    """Every manifest entry of the groups under `paths`, with 'pte_path' set
    to the unpacked .pte (archives are unpacked into `unpack_dir`, default the
    group folder's 'pte' subfolder, once)."""
    entries = []
    for group in find_groups(paths):
        target = Path(unpack_dir) if unpack_dir else group / "pte"
        target.mkdir(parents=True, exist_ok=True)
        for e in json.loads((group / "manifest_vision.json").read_text()):
            pte = target / e["pte"]
            if not pte.exists():
                archive = group / e["archive"] if e.get("archive") else None
                if archive is None or not archive.exists():
                    plain = group / e["pte"]
                    if not plain.exists():
                        raise FileNotFoundError(f"{e['name']}: neither {archive} nor {plain} exists")
                    pte = plain
                else:
                    with tarfile.open(archive, "r:xz") as tar:
                        try:
                            tar.extractall(target, filter="data")
                        except TypeError:  # Python without extraction filters
                            tar.extractall(target)
            entries.append({**e, "pte_path": str(pte), "group": group.name})
    return entries
