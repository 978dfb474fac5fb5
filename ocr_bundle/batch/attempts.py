"""One page's attempts: what makes a reply worth keeping, why it is flagged, which errors are worth
sending again, and the PageReader that applies that policy to one page (for the converter's
pipeline and the document API alike)."""

from __future__ import annotations

import json
import threading
from dataclasses import asdict, dataclass

import requests

from ..client import OcrClient, OcrError, OcrResult, build_chat_request
from ..grounding import parse
from .options import BatchOptions
from .repetition import Repetition, repeated_tail
from .server_watch import UNAVAILABLE, ServerWatch

OK, FLAGGED, FAILED = "ok", "flagged", "failed"  # a page's status, as the manifest keeps it
BACKOFF_S = (1.0, 2.0, 4.0, 8.0, 16.0, 30.0)
MAX_RETRY_AFTER_S = 60.0  # a server asking for more than this is waited on in steps of it

PROBLEMS_KEPT = 5  # grounding problems an attempt's record keeps (with their count)


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


class PageReader:
    """One page through the server: each request sent through transport errors and waited through a
    server that is away (`watch`), retried hotter while the reply is cut, loops or does not parse,
    the best attempt kept and flagged when none is clean. `stopping` abandons what is not sent yet."""

    def __init__(self, client: OcrClient, model: str, max_tokens: int, grounding: bool, options: BatchOptions,
                 watch: ServerWatch, stopping: threading.Event):
        self.client, self.model, self.max_tokens, self.grounding = client, model, max_tokens, grounding
        self.options, self.watch, self.stopping = options, watch, stopping

    def read(self, data_url: str, session: requests.Session, stats: PageStats) -> tuple[str, dict, str]:
        """(status, the page's record, the kept reply); PageFailed or PageAbandoned when no attempt answered."""
        attempts: list[tuple[Attempt, str]] = []
        for index, temperature in enumerate(self.options.temperatures()):
            if index and self.stopping.is_set():
                break  # stopping: the attempts received are kept (flagged, for --redo-flagged)
            body = json.dumps(build_chat_request(self.model, data_url, max_tokens=self.max_tokens,
                                                 temperature=temperature, top_p=self.options.top_p, stream=False,
                                                 grounding=self.grounding)).encode()
            try:
                result = self.send(body, session, stats)
            except (PageFailed, PageAbandoned):
                if not attempts:
                    raise
                break  # keep the attempts that did answer
            problems = (tuple(parse(result.text, cut=result.finish_reason == "length").problems)
                        if self.grounding else ())
            attempt = Attempt(temperature, result.finish_reason, result.prompt_tokens, result.completion_tokens,
                              result.latency_s, repeated_tail(result.text), problems)
            attempts.append((attempt, result.text))
            if attempt.clean:
                break
        best, text = max(attempts, key=lambda pair: pair[0].quality())
        flag = flag_of(best, self.max_tokens)
        record = {
            "status": FLAGGED if flag else OK, "attempts": len(attempts), "finish_reason": best.finish_reason,
            "flag": flag, "temperature": best.temperature, "prompt_tokens": best.prompt_tokens,
            "completion_tokens": best.completion_tokens, "latency_s": round(stats.latency_s, 3), "error": None,
            "attempt_log": [a.as_dict() for a, _ in attempts] if len(attempts) > 1 or flag else None,
        }
        return record["status"], record, text

    def send(self, body: bytes, session: requests.Session, stats: PageStats) -> OcrResult:
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
                result = self.client.complete_body(body, self.max_tokens, session=session)
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
