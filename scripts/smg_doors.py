#!/usr/bin/env python3
"""Write the gateway's door table (ocr_bundle/serve/smg_doors.json) from the installed SMG itself.

    python scripts/smg_doors.py            # with the Python that has smg (the CPU environment, or requirements.txt)

SMG's routes are compiled into its binary (axum), so no running gateway lists them. This script
reads them out of that binary and asks a real gateway about each, instead of anyone typing them:

1. every run of path-like text in smg's shared library (route literals are stored there, one after
   the other) is cut at each `/` into candidate paths, `{param}` standing for any value;
2. a bare gateway is started on loopback through the bundle's own launcher (ocr_bundle.serve.gateway),
   with a client key and an admin key and no server;
3. each candidate is tried with GET, POST, PUT, PATCH and DELETE: a path the router does not know
   answers 404 "unknown_url" to every method, a known one answers something else to at least one;
   a method the path does not take answers 405;
4. each route found is tried without a key, with a wrong one, with the client key and with the
   admin key, and recorded with its door: open (answers without a key), client (the client key), or
   admin (the admin key only).

The table names the SMG version it was made from; tests/test_gateway.py refuses a table made for
another version than the one installed, tries every route of it on the running cluster, and checks
that the README lists exactly its open routes.
"""

from __future__ import annotations

import importlib.metadata
import itertools
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ocr_bundle.serve.gateway_doors import DOORS_FILE, DoorTable, Route, classify  # noqa: E402

METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
CLIENT_KEY, ADMIN_KEY = "doors-client-key", "doors-admin-key"
PATH_RUN = re.compile(rb"(?:/[A-Za-z0-9_.{}*-]+)+")
MAX_SEGMENTS = 6


def smg_library() -> Path:
    import smg

    return next(Path(smg.__file__).parent.glob("smg_rs*.so"))


def runs(library: bytes) -> list[list[str]]:
    """The binary's path-like text, as lists of segments, parameters filled in."""
    return [[re.sub(r"\{\*[^}]*\}", "x/y", re.sub(r"\{[^*}][^}]*\}", "x", segment))
             for segment in run.decode("ascii").split("/")[1:]] for run in PATH_RUN.findall(library)]


def candidates(segment_runs: list[list[str]], firsts: set[str] | None = None) -> set[str]:
    """Every contiguous sequence of segments of every run. With `firsts` (the first segments of routes
    found), only sequences starting with one, each ending in every prefix of its last segment: literals
    are stored one after the other, so a route's last segment runs on into the next literal's text
    ("/v1/messages/count_tokensno_healthy_worker...")."""
    paths: set[str] = set()
    for segments in segment_runs:
        for start, length in itertools.product(range(len(segments)), range(1, MAX_SEGMENTS + 1)):
            part = segments[start:start + length]
            if len(part) != length or not all(part):
                continue
            if firsts is None:
                paths.add("/" + "/".join(part))
            elif part[0] in firsts:
                paths.update("/" + "/".join([*part[:-1], part[-1][:end]]) for end in range(2, len(part[-1])))
    return paths


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def answer(session: requests.Session, url: str, method: str, key: str | None) -> tuple[int, str]:
    """Status and body; 0 when the gateway closed the connection without an answer."""
    try:
        response = session.request(method, url, json={}, timeout=10, allow_redirects=False,
                                   headers={"Authorization": f"Bearer {key}"} if key else {})
    except requests.RequestException as exc:
        return 0, str(exc)
    return response.status_code, response.text[:300]


def unknown(status: int, body: str) -> bool:
    """The router's own answer for a path it has no route for (its OpenAI- and Anthropic-style bodies)."""
    return status == 404 and ('"unknown_url"' in body or "Invalid URL (" in body)


def known(session: requests.Session, url: str) -> bool:
    """Whether the router has a route for the URL's path: a path it does not know answers 404
    unknown_url to every method, a known one answers anything else (405 to a method it does not take)."""
    status, body = answer(session, url, "GET", ADMIN_KEY)
    if status == 0:  # the connection closed without an answer: ask once more on a new one
        status, body = answer(requests.Session(), url, "GET", ADMIN_KEY)
    return not unknown(status, body)


def canonical(session: requests.Session, base: str, path: str) -> str:
    """The route a path is an instance of: a segment that any value can take is written x."""
    segments = path.split("/")[1:]
    for index in range(len(segments) - 1, 0, -1):
        if segments[index] != "x" and known(session, base + "/" + "/".join(
                [*segments[:index], "zq7v", *segments[index + 1:]])):
            segments[index] = "x"
    # A catch-all ({*rest}) matches any depth: keep its shortest form.
    while len(segments) > 2 and segments[-1] == segments[-2] == "x":
        segments.pop()
    return "/" + "/".join(segments)


def main() -> int:
    version = importlib.metadata.version("smg")
    port, metrics = free_port(), free_port()
    env = {**os.environ, "VLLM_API_KEY": CLIENT_KEY, "ROUTER_ADMIN_KEY": ADMIN_KEY, "PYTHONPATH": str(ROOT)}
    for name in ("TLS_CERT", "TLS_KEY", "TLS_CA"):
        env.pop(name, None)
    gateway = subprocess.Popen([sys.executable, "-m", "ocr_bundle.serve.gateway", "--host", "127.0.0.1", "--port",
                                str(port), "--metrics-port", str(metrics)], env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        session = requests.Session()
        deadline = time.monotonic() + 60
        while True:
            try:
                if session.get(f"{base}/liveness", timeout=2).status_code == 200:
                    break
            except requests.RequestException:
                pass
            if time.monotonic() > deadline or gateway.poll() is not None:
                print("error: the gateway did not start", file=sys.stderr)
                return 1
            time.sleep(0.2)
        segment_runs = runs(smg_library().read_bytes())
        found = candidates(segment_runs)
        paths = {canonical(session, base, path) for path in sorted(found) if known(session, base + path)}
        firsts = {path.split("/")[1] for path in paths}
        extra = candidates(segment_runs, firsts) - found
        paths |= {canonical(session, base, path) for path in sorted(extra) if known(session, base + path)}
        found |= extra
        paths = sorted(paths)
        routes = set()
        for path in paths:
            for method in METHODS:
                if answer(session, base + path, method, ADMIN_KEY)[0] == 405:
                    continue
                answers = {name: answer(session, base + path, method, key)[0]
                           for name, key in (("none", None), ("wrong", "not-the-key"), ("client", CLIENT_KEY),
                                             ("admin", ADMIN_KEY))}
                routes.add(Route(method, path, classify(answers)))
        table = DoorTable(version, sorted(routes, key=lambda route: (route.path, route.method)))
    finally:
        os.killpg(gateway.pid, 15)
        gateway.wait(timeout=30)
    DOORS_FILE.write_text(table.to_json())
    counts = {door: sum(route.door == door for route in table.routes) for door in ("open", "client", "admin")}
    print(f"smg {version}: {len(found)} candidate paths, {len(table.routes)} routes: {counts}; written to "
          f"{DOORS_FILE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
