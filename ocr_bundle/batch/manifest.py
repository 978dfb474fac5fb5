"""One converted document on disk: its folder, manifest and Markdown files.

    ocr-out/<document>/manifest.json     what was done, page by page (status, attempts, tokens, errors)
    ocr-out/<document>/pages/0001.md     one Markdown file per page
    ocr-out/<document>/<name>.md         the document, assembled from its pages in order

The manifest is what makes a rerun resume. Each page's record carries its own basis: the
content hash of the source it was read from and the settings that shaped it (model,
max_tokens, DPI, longest edge, encoding). A page is done when its record is "ok" or
"flagged", its basis is the current one and its file is there; anything else is converted
again.

Finished work is data, never thrown away by a run that did not produce something better:
- a changed setting or a changed file makes the earlier pages *stale*, not gone: they stay,
  in the manifest and in the assembled document (marked), until the page is converted
  again under the new basis;
- a failed attempt never replaces a page that has text (a failed redo, a server error
  after a settings change): the text stays and the record notes the failure;
- a manifest that cannot be parsed is moved aside (`manifest.json.unreadable-…`), not
  overwritten.

Every file is written atomically and durably (ocr_bundle.files), the page's Markdown
before the manifest that lists it, so whatever moment a kill or a power cut comes, a page
listed as done has its complete file.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import threading
from dataclasses import asdict, dataclass
from pathlib import Path

from ..files import atomic_write_json, atomic_write_text

FORMAT = 2  # 1: one basis for the whole document (upgraded on load)
MANIFEST = "manifest.json"
# Page statuses. "flagged": converted, but no attempt finished cleanly (cut at max_tokens or
# ending in a loop); the best attempt is kept. Both count as done when resuming.
OK, FLAGGED, FAILED = "ok", "flagged", "failed"
DONE = (OK, FLAGGED)
# Kinds of document with numbered pages (the others are one image).
PAGED_KINDS = ("pdf", "tiff")


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


def read_manifest(folder: Path) -> dict | None:
    """The folder's manifest, or None when there is none or it cannot be parsed."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) else None


def _upgraded(manifest: dict) -> dict:
    """A format-1 manifest in format 2: each page gets the document's basis it was made under."""
    if manifest.get("format") == 1:
        for record in manifest.get("pages", {}).values():
            record.setdefault("source_sha256", manifest.get("source_sha256"))
            record.setdefault("settings", manifest.get("settings"))
        manifest["format"] = 2
    return manifest


class DocumentOutput:
    """A document's output folder. Thread-safe: pages finish in any order, from any thread."""

    def __init__(self, folder: Path, manifest: dict, known_shape: tuple[str, int] | None = None):
        self.folder = folder
        self.manifest = manifest
        # (kind, page_count) from an earlier run over the very same file: no need to count again.
        self.known_shape = known_shape
        self._lock = threading.Lock()

    # ------------------------------------------------------------ opening
    @classmethod
    def open(cls, folder: Path, source: Path, sha256: str,
             settings: ConversionSettings) -> tuple[DocumentOutput, str | None]:
        """The document's output under the current basis, with the earlier pages kept; with a
        note when some of them are stale (None when everything earlier still holds)."""
        fresh = {"format": FORMAT, "pages": {}}
        note = None
        path = folder / MANIFEST
        earlier = read_manifest(folder)
        if earlier is None and path.exists():
            aside = path.with_name(f"{MANIFEST}.unreadable-{dt.datetime.now():%Y%m%d-%H%M%S}")
            os.replace(path, aside)
            note = f"its manifest could not be read: moved to {aside.name}, converted again"
        manifest = fresh if earlier is None or earlier.get("format") not in (1, FORMAT) else _upgraded(earlier)
        if earlier is not None and manifest is fresh:
            note = f"manifest of an unknown format ({earlier.get('format')!r}): converted again"
        same_file = manifest.get("source_sha256") == sha256
        known = ((manifest["kind"], manifest["page_count"])
                 if same_file and manifest.get("kind") and manifest.get("page_count") and not manifest.get("error")
                 else None)
        manifest.update(source=str(source.resolve()), source_sha256=sha256, source_bytes=source.stat().st_size,
                        settings=settings.as_dict(), error=None)
        if known is None:
            manifest.update(kind=None, page_count=None)
        output = cls(folder, manifest, known)
        stale = output.stale_pages()
        if stale and note is None:
            note = f"{len(stale)} page(s) converted earlier {output.why_stale(stale[0])}: kept until converted again"
        return output, note

    @classmethod
    def unreadable(cls, folder: Path, source: Path, settings: ConversionSettings, error: str) -> DocumentOutput:
        """A file that cannot be read now (gone, unreadable, too large). Its folder is left as
        it is when it holds earlier work (the file may be readable again next time); otherwise
        a manifest says why."""
        earlier = read_manifest(folder)
        if earlier is not None or (folder / MANIFEST).exists():
            return cls(folder, {**(earlier or {"pages": {}}), "error": error})
        output = cls(folder, {"format": FORMAT, "source": str(source.resolve()), "source_sha256": None,
                              "source_bytes": None, "settings": settings.as_dict(), "kind": None,
                              "page_count": None, "error": error, "pages": {}, "updated_at": now()})
        with output._lock:
            output._save()
        return output

    # ------------------------------------------------------------ state
    @property
    def name(self) -> str:
        return Path(self.manifest["source"]).stem

    def _current(self, record: dict) -> bool:
        return (record.get("source_sha256") == self.manifest.get("source_sha256")
                and record.get("settings") == self.manifest.get("settings"))

    def _has_text(self, record: dict) -> bool:
        return record.get("status") in DONE and bool(record.get("file")) and (self.folder / record["file"]).is_file()

    def done_pages(self, statuses: tuple[str, ...] = DONE) -> set[int]:
        """Pages done under the current basis with one of `statuses`, their file present."""
        return {int(n) for n, record in self.manifest["pages"].items()
                if record.get("status") in statuses and self._current(record) and self._has_text(record)}

    def stale_pages(self) -> list[int]:
        """Pages with text from another basis (an earlier file or other settings)."""
        return sorted(int(n) for n, record in self.manifest["pages"].items()
                      if self._has_text(record) and not self._current(record))

    def why_stale(self, page: int) -> str:
        record = self.manifest["pages"][str(page)]
        if record.get("source_sha256") != self.manifest.get("source_sha256"):
            return "from an earlier version of the file"
        earlier, current = record.get("settings") or {}, self.manifest.get("settings") or {}
        changed = sorted(key for key in current if earlier.get(key) != current[key])
        return "with other settings (" + ", ".join(f"{key} {earlier.get(key)}" for key in changed) + ")"

    def page_file(self, page: int) -> Path:
        width = max(4, len(str(self.manifest.get("page_count") or 0)))
        return self.folder / "pages" / f"{page:0{width}d}.md"

    def describe(self, kind: str | None, page_count: int | None, error: str | None = None) -> None:
        """What the scan found: 'pdf', 'tiff' or 'image' and its page count, or why it cannot be read."""
        with self._lock:
            self.manifest.update(kind=kind, page_count=page_count, error=error)
            self._save()

    # ------------------------------------------------------------ writing
    def record_page(self, page: int, record: dict, text: str | None) -> bool:
        """Store one finished page: its Markdown first, then the manifest that lists it.
        A page without text (failed) never replaces one with text: the failure is noted
        beside the text kept. True when the record was stored as given."""
        key = str(page)
        record = {**record, "source_sha256": self.manifest["source_sha256"], "settings": self.manifest["settings"]}
        if text is not None:
            # Outside the lock: pages of one document are written side by side. A kill before the
            # manifest lists it leaves the earlier record, which a rerun converts again.
            path = self.page_file(page)
            atomic_write_text(path, text, durable=True)
            record["file"] = path.relative_to(self.folder).as_posix()
        with self._lock:
            earlier = self.manifest["pages"].get(key)
            if text is None and earlier is not None and self._has_text(earlier):
                self.manifest["pages"][key] = {**earlier, "redo_error": record.get("error"), "redo_at": now()}
                self._save()
                return False
            self.manifest["pages"][key] = record
            self._save()
            return True

    def _save(self) -> None:
        self.manifest["updated_at"] = now()
        atomic_write_json(self.folder / MANIFEST, self.manifest, durable=True)

    def document_file(self) -> Path:
        return self.folder / f"{self.name}.md"

    def write_document(self, pages: list[int]) -> Path:
        """Assemble the document's Markdown from its page files, in page order; pages not
        converted are marked where they belong, so nothing is silently missing, and pages
        kept from an earlier basis say so."""
        with self._lock:
            records = {n: dict(r) for n, r in self.manifest["pages"].items()}
            paged = self.manifest.get("kind") in PAGED_KINDS
        parts = []
        for page in pages:
            record = records.get(str(page)) or {}
            heading = f"<!-- page {page} -->\n\n" if paged else ""
            if self._has_text(record):
                text = (self.folder / record["file"]).read_text(encoding="utf-8")
                if not self._current(record):
                    heading += (f"<!-- page {page} converted {_in_comment(self.why_stale(page))}: "
                                "rerun to convert it again -->\n\n")
                if record.get("redo_error"):
                    heading += (f"<!-- page {page}: converting it again failed "
                                f"({_in_comment(record['redo_error'])}); this is the earlier text -->\n\n")
                if record.get("status") == FLAGGED:
                    heading += f"<!-- page {page} flagged: {_in_comment(record.get('flag'))} -->\n\n"
                parts.append(heading + text.strip())
            elif record.get("status") == FAILED:
                parts.append(f"<!-- page {page} not converted: {_in_comment(record.get('error'))} -->")
            else:
                parts.append(f"<!-- page {page} not converted yet: rerun to resume -->")
        atomic_write_text(self.document_file(), "\n\n".join(parts) + "\n", durable=True)
        return self.document_file()


def _in_comment(text: object) -> str:
    return str(text).replace("--", "—")  # "--" would end the HTML comment early
