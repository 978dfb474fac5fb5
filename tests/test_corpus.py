"""Many converters, one corpus, nothing lost (issue 36): shards, one writer per document, the
page journal, --status, and the repairs, against the scripted server (fast tier).

Each test names the case of the issue it covers ("case N"): each lost work before the fix.
The same converter against the reader's real server, three shards at once: test_batch.py.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import textwrap
import threading
import time
from pathlib import Path, PurePath

import pytest

import batch_ocr
from ocr_bundle.batch import cli as batch_cli
from helpers import PYTHON, ROOT, wait_for
from ocr_bundle.batch import manifest as manifest_module
from ocr_bundle.batch.locking import DocumentLock, holder_of
from ocr_bundle.batch.identity import take
from helpers import as_input
from ocr_bundle.batch.manifest import JOURNAL, ConversionSettings, DocumentOutput
from ocr_bundle.inputs import InputFile, discover, in_shard, parse_shard
from scripted_server import Reply
from test_batch_faults import convert, manifest, small_pdf, small_png, snapshot

pytestmark = pytest.mark.usefixtures("no_server_environment")


def run_batch(url: str, out: Path, *argv: str) -> subprocess.Popen:
    """batch_ocr.py in a process of its own, as a second user (or machine) would start it."""
    return subprocess.Popen([PYTHON, str(ROOT / "batch_ocr.py"), "--url", url, "--out", str(out), "--quiet",
                             "--max-attempts", "1", "--render-workers", "1", *argv],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "VLLM_API_KEY": ""})


def status(out: Path, *corpus: Path) -> tuple[int, str]:
    done = subprocess.run([PYTHON, str(ROOT / "batch_ocr.py"), "--status", str(out), *map(str, corpus)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    return done.returncode, done.stdout + done.stderr


def every_page_once(out: Path) -> dict[str, int]:
    """{document folder: pages} after checking each page of each is done, with one attempt."""
    counts = {}
    for path in out.rglob("manifest.json"):
        record = json.loads(path.read_text())
        assert not (path.parent / JOURNAL).exists() or not (path.parent / JOURNAL).stat().st_size
        pages = record["pages"]
        assert len(pages) == record["page_count"], path
        assert {r["status"] for r in pages.values()} == {"ok"} and {r["attempts"] for r in pages.values()} == {1}
        counts[path.parent.relative_to(out).as_posix()] = len(pages)
    return counts


# ------------------------------------------------------------------ shards


def test_shards_split_a_corpus_the_same_way_on_every_machine(tmp_path):
    names = [f"box{b}/scan{n:03d}.pdf" for b in range(4) for n in range(30)]
    for name in names:
        (tmp_path / "a" / "corpus" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "a" / "corpus" / name).write_bytes(b"%PDF")
    first = discover([tmp_path / "a" / "corpus"])
    # Another machine: the corpus mounted elsewhere, its folders named in another order.
    (tmp_path / "b").mkdir()
    os.symlink(tmp_path / "a" / "corpus", tmp_path / "b" / "mnt")
    second = discover([tmp_path / "b" / "mnt"])
    shards = [{i.relative for i in first if in_shard(i, k, 3)} for k in (1, 2, 3)]
    assert shards == [{i.relative for i in second if in_shard(i, k, 3)} for k in (1, 2, 3)]
    assert set().union(*shards) == {PurePath(n) for n in names} and sum(map(len, shards)) == len(names)
    assert all(25 <= len(shard) <= 55 for shard in shards)  # about a third each
    assert in_shard(InputFile(Path("/x/a.pdf"), PurePath("a.pdf")), 1, 1)
    for bad in ("0/3", "4/3", "2", "a/b", "1/0"):
        with pytest.raises(ValueError):
            parse_shard(bad)


def test_a_typo_in_shard_is_refused_before_anything_runs(tmp_path, capsys):
    with pytest.raises(SystemExit) as refused:
        batch_ocr.main([str(tmp_path), "--shard", "3/2"])
    assert refused.value.code == 2 and "K must be between 1 and N" in capsys.readouterr().err


def test_two_shards_and_an_overlapping_full_run_on_one_output_tree_convert_each_page_once(server, tmp_path):
    for n in range(6):
        small_pdf(tmp_path / "in" / f"doc{n}.pdf", 3)
    small_png(tmp_path / "in" / "scan.png")
    def together(request):
        """The first answers wait (up to 10 s) for three requests: the runs convert at the same time."""
        end = time.monotonic() + 10
        while server.chat_count() < 3 and time.monotonic() < end:
            time.sleep(0.05)
        return Reply()

    server.responder = together
    out = tmp_path / "out"
    runs = [run_batch(server.url, out, str(tmp_path / "in"), "--shard", "1/2", "--concurrency", "2"),
            run_batch(server.url, out, str(tmp_path / "in"), "--shard", "2/2", "--concurrency", "2"),
            run_batch(server.url, out, str(tmp_path / "in"), "--concurrency", "2")]
    results = [run.communicate(timeout=120) + (run.returncode,) for run in runs]
    print("\n[shards] " + "; ".join(f"run {i + 1}: exit {code}, {err.count('skipped, being converted')} skipped"
                                    for i, (_, err, code) in enumerate(results)))
    # The shards never meet; the full run meets both: whichever comes second to a document skips
    # it (exit 1) and leaves it to the one converting it.
    for _, err, code in results:
        assert "Traceback" not in err and code == (1 if "skipped, being converted by pid" in err else 0), err
    rerun = convert_quietly(server.url, out, tmp_path / "in")
    assert rerun.returncode == 0 and "19 page(s): 19 done before, 0 to convert" in rerun.stderr, rerun.stderr
    assert sum(every_page_once(out).values()) == 19
    assert server.chat_count() == 19  # no page was converted twice
    assert {p.name for p in out.glob("run-summary*.json")} == {
        "run-summary.json", "run-summary.shard-1-of-2.json", "run-summary.shard-2-of-2.json"}
    code, report = status(out, tmp_path / "in")
    assert code == 0 and "complete: every page of the 7 document(s) is done" in report, report


def convert_quietly(url: str, out: Path, *inputs: Path, extra: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    run = run_batch(url, out, *map(str, inputs), *extra)
    stdout, stderr = run.communicate(timeout=120)
    return subprocess.CompletedProcess(run.args, run.returncode, stdout, stderr)


# ------------------------------------------------------------------ case 1: one writer per document


def test_case1_two_runs_on_one_folder_never_lose_each_others_pages(server, tmp_path):
    pdf = small_pdf(tmp_path / "in" / "doc.pdf", 10)
    out = tmp_path / "out"
    release = threading.Event()
    server.responder = lambda request: (release.wait(30), Reply(text=f"text {request.index}"))[1]
    first = run_batch(server.url, out, str(pdf), "--pages", "1-5")
    wait_for(lambda: server.chat_count() >= 1, 60, "the first run's requests")
    second = convert_quietly(server.url, out, pdf, extra=("--pages", "6-10"))
    assert second.returncode == 1 and "skipped, being converted by pid" in second.stderr, second.stderr
    assert f"pid {first.pid} on" in second.stderr
    release.set()
    assert first.wait(60) == 0
    assert sorted(map(int, manifest(out / "doc.pdf")["pages"])) == [1, 2, 3, 4, 5]
    again = convert_quietly(server.url, out, pdf, extra=("--pages", "6-10"))
    assert again.returncode == 0 and "5 to convert" in again.stderr
    assert sorted(map(int, manifest(out / "doc.pdf")["pages"])) == list(range(1, 11))


def test_case1_a_held_folder_keeps_its_temporary_files_and_is_never_waited_for(server, tmp_path, capsys):
    image = small_png(tmp_path / "in" / "page.png")
    folder = tmp_path / "out" / "page.png"
    folder.mkdir(parents=True)
    partial = folder / ".manifest.json.partial-999999-abcd"  # another live writer's file in progress
    partial.write_text("{")
    held = DocumentLock.acquire(folder)
    try:
        assert holder_of(folder) == f"pid {os.getpid()} on {os.uname().nodename}"
        started = time.monotonic()
        run = convert(capsys, server.url, tmp_path / "out", str(image))
        assert run.code == 1 and time.monotonic() - started < 30
        assert "1 held by another converter" in run.err and "FAILED: 1 document(s) skipped" in run.err
        assert partial.exists() and server.chat_count() == 0
        assert run.summary["held"] == [{"source": str(image), "by": holder_of(folder)}]
    finally:
        held.release()
    assert holder_of(folder) is None
    assert convert(capsys, server.url, tmp_path / "out", str(image)).code == 0 and not partial.exists()


# ------------------------------------------------------------------ case 2 and 3: the assembled document


def test_case2_a_pages_rerun_keeps_every_page_of_the_document(server, tmp_path, capsys):
    pdf = small_pdf(tmp_path / "in" / "doc.pdf", 5)
    out = tmp_path / "out"
    server.responder = lambda request: Reply(text=f"first run {request.index}")
    assert convert(capsys, server.url, out, str(pdf)).code == 0
    server.responder = lambda request: Reply(text="page two again")
    assert convert(capsys, server.url, out, str(pdf), "--pages", "2", "--force").code == 0
    document = (out / "doc.pdf" / "doc.md").read_text()
    assert document.count("first run") == 4 and "page two again" in document
    assert document.index("<!-- page 1 -->") < document.index("page two again") < document.index("<!-- page 3 -->")
    assert "5 done before, 0 to convert" in convert(capsys, server.url, out, str(pdf)).err


def test_case3_a_kill_between_the_last_record_and_the_assembly_is_repaired(server, tmp_path, capsys):
    pdf = small_pdf(tmp_path / "in" / "doc.pdf", 4)
    out = tmp_path / "out"
    killed_at_assembly = textwrap.dedent(f"""
        import os, signal, sys
        sys.path.insert(0, {str(ROOT)!r})
        from ocr_bundle.batch.manifest import DocumentOutput
        DocumentOutput.write_document = lambda self: os.kill(os.getpid(), signal.SIGKILL)
        import batch_ocr
        sys.exit(batch_ocr.main(sys.argv[1:]))
    """)
    killed = subprocess.run([PYTHON, "-c", killed_at_assembly, str(pdf), "--url", server.url, "--out", str(out),
                             "--max-attempts", "1", "--quiet"], cwd=ROOT, capture_output=True, text=True, timeout=120,
                            env={**os.environ, "VLLM_API_KEY": ""})
    assert killed.returncode == -signal.SIGKILL
    folder = out / "doc.pdf"
    assert not (folder / "doc.md").exists() and len((folder / JOURNAL).read_text().splitlines()) == 4
    assert server.chat_count() == 4
    rerun = convert(capsys, server.url, out, str(pdf))
    assert rerun.code == 0 and "4 done before, 0 to convert" in rerun.err and server.chat_count() == 4
    assert (folder / "doc.md").read_text().count("Scripted page text.") == 4
    assert len(manifest(folder)["pages"]) == 4 and (folder / JOURNAL).stat().st_size == 0  # compacted

    (folder / "doc.md").write_text("a stale copy\n")
    os.utime(folder / "doc.md", ns=(0, 0))  # older than the manifest: a run that died before assembling
    assert convert(capsys, server.url, out, str(pdf)).code == 0
    assert (folder / "doc.md").read_text().count("Scripted page text.") == 4


# ------------------------------------------------------------------ case 4: better results only


def test_case4_a_worse_conversion_never_replaces_a_clean_page(server, tmp_path, capsys):
    image = small_png(tmp_path / "in" / "page.png")
    out = tmp_path / "out"
    server.responder = lambda request: Reply(text="the clean text")
    assert convert(capsys, server.url, out, str(image)).code == 0
    server.responder = lambda request: Reply(text="cut sho", finish_reason="length")
    changed = convert(capsys, server.url, out, str(image), "--max-tokens", "100")
    assert changed.code == 0 and "(the text converted earlier is kept)" in changed.err
    record = manifest(out / "page.png")["pages"]["1"]
    assert record["status"] == "ok" and record["redo"]["status"] == "flagged"
    assert (out / "page.png" / "pages" / "0001.md").read_text() == "the clean text"
    document = (out / "page.png" / "page.md").read_text()
    assert "the clean text" in document and "converting it again gave a worse result" in document
    # Tried under these settings: done (flagged), until --redo-flagged asks again.
    assert "1 done before, 0 to convert" in convert(capsys, server.url, out, str(image), "--max-tokens", "100").err
    server.responder = lambda request: Reply(text="the new clean text")
    assert convert(capsys, server.url, out, str(image), "--max-tokens", "100", "--redo-flagged").code == 0
    assert (out / "page.png" / "pages" / "0001.md").read_text() == "the new clean text"
    assert "redo" not in manifest(out / "page.png")["pages"]["1"]


# ------------------------------------------------------------------ case 5: a full disk


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT, errno.EROFS])
def test_case5_a_full_disk_stops_the_run_at_once_and_loses_nothing(server, tmp_path, capsys, monkeypatch, code):
    pdf = small_pdf(tmp_path / "in" / "doc.pdf", 30)
    out = tmp_path / "out"
    written = []
    real_write = manifest_module.atomic_write_text

    def filling_up(path, text, durable=False):
        if path.parent.name == "pages" and len(written) >= 5:
            raise OSError(code, os.strerror(code), str(path))
        real_write(path, text, durable)
        written.append(path)

    monkeypatch.setattr(manifest_module, "atomic_write_text", filling_up)
    run = convert(capsys, server.url, out, str(pdf), "--concurrency", "2")
    assert run.code == 1 and f"FAILED: disk full ({os.strerror(code)}" in run.err
    assert "free space and rerun" in run.err and run.summary["ended"] == "disk full"
    # Converted and thrown away: only the pages in flight when the disk filled (2 senders, a few prepared).
    assert server.chat_count() - len(written) <= 2 + 2
    monkeypatch.undo()
    rerun = convert(capsys, server.url, out, str(pdf))
    assert rerun.code == 0 and f"{len(written)} done before, {30 - len(written)} to convert" in rerun.err


def test_case5_a_disk_full_of_the_summary_too_still_says_what_happened(server, tmp_path, capsys, monkeypatch):
    image = small_png(tmp_path / "in" / "page.png")

    def full(path, value, durable=False):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(batch_cli, "atomic_write_json", full)
    monkeypatch.setattr(batch_cli, "check_writable", lambda out: None)
    run = convert(capsys, server.url, tmp_path / "out", str(image))
    assert run.code == 0 and "summary not written (No space left on device)" in run.err and "pages: 1 converted" in run.err


# ------------------------------------------------------------------ case 6: a gateway with nobody behind it


def test_case6_503_from_a_gateway_is_waited_out_as_a_server_away(server, tmp_path, capsys):
    pdf = small_pdf(tmp_path / "in" / "doc.pdf", 4)
    back_at = time.monotonic() + 3
    server.responder = lambda request: (Reply(status=503, error="no healthy worker") if time.monotonic() < back_at
                                        else Reply())
    run = convert(capsys, server.url, tmp_path / "out", str(pdf), "--server-wait", "30")
    assert run.code == 0, run.err
    assert "answers 503" in run.out and "no server is ready" in run.out and "answers again" in run.out
    assert {r["status"] for r in manifest(tmp_path / "out" / "doc.pdf")["pages"].values()} == {"ok"}


def test_case6_a_gateway_answering_503_past_server_wait_ends_the_run_with_everything_pending(server, tmp_path, capsys):
    server.responder = lambda request: Reply(status=502, error="bad gateway")
    run = convert(capsys, server.url, tmp_path / "out", str(small_pdf(tmp_path / "in" / "doc.pdf", 3)),
                  "--server-wait", "2")
    assert run.code == 1 and "the server answered 502 (no server ready) for 2 s" in run.err
    assert run.summary["pages"]["pending"] == 3 and run.summary["pages"]["failed"] == 0


# ------------------------------------------------------------------ case 7: the journal


SETTINGS = ConversionSettings("m", 100, 200, 1540, "PNG")


def locked_document(tmp_path: Path, pages: int) -> tuple[DocumentOutput, Path, Path]:
    """A document of `pages` pages opened as a converter opens it, holding its folder; (output, source, folder)."""
    source = tmp_path / "doc.pdf"
    source.write_bytes(b"%PDF-1.7")
    folder = tmp_path / "out"
    output, _ = DocumentOutput.open(folder, as_input(source), take(source), SETTINGS, DocumentLock.acquire(folder))
    output.describe("pdf", pages)
    return output, source, folder


def test_case7_a_page_costs_a_journal_line_not_a_manifest(tmp_path, monkeypatch):
    output, _, folder = locked_document(tmp_path, 200)
    saves = []
    monkeypatch.setattr(manifest_module, "atomic_write_json", lambda *a, **k: saves.append(a[0]))
    for page in range(1, 201):
        output.record_page(page, {"status": "ok"}, f"page {page}")
    assert saves == [] and len((folder / JOURNAL).read_text().splitlines()) == 200
    monkeypatch.undo()
    output.close()
    assert len(manifest(folder)["pages"]) == 200 and (folder / JOURNAL).stat().st_size == 0


def test_case7_a_torn_journal_line_costs_that_page_only(tmp_path):
    output, source, folder = locked_document(tmp_path, 3)
    output.record_page(1, {"status": "ok"}, "one")
    output.record_page(2, {"status": "ok"}, "two")
    output.close_without_writing()  # killed: the manifest never compacted
    with open(folder / JOURNAL, "ab") as journal:
        journal.write(b'{"page": "3", "record": {"sta')  # the kill came mid-line
    again, _ = DocumentOutput.open(folder, as_input(source), take(source), SETTINGS, DocumentLock.acquire(folder))
    assert again.done_pages() == {1, 2} and (folder / JOURNAL).stat().st_size == 0
    assert sorted(manifest(folder)["pages"]) == ["1", "2"]


def test_case7_a_rerun_with_nothing_to_do_writes_nothing_and_hashes_nothing(server, tmp_path, capsys, monkeypatch):
    for n in range(3):
        small_pdf(tmp_path / "in" / f"doc{n}.pdf", 2)
    out = tmp_path / "out"
    assert convert(capsys, server.url, out, str(tmp_path / "in")).code == 0

    def stamps() -> dict[str, int]:
        return {p.relative_to(out).as_posix(): p.stat().st_mtime_ns for p in out.rglob("*")
                if p.is_file() and not p.name.startswith("run-summary") and p.name != ".lock"}

    before, files = stamps(), snapshot(out)
    import ocr_bundle.batch.identity

    hashed = []
    monkeypatch.setattr(ocr_bundle.batch.identity, "file_sha256", lambda path: hashed.append(path) or "x")
    again = convert(capsys, server.url, out, str(tmp_path / "in"))
    assert again.code == 0 and "6 done before, 0 to convert" in again.err
    assert hashed == [] and stamps() == before
    assert {k: v for k, v in snapshot(out).items() if not k.startswith("run-summary")} == {
        k: v for k, v in files.items() if not k.startswith("run-summary")}
    os.utime(tmp_path / "in" / "doc1.pdf")  # touched, not changed: read again, found the same
    monkeypatch.undo()
    assert "6 done before, 0 to convert" in convert(capsys, server.url, out, str(tmp_path / "in")).err


# ------------------------------------------------------------------ --status


def test_status_says_what_is_left_and_exits_0_only_when_every_page_is_done(server, tmp_path, capsys):
    pdf = small_pdf(tmp_path / "in" / "doc.pdf", 3)
    small_png(tmp_path / "in" / "scan.png")
    out = tmp_path / "out"
    assert convert(capsys, server.url, out, str(tmp_path / "in"), "--pages", "1-2").code == 0
    code, report = status(out)
    assert code == 1 and "1 pending" in report, report
    assert "doc.pdf" in report and "scan.png" in report

    server.responder = lambda request: Reply(status=400, error="refused")
    assert convert(capsys, server.url, out, str(tmp_path / "in")).code == 1
    code, report = status(out)
    assert code == 1 and "1 failed" in report

    server.responder = lambda request: Reply()
    assert convert(capsys, server.url, out, str(tmp_path / "in")).code == 0
    code, report = status(out)
    assert code == 0 and "complete: every page of the 2 document(s) is done" in report and "2/2 complete" in report

    held = DocumentLock.acquire(out / "scan.png")
    try:
        code, report = status(out)
        assert code == 1 and f"pid {os.getpid()}" in report and "1 held by a live converter" in report
    finally:
        held.release()

    (out / "doc.pdf" / "doc.md").unlink()
    code, report = status(out)
    assert code == 1 and "1 <name>.md not current" in report

    pdf.write_bytes(pdf.read_bytes() + b"\n% changed\n")
    code, report = status(out)
    assert code == 1 and "its input changed since it was converted" in report

    assert batch_ocr.main(["--status", str(tmp_path / "nowhere")]) == 2


def test_status_with_the_corpus_names_the_files_no_run_has_started(server, tmp_path, capsys):
    for n in range(4):
        small_png(tmp_path / "in" / f"scan{n}.png")
    out = tmp_path / "out"
    shards = [run for run in (1, 2) if convert(capsys, server.url, out, str(tmp_path / "in"), "--shard", f"{run}/2").code == 0]
    assert shards == [1, 2]
    code, report = status(out, tmp_path / "in")
    assert code == 0 and "complete: every page of the 4 document(s) is done" in report, report
    small_png(tmp_path / "in" / "late.png")  # added to the corpus since: in no output yet
    code, report = status(out, tmp_path / "in")
    assert code == 1 and "late.png" in report and "not started: no run has converted it yet" in report
    assert status(out)[0] == 0  # without the corpus, --status knows only what was started


def test_a_corpus_of_more_files_than_the_open_file_limit_converts(server, tmp_path):
    """Folders are held while the scan reads them and while the run converts them, never all at
    once: 300 documents under a limit of 200 open files (a held folder is one open file)."""
    import resource

    for n in range(300):
        small_png(tmp_path / "in" / f"scan{n:03d}.png", (40, 30))
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    run = subprocess.run([PYTHON, str(ROOT / "batch_ocr.py"), str(tmp_path / "in"), "--url", server.url, "--out",
                          str(tmp_path / "out"), "--quiet", "--max-attempts", "1", "--render-workers", "1",
                          "--concurrency", "8"], cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "VLLM_API_KEY": ""},
                         preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (200, hard)))
    assert run.returncode == 0, run.stderr[-2000:]
    assert "300 file(s), 300 page(s): 0 done before, 300 to convert" in run.stderr and server.chat_count() == 300
    assert status(tmp_path / "out", tmp_path / "in")[0] == 0
