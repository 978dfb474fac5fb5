"""A stand-in HTTP server (standard library) that answers what a test says, for what a real
gateway or server cannot be made to answer on demand (a URL that is not a gateway, a redirect,
metrics that are not Prometheus text), and records every request with the key it carried.

    with StandIn(lambda method, path, key: (200, "OK", {})) as server:
        ... server.url ...; server.seen  # [(method, path, key, body), ...]
"""

from __future__ import annotations

import ssl
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class StandIn:
    """A stand-in for whatever JOIN points at: `answer(method, path, key) -> (status, body, headers)`."""

    def __init__(self, answer: Callable[[str, str, str | None], tuple[int, str, dict]],
                 tls: ssl.SSLContext | None = None, host: str = "127.0.0.1"):
        """`tls`: serve HTTPS with this server-side context (a server certificate; a client one required if
        the context says so). `host`: the loopback address to listen on."""
        self.answer, self.seen = answer, []
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def _any(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length).decode() if length else ""
                key = (self.headers.get("Authorization") or "").removeprefix("Bearer ") or None
                stand_in.seen.append((self.command, self.path, key, body))
                status, text, headers = stand_in.answer(self.command, self.path, key)
                data = text.encode()
                self.send_response(status)
                for name, value in {"Content-Length": str(len(data)), **headers}.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_DELETE = _any

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer((host, 0), Handler)
        if tls is not None:
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        self.url = f"{'https' if tls else 'http'}://{host}:{self.server.server_address[1]}"

    def __enter__(self) -> StandIn:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


def https_context(folder, ca=None) -> ssl.SSLContext:
    """A stand-in's server context with a machine's certificate (make_certs.py's folder); with `ca`,
    client certificates signed by it are required."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(folder / "cert.pem", folder / "key.pem")
    if ca is not None:
        context.load_verify_locations(ca)
        context.verify_mode = ssl.CERT_REQUIRED
    return context
