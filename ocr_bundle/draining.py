"""Waiting for worker threads, with a deadline once a stop is asked for.

The stress test's replay and the batch converter both run daemon worker threads and, on
Ctrl-C, stop starting new work, give what is in flight a grace period, then leave it (daemon
threads cannot hold the process). This is that wait, once. Standard library only.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class Countdown:
    """Set `done` when the last of `count` workers has called `finished()`."""

    def __init__(self, count: int):
        self.done = threading.Event()
        self._left = count
        self._lock = threading.Lock()
        if count <= 0:
            self.done.set()

    def finished(self) -> None:
        with self._lock:
            self._left -= 1
            if self._left <= 0:
                self.done.set()


def drain(done: threading.Event, stop: threading.Event, grace_s: float,
          tick: Callable[[], None] = lambda: None, poll_s: float = 0.2) -> bool:
    """Wait for `done`; once `stop` is set, `grace_s` more at most. True when the work
    finished, False when the deadline left some in flight.

    The wait is a timed one, so the main thread handles Ctrl-C meanwhile; `tick` runs at
    every poll (progress, or a check that may set `stop`)."""
    deadline = None
    while not done.wait(poll_s):
        tick()
        if stop.is_set() and deadline is None:
            deadline = time.monotonic() + grace_s
        if deadline is not None and time.monotonic() > deadline:
            return False
    return True
