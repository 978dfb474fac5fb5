"""Who can reach a service, and whether it may be reached unprotected.

The rule, for the API server and the page alike: a service bound beyond this machine's
loopback interface is refused without protection, the API without a key (VLLM_API_KEY),
the page without a login (UI_AUTH), unless the user says explicitly that it is meant to be
open (ALLOW_OPEN_API=1, UI_AUTH=none). The page holds the API key: an open page reachable
from the network opens a key-protected API to anyone, by browser and by script (Gradio
serves an API of its own), so the key would protect nothing.

A server that joins a router (the head of several machines) has one stricter rule: it needs
the key, always, with no opt-out. vllm-router 0.1.17 does not check keys itself; it passes
the client's Authorization header on, and each server behind it checks it. A server without
a key would make the router open to anyone who reaches it, whatever the head's settings.

Any address that is not a loopback one counts, not only 0.0.0.0: a LAN or public address,
or a host name (it resolves to something beyond this machine, or it would be localhost).

Standard library only: the start script runs it with the system's python3
(`python3 -m ocr_bundle.exposure ...`, exit 2 and the reasons when refused), and the
launcher and the page import it.
"""

from __future__ import annotations

import argparse
import ipaddress
import sys

OPEN_ON_PURPOSE = "none"  # UI_AUTH=none: a page without a login, on purpose
LOCAL_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"}


def is_loopback(host: str) -> bool:
    """True for addresses only this machine can reach (127.0.0.0/8, ::1, localhost)."""
    if host.lower() in LOCAL_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def api_problem(host: str, has_key: bool, open_on_purpose: bool) -> str | None:
    """Why an API server on `host` must not start (None when it may)."""
    if is_loopback(host) or has_key or open_on_purpose:
        return None
    return (f"refusing to serve the vLLM API on {host} without an API key: anyone who can reach this machine "
            "could use it. Set VLLM_API_KEY=... (the page and the clients send it), bind HOST=127.0.0.1, or set "
            "ALLOW_OPEN_API=1 (launcher: --allow-open-api) if it is meant to be open.")


def worker_problem(host: str, has_key: bool) -> str | None:
    """Why a server that joins a router must not start on `host` (None when it may)."""
    if has_key:
        return None
    return (f"refusing to start a joining server on {host} without an API key: the router does not check keys "
            "itself, the servers behind it do, so one server without a key opens the router to anyone who reaches "
            "it. Set VLLM_API_KEY to the head's key (the same on every machine); there is no opt-out for a joining "
            "server.")


def page_problem(host: str, auth: str | None, has_key: bool) -> str | None:
    """Why the page on `host` must not start (None when it may). `auth` is UI_AUTH as given."""
    if is_loopback(host) or auth:
        return None
    key = " It holds the API key, so the key would protect nothing." if has_key else ""
    return (f"refusing to serve the page on {host} without a login: anyone who can reach it could OCR through "
            f"your server, by browser or by script.{key} Set UI_AUTH=user:password, bind UI_HOST=127.0.0.1 "
            f"(and reach it through an SSH tunnel), or set UI_AUTH={OPEN_ON_PURPOSE} if it is meant to be open.")


def api_warning(host: str, has_key: bool) -> str | None:
    """A loud line for an API left open on purpose beyond loopback (None otherwise)."""
    if has_key or is_loopback(host):
        return None
    return (f"WARNING: the vLLM API on {host} has no API key, on purpose (ALLOW_OPEN_API): "
            "anyone who can reach it can use it.")


def router_warning(host: str) -> str | None:
    """The router's own gap, beyond loopback: its membership calls take no key (None on loopback)."""
    if is_loopback(host):
        return None
    return (f"WARNING: the router on {host} accepts /add_worker and /remove_worker from anyone who reaches it "
            "(vllm-router 0.1.17 checks no key on them): someone could add a server of their own and receive "
            "requests with their API keys. Let only your clients and your machines reach this port (firewall, "
            "private network).")


def page_warning(host: str, auth: str | None) -> str | None:
    """A loud line for a page left open on purpose beyond loopback (None otherwise)."""
    if auth != OPEN_ON_PURPOSE or is_loopback(host):
        return None
    return (f"WARNING: the page on {host} has no login, on purpose (UI_AUTH={OPEN_ON_PURPOSE}): "
            "anyone who can reach it can use the server through it.")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Check the start script's exposure settings; exit 2 when refused.")
    parser.add_argument("--api-host", required=True, help="the API server's bind address (HOST)")
    parser.add_argument("--api-key-set", action="store_true", help="VLLM_API_KEY is set")
    parser.add_argument("--allow-open-api", action="store_true", help="ALLOW_OPEN_API=1: no key, on purpose")
    parser.add_argument("--joins", action="store_true", help="this server joins a router (JOIN is set)")
    parser.add_argument("--router", action="store_true", help="the API is the head's router (ROUTER=on|only)")
    parser.add_argument("--page-host", default=None, help="the page's bind address (UI_HOST); omit with UI=off")
    parser.add_argument("--page-auth", default="", help="UI_AUTH as given ('none': no login, on purpose)")
    args = parser.parse_args(argv)
    problems = [worker_problem(args.api_host, args.api_key_set) if args.joins
                else api_problem(args.api_host, args.api_key_set, args.allow_open_api)]
    if args.page_host is not None:
        problems.append(page_problem(args.page_host, args.page_auth or None, args.api_key_set))
    problems = [problem for problem in problems if problem]
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    if problems:
        return 2
    warnings = [api_warning(args.api_host, args.api_key_set), router_warning(args.api_host) if args.router else None]
    if args.page_host is not None:
        warnings.append(page_warning(args.page_host, args.page_auth))
    for line in filter(None, warnings):
        print("#" * 80 + f"\n{line}\n" + "#" * 80, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
