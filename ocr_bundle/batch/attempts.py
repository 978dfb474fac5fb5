"""One page's attempts: what makes a reply worth keeping, why it is flagged, and which errors are
worth sending again (the retry policy the pipeline applies)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ..client import OcrError
from .repetition import Repetition

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
