"""Who can reach a service, and whether it may be reached unprotected: the one decision.

The rule, for the API and the page alike: a service bound beyond this machine's loopback
interface is refused without protection, the API without a key (VLLM_API_KEY), the page
without a login (UI_AUTH), unless the user says explicitly that it is meant to be open
(ALLOW_OPEN_API=1, UI_AUTH=none). The page holds the API key: an open page reachable from the
network opens a key-protected API to anyone, by browser and by script (Gradio serves an API of
its own), so the key would protect nothing.

Several machines (the head's gateway, servers that join it) have stricter rules, with no
opt-out: the gateway's pool is changed only with ROUTER_ADMIN_KEY, which differs from the
client key (a client could otherwise add a server of its own and receive everyone's pages);
a joining server needs both keys (the client key, which the gateway sends it, and the admin
key, to join), and an address the gateway can reach (not loopback when the gateway is
elsewhere).

What crosses the network is encrypted: beyond loopback, the API, the page and the gateway are
refused in plain HTTP (every key, login and page would cross the network in clear, and a key
read on the path opens every door), unless TLS_CERT/TLS_KEY/TLS_CA serve them over HTTPS or
ALLOW_PLAINTEXT=1 says the network is private on purpose. The certificate is checked here too,
with no network (tls.certificate_problems): key and certificate together, signed by TLS_CA,
naming every address the start script and the gateway use, not expired.

Any address that is not a loopback one counts as reachable, not only 0.0.0.0: a LAN or public
address, or a host name (it resolves to something beyond this machine, or it would be localhost).

`check()` makes the decision for the start script (`python3 -m ocr_bundle.exposure ...`, exit 2
and the reasons before anything starts), the launcher and the page. Keys and passwords are
read from the environment, never from arguments. Standard library only.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import socket
import sys
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field

from ocr_bundle import tls

OPEN_ON_PURPOSE = "none"  # UI_AUTH=none: a page without a login, on purpose
LOCAL_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"}
ALL_INTERFACES = {"0.0.0.0", "::", "[::]", ""}
ROLES = ("single", "head", "join")  # one machine; the head of several (gateway); a machine joining one
KEY_ENV, ADMIN_KEY_ENV, AUTH_ENV, OPEN_API_ENV = "VLLM_API_KEY", "ROUTER_ADMIN_KEY", "UI_AUTH", "ALLOW_OPEN_API"


def is_loopback(host: str) -> bool:
    """True for addresses only this machine can reach (127.0.0.0/8, ::1, localhost)."""
    if host.lower() in LOCAL_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def is_all_interfaces(host: str) -> bool:
    return host in ALL_INTERFACES


def local_address(bind_host: str) -> str:
    """The address a process on this machine uses to reach a service bound to `bind_host`."""
    if is_all_interfaces(bind_host) or bind_host.lower() in LOCAL_NAMES:
        return "127.0.0.1"
    return bind_host


def public_address(bind_host: str) -> str:
    """An address a person can open for a service bound to `bind_host`: bound to all interfaces,
    this machine's address on its default route (a UDP "connect" picks it and sends nothing)."""
    if not is_all_interfaces(bind_host):
        return bind_host
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(("192.0.2.1", 9))  # a documentation address: never reached
            return probe.getsockname()[0]
    except OSError:
        return socket.gethostname()


def unreachable_from(gateway_host: str, server_host: str) -> bool:
    """A server on this machine's loopback that a gateway on another machine is meant to reach."""
    return is_loopback(server_host) and not is_loopback(gateway_host)


def url_host(host: str) -> str:
    """`host` as it goes into a URL (IPv6 in brackets)."""
    return f"[{host.strip('[]')}]" if ":" in host.strip("[]") else host


def parse_auth(value: str | None) -> list[tuple[str, str]] | None:
    """'user:password[,user2:password2]' → Gradio's auth list; 'none' (no login, on purpose) → None.
    A malformed value raises ValueError (the message never repeats it: it holds passwords)."""
    if not value or value == OPEN_ON_PURPOSE:
        return None
    pairs = []
    for item in value.split(","):
        user, sep, password = item.partition(":")
        if not sep or not user or not password:
            raise ValueError(f"{AUTH_ENV} must look like user:password[,user2:password2] (or "
                             f"{AUTH_ENV}={OPEN_ON_PURPOSE}, a page without a login on purpose)")
        pairs.append((user, password))
    return pairs


def api_problem(host: str, has_key: bool, open_on_purpose: bool) -> str | None:
    """Why an API (server or gateway) on `host` must not start (None when it may)."""
    if is_loopback(host) or has_key or open_on_purpose:
        return None
    return (f"refusing to serve the vLLM API on {host} without an API key: anyone who can reach this machine "
            f"could use it. Set {KEY_ENV}=... (the page and the clients send it), bind HOST=127.0.0.1, or set "
            f"{OPEN_API_ENV}=1 (launcher: --allow-open-api) if it is meant to be open.")


def gateway_problems(has_key: bool, admin_key: str | None, key: str | None) -> list[str]:
    """The head's gateway: its pool changes only with an admin key that no client holds."""
    if not admin_key:
        return [f"the gateway (ROUTER=on) needs {ADMIN_KEY_ENV}: only it adds or removes servers, and the "
                "machines that join need it too (clients never do). Without one, anyone who reaches the "
                "gateway could add a server of their own and receive every client's pages. Generate one, e.g. "
                f"{ADMIN_KEY_ENV}=$(python3 -c 'import secrets; print(secrets.token_urlsafe(24))')"]
    if has_key and admin_key == key:
        return [f"{ADMIN_KEY_ENV} must differ from {KEY_ENV}: every client holds the client key, and with it "
                "could change the gateway's pool"]
    return []


def joining_problems(host: str, has_key: bool, admin_key: str | None, gateway_url: str,
                     admin_key_needed: bool = True) -> list[str]:
    """A server that joins a gateway: both keys, a well-formed gateway URL, an address it can reach."""
    problems = []
    parts = urllib.parse.urlsplit(gateway_url)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.path.strip("/") or parts.query:
        problems.append(f"JOIN must be the gateway's endpoint, like https://10.0.0.1:8000, not '{gateway_url}'")
    elif unreachable_from(parts.hostname, host):
        problems.append(f"HOST={host} is this machine's loopback address: the gateway at {parts.hostname} cannot "
                        "reach it. Set HOST=0.0.0.0 (or this machine's address on the gateway's network)")
    if not has_key:
        problems.append(f"refusing to start a joining server on {host} without an API key: the gateway sends "
                        f"its client key to every server, and a server without one is open to anyone who reaches "
                        f"it. Set {KEY_ENV} to the head's key (the same on every machine); there is no opt-out "
                        "for a joining server.")
    if admin_key_needed and not admin_key:
        problems.append(f"a joining server needs {ADMIN_KEY_ENV} (the head's admin key): it joins and leaves the "
                        "gateway's pool through its admin API")
    return problems


def page_problem(host: str, auth: str | None, has_key: bool) -> str | None:
    """Why the page on `host` must not start (None when it may). `auth` is UI_AUTH as given."""
    try:
        parse_auth(auth)
    except ValueError as exc:
        return str(exc)
    if is_loopback(host) or auth:
        return None
    key = " It holds the API key, so the key would protect nothing." if has_key else ""
    return (f"refusing to serve the page on {host} without a login: anyone who can reach it could OCR through "
            f"your server, by browser or by script.{key} Set {AUTH_ENV}=user:password, bind UI_HOST=127.0.0.1 "
            f"(and reach it through an SSH tunnel), or set {AUTH_ENV}={OPEN_ON_PURPOSE} if it is meant to be open.")


def api_warning(host: str, has_key: bool) -> str | None:
    """A loud line for an API left open on purpose beyond loopback (None otherwise)."""
    if has_key or is_loopback(host):
        return None
    return (f"WARNING: the vLLM API on {host} has no API key, on purpose ({OPEN_API_ENV}): "
            "anyone who can reach it can use it.")


def page_warning(host: str, auth: str | None) -> str | None:
    """A loud line for a page left open on purpose beyond loopback (None otherwise)."""
    if auth != OPEN_ON_PURPOSE or is_loopback(host):
        return None
    return (f"WARNING: the page on {host} has no login, on purpose ({AUTH_ENV}={OPEN_ON_PURPOSE}): "
            "anyone who can reach it can use the server through it.")


def plaintext_problem(service: str, host: str, tls_on: bool, allowed: bool) -> str | None:
    """Why `service` on `host` must not be served in plain HTTP (None when it may)."""
    if tls_on or allowed or is_loopback(host):
        return None
    return (f"refusing to serve {service} on {host} in plain HTTP: its key or login, and every page, would cross "
            f"the network in clear, and anyone on the path who reads the key is let in. Serve it over HTTPS with "
            f"{tls.CERT_ENV}, {tls.KEY_ENV} and {tls.CA_ENV} ({tls.MAKE_CERTS} makes them; docs/cluster.md), bind it "
            f"to 127.0.0.1, or set {tls.PLAINTEXT_ENV}=1 if the network is private on purpose.")


def plaintext_warning(service: str, host: str, tls_on: bool) -> str | None:
    if tls_on or is_loopback(host):
        return None
    return (f"WARNING: {service} on {host} serves plain HTTP, on purpose ({tls.PLAINTEXT_ENV}=1): keys, logins and "
            "pages cross the network in clear.")


def join_tls_problems(gateway_url: str, tls_on: bool, ca: str | None) -> list[str]:
    """A joining server speaks to the gateway as the gateway does: HTTPS when this machine has TLS."""
    gateway_scheme = urllib.parse.urlsplit(gateway_url).scheme
    if tls_on and gateway_scheme == "http":
        return [f"JOIN={gateway_url} is plain HTTP but this machine serves TLS ({tls.CERT_ENV}): the head's gateway "
                "serves https:// when it has TLS; the keys would cross the network in clear otherwise"]
    if gateway_scheme == "https" and not ca:
        return [f"JOIN={gateway_url} is HTTPS: set {tls.CA_ENV} (the cluster's ca.pem) so this machine can verify "
                "the gateway before it sends it a key"]
    return []


def truthy(value: str | None) -> bool:
    return (value or "").lower() in ("1", "true", "yes")


@dataclass(frozen=True)
class Decision:
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def check(role: str, api_host: str | None, page_host: str | None, env: Mapping[str, str],
          join_url: str | None = None, admin_key_needed: bool = True, tls_names: list[str] = ()) -> Decision:
    """The decision for what this machine serves: the API on `api_host` (the gateway's address
    on the head), the page on `page_host` (None: no page), keys, login and TLS from `env`. The
    certificate must name every address in `tls_names` (besides the local address of each
    service). The launcher checks a joining server without the admin key (membership is the
    start script's)."""
    key, admin_key, auth = env.get(KEY_ENV) or None, env.get(ADMIN_KEY_ENV) or None, env.get(AUTH_ENV) or None
    cert, cert_key, ca = (env.get(name) or None for name in (tls.CERT_ENV, tls.KEY_ENV, tls.CA_ENV))
    tls_on, plaintext_allowed = tls.serving(env), truthy(env.get(tls.PLAINTEXT_ENV))
    api_service = "the gateway" if role == "head" else "the vLLM API"
    problems: list[str | None] = []
    if api_host is not None:
        if role == "join":
            problems += joining_problems(api_host, bool(key), admin_key, join_url or "", admin_key_needed)
            problems += join_tls_problems(join_url or "", tls_on, ca)
        else:
            problems.append(api_problem(api_host, bool(key), truthy(env.get(OPEN_API_ENV))))
        if role == "head":
            problems += gateway_problems(bool(key), admin_key, key)
        problems.append(plaintext_problem(api_service, api_host, tls_on, plaintext_allowed))
    if page_host is not None:
        problems.append(page_problem(page_host, auth, bool(key)))
        problems.append(plaintext_problem("the page", page_host, tls_on, plaintext_allowed))
    names = [local_address(host) for host in (api_host, page_host) if host is not None]
    tls_problems, tls_warnings = tls.certificate_problems(cert, cert_key, ca, [*names, *tls_names])
    warnings = [api_warning(api_host, bool(key)) if api_host is not None and role != "join" else None,
                page_warning(page_host, auth) if page_host is not None else None,
                *(plaintext_warning(service, host, tls_on) for service, host in ((api_service, api_host),
                                                                                   ("the page", page_host))
                  if host is not None and plaintext_allowed),
                *tls_warnings]
    return Decision([p for p in [*problems, *tls_problems] if p], [w for w in warnings if w])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) == 2 and argv[0] in ("local-address", "public-address"):  # the start script's address helpers
        print(url_host((local_address if argv[0] == "local-address" else public_address)(argv[1])))
        return 0
    parser = argparse.ArgumentParser(description="Check the start script's exposure settings (keys and login from "
                                                 "the environment); exit 2 when refused.")
    parser.add_argument("--role", choices=ROLES, default="single")
    parser.add_argument("--api-host", required=True, help="the API's bind address (HOST; the gateway's on the head)")
    parser.add_argument("--join", default=None, help="the gateway this server joins (JOIN)")
    parser.add_argument("--page-host", default=None, help="the page's bind address (UI_HOST); omit with UI=off")
    parser.add_argument("--tls-name", action="append", default=[],
                        help="an address the certificate must name besides the services' local ones (repeatable; "
                             "a joining server's: the one the gateway reaches it at)")
    args = parser.parse_args(argv)
    decision = check(args.role, args.api_host, args.page_host, os.environ, args.join, tls_names=args.tls_name)
    for problem in decision.problems:
        print(f"error: {problem}", file=sys.stderr)
    if decision.problems:
        return 2
    for line in decision.warnings:
        print("#" * 80 + f"\n{line}\n" + "#" * 80, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
