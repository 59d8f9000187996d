"""Weights as ExecuTorch named data: the key scheme, the model id, and moving
Kiln's weights to an external .ptd file.

Every weight a Kiln engine reads (after export-time folding and dtype
conversion: the bytes the GPU uses) is stored once in the program's named
data under

    kiln/<model id>/<16 hex digits of hash_bytes(content)>-<size in bytes>

- <model id> is ``kiln.compile(..., model_id=...)``, or by default the first
  16 hex digits of a SHA-256 over every method's parameters, buffers and
  constants (names, dtypes, shapes, bytes). Two different models therefore
  get different keys even where a tensor has the same name (``fc1.weight``),
  and loading both in one process never mixes their weights.
- The content hash makes the key name the bytes: engines of several methods
  that use the same weight name the same key, so ExecuTorch stores it once
  and the runtime uploads it once per GPU.

The runtime checks the size and hash of every named weight it reads against
the engine, and shares a GPU copy only when key, size and hash all match
(src/runtime/named_weight_cache.h).
"""

from __future__ import annotations

import hashlib
import re
from typing import Iterable

import torch
from executorch.exir._serialize._named_data_store import NamedDataStore, NamedDataStoreOutput
from torch.export import ExportedProgram

KEY_ROOT = "kiln/"
MODEL_ID_PATTERN = r"[A-Za-z0-9._-]{1,64}"
# Named data alignment in the .pte/.ptd: the runtime copies the bytes to the
# GPU, so this only keeps host reads aligned.
ALIGNMENT = 64


def check_model_id(model_id: object) -> str:
    if not isinstance(model_id, str):
        raise TypeError(f"model_id: expected a str, got {type(model_id).__name__}")
    if not re.fullmatch(MODEL_ID_PATTERN, model_id):
        raise ValueError(
            f"model_id: {model_id!r} must be 1 to 64 characters from A-Z a-z 0-9 . _ - "
            "(it becomes part of every weight's key)"
        )
    return model_id


def _tensors(program: ExportedProgram) -> Iterable[tuple[str, torch.Tensor]]:
    yield from program.state_dict.items()
    yield from program.constants.items()


def default_model_id(programs: dict[str, ExportedProgram]) -> str:
    """16 hex digits of SHA-256 over the weights of every method (each name
    once: methods exported from one module share their state dict)."""
    tensors: dict[str, torch.Tensor] = {}
    for name in sorted(programs):
        for key, value in _tensors(programs[name]):
            if isinstance(value, torch.Tensor):
                tensors.setdefault(key, value)
    digest = hashlib.sha256()
    for key in sorted(tensors):
        t = tensors[key].detach().cpu().contiguous()
        digest.update(f"{key}\0{t.dtype}\0{list(t.shape)}\0".encode())
        digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return digest.hexdigest()[:16]


def key_prefix(model_id: str) -> str:
    return f"{KEY_ROOT}{check_model_id(model_id)}/"


def named_data(entries: list[tuple[str, str, bytes]]) -> NamedDataStoreOutput:
    """The NamedDataStoreOutput a preprocess returns for `entries`
    ((key, tensor name, bytes): the weights the compiler left out of an engine)."""
    store = NamedDataStore()
    for key, _name, data in entries:
        store.add_named_data(key, data, alignment=ALIGNMENT)
    return store.get_named_data_store_output()


def move_to_external_file(manager, tag: str) -> int:
    """Moves Kiln's named weights of `manager` (an EdgeProgramManager about to
    be saved; the caller owns it) from the .pte into the external data file
    `tag` (ExecuTorch writes it as <tag>, or <tag>.ptd). Returns how many
    entries moved. Relies on the EdgeProgramManager's named data store
    (ExecuTorch 1.5.1, pinned)."""
    store = getattr(manager, "_named_data_store", None)
    if not isinstance(store, NamedDataStore):
        raise RuntimeError(
            "kiln.save(external_weights=...): this ExecuTorch's EdgeProgramManager has no named "
            "data store where Kiln expects it (ExecuTorch 1.5.1 is required)"
        )
    moving = {k: v for k, v in store.pte_data.items() if k.startswith(KEY_ROOT)}
    if not moving:
        return 0
    target = store.external_data.setdefault(tag, {})
    for key, entry in moving.items():
        target[key] = entry
        del store.pte_data[key]
    return len(moving)
