"""What a `POST /v1/ocr` request asks for, read and checked before any page is rendered: the
document (a data URL; a remote URL only when fetching is turned on), the pages, the options.
Every refusal is an ApiError with the status and the reason the client sees.

The request is Mistral's OCR request (https://docs.mistral.ai/api/#tag/ocr):

    {"model": "...", "document": {"type": "document_url", "document_url": "data:application/pdf;base64,..."},
     "pages": [0, 2], "include_image_base64": true, "image_limit": 10, "image_min_size": 0,
     "drop": ["page_number"],          # the bundle's own: LightOnOCR-3's blocks left out of the Markdown
     "stream": true}                   # the bundle's own: one JSON line per page as it is read (the page's
                                       # progress), then the usage line; without it, Mistral's one response

`document` may also be {"type": "image_url", "image_url": "data:image/png;base64,..."} (or
{"url": ...}). With a grounding model (LightOnOCR-3), `include_blocks` adds each page's blocks in
Mistral's shape (`type` is LightOnOCR's label). Fields Mistral defines that have no meaning here
(annotations, table_format, extract_header...) are accepted and ignored, as its SDK sends some.
"""

from __future__ import annotations

import base64
import binascii
import os
from dataclasses import dataclass

from ..grounding import DROPPABLE
from ..settings import env_default, positive_int, positive_number

FETCH_ENV = "OCR_API_FETCH"  # 1: remote http(s) documents are fetched by the API (off: no server-side fetching)
MAX_PAGES_ENV, MAX_MB_ENV = "OCR_API_MAX_PAGES", "OCR_API_MAX_MB"
DEFAULT_MAX_PAGES, DEFAULT_MAX_MB = 1000, 100
FETCH_TIMEOUT_S = 30.0


class ApiError(Exception):
    """A request refused: `status` and a message for the client."""

    def __init__(self, status: int, message: str, code: str = "invalid_request", retry_after_s: float | None = None):
        super().__init__(message)
        self.status, self.message, self.code, self.retry_after_s = status, message, code, retry_after_s

    def body(self) -> dict:
        """The API's error object (a response's body, or a streamed line)."""
        return {"object": "error", "message": self.message, "type": self.code, "code": self.status}


@dataclass(frozen=True)
class Limits:
    max_pages: int = DEFAULT_MAX_PAGES
    max_bytes: int = DEFAULT_MAX_MB * 10**6
    fetch: bool = False

    @classmethod
    def from_env(cls) -> Limits:
        return cls(env_default(MAX_PAGES_ENV, DEFAULT_MAX_PAGES, positive_int),
                   int(env_default(MAX_MB_ENV, DEFAULT_MAX_MB, positive_number) * 10**6),
                   os.environ.get(FETCH_ENV, "").strip().lower() in ("1", "true", "yes", "on"))


@dataclass(frozen=True)
class OcrRequest:
    data: bytes
    pages: list[int] | None  # 0-based, in the order asked; None: every page
    include_image_base64: bool
    image_limit: int | None
    image_min_size: int
    drop: frozenset[str]
    stream: bool = False
    include_blocks: bool = False  # LightOnOCR-3's blocks as Mistral's page `blocks` (type: its label)


def _field(body: dict, name: str, kind: type, default=None):
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) != (kind is bool) or not isinstance(value, kind):  # True is an int to Python
        raise ApiError(400, f"'{name}' must be {'a list' if kind is list else 'an integer' if kind is int else 'true or false'}, "
                            f"not {type(value).__name__}")
    return value


def _document_url(document: object) -> str:
    if not isinstance(document, dict):
        raise ApiError(400, "'document' is required: {\"type\": \"document_url\", \"document_url\": \"data:"
                            "application/pdf;base64,...\"} or {\"type\": \"image_url\", \"image_url\": \"data:...\"}")
    kind = document.get("type", "document_url")
    if kind not in ("document_url", "image_url"):
        raise ApiError(400, f"document type {kind!r} is not supported here: send 'document_url' (a PDF or an image "
                            "as a data URL) or 'image_url'", "unsupported_document")
    url = document.get(kind)
    if isinstance(url, dict):  # {"image_url": {"url": ...}}, as chat requests write it
        url = url.get("url")
    if not isinstance(url, str) or not url:
        raise ApiError(400, f"'document.{kind}' must be a data URL (data:application/pdf;base64,...)")
    return url


def decode_data_url(url: str) -> bytes:
    header, comma, payload = url.partition(",")
    if not comma or not header.startswith("data:") or not header.endswith(";base64"):
        raise ApiError(400, "the document must be a base64 data URL (data:application/pdf;base64,...)")
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ApiError(400, f"the document's base64 is not valid ({exc})") from exc


def fetch(url: str, max_bytes: int) -> bytes:
    """A remote document, read up to `max_bytes` (OCR_API_FETCH=1 only)."""
    import requests

    try:
        with requests.get(url, stream=True, timeout=FETCH_TIMEOUT_S, allow_redirects=False) as response:
            if response.status_code != 200:
                raise ApiError(400, f"fetching the document answered {response.status_code}", "fetch_failed")
            data = b""
            for chunk in response.iter_content(1 << 20):
                data += chunk
                if len(data) > max_bytes:
                    raise ApiError(413, f"the document is over {max_bytes / 10**6:g} MB ({MAX_MB_ENV})", "too_large")
            return data
    except requests.RequestException as exc:
        raise ApiError(400, f"the document could not be fetched ({type(exc).__name__})", "fetch_failed") from exc


def read_request(body: object, limits: Limits) -> OcrRequest:
    """The request, checked; ApiError with the reason otherwise. The document's content (PDF or
    image, pages) is checked when it is opened (service.py)."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    url = _document_url(body.get("document"))
    if url.startswith(("http://", "https://")):
        if not limits.fetch:
            raise ApiError(400, "remote document URLs are not fetched by this server (no server-side fetching); "
                                "send the document as a data URL, or start it with OCR_API_FETCH=1", "fetch_disabled")
        data = fetch(url, limits.max_bytes)
    else:
        if len(url) > limits.max_bytes * 4 // 3 + 200:
            raise ApiError(413, f"the document is over {limits.max_bytes / 10**6:g} MB ({MAX_MB_ENV})", "too_large")
        data = decode_data_url(url)
    if not data:
        raise ApiError(400, "the document is empty (0 bytes)")
    if len(data) > limits.max_bytes:
        raise ApiError(413, f"the document is {len(data) / 10**6:.1f} MB, over the limit of "
                            f"{limits.max_bytes / 10**6:g} MB ({MAX_MB_ENV})", "too_large")
    pages = _field(body, "pages", list)
    if pages is not None:
        if not pages or not all(isinstance(p, int) and not isinstance(p, bool) and p >= 0 for p in pages):
            raise ApiError(400, "'pages' must be a list of 0-based page indices (e.g. [0, 1, 4])")
        pages = list(dict.fromkeys(pages))
        if len(pages) > limits.max_pages:
            raise ApiError(413, f"{len(pages)} pages asked, over the limit of {limits.max_pages} ({MAX_PAGES_ENV})",
                           "too_many_pages")
    drop = _field(body, "drop", list, [])
    unknown = sorted(set(map(str, drop)) - set(DROPPABLE))
    if unknown:
        raise ApiError(400, f"'drop' takes {', '.join(DROPPABLE)}; not {', '.join(unknown)}")
    image_limit = _field(body, "image_limit", int)
    return OcrRequest(data, pages, bool(_field(body, "include_image_base64", bool, False)),
                      image_limit if image_limit is None or image_limit >= 0 else 0,
                      max(0, _field(body, "image_min_size", int, 0)), frozenset(drop),
                      bool(_field(body, "stream", bool, False)), bool(_field(body, "include_blocks", bool, False)))


def select_pages(asked: list[int] | None, count: int, limits: Limits) -> list[int]:
    """0-based pages to read of a document of `count` pages; ApiError when out of range or too many."""
    if asked is None:
        if count > limits.max_pages:
            raise ApiError(413, f"the document has {count} pages, over the limit of {limits.max_pages} "
                                f"({MAX_PAGES_ENV}): ask for some with 'pages'", "too_many_pages")
        return list(range(count))
    outside = [p for p in asked if p >= count]
    if outside:
        raise ApiError(400, f"page {outside[0]} does not exist: the document has {count} page(s), indices 0 to "
                            f"{count - 1}", "page_out_of_range")
    return asked
