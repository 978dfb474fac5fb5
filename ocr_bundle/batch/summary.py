"""The batch converter's run summary (run-summary.json) and its lines on the terminal.

Like the stress test, it says what the client itself cost per page (render time in the
worker processes, CPU of the sending threads) and whether that could have limited the
measured rate.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import resource
from pathlib import Path

from ..headroom import headroom_verdict
from .attempts import PageStats
from .pipeline import BatchConverter
from .scan import Document

# Lists of pages in the summary are capped; every page is in its document's manifest anyway.
LISTED = 200


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def client_cost(stats: list[PageStats], render_workers: int, pages_per_s: float, concurrency: int) -> dict:
    """Per-page client cost and the rate it could sustain, against the measured rate.

    Waiting for a prepared page only counts after the first `concurrency` pages: those
    wait for the pipeline to fill (and the workers to start) whatever the render speed."""
    render = _mean([s.render_wall_s for s in stats if s.render_wall_s])
    render_cpu = _mean([s.render_cpu_s for s in stats if s.render_cpu_s])
    send_cpu = _mean([s.send_cpu_s for s in stats])
    wait = _mean([s.render_wait_s for s in stats[concurrency:]])
    latency = _mean([s.latency_s for s in stats if s.latency_s])
    render_capacity = render_workers / render if render else None
    send_capacity = 1 / send_cpu if send_cpu else None  # the sending threads share one core (the GIL)
    capacities = [c for c in (render_capacity, send_capacity) if c]
    waited = bool(wait and latency and wait > 0.05 * latency)
    verdict = headroom_verdict(min(capacities) if capacities else None, pages_per_s, waited=waited,
                               remedy="more --render-workers, or --encoding JPEG")
    ms = lambda value: round(value * 1000, 2) if value is not None else None  # noqa: E731
    return {"render_workers": render_workers, "render_ms_per_page": ms(render), "render_cpu_ms_per_page": ms(render_cpu),
            "render_wait_ms_per_page": ms(wait), "send_cpu_ms_per_page": ms(send_cpu),
            "render_capacity_pages_per_s": render_capacity, "send_capacity_pages_per_s": send_capacity,
            "verdict": verdict}


def run_summary(converter: BatchConverter, documents: list[Document], *, started_at: str, scan_s: float, ended: str,
                server: str, vllm_version: str | None, args: dict) -> dict:
    counts = converter.counts
    converted = counts.ok + counts.flagged
    in_scope = sum(len(d.pages) for d in documents)
    todo = sum(len(d.todo) for d in documents)
    pages_per_s = converted / converter.convert_s if converter.convert_s > 0 else 0.0
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime
    client = client_cost(counts.stats, converter.options.render_workers, pages_per_s,
                         converter.options.concurrency)
    client["process_cpu_s"] = round(cpu_s, 2)
    client["process_cpu_ms_per_page"] = round(1000 * cpu_s / len(counts.stats), 2) if counts.stats else None
    client["peak_rss_mib"] = round(own.ru_maxrss / 1024, 1)  # the converter itself (Linux: KiB)
    return {
        "started_at": started_at,
        "finished_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "ended": ended,
        "server": server,
        "vllm_version": vllm_version,
        "settings": converter.settings.as_dict(),
        "options": {k: _plain(v) for k, v in dataclasses.asdict(converter.options).items()},
        "arguments": {k: _plain(v) for k, v in args.items()},
        "documents": len(documents),
        "pages": {"in_scope": in_scope, "skipped": in_scope - todo, "to_convert": todo, "ok": counts.ok,
                  "flagged": counts.flagged, "failed": counts.failed,
                  "pending": sum(len(d.pending()) for d in documents)},
        "requests": counts.requests,
        "scan_s": round(scan_s, 3),
        "convert_s": round(converter.convert_s, 3),
        "pages_per_s": round(pages_per_s, 3),
        "client": client,
        "unreadable": [{"source": str(d.source.path), "error": d.error} for d in documents if d.error],
        "held": [{"source": str(d.source.path), "by": d.held_by} for d in documents if d.held_by],
        "disk_full": converter.disk_full,
        "pending_pages": [{"source": str(d.source.path), "page": page} for d in documents
                          for page in d.pending()][:LISTED],
        "faults": list(converter.faults),
        "render_crashes": converter.pool.crashes,
        "failed_pages": sorted(counts.failures, key=_where)[:LISTED],
        "flagged_pages": sorted(counts.flags, key=_where)[:LISTED],
    }


def _plain(value: object) -> object:
    """A value as JSON holds it: paths as text, sets as sorted lists."""
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    return value


def _where(item: dict) -> tuple:
    return item["source"], item["page"]


def summary_lines(summary: dict) -> list[str]:
    pages = summary["pages"]
    lines = [
        "",
        f"pages: {pages['ok'] + pages['flagged']} converted ({pages['ok']} ok, {pages['flagged']} flagged), "
        f"{pages['failed']} failed, {pages['skipped']} done before, {pages['pending']} pending"
        + (f"; {len(summary['unreadable'])} unreadable file(s)" if summary["unreadable"] else ""),
        f"time: {summary['convert_s']:.1f} s converting ({summary['pages_per_s']:.2f} pages/s, "
        f"{summary['requests']} requests), {summary['scan_s']:.1f} s reading the inputs",
    ]
    client = summary["client"]
    if client.get("render_ms_per_page") is not None:
        lines.append(f"client: {client['render_ms_per_page']:.0f} ms to prepare a page "
                     f"({client['render_workers']} worker(s)), {client['send_cpu_ms_per_page']:.1f} ms CPU to send it; "
                     f"{client['verdict']}")
    for item in summary["unreadable"]:
        lines.append(f"  unreadable: {item['source']}: {item['error']}")
    for item in summary["held"]:
        lines.append(f"  skipped: {item['source']}: being converted by {item['by']}")
    for fault in summary["faults"]:
        lines.append(f"  internal error: {fault}")
    if summary["pending_pages"]:
        shown = summary["pending_pages"][:10]
        lines.append(f"  pending ({pages['pending']}): " + ", ".join(f"{Path(i['source']).name} page {i['page']}"
                                                                       for i in shown)
                     + (" …" if pages["pending"] > len(shown) else ""))
    for item in summary["failed_pages"]:
        lines.append(f"  failed: {item['source']} page {item['page']}: {item['error']}")
    for item in summary["flagged_pages"][:20]:
        lines.append(f"  flagged: {item['source']} page {item['page']}: {item['flag']}")
    if len(summary["flagged_pages"]) > 20:
        lines.append(f"  … {len(summary['flagged_pages']) - 20} more flagged (see run-summary.json and the manifests)")
    return lines
