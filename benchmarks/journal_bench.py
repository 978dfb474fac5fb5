#!/usr/bin/env python3
"""What recording one finished page costs the converter, by document length: the page journal
(one appended, fsynced line) against the manifest rewritten whole after every page (before
issue 36). No server: the converter's own bookkeeping, on the disk holding --dir.

    python benchmarks/journal_bench.py                       # 1,000, 5,000 and 20,000 pages
    python benchmarks/journal_bench.py --pages 1000 --dir /mnt/shared/tmp

Per length, "journal": every page recorded through DocumentOutput.record_page (its page file,
then its journal line), timed per page, wall and CPU of the recording thread (the CPU is what
holds the GIL, against the sending threads); then the compaction at the document's end and a
no-op reopen. "whole manifest": the manifest of that many pages written atomically and fsynced
(what every page cost before), timed over a few rewrites at that length.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ocr_bundle.batch.locking import DocumentLock  # noqa: E402
from ocr_bundle.batch.manifest import ConversionSettings, DocumentOutput, file_sha256  # noqa: E402
from ocr_bundle.files import atomic_write_json  # noqa: E402
from ocr_bundle.tables import markdown  # noqa: E402

SETTINGS = ConversionSettings("lightonai/LightOnOCR-2-1B", 4096, 200, 1540, "PNG")
PAGE_TEXT = ("A line of a converted page, as long as the ones a real page gives. " * 30)[:2000]


def record(page: int) -> dict:
    """A page's record as the converter writes it."""
    return {"status": "ok", "attempts": 1, "finish_reason": "stop", "flag": None, "temperature": 0.2,
            "prompt_tokens": 2123, "completion_tokens": 611, "latency_s": 41.234, "image_size": [1089, 1540],
            "error": None, "attempt_log": None}


def ms(values: list[float]) -> str:
    return f"{1000 * statistics.mean(values):.2f}"


def journal_run(root: Path, pages: int) -> dict:
    source = root / f"doc{pages}.pdf"
    source.write_bytes(b"%PDF-1.7 stand-in " + str(pages).encode())
    folder = root / f"out{pages}"
    output, _ = DocumentOutput.open(folder, source, file_sha256(source), SETTINGS, DocumentLock.acquire(folder))
    output.describe("pdf", pages)
    wall, cpu = [], []
    for page in range(1, pages + 1):
        started, started_cpu = time.perf_counter(), time.thread_time()
        output.record_page(page, record(page), PAGE_TEXT)
        wall.append(time.perf_counter() - started)
        cpu.append(time.thread_time() - started_cpu)
    started = time.perf_counter()
    output.close()
    compact_s = time.perf_counter() - started
    started = time.perf_counter()
    again, _ = DocumentOutput.open(folder, source, file_sha256(source), SETTINGS, DocumentLock.acquire(folder))
    reopen_s = time.perf_counter() - started
    assert len(again.done_pages()) == pages
    again.close()
    tenth = max(1, pages // 10)
    return {"pages": pages, "wall_ms": ms(wall), "cpu_ms": ms(cpu), "first_tenth_ms": ms(wall[:tenth]),
            "last_tenth_ms": ms(wall[-tenth:]), "compact_s": f"{compact_s:.2f}", "reopen_s": f"{reopen_s:.2f}"}


def whole_manifest_run(root: Path, pages: int, rewrites: int = 5) -> dict:
    manifest = {"format": 2, "source": "/corpus/doc.pdf", "settings": SETTINGS.as_dict(), "kind": "pdf",
                "page_count": pages, "pages": {str(p): {**record(p), "file": f"pages/{p:05d}.md"}
                                               for p in range(1, pages + 1)}}
    wall, cpu = [], []
    for _ in range(rewrites):
        started, started_cpu = time.perf_counter(), time.thread_time()
        atomic_write_json(root / f"manifest{pages}.json", manifest, durable=True)
        wall.append(time.perf_counter() - started)
        cpu.append(time.thread_time() - started_cpu)
    size = (root / f"manifest{pages}.json").stat().st_size
    return {"wall_ms": ms(wall), "cpu_ms": ms(cpu), "bytes": size}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pages", type=int, nargs="+", default=[1000, 5000, 20000])
    parser.add_argument("--dir", type=Path, default=None, help="where to write (default: a temporary folder)")
    args = parser.parse_args()
    body = []
    with tempfile.TemporaryDirectory(dir=args.dir) as scratch:
        for pages in args.pages:
            root = Path(scratch) / str(pages)
            root.mkdir()
            journal = journal_run(root, pages)
            whole = whole_manifest_run(root, pages)
            body.append([f"{pages:,}", whole["wall_ms"], whole["cpu_ms"], f"{whole['bytes'] / 1e6:.1f} MB",
                         journal["wall_ms"], journal["cpu_ms"], journal["first_tenth_ms"], journal["last_tenth_ms"],
                         journal["compact_s"], journal["reopen_s"]])
            print(f"[journal_bench] {pages} pages done", file=sys.stderr, flush=True)
    print(markdown(["pages in the document", "before: ms/page (wall)", "before: ms/page (CPU)", "manifest size",
                    "journal: ms/page (wall)", "journal: ms/page (CPU)", "first tenth (wall)", "last tenth (wall)",
                    "compaction s", "no-op reopen s"], body))
    return 0


if __name__ == "__main__":
    sys.exit(main())
