"""The document API's routes (FastAPI): POST /v1/ocr, GET /v1/models, GET /health, GET /metrics.

Every route but /health needs the client key (VLLM_API_KEY, the same as the OCR server's), and so
does any path the app does not have (401 before 404: nothing is learnt without the key). Errors are
JSON, `{"object": "error", "message": ..., "type": ..., "code": status}`, with Retry-After when
the OCR server is away. A client that disconnects cancels its pages not yet sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import threading
from concurrent.futures import ThreadPoolExecutor

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from ..serve.route_keys import KeyEveryRoute
from .documents import ApiError, OcrRequest, read_request
from .service import DocumentService

DISCONNECT_POLL_S = 0.25


def error_response(error: ApiError) -> JSONResponse:
    headers = {"Retry-After": f"{error.retry_after_s:g}"} if error.retry_after_s else {}
    return JSONResponse(error.body(), status_code=error.status, headers=headers)


# Every path but /health, known or not, needs the key: the vLLM server's own middleware (plain ASGI, so a
# client's disconnect still reaches the route), with this API's error shape.
KEY_REFUSED = json.dumps(ApiError(401, "a valid API key is required (Authorization: Bearer <key>)",
                                  "unauthorized").body()).encode()


def build_app(service: DocumentService, key: str | None, max_requests: int = 256) -> FastAPI:
    handlers = ThreadPoolExecutor(max_requests, thread_name_prefix="ocr-request")

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        handlers.shutdown(wait=False, cancel_futures=True)

    app = FastAPI(title="LightOnOCR document API", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)
    registry = CollectorRegistry()
    requests_total = Counter("ocr_api_requests", "POST /v1/ocr requests answered, by status", ["status"],
                             registry=registry)
    pages_total = Counter("ocr_api_pages", "pages read and returned", registry=registry)
    in_flight = Gauge("ocr_api_requests_in_flight", "requests being read", registry=registry)
    Gauge("ocr_api_pages_in_flight", "pages at the OCR server now (all requests)",
          registry=registry).set_function(service.slots.in_use)
    Gauge("ocr_api_pages_sent", "pages sent to the OCR server since the start",
          registry=registry).set_function(lambda: service.pages_sent)

    if key:
        app.add_middleware(KeyEveryRoute, key=key, open_paths=frozenset({"/health"}), refusal=KEY_REFUSED)

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/metrics")
    async def metrics():
        return PlainTextResponse(generate_latest(registry).decode(), media_type="text/plain; version=0.0.4")

    @app.get("/v1/models")
    async def models():
        try:
            model, _ = await asyncio.get_running_loop().run_in_executor(handlers, service.model)
        except ApiError as error:
            return error_response(error)
        return {"object": "list", "data": [{"id": model, "object": "model", "owned_by": "lightonocr-bundle"}]}

    @app.post("/v1/ocr")
    async def ocr(request: Request):
        in_flight.inc()
        streaming = False
        try:
            ocr_request = await _request(request)
            if ocr_request.stream:
                streaming = True
                return StreamingResponse(_stream(ocr_request), media_type="application/x-ndjson")
            result = await _read(request, ocr_request)
        except ApiError as error:
            requests_total.labels(str(error.status)).inc()
            return error_response(error)
        finally:
            if not streaming:
                in_flight.dec()
        requests_total.labels("200").inc()
        pages_total.inc(len(result["pages"]))
        return JSONResponse(result)

    async def _stream(ocr_request: OcrRequest):
        """One JSON line per page as it is read, then the usage line (or an error line). The client
        going away ends this generator: its pages not yet sent are not sent."""
        loop, lines = asyncio.get_running_loop(), asyncio.Queue()
        cancelled = threading.Event()
        work = loop.run_in_executor(handlers, functools.partial(
            service.read, ocr_request, cancelled,
            lambda page: loop.call_soon_threadsafe(lines.put_nowait, {"page": page})))
        work.add_done_callback(lambda done: lines.put_nowait(None))
        try:
            while (line := await lines.get()) is not None:
                pages_total.inc()
                yield json.dumps(line) + "\n"
            try:
                result = work.result()
            except ApiError as error:
                requests_total.labels(str(error.status)).inc()
                yield json.dumps(error.body()) + "\n"
                return
            requests_total.labels("200").inc()
            yield json.dumps({"model": result["model"], "usage_info": result["usage_info"]}) + "\n"
        finally:
            cancelled.set()  # done, or the client went away
            in_flight.dec()

    async def _request(request: Request) -> OcrRequest:
        limit = service.limits.max_bytes * 4 // 3 + 64 * 1024  # base64 and the JSON around it
        too_large = ApiError(413, f"the request is over {service.limits.max_bytes / 10**6:g} MB of document "
                                  "(OCR_API_MAX_MB)", "too_large")
        if int(request.headers.get("content-length") or 0) > limit:
            raise too_large  # said before the body is read
        raw = await request.body()
        if len(raw) > limit:
            raise too_large
        try:
            body = json.loads(raw)
        except ValueError as exc:
            raise ApiError(400, f"the request body is not JSON ({exc})") from exc
        return await asyncio.get_running_loop().run_in_executor(handlers, read_request, body, service.limits)

    async def _read(request: Request, ocr_request: OcrRequest) -> dict:
        loop = asyncio.get_running_loop()
        cancelled = threading.Event()
        work = loop.run_in_executor(handlers, service.read, ocr_request, cancelled)
        while not work.done():
            await asyncio.wait({work}, timeout=DISCONNECT_POLL_S)
            if not work.done() and not cancelled.is_set() and await request.is_disconnected():
                cancelled.set()  # its pages not sent yet are not sent
        return work.result()

    @app.api_route("/{path:path}", methods=["GET", "POST", "PUT", "DELETE", "PATCH"])
    async def elsewhere(path: str):
        return error_response(ApiError(404, f"no route /{path}: this is the document API (POST /v1/ocr)",
                                       "not_found"))

    return app
