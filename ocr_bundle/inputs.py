"""What the user asked to convert: files, folders and glob patterns → input files; page ranges.

Shared by the stress test (image folders) and the batch converter (folders of PDFs and
scans). Inside folders only files with a page suffix are taken (PDFs and every image type
the page accepts); a file named explicitly is taken whatever its name, and its content
decides what it is. Links are not resolved: a file is the path it was found at.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePath

PAGE_SUFFIXES = (".pdf", ".png", ".jpg", ".jpeg", ".webp", ".tif", ".tiff", ".bmp", ".gif")
_GLOB_CHARS = set("*?[")


@dataclass(frozen=True)
class InputFile:
    path: Path  # as named, made absolute, symbolic links not resolved: two links to one file are two inputs
    relative: PurePath  # where it sits under what the user named: the output mirrors it, and it names the document


class InputNotFound(FileNotFoundError):
    pass


def _is_glob(text: str) -> bool:
    return bool(_GLOB_CHARS & set(text))


def _glob_base(pattern: str) -> Path:
    """The folder part of a pattern before its first wildcard: matches are named relative to it."""
    base = []
    for part in Path(pattern).parts:
        if _is_glob(part):
            break
        base.append(part)
    return Path(*base) if base else Path(".")


def _pattern_regex(pattern: str) -> re.Pattern:
    """A glob pattern relative to its base (`**` any folders, `*` and `?` within a name, `[...]`), as
    glob.glob(recursive=True) reads it."""
    out, index = [], 0
    while index < len(pattern):
        if pattern.startswith("**/", index):
            out.append("(?:[^/]+/)*")
            index += 3
        elif pattern.startswith("**", index):
            out.append(".*")
            index += 2
        elif pattern[index] == "*":
            out.append("[^/]*")
            index += 1
        elif pattern[index] == "?":
            out.append("[^/]")
            index += 1
        elif pattern[index] == "[" and "]" in pattern[index + 2:]:
            close = pattern.index("]", index + 2)
            body = pattern[index + 1:close]
            out.append("[" + ("^" + re.escape(body[1:]) if body.startswith("!") else re.escape(body)) + "]")
            index = close + 1
        else:
            out.append(re.escape(pattern[index]))
            index += 1
    return re.compile("".join(out) + r"\Z")


SkipFolder = Callable[[Path], "str | None"]


class _Walk:
    """Files under folders, following symbolic links to folders once each: a folder already on the way
    (its device and inode) is a loop and is not entered again. What it followed or skipped is in `notes`."""

    def __init__(self, skip_folder: SkipFolder | None, notes: list[str] | None):
        self.skip_folder = skip_folder
        self.notes = notes if notes is not None else []

    def files(self, folder: Path, recursive: bool) -> Iterator[Path]:
        if not recursive:
            yield from sorted(p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in PAGE_SUFFIXES)
            return
        yield from self._below(folder, frozenset())

    def _below(self, folder: Path, ancestors: frozenset[tuple[int, int]]) -> Iterator[Path]:
        try:
            info = folder.stat()
            entries = sorted(os.scandir(folder), key=lambda entry: entry.name)
        except OSError as exc:
            self.notes.append(f"{folder}: not read ({exc.strerror or exc})")
            return
        ancestors = ancestors | {(info.st_dev, info.st_ino)}
        folders = []
        for entry in entries:  # a folder's own files first, then its sub-folders (as os.walk gives them)
            path = Path(entry.path)
            try:
                is_dir = entry.is_dir()  # follows a link
            except OSError:
                continue
            if is_dir:
                folders.append((entry, path))
            elif entry.is_file() and path.suffix.lower() in PAGE_SUFFIXES:
                yield path
        for entry, path in folders:
            if entry.name.startswith("."):  # no .git, .cache, ...
                continue
            reason = self.skip_folder(path) if self.skip_folder else None
            if reason:
                self.notes.append(f"{path}: skipped ({reason})")
                continue
            try:
                target = path.stat()
            except OSError:
                continue
            if (target.st_dev, target.st_ino) in ancestors:
                self.notes.append(f"{path}: a link back to a folder above it (a loop): not followed")
                continue
            if entry.is_symlink():
                self.notes.append(f"{path}: a link to a folder ({os.path.realpath(path)}): followed")
            yield from self._below(path, ancestors)


def discover(sources: list[str | Path], recursive: bool = True, skip_folder: SkipFolder | None = None,
             notes: list[str] | None = None) -> list[InputFile]:
    """Input files in the order given (folders sorted), each path once. Raises InputNotFound for a
    path that does not exist or a pattern that matches nothing.

    A file is known by its path as named (made absolute, links not resolved): two links to one file
    are two documents, each named after its link. Folders are walked following links to folders, once
    each (a loop is not followed); `skip_folder(path)` may return why a folder is not an input (the
    converter's own output); each link followed, loop and folder skipped is said in `notes`."""
    walk = _Walk(skip_folder, notes)
    found: dict[str, InputFile] = {}
    for source in map(str, sources):
        path = Path(source)
        if path.is_dir():
            items = [InputFile(p, p.relative_to(path)) for p in walk.files(path, recursive)]
        elif path.is_file():
            items = [InputFile(path, PurePath(path.name))]
        elif _is_glob(source):
            base = _glob_base(source)
            wanted = _pattern_regex(Path(source).relative_to(base).as_posix() if base != Path(".")
                                    else Path(source).as_posix())
            items = [InputFile(m, m.relative_to(base)) for m in (walk.files(base, True) if base.is_dir() else ())
                     if wanted.match(m.relative_to(base).as_posix())]
            if not items:
                raise InputNotFound(f"no image or PDF file matches {source}")
        else:
            raise InputNotFound(f"no such file or folder: {source}")
        for item in items:
            absolute = Path(os.path.abspath(item.path))
            found.setdefault(str(absolute), InputFile(absolute, item.relative))
    return list(found.values())


def parse_shard(text: str) -> tuple[int, int]:
    """'2/3' → (2, 3): the second of three shards. Raises ValueError with a message."""
    parts = text.split("/")
    if len(parts) != 2 or not all(part.strip().isdigit() for part in parts):
        raise ValueError(f"a shard is K/N, e.g. 2/3 (the second of three), not {text!r}")
    index, count = int(parts[0]), int(parts[1])
    if not 1 <= index <= count:
        raise ValueError(f"shard {text}: K must be between 1 and N")
    return index, count


def in_shard(item: InputFile, index: int, count: int) -> bool:
    """Is `item` in shard `index` of `count`? By its path relative to what was named, so the
    same corpus splits the same way on every machine, whatever the order of the arguments or
    where the corpus is mounted; inputs of the same relative path share a shard (their output
    folders are numbered by one converter)."""
    digest = hashlib.sha256(item.relative.as_posix().encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % count == index - 1


def parse_page_ranges(text: str) -> list[tuple[int, int | None]]:
    """'1,3-5,10-' → [(1, 1), (3, 5), (10, None)] (1-based, inclusive; None: to the end)."""
    ranges = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        first, dash, last = item.partition("-")
        try:
            start = int(first)
            end = (int(last) if last.strip() else None) if dash else start
        except ValueError:
            raise ValueError(f"not a page or range: {item!r} (use e.g. 1,3-5,10-)") from None
        if start < 1 or (end is not None and end < start):
            raise ValueError(f"not a page or range: {item!r} (pages count from 1)")
        ranges.append((start, end))
    if not ranges:
        raise ValueError("no page given")
    return ranges


def pages_in(ranges: list[tuple[int, int | None]] | None, page_count: int) -> list[int]:
    """The pages of a document of `page_count` pages that the ranges select (all if None)."""
    if ranges is None:
        return list(range(1, page_count + 1))
    chosen = set()
    for start, end in ranges:
        chosen.update(range(start, min(end or page_count, page_count) + 1))
    return sorted(chosen)


def output_folders(inputs: list[InputFile],
                   belongs: Callable[[InputFile, PurePath], bool | None] = lambda item, folder: None,
                   ) -> dict[Path, PurePath]:
    """Each input's output folder, relative to the output root: its relative path, suffix
    kept (scans/a.pdf → scans/a.pdf), so that adding a.png beside a.pdf never moves a.pdf's
    output. Two inputs with the same relative path (both named x.pdf, given from two
    folders) get x.pdf and x.pdf~2.

    `belongs(item, folder)` says whether a folder already holds that input's output (True),
    another input's (False) or nothing (None). A folder that holds an input's output stays
    its folder, whatever else is given this time, and so does a folder of the bundle's
    earlier naming (scans/a); the others are numbered in path order, skipping folders that
    hold another input's output. So the same file lands in the same folder, whatever the
    order of the arguments or the other inputs."""
    groups: dict[PurePath, list[InputFile]] = {}
    for item in sorted(inputs, key=lambda i: (i.relative.as_posix(), str(i.path))):
        groups.setdefault(item.relative, []).append(item)
    folders: dict[Path, PurePath] = {}
    for relative, items in groups.items():
        candidates = list(itertools.islice(_numbered(relative), len(items) + 4))
        if relative.suffix:
            candidates.append(relative.with_suffix(""))  # the earlier naming: reused, never given anew
        taken: set[PurePath] = set()
        unplaced = []
        for item in items:
            own = next((f for f in candidates if f not in taken and belongs(item, f)), None)
            if own is None:
                unplaced.append(item)
            else:
                folders[item.path] = own
                taken.add(own)
        for item in unplaced:
            folder = next(f for f in _numbered(relative) if f not in taken and belongs(item, f) is None)
            folders[item.path] = folder
            taken.add(folder)
    return folders


def _numbered(relative: PurePath) -> Iterator[PurePath]:
    """x.pdf, x.pdf~2, x.pdf~3, …"""
    yield relative
    for n in itertools.count(2):
        yield relative.with_name(f"{relative.name}~{n}")
