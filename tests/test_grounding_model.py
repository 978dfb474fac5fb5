"""LightOnOCR-3's grounding end to end with a model that really grounds: the trained fixture
(tests/fixtures/lightonocr-3-1b-grounding, scripts/train_grounding.py) on the real CPU vLLM
server, through the client, the converter (the README's example), the stress test and the page
in a browser. Labels, boxes (IoU against the generated truth) and words are the model's own."""

from __future__ import annotations

import json
import random
import subprocess
import sys

import pytest
from PIL import Image, ImageChops, ImageStat

from helpers import PYTHON, ROOT, free_port, start_process, stop_group, wait_until_ready
from ocr_bundle import grounding
from ocr_bundle.client import OcrClient
from ocr_bundle.images import prepare_pil_image

sys.path.insert(0, str(ROOT / "scripts"))
import train_grounding  # noqa: E402
from make_pdf import jpeg_of, pictures_pdf  # noqa: E402
from train_reader import character_error_rate  # noqa: E402

pytestmark = pytest.mark.usefixtures("no_server_environment")
ARTIFACTS = ROOT / "test-artifacts"


def convert(url: str, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, "-m", "ocr_bundle.batch", "--url", url, *argv], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def test_the_generated_pages_and_their_answers_agree():
    """What the fixture learned from: every generated page's answer parses back to its blocks,
    which sit on the grid in reading order, one block to a row."""
    rng = random.Random(1)
    for _ in range(300):
        blocks = train_grounding.random_page(rng)
        parsed = grounding.parse(train_grounding.answer_of(blocks))
        assert parsed.clean and [(b.label, b.box, b.text) for b in parsed.blocks] == \
            [(b.label, b.box, b.text) for b in blocks]
        rows = [row for b in blocks for row in range(b.row, b.row + b.rows)]
        assert len(rows) == len(set(rows)) and rows == sorted(rows) and rows[-1] < train_grounding.GRID
        assert all(b.col >= 0 and b.col + b.cols <= train_grounding.GRID for b in blocks)
        assert all(len(b.text) == b.cols for b in blocks if b.label != "image")


def test_held_out_pages_come_back_as_their_blocks_boxes_and_words(grounding_server):
    client = OcrClient(grounding_server.url)
    # Served as "lightonocr-3-1b-grounding" from a folder of that name: a LightOnOCR-3 to every client.
    assert client.status().family(client.model()).name == "LightOnOCR-3-1B"
    pages = train_grounding.held_out_pages(24)
    replies = [client.ocr(prepare_pil_image(train_grounding.render_page(blocks)).data_url, grounding=True,
                          temperature=0.0, max_tokens=200).text for blocks in pages]
    ious, read, truth = [], [], []
    for reply, blocks in zip(replies, pages):
        parsed = grounding.parse(reply)
        assert parsed.clean, (reply, parsed.problems)
        assert [b.label for b in parsed.blocks] == [b.label for b in blocks], reply
        ious += [grounding.iou(got.box, want.box) for got, want in zip(parsed.blocks, blocks)]
        read.append(" | ".join(b.text for b in parsed.blocks))
        truth.append(" | ".join(b.text for b in blocks))
    cer = character_error_rate(read, truth)
    print(f"24 held-out pages, {len(ious)} blocks: every label in order, IoU min {min(ious):.3f} "
          f"mean {sum(ious) / len(ious):.3f}, CER {cer:.2%}")
    assert min(ious) >= 0.5 and cer <= 0.02


def test_the_converter_writes_blocks_pictures_and_markdown_with_and_without_drop(grounding_server, tmp_path):
    """The README's example (train_grounding.example_page), then two held-out pages, in one PDF."""
    pages = [train_grounding.example_page()] + train_grounding.held_out_pages(2, seed=7)
    rendered = [train_grounding.render_page(blocks) for blocks in pages]
    pdf = tmp_path / "in" / "report.pdf"
    pdf.parent.mkdir()
    pdf.write_bytes(pictures_pdf([jpeg_of(page, 95) for page in rendered]))  # each page 224 px at 200 dpi
    out = tmp_path / "out"
    run = convert(grounding_server.url, str(pdf), "--out", str(out), "--grounding", "--drop", "page_number",
                  "--max-tokens", "200")
    assert run.returncode == 0, run.stderr
    folder = out / "report.pdf"
    read, truth = [], []
    for number, blocks in enumerate(pages, start=1):
        written = [json.loads(line) for line in (folder / "pages" / f"{number:04d}.blocks.jsonl").read_text().splitlines()]
        assert [b["label"] for b in written] == [b.label for b in blocks]
        for got, want in zip(written, blocks):
            assert grounding.iou(tuple(got["box"]), want.box) >= 0.5, (got, want)
        read.append(" | ".join(b["text"] for b in written))
        truth.append(" | ".join(b.text for b in blocks))
    assert read[0] == truth[0] == "Report | net 2026 |  | 12"  # the README's page, word for word
    assert character_error_rate(read, truth) <= 0.1, (read, truth)  # the held-out pages went through JPEG
    # The example's picture (block 3) is cut from the page where the model put it.
    picture_block = json.loads((folder / "pages" / "0001.blocks.jsonl").read_text().splitlines()[2])
    assert picture_block["box"] == [250, 375, 750, 750] and picture_block["box_px"] == [56, 84, 168, 168]
    crop = Image.open(folder / "pages" / "0001-3-image.png").convert("RGB")
    expected = rendered[0].crop((56, 84, 168, 168))
    assert crop.size == expected.size
    assert max(ImageStat.Stat(ImageChops.difference(crop, expected)).mean) < 8  # the same picture, through JPEG
    page_file = (folder / "pages" / "0001.md").read_text()
    assert page_file == "# Report\n\nnet 2026\n\n![image](0001-3-image.png)\n\n12"  # the page keeps every block
    document = (folder / "report.md").read_text()
    first = "<!-- page 1 -->\n\n# Report\n\nnet 2026\n\n![image](pages/0001-3-image.png)\n\n"
    assert document.startswith(first + "<!-- page 2 -->"), document  # the page number dropped

    # Without --drop the page number comes back, reassembled from what is on disk: no request sent.
    again = convert(grounding_server.url, str(pdf), "--out", str(out), "--grounding", "--max-tokens", "200")
    assert again.returncode == 0, again.stderr
    summary = json.loads((out / "run-summary.json").read_text())
    assert summary["requests"] == 0 and "3 done before, 0 to convert" in again.stderr
    assert (folder / "report.md").read_text().startswith(first + "12\n\n<!-- page 2 -->")


def test_the_stress_test_sends_grounding_requests_to_a_grounding_model(grounding_server, tmp_path):
    image = tmp_path / "page.png"
    train_grounding.render_page(train_grounding.example_page()).save(image)
    report = tmp_path / "report"
    run = subprocess.run([PYTHON, "stress_test.py", "--url", grounding_server.url, "--images", str(image),
                          "--grounding", "--concurrency", "2", "--requests", "4", "--warmup", "0",
                          "--max-tokens", "200", "--out", str(report)], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr
    level, = json.loads((report / "results.json").read_text())["levels"]
    assert level["ok"] == 4 and level["errors"] == 0
    assert "grounding requests (layout blocks)" in (report / "report.md").read_text()


@pytest.fixture
def grounding_page(grounding_server, tmp_path_factory):
    port = free_port()
    log = tmp_path_factory.mktemp("grounding-ui") / "ui.log"
    started = start_process([PYTHON, str(ROOT / "app_vllm.py"), "--server-url", grounding_server.url,
                             "--port", str(port)], log, f"http://127.0.0.1:{port}")
    try:
        wait_until_ready(started, "/config", 120)
        yield started
    finally:
        stop_group(started)


def test_the_page_grounds_a_page_in_a_browser(grounding_page, tmp_path):
    from playwright.sync_api import expect, sync_playwright

    from test_browser import CHROMIUM, CHROMIUM_ARGS, upload

    image = tmp_path / "report.png"
    train_grounding.render_page(train_grounding.example_page()).save(image)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(grounding_page.url, wait_until="networkidle")
            expect(page.locator("#server-status")).to_contain_text("lightonocr-3-1b-grounding", timeout=30_000)
            page.get_by_text("Settings").click()
            # The served family's sampling: LightOnOCR-3's 0.1, not generation 2's 0.2.
            expect(page.locator("#temperature input[type=number]")).to_have_value("0.1")
            page.locator("#grounding input[type=checkbox]").check()
            page.locator("#drop").get_by_label("page_number").check()
            upload(page, image)
            page.locator("#extract").click()
            expect(page.locator("#stats")).to_contain_text("output tokens", timeout=120_000)
            rendered = page.locator("#rendered")
            expect(rendered.locator("h1")).to_have_text("Report")
            expect(rendered).to_contain_text("net 2026")
            assert "12" not in rendered.inner_text()  # dropped from the Markdown...
            page.get_by_role("tab", name="Raw text").click()
            raw = page.locator("#raw textarea").input_value()
            assert "![page_number](375,875,625,1000) 12" in raw  # ...not from the reply
            page.get_by_role("tab", name="Blocks").click()
            expect(page.locator("#blocks img").first).to_be_visible(timeout=30_000)
            expect(page.locator("#blocks")).to_contain_text("page 1: 4 block(s): 1 title, 2 text, 3 image, 4 page_number")
            # The whole page in view, its bottom (the page-number block) too: the image inside the gallery.
            shown, frame = page.locator("#blocks img").first.bounding_box(), page.locator("#blocks").bounding_box()
            assert shown["y"] >= frame["y"] and shown["y"] + shown["height"] <= frame["y"] + frame["height"], (shown, frame)
            assert page.title() == "LightOnOCR-3-1B · vLLM"  # named after the served family, not a fixed model
            expect(page.locator("#heading h1")).to_have_text("LightOnOCR-3-1B on vLLM")
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "page-grounding.png"), full_page=True)
        finally:
            browser.close()


def test_the_document_api_gives_the_picture_as_mistrals_image_with_its_box(grounding_server, tmp_path):
    """POST /v1/ocr on the README's grounding page: the picture block comes back as an `images` entry
    whose box is where the model put it and whose base64 is the picture; `drop` leaves the page number out."""
    import base64
    import io

    import requests

    page = train_grounding.render_page(train_grounding.example_page())
    pdf = pictures_pdf([jpeg_of(page, 95)])
    port = free_port()
    api = start_process([PYTHON, "-m", "ocr_bundle.api", "--url", grounding_server.url, "--port", str(port),
                         "--render-workers", "1"], tmp_path / "api.log", f"http://127.0.0.1:{port}",
                        {"OCR_API_MAX_TOKENS": "200", "OCR_API_TEMPERATURE": "0"})
    try:
        wait_until_ready(api, "/health", 60)
        body = {"document": {"type": "document_url",
                             "document_url": "data:application/pdf;base64," + base64.b64encode(pdf).decode()},
                "include_image_base64": True, "include_blocks": True, "drop": ["page_number"]}
        answer = requests.post(f"{api.url}/v1/ocr", json=body, timeout=300)
        assert answer.status_code == 200, answer.text
    finally:
        stop_group(api)
    result = answer.json()["pages"][0]
    [image] = result["images"]
    box = (image["top_left_x"], image["top_left_y"], image["bottom_right_x"], image["bottom_right_y"])
    assert grounding.iou(box, (56, 84, 168, 168)) >= 0.9, image  # the picture block, in the page's pixels
    header, _, data = image["image_base64"].partition(",")
    crop = Image.open(io.BytesIO(base64.b64decode(data))).convert("RGB")
    assert header == "data:image/png;base64" and crop.size == (box[2] - box[0], box[3] - box[1])
    assert max(ImageStat.Stat(ImageChops.difference(crop, page.crop(box))).mean) < 8  # the same picture
    assert result["markdown"] == f"# Report\n\nnet 2026\n\n![image]({image['id']})"  # dropped: the page number
    assert [block["type"] for block in result["blocks"]] == ["title", "text", "image", "page_number"]
    assert result["dimensions"] == {"dpi": 200, "height": 224, "width": 224}
