"""HTTP client for vLLM's OpenAI-compatible server, shared by the page and the stress test.

Configuration precedence everywhere in the bundle: command-line flags > environment
(VLLM_URL, VLLM_API_KEY, VLLM_MODEL, VLLM_CA_CERT) > defaults (ocr_bundle.settings). Creating a
client contacts nothing; `status()` is a short probe that never raises. Over HTTPS the client
verifies the server against its `Trust` (ocr_bundle.tls: --ca-cert, VLLM_CA_CERT, ...), never less.

Errors never escape as stack traces: every failure becomes an `OcrError` whose message a
person can act on (server down, timeout, bad image, request longer than max_model_len…).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import requests
from urllib3.exceptions import ReadTimeoutError

from . import tls
from .families import Family, served_family
from .grounding import GROUNDING_PROMPT

from .settings import (
    CONNECT_TIMEOUT_S,
    DEFAULT_SERVER_URL,
    ENV_MODEL,
    ENV_URL,
    MAX_OUTPUT_TOKENS,
    READ_TIMEOUT_S,
    STATUS_TIMEOUT_S,
    TEMPERATURE,
    TOP_P,
    api_key_from_env,
)


class OcrError(Exception):
    """A failed OCR request, with a message meant for people.

    kind: "connection" | "timeout" | "http" | "bad_response" | "input"
    """

    def __init__(self, message: str, kind: str, status: int | None = None, retry_after_s: float | None = None):
        super().__init__(message)
        self.kind = kind
        self.status = status
        self.retry_after_s = retry_after_s  # the server's Retry-After (429, 503), in seconds


class ServerUnusable(Exception):
    """The server cannot serve this run (unreachable, no such model); the message says why."""


@dataclass(frozen=True)
class ServerStatus:
    reachable: bool
    models: tuple[str, ...] = ()
    weights: tuple[str | None, ...] = ()  # each model's checkpoint (its "root" in /v1/models), in the same order
    max_model_len: int | None = None
    version: str | None = None
    error: str | None = None

    def family(self, model: str) -> Family:
        """The served model's family (its sampling defaults, its grounding), by its name and checkpoint."""
        return served_family(model, dict(zip(self.models, self.weights)).get(model))

    def describe(self) -> str:
        if not self.reachable:
            return f"**Server unreachable** — {self.error}"
        model = self.models[0] if self.models else "no model"
        version = f", vLLM {self.version}" if self.version else ""
        return f"**Server ready** — {model} (max_model_len {self.max_model_len}{version})"


@dataclass
class OcrResult:
    """One finished request. Times are time.perf_counter() deltas in seconds."""

    text: str
    prompt_tokens: int | None
    completion_tokens: int | None
    finish_reason: str | None
    latency_s: float
    ttft_s: float | None
    warnings: list[str] = field(default_factory=list)


def base_url_from_env(url: str | None = None) -> str:
    return (url or os.environ.get(ENV_URL) or DEFAULT_SERVER_URL).rstrip("/").removesuffix("/v1")


def retry_after_s(response: requests.Response) -> float | None:
    """Retry-After in seconds (the delta form; an HTTP date is ignored)."""
    try:
        return max(0.0, float(response.headers.get("Retry-After", "")))
    except ValueError:
        return None


def http_error(response: requests.Response) -> OcrError:
    return OcrError(explain_http_error(response.status_code, error_message_from_response(response)), "http",
                    response.status_code, retry_after_s(response))


def error_message_from_response(response: requests.Response) -> str:
    """The human part of an error reply, in either of vLLM's formats.

    vLLM answers `{"error": {"message": ...}}` (OpenAI style) or, in older versions and
    some routes, `{"object": "error", "message": ...}`; proxies answer HTML or nothing.
    """
    try:
        body = response.json()
    except ValueError:
        text = response.text.strip()
        return text[:300] if text else response.reason or f"HTTP {response.status_code}"
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])
        if isinstance(error, str):
            return error
        if body.get("message"):
            return str(body["message"])
        if body.get("detail"):
            return str(body["detail"])
    return json.dumps(body)[:300]


def explain_http_error(status: int, message: str) -> str:
    """Add the fix to the server's words where we know it."""
    if status == 401:
        return f"The server refused the API key (401): {message}. Set VLLM_API_KEY to the server's key."
    if status == 404 and "model" in message.lower():
        return f"Unknown model (404): {message}"
    if "maximum context length" in message or "max_model_len" in message:
        return (f"The page does not fit the server's context window: {message} "
                "Lower max tokens, or restart the server with a larger --max-model-len.")
    if status == 400 and "image" in message.lower():
        return f"The server could not read the image (400): {message}"
    if status >= 500:
        return f"The server failed ({status}): {message}. It may be overloaded or restarting; check its log."
    return f"The server rejected the request ({status}): {message}"


def build_chat_request(
    model: str,
    image_url: str,
    *,
    max_tokens: int = MAX_OUTPUT_TOKENS,
    temperature: float = TEMPERATURE,
    top_p: float = TOP_P,
    stream: bool = True,
    ignore_eos: bool = False,
    grounding: bool = False,
) -> dict:
    """The OpenAI chat body LightOnOCR expects: one user message holding only the page.

    No text prompt: the model was trained without one and tends to repeat prompts. The one
    exception is LightOnOCR-3's grounding mode (`grounding`): the text part "grounding" after
    the image asks for layout blocks with boxes (ocr_bundle/grounding.py reads them).
    """
    content: list[dict] = [{"type": "image_url", "image_url": {"url": image_url}}]
    if grounding:
        content.append({"type": "text", "text": GROUNDING_PROMPT})
    body: dict = {
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": int(max_tokens),
        "temperature": float(temperature),
        "top_p": float(top_p),
        "stream": stream,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    if ignore_eos:
        body["ignore_eos"] = True  # vLLM extension: fixed output length for benchmarks
    return body


class OcrClient:
    """Talks to one vLLM server. Thread-safe if each thread uses its own `session`."""

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        model: str | None = None,
        connect_timeout: float = CONNECT_TIMEOUT_S,
        read_timeout: float = READ_TIMEOUT_S,
        trust: tls.Trust | None = None,
    ):
        self.base_url = base_url_from_env(base_url)
        self.trust = trust or tls.Trust()
        self.tls_options = self.trust.requests_options()  # verify=, cert= on every request
        self.api_key = api_key or api_key_from_env()
        self._model = model or os.environ.get(ENV_MODEL) or None
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout

    # -------------------------------------------------------------- plumbing
    def headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers

    def new_session(self) -> requests.Session:
        session = requests.Session()
        session.headers.update(self.headers())
        return session

    def _get(self, path: str, timeout: float) -> requests.Response:
        return requests.get(f"{self.base_url}{path}", headers=self.headers(), timeout=timeout, **self.tls_options)

    # -------------------------------------------------------------- probes
    def status(self, timeout: float = STATUS_TIMEOUT_S) -> ServerStatus:
        """Reachable? Which model, which max_model_len? Never raises."""
        try:
            response = self._get("/v1/models", timeout)
        except requests.RequestException as exc:
            return ServerStatus(reachable=False, error=self._transport_message(exc))
        if response.status_code != 200:
            return ServerStatus(
                reachable=False,
                error=explain_http_error(response.status_code, error_message_from_response(response)),
            )
        try:
            data = response.json().get("data", [])
            models = tuple(str(m["id"]) for m in data)
            weights = tuple(m.get("root") for m in data)
            max_len = next((int(m["max_model_len"]) for m in data if m.get("max_model_len")), None)
        except (ValueError, KeyError, TypeError, AttributeError):
            return ServerStatus(reachable=False, error="/v1/models answered something that is not a model list")
        version = None
        try:
            version = self._get("/version", timeout).json().get("version")
        except (requests.RequestException, ValueError, AttributeError):
            pass
        return ServerStatus(reachable=True, models=models, weights=weights, max_model_len=max_len, version=version)

    def model(self) -> str:
        """The served model name: given, or the first one /v1/models lists."""
        if self._model:
            return self._model
        status = self.status()
        if not status.reachable:
            raise OcrError(f"Cannot ask the server for its model: {status.error}", "connection")
        if not status.models:
            raise OcrError("The server lists no model.", "bad_response")
        self._model = status.models[0]
        return self._model

    # -------------------------------------------------------------- OCR
    def stream_ocr(
        self,
        image_url: str,
        *,
        max_tokens: int = MAX_OUTPUT_TOKENS,
        temperature: float = TEMPERATURE,
        top_p: float = TOP_P,
        ignore_eos: bool = False,
        session: requests.Session | None = None,
        grounding: bool = False,
    ) -> Iterator[str | OcrResult]:
        """Yield text deltas as they arrive, then one final OcrResult. Raises OcrError."""
        body = build_chat_request(self.model(), image_url, max_tokens=max_tokens, temperature=temperature,
                                  top_p=top_p, stream=True, ignore_eos=ignore_eos, grounding=grounding)
        yield from self.stream_body(json.dumps(body).encode(), max_tokens, session=session)

    def stream_body(
        self,
        body: bytes,
        max_tokens: int,
        session: requests.Session | None = None,
        total_timeout: float | None = None,
    ) -> Iterator[str | OcrResult]:
        """Send an already-encoded streaming chat body (the stress test encodes each page once).

        total_timeout bounds the whole answer; the read timeout alone only bounds the gap
        between two chunks, so a server that trickles tokens could otherwise hold a request forever.
        """
        poster = session.post if session else requests.post
        start = time.perf_counter()
        try:
            response = poster(f"{self.base_url}/v1/chat/completions", data=body, headers=self.headers(),
                              stream=True, timeout=(self.connect_timeout, self.read_timeout), **self.tls_options)
        except requests.RequestException as exc:
            raise OcrError(self._transport_message(exc), _transport_kind(exc)) from exc
        with response:
            if response.status_code != 200:
                raise http_error(response)
            yield from self._read_stream(response, start, max_tokens, total_timeout)

    def complete_body(self, body: bytes, max_tokens: int, session: requests.Session | None = None) -> OcrResult:
        """Send an already-encoded non-streaming chat body; no TTFT, one response."""
        poster = session.post if session else requests.post
        start = time.perf_counter()
        try:
            response = poster(f"{self.base_url}/v1/chat/completions", data=body, headers=self.headers(),
                              timeout=(self.connect_timeout, self.read_timeout), **self.tls_options)
        except requests.RequestException as exc:
            raise OcrError(self._transport_message(exc), _transport_kind(exc)) from exc
        if response.status_code != 200:
            raise http_error(response)
        try:
            data = response.json()
            choice = data["choices"][0]
            usage = data.get("usage") or {}
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise OcrError(f"The server sent an unexpected answer ({exc}).", "bad_response") from exc
        return OcrResult(
            text=(choice.get("message") or {}).get("content") or "",
            prompt_tokens=usage.get("prompt_tokens"),
            completion_tokens=usage.get("completion_tokens"),
            finish_reason=choice.get("finish_reason"),
            latency_s=time.perf_counter() - start,
            ttft_s=None,
        )

    def _read_stream(self, response: requests.Response, start: float, max_tokens: int,
                     total_timeout: float | None) -> Iterator[str | OcrResult]:
        parts: list[str] = []
        ttft = None
        usage: dict = {}
        finish_reason = None
        try:
            for line in response.iter_lines(decode_unicode=False):
                if total_timeout is not None and time.perf_counter() - start > total_timeout:
                    raise OcrError(f"No complete answer within {total_timeout:g} s (request timeout).", "timeout")
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    break
                chunk = json.loads(payload)
                if "error" in chunk:  # vLLM reports mid-stream failures as a data event
                    error = chunk["error"]
                    message = error.get("message") if isinstance(error, dict) else str(error)
                    raise OcrError(f"The server failed while generating: {message}", "http",
                                   error.get("code") if isinstance(error, dict) else None)
                usage = chunk.get("usage") or usage
                for choice in chunk.get("choices", []):
                    delta = (choice.get("delta") or {}).get("content") or ""
                    if delta:
                        if ttft is None:
                            ttft = time.perf_counter() - start
                        parts.append(delta)
                        yield delta
                    finish_reason = choice.get("finish_reason") or finish_reason
        except requests.RequestException as exc:
            raise OcrError(self._transport_message(exc, mid_stream=True), _transport_kind(exc)) from exc
        except ValueError as exc:
            raise OcrError(f"The server sent a malformed stream event ({exc}).", "bad_response") from exc
        result = OcrResult(
            text="".join(parts),
            prompt_tokens=usage.get("prompt_tokens"),
            completion_tokens=usage.get("completion_tokens"),
            finish_reason=finish_reason,
            latency_s=time.perf_counter() - start,
            ttft_s=ttft,
        )
        if finish_reason is None:
            raise OcrError("The stream ended before the server finished (connection closed?).", "bad_response")
        if finish_reason == "length" and result.completion_tokens is not None and result.completion_tokens < max_tokens:
            # vLLM clips max_tokens to what is left of max_model_len instead of refusing.
            result.warnings.append(
                f"Output was cut at the context limit after {result.completion_tokens} tokens "
                f"(prompt {result.prompt_tokens} + output reached max_model_len, below max tokens {max_tokens}). "
                "Restart the server with a larger --max-model-len."
            )
        elif finish_reason == "length":
            result.warnings.append(f"Output stopped at max tokens ({max_tokens}); the page may have more text.")
        yield result

    def _transport_message(self, exc: requests.RequestException, mid_stream: bool = False) -> str:
        explained = None if mid_stream else tls.explain(exc, self.base_url, self.trust)  # a TLS lost mid-answer is a break
        return explained or _transport_message(exc, self.base_url, mid_stream)

    def ocr(self, image_url: str, **kwargs) -> OcrResult:
        """Run one page to completion (streaming under the hood, for TTFT)."""
        final = None
        for event in self.stream_ocr(image_url, **kwargs):
            if isinstance(event, OcrResult):
                final = event
        assert final is not None  # stream_ocr always ends with a result or raises
        return final


def connect(url: str | None, api_key: str | None, model: str | None,
            read_timeout: float = READ_TIMEOUT_S, ca_cert: str | None = None) -> tuple[OcrClient, ServerStatus]:
    """A client for the model the run asks for, after one probe of the server: the model
    given (which the server must list; a typo would otherwise fail every page with a 404)
    or the first one it serves. `ca_cert`: --ca-cert (tls.client_trust says what else is
    trusted). Raises ServerUnusable with a message for people.
    Shared by the batch converter, the stress test and the quality check."""
    try:
        trust = tls.client_trust(ca_cert)
    except tls.TlsConfigError as exc:
        raise ServerUnusable(str(exc)) from None
    client = OcrClient(url, api_key=api_key, model=model, read_timeout=read_timeout, trust=trust)
    status = client.status()
    if not status.reachable:
        raise ServerUnusable(f"cannot use the vLLM server at {client.base_url}: {status.error}")
    if not status.models:
        raise ServerUnusable(f"the vLLM server at {client.base_url} lists no model")
    if model and model not in status.models:
        raise ServerUnusable(f"the vLLM server at {client.base_url} does not serve the model {model!r}; it serves "
                             + ", ".join(repr(m) for m in status.models)
                             + f" (pass one to --model or {ENV_MODEL}, or leave it out for the first)")
    chosen = model or status.models[0]
    return OcrClient(url, api_key=api_key, model=chosen, read_timeout=read_timeout, trust=trust), status


def _is_timeout(exc: requests.RequestException) -> bool:
    # A read timeout while a streamed body is read reaches us as a ConnectionError wrapping
    # urllib3's ReadTimeoutError (requests' iter_content), not as requests.Timeout.
    return isinstance(exc, requests.Timeout) or any(isinstance(arg, ReadTimeoutError) for arg in exc.args)


def _transport_kind(exc: requests.RequestException) -> str:
    return "timeout" if _is_timeout(exc) else "connection"


def _transport_message(exc: requests.RequestException, base_url: str, mid_stream: bool = False) -> str:
    if isinstance(exc, requests.ConnectTimeout):
        return f"Timed out connecting to the vLLM server at {base_url}."
    if _is_timeout(exc):
        return f"The vLLM server at {base_url} did not answer in time (read timeout)."
    if isinstance(exc, requests.ConnectionError):
        if mid_stream:
            return f"The connection to the vLLM server at {base_url} broke during the answer (server stopped?)."
        if "Connection aborted" in str(exc) and base_url.startswith("http://"):
            return (f"The server at {base_url} closed the connection on a plain-HTTP request: if it serves HTTPS "
                    f"(TLS_CERT), use https:// and the cluster's CA (--ca-cert or {tls.CLIENT_CA_ENV}).")
        if "Connection aborted" in str(exc):  # TLS 1.3: a refused client certificate shows after the handshake
            return (f"The server at {base_url} closed the connection before answering: a server behind a gateway "
                    "requires the gateway's client certificate and accepts nobody else. Send requests to the "
                    "gateway's URL.")
        return f"Cannot reach the vLLM server at {base_url} (is it running? start it with ./start_optimized.sh)."
    return f"Request to {base_url} failed: {exc}"
