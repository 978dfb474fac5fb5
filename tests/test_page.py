"""The page's handlers against the real CPU vLLM server (the browser test drives the page itself)."""

from __future__ import annotations

import asyncio
import re

import gradio as gr
import pytest

from ocr_bundle.page import OcrPage, PageSettings, build_ui, pages_to_process
from ocr_bundle.client import OcrClient
from ocr_bundle.samples import sample_path
from test_images import make_pdf


@pytest.fixture()
def page(vllm_server) -> OcrPage:
    return OcrPage(OcrClient(vllm_server.url))


def test_build_ui_without_launching(vllm_server):
    async def build() -> gr.Blocks:
        return build_ui(OcrClient(vllm_server.url))

    # Built inside a running event loop, as the page's own launch does: outside one, Gradio
    # makes a new event loop for each of its locks and never closes them (a ResourceWarning
    # later in the session).
    blocks = asyncio.run(build())
    assert isinstance(blocks, gr.Blocks)


def test_extract_streams_text_then_stats(page: OcrPage):
    updates = list(page.extract(str(sample_path("english_a4_document.png")), max_tokens=24))
    assert len(updates) >= 3  # several partial updates: the text streams in
    rendered, raw, stats, _ = updates[-1]
    assert rendered == raw and raw.strip()
    assert updates[0][1] != raw and raw.startswith(updates[0][1].rstrip()[:5])
    prompt_tokens = int(re.search(r"([\d,]+) prompt \+", stats).group(1).replace(",", ""))
    assert prompt_tokens > 2000  # an A4 page at 1540 px
    assert "24 output tokens" in stats and "1089×1540" in stats


def test_pdf_pages_all_at_once(page: OcrPage, tmp_path):
    pdf = tmp_path / "three pages é.pdf"
    pdf.write_bytes(make_pdf(3))
    rendered, raw, stats, drawn = list(page.extract(str(pdf), all_pages=True, max_tokens=4))[-1]
    assert drawn is None  # no grounding asked: no blocks
    assert stats.startswith("**3 page(s)**") and raw.count("---") == 2


def test_corrupt_file_is_a_message_and_the_page_keeps_working(page: OcrPage, tmp_path):
    bad = tmp_path / "scan.png"
    bad.write_bytes(b"not an image at all")
    with pytest.raises(gr.Error, match="not an image"):
        list(page.extract(str(bad)))
    assert list(page.extract(str(sample_path("table_screenshot.png")), max_tokens=2))[-1][1]


def test_server_down_is_a_message(tmp_path):
    from helpers import free_port

    dead = OcrPage(OcrClient(f"http://127.0.0.1:{free_port()}", model="m"))
    with pytest.raises(gr.Error, match="Cannot reach the vLLM server"):
        list(dead.extract(str(sample_path("table_screenshot.png"))))
    assert "unreachable" in dead.server_status()


def test_upload_limit_and_page_picker(vllm_server, tmp_path):
    small = OcrPage(OcrClient(vllm_server.url), PageSettings(max_upload_bytes=10_000))
    with pytest.raises(gr.Error, match="limit is"):
        small.on_upload(str(sample_path("english_a4_document.png")))
    pdf = tmp_path / "doc.pdf"
    pdf.write_bytes(make_pdf(5))
    picker, all_pages, preview = OcrPage(OcrClient(vllm_server.url)).on_upload(str(pdf))
    assert picker["visible"] and picker["maximum"] == 5 and all_pages["visible"]
    assert preview.size == (1089, 1540)  # the page as it will be sent
    assert pages_to_process(pdf.read_bytes(), 2, False, 10**8) == [2]


def test_a_bad_upload_delivered_twice_gives_one_message(tmp_path):
    """Gradio can send one upload's change event twice (a quick Clear, then a new file: both
    events carry the new file). The browser showed 'Error (2)' for it; the repeat is now
    refused without a toast, and a real second upload (after Clear) is refused aloud again."""
    page = OcrPage(OcrClient("http://127.0.0.1:9", model="m"))  # an upload's preview needs no server
    bad = tmp_path / "scan.png"
    bad.write_bytes(b"not an image at all")
    me, other = gr.Request(session_hash="me"), gr.Request(session_hash="other")

    def refusal(request: gr.Request) -> gr.Error:
        with pytest.raises(gr.Error, match="not an image") as caught:
            page.on_upload(str(bad), request)
        return caught.value

    assert refusal(me).visible
    assert not refusal(me).visible  # the same event again: still refused (Extract stays off), silently
    assert refusal(other).visible  # another browser session has its own toast
    page.on_upload(None, me)  # Clear
    assert refusal(me).visible
    page.on_upload(str(sample_path("table_screenshot.png")), me)  # a good file in between
    assert refusal(me).visible
