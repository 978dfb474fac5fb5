"""The quality check's tables and reports, rendered from the same dicts its JSON files hold.

    <label>/results.json   one profile: where it ran, its settings, scores per category and test
    <label>/report.md      the same, for people
    comparison.json / .md  two profiles side by side: deltas, intervals, verdicts
"""

from __future__ import annotations

from pathlib import Path

from ..files import atomic_write_json, atomic_write_text
from ..tables import aligned, markdown
from .compare import Comparison
from .scoring import HEADERS_FOOTERS, LIGHTON_PUBLISHED, Score

FAILURES_LISTED = 20


def score_rows(score: Score) -> tuple[list[str], list[list[str]]]:
    header = ["category", "tests", "passed", "score %", "95% interval"]
    body = [[c.name, str(c.tests), str(c.passed), f"{c.score:.1f}", f"[{c.low:.1f}, {c.high:.1f}]"]
            for c in score.categories]
    body.append(["overall (mean of categories)", str(sum(c.tests for c in score.categories)),
                 str(sum(c.passed for c in score.categories)), f"{score.overall:.1f}",
                 f"[{score.low:.1f}, {score.high:.1f}]"])
    without = score.overall_without(HEADERS_FOOTERS)
    if without is not None:
        kept = [c for c in score.categories if c.name != HEADERS_FOOTERS]
        body.append([f"overall without {HEADERS_FOOTERS} ({LIGHTON_PUBLISHED})", str(sum(c.tests for c in kept)),
                     str(sum(c.passed for c in kept)), f"{without:.1f}", ""])
    return header, body


def comparison_rows(comparison: Comparison) -> tuple[list[str], list[list[str]]]:
    header = ["category", "tests", f"{comparison.a_label} %", f"{comparison.b_label} %", "delta", "95% interval",
              "verdict"]
    body = [[r.category, str(r.tests), f"{r.a:.1f}", f"{r.b:.1f}", f"{r.delta:+.1f}", f"[{r.low:+.1f}, {r.high:+.1f}]",
             r.verdict] for r in comparison.rows]
    return header, body


def type_line(score: Score) -> str:
    """Pass rates by kind of test, as olmOCR-Bench's command prints them."""
    return "by test type: " + ", ".join(f"{kind} {passed}/{total}" for kind, (passed, total) in score.by_type().items())


def score_table(score: Score) -> str:
    return aligned(*score_rows(score), left=1) + "\n" + type_line(score)


def comparison_table(comparison: Comparison) -> str:
    return aligned(*comparison_rows(comparison), left=1)


def describe_run(results: dict) -> str:
    server, client = results["server"], results["client"]
    return (f"{results['label']}: {results['url']}, model {server['model']} (vLLM {server['vllm']}, KV cache "
            f"{server['kv_cache_dtype']}), max_tokens {client['max_tokens']}, {client['dpi']} DPI, temperature "
            f"{client['temperature']}, {results['repeats']} repeat(s); {results['bench']['pdfs']} PDFs")


def conversion_note(results: dict) -> str | None:
    missing = results["conversion"]["pages_missing"]
    if not missing:
        return None
    return (f"{missing} page(s) have no Markdown (failed or not converted): their tests count as failed; rerun the "
            "same command to convert them")


def scorer_warning(score: Score) -> str | None:
    """Tests the scorer could not run (they count as failed), with the usual cause when it is known."""
    if not score.errors:
        return None
    text = f"{len(score.errors)} test(s) could not run and count as failed, e.g.: {score.errors[0][:200]}"
    if any("playwright" in error.lower() or "executable doesn't exist" in error.lower() for error in score.errors):
        text += (" (the math tests render LaTeX in Playwright's Chromium: `python -m playwright install chromium`, "
                 "once, on a machine with network)")
    return text


def markdown_report(results: dict) -> str:
    score = Score.from_dict(results["score"])
    parts = [f"# Quality check: {results['label']}", "", describe_run(results), "",
             markdown(*score_rows(score)), "", type_line(score) + ".", "",
             f"Scored by olmocr {score.olmocr_version} (olmOCR-Bench's own tests); intervals are its bootstrap "
             f"(95%). Scorer's folder: `{results['score_folder']}` "
             f"(`python -m olmocr.bench.benchmark --dir {results['score_folder']}` scores it the same way)."]
    for note in (conversion_note(results), scorer_warning(score)):
        if note:
            parts += ["", f"**{note}**"]
    failed = [t for t in score.tests if not t.passed]
    if failed:
        parts += ["", f"## Failed tests ({len(failed)}; the first {min(len(failed), FAILURES_LISTED)})", "",
                  markdown(["test", "page", "type", "why"],
                           [[t.id, f"{t.pdf} p{t.page}", t.type, (t.explanation or "").replace("|", "\\|")[:160]]
                            for t in failed[:FAILURES_LISTED]])]
    if score.errors:
        parts += ["", "## Scorer errors", ""] + [f"- {error}" for error in score.errors[:FAILURES_LISTED]]
    return "\n".join(parts) + "\n"


def comparison_markdown(comparison: Comparison, a: dict, b: dict) -> str:
    parts = [f"# Quality: {comparison.b_label} against {comparison.a_label}", "",
             f"- A: {describe_run(a)}", f"- B: {describe_run(b)}", "",
             markdown(*comparison_rows(comparison)), "",
             "Paired over the same tests: the interval is that of B - A, resampled test by test within each "
             "category (overall: the mean of the categories)."]
    if comparison.only_in_one:
        parts += ["", "Not in both runs (left out): " + "; ".join(comparison.only_in_one)]
    return "\n".join(parts) + "\n"


def write_results(folder: Path, results: dict) -> None:
    atomic_write_json(folder / "results.json", results)
    atomic_write_text(folder / "report.md", markdown_report(results))


def write_comparison(out: Path, comparison: Comparison, a: dict, b: dict) -> None:
    atomic_write_json(out / "comparison.json", {"a": a["label"], "b": b["label"], **comparison.as_dict()})
    atomic_write_text(out / "comparison.md", comparison_markdown(comparison, a, b))
