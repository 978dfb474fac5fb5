"""Two scores of the same benchmark side by side: per category and overall, the difference and
whether it is beyond chance.

The comparison is paired: both profiles ran the very same tests, so the interval is that of
the difference, resampled test by test (within each category; overall as the mean of the
categories, as olmOCR-Bench scores). That is tighter than comparing two separate intervals,
which overlap long after a difference is real. Verdicts, from the interval of B - A in points:
entirely below zero "worse by X points", entirely above "better by X points", otherwise "no
worse within the interval". Standard library only (a seeded `random.Random`), so it is exact
and repeatable for hand-made inputs (tests/test_quality.py).
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass

from .scoring import Score

OVERALL = "overall"


@dataclass(frozen=True)
class Difference:
    category: str
    tests: int  # tests both runs have
    a: float  # percent passed
    b: float
    delta: float  # b - a, points
    low: float  # interval of the delta, points
    high: float
    verdict: str


@dataclass(frozen=True)
class Comparison:
    a_label: str
    b_label: str
    rows: list[Difference]  # the categories, then "overall"
    only_in_one: list[str]  # categories (or tests) one run has and the other has not

    @property
    def worse(self) -> list[Difference]:
        return [row for row in self.rows if row.high < 0]

    def as_dict(self) -> dict:
        return {**asdict(self), "worse": [row.category for row in self.worse]}


def verdict(delta: float, low: float, high: float) -> str:
    if high < 0:
        return f"worse by {-delta:.1f} points"
    if low > 0:
        return f"better by {delta:.1f} points"
    return "no worse within the interval"


def percentile(sorted_values: list[float], share: float) -> float:
    """Linear interpolation between the closest ranks (numpy's default)."""
    position = share * (len(sorted_values) - 1)
    below = int(position)
    above = min(below + 1, len(sorted_values) - 1)
    return sorted_values[below] + (sorted_values[above] - sorted_values[below]) * (position - below)


def difference(category: str, tests: int, a: float, b: float, draws: list[float], tail: float) -> Difference:
    ordered = sorted(draws)
    low, high = percentile(ordered, tail), percentile(ordered, 1 - tail)
    return Difference(category, tests, a, b, b - a, low, high, verdict(b - a, low, high))


def compare(a: Score, b: Score, a_label: str, b_label: str, n_bootstrap: int = 1000, level: float = 0.95,
            seed: int = 0) -> Comparison:
    rng = random.Random(seed)
    by_id_a = {t.id: t for t in a.tests}
    by_id_b = {t.id: t for t in b.tests}
    shared = [i for i in by_id_a if i in by_id_b]
    only = sorted(set(by_id_a) ^ set(by_id_b))
    categories = list(dict.fromkeys(by_id_a[i].category for i in shared))
    rows: list[Difference] = []
    resampled: list[list[float]] = []  # per category, its bootstrap deltas in draw order
    tail = (1 - level) / 2
    for category in categories:
        pairs = [(float(by_id_a[i].passed), float(by_id_b[i].passed))
                 for i in shared if by_id_a[i].category == category]
        diffs = [y - x for x, y in pairs]
        n = len(diffs)
        draws = [100 * sum(rng.choices(diffs, k=n)) / n for _ in range(n_bootstrap)]
        resampled.append(draws)
        rows.append(difference(category, n, 100 * sum(x for x, _ in pairs) / n, 100 * sum(y for _, y in pairs) / n,
                               draws, tail))
    if rows:
        # Overall: the mean of the categories' deltas, each category resampled on its own (draw k
        # of every category makes overall draw k).
        overall_draws = [sum(draws[k] for draws in resampled) / len(resampled) for k in range(n_bootstrap)]
        rows.append(difference(OVERALL, sum(r.tests for r in rows), sum(r.a for r in rows) / len(rows),
                               sum(r.b for r in rows) / len(rows), overall_draws, tail))
    missing_categories = sorted({t.category for t in a.tests} ^ {t.category for t in b.tests})
    return Comparison(a_label, b_label, rows, missing_categories + (
        [f"{len(only)} test(s) in one run only, e.g. {only[0]}"] if only else []))
