"""tools/carry_split.py: a carried test folder split into parts that each fit a call."""
import json
import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
import carry_split  # noqa: E402


def _folder(tmp_path, sizes):
    folder = tmp_path / "conformance"
    folder.mkdir()
    entries = []
    for i, size in enumerate(sizes):
        (folder / f"m{i}.pte").write_bytes(random.randbytes(size))
        (folder / f"m{i}.state_dict.pt").write_bytes(random.randbytes(size // 2))
        entries.append({"name": f"m{i}", "pte": f"m{i}.pte", "state_dict": f"m{i}.state_dict.pt", "rtol": 1e-5})
    (folder / "manifest_ops.json").write_text(json.dumps(entries))
    return folder, entries


def test_parts_hold_every_entry_once_with_its_files_and_fit(tmp_path):
    sizes = [random.randint(1000, 60000) for _ in range(25)]
    folder, entries = _folder(tmp_path, sizes)
    limit_mib = 100000 / 2**20
    parts = carry_split.split(folder, tmp_path / "parts", limit_mib)
    assert len(parts) >= 2
    seen = []
    for part in parts:
        got = json.loads((part / "manifest_ops.json").read_text())
        total = 0
        for e in got:
            assert (part / e["pte"]).read_bytes() == (folder / e["pte"]).read_bytes()
            assert (part / e["state_dict"]).is_file()
            total += (part / e["pte"]).stat().st_size + (part / e["state_dict"]).stat().st_size
        assert total <= 100000
        seen += [e["name"] for e in got]
    assert sorted(seen) == sorted(e["name"] for e in entries)


def test_an_entry_larger_than_a_part_or_naming_no_file_is_refused(tmp_path):
    folder, _ = _folder(tmp_path, [5000, 300000])
    with pytest.raises(SystemExit, match="m1.*alone"):
        carry_split.split(folder, tmp_path / "parts", 100000 / 2**20)
    (folder / "m0.pte").unlink()
    (folder / "m0.state_dict.pt").unlink()
    with pytest.raises(SystemExit, match="names no file"):
        carry_split.split(folder, tmp_path / "parts", 1.0)
