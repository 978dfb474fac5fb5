"""The document API from the page's side: a PDF's pages read through `POST /v1/ocr`, one page at a
time as each is read (the API's `stream` lines), so that the page shows its progress.

    api = DocumentApi("http://127.0.0.1:8090", key, trust)
    for page in api.read(pdf_bytes, drop={"page_number"}, include_blocks=True): ...
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from dataclasses import dataclass

import requests

from .. import tls
from ..client import OcrError


@dataclass(frozen=True)
class DocumentApi:
    url: str
    key: str | None = None
    trust: tls.Trust | None = None
    read_timeout_s: float = 600.0  # between two lines: the slowest page of a long document

    def read(self, pdf: bytes, pages: list[int] | None = None, drop: frozenset[str] = frozenset(),
             include_blocks: bool = False) -> Iterator[dict]:
        """Each page (Mistral's page object) as the API reads it, in any order; OcrError on a refusal."""
        body = {"document": {"type": "document_url",
                             "document_url": "data:application/pdf;base64," + base64.b64encode(pdf).decode()},
                "stream": True, "include_blocks": include_blocks, "drop": sorted(drop),
                **({"pages": pages} if pages is not None else {})}
        headers = {"Authorization": f"Bearer {self.key}"} if self.key else {}
        options = self.trust.requests_options() if self.trust else {}
        try:
            with requests.post(f"{self.url.rstrip('/')}/v1/ocr", json=body, headers=headers, stream=True,
                               timeout=(10, self.read_timeout_s), **options) as response:
                if response.status_code != 200:
                    raise OcrError(f"the document API answered {response.status_code}: {_message(response.text)}",
                                   "http", response.status_code)
                for line in response.iter_lines():
                    if not line:
                        continue
                    item = json.loads(line)
                    if "page" in item:
                        yield item["page"]
                    elif item.get("object") == "error":
                        raise OcrError(f"the document API: {item.get('message')}", "http", item.get("code"))
        except requests.RequestException as exc:
            raise OcrError(f"the document API at {self.url} cannot be reached ({type(exc).__name__})",
                           "connection") from exc


def _message(text: str) -> str:
    try:
        return json.loads(text).get("message") or text[:200]
    except (ValueError, AttributeError):
        return text[:200]
