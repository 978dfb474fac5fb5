#!/usr/bin/env python3
"""Write a small benchmark in olmOCR-Bench's layout that the tests' trained reader can pass.

    python scripts/make_bench.py --out mini-bench                   # 24 one-line PDFs and their tests
    python quality_check.py mini-bench --url http://127.0.0.1:8000  # scored through the reader's server

The layout is olmOCR-Bench's (what `quality_check.py` and `python -m olmocr.bench.benchmark`
read): BENCH/pdfs/lines/line_01.pdf ..., and one JSONL file per category, each line one of the
scorer's unit tests:
- lines_text.jsonl: per page, its line is there (`present`) and another page's line is not (`absent`);
- lines_order.jsonl: per page, its first word comes before its last (`order`).
Every test holds for the true text. The lines come from the reader's held-out set
(scripts/train_reader.py: never trained on), with at least two words each, rendered the way
the reader was trained, one per page of a PDF whose page is the picture at 200 DPI, which the
converter renders back pixel for pixel. Random weights fail it; the trained reader passes it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import train_reader  # noqa: E402
from make_pdf import jpeg_of, pictures_pdf  # noqa: E402

CATEGORY = "lines"


def bench_lines(count: int) -> list[str]:
    """`count` held-out lines of two or more words, the first and last words different and of two
    characters or more (so that an order test means something), no line inside another."""
    chosen: list[str] = []
    for line in train_reader.held_out_lines(40 * count):
        words = line.split()
        if (len(line) >= 8 and len(words) >= 2 and words[0] != words[-1] and min(len(words[0]), len(words[-1])) >= 2
                and not any(line in other or other in line for other in chosen)):
            chosen.append(line)
        if len(chosen) == count:
            return chosen
    raise ValueError(f"the held-out set has fewer than {count} usable lines")


def tests_for(lines: list[str]) -> dict[str, list[dict]]:
    """The scorer's tests, per category file, for PDFs named like write_bench names them."""
    text, order = [], []
    for index, line in enumerate(lines):
        pdf = f"{CATEGORY}/line_{index + 1:02d}.pdf"
        other = lines[(index + 1) % len(lines)]
        words = line.split()
        text.append({"pdf": pdf, "page": 1, "id": f"line_{index + 1:02d}_present", "type": "present", "text": line})
        text.append({"pdf": pdf, "page": 1, "id": f"line_{index + 1:02d}_absent", "type": "absent", "text": other})
        order.append({"pdf": pdf, "page": 1, "id": f"line_{index + 1:02d}_order", "type": "order",
                      "before": words[0], "after": words[-1]})
    return {f"{CATEGORY}_text": text, f"{CATEGORY}_order": order}


def write_bench(out: Path, count: int = 24) -> list[str]:
    """The benchmark folder: PDFs and JSONL test files. Returns the lines, in PDF order."""
    lines = bench_lines(count)
    pdfs = out / "pdfs" / CATEGORY
    pdfs.mkdir(parents=True, exist_ok=True)
    for index, line in enumerate(lines):
        (pdfs / f"line_{index + 1:02d}.pdf").write_bytes(pictures_pdf([jpeg_of(train_reader.render_line(line), 95)]))
    for category, tests in tests_for(lines).items():
        (out / f"{category}.jsonl").write_text("".join(json.dumps(test) + "\n" for test in tests))
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="the benchmark folder to write")
    parser.add_argument("--pages", type=int, default=24, help="how many one-line PDFs (default 24)")
    args = parser.parse_args(argv)
    lines = write_bench(args.out, args.pages)
    print(f"wrote {args.out}: {len(lines)} PDFs in pdfs/{CATEGORY}/, {3 * len(lines)} tests in "
          f"{CATEGORY}_text.jsonl and {CATEGORY}_order.jsonl")
    return 0


if __name__ == "__main__":
    sys.exit(main())
