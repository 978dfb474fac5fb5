#!/usr/bin/env python3
"""Does a serving profile keep accuracy? olmOCR-Bench (or any folder in its layout) through the
bundle's own server and client, scored by olmOCR-Bench's own code.

    python quality_check.py olmOCR-bench/bench_data --label bf16                      # one profile
    python quality_check.py olmOCR-bench/bench_data --label fp8 --url http://127.0.0.1:8001 \\
        --compare quality-out/bf16                                                   # against an earlier run
    python quality_check.py olmOCR-bench/bench_data --label bf16 --compare-url http://127.0.0.1:8001 \\
        --compare-label fp8                                                          # two servers, one run
    python quality_check.py mini-bench --label dpi100 --dpi 100 --compare quality-out/default   # a client setting

Every PDF is converted with batch_ocr.py (the page preparation, client, retries and resumable
output users get), once per --repeats, into OUT/LABEL/convert/; the pages go into the scorer's
layout in OUT/score/LABEL/ and are scored by the `olmocr` package (pip install -r
requirements-quality.txt): per category (one JSONL file each) and overall (the mean of the
categories, olmOCR-Bench's headline number), with its bootstrap intervals. OUT/LABEL/ gets
results.json (every test) and report.md; a comparison gets OUT/comparison.json and .md, paired
test by test, with a verdict per category: "no worse within the interval", "worse by X points"
or "better by X points".

A profile is the server's side (model, weights, vLLM version, context length, KV-cache dtype
and block size, as the server reports them) and the client's (--max-tokens, --dpi,
--temperature, --max-attempts). Rerun the same command to resume; a run into a LABEL folder
made under another profile is refused (give each profile its own --label).

The overall score is reported with and without the headers_footers category: LightOn's
published figure for LightOnOCR-2-1B (83.2) leaves it out (the model keeps all visible text
by design, the category's tests ask for headers and footers to be dropped).

A comparison needs both runs complete: a page that failed or was never converted (an
outage, a server restarting) is not an accuracy loss, so comparing runs with missing pages
is refused (exit 2: rerun to complete them) unless --allow-missing, which compares only the
tests of pages both runs converted and says how many. Behind a gateway, every server's
profile is read from the gateway's /engine_metrics and recorded; a fleet of mixed profiles
is refused (a run measures one profile).

Exit status: 0 scored (and, in a comparison, no category worse); 1 a comparison found the
second profile worse; 2 the run cannot start (no benchmark, no scorer, no server, a label
taken by another profile, a mixed fleet) or cannot be compared (pages missing);
130 interrupted (rerun to resume). Precedence: flags > environment
(VLLM_URL, VLLM_API_KEY, VLLM_MODEL) > defaults.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import sys
from pathlib import Path

from ocr_bundle.client import OcrClient, ServerUnusable, connect
from ocr_bundle.grounding import parse_drop
from ocr_bundle.quality.bench import PDFS, Bench, BenchError, load_bench, prepare_score_folder, write_candidate
from ocr_bundle.quality.compare import NotComparable, compare, complete_pairs
from ocr_bundle.quality.convert import ClientSettings, convert_repeat, converted_pages
from ocr_bundle.quality.profile import check_and_record, server_profile
from ocr_bundle.quality.report import (comparison_table, conversion_note, describe_run, score_table, scorer_warning,
                                       write_comparison, write_results)
from ocr_bundle.quality.scoring import OlmocrMissing, Score, olmocr_modules, score_candidate
from ocr_bundle.settings import (add_conversion_arguments, add_server_arguments, api_key_from_env, flag_type,
                                 positive_int)

SCORE_FOLDER = "score"
LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def label(text: str) -> str:
    if not LABEL.fullmatch(text) or text in (SCORE_FOLDER, PDFS):
        raise argparse.ArgumentTypeError(f"{text!r}: a label is a folder name (letters, digits, . _ -), "
                                         f"not {SCORE_FOLDER!r} or {PDFS!r}")
    return text


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("bench", type=Path, help="the benchmark folder (olmOCR-Bench's bench_data, or one like it)")
    parser.add_argument("--out", type=Path, default=Path("quality-out"), help="output folder (default ./quality-out)")
    parser.add_argument("--label", type=label, default="default",
                        help="this profile's name and folder (default 'default')")
    add_server_arguments(parser)
    parser.add_argument("--compare-url", default=None,
                        help="a second server (another profile) converted and scored in the same run, then compared")
    parser.add_argument("--compare-label", type=label, default="compare",
                        help="the second server's label (default 'compare')")
    parser.add_argument("--compare", type=Path, default=None, metavar="RESULTS",
                        help="an earlier run to compare with: its results.json or its label folder")
    parser.add_argument("--grounding", action="store_true",
                        help="convert in LightOnOCR-3's grounding mode; the Markdown scored is made from the blocks")
    parser.add_argument("--drop", type=flag_type(parse_drop), default=frozenset(), metavar="LABELS",
                        help="with --grounding: blocks left out of the Markdown scored, e.g. header,footer,page_number "
                             "(the headers_footers tests ask for that)")
    parser.add_argument("--allow-missing", action="store_true",
                        help="compare runs that have pages missing (failed or not converted), on the tests of the "
                             "pages both converted; without it such a comparison is refused (exit 2)")
    parser.add_argument("--repeats", type=positive_int, default=1,
                        help="conversions per page (default 1); a test passes when most of its repeats pass. With "
                             "sampled decoding, 3 or more measure the sampling's spread too")
    add_conversion_arguments(parser)  # batch_ocr.py's own page settings, handed to it
    parser.add_argument("--concurrency", type=positive_int, default=64,
                        help="requests in flight per server (default 64; 256 saturates one H200)")
    parser.add_argument("--quiet", action="store_true", help="the converter logs lines instead of a progress bar")
    return parser


def fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


def load_earlier(path: Path, bench: Bench) -> dict:
    """An earlier run's results, checked to be of the same benchmark."""
    path = path / "results.json" if path.is_dir() else path
    try:
        earlier = json.loads(path.read_text(encoding="utf-8"))
        earlier_bench = earlier["bench"]
        Score.from_dict(earlier["score"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise BenchError(f"--compare {path}: not the results of a quality check ({type(exc).__name__}: {exc})") from exc
    if earlier_bench["fingerprint"] != bench.fingerprint():
        raise BenchError(f"--compare {path}: that run scored another benchmark ({earlier_bench['path']}, "
                         f"{earlier_bench['pdfs']} PDFs); compare runs of the same one")
    return earlier


def run_profile(args: argparse.Namespace, bench: Bench, name: str, client: OcrClient, server: dict,
                settings: ClientSettings) -> dict | int:
    """Convert, score and report one profile: its results, or the exit status that ends the run."""
    run = args.out / name
    statuses = []
    for repeat in range(1, args.repeats + 1):
        print(f"[quality] {name}: converting {len(bench.pdfs)} PDFs through {client.base_url} "
              f"(repeat {repeat} of {args.repeats})", file=sys.stderr, flush=True)
        status = convert_repeat(bench, run, repeat, client, settings, args.concurrency, args.quiet)
        if status in (2, 130):
            return status
        statuses.append(status)
    pages, missing = converted_pages(bench, run, args.repeats, frozenset(settings.drop))
    score_dir = args.out / SCORE_FOLDER
    prepare_score_folder(bench, score_dir)
    candidate = write_candidate(score_dir, name, pages)
    print(f"[quality] {name}: scoring with olmocr", file=sys.stderr, flush=True)
    score = score_candidate(candidate, bench)
    results = {
        "label": name, "url": client.base_url,
        "created_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "bench": {"path": str(bench.root), "pdfs": len(bench.pdfs), "tests": len(score.tests),
                  "fingerprint": bench.fingerprint()},
        "server": server, "client": settings.as_dict(), "repeats": args.repeats,
        "conversion": {"pages_missing": missing, "converter_exit_status": statuses},
        "score_folder": str(score_dir), "score": score.as_dict(),
        "overall_without_headers_footers": score.overall_without(),
    }
    write_results(run, results)
    return results


def print_results(results: dict) -> None:
    score = Score.from_dict(results["score"])
    print(f"\n{describe_run(results)}")
    print(score_table(score))
    for note in (conversion_note(results), scorer_warning(score)):
        if note:
            print(f"note: {note}")
    print(f"results: {Path(results['score_folder']).parent / results['label'] / 'results.json'}")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        bench = load_bench(args.bench)
        olmocr_modules()  # before a single page is converted
        earlier = load_earlier(args.compare, bench) if args.compare else None
    except (BenchError, OlmocrMissing) as exc:
        return fail(str(exc))
    if args.drop and not args.grounding:
        return fail("--drop leaves grounded blocks out: add --grounding")
    if args.compare_url and args.compare:
        return fail("--compare-url and --compare each give the run a second profile: use one")
    names = [(args.label, args.url)] + ([(args.compare_label, args.compare_url)] if args.compare_url else [])
    if len({name for name, _ in names}) < len(names) or (earlier and earlier["label"] == args.label):
        return fail("each profile needs its own label: give this run another --label than "
                    + (f"the earlier run's ({earlier['label']!r})" if earlier else "--compare-label"))
    profiles = []
    for name, url in names:  # every server checked before anything is converted
        try:
            client, status = connect(url, api_key_from_env(), args.model, ca_cert=args.ca_cert)
        except ServerUnusable as exc:
            return fail(str(exc))
        # Each server's model family samples its own way, unless --temperature says otherwise.
        temperature = status.family(client.model()).temperature if args.temperature is None else args.temperature
        settings = ClientSettings(args.max_tokens, args.dpi, temperature, args.max_attempts, args.grounding,
                                  tuple(sorted(args.drop)))
        if args.grounding and status.family(client.model()).grounding != "blocks":
            return fail(f"--grounding needs a LightOnOCR-3 model: {url} serves {client.model()}")
        server = server_profile(client, status)
        if server.get("mixed"):
            return fail(f"{url} is a gateway to servers of different profiles ({server['mixed']}): a quality run "
                        "measures one profile; check one server at a time, or make the fleet alike")
        if changed := check_and_record(args.out / name, {"server": server, "client": settings.as_dict()}):
            return fail(f"{args.out / name} holds a run of another profile ({'; '.join(changed)}): give this one "
                        "another --label (or --out), or delete that folder to start it over")
        profiles.append((name, client, server, settings))

    runs = [earlier] if earlier else []
    try:
        for name, client, server, settings in profiles:
            results = run_profile(args, bench, name, client, server, settings)
            if isinstance(results, int):
                return results
            print_results(results)
            runs.append(results)
    except KeyboardInterrupt:
        print("interrupted: every page converted so far is kept; rerun the same command to resume", file=sys.stderr)
        return 130
    if len(runs) < 2:
        return 0
    a, b = runs
    try:
        score_a, score_b, note = complete_pairs(Score.from_dict(a["score"]), Score.from_dict(b["score"]),
                                                a["label"], b["label"], args.allow_missing)
    except NotComparable as exc:
        print(f"error: not compared: {exc}", file=sys.stderr)
        return 2
    if note:
        print(note)
    comparison = compare(score_a, score_b, a["label"], b["label"])
    write_comparison(args.out, comparison, a, b)
    print(f"\n{b['label']} against {a['label']} (paired, the interval is that of the difference):")
    print(comparison_table(comparison))
    if comparison.only_in_one:
        print("not in both runs (left out): " + "; ".join(comparison.only_in_one))
    print(f"comparison: {args.out / 'comparison.md'}")
    return 1 if comparison.worse else 0


if __name__ == "__main__":
    sys.exit(main())
