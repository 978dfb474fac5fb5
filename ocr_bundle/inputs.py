"""What the user asked to convert: files, folders and glob patterns → input files; page ranges.

Shared by the stress test (image folders) and the batch converter (folders of PDFs and
scans). Inside folders only files with a page suffix are taken (PDFs and every image type
the page accepts); a file named explicitly is taken whatever its name, and its content
decides what it is.
"""

from __future__ import annotations

import glob
import hashlib
import itertools
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePath

PAGE_SUFFIXES = (".pdf", ".png", ".jpg", ".jpeg", ".webp", ".tif", ".tiff", ".bmp", ".gif")
_GLOB_CHARS = set("*?[")


@dataclass(frozen=True)
class InputFile:
    path: Path
    relative: PurePath  # where it sits under what the user named: the output mirrors it


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


def _folder_files(folder: Path, recursive: bool) -> list[Path]:
    if not recursive:
        return sorted(p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in PAGE_SUFFIXES)
    found = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))  # no .git, .cache, ...
        found += [Path(root) / f for f in sorted(files) if Path(f).suffix.lower() in PAGE_SUFFIXES]
    return found


def discover(sources: list[str | Path], recursive: bool = True) -> list[InputFile]:
    """Input files in the order given (folders sorted), each once. Raises InputNotFound for a
    path that does not exist or a pattern that matches nothing."""
    found: dict[Path, InputFile] = {}
    for source in map(str, sources):
        path = Path(source)
        if path.is_dir():
            items = [InputFile(p, p.relative_to(path)) for p in _folder_files(path, recursive)]
        elif path.is_file():
            items = [InputFile(path, PurePath(path.name))]
        elif _is_glob(source):
            base = _glob_base(source)
            matches = sorted(Path(m) for m in glob.glob(source, recursive=True))
            items = [InputFile(m, m.relative_to(base)) for m in matches
                     if m.is_file() and m.suffix.lower() in PAGE_SUFFIXES]
            if not items:
                raise InputNotFound(f"no image or PDF file matches {source}")
        else:
            raise InputNotFound(f"no such file or folder: {source}")
        for item in items:
            found.setdefault(item.path.resolve(), item)
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
