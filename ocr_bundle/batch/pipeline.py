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

The batch converter's parts, one concern each: options.py (what the run is asked), scan.py (what
each input is and what is left to do), identity.py (what makes a document the same document),
attempts.py (a page's attempts: kept, flagged, retried), server_watch.py (is the server there?),
this module (the run: claim, render, send, record), manifest.py (a document on disk).
"""

from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import requests

from ..client import OcrClient
from ..draining import Countdown, drain
from ..files import is_disk_full
from ..images import InputError
from ..inputs import pages_in
from . import identity
from .attempts import PageAbandoned, PageFailed, PageReader, PageStats
from .grounded import grounded_page
from .locking import DocumentLock
from .manifest import FAILED, FLAGGED, PAGED_KINDS, ConversionSettings, DocumentClosed, DocumentOutput
from .options import BatchOptions
from .render_pool import CountJob, PageJob, RenderedPage, RenderPool
from .scan import Document, pages_left, reason_of
from .server_watch import ServerWatch


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
        self.reader = PageReader(client, settings.model, settings.max_tokens, settings.grounding, options,
                                 self.watch, self.stopping)
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
            if document.held_by is None and not document.todo and document.needs_assembly:
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
            if not (document.touched or document.needs_assembly) or self.disk_full or document.error or document.held_by:
                return
            if not self._claim(document):
                return
        try:
            if not self.disk_full and (document.touched or document.needs_assembly):
                self.progress.document(document, document.output.write_document())
                document.touched = document.needs_assembly = False  # written: not again at the run's end
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
                                  self.settings.dpi, self.settings.longest_edge, self.options.max_bytes,
                                  (document.snapshot.size, document.snapshot.mtime_ns) if document.snapshot else None)
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
                document.error, document.todo = f"since the start of the run: {reason_of(exc)}", []
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
        document.todo = pages_left(output, document.todo, self.options)
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
        status, record, text = self.reader.read(rendered.data_url, session, stats)
        return status, {**record, "image_size": _size(rendered)}, text

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
