"""Score one candidate folder with olmOCR-Bench's own code (the `olmocr` package), per test.

The tests are loaded and run by olmocr itself (`load_tests`, `evaluate_candidate`: every
test against every repeat of its page, passed when most repeats pass), and the confidence
intervals are its bootstrap (`calculate_bootstrap_ci`). What this module adds is the
bookkeeping `python -m olmocr.bench.benchmark` does in its `main()` and does not return:
a baseline test for each PDF that has none, the score of a category (a JSONL file) as its
share of tests passed, the overall score as the mean of the categories' scores, and the
overall interval resampled within each category. tests/test_quality.py checks the result
against that command's own output for the same folder.

olmocr is an optional dependency (requirements-quality.txt); without it, `OlmocrMissing`
says how to install it.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import io
import random
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from .bench import Bench

MISSING_PAGE = "Missing MD files"  # what olmocr's evaluate_candidate records for a page with no Markdown
# LightOn's published olmOCR-Bench scores (83.2 for LightOnOCR-2-1B) leave this category out: its
# tests ask for headers and footers to be dropped, and the model keeps all visible text by design.
HEADERS_FOOTERS = "headers_footers"
LIGHTON_PUBLISHED = "LightOn's published 83.2 for LightOnOCR-2-1B is this figure"
BASELINE = "baseline"  # the category olmocr puts the baseline tests it adds into


class OlmocrMissing(ImportError):
    pass


@dataclass(frozen=True)
class Outcome:
    id: str
    pdf: str
    page: int
    type: str
    category: str
    passed: bool
    explanation: str


@dataclass(frozen=True)
class CategoryScore:
    name: str
    tests: int
    passed: int
    score: float  # percent of its tests passed
    low: float  # bootstrap interval, percent
    high: float


@dataclass(frozen=True)
class Score:
    overall: float  # percent: the mean of the categories' scores (olmOCR-Bench's headline number)
    low: float
    high: float
    categories: list[CategoryScore]
    tests: list[Outcome]
    missing_pages: int  # pages the conversion produced no Markdown for: their tests failed
    errors: list[str]  # anything else olmocr reported (a test that could not run, ...)
    olmocr_version: str

    def as_dict(self) -> dict:
        return asdict(self)

    def overall_without(self, category: str = HEADERS_FOOTERS) -> float | None:
        """The mean of the other categories (None when `category` is not scored, or is all there is)."""
        others = [c.score for c in self.categories if c.name != category]
        if len(others) == len(self.categories) or not others:
            return None
        return sum(others) / len(others)

    def missing(self) -> set[tuple[str, int]]:
        """(pdf, page) of every page the conversion gave no Markdown (failed or never converted)."""
        return {(t.pdf, t.page) for t in self.tests if t.explanation == MISSING_PAGE}

    def without_pages(self, pages: set[tuple[str, int]]) -> Score:
        """The same score with the tests of `pages` left out (for a paired comparison of what both have)."""
        return replace(self, tests=[t for t in self.tests if (t.pdf, t.page) not in pages])

    def by_type(self) -> dict[str, tuple[int, int]]:
        """{test type: (passed, tests)}, types sorted."""
        kinds = sorted({t.type for t in self.tests})
        return {kind: (sum(t.passed for t in self.tests if t.type == kind), sum(t.type == kind for t in self.tests))
                for kind in kinds}

    @classmethod
    def from_dict(cls, data: dict) -> Score:
        return cls(**{**data, "categories": [CategoryScore(**c) for c in data["categories"]],
                      "tests": [Outcome(**t) for t in data["tests"]]})


def olmocr_modules():
    """olmocr's benchmark modules, or OlmocrMissing with the install line."""
    try:
        return (importlib.import_module("olmocr.bench.benchmark"), importlib.import_module("olmocr.bench.tests"),
                importlib.import_module("olmocr.bench.utils"))
    except ImportError as exc:
        raise OlmocrMissing(f"scoring needs olmOCR-Bench's scorer, the olmocr package ({exc}): "
                            "pip install -r requirements-quality.txt") from exc


def olmocr_version() -> str:
    try:
        return importlib.metadata.version("olmocr")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def load_bench_tests(bench: Bench) -> list[tuple[object, str]]:
    """(test, category) for every test of the benchmark, plus olmocr's baseline test for each
    PDF without one (as its benchmark command adds them, last)."""
    _, tests_module, _ = olmocr_modules()
    loaded: list[tuple[object, str]] = []
    with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()):  # its loader's progress bar, per file
        for path in bench.test_files:
            # Its loader returns a file's tests in the order its threads finished: sorted here, so
            # that the seeded bootstrap draws the same intervals every time.
            loaded += sorted(((test, path.stem) for test in tests_module.load_tests(str(path))), key=lambda t: t[0].id)
    with_baseline = {test.pdf for test, _ in loaded if test.type == BASELINE}
    for pdf in bench.pdfs:
        if pdf not in with_baseline:
            loaded.append((tests_module.BaselineTest(id=f"{pdf}_baseline", pdf=pdf, page=1, type=BASELINE), BASELINE))
    return loaded


def score_candidate(folder: Path, bench: Bench, n_bootstrap: int = 1000, seed: int = 0) -> Score:
    """Run every test of `bench` on the Markdown in `folder` (the scorer's layout, bench.py)."""
    benchmark, _, utils = olmocr_modules()
    loaded = load_bench_tests(bench)
    category_of = {test.id: category for test, category in loaded}
    tests = [test for test, _ in loaded]
    outcome: dict[str, tuple[bool, str]] = {}
    errors: list[str] = []
    pending = tests
    for _ in range(5):
        # force=True: a PDF without Markdown fails its tests instead of failing the whole candidate.
        _, _, found, _, _, _, results = benchmark.evaluate_candidate(str(folder), pending, list(bench.pdfs), True)
        errors += found
        outcome.update({t.id: (passed, why) for pages in results.values() for runs in pages.values()
                        for t, passed, why in runs})
        # Its threads fill one dict of dicts unlocked, so a result can be lost: run those tests again.
        pending = [t for t in pending if t.id not in outcome]
        if not pending:
            break
    else:
        raise RuntimeError(f"olmocr recorded no result for {len(pending)} test(s), e.g. {pending[0].id}")
    rows = [Outcome(t.id, t.pdf, t.page, t.type, category_of[t.id], bool(outcome[t.id][0]), outcome[t.id][1] or "")
            for t in tests]
    missing = {(r.pdf, r.page) for r in rows if r.explanation == MISSING_PAGE}
    other_errors = [e for e in dict.fromkeys(errors) if "missing MD repeats" not in e]

    import numpy as np  # olmocr's own requirement; its bootstrap draws from numpy's global generator

    np.random.seed(seed)
    random.seed(seed)
    categories, flat, splits = [], [], []
    for name in dict.fromkeys(r.category for r in rows):  # the command's order: first seen first
        scores = [1.0 if r.passed else 0.0 for r in rows if r.category == name]
        low, high = utils.calculate_bootstrap_ci(scores, n_bootstrap=n_bootstrap)
        categories.append(CategoryScore(name, len(scores), int(sum(scores)), 100 * sum(scores) / len(scores),
                                        100 * low, 100 * high))
        flat += scores
        splits.append(len(scores))
    low, high = utils.calculate_bootstrap_ci(flat, n_bootstrap=n_bootstrap, splits=splits)
    overall = sum(c.score for c in categories) / len(categories)
    return Score(overall, 100 * low, 100 * high, categories, rows, len(missing), other_errors, olmocr_version())
