"""One writer per document folder: an exclusive `flock` on `<folder>/.lock`.

The kernel releases the lock when its holder dies, however it dies (SIGKILL, an
out-of-memory kill, a power cut), so there is never a stale lock to clean up by hand and
never a wait on a dead process. A converter that finds a document held skips it and says
by whom; it never waits, and never touches that folder's files (not even the temporary
files the holder is writing). The file itself is never deleted: deleting a lock file lets
a third process lock a new file of the same name while the second still holds the old one.

Who holds a lock is read from this machine's /proc/locks (no lock taken to look: `--status`
never makes a converter find a folder held). For a holder on another machine of an NFS share,
the holder's PID and host are written into the file when a run converts there, for messages
only (the lock is what counts; a scan that only reads a folder writes nothing, nor does a run
holding it again). `flock` locks are honoured on local filesystems and on NFS (Linux emulates
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
    def acquire(cls, folder: Path, announce: bool = True) -> DocumentLock | str:
        """The lock, or who holds it ("pid 1234 on host") when another process does. `announce`: name
        this process in the file, for the messages of others (a run converting there); the scan, which
        only reads the folder, does not, so a rerun with nothing to do writes nothing."""
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
        if announce:
            me = f"pid {os.getpid()} on {socket.gethostname()}\n".encode()
            if os.pread(handle, 200, 0) != me:
                os.ftruncate(handle, 0)
                os.pwrite(handle, me, 0)
        return cls(folder, handle)

    def release(self) -> None:
        if self._handle is not None:
            os.close(self._handle)  # closing the last descriptor releases the flock
            self._handle = None


def held_locks() -> dict[tuple[int, int, int], int]:
    """(device major, minor, inode) → PID, of every file this machine's processes hold a lock on, from
    /proc/locks: looking costs no lock, so --status never makes a converter find a folder held."""
    held: dict[tuple[int, int, int], int] = {}
    try:
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return held
    for line in lines:
        fields = line.split()
        if len(fields) >= 6 and fields[1] in ("FLOCK", "POSIX") and fields[4] != "->":
            try:
                major, minor, inode = fields[5].split(":")
                held[(int(major, 16), int(minor, 16), int(inode))] = int(fields[4])
            except ValueError:
                continue
    return held


def _key(info: os.stat_result) -> tuple[int, int, int]:
    return os.major(info.st_dev), os.minor(info.st_dev), info.st_ino


def holder_of(folder: Path, held: dict[tuple[int, int, int], int] | None = None) -> str | None:
    """Who holds the folder's lock right now, or None when nobody does (read-only: for --status). Seen
    from this machine: a holder on another machine of an NFS share is not. `held`: held_locks(), read
    once for many folders."""
    try:
        info = os.stat(folder / LOCK_FILE)
    except FileNotFoundError:
        return None
    pid = (held if held is not None else held_locks()).get(_key(info))
    return None if pid is None else f"pid {pid} on {socket.gethostname()}"


def _read_holder(handle: int) -> str:
    """Who holds the lock on the open file: this machine's /proc/locks says which process; a holder on
    another machine is named by what it wrote in the file."""
    pid = held_locks().get(_key(os.fstat(handle)))
    if pid is not None:
        return f"pid {pid} on {socket.gethostname()}"
    text = os.pread(handle, 200, 0).decode(errors="replace").strip()
    return text or "another process"
