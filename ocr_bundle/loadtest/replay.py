"""Threaded replay of page images against vLLM, and the metrics computed from it.

The request function never raises: every outcome is a RequestResult. Metrics are a pure
function of a list of results (`calculate_metrics`), so they can be tested with
hand-made inputs and recomputed from a saved JSON report.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import requests

from ..client import OcrClient, OcrError, OcrResult, build_chat_request
from ..draining import Countdown, drain
from ..images import (MAX_PDF_PAGES_AT_ONCE, InputError, check_upload_size, is_pdf, pdf_page_count, prepare_upload,
                      to_data_url)


@dataclass(frozen=True)
class Workload:
    """One page, encoded once: the request body bytes reused by every request (or the
    reason it could not be prepared, which then counts as a failed request)."""

    name: str
    body: bytes | None
    error: str | None = None


@dataclass(frozen=True)
class RequestResult:
    ok: bool
    image: str
    status: int | None  # HTTP status when there was one
    error: str | None
    latency_s: float
    ttft_s: float | None
    prompt_tokens: int | None
    completion_tokens: int | None
    start_s: float  # perf_counter() at send, relative to the level's start
    end_s: float
    client_cpu_s: float  # CPU time this request cost the client thread


def percentile(values: list[float], q: float) -> float | None:
    """Linear-interpolation percentile (numpy's default), None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def group_errors(results: list[RequestResult]) -> dict[str, int]:
    """Identical error messages counted together, most frequent first."""
    counts = Counter(r.error or "unknown error" for r in results if not r.ok)
    return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))


@dataclass
class LevelMetrics:
    concurrency: int
    requests: int
    ok: int
    errors: int
    duration_s: float
    pages_per_s: float
    output_tokens_per_s: float
    prompt_tokens_per_s: float
    achieved_concurrency: float
    latency_mean_s: float | None
    latency_p50_s: float | None
    latency_p90_s: float | None
    latency_p99_s: float | None
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    mean_output_tokens: float | None
    errors_by_message: dict[str, int]
    client_cpu_per_request_s: float | None
    client_max_pages_per_s: float | None  # what one client core could drive at that CPU cost
    gpu_memory: dict = field(default_factory=dict)
    vllm: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


def calculate_metrics(results: list[RequestResult], concurrency: int) -> LevelMetrics:
    """Per-level numbers from per-request results. Throughput counts successful pages only,
    over the wall time from the first send to the last answer."""
    ok = [r for r in results if r.ok]
    duration = (max(r.end_s for r in results) - min(r.start_s for r in results)) if results else 0.0
    latencies = [r.latency_s for r in ok]
    ttfts = [r.ttft_s for r in ok if r.ttft_s is not None]
    output_tokens = sum(r.completion_tokens or 0 for r in ok)
    prompt_tokens = sum(r.prompt_tokens or 0 for r in ok)
    busy = sum(r.end_s - r.start_s for r in results)
    cpu = [r.client_cpu_s for r in results]
    cpu_per_request = sum(cpu) / len(cpu) if cpu else None
    return LevelMetrics(
        concurrency=concurrency,
        requests=len(results),
        ok=len(ok),
        errors=len(results) - len(ok),
        duration_s=duration,
        pages_per_s=len(ok) / duration if duration > 0 else 0.0,
        output_tokens_per_s=output_tokens / duration if duration > 0 else 0.0,
        prompt_tokens_per_s=prompt_tokens / duration if duration > 0 else 0.0,
        achieved_concurrency=busy / duration if duration > 0 else 0.0,
        latency_mean_s=sum(latencies) / len(latencies) if latencies else None,
        latency_p50_s=percentile(latencies, 50),
        latency_p90_s=percentile(latencies, 90),
        latency_p99_s=percentile(latencies, 99),
        ttft_p50_s=percentile(ttfts, 50),
        ttft_p99_s=percentile(ttfts, 99),
        mean_output_tokens=output_tokens / len(ok) if ok else None,
        errors_by_message=group_errors(results),
        client_cpu_per_request_s=cpu_per_request,
        client_max_pages_per_s=(1.0 / cpu_per_request) if cpu_per_request else None,
    )


def prepare_workload(name: str, image_url: str | None, error: str | None, model: str, *, max_tokens: int,
                     temperature: float, top_p: float, stream: bool, ignore_eos: bool,
                     grounding: bool = False) -> Workload:
    if image_url is None:
        return Workload(name, None, error)
    body = build_chat_request(model, image_url, max_tokens=max_tokens, temperature=temperature, top_p=top_p,
                              stream=stream, ignore_eos=ignore_eos, grounding=grounding)
    return Workload(name, json.dumps(body).encode())


def load_workloads(paths: list[Path], model: str, *, raw: bool, encoding: str, **request_options) -> list[Workload]:
    """Prepare every page once (`request_options`: prepare_workload's). A file that cannot be prepared
    stays in the list as an error, so the requests it would have made are counted as failures, not
    silently dropped. `raw`: the file's bytes as they are, not the page the model expects."""
    workloads = []
    for path in paths:
        try:
            data = path.read_bytes()
            check_upload_size(data)
            if raw:
                mime = "application/pdf" if is_pdf(data) else "image/" + (path.suffix.lstrip(".").lower() or "png")
                pages = [(path.name, to_data_url(data, mime))]
            elif is_pdf(data):
                count = min(pdf_page_count(data), MAX_PDF_PAGES_AT_ONCE)
                pages = [(f"{path.name}#p{n}", prepare_upload(data, n, fmt=encoding).data_url)
                         for n in range(1, count + 1)]
            else:
                pages = [(path.name, prepare_upload(data, fmt=encoding).data_url)]
            workloads += [prepare_workload(name, url, None, model, **request_options) for name, url in pages]
        except (InputError, OSError) as exc:
            workloads.append(prepare_workload(path.name, None, f"unusable input {path.name}: {exc}", model,
                                              **request_options))
    return workloads


class Replayer:
    """Sends workloads at a fixed concurrency: `concurrency` threads, one HTTP session each."""

    def __init__(self, client: OcrClient, max_tokens: int, stream: bool, timeout_s: float):
        self.client = client
        self.max_tokens = max_tokens
        self.stream = stream
        self.timeout_s = timeout_s
        self._local = threading.local()

    def _session(self) -> requests.Session:
        session = getattr(self._local, "session", None)
        if session is None:
            session = self._local.session = self.client.new_session()
        return session

    def send(self, workload: Workload, level_start: float) -> RequestResult:
        """One request; never raises."""
        cpu_start = time.thread_time()
        start = time.perf_counter()
        status, error, result = None, None, None
        try:
            if workload.body is None:
                raise OcrError(workload.error or "image could not be prepared", "input")
            if self.stream:
                for event in self.client.stream_body(workload.body, self.max_tokens, session=self._session(),
                                                     total_timeout=self.timeout_s):
                    if isinstance(event, OcrResult):
                        result = event
            else:
                result = self.client.complete_body(workload.body, self.max_tokens, session=self._session())
            status = 200
        except OcrError as exc:
            status, error = exc.status, str(exc)
        except Exception as exc:  # a client bug must not lose the request: record it
            error = f"client error: {type(exc).__name__}: {exc}"
        end = time.perf_counter()
        return RequestResult(
            ok=result is not None and error is None,
            image=workload.name,
            status=status,
            error=error,
            latency_s=end - start,
            ttft_s=result.ttft_s if result else None,
            prompt_tokens=result.prompt_tokens if result else None,
            completion_tokens=result.completion_tokens if result else None,
            start_s=start - level_start,
            end_s=end - level_start,
            client_cpu_s=time.thread_time() - cpu_start,
        )

    def run(self, workloads: list[Workload], concurrency: int, requests_count: int,
            stop: threading.Event | None = None, grace_s: float = 30.0,
            on_result: Callable[[RequestResult], None] = lambda result: None, ramp_s: float = 0.0) -> LevelRun:
        """`requests_count` requests cycling over the workloads, `concurrency` in flight.

        `ramp_s` spreads the first `concurrency` sends evenly over that many seconds instead of
        sending them at once: identical pages sent together stay in step (encoded, decoded and
        answered together), spread they keep the server in the mix a long conversion sees.
        When `stop` is set (Ctrl-C), no new request starts; those in flight get `grace_s`
        to finish, then are abandoned (daemon threads: they cannot hold the process)."""
        stop = stop or threading.Event()
        level_start = time.perf_counter()
        results: list[RequestResult] = []
        lock = threading.Lock()
        issued = 0

        threads_count = min(concurrency, requests_count)
        workers = Countdown(threads_count)

        def worker(delay_s: float) -> None:
            nonlocal issued
            try:
                if stop.wait(delay_s):
                    return
                while not stop.is_set():
                    with lock:
                        if issued >= requests_count:
                            return
                        index, issued = issued, issued + 1
                    result = self.send(workloads[index % len(workloads)], level_start)
                    with lock:
                        results.append(result)
                    on_result(result)
            finally:
                workers.finished()

        for i in range(threads_count):
            threading.Thread(target=worker, args=(i * ramp_s / threads_count,), name=f"c{concurrency}-{i}",
                             daemon=True).start()
        drain(workers.done, stop, grace_s)
        with lock:
            finished = sorted(results, key=lambda r: r.start_s)
            return LevelRun(finished, cancelled=requests_count - issued, abandoned=issued - len(finished))


@dataclass(frozen=True)
class LevelRun:
    results: list[RequestResult]
    cancelled: int = 0  # never sent: the run was interrupted
    abandoned: int = 0  # sent, but no answer within the grace period after the interrupt
