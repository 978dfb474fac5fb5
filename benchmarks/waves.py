#!/usr/bin/env python3
"""How much of a saturation run was saturated: the waves inside a stress test's results.json.

    python3 benchmarks/waves.py docs/benchmarks/h200-2026-12-03-v034-rounds/*-c256/results.json

A run of N identical pages at concurrency C (the benchmarks' 384 at 256) starts its first C
requests together: they are encoded and prefilled together, decode together and end together,
and the last N - C start as those end and finish with fewer than C in flight. Its pages/s
(N over the whole run) is then a mix of a cold first wave and a drain, not the rate of a server
kept at C pages in flight, which is what a long conversion sees. Per level this prints the
run's pages/s, the first wave's own rate (C pages over the time its last one ended), and the
drain: the share of the run after the last request started, and how many were in flight 5 s
before the end. Where the run had a stretch with every slot busy after spread sends
(stress_test.py --ramp, or any run at c=1) it adds that sustained rate, by the stress test's own
rule (ocr_bundle.loadtest.sustained): that recomputes it for reports saved before the rule's
window was corrected (2026-12-03).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ocr_bundle.loadtest.sustained import sustained_rate  # noqa: E402  (standard library only)


def in_flight(requests: list[dict], at: float) -> int:
    return sum(1 for r in requests if r["start_s"] <= at < r["end_s"])


def waves(results: dict) -> list[dict]:
    """One row per concurrency level of a results.json (stress_test.py's: levels, requests)."""
    rows = []
    for level in results["levels"]:
        concurrency = level["concurrency"]
        sent = [r for r in results["requests"] if r["concurrency"] == concurrency]
        done = [r for r in sent if r.get("ok")]
        if len(done) < concurrency:  # no full first wave to speak of
            continue
        ends = sorted(r["end_s"] for r in done)
        last_start, last_end = max(r["start_s"] for r in done), ends[-1]
        rows.append({
            "concurrency": concurrency,
            "pages": len(done),
            "pages_per_s": level["pages_per_s"],
            "first_wave_pages_per_s": concurrency / ends[concurrency - 1],
            "drain_share": (last_end - last_start) / last_end,
            "in_flight_5s_before_end": in_flight(done, last_end - 5.0),
            "sustained": sustained_rate([SimpleNamespace(**r) for r in sent], concurrency),
        })
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="+", type=Path, help="results.json files of stress_test.py")
    args = parser.parse_args(argv)
    for path in args.results:
        try:
            rows = waves(json.loads(path.read_text()))
        except (OSError, ValueError, KeyError) as error:
            print(f"{path}: not a stress test's results.json ({error})", file=sys.stderr)
            return 2
        name = path.parent.name if path.name == "results.json" else path.stem  # a report's folder, or a copy's name
        for row in rows:
            print(f"{name}: c={row['concurrency']} {row['pages']} pages, {row['pages_per_s']:.2f} pages/s; "
                  f"first wave {row['first_wave_pages_per_s']:.2f} pages/s; drain {row['drain_share']:.0%} of the run, "
                  f"{row['in_flight_5s_before_end']} in flight 5 s before the end"
                  + (f"; sustained {row['sustained']['pages_per_s']:.2f} pages/s over {row['sustained']['pages']} pages"
                     if row["sustained"] else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
