"""A server's membership in the head's gateway: checked before it starts, joined once ready,
kept joined, left when stopped.

start_optimized.sh runs `keep` beside every server that serves through a gateway (the head's
own and each joining machine's), as a service of its own with a PID file:

    python3 -m ocr_bundle.serve.membership preflight --gateway URL --bind 0.0.0.0 --port 8000
    python3 -m ocr_bundle.serve.membership advertise --bind 0.0.0.0 --port 8000 --gateway URL
    python3 -m ocr_bundle.serve.membership join  --gateway URL --server URL   # 0 joined, 3 unreachable, 2 refused
    python3 -m ocr_bundle.serve.membership keep  --gateway URL --server URL --pid-file run/vllm.pid
    python3 -m ocr_bundle.serve.membership leave --gateway URL --server URL
    python3 -m ocr_bundle.serve.membership members --gateway URL              # the servers in its pool

`preflight` runs before vLLM starts (minutes on a GPU) and refuses, exit 2, what would only
fail later: a URL that answers but is not a gateway (the head's vLLM port, the page), an admin
key the gateway refuses, a client key it refuses (the gateway sends its own to every server, so
a server with another key would answer 401 to every request sent to it), an address the
gateway cannot reach. A gateway that does not answer yet is fine (exit 3): `keep` joins it
once it does.

`keep` checks every few seconds that the server is in the gateway's pool and adds it again
when it is not: a head that restarts (an empty pool) gets every live server back within one
interval, with no one telling the nodes. It never gives up while the server lives: a failure
(gateway down, refused, slow to add) is logged and tried again at the next interval. A server
whose process is gone is removed, and `keep` ends. On TERM (stop_optimized.sh) it removes the
server first, then waits until the server has finished the requests it holds, so stopping a
node fails no request: the gateway has stopped sending it work.

Keys come from the environment: ROUTER_ADMIN_KEY on the pool calls (SMG's `/workers`), the
client key VLLM_API_KEY on the one preflight request that checks it and in the request that
adds the server (the gateway sends it there), no key on a server's own /health and /metrics
(open by design). Redirects are never followed: a key goes to the URL it
was meant for or nowhere.

With TLS (TLS_CERT, TLS_KEY, TLS_CA in the environment) every call is HTTPS: the gateway is
verified against TLS_CA before a key is sent to it (a certificate that does not verify is a
refusal, exit 2, not something to wait for), this machine's certificate is presented (its own
server, behind the gateway, requires one), and the server is advertised as https://.

Standard library only: the start script runs it with the system's python3.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ocr_bundle import prometheus, tls
from ocr_bundle.exposure import ADMIN_KEY_ENV, KEY_ENV, is_all_interfaces, unreachable_from, url_host
from ocr_bundle.serve.processes import read_pid_file
from ocr_bundle.settings import number_at_least_zero, port_number, positive_number

KEEP_INTERVAL_S = 5.0
DRAIN_TIMEOUT_S = 60.0
ADD_WAIT_S = 40.0  # the gateway adds a server once its own /health check and model discovery pass


class GatewayUnreachable(Exception):
    """No answer from the gateway (down, restarting, wrong address), or a 5xx: try again later."""


class GatewayRefused(Exception):
    """The gateway answered and refused: a wrong key, or the URL is not a gateway."""


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, request, fp, code, message, headers, new_url):  # noqa: PLR0913 (urllib's signature)
        raise GatewayRefused(f"{request.full_url} redirects to {new_url}: not a gateway's admin API (redirects are "
                             "not followed with a key)")


_OPENER = urllib.request.build_opener(_NoRedirects)


def _call(method: str, url: str, key: str | None, timeout_s: float, body: dict | None = None,
          trust: tls.Trust | None = None) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    data = None
    if body is not None:
        data, headers["Content-Type"] = json.dumps(body).encode(), "application/json"
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    opener = _OPENER if trust is None else \
        urllib.request.build_opener(_NoRedirects, urllib.request.HTTPSHandler(context=trust.ssl_context()))
    try:
        with opener.open(request, timeout=timeout_s) as response:
            return response.status, response.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")
    except (urllib.error.URLError, OSError) as exc:
        if (explained := tls.explain(exc, url, trust or tls.Trust())) is not None:
            raise GatewayRefused(explained) from None  # a certificate that does not verify will not by waiting
        reason = getattr(exc, "reason", exc)
        if isinstance(reason, socket.gaierror):  # a name that does not resolve: a typo, not a head starting
            raise GatewayRefused(unresolvable(url, reason)) from None
        raise GatewayUnreachable(f"{url}: {reason}") from None


def unresolvable(url: str, error: socket.gaierror) -> str:
    return (f"cannot resolve {urllib.parse.urlsplit(url).hostname} ({url}): {error.strerror or error}. Is JOIN the "
            "head's address?")


def normalized(url: str) -> str:
    return url.rstrip("/")


@dataclass(frozen=True)
class Gateway:
    """SMG's admin API (`/workers`) with the admin key, and the one client-key check. A server is
    added with the client key, which the gateway then sends it (SMG discovers the served model
    through the server's keyed /v1/models)."""

    url: str
    admin_key: str | None
    client_key: str | None = None
    timeout_s: float = 10.0
    trust: tls.Trust | None = None  # this machine's TLS (tls.machine_trust), None for plain HTTP

    def servers(self) -> dict[str, dict]:
        """The pool: server URL -> SMG's record of it (id, is_healthy, status, ...)."""
        status, body = _call("GET", f"{normalized(self.url)}/workers", self.admin_key, self.timeout_s,
                             trust=self.trust)
        if status in (401, 403):
            raise GatewayRefused(f"the gateway at {self.url} refused {ADMIN_KEY_ENV} ({status}): it must be the "
                                 "head's admin key")
        if status >= 500:
            raise GatewayUnreachable(f"the gateway at {self.url} answered {status}")
        try:
            records = json.loads(body)["workers"] if status == 200 else None
        except (ValueError, KeyError, TypeError):
            records = None
        if not isinstance(records, list):
            raise GatewayRefused(f"{self.url} is not a gateway: GET /workers answered {status} "
                                 f"{body[:80]!r} (JOIN is the head's gateway port, not its vLLM server or page)")
        return {normalized(str(record.get("url", ""))): record for record in records if isinstance(record, dict)}

    def add(self, server: str, wait_s: float = ADD_WAIT_S) -> None:
        """Add `server` and wait until the pool lists it (SMG adds in the background)."""
        spec = {"url": server, **({"api_key": self.client_key} if self.client_key else {})}
        status, body = _call("POST", f"{normalized(self.url)}/workers", self.admin_key, self.timeout_s, spec,
                             self.trust)
        if status in (401, 403):
            raise GatewayRefused(f"the gateway at {self.url} refused {ADMIN_KEY_ENV} ({status})")
        if status not in (200, 201, 202, 409):  # 409: listed already
            raise GatewayUnreachable(f"the gateway at {self.url} answered {status} to adding {server}: {body[:200]}")
        deadline = time.monotonic() + wait_s
        while normalized(server) not in self.servers():
            if time.monotonic() > deadline:
                raise GatewayUnreachable(f"the gateway at {self.url} accepted {server} but has not added it after "
                                         f"{wait_s:g} s (does it answer the gateway's /health? the same {KEY_ENV}? "
                                         "with TLS: is its certificate signed by the gateway's CA, and does it name "
                                         "this address?)")
            time.sleep(0.5)

    def remove(self, server: str, wait_s: float = 10.0) -> None:
        """Remove `server` and wait until the pool no longer lists it (SMG removes in the background)."""
        record = self.servers().get(normalized(server))
        if record is None:
            return
        status, body = _call("DELETE", f"{normalized(self.url)}/workers/{urllib.parse.quote(str(record['id']))}",
                             self.admin_key, self.timeout_s, trust=self.trust)
        if status in (401, 403):
            raise GatewayRefused(f"the gateway at {self.url} refused {ADMIN_KEY_ENV} ({status})")
        if status not in (200, 202, 204, 404):
            raise GatewayUnreachable(f"the gateway at {self.url} answered {status} to removing {server}: {body[:200]}")
        deadline = time.monotonic() + wait_s
        while normalized(server) in self.servers():
            if time.monotonic() > deadline:
                raise GatewayUnreachable(f"the gateway at {self.url} accepted removing {server} but still lists it")
            time.sleep(0.2)

    def identify(self) -> None:
        """Refuse a URL that answers but is not SMG: its /liveness answers "OK" to anyone, where a
        keyed vLLM server answers 401 and the page or an unkeyed server 404."""
        status, body = _call("GET", f"{normalized(self.url)}/liveness", None, self.timeout_s, trust=self.trust)
        if status >= 500:
            raise GatewayUnreachable(f"the gateway at {self.url} answered {status}")
        if status != 200 or body.strip() != "OK":
            raise GatewayRefused(f"{self.url} is not a gateway: GET /liveness answered {status} (JOIN is the head's "
                                 "gateway port, not a vLLM server's or the page's)")

    def accepts_client_key(self, key: str | None) -> bool:
        """Whether the gateway lets `key` through to its servers: a chat request with an empty body
        is refused (401) before it is read when the key is wrong, and never reaches a server."""
        status, _ = _call("POST", f"{normalized(self.url)}/v1/chat/completions", key, self.timeout_s, {},
                          self.trust)
        if status >= 500:
            raise GatewayUnreachable(f"the gateway at {self.url} answered {status}")
        return status not in (401, 403)


def advertised_url(bind_host: str, port: int, gateway_url: str, scheme: str = "http") -> str:
    """The URL the gateway reaches this server at: its bind address, or, bound to all
    interfaces, this machine's address on the route to the gateway. `scheme`: https with TLS."""
    host = bind_host
    if is_all_interfaces(bind_host):
        gateway_host = urllib.parse.urlsplit(gateway_url).hostname or "127.0.0.1"
        family = socket.AF_INET6 if ":" in gateway_host else socket.AF_INET
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            try:
                probe.connect((gateway_host, 9))  # a UDP "connect" sends nothing; it only picks the route
            except socket.gaierror as exc:
                raise GatewayRefused(unresolvable(gateway_url, exc)) from None
            host = probe.getsockname()[0]
    elif bind_host == "localhost":
        host = "127.0.0.1"
    return f"{scheme}://{url_host(host)}:{port}"


def preflight(gateway: Gateway, server_url: str) -> None:
    """Refuse (GatewayRefused) what would only fail once vLLM has started; GatewayUnreachable
    when the gateway does not answer yet (the keeper joins it later)."""
    gateway_parts, server_parts = urllib.parse.urlsplit(gateway.url), urllib.parse.urlsplit(server_url)
    if (gateway_parts.hostname, gateway_parts.port) == (server_parts.hostname, server_parts.port):
        raise GatewayRefused(f"this server would listen at {server_url}, which is the gateway's own address")
    if unreachable_from(gateway_parts.hostname or "", server_parts.hostname or ""):
        raise GatewayRefused(f"the gateway at {gateway_parts.hostname} cannot reach {server_url}, a loopback address")
    gateway.identify()
    gateway.servers()  # the admin key is right
    if not gateway.accepts_client_key(gateway.client_key):
        raise GatewayRefused(f"the gateway at {gateway.url} refuses this machine's {KEY_ENV}: it sends its own key "
                             "to every server, so this server would refuse every request. Use the head's key")


def server_load(server_url: str, trust: tls.Trust | None = None, timeout_s: float = 3.0) -> int | None:
    """Requests the server holds (running + waiting, from its /metrics); None if it does not answer."""
    try:
        status, text = _call("GET", f"{normalized(server_url)}/metrics", None, timeout_s, trust=trust)
        held = prometheus.fold(text, {"vllm:num_requests_running": sum, "vllm:num_requests_waiting": sum})
    except (GatewayUnreachable, GatewayRefused, ValueError):
        return None
    return round(sum(held.values())) if status == 200 else None


def server_healthy(server_url: str, trust: tls.Trust | None = None) -> bool:
    try:
        return _call("GET", f"{normalized(server_url)}/health", None, 3.0, trust=trust)[0] == 200
    except (GatewayUnreachable, GatewayRefused):
        return False


def drain(server_url: str, timeout_s: float, say: Callable[[str], None], trust: tls.Trust | None = None) -> None:
    """Wait until the server holds no request (or is gone, or the time is up)."""
    deadline = time.monotonic() + timeout_s
    while (held := server_load(server_url, trust)) and time.monotonic() < deadline:
        say(f"waiting for the {held} request(s) {server_url} still holds")
        time.sleep(1.0)


def keep(gateway: Gateway, server: str, server_alive: Callable[[], bool], stop: threading.Event,
         say: Callable[[str], None], interval_s: float = KEEP_INTERVAL_S, drain_s: float = DRAIN_TIMEOUT_S) -> int:
    """Keep `server` in the gateway's pool while its process lives; leave on `stop`."""
    joined_before = False
    while not stop.is_set():
        if not server_alive():
            say(f"the server at {server} is gone: leaving the gateway")
            _leave_quietly(gateway, server, say)
            return 1
        try:
            if normalized(server) in gateway.servers():
                joined_before = True
            elif server_healthy(server, gateway.trust):
                gateway.add(server)
                say(f"{'re' if joined_before else ''}joined the gateway at {gateway.url} as {server}")
                joined_before = True
        except (GatewayUnreachable, GatewayRefused) as exc:
            say(f"{exc}; trying again in {interval_s:g} s")
        stop.wait(interval_s)
    _leave_quietly(gateway, server, say)
    drain(server, drain_s, say, gateway.trust)
    return 0


def _leave_quietly(gateway: Gateway, server: str, say: Callable[[str], None]) -> None:
    try:
        gateway.remove(server)
        say(f"left the gateway at {gateway.url}")
    except (GatewayUnreachable, GatewayRefused) as exc:
        say(f"could not leave the gateway ({exc}); it stops sending to {server} once its health checks fail")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m ocr_bundle.serve.membership", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    for name in ("advertise", "preflight"):
        command = commands.add_parser(name, help="print the URL the gateway reaches this server at" if name ==
                                      "advertise" else "refuse, before vLLM starts, what would fail once it runs")
        command.add_argument("--bind", required=True)
        command.add_argument("--port", type=port_number, required=True)
        command.add_argument("--gateway", required=True)
    members = commands.add_parser("members", help="print the servers in the gateway's pool")
    members.add_argument("--gateway", required=True)
    for name in ("join", "leave", "keep"):
        command = commands.add_parser(name)
        command.add_argument("--gateway", required=True, help="the gateway's URL (the head's endpoint)")
        command.add_argument("--server", required=True, help="this server's URL as the gateway reaches it")
        if name == "keep":
            command.add_argument("--pid-file", type=Path, required=True, help="the server's PID file")
            command.add_argument("--interval", type=positive_number, default=KEEP_INTERVAL_S)
            command.add_argument("--drain-timeout", type=number_at_least_zero, default=DRAIN_TIMEOUT_S,
                                 help="on stop, seconds to wait for the server's requests after leaving")
    args = parser.parse_args(argv)
    if args.command == "advertise":
        try:
            print(advertised_url(args.bind, args.port, args.gateway, tls.scheme()))
        except GatewayRefused as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        return 0

    def say(line: str) -> None:
        print(f"[membership] {time.strftime('%H:%M:%S')} {line}", flush=True)

    gateway = Gateway(args.gateway, os.environ.get(ADMIN_KEY_ENV) or None, os.environ.get(KEY_ENV) or None,
                      trust=tls.machine_trust())
    try:
        if args.command == "preflight":
            preflight(gateway, advertised_url(args.bind, args.port, args.gateway, tls.scheme()))
            return 0
        if args.command == "members":
            print(" ".join(gateway.servers()) or "none yet")
            return 0
        if args.command == "join":
            if normalized(args.server) not in gateway.servers():
                gateway.add(args.server)
            say(f"joined the gateway at {args.gateway} as {args.server}")
            return 0
        if args.command == "leave":
            gateway.remove(args.server)
            say(f"left the gateway at {args.gateway}")
            return 0
    except GatewayUnreachable as exc:
        print(f"gateway not reachable: {exc}", file=sys.stderr)
        return 3
    except GatewayRefused as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    service = read_pid_file(args.pid_file)
    if service is None:
        print(f"error: no server recorded in {args.pid_file}", file=sys.stderr)
        return 2
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    return keep(gateway, args.server, service.alive, stop, say, args.interval, args.drain_timeout)


if __name__ == "__main__":
    sys.exit(main())
