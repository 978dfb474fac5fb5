"""What makes a document the same document: the one rule, for the scan, the claim, --status and the
quality check.

A document is its path relative to the corpus argument it was found under (as named: symbolic links
are not resolved, so two links to one file are two documents, each named after its link), plus its
content (SHA-256). The absolute path is where it was last seen, nothing more: a shared output tree
works from any mount point, and a rerun from another mount hashes nothing and writes nothing.

A file's content is known by a Snapshot: its size and modification time taken together with its
hash (stat, hash, stat again: a file that changes while it is read is read again). A file whose size
and modification time still match its manifest's snapshot is taken to be the file hashed then (what
make and rsync go by); any other is hashed again, at the scan and again when the run claims it.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from ..images import check_size
from ..inputs import InputFile

READ_TRIES = 3


class FileChanging(OSError):
    """The file changed each time it was read (still being written?)."""


@dataclass(frozen=True)
class Snapshot:
    size: int
    mtime_ns: int
    sha256: str

    def matches(self, stat: os.stat_result) -> bool:
        return stat.st_size == self.size and stat.st_mtime_ns == self.mtime_ns

    def as_manifest(self) -> dict:
        return {"source_sha256": self.sha256, "source_bytes": self.size, "source_mtime_ns": self.mtime_ns}


def file_sha256(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def recorded(manifest: dict | None) -> Snapshot | None:
    """The snapshot a manifest was made from (None when it holds none)."""
    if not manifest or not manifest.get("source_sha256") or manifest.get("source_bytes") is None:
        return None
    return Snapshot(manifest["source_bytes"], manifest.get("source_mtime_ns") or 0, manifest["source_sha256"])


def take(path: Path, max_bytes: int | None = None, known: Snapshot | None = None) -> Snapshot:
    """The file's snapshot: `known`'s hash when its size and modification time still match, else hashed
    now, between two stats that agree. Raises OSError (gone, unreadable, FileChanging) or InputError
    (larger than `max_bytes`)."""
    for _ in range(READ_TRIES):
        before = os.stat(path)
        if max_bytes is not None:
            check_size(before.st_size, max_bytes)
        if known is not None and known.matches(before):
            return known
        sha256 = file_sha256(path)
        after = os.stat(path)
        if (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns):
            return Snapshot(before.st_size, before.st_mtime_ns, sha256)
    raise FileChanging(f"{path} changed each time it was read ({READ_TRIES} times): still being written?")


def unchanged(manifest: dict, stat: os.stat_result) -> bool:
    """Is the file of `stat` the one the manifest hashed, by size and modification time?"""
    snapshot = recorded(manifest)
    return snapshot is not None and snapshot.matches(stat)


def relative_of(manifest: dict) -> str | None:
    """The document's path relative to its corpus argument, as recorded (None in older manifests)."""
    return manifest.get("relative")


def same_document(manifest: dict, item: InputFile) -> bool:
    """Is the manifest this input's? Its relative path must be the input's; then it is the same document
    when it was read at this very path, or at a path that is this same file (a bind mount, a link to the
    folder), or at a path that does not exist here (the corpus mounted elsewhere, or another machine).
    A path that exists here and is another file (two folders given, each with an x.pdf) is another
    document. A manifest of an older bundle (no relative path recorded) only by its path."""
    relative = relative_of(manifest)
    if relative is not None and relative != item.relative.as_posix():
        return False
    source = manifest.get("source")
    if not source:
        return False
    if os.path.abspath(source) == str(item.path):
        return True
    try:
        return os.path.samefile(source, item.path)
    except FileNotFoundError:
        return relative is not None
    except OSError:
        return False


def stem_of(manifest: dict) -> str:
    """The document's name (its <name>.md): its own file name, never a link's target's."""
    return PurePosixPath(relative_of(manifest) or manifest.get("source") or "document").stem
