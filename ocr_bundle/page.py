"""The page's handlers and layout (app_vllm.py runs it): upload an image or a PDF, read the text;
with LightOnOCR-3, its layout blocks drawn on the page (grounding).

Gradio and the client side only: the page talks HTTP to the vLLM server and never loads the model.
"""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import gradio as gr
from PIL import Image, ImageDraw

from .client import OcrClient, OcrError, OcrResult
from .api.documents import DEFAULT_MAX_PAGES
from .api.remote import DocumentApi
from .grounding import DROPPABLE, SCALE, Block, parse, to_markdown
from .images import (
    MAX_PDF_PAGES_AT_ONCE,
    MAX_UPLOAD_BYTES,
    InputError,
    PreparedImage,
    check_size,
    decode_data_url,
    is_pdf,
    pdf_page_count,
    prepare_upload,
)
from .samples import sample_paths
from .settings import MAX_OUTPUT_TOKENS, PAGE_PROMPT_TOKENS, TEMPERATURE

LATEX_DELIMITERS = [
    {"left": "$$", "right": "$$", "display": True},
    {"left": "$", "right": "$", "display": False},
    {"left": "\\[", "right": "\\]", "display": True},
    {"left": "\\(", "right": "\\)", "display": False},
]
PAGE_SEPARATOR = "\n\n---\n\n"


@dataclass(frozen=True)
class PageSettings:
    max_upload_bytes: int = MAX_UPLOAD_BYTES
    concurrency: int = 16  # vLLM batches concurrent requests; the page must not serialize them
    # "All pages" of a PDF through the document API (ocr_bundle/api), the converter's path; without it,
    # page by page here, up to MAX_PDF_PAGES_AT_ONCE.
    document_api: DocumentApi | None = None
    document_api_max_pages: int = DEFAULT_MAX_PAGES

    @property
    def max_pages_at_once(self) -> int:
        return self.document_api_max_pages if self.document_api else MAX_PDF_PAGES_AT_ONCE


def user_error(message: object) -> gr.Error:
    """A message for the page: shown until dismissed (people look away during long pages), no traceback."""
    return gr.Error(str(message), duration=None, print_exception=False)


def read_upload(path: str | None, max_bytes: int) -> bytes:
    if not path:
        # Also what a tab opened before a restart of the page sends: its upload never arrives.
        raise InputError("Upload an image or a PDF first. (Just uploaded one? The page may have restarted: "
                         "reload it.)")
    check_size(os.path.getsize(path), max_bytes)  # before reading a huge file into memory
    return Path(path).read_bytes()


def pages_to_process(data: bytes, page: int, all_pages: bool, max_bytes: int,
                     at_once: int = MAX_PDF_PAGES_AT_ONCE) -> list[int]:
    """1-based page numbers to OCR for this upload (images have one page)."""
    if not is_pdf(data):
        return [1]
    count = pdf_page_count(data, max_bytes)
    if all_pages:
        return list(range(1, min(count, at_once) + 1))
    if not 1 <= page <= count:
        raise InputError(f"Page {page} does not exist: the PDF has {count} page(s).")
    return [page]


def format_stats(results: list[tuple[PreparedImage, OcrResult]], wall_s: float) -> str:
    prompt = sum(r.prompt_tokens or 0 for _, r in results)
    output = sum(r.completion_tokens or 0 for _, r in results)
    first = results[0][1]
    image = results[0][0]
    ttft = f"{first.ttft_s:.2f} s" if first.ttft_s is not None else "n/a"
    rate = output / wall_s if wall_s > 0 else 0.0
    lines = [
        f"**{len(results)} page(s)** in **{wall_s:.2f} s** · time to first token {ttft} · "
        f"{prompt:,} prompt + {output:,} output tokens · {rate:,.0f} output tokens/s",
        f"Page sent as {image.width}×{image.height} {image.mime_type.split('/')[1].upper()} "
        f"({image.encoded_bytes / 1024:,.0f} KiB; original {image.original_width}×{image.original_height})",
    ]
    for _, result in results:
        lines += [f"⚠️ {w}" for w in result.warnings]
    return "  \n".join(lines)


class OcrPage:
    """The page's event handlers, separate from the layout so tests can call them directly.

    Handlers raise gr.Error with a message for people; Gradio shows it as a toast and the
    page stays usable."""

    REMEMBERED_SESSIONS = 10_000  # browser sessions whose last refused upload is kept (see on_upload)

    def __init__(self, client: OcrClient, settings: PageSettings = PageSettings()):
        self.client = client
        self.settings = settings
        self._refused: OrderedDict[str, str] = OrderedDict()  # session -> the upload last refused there
        self._refused_lock = threading.Lock()

    def server_status(self) -> str:
        return self.client.status().describe()

    def served_family(self) -> str:
        """The served model's family ("LightOnOCR-3-1B"), as the status line knows it; the bundle's
        first model when the server does not answer yet."""
        status = self.client.status()
        if not status.reachable or not status.models:
            return DEFAULT_TITLE_FAMILY
        return status.family(self.client.model()).name

    def heading(self) -> str:
        return heading_of(self.served_family())

    def sampling_defaults(self):
        """The temperature slider at the served family's value (0.1 for LightOnOCR-3, 0.2 for 2),
        asked when the page opens: the server may have started, or changed, after the page."""
        status = self.client.status()
        if not status.reachable or not status.models:
            return gr.update()
        family = status.family(self.client.model())
        return gr.update(value=family.temperature, info=f"{family.temperature:g} is {family.name}'s recommendation")

    def _read(self, path: str | None) -> bytes:
        try:
            return read_upload(path, self.settings.max_upload_bytes)
        except InputError as exc:
            raise user_error(exc) from exc

    def on_upload(self, path: str | None, request: gr.Request | None = None):
        """Show a page picker for PDFs and a preview of what will be sent.

        Gradio can deliver one upload twice: a Clear quickly followed by a new file sends two
        change events, and both can carry the new file (the browser test caught the page
        showing 'Error (2)' for one bad file). So when a session's upload is refused again
        with nothing in between, the refusal is raised without a message: Extract stays
        disabled, and one bad file gives one toast. A real second upload of the same file
        goes through Clear (an empty value), which forgets the refusal."""
        session = request.session_hash if request is not None else None
        if not path:
            self._forget_refusal(session)
            return gr.update(visible=False, value=1, maximum=2), gr.update(visible=False), None
        try:
            shown = self._preview(path)
        except gr.Error as exc:
            if self._refused_again(session, path):
                raise gr.Error(exc.message, visible=False, print_exception=False) from exc
            raise
        self._forget_refusal(session)
        return shown

    def _refused_again(self, session: str | None, path: str) -> bool:
        """Record that the session's upload `path` was refused; True if it was the last one refused."""
        if session is None:
            return False
        with self._refused_lock:
            repeated = self._refused.get(session) == path
            self._refused[session] = path
            self._refused.move_to_end(session)
            while len(self._refused) > self.REMEMBERED_SESSIONS:
                self._refused.popitem(last=False)
            return repeated

    def _forget_refusal(self, session: str | None) -> None:
        with self._refused_lock:
            self._refused.pop(session, None)

    def _preview(self, path: str):
        data = self._read(path)
        try:
            count = pdf_page_count(data, self.settings.max_upload_bytes) if is_pdf(data) else 1
            preview = prepare_upload(data, 1, max_bytes=self.settings.max_upload_bytes)
        except InputError as exc:
            raise user_error(exc) from exc
        is_multi = count > 1
        return (gr.update(visible=is_multi, value=1, maximum=max(count, 2), label=f"Page (of {count})"),
                gr.update(visible=is_multi), decode_data_url(preview.data_url))

    def on_page_change(self, path: str | None, page: int):
        if not path:
            return None
        data = self._read(path)
        try:
            return decode_data_url(prepare_upload(data, int(page), max_bytes=self.settings.max_upload_bytes).data_url)
        except InputError as exc:
            raise user_error(exc) from exc

    def extract(self, path: str | None, page: int = 1, all_pages: bool = False,
                max_tokens: int = MAX_OUTPUT_TOKENS, temperature: float = TEMPERATURE,
                encoding: str = "PNG", grounding: bool = False,
                drop: list[str] | tuple[str, ...] = ()) -> Iterator[tuple[str, str, str, list | None]]:
        """Stream (rendered markdown, raw text, stats, pages with their blocks drawn) while the pages
        are read. `grounding`: LightOnOCR-3's layout blocks; the Markdown is made from them, without
        the labels in `drop`, and each page comes back with its blocks drawn on it."""
        start = time.perf_counter()
        data = self._read(path)
        try:
            numbers = pages_to_process(data, int(page or 1), bool(all_pages), self.settings.max_upload_bytes,
                                       self.settings.max_pages_at_once)
        except InputError as exc:
            raise user_error(exc) from exc
        if grounding:
            self._check_grounding()
        if len(numbers) > 1 and self.settings.document_api is not None:
            yield from self._extract_document(data, numbers, bool(grounding), frozenset(drop), start)
            return
        texts: list[str] = []
        shown: list[str] = []
        drawn: list[tuple[Image.Image, str]] = []
        notes: list[str] = []
        done: list[tuple[PreparedImage, OcrResult]] = []
        for number in numbers:
            try:
                image = prepare_upload(data, number, fmt=encoding, max_bytes=self.settings.max_upload_bytes)
                current = ""
                for event in self.client.stream_ocr(image.data_url, max_tokens=int(max_tokens),
                                                    temperature=float(temperature), grounding=bool(grounding)):
                    if isinstance(event, OcrResult):
                        done.append((image, event))
                    else:
                        current += event
                        text = PAGE_SEPARATOR.join(texts + [current])
                        yield (PAGE_SEPARATOR.join(shown + [current]), text,
                               f"Reading page {number} of {len(numbers)}… {len(current):,} characters", drawn or None)
                texts.append(current)
                if grounding:
                    parsed = parse(current, cut=done[-1][1].finish_reason == "length")
                    shown.append(to_markdown(parsed.blocks, frozenset(drop)) if parsed.clean else current)
                    drawn.append((draw_blocks(decode_data_url(image.data_url), parsed.blocks),
                                  block_list(number, parsed.blocks)))
                    notes += [f"page {number}: {problem}" for problem in parsed.problems]
                else:
                    shown.append(current)
            except (InputError, OcrError) as exc:
                where = f" (page {number})" if len(numbers) > 1 else ""
                raise user_error(f"{exc}{where}") from exc
        stats = format_stats(done, time.perf_counter() - start)
        if notes:
            stats += "  \n" + "  \n".join(f"⚠️ grounding: {note} (the raw text is shown)" for note in notes[:5])
        yield PAGE_SEPARATOR.join(shown), PAGE_SEPARATOR.join(texts), stats, drawn or None

    def _extract_document(self, data: bytes, numbers: list[int], grounding: bool, drop: frozenset[str],
                          start: float) -> Iterator[tuple[str, str, str, list | None]]:
        """All pages of a PDF through the document API (the converter's render pool, retries and
        grounding), shown as they come back: the pages read so far, in order, and how many."""
        done: dict[int, dict] = {}
        try:
            for api_page in self.settings.document_api.read(data, [n - 1 for n in numbers], drop, grounding):
                done[api_page["index"] + 1] = api_page
                text = PAGE_SEPARATOR.join(done[n]["markdown"] for n in sorted(done))
                yield text, text, f"Read {len(done)} of {len(numbers)} pages (document API)…", None
        except OcrError as exc:
            raise user_error(f"{exc} ({len(done)} of {len(numbers)} pages were read)") from exc
        text = PAGE_SEPARATOR.join(done[n]["markdown"] for n in numbers)
        drawn = None
        if grounding:
            drawn = [(draw_blocks(decode_data_url(prepare_upload(data, n).data_url), api_blocks(done[n])),
                      block_list(n, api_blocks(done[n]))) for n in numbers]
        flags = [f"⚠️ page {n}: {done[n]['flag']}" for n in numbers if done[n].get("flag")]
        stats = "  \n".join([f"**{len(numbers)} page(s)** in **{time.perf_counter() - start:.2f} s** through the "
                             "document API (its render pool, retries of cut or looping pages)", *flags[:5]])
        yield text, text, stats, drawn

    def _check_grounding(self) -> None:
        status = self.client.status()
        family = status.family(self.client.model())
        if family.grounding != "blocks":
            raise user_error(f"Grounding needs LightOnOCR-3: the server serves {self.client.model()} "
                             f"({family.name}), which has no grounding mode.")


# One colour per kind of block, so that the page reads at a glance.
BLOCK_COLOURS = {"title": "#d62728", "section": "#ff7f0e", "header": "#7f7f7f", "footer": "#7f7f7f",
                 "page_number": "#7f7f7f", "image": "#2ca02c", "chart": "#2ca02c", "table": "#9467bd",
                 "caption": "#8c564b", "formula": "#e377c2", "code": "#17becf"}


DEFAULT_TITLE_FAMILY = "LightOnOCR-2-1B"


def heading_of(family: str) -> str:
    return f"# {family} on vLLM\nUpload a page image or a PDF; the text streams in as Markdown."


def block_list(number: int, blocks: list[Block]) -> str:
    """The caption under a page's drawn blocks: how many, and each by its number and label."""
    return f"page {number}: {len(blocks)} block(s): " + ", ".join(
        f"{index} {block.label}" for index, block in enumerate(blocks, start=1))


def api_blocks(api_page: dict) -> list[Block]:
    """A document API page's blocks (boxes in its pixels) as the parser's blocks (boxes on the grid)."""
    width, height = api_page["dimensions"]["width"], api_page["dimensions"]["height"]
    return [Block(block["type"], (round(block["top_left_x"] * SCALE / width), round(block["top_left_y"] * SCALE / height),
                                  round(block["bottom_right_x"] * SCALE / width),
                                  round(block["bottom_right_y"] * SCALE / height)), block["content"])
            for block in api_page.get("blocks") or []]


def draw_blocks(page: Image.Image, blocks: list) -> Image.Image:
    """The page with each block's box drawn and labelled (blue for text and the rest)."""
    drawn = page.convert("RGB")
    pen = ImageDraw.Draw(drawn)
    width = max(2, round(max(drawn.size) / 400))
    for index, block in enumerate(blocks, start=1):
        colour = BLOCK_COLOURS.get(block.label, "#1f77b4")
        x1, y1, x2, y2 = block.pixels(*drawn.size)
        pen.rectangle((x1, y1, x2, y2), outline=colour, width=width)
        tag = f"{index} {block.label}" + ("+" if block.continued else "")
        left, top, right, bottom = pen.textbbox((x1, y1), tag)
        pen.rectangle((left, top, right + 4, bottom + 2), fill=colour)
        pen.text((x1 + 2, y1), tag, fill="white")
    return drawn


def build_ui(client: OcrClient, settings: PageSettings = PageSettings()) -> gr.Blocks:
    """The page, without launching it (tests build it too)."""
    handlers = OcrPage(client, settings)
    server_status, on_upload, on_page_change, extract = (
        handlers.server_status, handlers.on_upload, handlers.on_page_change, handlers.extract)

    family = handlers.served_family()  # the page's title names what the server serves (LightOnOCR-3, ...)
    with gr.Blocks(title=f"{family} · vLLM") as page:
        heading = gr.Markdown(heading_of(family), elem_id="heading")
        with gr.Row():
            status = gr.Markdown(server_status, elem_id="server-status")
            refresh = gr.Button("Refresh status", size="sm", scale=0)
        with gr.Row():
            with gr.Column(scale=1):
                upload = gr.File(label="Image or PDF", file_types=["image", ".pdf"], type="filepath",
                                 elem_id="upload")
                page_number = gr.Slider(1, 2, value=1, step=1, label="Page", visible=False, elem_id="page-picker")
                all_pages = gr.Checkbox(label=f"All pages (up to {settings.max_pages_at_once:,})", visible=False)
                preview = gr.Image(label="What the model sees", interactive=False, height=360)
                with gr.Accordion("Settings", open=False):
                    max_tokens = gr.Slider(16, 8192, value=MAX_OUTPUT_TOKENS, step=16, label="Max output tokens",
                                           info=f"{MAX_OUTPUT_TOKENS} fits the densest pages; the server's max_model_len "
                                                f"must hold ~{PAGE_PROMPT_TOKENS:,} image tokens plus this",
                                           elem_id="max-tokens")
                    temperature = gr.Slider(0.0, 1.0, value=TEMPERATURE, step=0.05, label="Temperature",
                                            info=f"{TEMPERATURE} is the model's recommendation", elem_id="temperature")
                    encoding = gr.Radio(["PNG", "JPEG"], value="PNG", label="Encoding sent to the server",
                                        info="PNG is lossless; JPEG is smaller for slow links")
                    grounding = gr.Checkbox(False, label="Grounding: layout blocks with boxes (LightOnOCR-3)",
                                            elem_id="grounding")
                    drop = gr.CheckboxGroup(list(DROPPABLE), label="Leave out of the Markdown (grounding)",
                                            elem_id="drop")
                extract_button = gr.Button("Extract text", variant="primary", elem_id="extract")
                gr.Examples(examples=[[str(p)] for p in sample_paths()], inputs=[upload], label="Sample pages")
            with gr.Column(scale=2):
                stats = gr.Markdown("", elem_id="stats")
                with gr.Tabs():
                    with gr.Tab("Rendered"):
                        rendered = gr.Markdown(latex_delimiters=LATEX_DELIMITERS, elem_id="rendered",
                                               min_height=300)
                    with gr.Tab("Raw text"):
                        raw = gr.Textbox(lines=24, max_lines=60, buttons=["copy"], label="Markdown",
                                         elem_id="raw")
                    with gr.Tab("Blocks"):
                        # The whole page in view (contain), its block list as the caption below it.
                        blocks = gr.Gallery(label="Layout blocks (grounding)", columns=1, height=640,
                                            object_fit="contain", preview=True, elem_id="blocks")
        # A new file clears the previous result first, so an error never sits next to old text.
        upload.change(lambda: ("", "", "", None), None, [rendered, raw, stats, blocks], queue=False)
        uploaded = upload.change(on_upload, [upload], [page_number, all_pages, preview],
                                 concurrency_limit=settings.concurrency)
        # A file the preview already refused would only raise the same message again on
        # Extract: the button waits for a file that can be read (one toast per bad upload).
        uploaded.success(lambda: gr.update(interactive=True), None, extract_button, queue=False)
        uploaded.failure(lambda: gr.update(interactive=False), None, extract_button, queue=False)
        page_number.release(on_page_change, [upload, page_number], [preview],
                            concurrency_limit=settings.concurrency)
        extract_button.click(extract, [upload, page_number, all_pages, max_tokens, temperature, encoding, grounding,
                                       drop], [rendered, raw, stats, blocks], concurrency_limit=settings.concurrency,
                             api_name="extract")
        page.load(handlers.sampling_defaults, None, temperature, queue=False)
        page.load(handlers.heading, None, heading, queue=False)  # a server restarted with another model
        refresh.click(server_status, None, status)
        gr.Timer(15).tick(server_status, None, status)  # the line follows a server restart
    return page
