"""Atomic file writes: a reader (or a rerun after SIGKILL) sees the old file or the new one,
never half of one.

Each write goes to a hidden temporary file in the same folder (`.NAME.partial-PID-RANDOM`),
is flushed to disk, then renamed over the target: rename is atomic within a filesystem.
A kill between the two leaves only a temporary file, which `remove_partials` recognises
by its name and deletes on the next run.
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path

PARTIAL_MARK = ".partial-"


def atomic_write_bytes(path: Path, data: bytes, durable: bool = False) -> None:
    """Write `data` to `path` atomically. `durable` also fsyncs, so the data survives a power
    cut, not only a killed process (slower: use it for what is expensive to redo)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}{PARTIAL_MARK}{os.getpid()}-{secrets.token_hex(4)}")
    try:
        with open(temporary, "wb") as handle:
            handle.write(data)
            if durable:
                handle.flush()
                os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str, durable: bool = False) -> None:
    atomic_write_bytes(path, text.encode("utf-8"), durable)


def atomic_write_json(path: Path, value: object, durable: bool = False) -> None:
    atomic_write_text(path, json.dumps(value, indent=1, ensure_ascii=False) + "\n", durable)


def is_partial(path: Path) -> bool:
    return path.name.startswith(".") and PARTIAL_MARK in path.name


def remove_partials(folder: Path) -> int:
    """Delete temporary files a killed writer left in `folder` and below; how many."""
    removed = 0
    if folder.is_dir():
        for path in folder.rglob(f".*{PARTIAL_MARK}*"):
            if path.is_file() and is_partial(path):
                path.unlink(missing_ok=True)
                removed += 1
    return removed
