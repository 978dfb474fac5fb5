"""One identity for a document (ocr_bundle/batch/identity.py), in real trees (issue 44), against the scripted
server (fast tier). Each test names the case of the issue it covers ("case N"); each failed before the fix:
a file replaced or removed after the scan, links, a corpus mounted at two paths, the output folder inside
the input, a name of 240 bytes, a Ctrl-C on a corpus not yet started.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import time
from pathlib import Path

import pytest

from ocr_bundle.batch import identity
from ocr_bundle.inputs import discover
from scripted_server import Reply
from test_batch_faults import convert, small_pdf, small_png
from test_corpus import run_batch, status

pytestmark = pytest.mark.usefixtures("no_server_environment")


def md_pages(path: Path) -> int:
    return path.read_text().count("<!-- page ") if path.exists() else 0


def mtimes(tree: Path) -> dict[str, int]:
    return {str(p.relative_to(tree)): p.stat().st_mtime_ns for p in tree.rglob("*") if p.is_file()}


# ------------------------------------------------------------------ the rule itself, exact


def test_a_snapshot_is_the_stat_and_the_hash_together_and_a_known_one_is_not_hashed_again(tmp_path, monkeypatch):
    path = tmp_path / "a.png"
    path.write_bytes(b"one")
    first = identity.take(path)
    assert first.sha256 == identity.file_sha256(path) and first.size == 3
    hashed = []
    monkeypatch.setattr(identity, "file_sha256", lambda p: hashed.append(p) or "new")
    assert identity.take(path, known=first) is first and hashed == []  # same size and mtime: no read
    os.utime(path, ns=(first.mtime_ns + 10**9, first.mtime_ns + 10**9))
    assert identity.take(path, known=first).sha256 == "new" and hashed == [path]


def test_a_file_that_changes_while_it_is_read_is_read_again_then_refused(tmp_path, monkeypatch):
    path = tmp_path / "a.png"
    path.write_bytes(b"one")
    reads = []

    def growing(p):
        reads.append(p)
        with open(p, "ab") as handle:
            handle.write(b"+")  # written to while being hashed
        return "sha"

    monkeypatch.setattr(identity, "file_sha256", growing)
    with pytest.raises(identity.FileChanging, match="changed each time it was read"):
        identity.take(path)
    assert len(reads) == identity.READ_TRIES


# ------------------------------------------------------------------ case 1: replaced after the scan


def test_case1_a_file_replaced_after_the_scan_is_converted_as_it_is_now(server, tmp_path):
    corpus, out = tmp_path / "in", tmp_path / "out"
    small_pdf(corpus / "a.pdf", 8)  # long enough that the run is still on it when b.pdf is replaced
    small_pdf(corpus / "b.pdf", 3)
    replacement = small_pdf(tmp_path / "b-new.pdf", 5)
    gate = threading.Event()
    server.responder = lambda request: gate.wait(timeout=30) and Reply()  # held until b.pdf is replaced
    run = run_batch(server.url, out, str(corpus), "--concurrency", "1")
    wait_for_requests(server, 1)
    shutil.copyfile(replacement, corpus / "b.pdf")  # after the scan counted 3 pages, before the run claims it
    gate.set()
    out_text, err = run.communicate(timeout=120)
    assert run.returncode == 0, err
    assert "b.pdf: changed since it was read at the start: converted as it is now" in out_text + err
    assert md_pages(out / "b.pdf" / "b.md") == 5 and server.chat_count() == 13
    rerun = run_batch(server.url, out, str(corpus))
    assert "13 page(s): 13 done before, 0 to convert" in rerun.communicate(timeout=60)[1]
    code, report = status(out, corpus)
    assert code == 0 and "complete: every page of the 2 document(s) is done" in report


def wait_for_requests(server, count: int) -> None:
    end = time.monotonic() + 60
    while server.chat_count() < count:
        assert time.monotonic() < end, "no request reached the server"
        time.sleep(0.05)


# ------------------------------------------------------------------ case 2: removed after the scan


def test_case2_a_file_removed_mid_run_is_that_documents_error_and_the_run_goes_on(server, tmp_path):
    corpus, out = tmp_path / "in", tmp_path / "out"
    small_pdf(corpus / "a.pdf", 8)
    small_pdf(corpus / "b.pdf", 2)
    small_pdf(corpus / "c.pdf", 2)
    gate = threading.Event()
    server.responder = lambda request: gate.wait(timeout=30) and Reply()
    run = run_batch(server.url, out, str(corpus), "--concurrency", "1")
    wait_for_requests(server, 1)
    (corpus / "b.pdf").unlink()
    gate.set()
    out_text, err = run.communicate(timeout=120)
    assert run.returncode == 1 and "Traceback" not in err, err
    assert "b.pdf: since the start of the run: The file cannot be read: No such file or directory" in out_text + err
    assert "unreadable: " in err and "summary:" in err  # the run's summary, b.pdf listed in it
    assert md_pages(out / "a.pdf" / "a.md") == 8 and md_pages(out / "c.pdf" / "c.md") == 2  # the others converted


# ------------------------------------------------------------------ case 3: links


def test_case3_two_links_to_one_file_are_two_documents_named_after_their_links(server, tmp_path, capsys):
    corpus, store, out = tmp_path / "corpus", tmp_path / "store", tmp_path / "out"
    small_png(store / "SHA256E-s1234--ab12.png")
    corpus.mkdir()
    for name in ("invoice-2023.png", "invoice-copy.png"):
        (corpus / name).symlink_to(Path("..") / "store" / "SHA256E-s1234--ab12.png")
    run = convert(capsys, server.url, out, str(corpus))
    assert run.code == 0, run.err
    assert (out / "invoice-2023.png" / "invoice-2023.md").exists() and (out / "invoice-copy.png" / "invoice-copy.md").exists()
    assert not list(out.rglob("SHA256E*"))
    code, report = status(out, corpus)
    assert code == 0 and "2 document(s)" in report
    shutil.rmtree(out / "invoice-copy.png")
    code, report = status(out, corpus)
    assert code == 1 and "invoice-copy.png" in report and "not started" in report


def test_case3_linked_folders_are_followed_once_and_a_loop_ends(server, tmp_path, capsys):
    corpus, elsewhere, out = tmp_path / "corpus", tmp_path / "elsewhere", tmp_path / "out"
    small_png(corpus / "top.png")
    small_png(elsewhere / "deep" / "linked.png")
    (corpus / "more").symlink_to(elsewhere)
    (corpus / "self").symlink_to(Path("."))  # a loop
    (elsewhere / "back").symlink_to(corpus)  # a loop through the link
    notes: list[str] = []
    found = discover([corpus], notes=notes)
    assert sorted(item.relative.as_posix() for item in found) == ["more/deep/linked.png", "top.png"]
    assert any("a link to a folder" in note and "followed" in note for note in notes)
    assert sum("a loop" in note for note in notes) == 2
    found = discover([str(corpus / "**" / "*.png")])  # a pattern over the same tree ends too
    assert sorted(item.relative.as_posix() for item in found) == ["more/deep/linked.png", "top.png"]
    run = convert(capsys, server.url, out, str(corpus))
    assert run.code == 0 and "a link back to a folder above it (a loop): not followed" in run.err
    assert (out / "more" / "deep" / "linked.png" / "linked.md").exists()


# ------------------------------------------------------------------ case 4: another mount point


def test_case4_a_corpus_read_at_another_path_is_the_same_corpus(server, tmp_path, capsys, monkeypatch):
    disk, out = tmp_path / "disk" / "corpus", tmp_path / "out"
    small_pdf(disk / "box" / "a.pdf", 2)
    small_png(disk / "b.png")
    (tmp_path / "mntA").mkdir()
    (tmp_path / "mntB").mkdir()
    (tmp_path / "mntA" / "corpus").symlink_to(disk)  # two machines' mount points of one share
    (tmp_path / "mntB" / "corpus").symlink_to(disk)
    first = convert(capsys, server.url, out, str(tmp_path / "mntB" / "corpus"))
    assert first.code == 0, first.err
    code, report = status(out, tmp_path / "mntA" / "corpus")
    assert code == 0 and "complete: every page of the 2 document(s) is done" in report, report
    before = mtimes(out)
    hashed = []
    real_sha = identity.file_sha256
    monkeypatch.setattr(identity, "file_sha256", lambda path: hashed.append(path) or real_sha(path))
    again = convert(capsys, server.url, out, str(tmp_path / "mntA" / "corpus"))
    assert again.code == 0 and "3 page(s): 3 done before, 0 to convert" in again.err
    assert hashed == [] and server.chat_count() == 3
    changed = {name for name, mtime in mtimes(out).items() if before.get(name) != mtime}
    assert changed == {"run-summary.json"}, changed  # no manifest, journal or .md rewritten


# ------------------------------------------------------------------ case 5: the output inside the input


def test_case5_the_output_folder_inside_the_input_is_never_an_input(server, tmp_path, capsys, monkeypatch):
    corpus = tmp_path / "corpus"
    small_png(corpus / "scan.png")
    monkeypatch.chdir(corpus)
    for _ in range(2):
        run = convert(capsys, server.url, corpus / "ocr-out", ".")
        assert run.code == 0, run.err
        assert "1 file(s), 1 page(s)" in run.err
    assert "skipped (the output folder)" in run.err
    assert not (corpus / "ocr-out" / "ocr-out").exists()
    # Output copied elsewhere into the corpus is converted output too (its bundle manifest says so).
    shutil.copytree(corpus / "ocr-out", corpus / "archive")
    run = convert(capsys, server.url, tmp_path / "out2", str(corpus))
    assert run.code == 0 and "1 file(s), 1 page(s)" in run.err and "converted output" in run.err


# ------------------------------------------------------------------ case 6: a name of 240 bytes


def test_case6_a_name_of_240_bytes_converts_and_its_status_is_complete(server, tmp_path, capsys):
    name = "報" * 80 + ".png"  # 244 bytes in UTF-8
    assert len(name.encode()) == 244
    corpus, out = tmp_path / "corpus", tmp_path / "out"
    small_png(corpus / name)
    run = convert(capsys, server.url, out, str(corpus))
    assert run.code == 0, run.err
    assert (out / name / ("報" * 80 + ".md")).exists()
    code, report = status(out, corpus)
    assert code == 0, report


# ------------------------------------------------------------------ case 8: a stop costs nothing per document


def test_case8_ctrl_c_writes_nothing_for_documents_not_started(server, tmp_path):
    corpus, out = tmp_path / "corpus", tmp_path / "out"
    for n in range(300):
        small_png(corpus / f"p{n:03d}.png", size=(40, 30))
    gate = threading.Event()
    server.responder = lambda request: gate.wait(timeout=30) and Reply()
    run = run_batch(server.url, out, str(corpus), "--concurrency", "2")
    wait_for_requests(server, 2)
    run.send_signal(signal.SIGINT)
    started = time.monotonic()
    gate.set()
    _, err = run.communicate(timeout=60)
    stopped_s = time.monotonic() - started
    assert run.returncode == 130, err
    assembled = list(out.rglob("p*.md"))
    # The documents whose pages were in flight or prepared (2 senders + 2 prepared ahead, and the one the
    # producer was claiming), not 300 placeholders.
    assert len(assembled) <= 6, len(assembled)
    print(f"\n[stop] Ctrl-C on 300 documents: stopped in {stopped_s:.2f} s, {len(assembled)} <name>.md written")
    assert stopped_s < 10
    manifests = [json.loads(p.read_text()) for p in out.rglob("manifest.json")]
    assert all(m.get("relative") for m in manifests)


def test_after_the_scan_a_document_holds_its_shape_not_its_pages(server, tmp_path, capsys):
    """issue 44, case 8: every document kept its whole record in memory (~1.4 KB a page) for the whole run;
    the run reads it again when it claims the document."""
    from ocr_bundle.batch.manifest import ConversionSettings
    from ocr_bundle.batch.options import BatchOptions
    from ocr_bundle.batch.render_pool import RenderPool
    from ocr_bundle.batch.scan import scan

    corpus, out = tmp_path / "corpus", tmp_path / "out"
    small_pdf(corpus / "a.pdf", 6)
    assert convert(capsys, server.url, out, str(corpus)).code == 0
    settings = ConversionSettings("scripted-ocr", 4096, 200, 1540, "PNG")
    with RenderPool(1) as pool:
        (document,) = scan(discover([corpus]), out, settings, BatchOptions(), pool)
    assert document.todo == [] and document.pages == [1, 2, 3, 4, 5, 6]
    assert document.output.manifest["pages"] == {} and document.output.manifest["page_count"] == 6


def test_case1_a_file_replaced_while_its_pages_render_is_not_mixed_into_its_record(server, tmp_path):
    """Replaced after the run claimed it: the pages not yet rendered fail with the reason (not rendered from
    the new file under the old one's record); the rerun converts the file as it is now, every page."""
    corpus, out = tmp_path / "in", tmp_path / "out"
    small_pdf(corpus / "b.pdf", 12)
    replacement = small_pdf(tmp_path / "b-new.pdf", 12)
    gate = threading.Event()
    server.responder = lambda request: gate.wait(timeout=30) and Reply()
    run = run_batch(server.url, out, str(corpus), "--concurrency", "1")
    wait_for_requests(server, 1)  # the first page is at the server, two more prepared: the rest wait
    shutil.copyfile(replacement, corpus / "b.pdf")
    os.utime(corpus / "b.pdf", ns=(time.time_ns(), time.time_ns()))
    gate.set()
    out_text, err = run.communicate(timeout=120)
    assert run.returncode == 1, err
    assert "The file changed since the run read it: rerun to convert it as it is now." in out_text + err
    rerun = run_batch(server.url, out, str(corpus))
    out_text, err = rerun.communicate(timeout=120)
    assert rerun.returncode == 0, err
    code, report = status(out, corpus)
    assert code == 0 and md_pages(out / "b.pdf" / "b.md") == 12, report
