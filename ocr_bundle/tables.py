"""Tables of already formatted cells: aligned for a terminal, or Markdown for a report.

Standard library only. The stress test's report and the quality check's both print theirs
through here, so the two look alike.
"""

from __future__ import annotations


def aligned(header: list[str], body: list[list[str]], left: int = 0) -> str:
    """Columns padded to their widest cell, a rule under the header; the first `left` columns
    are aligned left (names), the others right (numbers)."""
    widths = [max(len(cell) for cell in column) for column in zip(header, *body)]

    def line(cells: list[str]) -> str:
        return "  ".join(c.ljust(w) if i < left else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    return "\n".join([line(header), line(["-" * w for w in widths])] + [line(r) for r in body])


def markdown(header: list[str], body: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in body]
    return "\n".join(out)
