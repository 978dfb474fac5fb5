"""Page preparation in worker processes, for the batch converter.

Rendering a PDF page at 200 DPI and encoding it as PNG costs ~100 ms of CPU; done in the
converter's threads it would hold the GIL and make the client the bottleneck, and
pypdfium2 is not thread-safe anyway. So pages are prepared by a pool of processes, each
keeping the last few PDFs it opened (a 1,000-page PDF is opened once per worker, read by
pdfium page by page, never rendered whole). A worker that dies (pdfium crashing on a
hostile file) is replaced, and its page retried once before it is reported as failed.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path

from .images import InputError, check_size, open_pdf, prepare_image_bytes, render_page_of

OPEN_PDFS_PER_WORKER = 4


@dataclass(frozen=True)
class PageJob:
    path: str
    page: int  # 1-based; 1 for an image
    is_pdf: bool
    encoding: str
    dpi: int
    longest_edge: int
    max_bytes: int


@dataclass(frozen=True)
class RenderedPage:
    data_url: str | None  # None when the page could not be prepared (then `error` says why)
    error: str | None
    width: int = 0
    height: int = 0
    wall_s: float = 0.0  # in the worker: render + encode
    cpu_s: float = 0.0


_open_pdfs: OrderedDict = OrderedDict()  # per worker process: path -> pypdfium2 document


def _pdf(path: str):
    document = _open_pdfs.pop(path, None) or open_pdf(Path(path))
    _open_pdfs[path] = document
    while len(_open_pdfs) > OPEN_PDFS_PER_WORKER:
        _open_pdfs.popitem(last=False)[1].close()
    return document


def render(job: PageJob) -> RenderedPage:
    """Prepare one page; never raises (the error is in the result)."""
    wall, cpu = time.perf_counter(), time.process_time()
    try:
        if job.is_pdf:
            prepared = render_page_of(_pdf(job.path), job.page, job.encoding, job.dpi, job.longest_edge)
        else:
            path = Path(job.path)
            check_size(path.stat().st_size, job.max_bytes)  # before reading a huge file
            prepared = prepare_image_bytes(path.read_bytes(), job.encoding, job.longest_edge,
                                           max_bytes=job.max_bytes)
    except InputError as exc:
        return RenderedPage(None, str(exc), wall_s=time.perf_counter() - wall, cpu_s=time.process_time() - cpu)
    except OSError as exc:
        return RenderedPage(None, f"The file cannot be read: {exc}.")
    except Exception as exc:  # a decoder bug on a hostile file must not lose the other pages
        return RenderedPage(None, f"The page could not be prepared ({type(exc).__name__}: {exc}).")
    return RenderedPage(prepared.data_url, None, prepared.width, prepared.height,
                        time.perf_counter() - wall, time.process_time() - cpu)


def _worker_init() -> None:
    # Ctrl-C reaches the whole foreground process group: the converter decides what stops.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_exit_with_parent, args=(os.getppid(),), name="parent-watch", daemon=True).start()


def _exit_with_parent(parent: int) -> None:
    """A converter killed outright (SIGKILL, a second Ctrl-C) cannot shut its pool down:
    its workers notice the orphaning and go too, instead of holding its pipes open."""
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(0)


@dataclass
class Ticket:
    job: PageJob
    future: Future
    generation: int
    resubmitted: bool = False


class RenderPool:
    """A process pool for PageJobs that survives a crashing worker. A context manager."""

    def __init__(self, workers: int):
        self.workers = workers
        self._lock = threading.Lock()
        self._generation = 0
        self._pool = self._new_pool()

    def _new_pool(self) -> ProcessPoolExecutor:
        # spawn: a fresh interpreter, not a fork of a process that runs HTTP threads.
        return ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"),
                                   initializer=_worker_init)

    def submit(self, job: PageJob) -> Ticket:
        with self._lock:
            return Ticket(job, self._pool.submit(render, job), self._generation)

    def result(self, ticket: Ticket) -> RenderedPage:
        """The prepared page (blocking). A broken pool is replaced and the page retried once."""
        try:
            return ticket.future.result()
        except BrokenProcessPool:
            if ticket.resubmitted:
                return RenderedPage(None, "The page renderer crashed on this page (a damaged file?).")
            with self._lock:
                if ticket.generation == self._generation:
                    self._pool.shutdown(wait=False, cancel_futures=True)
                    self._pool = self._new_pool()
                    self._generation += 1
            retry = self.submit(ticket.job)
            retry.resubmitted = True
            return self.result(retry)

    def close(self) -> None:
        with self._lock:
            self._pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> RenderPool:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
