"""A scripted stand-in for vLLM's OpenAI server, for the faults a real server cannot be made
to show on demand: per request it answers what the test says (text and finish_reason, an
HTTP error with Retry-After, a reset connection, a stall, malformed JSON).

Standard library only, so the fast tier runs without vLLM. It serves /health, /version,
/v1/models and POST /v1/chat/completions (non-streaming, the batch converter's and the
stress test's --no-stream path; streamed as server-sent events when asked, the page's path);
the real-server tests cover everything else.

    with ScriptedServer() as server:
        server.responder = lambda request: Reply(status=429, retry_after=1) if request.index < 2 else Reply()
        ... point a client at server.url ...
        server.requests  # every chat request received, in order
"""

from __future__ import annotations

import json
import socket
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MODEL = "scripted-ocr"


@dataclass(frozen=True)
class Reply:
    """What to answer one chat request with."""

    text: str = "Scripted page text."
    finish_reason: str = "stop"
    status: int = 200
    error: str = "scripted error"
    retry_after: float | None = None
    action: str = "answer"  # "answer" | "reset" | "stall" | "malformed"
    completion_tokens: int = 4


@dataclass
class ChatRequest:
    index: int  # 0-based, in arrival order
    body: dict
    headers: dict = field(default_factory=dict)

    @property
    def image_url(self) -> str:
        return self.body["messages"][0]["content"][0]["image_url"]["url"]

    @property
    def temperature(self) -> float:
        return self.body.get("temperature")


class ScriptedServer:
    """A context manager; `url` once started. `port` may be given to come back on the same one."""

    def __init__(self, port: int = 0, models: tuple[str, ...] = (MODEL,),
                 responder: Callable[[ChatRequest], Reply] = lambda request: Reply()):
        self.models = models
        self.responder = responder
        self.requests: list[ChatRequest] = []
        self.release = threading.Event()  # ends every stall (set on stop)
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", port), self._handler_class())
        self._httpd.daemon_threads = True
        self.port = self._httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="scripted-server", daemon=True)

    def __enter__(self) -> ScriptedServer:
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def stop(self) -> None:
        """Stop listening and end every stalled request (its client sees the connection close)."""
        self.release.set()
        self._httpd.shutdown()
        self._httpd.server_close()

    def chat_count(self) -> int:
        with self._lock:
            return len(self.requests)

    def _record(self, body: dict, headers: dict) -> ChatRequest:
        with self._lock:
            request = ChatRequest(len(self.requests), body, headers)
            self.requests.append(request)
            return request

    def _handler_class(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # quiet: the tests assert, not read logs
                pass

            def _send_json(self, status: int, value: object, headers: dict | None = None) -> None:
                payload = json.dumps(value).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                for name, text in (headers or {}).items():
                    self.send_header(name, text)
                self.end_headers()
                self.wfile.write(payload)

            def do_GET(self) -> None:
                if self.path == "/health":
                    self._send_json(200, {})
                elif self.path == "/version":
                    self._send_json(200, {"version": "scripted"})
                elif self.path == "/v1/models":
                    self._send_json(200, {"object": "list", "data": [
                        {"id": m, "object": "model", "max_model_len": 8192} for m in server.models]})
                else:
                    self._send_json(404, {"error": {"message": f"no route {self.path}"}})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                if self.path != "/v1/chat/completions":
                    self._send_json(404, {"error": {"message": f"no route {self.path}"}})
                    return
                if body.get("model") not in server.models:
                    self._send_json(404, {"error": {"message": f"The model `{body.get('model')}` does not exist."}})
                    return
                reply = server.responder(server._record(body, dict(self.headers)))
                if reply.action == "stall":
                    server.release.wait()
                    self._reset()
                elif reply.action == "reset":
                    self._reset()
                elif reply.action == "malformed":
                    payload = b'{"choices": [{"message": '
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                elif reply.status != 200:
                    headers = {"Retry-After": f"{reply.retry_after:g}"} if reply.retry_after is not None else {}
                    self._send_json(reply.status, {"error": {"message": reply.error}}, headers)
                elif body.get("stream"):
                    self._stream(body, reply)
                else:
                    self._send_json(200, {
                        "id": f"chatcmpl-{len(server.requests)}", "object": "chat.completion", "model": body["model"],
                        "choices": [{"index": 0, "finish_reason": reply.finish_reason,
                                     "message": {"role": "assistant", "content": reply.text}}],
                        "usage": {"prompt_tokens": 100, "completion_tokens": reply.completion_tokens,
                                  "total_tokens": 100 + reply.completion_tokens}})

            def _stream(self, body: dict, reply: Reply) -> None:
                """Server-sent events as vLLM sends them: the text in a few deltas, the finish reason, usage."""
                words = reply.text.split(" ")
                deltas = [word + (" " if i < len(words) - 1 else "") for i, word in enumerate(words)]
                chunks = [{"choices": [{"index": 0, "delta": {"content": delta}, "finish_reason": None}]}
                          for delta in deltas]
                chunks.append({"choices": [{"index": 0, "delta": {}, "finish_reason": reply.finish_reason}]})
                chunks.append({"choices": [], "usage": {"prompt_tokens": 100, "completion_tokens": reply.completion_tokens,
                                                        "total_tokens": 100 + reply.completion_tokens}})
                events = b"".join(b"data: " + json.dumps({"id": "chatcmpl-s", "object": "chat.completion.chunk",
                                                           "model": body["model"], **chunk}).encode() + b"\n\n"
                                  for chunk in chunks) + b"data: [DONE]\n\n"
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Content-Length", str(len(events)))
                self.end_headers()
                self.wfile.write(events)

            def _reset(self) -> None:
                """Close with a TCP reset, as a crashed server or a proxy dropping the line does."""
                self.close_connection = True
                try:  # linger 0: the close (once rfile and wfile let go of the socket) sends RST, not FIN
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                except OSError:
                    pass
                self.connection.close()

            def finish(self) -> None:
                try:
                    super().finish()
                except (OSError, ValueError):  # the connection was reset on purpose
                    pass

        return Handler
