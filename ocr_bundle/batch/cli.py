"""Convert folders of PDFs and scans into Markdown through the vLLM server: resumable, loop-safe.

    python batch_ocr.py scans/                              # every PDF and image below scans/ → ./ocr-out/
    python batch_ocr.py report.pdf 'archive/**/*.tif' --out converted/
    python batch_ocr.py book.pdf --pages 1,3-5,100-         # some pages of a PDF
    python batch_ocr.py scans/ --concurrency 256            # a dedicated GPU: more pages in flight
    python batch_ocr.py scans/ --quiet >> convert.log       # log lines instead of a progress bar
    python batch_ocr.py corpus/ --shard 2/3 --out shared/   # machine 2 of 3: its third of corpus/
    python batch_ocr.py --status shared/ corpus/            # is every page of every file of corpus/ done?

Per input file, a folder in --out named like it (scans/a.pdf → OUT/scans/a.pdf/) with
pages/0001.md… (one Markdown file per page), the assembled <name>.md and manifest.json
(per page: status, attempts, finish_reason, tokens, latency, image size, error); and
run-summary.json for the run. PDFs and multi-page TIFFs are documents of many pages, any
other image one page. Pages are prepared like the page and the stress test do it (200 DPI,
longest edge 1540 px, EXIF orientation, RGB), in worker processes, while up to
--concurrency requests are in flight.

Rerun the same command to resume: pages already done are skipped; pages of a changed file
or done under other settings (model, --max-tokens, --dpi, --encoding) are converted again,
and --force converts every page again. Finished work is never thrown away: an earlier
page stays (marked in <name>.md) until a new conversion at least as good replaces it (ok
over flagged over failed), <name>.md always holds every page of the document, and a file
that cannot be read on a rerun keeps its output. Ctrl-C stops admitting pages, lets pages
in flight finish (up to --drain-timeout), writes everything and exits 130; a second Ctrl-C
exits at once. Nothing written is ever half a file, even after a kill or a power cut; a
full disk stops the run at once (free space and rerun).

Many converters, one corpus: --shard K/N takes the K-th of N deterministic parts of the
inputs (by path relative to the arguments: the same on every machine), so N machines
convert a corpus with no coordinator, into one shared output tree or each its own. Each
document folder is locked by the process reading or converting it: a run that finds a
document held by another live converter skips it (exit 1; rerun later to finish it) and
never waits.
--status OUT reports every document under OUT, exit 0 only when every page is done.

A reply cut at max_tokens or ending in a loop is retried at a higher temperature
(0.2, 0.4, 0.6, 0.8 with --max-attempts 4); the best attempt is kept and the page flagged
in its manifest if none finished cleanly.

Exit status: 0 every page converted; 1 a page still pending at the end (the server went
away, a page in flight past --drain-timeout, a document held by another converter, a full
disk), or failed pages and unreadable files above --max-failed-rate; 2 the run cannot start (no server, a model it does not serve, no
inputs, output not writable); 130 interrupted. Precedence: flags > environment (VLLM_URL,
VLLM_API_KEY, VLLM_MODEL) > defaults.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import sys
import threading
import time
from pathlib import Path

from .manifest import MANIFEST, ConversionSettings, is_output_folder
from .options import BatchOptions
from .pipeline import BatchConverter, Progress
from .scan import Document, scan
from .render_pool import RenderPool
from .status import corpus_status, status_report
from .summary import run_summary, summary_lines
from ..client import OcrClient, ServerStatus, ServerUnusable, connect
from ..files import atomic_write_json, is_disk_full
from ..grounding import parse_drop
from ..inputs import InputFile, InputNotFound, discover, in_shard, parse_page_ranges, parse_shard
from ..interrupts import GracefulInterrupt
from ..progress import progress_bar
from ..settings import (
    PAGE_PROMPT_TOKENS,
    READ_TIMEOUT_S,
    TARGET_LONGEST_EDGE,
    add_conversion_arguments,
    add_server_arguments,
    api_key_from_env,
    flag_type,
    fraction,
    number_at_least_zero,
    positive_int,
    positive_number,
)

SUMMARY = "run-summary.json"
DISK_FULL_ADVICE = "free space and rerun the same command: every page written so far is kept"


def summary_name(shard_of: tuple[int, int] | None) -> str:
    """run-summary.json, or one per shard: shards sharing an output tree keep their own."""
    return SUMMARY if shard_of is None else f"run-summary.shard-{shard_of[0]}-of-{shard_of[1]}.json"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("inputs", nargs="*", metavar="INPUT",
                        help="files, folders (searched recursively) and glob patterns (quote them)")
    parser.add_argument("--out", type=Path, default=Path("ocr-out"), help="output folder (default ./ocr-out)")
    parser.add_argument("--status", type=Path, metavar="OUT", default=None,
                        help="report what is done under the output folder OUT (every shard's) and exit: 0 when every "
                             "page of every document is done; needs no server. With the corpus's INPUTs, files no run "
                             "has started count too (a shard that never ran)")
    parser.add_argument("--shard", type=flag_type(parse_shard), metavar="K/N", default=None,
                        help="convert only the K-th of N parts of the inputs (split by relative path, the same "
                             "on every machine): N converters, one per machine, share a corpus")
    add_server_arguments(parser)
    parser.add_argument("--pages", type=flag_type(parse_page_ranges), default=None,
                        help="PDF pages to convert, e.g. 1,3-5,10- (default: all)")
    parser.add_argument("--concurrency", type=positive_int, default=64,
                        help="requests in flight (default 64; 256 reaches the saturation of one H200, "
                             "docs/benchmarks.md)")
    parser.add_argument("--render-workers", type=positive_int, default=max(1, min(8, (os.cpu_count() or 2) - 1)),
                        help="processes preparing pages (default: CPU cores - 1, at most 8)")
    add_conversion_arguments(parser)
    parser.add_argument("--encoding", choices=("PNG", "JPEG"), default="PNG", help="page encoding sent (default PNG)")
    parser.add_argument("--max-file-mb", type=positive_number, default=1024,
                        help="skip files larger than this many MB (10^6 bytes; default 1024)")
    parser.add_argument("--grounding", action="store_true",
                        help="LightOnOCR-3's grounding mode: per page, its layout blocks with boxes "
                             "(pages/NNNN.blocks.jsonl), its pictures cut out (pages/NNNN-K-image.png) and Markdown "
                             "made from them; a grounding run never reuses plain pages, nor the reverse")
    parser.add_argument("--drop", type=flag_type(parse_drop), default=frozenset(), metavar="LABELS",
                        help="with --grounding: blocks left out of the assembled <name>.md, e.g. "
                             "header,footer,page_number (default: keep everything; the blocks files keep them all)")
    parser.add_argument("--force", action="store_true", help="convert every page again, even those already done")
    parser.add_argument("--redo-flagged", action="store_true",
                        help="also convert again the pages flagged in earlier runs (cut or looping)")
    parser.add_argument("--timeout", type=positive_number, default=READ_TIMEOUT_S,
                        help=f"seconds allowed per request (default {READ_TIMEOUT_S:g})")
    parser.add_argument("--server-wait", type=number_at_least_zero, default=180.0,
                        help="how long to wait for a server that stopped answering before ending the run "
                             "(default 180: a restart on a GPU takes 2-3 minutes)")
    parser.add_argument("--drain-timeout", type=number_at_least_zero, default=60.0,
                        help="after Ctrl-C, seconds pages in flight may take to finish (default 60)")
    parser.add_argument("--max-failed-rate", type=fraction, default=0.0,
                        help="exit 1 when failed pages and unreadable files exceed this fraction (default 0)")
    parser.add_argument("--quiet", action="store_true", help="log lines (one per document) instead of a progress bar")
    return parser


# ------------------------------------------------------------------ progress


class BarProgress(Progress):
    """A tqdm bar: pages done/total, pages/s, ETA, failures."""

    def __init__(self, total: int, already_done: int):
        self._lock = threading.Lock()
        self.failed = self.flagged = 0
        self.bar = progress_bar(total, "page", "converting",
                                postfix=f"failed=0, flagged=0, done before={already_done}")
        self.already_done = already_done

    def page(self, status: str) -> None:
        with self._lock:
            self.failed += status == "failed"
            self.flagged += status == "flagged"
            self.bar.set_postfix_str(f"failed={self.failed}, flagged={self.flagged}, done before={self.already_done}",
                                     refresh=False)
            self.bar.update(1)

    def message(self, text: str) -> None:
        self.bar.write(f"[batch] {text}", file=sys.stderr)

    def close(self) -> None:
        self.bar.close()


class LogProgress(Progress):
    """--quiet: a line per finished document and one a minute, for logs."""

    def __init__(self, total: int):
        self.total = total
        self.done = 0
        self.start = time.monotonic()
        self.last = self.start
        self._lock = threading.Lock()

    def page(self, status: str) -> None:
        with self._lock:
            self.done += 1

    def document(self, document: Document, path: Path) -> None:
        records = document.output.manifest["pages"]
        statuses = [records.get(str(page), {}).get("status", "pending") for page in document.pages]
        counts = ", ".join(f"{statuses.count(s)} {s}" for s in ("ok", "flagged", "failed", "pending")
                           if statuses.count(s))
        print(f"[batch] {document.source.relative}: {counts} → {path}", flush=True)

    def tick(self) -> None:
        now = time.monotonic()
        if now - self.last >= 60 and self.done:
            self.last = now
            rate = self.done / (now - self.start)
            eta = (self.total - self.done) / rate if rate else float("inf")
            print(f"[batch] {self.done}/{self.total} pages, {rate:.2f} pages/s, ETA {eta:.0f} s", flush=True)

    def message(self, text: str) -> None:
        print(f"[batch] {text}", flush=True)

    def close(self) -> None:
        pass


# ------------------------------------------------------------------ run


def fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


def check_writable(out: Path) -> str | None:
    """Why the output folder cannot be written, or None."""
    check = out / f".write-check-{os.getpid()}"  # its own name: two converters may start at once
    try:
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_json(check, {})
        check.unlink()
    except OSError as exc:
        return f"cannot write to the output folder {out}: {exc.strerror or exc}"
    return None


def not_an_input(out: Path):
    """Folders never taken as inputs: the output folder (`batch_ocr.py . ` must not convert its own crops)
    and any folder of converted output (it holds a bundle manifest), wherever they are."""
    out_real = os.path.realpath(out)

    def skip(folder: Path) -> str | None:
        if os.path.realpath(folder) == out_real:
            return "the output folder"
        if is_output_folder(folder):
            return f"converted output (its {MANIFEST} is the converter's)"
        return None

    return skip


def report_status(out: Path, inputs: list[str]) -> int:
    """--status OUT [INPUTS]: every document under OUT; with the corpus's inputs, those no run has started too."""
    if not out.is_dir():
        return fail(f"no such output folder: {out}")
    try:
        corpus = discover(inputs, recursive=True, skip_folder=not_an_input(out)) if inputs else []
    except InputNotFound as exc:
        return fail(str(exc))
    report, complete = status_report(out, corpus_status(out, corpus))
    print(report)
    return 0 if complete else 1


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.status is not None:
        return report_status(args.status, args.inputs)
    if not args.inputs:
        parser.error("the following arguments are required: INPUT")
    started_at = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    if args.drop and not args.grounding:
        return fail("--drop leaves grounded blocks out: add --grounding")
    if not 0 <= args.max_failed_rate <= 1:
        return fail("--max-failed-rate is a fraction between 0 and 1")
    notes: list[str] = []
    try:
        inputs = discover(args.inputs, recursive=True, skip_folder=not_an_input(args.out), notes=notes)
    except InputNotFound as exc:
        return fail(str(exc))
    for note in notes:
        print(f"  {note}", file=sys.stderr)
    if not inputs:
        return fail(f"no PDF or image files in {', '.join(args.inputs)}")
    if args.shard is not None:
        everything = len(inputs)
        inputs = [item for item in inputs if in_shard(item, *args.shard)]
        print(f"shard {args.shard[0]}/{args.shard[1]}: {len(inputs)} of {everything} file(s)", file=sys.stderr)
        if not inputs:
            print("nothing in this shard: every file is in another one", file=sys.stderr)
            return 0
    try:  # before anything is written: a typo in --model must not touch earlier work
        client, status = connect(args.url, api_key_from_env(), args.model, read_timeout=args.timeout,
                                 ca_cert=args.ca_cert)
    except ServerUnusable as exc:
        return fail(str(exc))
    if (problem := check_writable(args.out)) is not None:
        return fail(problem)
    if status.max_model_len and status.max_model_len < PAGE_PROMPT_TOKENS + args.max_tokens:
        print(f"warning: the server's max_model_len {status.max_model_len} leaves ~"
              f"{status.max_model_len - PAGE_PROMPT_TOKENS} output tokens for an A4 page, below --max-tokens "
              f"{args.max_tokens}: long pages will be cut (and flagged)", file=sys.stderr)

    family = status.family(client.model())  # its sampling, unless --temperature says otherwise
    if args.grounding and family.grounding != "blocks":
        return fail(f"--grounding needs a LightOnOCR-3 model: {client.model()} is {family.name}, which has no "
                    "grounding mode (serve lightonai/LightOnOCR-3-1B)")
    settings = ConversionSettings(client.model(), args.max_tokens, args.dpi, TARGET_LONGEST_EDGE, args.encoding,
                                  grounding=args.grounding)
    temperature = family.temperature if args.temperature is None else args.temperature
    options = BatchOptions(concurrency=args.concurrency, render_workers=args.render_workers,
                           max_attempts=args.max_attempts, temperature=temperature, top_p=family.top_p,
                           max_bytes=int(args.max_file_mb * 1e6), pages=args.pages, force=args.force,
                           redo_flagged=args.redo_flagged, server_wait_s=args.server_wait,
                           drain_s=args.drain_timeout, drop=args.drop)
    with RenderPool(args.render_workers) as pool:
        return convert(args, client, status, settings, options, inputs, pool, started_at)


def convert(args: argparse.Namespace, client: OcrClient, status: ServerStatus, settings: ConversionSettings,
            options: BatchOptions, inputs: list[InputFile], pool: RenderPool, started_at: str) -> int:
    """Scan, convert, summarise: the run once the server, inputs and output folder are known good."""
    scan_start = time.perf_counter()
    try:
        documents = scan(inputs, args.out, settings, options, pool)
    except KeyboardInterrupt:
        print("interrupted while reading the inputs; nothing was converted", file=sys.stderr)
        return 130
    except OSError as exc:
        if not is_disk_full(exc):
            raise
        print(f"FAILED: disk full while reading the inputs ({exc.strerror}: {exc.filename}): {DISK_FULL_ADVICE}",
              file=sys.stderr)
        return 1
    scan_s = time.perf_counter() - scan_start
    todo = sum(len(d.todo) for d in documents)
    in_scope = sum(len(d.pages) for d in documents)
    unreadable = [d for d in documents if d.error]
    held = [d for d in documents if d.held_by]
    print(f"{len(documents)} file(s), {in_scope} page(s): {in_scope - todo} done before, {todo} to convert"
          + (f", {len(unreadable)} unreadable" if unreadable else "")
          + (f", {len(held)} held by another converter" if held else "")
          + f" (read in {scan_s:.1f} s); server {client.base_url}, model {settings.model} (temperature "
          f"{options.temperature:g}, top_p {options.top_p:g})", file=sys.stderr)
    for document in documents:
        if document.note and document.todo:
            print(f"  {document.source.relative}: {document.note}", file=sys.stderr)
        if document.held_by:
            print(f"  {document.source.relative}: skipped, being converted by {document.held_by} "
                  "(rerun once it ends to finish it)", file=sys.stderr)

    progress = LogProgress(todo) if args.quiet else BarProgress(todo, in_scope - todo)
    converter = BatchConverter(client, settings, options, documents, pool, progress)

    def stop_admitting() -> None:
        progress.message(f"stopping: no new pages; pages in flight get up to {args.drain_timeout:g} s "
                         "(Ctrl-C again to exit at once)")
        converter.request_stop()

    try:
        with GracefulInterrupt(stop_admitting, "every page already written is kept") as interrupt:
            ended = converter.run()
    finally:
        progress.close()

    summary = run_summary(converter, documents, started_at=started_at, scan_s=scan_s, ended=ended,
                          server=client.base_url, vllm_version=status.version, args=vars(args))
    print("\n".join(summary_lines(summary)), file=sys.stderr)
    summary_path = args.out / summary_name(args.shard)
    try:
        atomic_write_json(summary_path, summary)
        print(f"summary: {summary_path}", file=sys.stderr)
    except OSError as exc:
        if not is_disk_full(exc):
            raise
        print(f"summary not written ({exc.strerror}): the lines above are all of it", file=sys.stderr)
    if ended == "disk full":
        print(f"FAILED: disk full ({converter.disk_full}): {DISK_FULL_ADVICE}", file=sys.stderr)
        return 1
    if ended == "interrupted":
        print("interrupted: rerun the same command to convert the rest", file=sys.stderr)
        return interrupt.exit_code
    if ended == "server gone":
        print(f"FAILED: the server {converter.watch.gone_because} for {args.server_wait:g} s; everything converted "
              "so far is kept: rerun the same command once it is back", file=sys.stderr)
        return 1
    held = [d for d in documents if d.held_by]  # at the scan, or when the run reached them
    if held:
        print(f"FAILED: {len(held)} document(s) skipped, being converted by another process: rerun the same "
              "command once it ends to finish them", file=sys.stderr)
        return 1
    if summary["pages"]["pending"]:
        print(f"FAILED: {summary['pages']['pending']} page(s) still pending"
              + (f" ({'; '.join(converter.faults)})" if converter.faults else "")
              + ": rerun the same command to convert them", file=sys.stderr)
        return 1
    failed_units = summary["pages"]["failed"] + len(summary["unreadable"])
    units = summary["pages"]["in_scope"] + len(summary["unreadable"])
    rate = failed_units / units if units else 0.0
    if rate > args.max_failed_rate:
        print(f"FAILED: {failed_units} of {units} pages/files failed ({rate:.1%} > --max-failed-rate "
              f"{args.max_failed_rate:.1%})", file=sys.stderr)
        return 1
    return 0
