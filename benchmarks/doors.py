"""Knock on every door of a running server on the lent GPU machine: each route without a key, with a wrong
one, with the client key (VLLM_API_KEY) and, when set, the admin key (ROUTER_ADMIN_KEY); keys from the
environment, never argv. One line a route: NAME METHOD PATH and the status codes, in that order.
  python3 benchmarks/doors.py NAME URL --log VLLM_LOG --verdict   # a vLLM server: every route it logged at start
  python3 benchmarks/doors.py gateway URL                         # the gateway's main routes
--verdict holds a vLLM server to the bundle's rule (ocr_bundle.serve.route_keys): every route but OPEN_PATHS
refuses a missing or wrong key (and the admin key) with 401 and lets the client key in; the last line says how
many routes broke it, and the exit status is 1 when any did. The CPU tests hold the same rule
(tests/test_gateway.py); this runs it against a vLLM the CPU build cannot be, such as a new pin's GPU build.
"""

from __future__ import annotations

import argparse
import os
import sys
import urllib.error
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ocr_bundle.serve.route_keys import OPEN_PATHS, breaks_key_rule, logged_routes  # noqa: E402  (standard library only)

GATEWAY_ROUTES = [("POST", "/v1/chat/completions"), ("POST", "/invocations"), ("GET", "/workers"),
                  ("POST", "/workers"), ("GET", "/v1/models"), ("GET", "/health"), ("GET", "/liveness"),
                  ("GET", "/engine_metrics"), ("POST", "/generate"), ("POST", "/v1/tokenize"),
                  ("POST", "/add_worker"), ("GET", "/list_workers")]


class NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is the door's answer (its 3xx), not a second request."""

    def redirect_request(self, *args, **kwargs):
        return None


OPENER = urllib.request.build_opener(NoRedirect)


def knock(url: str, method: str, key: str | None) -> int:
    """The status a request with this key gets (0: no answer), redirects not followed."""
    request = urllib.request.Request(url, data=b"{}", method=method, headers={
        "Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})})
    try:
        return OPENER.open(request, timeout=60).status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("name", help="the port's name in the table")
    parser.add_argument("url", help="the server's base URL, e.g. http://127.0.0.1:8000")
    parser.add_argument("--log", type=Path, help="the vLLM server's log: its routes as it listed them at start")
    parser.add_argument("--verdict", action="store_true", help="hold a vLLM server to the bundle's key rule")
    args = parser.parse_args()
    keys = {"none": None, "wrong": "not-the-key", "client": os.environ["VLLM_API_KEY"]}
    if os.environ.get("ROUTER_ADMIN_KEY"):
        keys["admin"] = os.environ["ROUTER_ADMIN_KEY"]
    routes = logged_routes(args.log.read_text(errors="replace")) if args.log else GATEWAY_ROUTES
    if args.verdict and not (("POST", "/invocations") in routes and len(routes) > 20):
        print(f"doors: {args.name}: the log lists {len(routes)} routes, not the app's: no verdict")
        return 2
    broken = []
    for method, path in routes:
        answers = {name: knock(args.url + path, method, key) for name, key in keys.items()}
        print(args.name, method, path, *answers.values(), flush=True)
        if args.verdict and breaks_key_rule(path, answers):
            broken.append(f"{method} {path}")
    if args.verdict:
        print(f"doors: {args.name}: {len(routes)} routes, {len(broken)} break the key rule"
              + (f": {', '.join(broken)}" if broken else f" (open without a key: {' '.join(sorted(OPEN_PATHS))})"))
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
