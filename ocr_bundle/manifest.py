"""One converted document on disk: its folder, manifest and Markdown files.

    ocr-out/<document>/manifest.json     what was done, page by page (status, attempts, tokens, errors)
    ocr-out/<document>/pages/0001.md     one Markdown file per page
    ocr-out/<document>/<name>.md         the document, assembled from its pages in order

The manifest is what makes a rerun resume: it records the source's content hash and the
settings that shape the output (model, max_tokens, DPI, longest edge, encoding). Pages
whose record is "ok" or "flagged" under the same source and settings are skipped; a
changed source or setting starts the document afresh. Every file is written atomically
(ocr_bundle.files), the page's Markdown before the manifest that lists it, so whatever
moment a kill comes, a page listed as done has its complete file.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import threading
from dataclasses import asdict, dataclass
from pathlib import Path

from .files import atomic_write_json, atomic_write_text

FORMAT = 1
MANIFEST = "manifest.json"
# Page statuses. "flagged": converted, but no attempt finished cleanly (cut at max_tokens or
# ending in a loop); the best attempt is kept. Both count as done when resuming.
OK, FLAGGED, FAILED = "ok", "flagged", "failed"
DONE = (OK, FLAGGED)


@dataclass(frozen=True)
class ConversionSettings:
    """What shapes a page's output: change one and the page is converted again."""

    model: str
    max_tokens: int
    dpi: int
    longest_edge: int
    encoding: str

    def as_dict(self) -> dict:
        return asdict(self)


def file_sha256(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


class DocumentOutput:
    """A document's output folder. Thread-safe: pages finish in any order, from any thread."""

    def __init__(self, folder: Path, manifest: dict):
        self.folder = folder
        self.manifest = manifest
        self._lock = threading.Lock()

    # ------------------------------------------------------------ opening
    @classmethod
    def open(cls, folder: Path, source: Path, sha256: str, settings: ConversionSettings,
             force: bool = False) -> tuple[DocumentOutput, str | None]:
        """The document's output, resumed when its manifest matches; with the reason when the
        earlier work cannot be reused (None when resumed or new)."""
        fresh = {"format": FORMAT, "source": str(source), "source_sha256": sha256,
                 "source_bytes": source.stat().st_size, "settings": settings.as_dict(),
                 "kind": None, "page_count": None, "error": None, "pages": {}, "updated_at": now()}
        try:
            earlier = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
        except FileNotFoundError:
            return cls(folder, fresh), None
        except (OSError, ValueError) as exc:
            return cls(folder, fresh), f"unreadable manifest ({exc}): converted again"
        if force:
            reason = "--force"
        elif earlier.get("format") != FORMAT:
            reason = "manifest of another format"
        elif earlier.get("source_sha256") != sha256:
            reason = "the file changed since it was converted"
        elif earlier.get("settings") != settings.as_dict():
            changed = sorted(k for k, v in settings.as_dict().items() if (earlier.get("settings") or {}).get(k) != v)
            reason = f"settings changed ({', '.join(changed)})"
        else:
            earlier["source"] = str(source)
            return cls(folder, earlier), None
        return cls(folder, fresh), reason

    @classmethod
    def unreadable(cls, folder: Path, source: Path, settings: ConversionSettings, error: str) -> DocumentOutput:
        """A file that cannot be read at all (empty, unreadable): a manifest that says why."""
        output = cls(folder, {"format": FORMAT, "source": str(source), "source_sha256": None, "source_bytes": None,
                              "settings": settings.as_dict(), "kind": None, "page_count": None, "error": error,
                              "pages": {}, "updated_at": now()})
        with output._lock:
            output._save()
        return output

    # ------------------------------------------------------------ state
    @property
    def name(self) -> str:
        return Path(self.manifest["source"]).stem

    def done_pages(self, statuses: tuple[str, ...] = DONE) -> set[int]:
        """Pages recorded with one of `statuses` (by default: done, flagged included)."""
        return {int(n) for n, page in self.manifest["pages"].items() if page.get("status") in statuses}

    def page_file(self, page: int) -> Path:
        width = max(4, len(str(self.manifest.get("page_count") or 0)))
        return self.folder / "pages" / f"{page:0{width}d}.md"

    def describe(self, kind: str, page_count: int | None, error: str | None = None) -> None:
        """What the scan found: 'pdf' or 'image' and its page count, or why it cannot be read."""
        with self._lock:
            self.manifest.update(kind=kind, page_count=page_count, error=error)
            self._save()

    # ------------------------------------------------------------ writing
    def record_page(self, page: int, record: dict, text: str | None) -> None:
        """Store one finished page: its Markdown first, then the manifest that lists it."""
        with self._lock:
            if text is not None:
                atomic_write_text(self.page_file(page), text)
                record = {**record, "file": str(self.page_file(page).relative_to(self.folder))}
            self.manifest["pages"][str(page)] = record
            self._save()

    def _save(self) -> None:
        self.manifest["updated_at"] = now()
        atomic_write_json(self.folder / MANIFEST, self.manifest)

    def document_file(self) -> Path:
        return self.folder / f"{self.name}.md"

    def write_document(self, pages: list[int]) -> Path:
        """Assemble the document's Markdown from its page files, in page order; pages not
        converted are marked where they belong, so nothing is silently missing."""
        with self._lock:
            records = dict(self.manifest["pages"])
            is_pdf = self.manifest.get("kind") == "pdf"
        parts = []
        for page in pages:
            record = records.get(str(page)) or {}
            status = record.get("status")
            heading = f"<!-- page {page} -->\n\n" if is_pdf else ""
            if status in DONE:
                text = self.page_file(page).read_text(encoding="utf-8")
                if status == FLAGGED:
                    heading += f"<!-- page {page} flagged: {_in_comment(record.get('flag'))} -->\n\n"
                parts.append(heading + text.strip())
            elif status == FAILED:
                parts.append(f"<!-- page {page} not converted: {_in_comment(record.get('error'))} -->")
            else:
                parts.append(f"<!-- page {page} not converted yet: rerun to resume -->")
        atomic_write_text(self.document_file(), "\n\n".join(parts) + "\n")
        return self.document_file()


def _in_comment(text: object) -> str:
    return str(text).replace("--", "—")  # "--" would end the HTML comment early
