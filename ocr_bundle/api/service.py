"""A document through the converter's own parts: its render pool (PDF pages at the model's size,
in worker processes), its PageReader (retries of cut, looping and garbled replies; flags), the
grounding parser and its picture crops. Pages go out through FairSlots, shared by every request.

The response is Mistral's OCR response: per page its index, Markdown (made from LightOnOCR-3's
blocks when the server grounds, as the converter's pages/0001.md), its pictures with their boxes in
the page's pixels (and the crop as a data URL when asked), its dimensions; then usage_info.
"""

from __future__ import annotations

import base64
import dataclasses
import os
import tempfile
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from ..batch.attempts import FLAGGED, PageAbandoned, PageFailed, PageReader, PageStats
from ..batch.grounded import cut_pictures
from ..batch.options import BatchOptions
from ..batch.render_pool import IMAGE, CountJob, PageJob, RenderPool
from ..batch.server_watch import ServerWatch
from ..client import OcrClient
from ..families import Family
from ..grounding import parse, to_markdown
from ..settings import MAX_OUTPUT_TOKENS, PDF_RENDER_DPI, TARGET_LONGEST_EDGE
from .documents import ApiError, Limits, OcrRequest, select_pages
from .fair import FairSlots

SERVER_AWAY_RETRY_S = 10  # Retry-After when the OCR server is away
DEFAULT_SERVER_WAIT_S = 10.0  # how long a request waits out a server that is away before answering 503


def client_gone() -> ApiError:
    """What a page not sent because its client disconnected ends with (nobody reads it: 499, as nginx says)."""
    return ApiError(499, "the client went away", "cancelled")


@dataclass
class DocumentService:
    client: OcrClient
    pool: RenderPool
    slots: FairSlots
    limits: Limits = field(default_factory=Limits)
    options: BatchOptions = field(default_factory=BatchOptions)
    max_tokens: int = MAX_OUTPUT_TOKENS
    temperature: float | None = None  # None: the served family's (as the converter)
    server_wait_s: float = DEFAULT_SERVER_WAIT_S
    spool: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="ocr-api-")))  # 0700: ours only
    pages_sent: int = 0  # pages sent to the OCR server, for /metrics and the tests
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def model(self) -> tuple[str, Family]:
        """(the served model, its family); 503 when the server is away."""
        status = self.client.status(timeout=5.0)
        if not status.reachable or not status.models:
            raise ApiError(503, f"the OCR server is not available ({status.error or 'no model served'})",
                           "server_unavailable", SERVER_AWAY_RETRY_S)
        model = self.client.model()
        return model, status.family(model)

    def read(self, request: OcrRequest, cancelled: threading.Event,
             on_page: Callable[[dict], None] = lambda page: None) -> dict:
        """The response for `request`; ApiError when it cannot be read. `cancelled` (the client went
        away) stops its pages not yet sent; `on_page` hears of each page as it is read (any order)."""
        model, family = self.model()
        grounding = family.grounding == "blocks"
        options = dataclasses.replace(self.options, top_p=family.top_p, temperature=family.temperature
                                      if self.temperature is None else self.temperature)
        handle, path = tempfile.mkstemp(dir=self.spool, suffix=".doc")
        try:
            with os.fdopen(handle, "wb") as spooled:
                spooled.write(request.data)
            counted = self.pool.result(self.pool.submit(CountJob(path, self.limits.max_bytes)))
            if counted.error:
                raise ApiError(400, counted.error, "unreadable_document")
            pages = select_pages(request.pages, counted.page_count, self.limits)
            watch = ServerWatch(self.client, self.server_wait_s, cancelled)
            reader = PageReader(self.client, model, self.max_tokens, grounding, options, watch, cancelled)
            owner = object()
            with ThreadPoolExecutor(min(len(pages), self.slots.slots)) as senders:
                futures = [senders.submit(self._page, owner, reader, path, counted.kind, index, request, grounding,
                                          cancelled) for index in pages]
                for future in futures:
                    future.add_done_callback(lambda done: done.exception() is None and on_page(done.result()))
                try:
                    out = [future.result() for future in futures]
                except BaseException:
                    cancelled.set()  # one page failed: the others not sent yet are not sent
                    raise
        finally:
            os.unlink(path)
        return {"pages": out, "model": model,
                "usage_info": {"pages_processed": len(out), "doc_size_bytes": len(request.data)}}

    def _page(self, owner: object, reader: PageReader, path: str, kind: str, index: int, request: OcrRequest,
              grounding: bool, cancelled: threading.Event) -> dict:
        if not self.slots.acquire(owner, cancelled):
            raise client_gone()
        try:
            rendered = self.pool.result(self.pool.submit(PageJob(path, index + 1, kind, "PNG", PDF_RENDER_DPI,
                                                                 TARGET_LONGEST_EDGE, self.limits.max_bytes)))
            if rendered.error:
                if kind == IMAGE:  # the document is this one image
                    raise ApiError(400, rendered.error, "unreadable_document")
                raise ApiError(400, f"page {index}: {rendered.error}", "unreadable_page")
            with self._lock:
                self.pages_sent += 1
            session = self.client.new_session()
            try:
                status, record, text = reader.read(rendered.data_url, session, PageStats())
            except PageAbandoned as exc:
                if cancelled.is_set():
                    raise client_gone() from exc
                raise ApiError(503, "the OCR server went away while reading the document", "server_unavailable",
                               SERVER_AWAY_RETRY_S) from exc
            except PageFailed as exc:
                raise ApiError(502, f"page {index}: the OCR server could not read it ({exc})", "page_failed") from exc
            finally:
                session.close()
        finally:
            self.slots.release()
        page = {"index": index, "markdown": text, "images": [],
                "dimensions": {"dpi": rendered.dpi or 0, "height": rendered.height, "width": rendered.width}}
        if status == FLAGGED:
            page["flag"] = record["flag"]  # the bundle's: why no attempt was clean (cut, a loop, a garbled reply)
        if grounding:
            self._grounded(page, text, record["finish_reason"] == "length", rendered, request)
        return page

    @staticmethod
    def _grounded(page: dict, reply: str, cut: bool, rendered, request: OcrRequest) -> None:
        """The page's Markdown from its blocks (without `drop`) and its pictures as Mistral's `images`."""
        parsed = parse(reply, cut=cut)
        if not parsed.clean:
            return  # the reply as it came, flagged (as the converter keeps it)
        pictures = cut_pictures(parsed.blocks, rendered, lambda index, block: f"img-{page['index']}-{index}.png",
                                max(1, request.image_min_size))
        kept = sorted(pictures.names)[:request.image_limit]  # image_limit: pictures kept per page (None: all)
        for index in kept:
            x1, y1, x2, y2 = parsed.blocks[index].pixels(pictures.width, pictures.height)
            page["images"].append({
                "id": pictures.names[index], "top_left_x": x1, "top_left_y": y1, "bottom_right_x": x2,
                "bottom_right_y": y2, "image_base64": ("data:image/png;base64," + base64.b64encode(
                    pictures.crops[index]).decode()) if request.include_image_base64 else None})
        page["markdown"] = to_markdown(parsed.blocks, request.drop, {i: pictures.names[i] for i in kept})
        if request.include_blocks:
            page["blocks"] = [dict(zip(("type", "top_left_x", "top_left_y", "bottom_right_x", "bottom_right_y",
                                        "content"), (block.label, *block.pixels(pictures.width, pictures.height),
                                                     block.text))) for block in parsed.blocks]
