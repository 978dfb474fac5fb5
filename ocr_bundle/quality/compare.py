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

from .scoring import HEADERS_FOOTERS, Score

OVERALL = "overall"
OVERALL_WITHOUT = f"overall without {HEADERS_FOOTERS}"  # the figure LightOn publishes


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


# With --allow-missing, the share of tests both runs must have for their comparison to say anything.
MIN_COMMON_SHARE = 0.5


class NotComparable(Exception):
    """Two runs that cannot be compared as they are (pages missing); the message says what to do."""


def complete_pairs(a: Score, b: Score, a_label: str, b_label: str, allow_missing: bool) -> tuple[Score, Score, str | None]:
    """The two scores to compare, and a note when tests were left out. A page that failed or was
    never converted (an outage) is not an accuracy loss: runs with missing pages are refused
    (NotComparable) unless `allow_missing`, which keeps only the tests of pages both converted."""
    missing = {a_label: a.missing(), b_label: b.missing()}
    if not any(missing.values()):
        return a, b, None
    if not allow_missing:
        raise NotComparable("; ".join(f"{label}: {len(pages)} page(s) missing (failed or not converted)"
                                      for label, pages in missing.items() if pages)
                            + ": rerun to complete them (a missing page is not an accuracy loss), or "
                              "--allow-missing to compare only the pages both runs converted")
    left_out = set().union(*missing.values())
    kept_a, kept_b = a.without_pages(left_out), b.without_pages(left_out)
    share = len(kept_a.tests) / len(a.tests) if a.tests else 0.0
    if share < MIN_COMMON_SHARE:
        raise NotComparable(f"--allow-missing: only {len(kept_a.tests)} of {len(a.tests)} tests ({share:.0%}) are of "
                            f"pages both runs converted, below the {MIN_COMMON_SHARE:.0%} a comparison needs: rerun "
                            "to complete them")
    return kept_a, kept_b, (f"--allow-missing: comparing {len(kept_a.tests)} of {len(a.tests)} tests, those of the "
                            f"pages both runs converted ({len(left_out)} page(s) left out)")


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
    categories_rows = list(rows)
    # Overall: the mean of the categories' deltas, each category resampled on its own (draw k of
    # every category makes overall draw k); and the same without headers/footers.
    for name, kept in ((OVERALL, categories), (OVERALL_WITHOUT, [c for c in categories if c != HEADERS_FOOTERS])):
        if not kept or (name == OVERALL_WITHOUT and len(kept) == len(categories)):
            continue
        chosen = [i for i, category in enumerate(categories) if category in kept]
        overall_draws = [sum(resampled[i][k] for i in chosen) / len(chosen) for k in range(n_bootstrap)]
        picked = [categories_rows[i] for i in chosen]
        rows.append(difference(name, sum(r.tests for r in picked), sum(r.a for r in picked) / len(picked),
                               sum(r.b for r in picked) / len(picked), overall_draws, tail))
    missing_categories = sorted({t.category for t in a.tests} ^ {t.category for t in b.tests})
    return Comparison(a_label, b_label, rows, missing_categories + (
        [f"{len(only)} test(s) in one run only, e.g. {only[0]}"] if only else []))
