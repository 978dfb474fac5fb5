"""quality_check.py: olmOCR-Bench through the bundle's server and client, scored by olmocr itself.

Three tiers: the paired comparison and the benchmark checks on hand-made inputs (exact
answers); olmocr's scorer on hand-written Markdown, against `python -m olmocr.bench.benchmark`'s
own numbers; and the whole tool against the trained reader's real server, on a benchmark
generated in olmOCR-Bench's layout (scripts/make_bench.py), with a profile that reads and one
that cannot."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import PYTHON, ROOT, server_requests
from ocr_bundle.batch.manifest import ConversionSettings, DocumentOutput
from ocr_bundle.quality.bench import BenchError, candidate_name, load_bench, prepare_score_folder, write_candidate
from ocr_bundle.client import OcrClient, ServerStatus
from ocr_bundle.quality.compare import NotComparable, compare, complete_pairs, percentile, verdict
from ocr_bundle.quality.convert import converted_pages, repeat_folder
from ocr_bundle.quality.profile import check_and_record, server_profile
from ocr_bundle.quality.report import score_table
from ocr_bundle.quality.scoring import MISSING_PAGE, CategoryScore, Score, Outcome
from stand_in import StandIn

sys.path.insert(0, str(ROOT / "scripts"))
import make_bench  # noqa: E402

needs_olmocr = pytest.mark.needs_olmocr


def score_of(results: dict[str, list[bool]]) -> Score:
    """A Score from {category: [passed, ...]} (test ids category_i)."""
    tests = [Outcome(f"{category}_{i}", f"{category}_{i}.pdf", 1, "present", category, passed, "")
             for category, outcomes in results.items() for i, passed in enumerate(outcomes)]
    categories = [CategoryScore(c, len(o), sum(o), 100 * sum(o) / len(o), 0, 100) for c, o in results.items()]
    return Score(sum(c.score for c in categories) / len(categories), 0, 100, categories, tests, 0, [], "test")


# ------------------------------------------------------------------ the comparison: exact answers


def test_a_category_failed_everywhere_is_worse_by_its_whole_score_and_the_overall_by_its_share():
    a = score_of({"text": [True] * 10, "order": [True] * 4})
    b = score_of({"text": [True] * 10, "order": [False] * 4})
    rows = {r.category: r for r in compare(a, b, "bf16", "fp8").rows}
    # Every resample of "order" loses all four tests; "text" never differs.
    assert (rows["order"].delta, rows["order"].low, rows["order"].high) == (-100.0, -100.0, -100.0)
    assert rows["order"].verdict == "worse by 100.0 points"
    assert (rows["text"].delta, rows["text"].low, rows["text"].high) == (0.0, 0.0, 0.0)
    assert rows["text"].verdict == "no worse within the interval"
    assert (rows["overall"].a, rows["overall"].b, rows["overall"].delta) == (100.0, 50.0, -50.0)
    assert (rows["overall"].low, rows["overall"].high, rows["overall"].tests) == (-50.0, -50.0, 14)
    assert [r.category for r in compare(a, b, "bf16", "fp8").worse] == ["order", "overall"]


def test_identical_runs_are_no_worse_and_a_small_difference_stays_inside_its_interval():
    same = score_of({"text": [True, False] * 20})
    assert all(r.verdict == "no worse within the interval" and r.low == r.high == 0
               for r in compare(same, same, "a", "b").rows)
    # One test of forty lost: -2.5 points, far inside the interval a resample gives.
    a = score_of({"text": [True] * 40})
    b = score_of({"text": [True] * 39 + [False]})
    row = compare(a, b, "a", "b").rows[0]
    assert row.delta == -2.5 and row.low < -2.5 and row.high == 0.0
    assert row.verdict == "no worse within the interval"


def test_verdict_and_percentile():
    assert verdict(-3.0, -5.0, -1.0) == "worse by 3.0 points"
    assert verdict(4.0, 1.0, 7.0) == "better by 4.0 points"
    assert verdict(-1.0, -3.0, 1.0) == "no worse within the interval"
    assert percentile([0.0, 10.0, 20.0, 30.0, 40.0], 0.5) == 20.0
    assert percentile([0.0, 10.0], 0.25) == 2.5  # between ranks, as numpy interpolates
    assert percentile([7.0], 0.975) == 7.0


def test_tests_or_categories_in_one_run_only_are_left_out_and_said():
    a = score_of({"text": [True] * 4, "math": [True] * 2})
    b = score_of({"text": [True] * 3})
    comparison = compare(a, b, "a", "b")
    assert [r.category for r in comparison.rows] == ["text", "overall"]
    assert comparison.rows[0].tests == 3
    assert comparison.only_in_one == ["math", "3 test(s) in one run only, e.g. math_0"]


def test_overall_is_reported_with_and_without_headers_footers_as_lighton_publishes_it():
    a = score_of({"text": [True] * 4, "headers_footers": [False] * 2, "tables": [True, False]})
    assert a.overall == 50.0 and a.overall_without() == 75.0
    table = score_table(a)
    assert "overall without headers_footers (LightOn's published 83.2 for LightOnOCR-2-1B is this figure)" in table
    assert re.search(r"overall without headers_footers .*  6 +5 +75\.0", table), table
    b = score_of({"text": [True] * 4, "headers_footers": [True] * 2, "tables": [True, False]})
    rows = {r.category: r for r in compare(a, b, "a", "b").rows}
    assert rows["overall"].delta == pytest.approx(100 / 3) and rows["overall without headers_footers"].delta == 0.0
    assert score_of({"text": [True]}).overall_without() is None  # nothing to leave out
    assert "overall without" not in score_table(score_of({"text": [True]}))


def with_missing_page(score: Score) -> Score:
    """`score` with its first test's page missing, failed as olmocr records a page with no Markdown."""
    return Score(score.overall, score.low, score.high, score.categories,
                 [Outcome(t.id, t.pdf, t.page, t.type, t.category, False, MISSING_PAGE) if i == 0 else t
                  for i, t in enumerate(score.tests)], 1, [], "test")


def test_runs_with_missing_pages_are_compared_only_when_allowed_and_on_what_both_have():
    full = score_of({"text": [True] * 10})
    outage = with_missing_page(score_of({"text": [True] * 10}))
    with pytest.raises(NotComparable, match=r"b: 1 page\(s\) missing .*rerun to complete them"):
        complete_pairs(full, outage, "a", "b", allow_missing=False)
    a, b, note = complete_pairs(full, outage, "a", "b", allow_missing=True)
    assert note == "--allow-missing: comparing 9 of 10 tests, those of the pages both runs converted (1 page(s) left out)"
    assert compare(a, b, "a", "b").rows[0].verdict == "no worse within the interval"  # not "worse": nothing was lost
    assert complete_pairs(full, full, "a", "b", allow_missing=False) == (full, full, None)
    # Nothing (or too little) in common: refused even with --allow-missing.
    empty = score_of({"text": [True] * 10})
    empty = Score(empty.overall, empty.low, empty.high, empty.categories,
                  [Outcome(t.id, t.pdf, t.page, t.type, t.category, False, MISSING_PAGE) for t in empty.tests], 1, [],
                  "test")
    with pytest.raises(NotComparable, match=r"only 0 of 10 tests \(0%\) .*below the 50%"):
        complete_pairs(full, empty, "a", "b", allow_missing=True)


def test_a_page_missing_from_one_repeat_is_a_missing_page(tmp_path: Path):
    """--repeats 3: a page converted in two repeats of three is not scored from two (the scorer's majority
    would read the absent one as a pass or a fail): it is missing, refused unless --allow-missing."""
    make_bench.write_bench(tmp_path / "bench", 2)
    bench = load_bench(tmp_path / "bench")
    settings = ConversionSettings("m", 64, 200, 1540, "PNG")
    run = tmp_path / "run"
    for repeat in (1, 2, 3):
        for index, name in enumerate(bench.pdfs):
            if index == 1 and repeat == 2:
                continue  # the second PDF's page failed in repeat 2
            output, _ = DocumentOutput.open(repeat_folder(run, repeat) / name, *_input(bench, bench.pdf_folder / name),
                                            settings)
            output.describe("pdf", 1)
            output.record_page(1, {"status": "ok"}, f"{name} repeat {repeat}")
    pages, missing = converted_pages(bench, run, repeats=3)
    assert sorted(pages) == [(bench.pdfs[0], 1, repeat) for repeat in (1, 2, 3)]
    assert missing == 3  # the second PDF's page, in each of its three repeats


def cache_info(dtype: str, server: str | None = None) -> str:
    labels = f'block_size="16",cache_dtype="{dtype}"' + (f',worker_addr="{server}"' if server else "")
    return f"vllm:cache_config_info{{{labels}}} 1.0\n"


@pytest.mark.parametrize("fleet, mixed", [(("auto", "auto"), False), (("auto", "fp8"), True)])
def test_behind_a_gateway_every_servers_profile_is_recorded_and_a_mixed_fleet_is_said(fleet, mixed):
    engine_metrics = "".join(cache_info(dtype, f"http://10.0.0.{n}:8000") for n, dtype in enumerate(fleet, 1))

    def gateway(method, path, key):  # SMG: no /metrics on its port; every server's on /engine_metrics
        return (200, engine_metrics, {}) if path == "/engine_metrics" else (404, "", {})

    with StandIn(gateway) as server:
        profile = server_profile(OcrClient(server.url, model="m"), ServerStatus(reachable=True, models=("m",)))
    assert set(profile["servers"]) == {"http://10.0.0.1:8000", "http://10.0.0.2:8000"}
    if mixed:
        assert profile["mixed"] == ("http://10.0.0.1:8000: kv_cache_dtype auto, kv_block_size 16; "
                                    "http://10.0.0.2:8000: kv_cache_dtype fp8, kv_block_size 16")
        assert profile["kv_cache_dtype"] is None
    else:
        assert "mixed" not in profile and profile["kv_cache_dtype"] == "auto" and profile["kv_block_size"] == "16"
    with StandIn(lambda method, path, key: (200, cache_info("fp8"), {}) if path == "/metrics" else (404, "", {})) as one:
        alone = server_profile(OcrClient(one.url, model="m"), ServerStatus(reachable=True, models=("m",)))
    assert alone["kv_cache_dtype"] == "fp8" and "servers" not in alone


def test_a_fleet_growing_between_two_resumes_is_the_same_profile(tmp_path: Path):
    one = {"server": {"kv_cache_dtype": "auto", "servers": {"http://a": {"kv_cache_dtype": "auto"}}}}
    two = {"server": {"kv_cache_dtype": "auto", "servers": {"http://a": {"kv_cache_dtype": "auto"},
                                                           "http://b": {"kv_cache_dtype": "auto"}}}}
    assert check_and_record(tmp_path, one) == [] and check_and_record(tmp_path, two) == []


# ------------------------------------------------------------------ the benchmark folder and the profile


def test_a_folder_that_is_not_a_benchmark_is_refused_with_the_reason(tmp_path: Path):
    with pytest.raises(BenchError, match="no pdfs/ folder"):
        load_bench(tmp_path)
    (tmp_path / "pdfs" / "cat").mkdir(parents=True)
    with pytest.raises(BenchError, match="no PDF in"):
        load_bench(tmp_path)
    (tmp_path / "pdfs" / "cat" / "a.pdf").write_bytes(b"%PDF-1.7\n")
    with pytest.raises(BenchError, match=r"no test file \(\*\.jsonl\)"):
        load_bench(tmp_path)
    (tmp_path / "cat.jsonl").write_text('{"pdf": "cat/b.pdf", "page": 1, "id": "t", "type": "present", "text": "x"}\n')
    with pytest.raises(BenchError, match=r"cat.jsonl line 1 tests 'cat/b.pdf', which is not in"):
        load_bench(tmp_path)
    (tmp_path / "cat.jsonl").write_text('\n{"page": 1}\n')
    with pytest.raises(BenchError, match="cat.jsonl line 2 is not a test"):
        load_bench(tmp_path)
    (tmp_path / "cat.jsonl").write_text('{"pdf": "cat/a.pdf", "page": 1, "id": "t", "type": "present", "text": "x"}\n')
    bench = load_bench(tmp_path)
    assert bench.pdfs == ("cat/a.pdf",) and [p.name for p in bench.test_files] == ["cat.jsonl"]
    assert candidate_name("cat/a.pdf", 3, 2) == "cat/a_pg3_repeat2.md"


def test_the_scorers_folder_links_the_benchmark_and_never_writes_into_it(tmp_path: Path):
    make_bench.write_bench(tmp_path / "bench", 2)
    bench = load_bench(tmp_path / "bench")
    before = sorted(p.relative_to(bench.root) for p in bench.root.rglob("*"))
    score = tmp_path / "out" / "score"
    prepare_score_folder(bench, score)
    prepare_score_folder(bench, score)  # again: the links stay
    assert (score / "pdfs").resolve() == bench.pdf_folder and (score / "lines_text.jsonl").is_symlink()
    write_candidate(score, "a", {("lines/line_01.pdf", 1, 1): "old"})
    write_candidate(score, "a", {("lines/line_02.pdf", 1, 1): "new"})  # derived data: written anew
    assert sorted(p.name for p in (score / "a" / "lines").iterdir()) == ["line_02_pg1_repeat1.md"]
    assert sorted(p.relative_to(bench.root) for p in bench.root.rglob("*")) == before


def test_a_run_folder_keeps_its_profile_and_refuses_another(tmp_path: Path):
    profile = {"server": {"model": "m", "kv_cache_dtype": "auto"}, "client": {"dpi": 200}}
    assert check_and_record(tmp_path, profile) == []
    assert check_and_record(tmp_path, profile) == []  # the same profile resumes
    fp8 = {"server": {"model": "m", "kv_cache_dtype": "fp8"}, "client": {"dpi": 200}}
    assert check_and_record(tmp_path, fp8) == ["server.kv_cache_dtype auto → fp8"]
    assert json.loads((tmp_path / "profile.json").read_text()) == profile  # the earlier one is kept


def test_only_pages_done_under_the_runs_settings_are_scored(tmp_path: Path):
    """The converter keeps pages of other settings (stale) until they are converted again: they
    are not this profile's and must not be scored; a failed page has no Markdown."""
    make_bench.write_bench(tmp_path / "bench", 3)
    bench = load_bench(tmp_path / "bench")
    run = tmp_path / "run"
    sources = [bench.pdf_folder / name for name in bench.pdfs]
    earlier = ConversionSettings("m", 64, 100, 1540, "PNG")
    now = ConversionSettings("m", 64, 200, 1540, "PNG")
    folders = [repeat_folder(run, 1) / name for name in bench.pdfs]
    for folder, source in zip(folders, sources):  # an earlier run at 100 DPI
        output, _ = DocumentOutput.open(folder, *_input(bench, source), earlier)
        output.describe("pdf", 1)
        output.record_page(1, {"status": "ok"}, f"at 100 DPI: {source.name}")
    for index, (folder, source) in enumerate(zip(folders, sources)):  # this run at 200 DPI
        output, _ = DocumentOutput.open(folder, *_input(bench, source), now)
        output.describe("pdf", 1)
        if index == 0:
            output.record_page(1, {"status": "ok"}, "read at 200 DPI")
        elif index == 1:
            output.record_page(1, {"status": "failed", "error": "boom"}, None)  # keeps the 100-DPI text
    pages, missing = converted_pages(bench, run, repeats=1)
    assert pages == {("lines/line_01.pdf", 1, 1): "read at 200 DPI"}
    assert missing == 2


def test_a_grounded_run_scores_the_markdown_of_its_blocks_with_the_chosen_drop(tmp_path: Path):
    from ocr_bundle.quality.convert import ClientSettings

    make_bench.write_bench(tmp_path / "bench", 1)
    bench = load_bench(tmp_path / "bench")
    source = bench.pdf_folder / bench.pdfs[0]
    folder = repeat_folder(tmp_path / "run", 1) / bench.pdfs[0]
    output, _ = DocumentOutput.open(folder, *_input(bench, source), ConversionSettings("m", 64, 200, 1540, "PNG", True))
    output.describe("pdf", 1)
    blocks = ('{"label": "header", "box": [0, 0, 1000, 50], "text": "Running head", "continued": false}\n'
              '{"label": "text", "box": [0, 100, 1000, 900], "text": "The body.", "continued": false}\n')
    output.record_page(1, {"status": "ok", "blocks_file": "pages/0001.blocks.jsonl"}, "Running head\n\nThe body.",
                       {"pages/0001.blocks.jsonl": blocks.encode()})
    kept, _ = converted_pages(bench, tmp_path / "run", repeats=1)
    dropped, _ = converted_pages(bench, tmp_path / "run", repeats=1, drop=frozenset({"header"}))
    assert list(kept.values()) == ["Running head\n\nThe body."] and list(dropped.values()) == ["The body."]
    plain = ClientSettings(64, 200, 0.2, 1)
    assert plain.as_dict() == {"max_tokens": 64, "dpi": 200, "temperature": 0.2, "max_attempts": 1}  # as before
    grounded = ClientSettings(64, 200, 0.1, 1, True, ("footer", "header"))
    assert grounded.as_dict()["drop"] == ("footer", "header") and "--grounding" in grounded.batch_arguments()


def _input(bench, path: Path) -> tuple:
    """A bench PDF as the converter takes it (named relative to the bench's pdfs/ folder) and its snapshot."""
    from pathlib import PurePath

    from ocr_bundle.batch.identity import take
    from ocr_bundle.inputs import InputFile

    return InputFile(path, PurePath(path.relative_to(bench.pdf_folder).as_posix())), take(path)


def run_check(*argv: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, str(ROOT / "quality_check.py"), *argv], capture_output=True, text=True,
                          timeout=600, cwd=ROOT, env=env)


def test_no_benchmark_no_scorer_or_no_server_stop_the_run_before_anything_is_sent(tmp_path: Path):
    missing = run_check(str(tmp_path / "nowhere"))
    assert missing.returncode == 2 and "no such benchmark folder" in missing.stderr
    make_bench.write_bench(tmp_path / "bench", 2)
    without_olmocr = subprocess.run(
        [PYTHON, "-c", "import runpy, sys; sys.modules['olmocr'] = None; "
                       "sys.argv = ['quality_check.py', *sys.argv[1:]]; runpy.run_path('quality_check.py', "
                       "run_name='__main__')", str(tmp_path / "bench"),
         "--url", "http://127.0.0.1:9"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert without_olmocr.returncode == 2
    assert "pip install -r requirements-quality.txt" in without_olmocr.stderr
    assert not (ROOT / "quality-out").exists() and not (tmp_path / "out").exists()


@needs_olmocr
def test_no_server_stops_the_run_before_anything_is_written(tmp_path: Path):
    make_bench.write_bench(tmp_path / "bench", 2)
    done = run_check(str(tmp_path / "bench"), "--url", "http://127.0.0.1:9", "--out", str(tmp_path / "out"))
    assert done.returncode == 2 and "cannot use the vLLM server at http://127.0.0.1:9" in done.stderr
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------ olmocr's scorer on hand-written Markdown


def olmocr_average(score_dir: Path) -> dict[str, float]:
    """The per-candidate Average Score that `python -m olmocr.bench.benchmark` prints itself."""
    done = subprocess.run([PYTHON, "-m", "olmocr.bench.benchmark", "--dir", str(score_dir)], capture_output=True,
                          text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    summary = done.stdout.split("Final Summary")[1]
    return {name: float(value) for name, value in re.findall(r"^(\S+)\s+: Average Score: ([\d.]+)%", summary, re.M)}


@needs_olmocr
def test_scores_match_olmocrs_own_command_and_a_missing_page_fails_its_tests(tmp_path: Path):
    from ocr_bundle.quality.scoring import score_candidate

    lines = make_bench.write_bench(tmp_path / "bench", 4)
    bench = load_bench(tmp_path / "bench")
    score_dir = tmp_path / "score"
    prepare_score_folder(bench, score_dir)
    right = {(f"lines/line_{i + 1:02d}.pdf", 1, 1): line for i, line in enumerate(lines)}
    misread = {**right, ("lines/line_02.pdf", 1, 1): "zzz qqq"}  # its present and order tests fail
    good = score_candidate(write_candidate(score_dir, "good", right), bench)
    poor = score_candidate(write_candidate(score_dir, "poor", misread), bench)
    assert (good.overall, good.missing_pages) == (100.0, 0)
    assert {c.name: (c.passed, c.tests) for c in poor.categories} == {
        "lines_order": (3, 4), "lines_text": (7, 8), "baseline": (4, 4)}
    assert poor.overall == pytest.approx((75.0 + 87.5 + 100.0) / 3) and poor.low <= poor.overall <= poor.high
    assert {t.id for t in poor.tests if not t.passed} == {"line_02_present", "line_02_order"}
    # The numbers are olmOCR-Bench's own: its command on the same folder agrees.
    assert olmocr_average(score_dir) == {"good": pytest.approx(good.overall, abs=0.05),
                                         "poor": pytest.approx(poor.overall, abs=0.05)}

    # A page the conversion did not produce fails every test of it (olmocr's command refuses to
    # score such a candidate at all: "FAILED (errors)"), and is counted.
    del misread[("lines/line_04.pdf", 1, 1)]
    missing = score_candidate(write_candidate(tmp_path / "other", "missing", misread), bench)
    assert missing.missing_pages == 1 and missing.errors == []
    assert {c.name: (c.passed, c.tests) for c in missing.categories} == {
        "lines_order": (2, 4), "lines_text": (5, 8), "baseline": (3, 4)}
    assert {t.id for t in missing.tests if not t.passed} == {
        "line_02_present", "line_02_order", "line_04_present", "line_04_absent", "line_04_order",
        "lines/line_04.pdf_baseline"}


# ------------------------------------------------------------------ the whole tool, against the reader's server


@pytest.fixture(scope="module")
def mini_bench(tmp_path_factory: pytest.TempPathFactory) -> Path:
    bench = tmp_path_factory.mktemp("mini-bench")
    make_bench.write_bench(bench, 24)
    return bench


@needs_olmocr
def test_the_reader_passes_the_mini_bench_and_a_resolution_it_cannot_read_is_found_worse(reader_server, mini_bench,
                                                                                        tmp_path: Path):
    out = tmp_path / "quality"
    common = ["--url", reader_server.url, "--out", str(out), "--max-tokens", "32", "--quiet"]
    good = run_check(str(mini_bench), "--label", "default", *common)
    assert good.returncode == 0, good.stdout + good.stderr[-3000:]
    results = json.loads((out / "default" / "results.json").read_text())
    score = Score.from_dict(results["score"])
    present = [t for t in score.tests if t.type == "present"]
    assert len(present) == 24 and sum(t.passed for t in present) / len(present) >= 0.95, \
        [t for t in present if not t.passed]
    assert results["server"]["model"] == "lightonocr-reader" and results["server"]["kv_cache_dtype"] == "auto"
    assert results["conversion"]["pages_missing"] == 0 and score.olmocr_version == "0.4.27"
    assert "overall (mean of categories)" in good.stdout and (out / "default" / "report.md").exists()
    # The numbers are olmOCR-Bench's own: its command on the same folder agrees.
    assert olmocr_average(out / "score")["default"] == pytest.approx(score.overall, abs=0.05)

    # At 100 DPI a line is 14 px high: the reader cannot read it.
    blurred = run_check(str(mini_bench), "--label", "dpi100", "--dpi", "100", "--compare", str(out / "default"),
                        *common)
    print(blurred.stdout)
    assert blurred.returncode == 1, blurred.stdout + blurred.stderr[-3000:]
    comparison = json.loads((out / "comparison.json").read_text())
    rows = {row["category"]: row for row in comparison["rows"]}
    assert rows["overall"]["high"] < 0 and rows["overall"]["b"] < rows["overall"]["a"] - 30
    assert "overall" in comparison["worse"] and "lines_order" in comparison["worse"]
    assert re.search(r"^overall .* worse by \d+\.\d points$", blurred.stdout, re.M)
    assert "| verdict |" in (out / "comparison.md").read_text()


@needs_olmocr
def test_two_servers_in_one_run_resume_and_a_changed_profile_is_refused(reader_server, mini_bench, tmp_path: Path):
    """--compare-url: both servers converted and scored (here the same reader twice, greedy: two
    equal profiles). A rerun sends nothing; the same folder with other settings is refused."""
    out = tmp_path / "quality"
    common = [str(mini_bench), "--url", reader_server.url, "--compare-url", reader_server.url, "--label", "a",
              "--compare-label", "b", "--out", str(out), "--max-tokens", "32", "--temperature", "0", "--quiet"]
    first = run_check(*common, "--repeats", "2")
    assert first.returncode == 0, first.stdout + first.stderr[-3000:]
    rows = json.loads((out / "comparison.json").read_text())["rows"]
    assert rows and all(row["verdict"] == "no worse within the interval" for row in rows)
    assert len(list((out / "score" / "b" / "lines").glob("*_repeat2.md"))) == 24
    sent = server_requests(reader_server.url)
    again = run_check(*common, "--repeats", "2")
    assert again.returncode == 0 and "24 done before, 0 to convert" in again.stderr
    assert server_requests(reader_server.url) == sent
    changed = run_check(*common, "--repeats", "2", "--max-tokens", "16")
    assert changed.returncode == 2 and "client.max_tokens 32 → 16" in changed.stderr
    assert server_requests(reader_server.url) == sent
