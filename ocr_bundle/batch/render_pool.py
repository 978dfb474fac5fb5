"""Page preparation in worker processes, for the batch converter.

Rendering a PDF page at 200 DPI and encoding it as PNG costs ~100 ms of CPU; done in the
converter's threads it would hold the GIL and make the client the bottleneck, and
pypdfium2 is not thread-safe anyway. So pages are prepared by worker processes, each
keeping the last few PDFs it opened (a 1,000-page PDF is opened once per worker, read by
pdfium page by page, never rendered whole). Counting a file's pages goes through them too:
a PDF that crashes pdfium must fail that file, not the converter.

Why not concurrent.futures.ProcessPoolExecutor: when one of its workers dies, every page
queued in the pool fails with it, and nothing says which page killed it. Here each worker
process is driven by one thread of the pool and holds one job at a time, so a worker that
dies (a pdfium segfault on a hostile file) is charged to exactly the job it was running:
that job is tried once more in a fresh process, alone, and reported as failed only if it
kills that one too. The other workers and their pages never notice. A job that runs past
`job_timeout_s` (a decoder stuck on a damaged file) gets its worker killed and fails.

The pool never raises to its callers: `result()` always returns a value whose `error`
says what went wrong, and `close()` returns within a few seconds whatever the workers do.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import queue
import signal
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

from ..images import (
    InputError,
    check_size,
    is_pdf,
    open_pdf,
    pdf_page_count,
    prepare_image_bytes,
    render_page_of,
    tiff_page,
    tiff_page_count,
)

OPEN_PDFS_PER_WORKER = 4
JOB_TIMEOUT_S = 300.0  # a page takes ~0.1 s; minutes mean a decoder that will not finish
CLOSE_GRACE_S = 3.0
STOPPING = "Not prepared: the run is stopping."

# What a file is, for the converter: a PDF and a multi-page TIFF have pages, any other
# image is one page.
PDF, TIFF, IMAGE = "pdf", "tiff", "image"


@dataclass(frozen=True)
class CountJob:
    """What kind of document a file is and how many pages it has."""

    path: str
    max_bytes: int


@dataclass(frozen=True)
class Counted:
    kind: str | None
    page_count: int | None
    error: str | None = None  # why the file cannot be read (then kind and page_count are None)


@dataclass(frozen=True)
class PageJob:
    path: str
    page: int  # 1-based; 1 for a single image
    kind: str  # PDF, TIFF or IMAGE
    encoding: str
    dpi: int
    longest_edge: int
    max_bytes: int
    # (size, modification time in ns) of the file as the run claimed it: a page of a file replaced since
    # is not rendered from the new content under the old document's record.
    expected: tuple[int, int] | None = None


CHANGED = "The file changed since the run read it: rerun to convert it as it is now."


@dataclass(frozen=True)
class RenderedPage:
    data_url: str | None  # None when the page could not be prepared (then `error` says why)
    error: str | None
    width: int = 0
    height: int = 0
    wall_s: float = 0.0  # in the worker: render + encode
    cpu_s: float = 0.0
    dpi: int | None = None  # a PDF page's rendering resolution


Job = CountJob | PageJob
Outcome = Counted | RenderedPage


def failure(job: Job, message: str) -> Outcome:
    """The result that says `job` could not be done."""
    return Counted(None, None, message) if isinstance(job, CountJob) else RenderedPage(None, message)


# ------------------------------------------------------------------ in the worker

_open_pdfs: OrderedDict = OrderedDict()  # per worker process: (path, (size, mtime)) -> pypdfium2 document


def _pdf(path: str, version: tuple[int, int]):
    """The open PDF, per path and version (size, mtime): a replaced file is opened anew."""
    key = (path, version)
    document = _open_pdfs.pop(key, None) or open_pdf(Path(path))
    _open_pdfs[key] = document
    while len(_open_pdfs) > OPEN_PDFS_PER_WORKER:
        _open_pdfs.popitem(last=False)[1].close()
    return document


def count(job: CountJob) -> Counted:
    """Kind and page count of a file; never raises."""
    path = Path(job.path)
    try:
        with open(path, "rb") as handle:
            head = handle.read(1024)
        if is_pdf(head):
            return Counted(PDF, pdf_page_count(path, job.max_bytes))
        pages = tiff_page_count(path)
        return Counted(TIFF, pages) if pages > 1 else Counted(IMAGE, 1)
    except InputError as exc:
        return Counted(None, None, str(exc))
    except OSError as exc:
        return Counted(None, None, f"The file cannot be read: {exc.strerror or exc}.")
    except Exception as exc:  # a parser bug on a hostile file: that file fails, not the run
        return Counted(None, None, f"The file could not be read ({type(exc).__name__}: {exc}).")


def render(job: PageJob) -> RenderedPage:
    """Prepare one page; never raises (the error is in the result)."""
    wall, cpu = time.perf_counter(), time.process_time()
    try:
        path = Path(job.path)
        info = path.stat()
        version = (info.st_size, info.st_mtime_ns)
        if job.expected is not None and version != tuple(job.expected):
            return RenderedPage(None, CHANGED)
        if job.kind == PDF:
            prepared = render_page_of(_pdf(job.path, version), job.page, job.encoding, job.dpi, job.longest_edge)
        elif job.kind == TIFF:
            check_size(path.stat().st_size, job.max_bytes)
            prepared = tiff_page(path, job.page, job.encoding, job.longest_edge)
        else:
            check_size(path.stat().st_size, job.max_bytes)  # before reading a huge file
            prepared = prepare_image_bytes(path.read_bytes(), job.encoding, job.longest_edge,
                                           max_bytes=job.max_bytes)
    except InputError as exc:
        return RenderedPage(None, str(exc), wall_s=time.perf_counter() - wall, cpu_s=time.process_time() - cpu)
    except OSError as exc:
        return RenderedPage(None, f"The file cannot be read: {exc.strerror or exc}.")
    except Exception as exc:  # a decoder bug on a hostile file must not lose the other pages
        return RenderedPage(None, f"The page could not be prepared ({type(exc).__name__}: {exc}).")
    return RenderedPage(prepared.data_url, None, prepared.width, prepared.height,
                        time.perf_counter() - wall, time.process_time() - cpu, prepared.dpi)


def do_job(job: Job) -> Outcome:
    return count(job) if isinstance(job, CountJob) else render(job)


def _worker_main(connection, work: Callable[[Job], Outcome]) -> None:
    # Ctrl-C reaches the whole foreground process group: the converter decides what stops.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_exit_with_parent, args=(os.getppid(),), name="parent-watch", daemon=True).start()
    while True:
        try:
            job = connection.recv()
        except (EOFError, OSError):  # the converter is gone
            return
        if job is None:
            return
        connection.send(work(job))


def _exit_with_parent(parent: int) -> None:
    """A converter killed outright (SIGKILL, a second Ctrl-C) cannot shut its pool down:
    its workers notice the orphaning and go too, instead of holding its pipes open."""
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(0)


# ------------------------------------------------------------------ in the converter


class _Worker:
    """One worker process and the pipe to it; one job at a time."""

    # spawn: a fresh interpreter, not a fork of a process that runs HTTP threads.
    _context = multiprocessing.get_context("spawn")

    def __init__(self, work: Callable[[Job], Outcome]):
        self.connection, child = self._context.Pipe()
        self.process = self._context.Process(target=_worker_main, args=(child, work), daemon=True,
                                             name="render-worker")
        self.process.start()
        child.close()

    def call(self, job: Job, timeout_s: float) -> tuple[str, Outcome | int | None]:
        """("done", outcome) | ("died", exit code) | ("timeout", None)."""
        try:
            self.connection.send(job)
        except (OSError, ValueError):
            return "died", self.process.exitcode
        ready = multiprocessing.connection.wait([self.connection, self.process.sentinel], timeout_s)
        if not ready:
            return "timeout", None
        if self.connection in ready:
            try:
                return "done", self.connection.recv()
            except (EOFError, OSError):  # it died before (or while) answering
                pass
        self.process.join(1.0)
        return "died", self.process.exitcode

    def stop(self, grace_s: float = 1.0) -> None:
        try:
            self.connection.send(None)
        except (OSError, ValueError):
            pass
        self.process.join(grace_s)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(grace_s)
        self.connection.close()

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join(CLOSE_GRACE_S)
        self.connection.close()


class RenderPool:
    """`workers` page-preparing processes, started when first needed. A context manager."""

    def __init__(self, workers: int, work: Callable[[Job], Outcome] = do_job, job_timeout_s: float = JOB_TIMEOUT_S):
        self.workers = workers
        self.crashes = 0  # worker processes that died under a job (for the run summary)
        self._work = work
        self._job_timeout_s = job_timeout_s
        self._jobs: queue.Queue = queue.Queue()
        self._closing = threading.Event()
        self._lock = threading.Lock()
        self._live: set[_Worker] = set()
        self._slots = [threading.Thread(target=self._slot, name=f"render-slot-{i}", daemon=True)
                       for i in range(workers)]
        for slot in self._slots:
            slot.start()

    def submit(self, job: Job) -> Future:
        """Queue a job; its future always gets an outcome (never an exception)."""
        future: Future = Future()
        if self._closing.is_set():
            future.set_result(failure(job, STOPPING))
        else:
            self._jobs.put((job, future))
        return future

    @staticmethod
    def result(future: Future) -> Outcome:
        """The job's outcome (blocking)."""
        return future.result()

    def worker_pids(self) -> list[int]:
        with self._lock:
            return sorted(worker.process.pid for worker in self._live)

    # ------------------------------------------------------------ one slot
    def _slot(self) -> None:
        worker: _Worker | None = None
        try:
            while True:
                item = self._jobs.get()
                if item is None:
                    return
                job, future = item
                if self._closing.is_set():
                    future.set_result(failure(job, STOPPING))
                    continue
                try:
                    outcome, worker = self._run(job, worker)
                except Exception as exc:  # e.g. no process can be started: this job fails, the slot goes on
                    outcome, worker = failure(job, f"The page could not be prepared ({exc})."), None
                future.set_result(outcome)
        finally:
            if worker is not None:
                self._retire(worker, stop=True)

    def _run(self, job: Job, worker: _Worker | None) -> tuple[Outcome, _Worker | None]:
        """Run `job`; a worker that dies under it is replaced and the job tried once more,
        alone in the new process: only a job that kills that one too is charged with it."""
        exit_codes = []
        for _ in range(2):
            if worker is None:
                worker = _Worker(self._work)
                with self._lock:
                    self._live.add(worker)
            state, value = worker.call(job, self._job_timeout_s)
            if state == "done":
                return value, worker
            self._retire(worker)
            worker = None
            if self._closing.is_set():
                return failure(job, STOPPING), None
            if state == "timeout":
                return failure(job, f"Preparing it took longer than {self._job_timeout_s:g} s: given up "
                                    "(a damaged file?)."), None
            with self._lock:
                self.crashes += 1
            exit_codes.append(value)
        what = "file" if isinstance(job, CountJob) else "page"
        return failure(job, f"The page renderer crashed on this {what}, twice (exit {exit_codes[-1]}): "
                            "a damaged file?"), None

    def _retire(self, worker: _Worker, stop: bool = False) -> None:
        with self._lock:
            self._live.discard(worker)
        if stop:
            worker.stop()
        else:
            worker.kill()

    # ------------------------------------------------------------ closing
    def _fail_queued(self) -> None:
        while True:
            try:
                item = self._jobs.get_nowait()
            except queue.Empty:
                return
            if item is not None:
                item[1].set_result(failure(item[0], STOPPING))

    def close(self) -> None:
        """Fail what is still queued, stop the workers; returns within a few seconds."""
        self._closing.set()
        self._fail_queued()
        for _ in self._slots:
            self._jobs.put(None)
        deadline = time.monotonic() + CLOSE_GRACE_S
        for slot in self._slots:
            slot.join(max(0.0, deadline - time.monotonic()))
        with self._lock:
            busy = list(self._live)  # workers still inside a job: their slot returns once they are gone
        for worker in busy:
            worker.process.kill()
        for slot in self._slots:
            slot.join(CLOSE_GRACE_S)
        self._fail_queued()  # a job submitted while closing, behind the slots' last call

    def __enter__(self) -> RenderPool:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
