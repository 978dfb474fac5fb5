"""Prometheus text (what vLLM's and the gateway's /metrics answer), read once for the whole bundle.

The stress test's pollers, the quality check's serving profile and the membership keeper's
drain all read metrics through `samples()` and `fold()`. Standard library only: the keeper runs
with the system's python3. Text that is not Prometheus exposition raises ValueError, so a
caller can drop one bad source and keep the others.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

_SAMPLE = re.compile(r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)(?:\s+-?\d+)?\s*$")
_LABEL = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(?:,|$)')
_ESCAPES = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


@dataclass(frozen=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float


def _labels(text: str, line: str) -> dict[str, str]:
    labels, position = {}, 0
    while position < len(text):
        match = _LABEL.match(text, position)
        if match is None:
            raise ValueError(f"not Prometheus text: bad labels in {line[:120]!r}")
        labels[match[1]] = re.sub(r"\\[\\\"n]", lambda m: _ESCAPES[m[0]], match[2])
        position = match.end()
    return labels


def samples(text: str) -> Iterator[Sample]:
    """Every sample of an exposition; ValueError on a line that is not one."""
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if match is None:
            raise ValueError(f"not Prometheus text: {line[:120]!r}")
        try:
            value = float(match["value"])
        except ValueError:
            raise ValueError(f"not Prometheus text: bad value in {line[:120]!r}") from None
        yield Sample(match["name"], _labels(match["labels"] or "", line), value)


def fold(text: str, wanted: dict[str, Callable[[list[float]], float]]) -> dict[str, float]:
    """The wanted metrics, each one's series (one per engine and label set) folded with its reducer."""
    found: dict[str, list[float]] = {}
    for sample in samples(text):
        if sample.name in wanted:
            found.setdefault(sample.name, []).append(sample.value)
    return {name: wanted[name](values) for name, values in found.items()}
