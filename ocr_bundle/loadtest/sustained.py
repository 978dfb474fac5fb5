"""The sustained rate of a stress-test level: pages answered per second with every slot busy.

Standard library only: benchmarks/waves.py recomputes it from a saved results.json with any python3.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class Answer(Protocol):
    """What the rate needs of a request: a RequestResult (ocr_bundle.loadtest.replay), or a saved one."""

    ok: bool
    start_s: float
    end_s: float


def sustained_rate(results: Sequence[Answer], concurrency: int) -> dict | None:
    """Pages answered per second while every slot was busy and arrivals had spread: from the first
    answer to a page sent once every slot was taken (after the ramp's `concurrency` first sends) to
    the last send (after it the run drains with fewer in flight). Answers before that first one
    belong to pages sent during the ramp, while fewer were in flight: a server whose pages slow as
    it fills answers those late, after the ramp ends, so counting from the ramp's end read 8-14% under
    the server's rate (tests: a server of known capacity). The rate of a run of identical pages sent
    at once is not this: they are answered in waves (benchmarks/waves.py). None without two answers inside."""
    if len(results) <= concurrency:
        return None
    by_start = sorted(results, key=lambda r: r.start_s)
    window_start = min(r.end_s for r in by_start[concurrency:])
    window_end = by_start[-1].start_s
    answered = [r for r in results if r.ok and window_start < r.end_s <= window_end]
    if window_end <= window_start or len(answered) < 2:
        return None
    return {"pages_per_s": len(answered) / (window_end - window_start), "pages": len(answered),
            "window_s": [window_start, window_end]}
