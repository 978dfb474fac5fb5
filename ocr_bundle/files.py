"""Atomic file writes: a reader (or a rerun after SIGKILL) sees the old file or the new one,
never half of one.

Each write goes to a hidden temporary file in the same folder (`.DIGEST.partial-PID-RANDOM`,
DIGEST a short hash of the target's name: the temporary name is short whatever the target's, so
a name of 255 bytes can still be written), then is renamed over the target: rename is atomic
within a filesystem. A kill between the
two leaves only a temporary file, which `remove_partials` recognises by its name and
deletes on the next run.

What that guarantees depends on `durable`:
- always: a killed process (SIGKILL, Ctrl-C, an out-of-memory kill) never leaves half a
  file under the real name;
- `durable=True` only: a power cut or kernel crash does not either. Without it the kernel
  may put the rename on disk before the data, and after a reboot the name can hold an
  empty file. Durable writes fsync the data before the rename (a few milliseconds). The
  rename itself may still be lost to a power cut, leaving the old file: callers that
  need it must treat "the old file" as a valid state. The batch converter does: a
  manifest that lost its last pages, or a page file that is missing, means "convert that
  page again", never "lost".
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import secrets
from pathlib import Path

PARTIAL_MARK = ".partial-"
# A write that fails with one of these fails for every file that follows: stop, do not go on.
DISK_FULL = {errno.ENOSPC, errno.EDQUOT, errno.EROFS}


def is_disk_full(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in DISK_FULL


def fsync_folder(folder: Path) -> None:
    """Make the names in `folder` (a file just created or renamed there) survive a power cut."""
    handle = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)


def atomic_write_bytes(path: Path, data: bytes, durable: bool = False) -> None:
    """Write `data` to `path` atomically; `durable` also survives a power cut (see above)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256(path.name.encode("utf-8", "surrogateescape")).hexdigest()[:12]
    temporary = path.with_name(f".{digest}{PARTIAL_MARK}{os.getpid()}-{secrets.token_hex(4)}")
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
    """Delete temporary files a killed writer left in `folder` and below; how many. Call it
    only holding the folder's lock (ocr_bundle.batch.locking): a live writer's files look the same."""
    removed = 0
    if folder.is_dir():
        for path in folder.rglob(f".*{PARTIAL_MARK}*"):
            if path.is_file() and is_partial(path):
                path.unlink(missing_ok=True)
                removed += 1
    return removed
