"""One converted document on disk: its folder, manifest, journal and Markdown files.

    ocr-out/<document>/manifest.json     what was done, page by page (status, attempts, tokens, errors)
    ocr-out/<document>/journal.jsonl     pages finished since the manifest was last written
    ocr-out/<document>/pages/0001.md     one Markdown file per page
    ocr-out/<document>/<name>.md         the document, assembled from its pages in order
    ocr-out/<document>/.lock             held by the one process converting it (ocr_bundle.batch.locking)

Each finished page costs one appended, fsynced line in the journal, whatever the length of
the document; the manifest is rewritten from memory ("compacted") when the document's run
ends, and by the next run when it finds journal lines (a killed run), so the manifest plus
the journal is always the whole record. The assembled `<name>.md` holds every page of the
document, those never converted marked where they belong; it is rewritten whenever the
manifest or the journal is newer than it, so a kill between a page's record and the
assembly is repaired by the next run.

The manifest is what makes a rerun resume. Each page's record carries its own basis: the
content hash of the source it was read from and the settings that shaped it (model,
max_tokens, DPI, longest edge, encoding). A page is done when its record is "ok" or
"flagged", its basis is the current one and its file is there; anything else is converted
again.

Finished work is data, never thrown away by a run that did not produce something better:
- a changed setting or a changed file makes the earlier pages *stale*, not gone: they stay,
  in the manifest and in the assembled document (marked), until the page is converted
  again under the new basis;
- a page with text is replaced only by a result at least as good (ok over flagged over
  failed): a worse attempt (a failed redo, a reply cut at max_tokens after a settings
  change) leaves the text as it was and is noted in the record ("redo");
- a manifest that cannot be parsed is moved aside (`manifest.json.unreadable-…`), not
  overwritten.

Every file is written atomically and durably (ocr_bundle.files), the page's Markdown
before the journal line that lists it, so whatever moment a kill or a power cut comes, a
page listed as done has its complete file.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import threading
from dataclasses import asdict, dataclass
from pathlib import Path

from ..files import atomic_write_bytes, atomic_write_json, atomic_write_text, fsync_folder
from ..grounding import Block, to_markdown
from ..inputs import InputFile
from .attempts import FAILED, FLAGGED, OK
from .identity import Snapshot, stem_of
from .locking import DocumentLock

FORMAT = 2  # 1: one basis for the whole document (upgraded on load)
MANIFEST = "manifest.json"
JOURNAL = "journal.jsonl"
# Page statuses. "flagged": converted, but no attempt finished cleanly (cut at max_tokens or
# ending in a loop); the best attempt is kept. Both count as done when resuming (attempts.py names them).
DONE = (OK, FLAGGED)
RANK = {OK: 2, FLAGGED: 1, FAILED: 0}  # a page's text is replaced only by a result of at least its rank
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
    grounding: bool = False  # LightOnOCR-3's layout blocks instead of plain Markdown

    def as_dict(self) -> dict:
        out = asdict(self)
        if not self.grounding:
            del out["grounding"]  # plain runs keep the basis they always had: no page turns stale
        return out


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def is_output_folder(folder: Path) -> bool:
    """Does `folder` hold a document's converted output (a manifest of this bundle's, not some other
    program's manifest.json)?"""
    if not (folder / MANIFEST).is_file():
        return False
    manifest = read_manifest(folder)
    return manifest is not None and manifest.get("format") in (1, FORMAT) and isinstance(manifest.get("pages"), dict)


def read_manifest(folder: Path) -> dict | None:
    """The folder's manifest, or None when there is none or it cannot be parsed."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) else None


def replay_journal(folder: Path, manifest: dict) -> int:
    """Apply the journal's page records to `manifest`; how many lines it held. A line cut by a
    kill (the last one) is skipped: its page is converted again."""
    try:
        with open(folder / JOURNAL, "rb") as handle:
            lines = handle.read().splitlines()
    except FileNotFoundError:
        return 0
    pages = manifest.setdefault("pages", {})
    for line in lines:
        try:
            entry = json.loads(line)
            pages[str(entry["page"])] = entry["record"]
        except (ValueError, KeyError, TypeError):
            continue
    return len(lines)


def load_record(folder: Path) -> dict | None:
    """The document's whole record (manifest plus journal), read only; None without a readable manifest."""
    manifest = read_manifest(folder)
    if manifest is not None:
        replay_journal(folder, _upgraded(manifest))
    return manifest


def _upgraded(manifest: dict) -> dict:
    """A format-1 manifest in format 2: each page gets the document's basis it was made under."""
    if manifest.get("format") == 1:
        for record in manifest.get("pages", {}).values():
            record.setdefault("source_sha256", manifest.get("source_sha256"))
            record.setdefault("settings", manifest.get("settings"))
        manifest["format"] = 2
    return manifest


class DocumentClosed(Exception):
    """A page finished after its document was closed (a sender past the drain timeout): left pending."""


class DocumentOutput:
    """A document's output folder. Thread-safe: pages finish in any order, from any thread."""

    def __init__(self, folder: Path, manifest: dict, known_shape: tuple[str, int] | None = None,
                 lock: DocumentLock | None = None):
        self.folder = folder
        self.manifest = manifest
        # (kind, page_count) from an earlier run over the very same file: no need to count again.
        self.known_shape = known_shape
        self.folder_lock = lock  # this process's hold on the folder (None: read only)
        self._lock = threading.Lock()
        self._journal: int | None = None  # the journal's descriptor, opened at the first page recorded
        self._closed = False  # the run let go of the folder: nothing more is written
        self._journaled = 0  # lines appended since the manifest was last written

    @classmethod
    def load(cls, folder: Path) -> DocumentOutput | None:
        """Read only (the quality check, --status): the record as it stands, manifest plus journal."""
        manifest = load_record(folder)
        return None if manifest is None else cls(folder, manifest)

    # ------------------------------------------------------------ opening
    @classmethod
    def open(cls, folder: Path, item: InputFile, snapshot: Snapshot, settings: ConversionSettings,
             lock: DocumentLock | None = None, drop: frozenset[str] = frozenset()) -> tuple[DocumentOutput, str | None]:
        """The document's output under the current basis (`snapshot`: the content the pages are
        read from, ocr_bundle.batch.identity), with the earlier pages kept; with a note when some
        of them are stale (None when everything earlier still holds). Call it holding the folder's
        lock: a killed run's journal is compacted here. Nothing is written when nothing changed,
        where the file was found included (another mount point of the same corpus)."""
        fresh = {"format": FORMAT, "pages": {}}
        note = None
        path = folder / MANIFEST
        earlier = read_manifest(folder)
        replayed = replay_journal(folder, _upgraded(earlier)) if earlier is not None else 0
        if earlier is None and path.exists():
            aside = path.with_name(f"{MANIFEST}.unreadable-{dt.datetime.now():%Y%m%d-%H%M%S}")
            os.replace(path, aside)
            note = f"its manifest could not be read: moved to {aside.name}, converted again"
        manifest = fresh if earlier is None or earlier.get("format") not in (1, FORMAT) else _upgraded(earlier)
        if earlier is not None and manifest is fresh:
            note = f"manifest of an unknown format ({earlier.get('format')!r}): converted again"
        same_file = manifest.get("source_sha256") == snapshot.sha256
        known = ((manifest["kind"], manifest["page_count"])
                 if same_file and manifest.get("kind") and manifest.get("page_count") and not manifest.get("error")
                 else None)
        before = _without_location(manifest)
        manifest.update(source=str(item.path), relative=item.relative.as_posix(), **snapshot.as_manifest(),
                        settings=settings.as_dict(), error=None)
        # What the assembled document leaves out of grounded pages: a change rewrites the manifest,
        # which makes <name>.md older than it, so the run reassembles it (no page converted again).
        if drop or "drop" in manifest:
            manifest["drop"] = sorted(drop)
        if known is None:
            manifest.update(kind=None, page_count=None)
        output = cls(folder, manifest, known, lock)
        if replayed or _without_location(manifest) != before:
            with output._lock:
                output._save()
        stale = output.stale_pages()
        if stale and note is None:
            note = f"{len(stale)} page(s) converted earlier {output.why_stale(stale[0])}: kept until converted again"
        return output, note

    @classmethod
    def unreadable(cls, folder: Path, item: InputFile, settings: ConversionSettings, error: str,
                   lock: DocumentLock | None = None) -> DocumentOutput:
        """A file that cannot be read now (gone, unreadable, too large). Its folder is left as
        it is when it holds earlier work (the file may be readable again next time); otherwise
        a manifest says why."""
        earlier = load_record(folder)
        if earlier is not None or (folder / MANIFEST).exists():
            if lock is not None:
                lock.release()  # nothing of it is written this run: another converter may have it
            return cls(folder, {**(earlier or {"pages": {}}), "error": error})
        output = cls(folder, {"format": FORMAT, "source": str(item.path), "relative": item.relative.as_posix(),
                              "source_sha256": None,
                              "source_bytes": None, "settings": settings.as_dict(), "kind": None,
                              "page_count": None, "error": error, "pages": {}, "updated_at": now()},
                     lock=lock)
        with output._lock:
            output._save()
        return output

    def forget_pages(self) -> None:
        """Keep what names the document and its shape, drop the rest of its record (read only, or let go:
        the run reads the record again when it claims the folder)."""
        with self._lock:
            self.manifest = {key: self.manifest.get(key) for key in ("source", "relative", "kind", "page_count")}
            self.manifest["pages"] = {}

    # ------------------------------------------------------------ state
    @property
    def name(self) -> str:
        return stem_of(self.manifest)

    def _current(self, record: dict) -> bool:
        return (record.get("source_sha256") == self.manifest.get("source_sha256")
                and record.get("settings") == self.manifest.get("settings"))

    def has_text(self, record: dict) -> bool:
        return record.get("status") in DONE and bool(record.get("file")) and (self.folder / record["file"]).is_file()

    def done_status(self, record: dict) -> str | None:
        """"ok" or "flagged" when the page needs no conversion under the current basis, else None.
        A page whose text is kept over a worse attempt made under the current basis counts as
        flagged (--redo-flagged tries it again)."""
        if not self.has_text(record):
            return None
        if self._current(record):
            return record["status"]
        redo = record.get("redo") or {}
        return FLAGGED if redo.get("status") == FLAGGED and self._current(redo) else None

    def done_pages(self, statuses: tuple[str, ...] = DONE) -> set[int]:
        """Pages done under the current basis with one of `statuses`, their file present."""
        return {int(n) for n, record in self.manifest["pages"].items() if self.done_status(record) in statuses}

    def all_pages(self) -> list[int]:
        """Every page of the document (one for an image, none when it cannot be read)."""
        if self.manifest.get("kind") in PAGED_KINDS:
            return list(range(1, (self.manifest.get("page_count") or 0) + 1))
        return [1] if self.manifest.get("kind") else []

    def stale_pages(self) -> list[int]:
        """Pages with text from another basis (an earlier file or other settings), not tried again since."""
        return sorted(int(n) for n, record in self.manifest["pages"].items()
                      if self.has_text(record) and self.done_status(record) is None)

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
            if (self.manifest.get("kind"), self.manifest.get("page_count"), self.manifest.get("error")) != (
                    kind, page_count, error):
                self.manifest.update(kind=kind, page_count=page_count, error=error)
                self._save()

    # ------------------------------------------------------------ writing
    def record_page(self, page: int, record: dict, text: str | None, attachments: dict[str, bytes] | None = None) -> bool:
        """Store one finished page: its Markdown first, then its journal line. A page with text
        is replaced only by a result at least as good (ok > flagged > failed); a worse one is
        noted beside the text kept ("redo"). True when the record was stored as given. An
        OSError (a full disk) leaves the page as it was before."""
        key = str(page)
        basis = {"source_sha256": self.manifest["source_sha256"], "settings": self.manifest["settings"]}
        record = {**record, **basis}
        with self._lock:
            if self._closed:  # a sender still in flight after the run let go of the folder
                raise DocumentClosed(f"{self.folder}: page {page} finished after the run ended")
            earlier = self.manifest["pages"].get(key)
            if earlier is not None and self.has_text(earlier) and RANK[record["status"]] < RANK[earlier["status"]]:
                why = record.get("error") if record["status"] == FAILED else record.get("flag")
                self._append(key, {**earlier, "redo": {"status": record["status"], "why": why, "at": now(), **basis}})
                return False
        if text is not None:
            # Outside the lock: pages of one document are written side by side (each page by one sender).
            # Attachments first (a grounded page's blocks, raw reply, pictures), the page's Markdown last.
            for name, data in sorted((attachments or {}).items()):
                atomic_write_bytes(self.folder / name, data, durable=True)
            path = self.page_file(page)
            atomic_write_text(path, text, durable=True)
            record["file"] = path.relative_to(self.folder).as_posix()
        with self._lock:
            if self._closed:
                raise DocumentClosed(f"{self.folder}: page {page} finished after the run ended")
            self._append(key, record)
        return True

    def _append(self, key: str, record: dict) -> None:
        line = (json.dumps({"page": key, "record": record}, ensure_ascii=False) + "\n").encode("utf-8")
        if self._journal is None:
            self._journal = os.open(self.folder / JOURNAL, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            fsync_folder(self.folder)  # the journal's name survives a power cut too
        written = os.write(self._journal, line)
        if written != len(line):  # a short write (a full disk on some filesystems): undo it, then say so
            os.ftruncate(self._journal, os.fstat(self._journal).st_size - written)
            raise OSError(28, "No space left on device (short write)", str(self.folder / JOURNAL))
        os.fsync(self._journal)
        self.manifest["pages"][key] = record
        self._journaled += 1

    def compact(self) -> None:
        """Write the manifest from memory and empty the journal (the document's run is over)."""
        with self._lock:
            if self._journaled or (self.folder / JOURNAL).exists() and (self.folder / JOURNAL).stat().st_size:
                self._save()

    def close(self) -> None:
        """Compact what is left and let go of the folder (another converter may take it)."""
        try:
            if self.folder_lock is not None:
                self.compact()
        finally:
            self.close_without_writing()

    def close_without_writing(self) -> None:
        """Let go of the folder as it is (the disk is full: the journal keeps what the manifest lacks)."""
        with self._lock:
            self._closed = True
        if self._journal is not None:
            os.close(self._journal)
            self._journal = None
        if self.folder_lock is not None:
            self.folder_lock.release()
            self.folder_lock = None

    def _save(self) -> None:
        """The manifest, written whole; the journal, now redundant, emptied after it."""
        self.manifest["updated_at"] = now()
        atomic_write_json(self.folder / MANIFEST, self.manifest, durable=True)
        journal = self.folder / JOURNAL
        if self._journal is not None:
            os.ftruncate(self._journal, 0)
            os.fsync(self._journal)
        elif journal.exists():
            with open(journal, "r+b") as handle:
                handle.truncate(0)
                os.fsync(handle.fileno())
        self._journaled = 0

    def page_markdown(self, record: dict, drop: frozenset[str] = frozenset(),
                      join_continued: bool = False) -> tuple[str, str | None]:
        """A page's Markdown as a document holds it, and the text it carries over to the previous
        page (a grounded page whose first block continues it, when `join_continued`). A grounded
        page that parsed cleanly is made from its blocks, without those in `drop`, pictures linked
        from the document's folder; any other page is its file."""
        blocks = self._clean_blocks(record)
        if blocks is None:
            return (self.folder / record["file"]).read_text(encoding="utf-8"), None
        pictures = {int(index): name for index, name in record.get("pictures", {}).items()}
        carried = None
        if join_continued and blocks and blocks[0].continued:
            carried = blocks[0].text
            pictures = {index - 1: name for index, name in pictures.items() if index}
            blocks = blocks[1:]
        return to_markdown(blocks, drop, pictures), carried

    def _clean_blocks(self, record: dict) -> list[Block] | None:
        """A grounded page's blocks when its reply parsed cleanly, flagged or not (None: use its page file
        as it is). Records of older runs, which did not say, count as parsed when the page was ok."""
        name = record.get("blocks_file")
        if not name or not record.get("parsed", record.get("status") == OK) or record.get("status") == FAILED:
            return None
        try:
            lines = (self.folder / name).read_text(encoding="utf-8").splitlines()
            return [Block(b["label"], tuple(b["box"]), b["text"], b["continued"])
                    for b in map(json.loads, filter(None, lines))]
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def assembly_current(self) -> bool:
        """Does <name>.md reflect the record: present, newer than the manifest, no journal lines since?"""
        try:
            assembled = self.document_file().stat().st_mtime_ns
            manifest = (self.folder / MANIFEST).stat().st_mtime_ns
        except FileNotFoundError:
            return False
        journal = self.folder / JOURNAL
        return assembled >= manifest and not (journal.exists() and journal.stat().st_size)

    def document_file(self) -> Path:
        return self.folder / f"{self.name}.md"

    def write_document(self) -> Path:
        """Assemble the document's Markdown from its page files, every page in page order
        (whatever --pages this run had); pages not converted are marked where they belong, so
        nothing is silently missing, and pages kept from an earlier basis say so. The record
        is compacted first, so the document is newer than it."""
        self.compact()
        with self._lock:
            records = {n: dict(r) for n, r in self.manifest["pages"].items()}
            paged = self.manifest.get("kind") in PAGED_KINDS
        drop = frozenset(self.manifest.get("drop") or ())
        parts = []
        for page in self.all_pages():
            record = records.get(str(page)) or {}
            heading = f"<!-- page {page} -->\n\n" if paged else ""
            if self.has_text(record):
                joined = parts and not parts[-1].endswith("-->")
                text, carried = self.page_markdown(record, drop, join_continued=bool(joined))
                if carried:  # a paragraph running on from the previous page: joined to it, not split by the break
                    parts[-1] += " " + carried
                if self.done_status(record) is None:
                    heading += (f"<!-- page {page} converted {_in_comment(self.why_stale(page))}: "
                                "rerun to convert it again -->\n\n")
                redo = record.get("redo") or {}
                if redo or record.get("redo_error"):
                    what = ("failed" if redo.get("status", FAILED) == FAILED
                            else "gave a worse result")
                    heading += (f"<!-- page {page}: converting it again {what} "
                                f"({_in_comment(redo.get('why') or record.get('redo_error'))}); "
                                "this is the earlier text -->\n\n")
                if record.get("status") == FLAGGED:
                    heading += f"<!-- page {page} flagged: {_in_comment(record.get('flag'))} -->\n\n"
                parts.append(heading + text.strip())
            elif record.get("status") == FAILED:
                parts.append(f"<!-- page {page} not converted: {_in_comment(record.get('error'))} -->")
            else:
                parts.append(f"<!-- page {page} not converted yet: rerun to resume -->")
        atomic_write_text(self.document_file(), "\n\n".join(parts) + "\n", durable=True)
        return self.document_file()


def _without_location(manifest: dict) -> str:
    """The manifest as compared for "did anything change": where the file was found is left out (the same
    corpus read through another mount point is the same work)."""
    return json.dumps({key: value for key, value in manifest.items() if key != "source"}, sort_keys=True)


def _in_comment(text: object) -> str:
    return str(text).replace("--", "—")  # "--" would end the HTML comment early
