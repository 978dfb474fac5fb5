"""The page's grounding toggle (ocr_bundle/page.py) against the scripted server streaming a
LightOnOCR-3-1B's grounding reply (fast tier: the handlers, not the browser)."""

from __future__ import annotations

import gradio as gr
import pytest
from PIL import Image

from ocr_bundle.client import OcrClient
from ocr_bundle.page import BLOCK_COLOURS, OcrPage, build_ui
from scripted_server import Reply, ScriptedServer
from test_grounded_batch import PAGE, V3, picture_page


@pytest.fixture
def v3():
    with ScriptedServer(models=(V3,)) as running:
        running.responder = lambda request: Reply(text=PAGE)
        yield running


def test_the_page_draws_the_blocks_and_makes_the_markdown_from_them(v3, tmp_path):
    image = picture_page(tmp_path / "report.png")
    page = OcrPage(OcrClient(v3.url))
    updates = list(page.extract(str(image), max_tokens=64, grounding=True, drop=["header", "page_number"]))
    rendered, raw, stats, drawn = updates[-1]
    assert v3.requests[0].body["messages"][0]["content"][1]["text"] == "grounding"
    assert raw == PAGE and rendered == "# Annual report\n\nThe year began well."
    (picture, caption), = drawn
    assert caption == "page 1: 5 block(s): 1 header, 2 title, 3 text, 4 image, 5 page_number"
    assert picture.size == (500, 800)
    # The image block's box (200,400)-(800,700) of 1000 is outlined in its colour on the page.
    green = Image.new("RGB", (1, 1), BLOCK_COLOURS["image"]).getpixel((0, 0))
    assert picture.getpixel((100, 450)) == green and picture.getpixel((250, 450)) == (255, 0, 0)
    assert "⚠️" not in stats


def test_a_garbled_reply_shows_its_raw_text_and_says_why(v3, tmp_path):
    v3.responder = lambda request: Reply(text="Preamble.\n![title](0,0,1000) T")
    rendered, raw, stats, drawn = list(OcrPage(OcrClient(v3.url)).extract(
        str(picture_page(tmp_path / "report.png")), grounding=True))[-1]
    assert rendered == raw == "Preamble.\n![title](0,0,1000) T"
    assert "⚠️ grounding: page 1: text before the first block" in stats and drawn[0][1] == "page 1: 0 block(s): "


def test_grounding_on_a_model_without_it_is_a_message(server, tmp_path):
    with pytest.raises(gr.Error, match="Grounding needs LightOnOCR-3"):
        list(OcrPage(OcrClient(server.url)).extract(str(picture_page(tmp_path / "report.png")), grounding=True))
    assert server.chat_count() == 0


def test_the_page_is_titled_after_the_served_family(v3):
    """The title and heading name what the server serves (the status line's family), not a fixed model."""
    page = build_ui(OcrClient(v3.url))
    assert page.title == "LightOnOCR-3-1B · vLLM"
    assert OcrPage(OcrClient(v3.url)).heading().startswith("# LightOnOCR-3-1B on vLLM")
    assert OcrPage(OcrClient("http://127.0.0.1:9")).heading().startswith("# LightOnOCR-2-1B on vLLM")  # none yet
