"""Ctrl-C for long runs (stress test, batch converter): the first stops gracefully, the second at once.

The first SIGINT or SIGTERM calls `on_first` (stop admitting work: what is in flight may
finish and the results are written); a second exits the process immediately with 130,
which is safe because everything the bundle writes is written atomically.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable


class GracefulInterrupt:
    """A context manager that owns SIGINT and SIGTERM while a long run goes on."""

    def __init__(self, on_first: Callable[[], None], last_words: str):
        self.on_first = on_first
        self.last_words = last_words
        self.received: list[int] = []
        self._previous: dict[int, object] = {}

    def _handle(self, signum: int, _frame) -> None:
        self.received.append(signum)
        if len(self.received) > 1:
            os.write(2, f"\nsecond interrupt: exiting now, {self.last_words}\n".encode())
            os._exit(130)
        self.on_first()

    @property
    def interrupted(self) -> bool:
        return bool(self.received)

    @property
    def exit_code(self) -> int:
        """130 for Ctrl-C, 143 for SIGTERM: the shell's convention (128 + signal)."""
        return 128 + self.received[0] if self.received else 0

    def __enter__(self) -> GracefulInterrupt:
        self._previous = {sig: signal.signal(sig, self._handle) for sig in (signal.SIGINT, signal.SIGTERM)}
        return self

    def __exit__(self, *exc_info) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
