"""Slots to the OCR server shared by every request of the document API, handed out in turn.

A request waiting for a slot goes behind every other request waiting: the next free slot goes to
the request that has waited longest since it was last served, not to the page that asked first. So
a 1,000-page document takes the free slots while it is alone, and ten one-page requests arriving
behind it each get one of the next ten slots instead of waiting for its 1,000 pages.
"""

from __future__ import annotations

import threading
from collections import Counter, deque


class FairSlots:
    def __init__(self, slots: int):
        self.slots = slots
        self._free = slots
        self._turns: deque[object] = deque()  # owners with a page waiting, the next to be served first
        self._waiting: Counter = Counter()  # owner -> pages waiting
        self._changed = threading.Condition()

    def acquire(self, owner: object, cancelled: threading.Event) -> bool:
        """Wait for a slot in `owner`'s turn; False (and no slot) once `cancelled` is set."""
        with self._changed:
            if not self._waiting[owner]:
                self._turns.append(owner)
            self._waiting[owner] += 1
            try:
                while not cancelled.is_set():
                    if self._free and self._turns[0] == owner:
                        self._free -= 1
                        return True
                    self._changed.wait(0.25)
                return False
            finally:
                self._waiting[owner] -= 1
                self._turns.remove(owner)
                if self._waiting[owner]:
                    self._turns.append(owner)  # its next page waits behind everyone else's
                else:
                    del self._waiting[owner]
                self._changed.notify_all()

    def release(self) -> None:
        with self._changed:
            self._free += 1
            self._changed.notify_all()

    def in_use(self) -> int:
        with self._changed:
            return self.slots - self._free
