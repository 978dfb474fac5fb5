"""The page's login, hardened: its cookie only over HTTPS, and password guessing slowed down.

Gradio's login sets two cookies holding the same session token: `access-token-<id>` (Secure,
SameSite=None) and `access-token-unsecure-<id>` (no Secure, so that a login works over plain
HTTP). Over HTTPS the second one is a leak: a browser sends it on any `http://` request to the
same host, where anyone on the path reads it, and it alone opens the page (Gradio accepts either).
So with TLS on, PageGuard removes that cookie from every response, refuses it on every request
(it is stripped before Gradio sees it), and marks any other cookie Secure.

Logins: Gradio answers a wrong password at once, without limit (200 guesses took 2.8 s). PageGuard
counts failed logins per client address; after FREE_FAILURES, each further failure doubles the time
that address must wait before its next attempt (1 s, 2 s, 4 s ... up to MAX_DELAY_S). An attempt
made too early is answered 429 with Retry-After and never reaches the password check. A success
clears the count; so does a quiet FORGET_AFTER_S. Each slowed address is said in the page's log.

A pure ASGI middleware (added through Gradio's `app_kwargs`), so it wraps every route of the page.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

UNSECURE_COOKIE = "access-token-unsecure-"
LOGIN_PATHS = ("/login", "/login/")
FREE_FAILURES = 5
MAX_DELAY_S = 300.0
FORGET_AFTER_S = 900.0


@dataclass
class _Record:
    failures: int = 0
    last_failure: float = 0.0
    next_allowed: float = 0.0


class LoginBackoff:
    """Failed logins per client address, and how long each must wait before trying again."""

    def __init__(self, free_failures: int = FREE_FAILURES, max_delay_s: float = MAX_DELAY_S,
                 forget_after_s: float = FORGET_AFTER_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.free_failures, self.max_delay_s, self.forget_after_s = free_failures, max_delay_s, forget_after_s
        self.clock = clock
        self._records: dict[str, _Record] = {}
        self._lock = threading.Lock()

    def wait_s(self, address: str) -> float:
        """Seconds `address` must still wait before its next attempt (0: it may try now)."""
        with self._lock:
            record = self._current(address)
            return max(0.0, record.next_allowed - self.clock()) if record else 0.0

    def failed(self, address: str) -> float:
        """Record a failed login; the delay now imposed on `address` (0 within the free failures)."""
        with self._lock:
            now = self.clock()
            record = self._current(address) or self._records.setdefault(address, _Record())
            record.failures += 1
            record.last_failure = now
            over = record.failures - self.free_failures
            delay = min(2.0 ** (over - 1), self.max_delay_s) if over > 0 else 0.0
            record.next_allowed = now + delay
            return delay

    def succeeded(self, address: str) -> None:
        with self._lock:
            self._records.pop(address, None)

    def failures(self, address: str) -> int:
        with self._lock:
            record = self._current(address)
            return record.failures if record else 0

    def _current(self, address: str) -> _Record | None:
        record = self._records.get(address)
        if record is not None and self.clock() - record.last_failure > self.forget_after_s:
            del self._records[address]
            return None
        return record


def _cookie_name(set_cookie: bytes) -> bytes:
    return set_cookie.split(b"=", 1)[0].strip()


def secure_response_headers(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """Over HTTPS: no unsecure token cookie, and every other cookie Secure."""
    kept = []
    for name, value in headers:
        if name.lower() == b"set-cookie":
            if _cookie_name(value).decode("latin-1").startswith(UNSECURE_COOKIE):
                continue
            if b"secure" not in [part.strip().lower() for part in value.split(b";")]:
                value += b"; Secure"
        kept.append((name, value))
    return kept


def without_unsecure_cookie(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """A request's headers with the unsecure token cookie taken out of its Cookie header."""
    cleaned = []
    for name, value in headers:
        if name.lower() == b"cookie":
            parts = [part for part in value.split(b";")
                     if not part.strip().decode("latin-1").startswith(UNSECURE_COOKIE)]
            if not parts:
                continue
            value = b";".join(parts)
        cleaned.append((name, value))
    return cleaned


class PageGuard:
    """ASGI middleware: see the module's docstring. `https`: the page is served over TLS."""

    def __init__(self, app, https: bool, backoff: LoginBackoff | None = None,
                 say: Callable[[str], None] | None = None) -> None:
        self.app = app
        self.https = https
        self.backoff = backoff or LoginBackoff()
        self.say = say or (lambda line: print(f"[page] {line}", file=sys.stderr, flush=True))

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        if self.https:
            scope = {**scope, "headers": without_unsecure_cookie(list(scope.get("headers", [])))}
        is_login = scope["type"] == "http" and scope.get("method") == "POST" and scope["path"] in LOGIN_PATHS
        address = (scope.get("client") or ("unknown", 0))[0]
        if is_login and (wait := self.backoff.wait_s(address)) > 0:
            await self._too_early(send, wait)
            return
        status: list[int] = []

        async def guarded_send(message) -> None:
            if message["type"] == "http.response.start":
                status.append(message["status"])
                if self.https:
                    message = {**message, "headers": secure_response_headers(list(message.get("headers", [])))}
            await send(message)

        await self.app(scope, receive, guarded_send)
        if is_login and status:
            if status[0] == 200:
                self.backoff.succeeded(address)
            elif status[0] in (400, 401, 403):
                delay = self.backoff.failed(address)
                if delay > 0:
                    self.say(f"{self.backoff.failures(address)} failed logins from {address}: its next attempt is "
                             f"allowed in {delay:g} s")

    @staticmethod
    async def _too_early(send, wait_s: float) -> None:
        seconds = max(1, round(wait_s + 0.49))
        body = json.dumps({"detail": f"Too many failed logins from this address: try again in {seconds} s."}).encode()
        await send({"type": "http.response.start", "status": 429,
                    "headers": [(b"content-type", b"application/json"), (b"retry-after", str(seconds).encode())]})
        await send({"type": "http.response.body", "body": body})
