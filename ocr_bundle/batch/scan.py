"""Before the run: what each input is and what is left to do.

Each document's folder is locked while it is read (in chunks, so a corpus of any size holds a
bounded number of files open), its input's snapshot taken (ocr_bundle.batch.identity: hashed only
when the file changed since its manifest), its pages counted in the render pool (a file that
crashes its parser fails alone) and the pages already done read from its record. Bad files are
documents with an error, never exceptions; a file unreadable now keeps its earlier output; a folder
another converter holds is skipped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path, PurePath

from ..files import is_disk_full, remove_partials
from ..images import InputError
from ..inputs import InputFile, output_folders, pages_in
from . import identity
from .identity import Snapshot
from .locking import DocumentLock
from .manifest import DONE, MANIFEST, OK, PAGED_KINDS, ConversionSettings, DocumentOutput, read_manifest
from .options import BatchOptions
from .render_pool import CountJob, RenderPool

SCAN_CHUNK = 64  # documents whose folders the scan holds at once (one open file each)


@dataclass
class Document:
    """One input file, its output, and the pages this run converts."""

    source: InputFile
    output: DocumentOutput
    kind: str | None  # "pdf", "tiff" (pages) or "image" (one page); None when unreadable
    pages: list[int]  # in scope (--pages), in order
    todo: list[int]  # not done yet
    error: str | None = None  # why the file cannot be read at all
    note: str | None = None  # why earlier work is not reused as it is
    snapshot: Snapshot | None = None  # the content the pages were counted on: checked again when the run claims it
    held_by: str | None = None  # another live converter holds the folder: skipped ("pid N on host")
    needs_assembly: bool = False  # <name>.md is missing or older than the record: rewrite it
    touched: bool = False  # a page was recorded in this run
    recorded: set[int] = field(default_factory=set)  # pages of `todo` recorded in this run

    def pending(self) -> list[int]:
        """Pages of `todo` this run has not recorded (yet)."""
        return [page for page in self.todo if page not in self.recorded]


class Snapshots:
    """Each input's snapshot (ocr_bundle.batch.identity), taken once and only hashed when needed: a
    file whose size and modification time match its own manifest's is taken to be the file hashed then."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self._snapshots: dict[Path, Snapshot | InputError | OSError] = {}

    def take(self, item: InputFile, earlier: dict | None = None) -> Snapshot | InputError | OSError:
        if item.path not in self._snapshots:
            known = (identity.recorded(earlier) if earlier is not None and identity.same_document(earlier, item)
                     else None)
            try:
                self._snapshots[item.path] = identity.take(item.path, self.max_bytes, known)
            except (InputError, OSError) as exc:
                self._snapshots[item.path] = exc
        return self._snapshots[item.path]


def scan(inputs: list[InputFile], out_root: Path, settings: ConversionSettings, options: BatchOptions,
         pool: RenderPool) -> list[Document]:
    """Read what is there to do: lock each document's folder, content hash (only of files
    changed since their manifest), page count (counted in the render pool, so a file that
    crashes its parser fails alone), pages already done. Bad files are documents with an
    error, never exceptions; a file unreadable now keeps its earlier output; a folder
    another converter holds is skipped. A full disk raises (OSError)."""
    snapshots = Snapshots(options.max_bytes)

    def belongs(item: InputFile, folder: PurePath) -> bool | None:
        """Does `folder` hold this input's earlier output (the same document, or its content), another's, or none?"""
        if not (out_root / folder / MANIFEST).exists():
            return None
        earlier = read_manifest(out_root / folder)
        if earlier is None:
            return False  # a manifest that cannot be read: not ours to take
        if identity.same_document(earlier, item):
            return True
        snapshot = snapshots.take(item, earlier)
        return isinstance(snapshot, Snapshot) and earlier.get("source_sha256") == snapshot.sha256

    folders = output_folders(inputs, belongs)
    documents: list[Document] = []
    # In chunks: each folder is locked while it is read and written here, then let go (the run claims
    # it again when it reaches it), so a corpus of any size holds a bounded number of files open.
    for start in range(0, len(inputs), SCAN_CHUNK):
        documents += _scan_chunk(inputs[start:start + SCAN_CHUNK], out_root, folders, snapshots, settings, options,
                                 pool)
    return documents


def _scan_chunk(inputs: list[InputFile], out_root: Path, folders: dict[Path, PurePath], snapshots: Snapshots,
                settings: ConversionSettings, options: BatchOptions, pool: RenderPool) -> list[Document]:
    opened = []
    for item in inputs:
        folder = out_root / folders[item.path]
        lock = DocumentLock.acquire(folder, announce=False)
        if isinstance(lock, str):  # another live converter: its files, its temporary files, its pages
            opened.append((item, DocumentOutput(folder, {"source": str(item.path), "pages": {}}), None, None, lock))
            continue
        remove_partials(folder)  # what a killed run left half-written: ours to clean, we hold the lock
        snapshot = snapshots.take(item, read_manifest(folder) if not options.force else None)
        if not isinstance(snapshot, Snapshot):
            error = reason_of(snapshot)
            opened.append((item, DocumentOutput.unreadable(folder, item, settings, error, lock), None, error,
                           None))
            continue
        try:
            output, note = DocumentOutput.open(folder, item, snapshot, settings, lock, options.drop)
        except OSError as exc:
            lock.release()
            if is_disk_full(exc):
                raise
            error = reason_of(exc)
            opened.append((item, DocumentOutput.unreadable(folder, item, settings, error), None, error, None))
            continue
        # Counting a PDF's pages runs pdfium: in the pool, all files at once.
        counting = None if output.known_shape else pool.submit(CountJob(str(item.path), options.max_bytes))
        opened.append((item, output, note, counting, None))

    documents = []
    for item, output, note, counting, held_by in opened:
        if held_by is not None:
            documents.append(Document(item, output, None, [], [], held_by=held_by))
            continue
        try:
            documents.append(_counted(item, output, note, counting, options))
        finally:
            output.close()  # let go: the run claims the folder again when it reaches it
            # The run reads the record again when it claims the document: between the scan and then, a
            # document costs its index entry, not its pages (a corpus of any length in bounded memory).
            output.forget_pages()
    return documents


def _counted(item: InputFile, output: DocumentOutput, note: str | None, counting, options: BatchOptions) -> Document:
    """The document once its pages are counted: what is in scope and what is left to do."""
    if isinstance(counting, str):  # unreadable: `counting` is the reason
        return Document(item, output, None, [], [], error=counting)
    if counting is None:
        (kind, count), error = output.known_shape, None
    else:
        counted = RenderPool.result(counting)
        kind, count, error = counted.kind, counted.page_count, counted.error
    output.describe(kind, count, error)
    if error:
        return Document(item, output, None, [], [], error=error, note=note)
    pages = pages_in(options.pages, count) if kind in PAGED_KINDS else [1]
    return Document(item, output, kind, pages, pages_left(output, pages, options), None, note,
                    snapshot=identity.recorded(output.manifest), needs_assembly=not output.assembly_current())


def pages_left(output: DocumentOutput, pages: list[int], options: BatchOptions) -> list[int]:
    done = set() if options.force else output.done_pages((OK,) if options.redo_flagged else DONE)
    return [page for page in pages if page not in done]


def reason_of(exc: Exception) -> str:
    if isinstance(exc, InputError):
        return str(exc)
    return f"The file cannot be read: {exc.strerror or exc}." if isinstance(exc, OSError) else str(exc)
