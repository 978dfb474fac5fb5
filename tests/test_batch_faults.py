"""The batch converter under faults that a real server cannot be made to show on demand.

A scripted OpenAI-compatible server (scripted_server.py) answers each request as the test
says; render workers die on a chosen page (render_faults.py). No vLLM here: this is the
fast tier. The same code paths run against the real CPU server in test_batch.py.

Each test names the case of issue 23 it covers ("case N"): each failed before the fix."""

from __future__ import annotations

import base64
import functools
import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from PIL import Image

import batch_ocr
from ocr_bundle.batch import cli as batch_cli
from helpers import PYTHON, ROOT, wait_for
from ocr_bundle.batch.options import BatchOptions
from ocr_bundle.batch.pipeline import BatchConverter
from ocr_bundle.batch.scan import scan
from ocr_bundle.client import OcrClient
from ocr_bundle.inputs import discover
from ocr_bundle.batch.manifest import ConversionSettings
from ocr_bundle.batch.render_pool import PageJob, RenderPool
from render_faults import marked_work
from scripted_server import MODEL, Reply, ScriptedServer

sys.path.insert(0, str(ROOT / "scripts"))
from make_pdf import image_pdf, jpeg_of  # noqa: E402


pytestmark = pytest.mark.usefixtures("no_server_environment")


@dataclass
class Run:
    code: int
    out: str
    err: str
    out_folder: Path

    @property
    def summary(self) -> dict:
        return json.loads((self.out_folder / "run-summary.json").read_text())


def convert(capsys, url: str, out: Path, *argv: str) -> Run:
    """batch_ocr.py's main, in this process (a spawned render pool all the same)."""
    capsys.readouterr()
    code = batch_ocr.main(["--url", url, "--out", str(out), "--quiet", "--render-workers", "2", "--concurrency", "4",
                           "--max-attempts", "1", *argv])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err + captured.out
    return Run(code, captured.out, captured.err, out)


def small_pdf(path: Path, pages: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(image_pdf(pages, jpeg_of(Image.new("RGB", (120, 160), "white")), (72, 96)))
    return path


def small_png(path: Path, size=(120, 90)) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, "white").save(path)
    return path


def manifest(folder: Path) -> dict:
    return json.loads((folder / "manifest.json").read_text())


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under `folder`, by relative path (not the lock file: it names its last holder)."""
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != ".lock"}


def sent_size(request) -> tuple[int, int]:
    """The size of the image a chat request carried."""
    return Image.open(io.BytesIO(base64.b64decode(request.image_url.split(",", 1)[1]))).size


# ------------------------------------------------------------------ case 1: settings and --model


def test_case1_a_model_typo_is_refused_before_anything_is_written(server, tmp_path, capsys):
    small_pdf(tmp_path / "in" / "doc.pdf", 3)
    out = tmp_path / "out"
    assert convert(capsys, server.url, out, str(tmp_path / "in")).code == 0
    before = snapshot(out)

    typo = convert(capsys, server.url, out, str(tmp_path / "in"), "--model", "scripted-ocr-typo")
    assert typo.code == 2
    assert f"does not serve the model 'scripted-ocr-typo'; it serves '{MODEL}'" in typo.err
    assert snapshot(out) == before  # not one byte changed, not even run-summary.json
    assert server.chat_count() == 3


def test_case1_a_settings_change_keeps_the_earlier_pages_until_they_are_converted_again(server, tmp_path, capsys):
    small_pdf(tmp_path / "in" / "doc.pdf", 3)
    out = tmp_path / "out"
    server.responder = lambda request: Reply(text=f"at dpi 200: {request.index}")
    assert convert(capsys, server.url, out, str(tmp_path / "in")).code == 0
    document = out / "doc.pdf" / "doc.md"
    assert document.read_text().count("at dpi 200") == 3

    # --dpi 300 against a server that refuses every page (a 400): nothing better was made.
    server.responder = lambda request: Reply(status=400, error="scripted refusal")
    changed = convert(capsys, server.url, out, str(tmp_path / "in"), "--dpi", "300")
    assert changed.code == 1
    assert "3 page(s) converted earlier with other settings (dpi 200): kept until converted again" in changed.err
    assert changed.summary["pages"]["failed"] == 3
    text = document.read_text()
    assert text.count("at dpi 200") == 3 and text.count("converted with other settings (dpi 200)") == 3
    assert all(record["redo"]["status"] == "failed" and "scripted refusal" in record["redo"]["why"]
               and record["status"] == "ok" for record in manifest(out / "doc.pdf")["pages"].values())

    # Back at the earlier settings: everything is still done.
    back = convert(capsys, server.url, out, str(tmp_path / "in"))
    assert back.code == 0 and "3 page(s): 3 done before, 0 to convert" in back.err

    # At the new settings, each page is replaced as it is converted.
    server.responder = lambda request: Reply(text="at dpi 300")
    new = convert(capsys, server.url, out, str(tmp_path / "in"), "--dpi", "300")
    assert new.code == 0 and "0 done before, 3 to convert" in new.err
    assert document.read_text().count("at dpi 300") == 3 and "dpi 200" not in document.read_text()


def test_case1_ctrl_c_right_after_a_settings_change_loses_nothing(server, tmp_path, capsys):
    small_pdf(tmp_path / "in" / "doc.pdf", 4)
    out = tmp_path / "out"
    assert convert(capsys, server.url, out, str(tmp_path / "in")).code == 0
    document = (out / "doc.pdf" / "doc.md").read_text()

    server.responder = lambda request: Reply(action="stall")
    run = subprocess.Popen([PYTHON, str(ROOT / "batch_ocr.py"), str(tmp_path / "in"), "--url", server.url, "--out",
                            str(out), "--dpi", "300", "--max-attempts", "1", "--concurrency", "2",
                            "--drain-timeout", "1", "--quiet"], cwd=ROOT, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, env={**os.environ, "VLLM_API_KEY": ""})
    wait_for(lambda: server.chat_count() >= 6, 60, "the rerun's first requests")
    run.send_signal(signal.SIGINT)
    _, err = run.communicate(timeout=60)
    assert run.returncode == 130, err
    # Converted nothing: every page's earlier text is still there, marked as made under the other settings.
    kept = (out / "doc.pdf" / "doc.md").read_text()
    assert kept.count("Scripted page text.") == document.count("Scripted page text.") == 4
    assert kept.count("converted with other settings (dpi 200)") == 4
    server.responder = lambda request: Reply()
    assert "4 done before, 0 to convert" in convert(capsys, server.url, out, str(tmp_path / "in")).err


# ------------------------------------------------------------------ case 2: unreadable on a rerun


def test_case2_a_file_unreadable_on_a_rerun_keeps_its_finished_work(server, tmp_path, capsys, monkeypatch):
    pdf = small_pdf(tmp_path / "in" / "doc.pdf", 3)
    out = tmp_path / "out"
    assert convert(capsys, server.url, out, str(pdf)).code == 0
    before = snapshot(out / "doc.pdf")

    limit = pdf.stat().st_size / 2e6  # half the file's size, in MB
    smaller = convert(capsys, server.url, out, str(pdf), "--max-file-mb", f"{limit:.6f}")
    assert smaller.code == 1
    assert f"the limit is {limit:.3g} MB" in smaller.err and "limit is 0 MB" not in smaller.err
    assert snapshot(out / "doc.pdf") == before

    # A read error of the moment (a network share that dropped; as root, permissions cannot
    # be made to refuse, so the hash reads through a stand-in that does).
    import ocr_bundle.batch.identity

    def refuse(path):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(ocr_bundle.batch.identity, "file_sha256", refuse)
    os.utime(pdf)  # rewritten on the share since: it has to be read again
    refused = convert(capsys, server.url, out, str(pdf))
    assert refused.code == 1 and "The file cannot be read: Permission denied." in refused.err
    assert snapshot(out / "doc.pdf") == before
    monkeypatch.undo()
    assert "3 done before, 0 to convert" in convert(capsys, server.url, out, str(pdf)).err


def test_the_size_limit_counts_megabytes_of_a_million_bytes(server, tmp_path, capsys):
    image = small_png(tmp_path / "in" / "a.png", (400, 400))
    assert BatchOptions().max_bytes == 1024 * 10**6  # the flag's default, in the flag's unit
    run = convert(capsys, server.url, tmp_path / "out", str(image), "--max-file-mb", "0.001")
    assert run.code == 1 and f"The file is {image.stat().st_size / 1e6:.3g} MB; the limit is 0.001 MB" in run.err


# ------------------------------------------------------------------ case 3: multi-page TIFFs


def test_case3_a_multi_page_tiff_is_a_document_of_pages(server, tmp_path, capsys):
    frames = [Image.new("L", (100 + 10 * n, 200), 255) for n in range(4)]
    tiff = tmp_path / "in" / "fax.tif"
    tiff.parent.mkdir()
    frames[0].save(tiff, save_all=True, append_images=frames[1:])
    out = tmp_path / "out"
    run = convert(capsys, server.url, out, str(tiff), "--pages", "2-3")
    assert run.code == 0, run.err
    record = manifest(out / "fax.tif")
    assert record["kind"] == "tiff" and record["page_count"] == 4 and sorted(record["pages"]) == ["2", "3"]
    assert sorted(sent_size(r) for r in server.requests) == [(110, 200), (120, 200)]  # frames 2 and 3
    document = (out / "fax.tif" / "fax.md").read_text()
    assert document.index("<!-- page 2 -->") < document.index("<!-- page 3 -->")
    everything = convert(capsys, server.url, out, str(tiff))
    assert everything.code == 0 and "4 page(s): 2 done before, 2 to convert" in everything.err


# ------------------------------------------------------------------ case 4: renderer crashes


def crashing_pool(monkeypatch, **kwargs):
    monkeypatch.setattr(batch_cli, "RenderPool", functools.partial(RenderPool, work=marked_work, **kwargs))


def test_case4_a_page_that_kills_its_renderer_fails_alone(server, tmp_path, capsys, monkeypatch):
    """41 pages, one of which kills whatever worker prepares it: only that page fails."""
    crashing_pool(monkeypatch)
    inputs = tmp_path / "in"
    small_pdf(inputs / "crash-p5.pdf", 12)
    small_pdf(inputs / "other.pdf", 20)
    for n in range(9):
        small_png(inputs / f"scan{n}.png")
    out = tmp_path / "out"
    run = convert(capsys, server.url, out, str(inputs), "--render-workers", "3", "--concurrency", "8")
    assert run.code == 1
    summary = run.summary
    assert summary["pages"] == {"in_scope": 41, "skipped": 0, "to_convert": 41, "ok": 40, "flagged": 0, "failed": 1,
                                "pending": 0}
    assert summary["ended"] == "complete" and summary["render_crashes"] == 2 and summary["faults"] == []
    [failed] = summary["failed_pages"]
    assert failed["page"] == 5 and failed["source"].endswith("crash-p5.pdf")
    assert "renderer crashed on this page, twice" in failed["error"]
    assert server.chat_count() == 40  # every other page was sent, once


def test_case4_a_file_that_kills_the_page_counter_fails_that_file_only(server, tmp_path, capsys, monkeypatch):
    crashing_pool(monkeypatch)
    inputs = tmp_path / "in"
    small_pdf(inputs / "crash-count.pdf", 3)
    small_pdf(inputs / "good.pdf", 3)
    run = convert(capsys, server.url, tmp_path / "out", str(inputs))
    assert run.code == 1
    assert run.summary["unreadable"][0]["source"].endswith("crash-count.pdf")
    assert "renderer crashed on this file" in run.summary["unreadable"][0]["error"]
    assert run.summary["pages"]["ok"] == 3


def test_the_render_pool_gives_up_on_a_stuck_page_and_closes_at_once(tmp_path):
    pdf = small_pdf(tmp_path / "stall-p2.pdf", 3)
    job = functools.partial(PageJob, str(pdf), kind="pdf", encoding="PNG", dpi=72, longest_edge=1540,
                            max_bytes=10**9)
    with RenderPool(2, work=marked_work, job_timeout_s=2) as pool:
        stuck, fine = pool.submit(job(page=2)), pool.submit(job(page=3))
        assert pool.result(fine).data_url
        assert "took longer than 2 s" in pool.result(stuck).error
    pool = RenderPool(1, work=marked_work)  # no timeout to speak of: close() must still return
    stuck = pool.submit(job(page=2))
    time.sleep(1.0)
    started = time.monotonic()
    pool.close()
    assert time.monotonic() - started < 10
    assert pool.result(stuck).error and pool.result(pool.submit(job(page=1))).error == "Not prepared: the run is stopping."


# ------------------------------------------------------------------ case 5: pending pages


def test_case5_pages_left_pending_by_a_failing_producer_make_exit_1(server, tmp_path, capsys, monkeypatch):
    import ocr_bundle.batch.pipeline

    def page_job(path, page, *args):
        if page == 3:
            raise RuntimeError("scripted bug")
        return PageJob(path, page, *args)

    monkeypatch.setattr(ocr_bundle.batch.pipeline, "PageJob", page_job)
    small_pdf(tmp_path / "in" / "doc.pdf", 6)
    run = convert(capsys, server.url, tmp_path / "out", str(tmp_path / "in"))
    assert run.code == 1
    assert "FAILED: 4 page(s) still pending (preparing pages stopped (RuntimeError: scripted bug)" in run.err
    assert run.summary["pages"]["pending"] == 4 and [p["page"] for p in run.summary["pending_pages"]] == [3, 4, 5, 6]


# ------------------------------------------------------------------ case 6: a deleted page file


def test_case6_a_done_page_whose_file_was_deleted_is_converted_again(server, tmp_path, capsys):
    small_pdf(tmp_path / "in" / "doc.pdf", 3)
    out = tmp_path / "out"
    assert convert(capsys, server.url, out, str(tmp_path / "in")).code == 0
    (out / "doc.pdf" / "pages" / "0002.md").unlink()
    again = convert(capsys, server.url, out, str(tmp_path / "in"))
    assert again.code == 0 and "2 done before, 1 to convert" in again.err
    assert (out / "doc.pdf" / "pages" / "0002.md").exists() and server.chat_count() == 4


# ------------------------------------------------------------------ case 7: output folder names


def test_case7_output_folders_do_not_move_when_inputs_are_added(server, tmp_path, capsys):
    inputs = tmp_path / "in"
    small_pdf(inputs / "doc.pdf", 3)
    out = tmp_path / "out"
    assert convert(capsys, server.url, out, str(inputs)).code == 0
    small_png(inputs / "doc.png")
    again = convert(capsys, server.url, out, str(inputs))
    assert again.code == 0 and "4 page(s): 3 done before, 1 to convert" in again.err
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["doc.pdf", "doc.png"]


def test_case7_same_names_from_two_folders_keep_their_folders_whatever_the_order(server, tmp_path, capsys):
    first, second = small_pdf(tmp_path / "a" / "x.pdf", 1), small_pdf(tmp_path / "b" / "x.pdf", 2)
    out = tmp_path / "out"
    assert convert(capsys, server.url, out, str(second), str(first)).code == 0
    folders = {manifest(out / name)["source"]: name for name in ("x.pdf", "x.pdf~2")}
    assert folders == {str(first.resolve()): "x.pdf", str(second.resolve()): "x.pdf~2"}  # by path, not argument order
    swapped = convert(capsys, server.url, out, str(first), str(second))
    assert "3 page(s): 3 done before, 0 to convert" in swapped.err
    only_second = convert(capsys, server.url, out, str(second))
    assert "2 done before, 0 to convert" in only_second.err and not (out / "x.pdf~3").exists()


def test_case7_a_folder_of_the_earlier_naming_is_reused(server, tmp_path, capsys):
    small_pdf(tmp_path / "in" / "doc.pdf", 2)
    out = tmp_path / "out"
    assert convert(capsys, server.url, out, str(tmp_path / "in")).code == 0
    (out / "doc.pdf").rename(out / "doc")  # what earlier versions of the converter named it
    again = convert(capsys, server.url, out, str(tmp_path / "in"))
    assert "2 done before, 0 to convert" in again.err and not (out / "doc.pdf").exists()


# ------------------------------------------------------------------ case 8: --redo-flagged, Ctrl-C between attempts


def test_case8_a_failed_redo_keeps_the_flagged_text(server, tmp_path, capsys):
    image = small_png(tmp_path / "in" / "page.png")
    out = tmp_path / "out"
    server.responder = lambda request: Reply(text="the flagged text", finish_reason="length")
    assert convert(capsys, server.url, out, str(image)).code == 0
    assert manifest(out / "page.png")["pages"]["1"]["status"] == "flagged"

    server.responder = lambda request: Reply(status=400, error="scripted refusal")
    redo = convert(capsys, server.url, out, str(image), "--redo-flagged")
    assert redo.code == 1 and "(the text converted earlier is kept)" in redo.err
    record = manifest(out / "page.png")["pages"]["1"]
    assert record["status"] == "flagged" and "scripted refusal" in record["redo"]["why"]
    document = (out / "page.png" / "page.md").read_text()
    assert "the flagged text" in document and "converting it again failed" in document


def test_case8_stopping_between_attempts_keeps_the_attempt_received(server, tmp_path):
    image = small_png(tmp_path / "in" / "page.png")
    settings = ConversionSettings(MODEL, 64, 200, 1540, "PNG")
    options = BatchOptions(concurrency=1, render_workers=1, max_attempts=4)
    with RenderPool(1) as pool:
        documents = scan(discover([image]), tmp_path / "out", settings, options, pool)
        converter = BatchConverter(OcrClient(server.url, model=MODEL), settings, options, documents, pool)

        def cut_then_stop(request):
            converter.request_stop()  # Ctrl-C while the first attempt's answer is on its way
            return Reply(text="cut short", finish_reason="length")

        server.responder = cut_then_stop
        assert converter.run() == "interrupted"
    record = manifest(tmp_path / "out" / "page.png")["pages"]["1"]
    assert record["status"] == "flagged" and record["attempts"] == 1 and server.chat_count() == 1
    assert (tmp_path / "out" / "page.png" / "pages" / "0001.md").read_text() == "cut short"


# ------------------------------------------------------------------ the server misbehaving


def test_429_and_5xx_are_waited_out_and_retried(server, tmp_path, capsys, monkeypatch):
    import ocr_bundle.batch.attempts

    monkeypatch.setattr(ocr_bundle.batch.attempts, "BACKOFF_S", (0.2, 0.2, 0.2, 0.2))  # seconds, not a minute
    answers = {0: Reply(status=429, retry_after=1.5, error="too many"), 1: Reply(status=503, error="restarting"),
               2: Reply(action="reset"), 3: Reply(action="malformed")}
    server.responder = lambda request: answers.get(request.index, Reply(text="finally"))
    image = small_png(tmp_path / "in" / "page.png")
    started = time.monotonic()
    run = convert(capsys, server.url, tmp_path / "out", str(image), "--concurrency", "1")
    assert run.code == 0, run.err
    assert run.summary["requests"] == 5 and run.summary["pages"]["ok"] == 1
    assert (tmp_path / "out" / "page.png" / "pages" / "0001.md").read_text() == "finally"
    assert time.monotonic() - started >= 1.5 + 3 * 0.2  # the server's Retry-After, then the backoff steps


def test_a_4xx_fails_the_page_at_once(server, tmp_path, capsys):
    server.responder = lambda request: Reply(status=400, error="scripted bad image")
    run = convert(capsys, server.url, tmp_path / "out", str(small_png(tmp_path / "in" / "page.png")))
    assert run.code == 1 and server.chat_count() == 1 and "scripted bad image" in run.err


def test_the_server_coming_back_within_server_wait_lets_the_run_go_on(tmp_path, capsys):
    first = ScriptedServer().__enter__()
    port = first.port
    holder = {}

    def restart():
        wait_for(lambda: first.chat_count() >= 1, 30, "the first request")
        first.stop()
        time.sleep(2.0)  # the outage
        holder["second"] = ScriptedServer(port=port).__enter__()

    first.responder = lambda request: Reply(action="reset")
    restarter = threading.Thread(target=restart)
    restarter.start()
    try:
        small_pdf(tmp_path / "in" / "doc.pdf", 3)
        started = time.monotonic()
        run = convert(capsys, first.url, tmp_path / "out", str(tmp_path / "in"), "--server-wait", "30")
        restarter.join()
        assert run.code == 0, run.err
        assert run.summary["pages"]["ok"] == 3 and holder["second"].chat_count() == 3
        assert time.monotonic() - started >= 2.0
    finally:
        restarter.join()
        if "second" in holder:
            holder["second"].stop()


def test_the_server_staying_away_ends_the_run_with_exit_1(tmp_path, capsys):
    gone = ScriptedServer().__enter__()
    gone.responder = lambda request: Reply(action="reset")
    threading.Thread(target=lambda: (wait_for(lambda: gone.chat_count() >= 1, 30, "a request"), gone.stop())).start()
    small_pdf(tmp_path / "in" / "doc.pdf", 3)
    run = convert(capsys, gone.url, tmp_path / "out", str(tmp_path / "in"), "--server-wait", "2")
    assert run.code == 1 and "the server stopped answering for 2 s" in run.err
    assert run.summary["ended"] == "server gone" and run.summary["pages"]["pending"] == 3


def test_drain_timeout_leaves_the_pages_in_flight_pending(server, tmp_path):
    server.responder = lambda request: Reply(action="stall")
    small_pdf(tmp_path / "in" / "doc.pdf", 6)
    out = tmp_path / "out"
    run = subprocess.Popen([PYTHON, str(ROOT / "batch_ocr.py"), str(tmp_path / "in"), "--url", server.url, "--out",
                            str(out), "--max-attempts", "1", "--concurrency", "2", "--drain-timeout", "1", "--quiet"],
                           cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env={**os.environ, "VLLM_API_KEY": ""})
    wait_for(lambda: server.chat_count() >= 2, 60, "two requests in flight")
    run.send_signal(signal.SIGINT)
    stopped = time.monotonic()
    stdout, stderr = run.communicate(timeout=60)
    assert run.returncode == 130, stderr
    assert time.monotonic() - stopped < 15
    assert "2 page(s) still in flight after 1 s: left pending" in stdout
    summary = json.loads((out / "run-summary.json").read_text())
    assert summary["ended"] == "interrupted" and summary["pages"]["pending"] == 6
