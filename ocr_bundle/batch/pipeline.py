"""Batch conversion: many documents through one vLLM server, resumable and loop-safe.

The pipeline, bounded whatever the input size:

    scan (hash; page counts, in the render pool; what is already done)
      → producer: submits pages in order to the render pool (worker processes), holding at
        most `concurrency + prefetch` prepared pages at a time
      → `concurrency` sender threads: one page each, request → retries → record
      → DocumentOutput: page Markdown + manifest, written atomically as each page finishes

Per page: a reply cut at max_tokens (finish_reason "length") or ending in a loop
(ocr_bundle.batch.repetition) is retried at a higher temperature, up to `max_attempts`; the best
attempt is kept and the page is flagged if none finished cleanly. Transport errors and
5xx/429 are retried with backoff; a 4xx fails that page only. When the server stops
answering, senders wait up to `server_wait_s` for it to come back, then the run ends
with everything done so far kept. `request_stop()` (Ctrl-C) stops admitting pages, lets
pages in flight finish for `drain_s`, and ends the run; pages not finished stay pending
and a rerun picks them up. Nothing a thread meets (a crashed renderer, a bug) ends a sender
or the producer silently: the page is failed or left pending, and said so. A full disk
ends the run at once (every later page would be converted only to be thrown away).

Behind a gateway, 502/503/504 mean "no server ready" (one restarting, all busy starting):
like a refused connection, they are waited out for up to `server_wait_s`, not counted as
a page's failures.

Each document folder is locked (ocr_bundle.batch.locking) while the scan reads it and while
the run converts it: a document another live converter holds is skipped, said so, and left
for a rerun.
"""

from __future__ import annotations

import json
import os
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePath, PurePosixPath

import requests

from ..client import OcrClient, OcrError, OcrResult, build_chat_request
from ..draining import Countdown, drain
from ..files import is_disk_full, remove_partials
from ..images import InputError, check_size
from ..inputs import InputFile, output_folders, pages_in
from .manifest import (
    DONE,
    FAILED,
    FLAGGED,
    MANIFEST,
    OK,
    PAGED_KINDS,
    ConversionSettings,
    DocumentClosed,
    DocumentOutput,
    read_manifest,
)
from . import identity
from .identity import Snapshot
from ..grounding import parse
from .grounded import grounded_page
from .locking import DocumentLock
from .render_pool import CountJob, PageJob, RenderedPage, RenderPool
from .repetition import Repetition, repeated_tail

TEMPERATURE_STEP = 0.2
MAX_TEMPERATURE = 1.0
BACKOFF_S = (1.0, 2.0, 4.0, 8.0, 16.0, 30.0)
MAX_RETRY_AFTER_S = 60.0  # a server asking for more than this is waited on in steps of it
UNAVAILABLE = (502, 503, 504)  # a gateway (or proxy) with no server ready behind it
UNAVAILABLE_PAUSE_S = 2.0  # between tries while the server is unavailable
SCAN_CHUNK = 64  # documents whose folders the scan holds at once (one open file each)
PROBLEMS_KEPT = 5  # grounding problems an attempt's record keeps (with their count)


@dataclass(frozen=True)
class BatchOptions:
    concurrency: int = 64
    render_workers: int = 2
    max_attempts: int = 4
    temperature: float = 0.2
    top_p: float = 0.9
    max_bytes: int = 1024 * 10**6  # --max-file-mb's default, in its unit (10^6 bytes)
    pages: list[tuple[int, int | None]] | None = None  # ocr_bundle.inputs.parse_page_ranges
    force: bool = False
    redo_flagged: bool = False
    max_transport_retries: int = 5
    server_wait_s: float = 180.0
    drain_s: float = 60.0
    drop: frozenset[str] = frozenset()  # grounded blocks left out of the assembled documents (--drop)

    def temperatures(self) -> list[float]:
        """0.2 → 0.4 → 0.6 → 0.8 for four attempts from LightOn's 0.2."""
        return [round(min(self.temperature + TEMPERATURE_STEP * i, MAX_TEMPERATURE), 3)
                for i in range(self.max_attempts)]


# ------------------------------------------------------------------ scanning


@dataclass
class Document:
    """One input file, its output, and the pages this run converts."""

    source: InputFile
    output: DocumentOutput
    kind: str | None  # "pdf", "tiff" (pages) or "image" (one page); None when unreadable
    pages: list[int]  # in scope (--pages), in order
    todo: list[int]  # not done yet
    error: str | None = None  # why the file cannot be read at all
    note: str | None = None  # why earlier work is not reused as it is
    snapshot: Snapshot | None = None  # the content the pages were counted on: checked again when the run claims it
    held_by: str | None = None  # another live converter holds the folder: skipped ("pid N on host")
    assemble: bool = False  # <name>.md is missing or older than the record: rewrite it
    touched: bool = False  # a page was recorded in this run
    recorded: set[int] = field(default_factory=set)  # pages of `todo` recorded in this run

    def pending(self) -> list[int]:
        """Pages of `todo` this run has not recorded (yet)."""
        return [page for page in self.todo if page not in self.recorded]


class ContentHashes:
    """Each input's snapshot (ocr_bundle.batch.identity), taken once and only hashed when needed: a
    file whose size and modification time match its own manifest's is taken to be the file hashed then."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self._snapshots: dict[Path, Snapshot | InputError | OSError] = {}

    def of(self, item: InputFile, earlier: dict | None = None) -> Snapshot | InputError | OSError:
        if item.path not in self._snapshots:
            known = (identity.recorded(earlier) if earlier is not None and identity.same_document(earlier, item)
                     else None)
            try:
                self._snapshots[item.path] = identity.take(item.path, self.max_bytes, known)
            except (InputError, OSError) as exc:
                self._snapshots[item.path] = exc
        return self._snapshots[item.path]


def scan(inputs: list[InputFile], out_root: Path, settings: ConversionSettings, options: BatchOptions,
         pool: RenderPool) -> list[Document]:
    """Read what is there to do: lock each document's folder, content hash (only of files
    changed since their manifest), page count (counted in the render pool, so a file that
    crashes its parser fails alone), pages already done. Bad files are documents with an
    error, never exceptions; a file unreadable now keeps its earlier output; a folder
    another converter holds is skipped. A full disk raises (OSError)."""
    hashes = ContentHashes(options.max_bytes)

    def belongs(item: InputFile, folder: PurePath) -> bool | None:
        """Does `folder` hold this input's earlier output (the same document, or its content), another's, or none?"""
        if not (out_root / folder / MANIFEST).exists():
            return None
        earlier = read_manifest(out_root / folder)
        if earlier is None:
            return False  # a manifest that cannot be read: not ours to take
        if identity.same_document(earlier, item):
            return True
        snapshot = hashes.of(item, earlier)
        return isinstance(snapshot, Snapshot) and earlier.get("source_sha256") == snapshot.sha256

    folders = output_folders(inputs, belongs)
    documents: list[Document] = []
    # In chunks: each folder is locked while it is read and written here, then let go (the run claims
    # it again when it reaches it), so a corpus of any size holds a bounded number of files open.
    for start in range(0, len(inputs), SCAN_CHUNK):
        documents += _scan_chunk(inputs[start:start + SCAN_CHUNK], out_root, folders, hashes, settings, options,
                                 pool)
    return documents


def _scan_chunk(inputs: list[InputFile], out_root: Path, folders: dict[Path, PurePath], hashes: ContentHashes,
                settings: ConversionSettings, options: BatchOptions, pool: RenderPool) -> list[Document]:
    opened = []
    for item in inputs:
        folder = out_root / folders[item.path]
        lock = DocumentLock.acquire(folder, announce=False)
        if isinstance(lock, str):  # another live converter: its files, its temporary files, its pages
            opened.append((item, DocumentOutput(folder, {"source": str(item.path), "pages": {}}), None, None, lock))
            continue
        remove_partials(folder)  # what a killed run left half-written: ours to clean, we hold the lock
        snapshot = hashes.of(item, read_manifest(folder) if not options.force else None)
        if not isinstance(snapshot, Snapshot):
            error = _reason(snapshot)
            opened.append((item, DocumentOutput.unreadable(folder, item, settings, error, lock), None, error,
                           None))
            continue
        try:
            output, note = DocumentOutput.open(folder, item, snapshot, settings, lock, options.drop)
        except OSError as exc:
            lock.release()
            if is_disk_full(exc):
                raise
            error = _reason(exc)
            opened.append((item, DocumentOutput.unreadable(folder, item, settings, error), None, error, None))
            continue
        # Counting a PDF's pages runs pdfium: in the pool, all files at once.
        counting = None if output.known_shape else pool.submit(CountJob(str(item.path), options.max_bytes))
        opened.append((item, output, note, counting, None))

    documents = []
    for item, output, note, counting, held_by in opened:
        if held_by is not None:
            documents.append(Document(item, output, None, [], [], held_by=held_by))
            continue
        try:
            documents.append(_counted(item, output, note, counting, options))
        finally:
            output.close()  # let go: the run claims the folder again when it reaches it
    return documents


def _counted(item: InputFile, output: DocumentOutput, note: str | None, counting, options: BatchOptions) -> Document:
    """The document once its pages are counted: what is in scope and what is left to do."""
    if isinstance(counting, str):  # unreadable: `counting` is the reason
        return Document(item, output, None, [], [], error=counting)
    if counting is None:
        (kind, count), error = output.known_shape, None
    else:
        counted = RenderPool.result(counting)
        kind, count, error = counted.kind, counted.page_count, counted.error
    output.describe(kind, count, error)
    if error:
        return Document(item, output, None, [], [], error=error, note=note)
    pages = pages_in(options.pages, count) if kind in PAGED_KINDS else [1]
    return Document(item, output, kind, pages, _todo(output, pages, options), None, note,
                    snapshot=identity.recorded(output.manifest), assemble=not output.assembly_current())


def _todo(output: DocumentOutput, pages: list[int], options: BatchOptions) -> list[int]:
    done = set() if options.force else output.done_pages((OK,) if options.redo_flagged else DONE)
    return [page for page in pages if page not in done]


def _reason(exc: Exception) -> str:
    if isinstance(exc, InputError):
        return str(exc)
    return f"The file cannot be read: {exc.strerror or exc}." if isinstance(exc, OSError) else str(exc)


# ------------------------------------------------------------------ one page


@dataclass(frozen=True)
class Attempt:
    temperature: float
    finish_reason: str | None
    prompt_tokens: int | None
    completion_tokens: int | None
    latency_s: float
    repetition: Repetition | None
    problems: tuple[str, ...] = ()  # a grounded reply's parsing problems (ocr_bundle.grounding)

    @property
    def clean(self) -> bool:
        return self.finish_reason == "stop" and self.repetition is None and not self.problems

    def quality(self) -> tuple:
        """Higher is better: clean, then no loop, then the shortest loop, then finished, then fewest problems."""
        covered = self.repetition.covered_tokens if self.repetition else 0
        return (self.clean, self.repetition is None, -covered, self.finish_reason == "stop", -len(self.problems))

    def as_dict(self) -> dict:
        """As the manifest keeps it: a garbled grounded reply's problems counted, the first few kept (700
        boxes of problems per attempt made a 227 KB manifest, fsynced line by line)."""
        out = asdict(self)
        out["repetition"] = asdict(self.repetition) if self.repetition else None
        out["problems"] = list(self.problems[:PROBLEMS_KEPT])
        if len(self.problems) > PROBLEMS_KEPT:
            out["problem_count"] = len(self.problems)
        return out


def flag_of(attempt: Attempt, max_tokens: int) -> str | None:
    """Why a kept attempt is not clean, in words (None when it is)."""
    if attempt.problems and attempt.finish_reason == "stop" and attempt.repetition is None:
        return "grounding: " + "; ".join(attempt.problems[:3]) + (" …" if len(attempt.problems) > 3 else "")
    if attempt.repetition is not None:
        unit = attempt.repetition.unit
        return (f"ends in a loop: {unit[:40] + ('…' if len(unit) > 40 else '')!r} "
                f"repeated {attempt.repetition.repeats:.0f} times")
    if attempt.finish_reason == "length":
        if attempt.completion_tokens is not None and attempt.completion_tokens < max_tokens:
            return (f"cut at the server's context limit after {attempt.completion_tokens} tokens "
                    "(restart it with a larger max-model-len)")
        return f"stopped at max_tokens ({max_tokens}): the page may have more text"
    if attempt.finish_reason != "stop":
        return f"finish_reason {attempt.finish_reason!r}"
    return None


def is_transient(error: OcrError) -> bool:
    """Worth sending again: the network, a timeout, an overloaded or restarting server."""
    if error.kind in ("connection", "timeout", "bad_response"):
        return True
    return error.kind == "http" and (error.status is None or error.status >= 500 or error.status in (408, 429))


class PageAbandoned(Exception):
    """The page is left pending: the run is stopping or the server is gone."""


class PageFailed(Exception):
    """The page cannot be converted (its message says why); the run goes on."""


@dataclass
class PageStats:
    """What one page cost the client and the server, for the run's summary."""

    render_wall_s: float = 0.0
    render_cpu_s: float = 0.0
    render_wait_s: float = 0.0  # how long a sender waited for the page to be prepared
    send_cpu_s: float = 0.0
    requests: int = 0
    latency_s: float = 0.0


class ServerWatch:
    """Shared by the senders: is the server back? One probe per second at most, whoever asks."""

    def __init__(self, client: OcrClient, wait_s: float, stopping: threading.Event, say=lambda text: None):
        self.client = client
        self.wait_s = wait_s
        self.stopping = stopping
        self.say = say
        self.gone = threading.Event()
        self.gone_because = "stopped answering"
        self._lock = threading.Lock()
        self._down_since: float | None = None
        self._unavailable_since: float | None = None
        self._last_probe = (-1e9, False)

    def answered(self) -> None:
        """A request was answered: whatever outage there was is over."""
        if self._unavailable_since is not None:
            with self._lock:
                if self._unavailable_since is not None:
                    self._unavailable_since = None
                    self.say("the server answers again: going on")

    def wait_out_unavailable(self, error: OcrError) -> bool:
        """The server answered 502/503/504 (a gateway with no server ready, one restarting):
        pause, then True to send again; False once that has lasted `wait_s` (then `gone` is set)."""
        with self._lock:
            now = time.monotonic()
            if self._unavailable_since is None:
                self._unavailable_since = now
                self.say(f"the server answers {error.status} ({error}): behind a gateway that means no server is "
                         f"ready (restarting?); waiting up to {self.wait_s:g} s (--server-wait)")
            unavailable_for = now - self._unavailable_since
        if unavailable_for >= self.wait_s:
            self.gone_because = f"answered {error.status} (no server ready)"
            self.gone.set()
            return False
        return not self.stopping.wait(UNAVAILABLE_PAUSE_S) and not self.gone.is_set()

    def _probe(self) -> bool:
        with self._lock:
            at, reachable = self._last_probe
            if time.monotonic() - at >= 1.0:
                reachable = self.client.status(timeout=2.0).reachable
                self._last_probe = (time.monotonic(), reachable)
            if reachable:
                self._down_since = None
            elif self._down_since is None:
                self._down_since = time.monotonic()
            return reachable

    def wait_until_back(self) -> bool:
        """True once the server answers; False when it stayed away `wait_s` (then `gone` is set)."""
        while not self.stopping.is_set() and not self.gone.is_set():
            if self._probe():
                return True
            with self._lock:
                down_for = time.monotonic() - (self._down_since or time.monotonic())
            if down_for >= self.wait_s:
                self.gone.set()
                break
            self.stopping.wait(1.0)
        return False


# ------------------------------------------------------------------ the run


@dataclass
class RunCounts:
    ok: int = 0
    flagged: int = 0
    failed: int = 0
    requests: int = 0
    stats: list[PageStats] = field(default_factory=list)
    failures: list[dict] = field(default_factory=list)
    flags: list[dict] = field(default_factory=list)


class Progress:
    """What the converter reports as it goes; the CLI shows it (tqdm bar or log lines)."""

    def page(self, status: str) -> None: ...

    def document(self, document: Document, path: Path) -> None: ...

    def message(self, text: str) -> None: ...

    def tick(self) -> None:
        """Called about five times a second while pages are converted."""


class BatchConverter:
    def __init__(self, client: OcrClient, settings: ConversionSettings, options: BatchOptions,
                 documents: list[Document], pool: RenderPool, progress: Progress = Progress()):
        self.client = client
        self.pool = pool
        self.settings = settings
        self.options = options
        self.documents = documents
        self.progress = progress
        self.stopping = threading.Event()
        self.interrupted = False
        self.watch = ServerWatch(client, options.server_wait_s, self.stopping, progress.message)
        self.counts = RunCounts()
        self._lock = threading.Lock()
        prefetch = 2 * options.render_workers
        self._slots = threading.BoundedSemaphore(options.concurrency + prefetch)
        self._ready: queue.Queue = queue.Queue()
        self._senders = Countdown(options.concurrency)
        self.convert_s = 0.0  # wall time of the conversion itself (after the scan)
        self.faults: list[str] = []  # what went wrong inside the converter itself (bugs)
        self.disk_full: str | None = None  # the write that found the disk full: the run stopped there

    # ------------------------------------------------------------ control
    def request_stop(self) -> None:
        """Stop admitting pages; pages in flight finish (see `run`'s drain)."""
        self.interrupted = True
        self.stopping.set()

    def run(self) -> str:
        """Convert every pending page; returns how the run ended: "complete", "interrupted",
        "server gone" or "disk full"."""
        for document in self.documents:
            if document.held_by is None and not document.todo and document.assemble:
                self._finish(document)  # nothing to convert, only <name>.md to bring up to date
        start = time.perf_counter()
        if any(d.todo for d in self.documents):
            self._run_pipeline()
        self.convert_s = time.perf_counter() - start
        # Stopped early (Ctrl-C, the server gone, a full disk): the documents this run never reached
        # are left as they are, not claimed only to write placeholders; the stop takes as long whatever
        # the corpus's size.
        stopped_early = self.interrupted or self.watch.gone.is_set() or self.disk_full is not None
        for document in self.documents:
            if document.held_by is None and not (stopped_early and document.output.folder_lock is None
                                                 and not document.touched):
                self._finish(document)
        if self.disk_full:
            return "disk full"
        if self.watch.gone.is_set():
            return "server gone"
        return "interrupted" if self.interrupted else "complete"

    def _finish(self, document: Document) -> None:
        """Assemble the document if it changed or its <name>.md is behind, and let go of its folder
        (at once when its last page is recorded, so that the lock is held no longer than needed)."""
        if document.output.folder_lock is None:  # not claimed by this run (nothing converted yet)
            if not (document.touched or document.assemble) or self.disk_full or document.error or document.held_by:
                return
            if not self._claim(document):
                return
        try:
            if not self.disk_full and (document.touched or document.assemble):
                self.progress.document(document, document.output.write_document())
                document.touched = document.assemble = False  # written: not again at the run's end
            document.output.close()
        except OSError as exc:
            if not is_disk_full(exc):
                raise
            self._stop_for_full_disk(exc)
            document.output.close_without_writing()

    def _stop_for_full_disk(self, exc: OSError) -> None:
        with self._lock:
            first = self.disk_full is None
            if first:
                self.disk_full = f"{exc.strerror or exc}" + (f" ({exc.filename})" if exc.filename else "")
        self.stopping.set()
        if first:
            self.progress.message(f"disk full: {self.disk_full}; stopping now (free space and rerun)")

    def _run_pipeline(self) -> None:
        senders = [threading.Thread(target=self._sender, name=f"sender-{i}", daemon=True)
                   for i in range(self.options.concurrency)]
        producer = threading.Thread(target=self._producer, name="producer", daemon=True)
        producer.start()
        for sender in senders:
            sender.start()

        def tick() -> None:
            self.progress.tick()
            if self.watch.gone.is_set():
                self.stopping.set()

        if not drain(self._senders.done, self.stopping, self.options.drain_s, tick):
            # Daemon threads: their pages stay pending, nothing half-written.
            self.progress.message(f"{sum(s.is_alive() for s in senders)} page(s) still in flight after "
                                  f"{self.options.drain_s:g} s: left pending")
        self.stopping.set()  # tells a producer still waiting for a slot to stop

    def _producer(self) -> None:
        try:
            for document in self.documents:
                if self.stopping.is_set():
                    return
                if not document.todo or not self._claim(document):
                    continue
                if not document.todo:  # another run finished it since the scan
                    self._finish(document)
                    continue
                for page in document.todo:
                    while not self._slots.acquire(timeout=0.2):
                        if self.stopping.is_set():
                            return
                    if self.stopping.is_set():
                        self._slots.release()
                        return
                    job = PageJob(str(document.source.path), page, document.kind, self.settings.encoding,
                                  self.settings.dpi, self.settings.longest_edge, self.options.max_bytes)
                    self._ready.put((document, page, self.pool.submit(job)))
        except Exception as exc:  # a bug: say so; the pages not handed out stay pending
            self._fault(f"preparing pages stopped ({type(exc).__name__}: {exc}); the pages not sent yet stay "
                        "pending")
        finally:
            for _ in range(self.options.concurrency):
                self._ready.put(None)

    def _claim(self, document: Document) -> bool:
        """Take the document's folder for the run, its record read again (another run may have
        converted some of its pages since the scan: they are left out), and the file looked at
        again (ocr_bundle.batch.identity): one replaced since the scan is hashed and counted anew
        and converted as it is now; one gone or unreadable is this document's error, not the run's.
        False when another live converter holds it (its pages stay pending, and it is said so) or
        the file cannot be read."""
        lock = DocumentLock.acquire(document.output.folder)
        if isinstance(lock, str):
            document.held_by = lock
            self.progress.message(f"{document.source.relative}: skipped, being converted by {lock} "
                                  "(rerun once it ends to finish it)")
            return False
        try:
            try:
                snapshot = identity.take(document.source.path, self.options.max_bytes, document.snapshot)
                shape = (document.kind, document.output.manifest.get("page_count"))
                if snapshot != document.snapshot:
                    counted = RenderPool.result(self.pool.submit(CountJob(str(document.source.path),
                                                                          self.options.max_bytes)))
                    if counted.error:
                        raise InputError(counted.error)
                    shape = (counted.kind, counted.page_count)
                    self.progress.message(f"{document.source.relative}: changed since it was read at the start: "
                                          "converted as it is now")
            except (InputError, OSError) as exc:
                if is_disk_full(exc):
                    raise
                document.error, document.todo = f"since the start of the run: {_reason(exc)}", []
                self.progress.message(f"{document.source.relative}: {document.error}")
                lock.release()
                return False
            output, _ = DocumentOutput.open(document.output.folder, document.source, snapshot, self.settings, lock,
                                            self.options.drop)
        except BaseException:
            lock.release()
            raise
        output.describe(*shape, None)
        if snapshot != document.snapshot:
            document.kind, document.snapshot = shape[0], snapshot
            document.pages = pages_in(self.options.pages, shape[1]) if shape[0] in PAGED_KINDS else [1]
            document.todo = list(document.pages)
        document.output = output
        document.todo = _todo(output, document.todo, self.options)
        return True

    def _fault(self, text: str) -> None:
        with self._lock:
            self.faults.append(text)
        self.progress.message(f"internal error: {text}")

    def _sender(self) -> None:
        try:
            self._send_pages()
        finally:
            self._senders.finished()

    def _send_pages(self) -> None:
        session = self.client.new_session()
        while not self.stopping.is_set():
            try:
                item = self._ready.get(timeout=0.2)
            except queue.Empty:
                continue
            if item is None:
                return
            document, page, rendering = item
            try:
                if not self.stopping.is_set():
                    self._convert_and_record(document, page, rendering, session)
            except OSError as exc:
                if not is_disk_full(exc):
                    self._fault(f"{document.source.relative} page {page}: {type(exc).__name__}: {exc}; left pending")
                else:  # every page after this one would be converted and thrown away
                    self._stop_for_full_disk(exc)
            except Exception as exc:  # a bug: this page stays pending, the sender goes on
                self._fault(f"{document.source.relative} page {page}: {type(exc).__name__}: {exc}; left pending")
            finally:
                self._slots.release()

    # ------------------------------------------------------------ one page
    def _convert_and_record(self, document: Document, page: int, rendering: Future,
                            session: requests.Session) -> None:
        stats = PageStats()
        waited = time.perf_counter()
        rendered = self.pool.result(rendering)
        stats.render_wait_s = time.perf_counter() - waited
        stats.render_wall_s, stats.render_cpu_s = rendered.wall_s, rendered.cpu_s
        cpu = time.thread_time()
        try:
            if rendered.error is not None:
                raise PageFailed(rendered.error)
            status, record, text = self._convert(rendered, session, stats)
        except PageFailed as exc:
            status, record, text = FAILED, {"status": FAILED, "attempts": stats.requests, "error": str(exc),
                                            "image_size": _size(rendered)}, None
        except PageAbandoned:
            return
        finally:
            stats.send_cpu_s = time.thread_time() - cpu
        attachments = None
        if self.settings.grounding and text is not None:
            page_file = PurePosixPath(document.output.page_file(page).relative_to(document.output.folder).as_posix())
            text, attachments, fields = grounded_page(text, record["finish_reason"] == "length", rendered, page_file)
            record.update(fields)
        try:
            stored = document.output.record_page(page, record, text, attachments)
        except DocumentClosed:
            return  # the run is over and the folder let go: the page stays pending
        if not stored:
            key = "error" if status == FAILED else "flag"
            record = {**record, key: f"{record[key]} (the text converted earlier is kept)"}
        self._count(document, page, status, record, stats)

    def _convert(self, rendered: RenderedPage, session: requests.Session,
                 stats: PageStats) -> tuple[str, dict, str]:
        attempts: list[tuple[Attempt, str]] = []
        for index, temperature in enumerate(self.options.temperatures()):
            if index and self.stopping.is_set():
                break  # stopping: the attempts received are kept (flagged, for --redo-flagged)
            body = json.dumps(build_chat_request(self.settings.model, rendered.data_url,
                                                 max_tokens=self.settings.max_tokens, temperature=temperature,
                                                 top_p=self.options.top_p, stream=False,
                                                 grounding=self.settings.grounding)).encode()
            try:
                result = self._send(body, session, stats)
            except (PageFailed, PageAbandoned):
                if not attempts:
                    raise
                break  # keep the attempts that did answer
            problems = (tuple(parse(result.text, cut=result.finish_reason == "length").problems)
                        if self.settings.grounding else ())
            attempt = Attempt(temperature, result.finish_reason, result.prompt_tokens, result.completion_tokens,
                              result.latency_s, repeated_tail(result.text), problems)
            attempts.append((attempt, result.text))
            if attempt.clean:
                break
        best, text = max(attempts, key=lambda pair: pair[0].quality())
        flag = flag_of(best, self.settings.max_tokens)
        record = {
            "status": FLAGGED if flag else OK, "attempts": len(attempts), "finish_reason": best.finish_reason,
            "flag": flag, "temperature": best.temperature, "prompt_tokens": best.prompt_tokens,
            "completion_tokens": best.completion_tokens, "latency_s": round(stats.latency_s, 3),
            "image_size": _size(rendered), "error": None,
            "attempt_log": [a.as_dict() for a, _ in attempts] if len(attempts) > 1 or flag else None,
        }
        return record["status"], record, text

    def _send(self, body: bytes, session: requests.Session, stats: PageStats) -> OcrResult:
        """One request, retried through transport errors and waited through a server that is
        away (refused connections, 502/503/504); PageFailed / PageAbandoned otherwise."""
        retry = 0  # transport errors so far (an unavailable server does not count)
        first = True
        while True:
            if self.stopping.is_set() and not first:
                raise PageAbandoned
            first = False
            stats.requests += 1
            try:
                result = self.client.complete_body(body, self.settings.max_tokens, session=session)
            except OcrError as exc:
                if not is_transient(exc):
                    raise PageFailed(str(exc)) from exc
                if exc.kind == "http" and exc.status in UNAVAILABLE:
                    if not self.watch.wait_out_unavailable(exc):
                        raise PageAbandoned from exc
                    continue
                if retry == self.options.max_transport_retries:
                    raise PageFailed(f"{exc} (gave up after {retry + 1} tries)") from exc
                if exc.kind == "connection" and not self.watch.wait_until_back():
                    raise PageAbandoned from exc
                pause = max(BACKOFF_S[min(retry, len(BACKOFF_S) - 1)], min(exc.retry_after_s or 0, MAX_RETRY_AFTER_S))
                retry += 1
                if self.stopping.wait(pause):
                    raise PageAbandoned from exc
                continue
            self.watch.answered()
            stats.latency_s += result.latency_s
            return result

    def _count(self, document: Document, page: int, status: str, record: dict, stats: PageStats) -> None:
        with self._lock:
            setattr(self.counts, status, getattr(self.counts, status) + 1)
            self.counts.requests += stats.requests
            self.counts.stats.append(stats)
            where = {"source": str(document.source.path), "page": page}
            if status == FAILED:
                self.counts.failures.append({**where, "error": record["error"]})
            elif status == FLAGGED:
                self.counts.flags.append({**where, "flag": record["flag"]})
            document.touched = True
            document.recorded.add(page)
            finished = len(document.recorded) == len(document.todo)
        self.progress.page(status)
        if finished:
            self._finish(document)


def _size(rendered: RenderedPage) -> list[int] | None:
    return [rendered.width, rendered.height] if rendered.data_url else None
