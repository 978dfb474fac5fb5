"""Is the server there? Shared by the senders of a run: one probe per second at most, whoever asks;
502/503/504 (a gateway with no server ready) and refused connections waited out up to --server-wait."""

from __future__ import annotations

import threading
import time

from ..client import OcrClient, OcrError

UNAVAILABLE = (502, 503, 504)  # a gateway (or proxy) with no server ready behind it
UNAVAILABLE_PAUSE_S = 2.0  # between tries while the server is unavailable


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
