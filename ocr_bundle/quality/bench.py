"""A benchmark folder in olmOCR-Bench's layout, and the candidate folders its scorer reads.

    BENCH/pdfs/<category>/<name>.pdf       the pages (single-page PDFs in the real benchmark)
    BENCH/<category>.jsonl                 the unit tests: {"pdf": "<category>/<name>.pdf", "page": 1, "type": ...}

A candidate (one serving profile) is a folder beside pdfs/ holding one Markdown file per
page and repeat, named `<category>/<name>_pg<page>_repeat<r>.md`. The user's benchmark
folder is never written to: the scorer's folder is built in the run's output (`score/`),
with links to the benchmark's PDFs and test files, so `python -m olmocr.bench.benchmark
--dir OUT/score` scores it too.

Standard library only.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from ..files import atomic_write_text

PDFS = "pdfs"


class BenchError(Exception):
    """The folder is not a benchmark this tool can run; the message says why."""


@dataclass(frozen=True)
class Bench:
    root: Path
    pdfs: tuple[str, ...]  # relative to root/pdfs, as the tests name them ("lines/line_01.pdf")
    test_files: tuple[Path, ...]  # the JSONL files: one category each

    @property
    def pdf_folder(self) -> Path:
        return self.root / PDFS

    def fingerprint(self) -> str:
        """What a comparison must share: the same tests over the same PDFs (names and bytes)."""
        digest = hashlib.sha256()
        for path in sorted(self.test_files):
            digest.update(path.name.encode() + b"\0" + path.read_bytes())
        for name in self.pdfs:
            digest.update(name.encode() + b"\0" + str((self.pdf_folder / name).stat().st_size).encode())
        return digest.hexdigest()[:16]


def load_bench(root: Path) -> Bench:
    """The benchmark at `root`, checked: its PDFs, its test files, every test naming a PDF that is there."""
    if not root.is_dir():
        raise BenchError(f"no such benchmark folder: {root}")
    pdf_folder = root / PDFS
    if not pdf_folder.is_dir():
        raise BenchError(f"{root} has no {PDFS}/ folder: it is not in olmOCR-Bench's layout "
                         f"(BENCH/{PDFS}/<category>/<name>.pdf and BENCH/<category>.jsonl)")
    pdfs = tuple(sorted(p.relative_to(pdf_folder).as_posix() for p in pdf_folder.rglob("*.pdf") if p.is_file()))
    if not pdfs:
        raise BenchError(f"no PDF in {pdf_folder}")
    test_files = tuple(sorted(p for p in root.glob("*.jsonl") if p.is_file()))
    if not test_files:
        raise BenchError(f"no test file (*.jsonl) in {root}")
    known = set(pdfs)
    for path in test_files:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if not line.strip():
                continue
            try:
                pdf = json.loads(line)["pdf"]
            except (ValueError, KeyError, TypeError) as exc:
                raise BenchError(f"{path.name} line {number} is not a test ({type(exc).__name__}: {exc})") from exc
            if pdf not in known:
                raise BenchError(f"{path.name} line {number} tests {pdf!r}, which is not in {pdf_folder}")
    return Bench(root.resolve(), pdfs, test_files)


def candidate_name(pdf: str, page: int, repeat: int) -> str:
    """The scorer's file name for one page and repeat: lines/line_01.pdf → lines/line_01_pg1_repeat1.md."""
    return f"{os.path.splitext(pdf)[0]}_pg{page}_repeat{repeat}.md"


def prepare_score_folder(bench: Bench, score_dir: Path) -> None:
    """The scorer's folder: links to the benchmark's PDFs and test files (candidates go beside them)."""
    score_dir.mkdir(parents=True, exist_ok=True)
    links = {PDFS: bench.pdf_folder, **{path.name: path for path in bench.test_files}}
    for name, target in links.items():
        link = score_dir / name
        if link.is_symlink() or link.exists():
            if link.is_symlink() and Path(os.readlink(link)) == target:
                continue
            link.unlink()
        link.symlink_to(target)


def write_candidate(score_dir: Path, label: str, pages: dict[tuple[str, int, int], str]) -> Path:
    """One profile's Markdown in the scorer's layout, from {(pdf, page, repeat): text}. The folder
    is derived data (the conversion keeps the pages) and is written anew each time."""
    folder = score_dir / label
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    for (pdf, page, repeat), text in pages.items():
        atomic_write_text(folder / candidate_name(pdf, page, repeat), text)
    return folder
