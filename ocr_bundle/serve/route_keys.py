"""Every route of the vLLM server needs the key, except what a gateway and a scraper need.

vLLM checks VLLM_API_KEY only on paths under /v1 (and a few other prefixes): `POST
/invocations`, `/tokenize`, `/pooling` and whatever a later vLLM adds answer without it (vLLM
issue #58144, seen on 0.26.0 on an H200 and 0.32.0 on the CPU: `/invocations` with a chat body
ran OCR without a key). The bundle turns the rule around: with a key set, a request needs it
on every path but OPEN_PATHS, whatever routes the running app has.

How: `install()` wraps vLLM's `serve_http(app, ...)`, the one function every vLLM API server
process calls with its finished app before uvicorn serves it, and adds KeyEveryRoute as the
outermost layer around the app's middleware stack. It touches vLLM only there, only on the versions in VERIFIED (where the
function was read and the door test of tests/test_gateway.py passed), and fails closed: with
a key set, a vLLM where it cannot install stops the server instead of serving open doors
(the launcher refuses such a version before vLLM starts; see launch.route_keys_problem).

Standard library only: the launcher imports it before it knows which Python has vLLM.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import json
import os
import re
import secrets
import sys

from ocr_bundle.serve.versions import release

# What a gateway's health checks and a Prometheus scraper need, and nothing that runs the
# model or reveals what it serves. /metrics/ is where vLLM's mounted metrics app may redirect.
OPEN_PATHS = frozenset({"/health", "/metrics", "/metrics/", "/version", "/ping"})
# vLLM version -> the module holding serve_http there.
# A new version joins once its serve_http was read and benchmarks/version_bench.sh DOORS=1 passed on it.
VERIFIED = {"0.26.0": "vllm.entrypoints.launcher", "0.32.0": "vllm.entrypoints.launchers.launcher"}
KEY_ENV = "VLLM_API_KEY"
UNAUTHORIZED = json.dumps({"error": {"message": "Unauthorized: this server needs its API key "
                                                "(Authorization: Bearer ...)", "type": "Unauthorized",
                                     "code": 401}}).encode()


class KeyEveryRoute:
    """Pure ASGI middleware: HTTP and WebSocket requests need `Authorization: Bearer <key>`
    unless their path is in OPEN_PATHS. OPTIONS is not exempt: no browser calls this API."""

    def __init__(self, app, key: str, open_paths: frozenset[str] = OPEN_PATHS, refusal: bytes = UNAUTHORIZED) -> None:
        """`refusal`: the JSON body of a 401 (the document API answers in its own error shape)."""
        self.app = app
        self.key_digest = hashlib.sha256(key.encode()).digest()
        self.open_paths = open_paths
        self.refusal = refusal

    def allowed(self, headers: list[tuple[bytes, bytes]]) -> bool:
        value = next((v for k, v in headers if k.lower() == b"authorization"), b"").decode("latin-1")
        scheme, _, token = value.partition(" ")
        # Digests of equal length: the comparison takes the same time whatever was sent.
        return scheme.lower() == "bearer" and secrets.compare_digest(
            hashlib.sha256(token.strip().encode("latin-1")).digest(), self.key_digest)

    async def __call__(self, scope, receive, send) -> None:
        if (scope["type"] not in ("http", "websocket") or scope["path"] in self.open_paths
                or self.allowed(scope.get("headers", []))):
            await self.app(scope, receive, send)
        elif scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})  # policy violation, before accepting
        else:
            await send({"type": "http.response.start", "status": 401,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"www-authenticate", b"Bearer")]})
            await send({"type": "http.response.body", "body": self.refusal})


def keyed_serve_http(serve_http, key: str):
    """serve_http with KeyEveryRoute added to the app it serves."""

    @functools.wraps(serve_http)
    async def wrapper(app, *args, **kwargs):
        # Around the whole middleware stack (vLLM may have built it already, after which Starlette
        # refuses add_middleware): the outermost layer, before vLLM's own and before any route.
        app.middleware_stack = KeyEveryRoute(app.middleware_stack or app.build_middleware_stack(), key)
        paths = sorted({getattr(route, "path", "") for route in app.routes} - {""})
        guarded = [path for path in paths if path not in OPEN_PATHS]
        _log(f"the API key is required on every route ({len(guarded)} in this app) except "
             f"{' '.join(sorted(OPEN_PATHS - {'/metrics/'}))}")
        return await serve_http(app, *args, **kwargs)

    wrapper.__bundle_keyed__ = True
    return wrapper


def install(vllm_version: str, key: str | None) -> str:
    """Key every route of the servers this process starts; what was done (also logged).
    Raises RuntimeError when a key is set and it cannot be done: never serve open doors."""
    if not key:
        return "no API key set: nothing to enforce"
    module_name = VERIFIED.get(release(vllm_version))
    if module_name is None:
        raise RuntimeError(f"vLLM {vllm_version}: the bundle keys every route only on vLLM "
                           f"{', '.join(VERIFIED)} (vLLM itself keys only /v1 paths)")
    module = importlib.import_module(module_name)
    original = module.serve_http
    if getattr(original, "__bundle_keyed__", False):
        return "already installed"
    keyed = keyed_serve_http(original, key)
    module.serve_http = keyed
    # Modules that already bound the name (`from ..launcher import serve_http`) get it too.
    for loaded in list(sys.modules.values()):
        if getattr(loaded, "serve_http", None) is original:
            loaded.serve_http = keyed
    return f"installed on vLLM {vllm_version}"


def logged_routes(vllm_log: str) -> list[tuple[str, str]]:
    """(method, path) of every route a running vLLM app has, from what its serve_http logs at start
    ("Route: /invocations, Methods: POST"); a path parameter reads as x. The door tests knock on these."""
    routes = set()
    for path, methods in re.findall(r"Route: (\S+), Methods: ([A-Z, ]+)", vllm_log):
        routes.update((method.strip(), re.sub(r"\{[^}]+\}", "x", path)) for method in methods.split(","))
    return sorted(routes, key=lambda route: (route[1], route[0]))


def breaks_key_rule(path: str, answers: dict[str, int]) -> bool:
    """Whether a keyed server's door broke the rule, from the statuses it gave each caller: "client" (the
    server's key), "none", "wrong" and, where tried, "admin" (a gateway's key). Every path but OPEN_PATHS
    refuses all but the client key with 401, and lets the client key in."""
    if path in OPEN_PATHS:
        return False
    return any(status != 401 for caller, status in answers.items() if caller != "client") or answers["client"] == 401


def _log(line: str) -> None:
    print(f"[ocr_bundle.route_keys] {line}", file=sys.stderr, flush=True)


def install_from_environment() -> None:
    """vllm_serve's hook: the key from the environment (never argv), vLLM's version as installed."""
    key = os.environ.get(KEY_ENV) or None
    if not key:
        return
    import vllm

    try:
        _log(install(vllm.__version__, key))
    except (RuntimeError, ImportError, AttributeError) as exc:
        _log(f"error: {exc}; refusing to serve with unguarded routes")
        raise SystemExit(2) from None
