"""One writer per document folder: an exclusive `flock` on `<folder>/.lock`.

The kernel releases the lock when its holder dies, however it dies (SIGKILL, an
out-of-memory kill, a power cut), so there is never a stale lock to clean up by hand and
never a wait on a dead process. A converter that finds a document held skips it and says
by whom; it never waits, and never touches that folder's files (not even the temporary
files the holder is writing). The file itself is never deleted: deleting a lock file lets
a third process lock a new file of the same name while the second still holds the old one.

The holder's PID and host are written into the file, for messages only: the lock is
what counts. `flock` locks are honoured on local filesystems and on NFS (Linux emulates
them with NFS byte-range locks).
"""

from __future__ import annotations

import fcntl
import os
import socket
from pathlib import Path

LOCK_FILE = ".lock"


class DocumentLock:
    """An exclusive lock on one document folder, held until `release()` or the process ends."""

    def __init__(self, folder: Path, handle: int):
        self.folder = folder
        self._handle: int | None = handle

    @classmethod
    def acquire(cls, folder: Path) -> DocumentLock | str:
        """The lock, or who holds it ("pid 1234 on host") when another process does."""
        folder.mkdir(parents=True, exist_ok=True)
        handle = os.open(folder / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(handle)
            os.close(handle)
            return holder
        except BaseException:
            os.close(handle)
            raise
        os.ftruncate(handle, 0)
        os.pwrite(handle, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
        return cls(folder, handle)

    def release(self) -> None:
        if self._handle is not None:
            os.close(self._handle)  # closing the last descriptor releases the flock
            self._handle = None


def holder_of(folder: Path) -> str | None:
    """Who holds the folder's lock right now, or None when nobody does (read-only: for --status)."""
    try:
        handle = os.open(folder / LOCK_FILE, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return _read_holder(handle)
    finally:
        os.close(handle)  # also releases the shared lock just taken
    return None


def _read_holder(handle: int) -> str:
    text = os.pread(handle, 200, 0).decode(errors="replace").strip()
    return text or "another process"
