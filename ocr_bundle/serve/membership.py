"""A server's membership in the head's router: join once ready, stay joined, leave when stopped.

start_optimized.sh runs `keep` beside every server that serves through a router (the head's
own and each joining machine's), as a service of its own with a PID file:

    python3 -m ocr_bundle.serve.membership advertise --bind 0.0.0.0 --port 8000 --router http://10.0.0.1:8000
    python3 -m ocr_bundle.serve.membership join  --router URL --worker URL   # 0 joined, 3 router unreachable, 2 refused
    python3 -m ocr_bundle.serve.membership keep  --router URL --worker URL --pid-file run/vllm.pid
    python3 -m ocr_bundle.serve.membership leave --router URL --worker URL
    python3 -m ocr_bundle.serve.membership members --router URL                # the servers it lists

`keep` checks every few seconds that the server is in the router's list and adds it again
when it is not: a head that restarts (an empty list) gets every live server back within one
interval, with no one telling the nodes. A server that answers /health is added; one whose
process is gone is removed, and `keep` ends. On TERM (stop_optimized.sh) it removes the
server from the router first, then waits until the server has finished the requests it
holds, so stopping a node fails no request: the router has stopped sending it work.

The router's /add_worker and /remove_worker take VLLM_API_KEY (from the environment, never
argv); its list, /list_workers, answers without one.

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

from ocr_bundle.serve.processes import read_pid_file

KEEP_INTERVAL_S = 5.0
DRAIN_TIMEOUT_S = 60.0
ALL_INTERFACES = {"0.0.0.0", "::", ""}


class RouterUnreachable(Exception):
    """No answer from the router (down, restarting, wrong address)."""


class RouterRefused(Exception):
    """The router answered but refused (a wrong or missing key, a bad URL): retrying will not help."""


def _status_and_body(request: urllib.request.Request, timeout: float) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")
    except (urllib.error.URLError, OSError) as exc:
        raise RouterUnreachable(f"{request.full_url}: {getattr(exc, 'reason', exc)}") from None


def normalized(url: str) -> str:
    return url.rstrip("/")


@dataclass(frozen=True)
class Router:
    url: str
    key: str | None = None
    timeout_s: float = 40.0  # /add_worker answers once the server passes the router's own /health check

    def _call(self, method: str, path: str) -> tuple[int, str]:
        headers = {"Authorization": f"Bearer {self.key}"} if self.key else {}
        request = urllib.request.Request(f"{normalized(self.url)}{path}", method=method, headers=headers)
        return _status_and_body(request, self.timeout_s)

    def members(self) -> list[str]:
        status, body = self._call("GET", "/list_workers")
        if status != 200:
            raise RouterUnreachable(f"{self.url}/list_workers answered {status}: is this a vllm-router?")
        return [normalized(url) for url in json.loads(body).get("urls", [])]

    def _change(self, action: str, worker: str) -> str:
        status, body = self._call("POST", f"/{action}?url={urllib.parse.quote(worker, safe=':/')}")
        if status in (401, 403):
            raise RouterRefused(f"the router at {self.url} refused /{action} ({status}): VLLM_API_KEY must be the "
                                "head's key")
        if status in (502, 503, 504):
            raise RouterUnreachable(f"the router at {self.url} answered {status} to /{action}")
        return body.strip()

    def add(self, worker: str) -> None:
        answer = self._change("add_worker", worker)
        if normalized(worker) not in self.members():
            raise RouterRefused(f"the router at {self.url} did not add {worker}: {answer[:300]}")

    def remove(self, worker: str) -> None:
        self._change("remove_worker", worker)


def advertised_url(bind_host: str, port: int, router_url: str) -> str:
    """The URL the router reaches this server at: its bind address, or, bound to all
    interfaces, this machine's address on the route to the router."""
    host = bind_host
    if bind_host in ALL_INTERFACES:
        router_host = urllib.parse.urlsplit(router_url).hostname or "127.0.0.1"
        family = socket.AF_INET6 if ":" in router_host else socket.AF_INET
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect((router_host, 9))  # a UDP "connect" sends nothing; it only picks the route
            host = probe.getsockname()[0]
    elif bind_host == "localhost":
        host = "127.0.0.1"
    return f"http://{f'[{host}]' if ':' in host else host}:{port}"


def server_load(server_url: str, timeout_s: float = 3.0) -> int | None:
    """Requests the server holds (running + waiting, from its /metrics); None if it does not answer."""
    try:
        with urllib.request.urlopen(f"{normalized(server_url)}/metrics", timeout=timeout_s) as response:
            text = response.read().decode(errors="replace")
    except (urllib.error.URLError, OSError):
        return None
    held = 0.0
    for line in text.splitlines():
        if line.startswith(("vllm:num_requests_running", "vllm:num_requests_waiting")):
            held += float(line.rsplit(" ", 1)[1])
    return round(held)


def server_healthy(server_url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{normalized(server_url)}/health", timeout=3) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def drain(server_url: str, timeout_s: float, say: Callable[[str], None]) -> None:
    """Wait until the server holds no request (or is gone, or the time is up)."""
    deadline = time.monotonic() + timeout_s
    while (held := server_load(server_url)) and time.monotonic() < deadline:
        say(f"waiting for the {held} request(s) {server_url} still holds")
        time.sleep(1.0)


def keep(router: Router, worker: str, server_alive: Callable[[], bool], stop: threading.Event,
         say: Callable[[str], None], interval_s: float = KEEP_INTERVAL_S, drain_s: float = DRAIN_TIMEOUT_S) -> int:
    """Keep `worker` in the router's list while its server lives; leave on `stop`."""
    joined_before = False
    while not stop.is_set():
        if not server_alive():
            say(f"the server at {worker} is gone: leaving the router")
            _leave_quietly(router, worker, say)
            return 1
        try:
            if server_healthy(worker) and normalized(worker) not in router.members():
                router.add(worker)
                say(f"{'re' if joined_before else ''}joined the router at {router.url} as {worker}")
                joined_before = True
            elif not joined_before:
                joined_before = normalized(worker) in router.members()
        except RouterUnreachable as exc:
            say(f"router not reachable ({exc}); trying again in {interval_s:g} s")
        except RouterRefused as exc:
            say(f"error: {exc}")
            return 2
        stop.wait(interval_s)
    _leave_quietly(router, worker, say)
    drain(worker, drain_s, say)
    return 0


def _leave_quietly(router: Router, worker: str, say: Callable[[str], None]) -> None:
    try:
        router.remove(worker)
        say(f"left the router at {router.url}")
    except (RouterUnreachable, RouterRefused) as exc:
        say(f"could not leave the router ({exc}); it drops {worker} once its health checks fail")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m ocr_bundle.serve.membership", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    advertise = commands.add_parser("advertise", help="print the URL the router reaches this server at")
    advertise.add_argument("--bind", required=True)
    advertise.add_argument("--port", type=int, required=True)
    advertise.add_argument("--router", required=True)
    members = commands.add_parser("members", help="print the servers the router lists")
    members.add_argument("--router", required=True)
    for name in ("join", "leave", "keep"):
        command = commands.add_parser(name)
        command.add_argument("--router", required=True, help="the router's URL (the head's endpoint)")
        command.add_argument("--worker", required=True, help="this server's URL as the router reaches it")
        if name == "keep":
            command.add_argument("--pid-file", type=Path, required=True, help="the server's PID file")
            command.add_argument("--interval", type=float, default=KEEP_INTERVAL_S)
            command.add_argument("--drain-timeout", type=float, default=DRAIN_TIMEOUT_S,
                                 help="on stop, seconds to wait for the server's requests after leaving")
    args = parser.parse_args(argv)
    if args.command == "advertise":
        print(advertised_url(args.bind, args.port, args.router))
        return 0

    def say(line: str) -> None:
        print(f"[membership] {time.strftime('%H:%M:%S')} {line}", flush=True)

    router = Router(args.router, os.environ.get("VLLM_API_KEY") or None)
    try:
        if args.command == "members":
            print(" ".join(router.members()) or "none yet")
            return 0
        if args.command == "join":
            if normalized(args.worker) not in router.members():
                router.add(args.worker)
            say(f"joined the router at {args.router} as {args.worker}")
            return 0
        if args.command == "leave":
            router.remove(args.worker)
            say(f"left the router at {args.router}")
            return 0
    except RouterUnreachable as exc:
        print(f"router not reachable: {exc}", file=sys.stderr)
        return 3
    except RouterRefused as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    service = read_pid_file(args.pid_file)
    if service is None:
        print(f"error: no server recorded in {args.pid_file}", file=sys.stderr)
        return 2
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    return keep(router, args.worker, service.alive, stop, say, args.interval, args.drain_timeout)


if __name__ == "__main__":
    sys.exit(main())
