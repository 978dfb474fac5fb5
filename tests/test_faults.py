"""Bad input, bad requests, a dying server and overload: the bundle keeps working and loses nothing.

Every case runs against real processes on the CPU backend (issue: faults and load)."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import gradio as gr
import numpy as np
import pytest
from PIL import Image

from ocr_bundle.page import OcrPage
from conftest import TEST_MAX_MODEL_LEN
from helpers import PYTHON, ROOT, free_port, running_requests, start_process, stop_group, wait_for, wait_until_ready
from ocr_bundle.client import OcrClient, OcrError
from ocr_bundle.images import prepare_image_bytes
from ocr_bundle.inputs import discover, output_folders
from ocr_bundle.loadtest.pollers import PeriodicPoller, ServerMetrics
from ocr_bundle.samples import sample_path
from test_batch import a4_pdf, done_pages, manifest
from test_images import encode, make_pdf


def encrypted_pdf() -> bytes:
    from pypdf import PdfWriter

    writer = PdfWriter()
    writer.add_blank_page(595, 842)
    writer.encrypt("secret", algorithm="RC4-128")
    buffer = io.BytesIO()
    writer.write(buffer)
    return buffer.getvalue()


def exif_rotated_photo() -> bytes:
    exif = Image.Exif()
    exif[0x0112] = 8
    return encode(Image.effect_noise((640, 480), 40).convert("RGB"), "JPEG", exif=exif)


def animated_gif() -> bytes:
    frames = [Image.new("P", (300, 200), i) for i in range(3)]
    buffer = io.BytesIO()
    frames[0].save(buffer, format="GIF", save_all=True, append_images=frames[1:], loop=0)
    return buffer.getvalue()


# name → (how to make the file's bytes, expected: "ok" or a piece of the message the user sees).
# Made when the fixture needs them (pypdf is the CPU environment's, not the fast tier's).
INPUT_CASES = {
    "zero-byte.png": (lambda: b"", "empty"),
    "text renamed.png": (lambda: b"Dear reader, I am plain text.", "not an image"),
    "truncated.png": (lambda: sample_path("table_screenshot.png").read_bytes()[:700], "truncated"),
    "truncated.jpg": (lambda: encode(Image.effect_noise((800, 800), 60).convert("RGB"), "JPEG")[:3000], "truncated"),
    "huge 20000x20000.png": (lambda: encode(Image.new("1", (20000, 20000)), "PNG", optimize=True),
                             "20000×20000 (400 MP); the limit is 100 MP"),
    "one-pixel.png": (lambda: encode(Image.new("RGB", (1, 1), "white")), "ok"),
    "cmyk.jpg": (lambda: encode(Image.new("CMYK", (400, 300), (0, 50, 100, 0)), "JPEG"), "ok"),
    "sixteen-bit.png": (lambda: encode(Image.fromarray(np.arange(0, 65536, 16, dtype=np.uint16).reshape(64, 64))),
                        "ok"),
    "palette.png": (lambda: encode(Image.new("P", (300, 200), 3)), "ok"),
    "rgba.png": (lambda: encode(Image.new("RGBA", (300, 200), (0, 0, 0, 0))), "ok"),
    "exif-rotated photo é.jpg": (exif_rotated_photo, "ok"),
    "animated.gif": (animated_gif, "ok"),
    "scan.tiff": (lambda: encode(Image.new("L", (500, 700), 200), "TIFF"), "ok"),
    "fifty pages.pdf": (lambda: make_pdf(50), "ok"),
    "encrypted.pdf": (encrypted_pdf, "encrypted"),
    "corrupt.pdf": (lambda: b"%PDF-1.7\n1 0 obj << /Type /Catalog >> endobj\n%%EOF", "damaged"),
}


@pytest.fixture(scope="module")
def input_files(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("bad inputs ü")
    for name, (make, _) in INPUT_CASES.items():
        (folder / name).write_bytes(make())
    return folder


@pytest.mark.parametrize("name", list(INPUT_CASES))
def test_every_input_gets_a_result_or_a_clear_message_in_the_page(vllm_server, input_files, name):
    page = OcrPage(OcrClient(vllm_server.url))
    expected = INPUT_CASES[name][1]
    path = str(input_files / name)
    if expected == "ok":
        final = list(page.extract(path, page=50 if name.endswith(".pdf") else 1, max_tokens=4))[-1]
        assert "output tokens" in final[2]
    else:
        with pytest.raises(gr.Error) as caught:
            list(page.extract(path, max_tokens=4))
        assert expected in str(caught.value)
        assert "Traceback" not in str(caught.value)
    # ...and the service answers the next request.
    assert list(page.extract(str(sample_path("table_screenshot.png")), max_tokens=2))[-1][1]


def test_every_input_is_accounted_for_in_the_stress_test(vllm_server, input_files, tmp_path):
    done = subprocess.run([PYTHON, str(ROOT / "stress_test.py"), "--url", vllm_server.url, "--images", str(input_files),
                           "--concurrency", "4", "--requests", "40", "--warmup", "0", "--max-tokens", "2",
                           "--max-error-rate", "1", "--out", str(tmp_path / "r")],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / "r" / "results.json").read_text())
    level = report["levels"][0]
    assert level["ok"] + level["errors"] == level["requests"] == 40
    # The 50-page PDF becomes 20 pages (the cap), every other file one entry.
    assert len(report["images"]) == len(INPUT_CASES) - 1 + 20
    bad = {n for n, (_, e) in INPUT_CASES.items() if e != "ok"}
    failed_images = {r["image"] for r in report["requests"] if not r["ok"]}
    assert failed_images == bad & {r["image"] for r in report["requests"]}
    assert "Traceback" not in done.stderr


def test_every_input_is_accounted_for_in_a_batch_conversion(vllm_server, input_files, tmp_path):
    """The whole fault suite in one folder: every good page converted, every bad file or page
    a clear line in its manifest and in the summary, no traceback, exit 1."""
    out = tmp_path / "out"
    done = subprocess.run([PYTHON, str(ROOT / "batch_ocr.py"), str(input_files), "--url", vllm_server.url, "--out",
                           str(out), "--max-tokens", "2", "--max-attempts", "1", "--concurrency", "8", "--quiet"],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    summary = json.loads((out / "run-summary.json").read_text())
    folders = {path.name: folder for path, folder in output_folders(discover([input_files])).items()}
    assert folders["truncated.png"].name == "truncated.png" and folders["cmyk.jpg"].name == "cmyk.jpg"  # always with the suffix
    for name, (_, expected) in INPUT_CASES.items():
        folder = out / folders[name]
        record = manifest(folder)
        if expected == "ok":
            pages = 50 if name.endswith(".pdf") else 1
            # Converted: "flagged" at 2 tokens, or "ok" where the random weights sampled the end token.
            assert sum(p["status"] in ("ok", "flagged") for p in record["pages"].values()) == pages, name
            continue
        # The reason, in the file's manifest and on its line of the summary.
        reasons = [record.get("error")] + [p.get("error") for p in record["pages"].values()]
        assert any(expected in (reason or "") for reason in reasons), (name, reasons)
        assert any(name in line and expected in line for line in done.stderr.splitlines()), name
    bad = sum(expected != "ok" for _, expected in INPUT_CASES.values())
    assert summary["pages"]["failed"] + len(summary["unreadable"]) == bad
    assert summary["pages"]["ok"] + summary["pages"]["flagged"] == 50 + sum(
        expected == "ok" and not name.endswith(".pdf") for name, (_, expected) in INPUT_CASES.items())
    assert f"FAILED: {bad} of " in done.stderr


# ------------------------------------------------------------------ bad requests


def test_output_cut_by_max_model_len_names_both_numbers(vllm_server):
    url = prepare_image_bytes(sample_path("english_a4_document.png").read_bytes()).data_url
    result = OcrClient(vllm_server.url).ocr(url, max_tokens=TEST_MAX_MODEL_LEN, ignore_eos=True)
    assert result.prompt_tokens + result.completion_tokens == TEST_MAX_MODEL_LEN
    warning = result.warnings[0]
    assert "context limit" in warning and f"max tokens {TEST_MAX_MODEL_LEN}" in warning
    assert f"prompt {result.prompt_tokens}" in warning and "--max-model-len" in warning


@pytest.mark.parametrize("kwargs, status, message", [
    ({"model": "no-such-model"}, 404, "Unknown model"),
    ({"max_tokens": 0}, 400, "max_tokens"),
    ({"max_tokens": -5}, 400, "max_tokens"),
])
def test_bad_requests_get_clear_errors(vllm_server, kwargs, status, message):
    client = OcrClient(vllm_server.url, model=kwargs.pop("model", None))
    url = prepare_image_bytes(sample_path("table_screenshot.png").read_bytes()).data_url
    with pytest.raises(OcrError) as caught:
        client.ocr(url, **kwargs)
    assert caught.value.status == status and message in str(caught.value)


# ------------------------------------------------------------------ overload


def test_64_concurrent_requests_with_a_short_timeout_are_all_accounted_for(vllm_server, tmp_path):
    """64 × 3,000 forced tokens is ~190,000 tokens: no CPU serves that within the 5 s each
    request is allowed, however fast the runner, so timeouts are certain."""
    start = time.monotonic()
    done = subprocess.run([PYTHON, str(ROOT / "stress_test.py"), "--url", vllm_server.url, "--concurrency", "64",
                           "--images", str(sample_path("table_screenshot.png")), "--requests", "64", "--warmup", "0",
                           "--max-tokens", "3000", "--ignore-eos", "--timeout", "5", "--max-error-rate", "1",
                           "--out", str(tmp_path / "load")], capture_output=True, text=True, timeout=300, cwd=ROOT)
    elapsed = time.monotonic() - start
    assert done.returncode == 0, done.stderr
    level = json.loads((tmp_path / "load" / "results.json").read_text())["levels"][0]
    assert level["requests"] == 64 and level["ok"] + level["errors"] == 64
    assert level["errors"] > 0 and all("timeout" in m.lower() or "in time" in m for m in level["errors_by_message"])
    assert elapsed < 120, elapsed  # nothing hangs past the per-request deadline
    # The server is still fine afterwards.
    url = prepare_image_bytes(sample_path("table_screenshot.png").read_bytes()).data_url
    assert OcrClient(vllm_server.url).ocr(url, max_tokens=2).completion_tokens >= 1


# ------------------------------------------------------------------ a dying server


def start_dedicated_server(tiny_checkpoint: Path, port: int, log: Path):
    started = start_process([PYTHON, str(ROOT / "start_vllm_server.py"), "--model", str(tiny_checkpoint),
                             "--served-model-name", "lightonocr-tiny", "--port", str(port),
                             "--max-model-len", str(TEST_MAX_MODEL_LEN), "--cpu-kv-cache-gb", "1"],
                            log, f"http://127.0.0.1:{port}")
    wait_until_ready(started, "/health", 300)
    return started


@pytest.mark.slow
def test_vllm_killed_during_a_stress_run_and_a_batch_then_back(tiny_checkpoint, tmp_path):
    port = free_port()
    server = start_dedicated_server(tiny_checkpoint, port, tmp_path / "vllm1.log")
    url = f"http://127.0.0.1:{port}"
    pdf = tmp_path / "thirty.pdf"
    pdf.write_bytes(a4_pdf(30))
    out = tmp_path / "converted"
    convert = [PYTHON, str(ROOT / "batch_ocr.py"), str(pdf), "--url", url, "--out", str(out), "--max-tokens", "64",
               "--max-attempts", "1", "--concurrency", "2", "--server-wait", "5", "--quiet"]
    try:
        batch = subprocess.Popen(convert, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        wait_for(lambda: done_pages(out / "thirty.pdf") >= 2, 120, "two pages converted")
        stress = subprocess.Popen([PYTHON, str(ROOT / "stress_test.py"), "--url", url, "--concurrency", "2",
                                   "--requests", "8", "--warmup", "0", "--max-tokens", "1500", "--ignore-eos",
                                   "--out", str(tmp_path / "killed")], cwd=ROOT, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
        wait_for(lambda: running_requests(url) >= 3, 120, "the stress test's requests in flight beside the batch")
        os.killpg(server.process.pid, signal.SIGKILL)  # the fault
        out_text, err = stress.communicate(timeout=120)
        batch_out, batch_err = batch.communicate(timeout=120)
    finally:
        stop_group(server)
    assert stress.returncode == 1, out_text + err
    report = json.loads((tmp_path / "killed" / "results.json").read_text())
    level = report["levels"][0]
    assert level["requests"] == 8 and level["errors"] >= 6 and level["ok"] + level["errors"] == 8
    assert (tmp_path / "killed" / "report.md").exists() and "Traceback" not in err

    # The batch ends cleanly once the server stays away (--server-wait), keeping what it converted.
    assert batch.returncode == 1, batch_out + batch_err
    assert "the server stopped answering for 5 s" in batch_err and "Traceback" not in batch_err
    converted = done_pages(out / "thirty.pdf")
    summary = json.loads((out / "run-summary.json").read_text())
    assert summary["ended"] == "server gone" and summary["pages"]["pending"] == 30 - converted > 0

    # The page says the server is down, and recovers once it is back on the same port.
    page = OcrPage(OcrClient(url, model="lightonocr-tiny"))
    assert "unreachable" in page.server_status()
    with pytest.raises(gr.Error, match="Cannot reach"):
        list(page.extract(str(sample_path("table_screenshot.png")), max_tokens=2))
    server = start_dedicated_server(tiny_checkpoint, port, tmp_path / "vllm2.log")
    try:
        assert "lightonocr-tiny" in page.server_status()
        assert list(page.extract(str(sample_path("table_screenshot.png")), max_tokens=2))[-1][1]
        # ...and the batch, rerun, converts the rest.
        rerun = subprocess.run(convert, cwd=ROOT, capture_output=True, text=True, timeout=600)
        assert rerun.returncode == 0, rerun.stderr
        assert f"{converted} done before, {30 - converted} to convert" in rerun.stderr
        assert done_pages(out / "thirty.pdf") == 30
    finally:
        stop_group(server)


# ------------------------------------------------------------------ several users at once


def test_eight_simultaneous_users_of_the_page_all_get_answers(vllm_server, tmp_path):
    """...served side by side: vLLM sees several of their requests at once (a page that
    serialised them, concurrency_limit 1, would answer everyone too, one by one)."""
    from gradio_client import Client, handle_file

    port = free_port()
    ui = start_process([PYTHON, str(ROOT / "app_vllm.py"), "--server-url", vllm_server.url, "--port", str(port)],
                       tmp_path / "ui.log", f"http://127.0.0.1:{port}")
    try:
        wait_until_ready(ui, "/config", 120)
        answers: list[str] = []
        errors: list[str] = []
        # Each user connects first, then all press the button together: connecting (a config
        # fetch and a handshake each) on two busy cores staggers them by seconds otherwise.
        press_together = threading.Barrier(8)

        def user(index: int):
            try:
                client = Client(ui.url, verbose=False)
                press_together.wait(timeout=120)
                rendered, raw, stats, _ = client.predict(handle_file(str(sample_path("table_screenshot.png"))), 1,
                                                         False, 64, 0.2, "PNG", False, [], api_name="/extract")
                answers.append(stats)
            except Exception as exc:  # collected and asserted below
                press_together.abort()  # the others fail at once instead of waiting for this one
                errors.append(f"user {index}: {exc!r}")

        threads = [threading.Thread(target=user, args=(i,)) for i in range(8)]
        # A generous timeout: the CPU server answers /metrics slowly while it runs all eight, and a
        # sample given up on would be lost just when the overlap happens.
        with PeriodicPoller(ServerMetrics(vllm_server.url, timeout=30), 0.05, "vllm-metrics") as metrics:
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(timeout=240)
        assert not errors, errors
        assert len(answers) == 8 and all(re.search(r"\+ \d+ output tokens", a) for a in answers)
        overlap = max((value for _, value in metrics.series("vllm:num_requests_running")), default=0)
        assert overlap >= 2, f"the server never ran two page requests at once (peak {overlap}; {answers})"
    finally:
        stop_group(ui)
