"""`batch_ocr.py --status OUT`: is a corpus finished? Read only, no server needed.

Reads every document folder under OUT (written by any number of converters and shards), and,
given the corpus's inputs, names each file no run has started (a shard that never ran):
per document and overall, pages done (ok, flagged), failed, stale (converted from an
earlier version of the file or under other settings), pending (never converted); whether
a live converter holds the document now; whether `<name>.md` is current. A corpus is
complete when every page of every document is done, nothing is held, no file changed
since, and every `<name>.md` is current: that, and only that, exits 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..inputs import InputFile
from ..tables import aligned
from .locking import held_locks, holder_of
from . import identity
from .manifest import FAILED, MANIFEST, DocumentOutput

COUNTS = ("ok", "flagged", "failed", "stale", "pending")


@dataclass
class DocumentStatus:
    folder: Path
    source: str
    pages: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTS, 0))
    held_by: str | None = None
    assembled: bool = False  # <name>.md is there and current
    problem: str | None = None  # unreadable file, changed file, pages never counted

    @property
    def complete(self) -> bool:
        done = self.pages["ok"] + self.pages["flagged"]
        return (self.problem is None and self.held_by is None and self.assembled and done > 0
                and done == sum(self.pages.values()))


def document_status(folder: Path, source: Path | None = None,
                    held: dict[tuple[int, int, int], int] | None = None,
                    output: DocumentOutput | None = None) -> DocumentStatus:
    """One document's state; `source`: where its input is now (given the corpus), else where it was last
    seen; `held`: the locks held on this machine (locking.held_locks); `output`: its record, if read already."""
    output = output or DocumentOutput.load(folder)
    if output is None:
        return DocumentStatus(folder, "?", problem="its manifest cannot be read")
    manifest = output.manifest
    status = DocumentStatus(folder, str(source) if source else manifest.get("source") or "?",
                            held_by=holder_of(folder, held), assembled=output.assembly_current())
    if manifest.get("error"):
        status.problem = f"unreadable: {manifest['error']}"
    elif not manifest.get("kind"):
        status.problem = "pages not counted yet (a run was stopped while reading it)"
    changed = _source_changed(manifest, source)
    if changed and status.problem is None:
        status.problem = changed
    for page in output.all_pages():
        record = manifest.get("pages", {}).get(str(page))
        done = output.done_status(record) if record and not changed else None
        if done is not None:
            status.pages[done] += 1
        elif record and output.has_text(record):
            status.pages["stale"] += 1
        elif record and record.get("status") == FAILED:
            status.pages["failed"] += 1
        else:
            status.pages["pending"] += 1
    return status


def _source_changed(manifest: dict, source: Path | None) -> str | None:
    """Why the input no longer is the file converted (None when it still is, or cannot be told). `source`:
    the input as the corpus names it now; without it, where the manifest last saw it."""
    recorded = identity.recorded(manifest)
    path = source or (Path(manifest["source"]) if manifest.get("source") else None)
    if path is None or recorded is None:
        return None
    try:
        now = identity.take(path, known=recorded)
    except FileNotFoundError:
        # Given the corpus, its file is gone; otherwise it was moved or deleted: the output stands on its own.
        return "its input is gone from the corpus" if source else None
    except OSError as exc:
        return f"its input cannot be read now ({exc.strerror or exc})"
    return None if now.sha256 == recorded.sha256 else "its input changed since it was converted: rerun to convert it again"


def corpus_status(out: Path, inputs: list[InputFile] = ()) -> list[DocumentStatus]:
    """Every document folder under `out`; and each of `inputs` (the corpus, when given) that no
    run has started, as a document of no pages with that problem: a shard that never ran.
    Documents and inputs meet by their relative path (ocr_bundle.batch.identity): the corpus may be
    mounted here at another path than where the converters read it."""
    by_relative = {item.relative.as_posix(): item for item in inputs}
    documents, started, held = [], set(), held_locks()
    for path in sorted(out.rglob(MANIFEST)):
        output = DocumentOutput.load(path.parent)  # read once: for its identity and for its state
        manifest = output.manifest if output else {}
        relative = identity.relative_of(manifest)
        if relative is None:  # a manifest of an older bundle: by the path it recorded
            relative = next((key for key, item in by_relative.items() if identity.same_document(manifest, item)), None)
        item = by_relative.get(relative) if relative else None
        documents.append(document_status(path.parent, item.path if item else None, held, output))
        started.add(relative)
    for relative, item in by_relative.items():
        if relative not in started:
            documents.append(DocumentStatus(out / item.relative, str(item.path),
                                            problem="not started: no run has converted it yet"))
    return documents


def _state(document: DocumentStatus) -> str:
    if document.complete:
        return "complete"
    if document.problem:
        return document.problem
    if document.held_by:
        return "being converted"
    done = document.pages["ok"] + document.pages["flagged"]
    return "<name>.md behind: rerun" if done == sum(document.pages.values()) else "not done: rerun"


def status_report(out: Path, documents: list[DocumentStatus]) -> tuple[str, bool]:
    """The report's text and whether the corpus is complete."""
    if not documents:
        return f"no converted documents under {out}", False
    body = []
    for document in documents:
        pages = document.pages
        body.append([document.folder.relative_to(out).as_posix() or ".", str(sum(pages.values())),
                     *(str(pages[name]) for name in COUNTS),
                     "yes" if document.assembled else ("-" if not sum(pages.values()) else "NO"),
                     document.held_by or "", _state(document)])
    total = {name: sum(d.pages[name] for d in documents) for name in COUNTS}
    body.append(["all", str(sum(total.values())), *(str(total[name]) for name in COUNTS),
                 str(sum(d.assembled for d in documents)), str(sum(d.held_by is not None for d in documents)),
                 f"{sum(d.complete for d in documents)}/{len(documents)} complete"])
    table = aligned(["document", "pages", *COUNTS, "<name>.md", "held by", "state"], body, left=1)
    complete = all(d.complete for d in documents)
    if complete:
        verdict = f"complete: every page of the {len(documents)} document(s) is done"
    else:
        reasons = [f"{total[name]} {name}" for name in ("failed", "stale", "pending") if total[name]]
        reasons += [f"{n} held by a live converter" for n in [sum(d.held_by is not None for d in documents)] if n]
        reasons += [f"{n} <name>.md not current" for n in [sum(not d.assembled and sum(d.pages.values()) > 0
                                                            for d in documents)] if n]
        reasons += [f"{n} with a problem" for n in [sum(d.problem is not None for d in documents)] if n]
        verdict = "NOT complete: " + ", ".join(reasons) + ": rerun the conversion to finish"
    return f"{table}\n\n{verdict}", complete
