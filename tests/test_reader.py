"""The trained reader (tests/fixtures/lightonocr-reader) through the real CPU vLLM server:
tests that know which words must come out, where random weights proved nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from ocr_bundle.page import PAGE_SEPARATOR, OcrPage
from helpers import PYTHON, READER_CHECKPOINT, ROOT, server_requests
from ocr_bundle.client import OcrClient
from ocr_bundle.images import prepare_image_bytes
from test_images import encode

sys.path.insert(0, str(ROOT / "scripts"))
import make_checkpoint  # noqa: E402
import train_reader  # noqa: E402
from make_pdf import jpeg_of, pictures_pdf  # noqa: E402

CER_TARGET = 0.02
LINE = "paid 1234.50 EUR"  # one line every test reads (16 characters at most); the held-out set has its own


def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(READER_CHECKPOINT)


def batch(url: str, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, str(ROOT / "batch_ocr.py"), "--url", url, *argv], capture_output=True, text=True,
                          timeout=600, cwd=ROOT, env={**os.environ, "VLLM_API_KEY": ""})


def test_the_fixture_is_small_and_has_the_generators_layout():
    files = {p.name: p for p in READER_CHECKPOINT.iterdir()}
    assert sum(p.stat().st_size for p in files.values()) <= 10 * 1024 * 1024
    assert make_checkpoint.RANDOM_WEIGHTS_MARKER not in files  # the launcher must not call it random
    config = json.loads(files["config.json"].read_text())
    reference = make_checkpoint.build_config_dict(make_checkpoint.PRESETS["tiny"])
    assert config.keys() == reference.keys()
    for section in ("text_config", "vision_config"):
        assert config[section].keys() == reference[section].keys()
    assert (config["architectures"], config["model_type"]) == (reference["architectures"], reference["model_type"])
    assert (config["vision_config"]["patch_size"], config["vision_config"]["image_size"]) == (14, 1540)
    assert files["chat_template.jinja"].read_text() == make_checkpoint.CHAT_TEMPLATE
    processor = json.loads(files["processor_config.json"].read_text())
    assert processor["image_processor"]["size"] == {"longest_edge": 1540}
    assert processor["image_processor"]["patch_size"] == 14 and processor["spatial_merge_size"] == 2
    record = json.loads(files[train_reader.READER_MARKER].read_text())
    assert record["held_out_cer"] <= CER_TARGET and record["command"].startswith("python scripts/train_reader.py")


def test_held_out_lines_read_through_vllm_within_the_cer_target(reader_server):
    """Lines it never saw, rendered clean, the bundle's client and default sampling (0.2, top_p 0.9)."""
    client = OcrClient(reader_server.url)
    lines = train_reader.held_out_lines(60)

    def read(text: str):
        return client.ocr(prepare_image_bytes(encode(train_reader.render_line(text))).data_url, max_tokens=64)

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(read, lines))
    cer = train_reader.character_error_rate([r.text for r in results], lines)
    print(f"reader CER through vLLM on {len(lines)} held-out lines: {cer:.2%}")
    assert cer <= CER_TARGET, [(line, r.text) for line, r in zip(lines, results) if r.text != line]
    assert {r.finish_reason for r in results} == {"stop"}  # it ends its answers itself


def test_the_page_reads_an_uploaded_line_whatever_its_encoding(reader_server, tmp_path: Path):
    upright = train_reader.render_line(LINE)
    exif = Image.Exif()
    exif[0x0112] = 6  # stored turned a quarter left; viewers (and the bundle) turn it back
    variants = {
        "upright.png": encode(upright),
        "exif-rotated.jpg": encode(upright.rotate(90, expand=True), "JPEG", quality=95, exif=exif),
        "cmyk.tif": encode(upright.convert("CMYK"), "TIFF"),
        "sixteen-bit.png": encode(Image.fromarray(np.asarray(upright.convert("L"), dtype=np.uint16) * 257)),
    }
    page = OcrPage(OcrClient(reader_server.url))
    shown = {}
    for name, data in variants.items():
        (tmp_path / name).write_bytes(data)
        *_, (markdown, raw, stats, _) = page.extract(str(tmp_path / name), max_tokens=64, temperature=0.0)
        shown[name] = markdown
    assert all(word in shown["upright.png"] for word in LINE.split()), shown
    assert set(shown.values()) == {shown["upright.png"]}, shown


def test_the_pdf_picker_reads_the_page_asked_for_and_all_pages_in_order(reader_server, tmp_path: Path):
    pdf = tmp_path / "four pages.pdf"
    pdf.write_bytes(pictures_pdf([jpeg_of(train_reader.render_line(f"page {n}"), 95) for n in range(1, 5)]))
    page = OcrPage(OcrClient(reader_server.url))
    picker, _, _ = page.on_upload(str(pdf))
    assert picker["maximum"] == 4
    *_, (third, _, _, _) = page.extract(str(pdf), page=3, max_tokens=16, temperature=0.0)
    assert third.strip() == "page 3"
    *_, (every, _, _, _) = page.extract(str(pdf), all_pages=True, max_tokens=16, temperature=0.0)
    assert [text.strip() for text in every.split(PAGE_SEPARATOR)] == [f"page {n}" for n in range(1, 5)]


def test_the_batch_converter_puts_the_right_text_on_the_right_page_in_order(reader_server, tmp_path: Path):
    inputs = tmp_path / "in"
    inputs.mkdir()
    (inputs / "seven pages.pdf").write_bytes(
        pictures_pdf([jpeg_of(train_reader.render_line(f"page {n}"), 95) for n in range(1, 8)]))
    (inputs / "line.png").write_bytes(encode(train_reader.render_line(LINE)))
    out = tmp_path / "out"
    done = batch(reader_server.url, str(inputs), "--out", str(out), "--max-tokens", "64", "--temperature", "0",
                 "--concurrency", "4", "--quiet")
    assert done.returncode == 0, done.stdout + done.stderr
    document = out / "seven pages.pdf"
    for n in range(1, 8):
        assert (document / "pages" / f"{n:04d}.md").read_text().strip() == f"page {n}"
        record = json.loads((document / "manifest.json").read_text())["pages"][str(n)]
        assert (record["status"], record["finish_reason"]) == ("ok", "stop")
    assembled = (document / "seven pages.md").read_text()
    positions = [assembled.index(f"page {n}\n") for n in range(1, 8)]
    assert positions == sorted(positions)
    assert (out / "line.png" / "line.md").read_text().strip() == LINE


def test_a_multi_page_tiff_is_read_page_by_page(reader_server, tmp_path: Path):
    """A fax-style TIFF of three printed lines: each frame is its own page, read in order, and
    --pages picks frames like PDF pages."""
    lines = ["page one 11", "page two 22", "page three 33"]
    frames = [train_reader.render_line(text).convert("L") for text in lines]
    tiff = tmp_path / "in" / "fax.tif"
    tiff.parent.mkdir()
    frames[0].save(tiff, save_all=True, append_images=frames[1:])
    out = tmp_path / "out"
    some = batch(reader_server.url, str(tiff), "--out", str(out), "--max-tokens", "64", "--temperature", "0",
                 "--pages", "2-3")
    assert some.returncode == 0, some.stderr
    assert sorted(json.loads((out / "fax.tif" / "manifest.json").read_text())["pages"]) == ["2", "3"]
    rest = batch(reader_server.url, str(tiff), "--out", str(out), "--max-tokens", "64", "--temperature", "0")
    assert rest.returncode == 0 and "3 page(s): 2 done before, 1 to convert" in rest.stderr
    for n, text in enumerate(lines, start=1):
        assert (out / "fax.tif" / "pages" / f"{n:04d}.md").read_text().strip() == text
    document = (out / "fax.tif" / "fax.md").read_text()
    assert [document.index(f"<!-- page {n} -->") for n in (1, 2, 3)] == sorted(
        document.index(f"<!-- page {n} -->") for n in (1, 2, 3))
    assert document.index("page one 11") < document.index("page two 22") < document.index("page three 33")


def test_three_shards_at_once_read_every_page_of_a_corpus_once(reader_server, tmp_path: Path):
    """Three converters, one per shard as three machines would run them, at once on one output
    tree over PDFs and TIFFs: every page read once (the server's count), and --status says so."""
    inputs = tmp_path / "corpus"
    texts = {}
    for n in range(4):
        lines = [f"doc {n} page {p}" for p in range(1, 4)]
        (inputs / f"box{n % 2}").mkdir(parents=True, exist_ok=True)
        (inputs / f"box{n % 2}" / f"doc{n}.pdf").write_bytes(pictures_pdf([jpeg_of(train_reader.render_line(line), 95)
                                                                            for line in lines]))
        texts[f"box{n % 2}/doc{n}.pdf"] = lines
    for n in range(2):
        lines = [f"fax {n} page {p}" for p in range(1, 3)]
        frames = [train_reader.render_line(line).convert("L") for line in lines]
        frames[0].save(inputs / f"fax{n}.tif", save_all=True, append_images=frames[1:])
        texts[f"fax{n}.tif"] = lines
    out = tmp_path / "out"
    before = server_requests(reader_server.url)
    shards = [subprocess.Popen([PYTHON, str(ROOT / "batch_ocr.py"), "--url", reader_server.url, str(inputs), "--out",
                                str(out), "--shard", f"{k}/3", "--max-tokens", "64", "--temperature", "0",
                                "--concurrency", "2", "--render-workers", "1", "--quiet"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                               env={**os.environ, "VLLM_API_KEY": ""}) for k in (1, 2, 3)]
    finished = [shard.communicate(timeout=600) for shard in shards]
    for shard, (_, err) in zip(shards, finished):
        assert shard.returncode == 0, err
    assert sum(int(err.split("shard ")[1].split(": ")[1].split(" of ")[0]) for _, err in finished) == len(texts)
    pages = sum(len(lines) for lines in texts.values())  # 4 PDFs of 3 pages, 2 TIFFs of 2
    assert server_requests(reader_server.url) - before == pages == 16  # every page once, none twice
    for name, lines in texts.items():
        for page, line in enumerate(lines, start=1):
            assert (out / name / "pages" / f"{page:04d}.md").read_text().strip() == line
    status = subprocess.run([PYTHON, str(ROOT / "batch_ocr.py"), "--status", str(out), str(inputs)],
                            capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert status.returncode == 0 and "complete: every page of the 6 document(s) is done" in status.stdout, status.stdout


def test_a_max_tokens_cut_takes_the_retry_path_with_the_real_text(reader_server, tmp_path: Path):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "line.png").write_bytes(encode(train_reader.render_line(LINE)))
    out = tmp_path / "out"
    before = server_requests(reader_server.url)
    cut = batch(reader_server.url, str(tmp_path / "in"), "--out", str(out), "--max-tokens", "3",
                "--max-attempts", "2", "--temperature", "0")
    assert cut.returncode == 0, cut.stderr
    assert server_requests(reader_server.url) - before == 2  # the cut page was tried twice
    record = json.loads((out / "line.png" / "manifest.json").read_text())["pages"]["1"]
    assert record["status"] == "flagged" and record["attempts"] == 2
    assert all(a["finish_reason"] == "length" for a in record["attempt_log"])
    note, kept = (out / "line.png" / "line.md").read_text().split("-->\n")
    assert "flagged: stopped at max_tokens (3)" in note  # the document says so, above the page
    kept = kept.strip()
    assert kept == LINE[:3]  # one token per character: what was read before the cut, and only that
    # Asked again with room, the flagged page is read whole and stops by itself.
    whole = batch(reader_server.url, str(tmp_path / "in"), "--out", str(out), "--max-tokens", "64",
                  "--temperature", "0", "--redo-flagged")
    assert whole.returncode == 0, whole.stderr
    record = json.loads((out / "line.png" / "manifest.json").read_text())["pages"]["1"]
    assert (record["status"], record["finish_reason"]) == ("ok", "stop")
    assert (out / "line.png" / "line.md").read_text().strip() == LINE


def test_the_stress_test_counts_the_tokens_of_the_text_that_came_out(reader_server, tmp_path: Path):
    texts = {"short.png": "page 2", "line.png": LINE, "date.png": "due 15/03/2024"}
    for name, text in texts.items():
        (tmp_path / name).write_bytes(encode(train_reader.render_line(text)))
    out = tmp_path / "report"
    done = subprocess.run([PYTHON, str(ROOT / "stress_test.py"), "--url", reader_server.url,
                           "--images", *(str(tmp_path / n) for n in texts), "--concurrency", "1,3",
                           "--requests", "6", "--warmup", "0", "--max-tokens", "64", "--temperature", "0",
                           "--out", str(out)], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((out / "results.json").read_text())
    vocabulary = tokenizer()
    expected = {name: len(vocabulary(text, add_special_tokens=False)["input_ids"]) + 1  # + the end token
                for name, text in texts.items()}
    assert len(report["requests"]) == 12
    for row in report["requests"]:
        assert row["ok"] and row["completion_tokens"] == expected[Path(row["image"]).name], row
    mean = sum(expected[Path(r["image"]).name] for r in report["requests"]) / 12
    assert all(level["mean_output_tokens"] == pytest.approx(mean) for level in report["levels"])

