"""batch_ocr.py against the real CPU vLLM server: folders, resume after SIGKILL and Ctrl-C,
the retry path, bounded memory, and the refusals that keep a run from starting."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
from PIL import Image

from helpers import PYTHON, ROOT, free_port, running_requests, server_requests, wait_for
from ocr_bundle.batch.manifest import load_record
from ocr_bundle.files import is_partial
from ocr_bundle.samples import sample_path

sys.path.insert(0, str(ROOT / "scripts"))
from make_pdf import image_pdf, jpeg_of  # noqa: E402



def batch_command(url: str, *argv: str) -> list[str]:
    return [PYTHON, str(ROOT / "batch_ocr.py"), "--url", url, *argv]


def batch(url: str, *argv: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(batch_command(url, *argv), capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          env={**os.environ, "VLLM_API_KEY": ""})


def a4_pdf(pages: int) -> bytes:
    """A4 pages of the sample document, each labelled "page N" (renders to 1089×1540)."""
    return image_pdf(pages, jpeg_of(Image.open(sample_path("english_a4_document.png"))))


def manifest(folder: Path) -> dict:
    """The document's whole record as a converter (or a rerun) sees it: manifest.json plus the pages
    journaled since it was written (a run compacts them into the manifest at its end)."""
    record = load_record(folder)
    assert record is not None, f"no manifest in {folder}"
    return record


def done_pages(folder: Path) -> int:
    record = load_record(folder)  # None: not written yet
    return sum(p["status"] in ("ok", "flagged") for p in record["pages"].values()) if record else 0


def settle(url: str) -> float:
    """The server's finished-request count once nothing runs or waits (a killed client's
    requests are aborted by vLLM shortly after the disconnect)."""
    wait_for(lambda: running_requests(url, waiting_too=True) == 0, 60,
             "the server to finish or abort every request")
    return server_requests(url)


def no_partial_files(root: Path) -> bool:
    return not any(is_partial(path) for path in root.rglob("*"))


def test_mixed_folder_with_a_30_page_pdf_end_to_end(vllm_server, tmp_path: Path):
    inputs = tmp_path / "in put é"
    (inputs / "scans" / "deep").mkdir(parents=True)
    (inputs / "report.pdf").write_bytes(a4_pdf(30))
    Image.open(sample_path("table_screenshot.png")).save(inputs / "scans" / "table.png")
    Image.open(sample_path("chinese_mixed_flyer.png")).convert("RGB").save(inputs / "scans" / "deep" / "flyer.jpg")
    (inputs / "notes.txt").write_text("not a page: ignored in a folder")
    out = tmp_path / "out"
    before = server_requests(vllm_server.url)

    done = batch(vllm_server.url, str(inputs), "--out", str(out), "--max-tokens", "8", "--max-attempts", "1",
                 "--concurrency", "8", "--quiet")
    assert done.returncode == 0, done.stdout + done.stderr
    assert server_requests(vllm_server.url) - before == 32  # one request per page, no retries asked for
    report = out / "report.pdf"
    pages = sorted((report / "pages").iterdir())
    assert [p.name for p in pages] == [f"{n:04d}.md" for n in range(1, 31)]
    record = manifest(report)
    assert record["kind"] == "pdf" and record["page_count"] == 30 and len(record["pages"]) == 30
    first = record["pages"]["1"]
    assert first["status"] == "flagged" and first["finish_reason"] == "length" and first["completion_tokens"] == 8
    assert first["image_size"] == [1089, 1540] and first["prompt_tokens"] > 2000 and first["attempts"] == 1
    # The document is its pages, in page order, each under its marker.
    document = (report / "report.md").read_text()
    positions = [document.index(f"<!-- page {n} -->") for n in range(1, 31)]
    assert positions == sorted(positions)
    for n in (1, 17, 30):
        assert (report / "pages" / f"{n:04d}.md").read_text().strip() in document
    assert (out / "scans" / "table.png" / "table.md").exists()
    assert manifest(out / "scans" / "deep" / "flyer.jpg")["pages"]["1"]["image_size"] == list(Image.open(sample_path("chinese_mixed_flyer.png")).size)
    assert not (out / "notes.txt").exists()
    summary = json.loads((out / "run-summary.json").read_text())
    assert summary["pages"] == {"in_scope": 32, "skipped": 0, "to_convert": 32, "ok": 0, "flagged": 32, "failed": 0,
                                "pending": 0}
    assert summary["ended"] == "complete" and summary["requests"] == 32 and summary["pages_per_s"] > 0
    assert summary["client"]["render_ms_per_page"] > 0 and summary["client"]["verdict"] != "n/a"
    assert "report.pdf: 30 flagged" in done.stdout  # the --quiet log line per document

    # Rerun: everything is done, nothing is sent.
    before = server_requests(vllm_server.url)
    again = batch(vllm_server.url, str(inputs), "--out", str(out), "--max-tokens", "8", "--max-attempts", "1")
    assert again.returncode == 0, again.stderr
    assert "32 page(s): 32 done before, 0 to convert" in again.stderr
    assert server_requests(vllm_server.url) == before

    # A changed setting (max_tokens) converts the document again.
    changed = batch(vllm_server.url, str(inputs / "scans"), "--out", str(tmp_path / "out2"), "--max-tokens", "8",
                    "--max-attempts", "1")
    assert changed.returncode == 0
    rerun = batch(vllm_server.url, str(inputs / "scans"), "--out", str(tmp_path / "out2"), "--max-tokens", "9",
                  "--max-attempts", "1")
    assert "1 page(s) converted earlier with other settings (max_tokens 8): kept until converted again" in rerun.stderr
    assert "2 to convert" in rerun.stderr
    assert manifest(tmp_path / "out2" / "table.png")["pages"]["1"]["completion_tokens"] == 9


def test_sigkill_half_way_then_rerun_requests_each_missing_page_once(vllm_server, tmp_path: Path):
    pdf = tmp_path / "long.pdf"
    pdf.write_bytes(a4_pdf(30))
    out = tmp_path / "out"
    args = (str(pdf), "--out", str(out), "--max-tokens", "48", "--max-attempts", "1", "--concurrency", "4", "--quiet")
    start = settle(vllm_server.url)
    first = subprocess.Popen(batch_command(vllm_server.url, *args), cwd=ROOT, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_for(lambda: done_pages(out / "long.pdf") >= 8, 300, "8 pages done")
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    after_kill = settle(vllm_server.url)
    done_before = done_pages(out / "long.pdf")
    assert 8 <= done_before < 30
    # Every page the manifest lists as done has its complete file; the kill left no page
    # half-written under its real name (a temporary file at most, removed by the rerun).
    for number, page in manifest(out / "long.pdf")["pages"].items():
        assert (out / "long.pdf" / page["file"]).read_text().strip(), number

    second = batch(vllm_server.url, *args)
    assert second.returncode == 0, second.stderr
    assert f"{done_before} done before, {30 - done_before} to convert" in second.stderr
    # The rerun asked the server once for each page that was missing, and for nothing else.
    assert settle(vllm_server.url) - after_kill == 30 - done_before
    assert done_pages(out / "long.pdf") == 30 and len(list((out / "long.pdf" / "pages").iterdir())) == 30
    assert no_partial_files(out)
    # For the closing note: what the kill cost (requests the first run sent whose answer it never stored).
    print(f"resume: first run {after_kill - start:.0f} requests for {done_before} pages stored; "
          f"rerun {30 - done_before} requests for {30 - done_before} pages")


def test_ctrl_c_stops_admitting_pages_writes_everything_and_exits_130(vllm_server, tmp_path: Path):
    pdf = tmp_path / "long.pdf"
    pdf.write_bytes(a4_pdf(30))
    out = tmp_path / "out"
    args = (str(pdf), "--out", str(out), "--max-tokens", "48", "--max-attempts", "1", "--concurrency", "2",
            "--drain-timeout", "60", "--quiet")
    run = subprocess.Popen(batch_command(vllm_server.url, *args), cwd=ROOT, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    wait_for(lambda: done_pages(out / "long.pdf") >= 3, 300, "3 pages done")
    run.send_signal(signal.SIGINT)
    interrupted_at = time.monotonic()
    stdout, stderr = run.communicate(timeout=120)
    assert run.returncode == 130, stderr
    assert time.monotonic() - interrupted_at < 60  # two pages in flight finish; nothing new starts
    assert "stopping: no new pages" in stdout and "Traceback" not in stderr
    summary = json.loads((out / "run-summary.json").read_text())
    assert summary["ended"] == "interrupted" and summary["pages"]["pending"] > 0
    done = done_pages(out / "long.pdf")
    assert summary["pages"]["flagged"] == done < 30
    document = (out / "long.pdf" / "long.md").read_text()  # assembled from the pages done so far
    assert "<!-- page 1 -->" in document and "not converted yet: rerun to resume" in document

    # Resume picks up the rest.
    rest = batch(vllm_server.url, *args)
    assert rest.returncode == 0, rest.stderr
    assert f"{done} done before, {30 - done} to convert" in rest.stderr
    assert done_pages(out / "long.pdf") == 30 and "not converted yet" not in (out / "long.pdf" / "long.md").read_text()


def test_a_second_ctrl_c_exits_at_once(vllm_server, tmp_path: Path):
    pdf = tmp_path / "long.pdf"
    pdf.write_bytes(a4_pdf(8))
    out = tmp_path / "out"
    run = subprocess.Popen(batch_command(vllm_server.url, str(pdf), "--out", str(out), "--max-tokens", "2000",
                                         "--max-attempts", "1", "--concurrency", "2", "--quiet"),
                           cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: running_requests(vllm_server.url) >= 2, 120, "two requests of 2,000 tokens in flight")
    run.send_signal(signal.SIGINT)
    assert "stopping: no new pages" in run.stdout.readline()  # the first one was taken: now the second
    run.send_signal(signal.SIGINT)
    stdout, stderr = run.communicate(timeout=30)
    assert run.returncode == 130
    assert "exiting now" in stderr and "Traceback" not in stderr
    json.loads((out / "long.pdf" / "manifest.json").read_text())  # still whole


def test_retry_path_raises_the_temperature_and_flags_the_page(vllm_server, tmp_path: Path):
    """max_tokens 4 makes every reply stop at "length": each page takes every attempt."""
    image = tmp_path / "in" / "table.png"
    image.parent.mkdir()
    Image.open(sample_path("table_screenshot.png")).save(image)
    before = server_requests(vllm_server.url)
    done = batch(vllm_server.url, str(image.parent), "--out", str(tmp_path / "out"), "--max-tokens", "4",
                 "--max-attempts", "3")
    assert done.returncode == 0, done.stderr  # flagged is converted, not failed
    assert server_requests(vllm_server.url) - before == 3
    page = manifest(tmp_path / "out" / "table.png")["pages"]["1"]
    assert page["status"] == "flagged" and page["attempts"] == 3
    assert [a["temperature"] for a in page["attempt_log"]] == [0.2, 0.4, 0.6]
    assert all(a["finish_reason"] == "length" and a["completion_tokens"] == 4 for a in page["attempt_log"])
    assert page["flag"] == "stopped at max_tokens (4): the page may have more text"
    assert "flagged: " in done.stderr and "table.png page 1" in done.stderr
    # Flagged pages count as done on a rerun, unless asked for.
    assert "1 done before, 0 to convert" in batch(vllm_server.url, str(image.parent), "--out", str(tmp_path / "out"),
                                                  "--max-tokens", "4", "--max-attempts", "3").stderr
    assert "0 done before, 1 to convert" in batch(vllm_server.url, str(image.parent), "--out", str(tmp_path / "out"),
                                                  "--max-tokens", "4", "--max-attempts", "1", "--redo-flagged").stderr


def test_memory_stays_bounded_on_a_1000_page_pdf(vllm_server, tmp_path: Path):
    """1,000 pages of noise each render to a ~320 KB PNG: holding them all would take ~320 MB."""
    pdf = tmp_path / "thousand.pdf"
    pdf.write_bytes(image_pdf(1000, jpeg_of(Image.effect_noise((600, 600), 80)), (144, 144)))
    run = subprocess.Popen(batch_command(vllm_server.url, str(pdf), "--out", str(tmp_path / "out"), "--max-tokens",
                                         "1", "--max-attempts", "1", "--concurrency", "16", "--quiet"),
                           cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    peak = 0
    watched = psutil.Process(run.pid)
    while run.poll() is None:
        try:
            peak = max(peak, watched.memory_info().rss)
        except psutil.Error:
            break
        time.sleep(0.05)
    assert run.wait(timeout=600) == 0, run.stderr.read()
    assert done_pages(tmp_path / "out" / "thousand.pdf") == 1000
    print(f"batch_ocr.py peak RSS on 1,000 pages: {peak / 2**20:.0f} MiB")
    assert peak < 250 * 2**20, f"{peak / 2**20:.0f} MiB"


# ------------------------------------------------------------------ runs that cannot start


def test_output_folder_not_writable_is_exit_2(vllm_server, tmp_path: Path):
    blocker = tmp_path / "a file"
    blocker.write_text("x")
    done = batch(vllm_server.url, str(sample_path("table_screenshot.png")), "--out", str(blocker / "out"))
    assert done.returncode == 2
    assert done.stderr.startswith("error: cannot write to the output folder") and "Traceback" not in done.stderr
    if os.geteuid() != 0:  # root writes anywhere: a read-only folder only stops other users
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o555)
        assert batch(vllm_server.url, str(sample_path("table_screenshot.png")), "--out",
                     str(locked / "out")).returncode == 2


def test_no_server_and_no_inputs_are_exit_2(vllm_server, tmp_path: Path):
    dead = batch(f"http://127.0.0.1:{free_port()}", str(sample_path("table_screenshot.png")), "--out",
                 str(tmp_path / "o"))
    assert dead.returncode == 2 and "cannot use the vLLM server" in dead.stderr and "Traceback" not in dead.stderr
    missing = batch(vllm_server.url, str(tmp_path / "nothing-here"), "--out", str(tmp_path / "o"))
    assert missing.returncode == 2 and "no such file or folder" in missing.stderr
    (tmp_path / "empty").mkdir()
    empty = batch(vllm_server.url, str(tmp_path / "empty"), "--out", str(tmp_path / "o"))
    assert empty.returncode == 2 and "no PDF or image files" in empty.stderr
    nomatch = batch(vllm_server.url, str(tmp_path / "*.pdf"), "--out", str(tmp_path / "o"))
    assert nomatch.returncode == 2 and "no image or PDF file matches" in nomatch.stderr


def test_help_has_examples_and_every_flag_documented():
    done = subprocess.run([PYTHON, str(ROOT / "batch_ocr.py"), "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "--pages 1,3-5" in done.stdout and "env VLLM_URL" in done.stdout
    from ocr_bundle.batch.cli import build_parser

    assert all(action.help for action in build_parser()._actions)


def test_pages_option_picks_pages(vllm_server, tmp_path: Path):
    pdf = tmp_path / "doc.pdf"
    pdf.write_bytes(a4_pdf(6))
    done = batch(vllm_server.url, str(pdf), "--out", str(tmp_path / "out"), "--pages", "2,4-", "--max-tokens", "2",
                 "--max-attempts", "1")
    assert done.returncode == 0, done.stderr
    record = manifest(tmp_path / "out" / "doc.pdf")
    assert sorted(record["pages"], key=int) == ["2", "4", "5", "6"]
    # The document holds every page: those not asked for are marked where they belong.
    document = (tmp_path / "out" / "doc.pdf" / "doc.md").read_text()
    assert document.index("<!-- page 1 not converted yet") < document.index("<!-- page 2 -->") < document.index(
        "<!-- page 3 not converted yet") < document.index("<!-- page 4 -->")
    bad = batch(vllm_server.url, str(pdf), "--out", str(tmp_path / "out"), "--pages", "3-1")
    assert bad.returncode == 2 and "not a page or range" in bad.stderr
