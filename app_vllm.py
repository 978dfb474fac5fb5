#!/usr/bin/env python3
"""Gradio page for LightOnOCR-2-1B served by vLLM: upload an image or a PDF, read the text.

    python app_vllm.py                                   # server at http://127.0.0.1:8000, page on :7860
    VLLM_API_KEY=s3cret python app_vllm.py --server-url https://gpu-box:8000 --ca-cert ca.pem --auth alice:pw

Precedence: flags > environment (VLLM_URL, VLLM_MODEL, VLLM_API_KEY, VLLM_CA_CERT, UI_HOST,
UI_PORT, UI_AUTH, UI_MAX_UPLOAD_MB, UI_CONCURRENCY, TLS_CERT, TLS_KEY, TLS_CA) > defaults. With
TLS_CERT/TLS_KEY the page serves HTTPS (TLS_CA: the CA that signed them); beyond loopback it
refuses plain HTTP unless ALLOW_PLAINTEXT=1. The page only talks HTTP to the
vLLM server; it never loads the model. Pages are prepared here, once per click (EXIF
orientation, RGB, longest edge 1540 px, PNG), so the server receives what the model
was trained on. Every failure becomes a message on the page, never a stack trace.
"""

from __future__ import annotations

import argparse
import os
import ssl
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import gradio as gr

from ocr_bundle import exposure, tls
from ocr_bundle.client import OcrClient, OcrError, OcrResult
from ocr_bundle.images import (
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
from ocr_bundle.samples import sample_paths
from ocr_bundle.settings import (
    MAX_OUTPUT_TOKENS,
    PAGE_PROMPT_TOKENS,
    READ_TIMEOUT_S,
    TEMPERATURE,
    add_server_arguments,
    api_key_from_env,
    env_default,
)

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


def pages_to_process(data: bytes, page: int, all_pages: bool, max_bytes: int) -> list[int]:
    """1-based page numbers to OCR for this upload (images have one page)."""
    if not is_pdf(data):
        return [1]
    count = pdf_page_count(data, max_bytes)
    if all_pages:
        return list(range(1, min(count, MAX_PDF_PAGES_AT_ONCE) + 1))
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
                encoding: str = "PNG") -> Iterator[tuple[str, str, str]]:
        """Stream (rendered markdown, raw text, stats) while the pages are read."""
        start = time.perf_counter()
        data = self._read(path)
        try:
            numbers = pages_to_process(data, int(page or 1), bool(all_pages), self.settings.max_upload_bytes)
        except InputError as exc:
            raise user_error(exc) from exc
        texts: list[str] = []
        done: list[tuple[PreparedImage, OcrResult]] = []
        for number in numbers:
            try:
                image = prepare_upload(data, number, fmt=encoding, max_bytes=self.settings.max_upload_bytes)
                current = ""
                for event in self.client.stream_ocr(image.data_url, max_tokens=int(max_tokens),
                                                    temperature=float(temperature)):
                    if isinstance(event, OcrResult):
                        done.append((image, event))
                    else:
                        current += event
                        text = PAGE_SEPARATOR.join(texts + [current])
                        yield text, text, f"Reading page {number} of {len(numbers)}… {len(current):,} characters"
                texts.append(current)
            except (InputError, OcrError) as exc:
                where = f" (page {number})" if len(numbers) > 1 else ""
                raise user_error(f"{exc}{where}") from exc
        text = PAGE_SEPARATOR.join(texts)
        yield text, text, format_stats(done, time.perf_counter() - start)


def build_ui(client: OcrClient, settings: PageSettings = PageSettings()) -> gr.Blocks:
    """The page, without launching it (tests build it too)."""
    handlers = OcrPage(client, settings)
    server_status, on_upload, on_page_change, extract = (
        handlers.server_status, handlers.on_upload, handlers.on_page_change, handlers.extract)

    with gr.Blocks(title="LightOnOCR-2-1B · vLLM") as page:
        gr.Markdown("# LightOnOCR-2-1B on vLLM\nUpload a page image or a PDF; the text streams in as Markdown.")
        with gr.Row():
            status = gr.Markdown(server_status, elem_id="server-status")
            refresh = gr.Button("Refresh status", size="sm", scale=0)
        with gr.Row():
            with gr.Column(scale=1):
                upload = gr.File(label="Image or PDF", file_types=["image", ".pdf"], type="filepath",
                                 elem_id="upload")
                page_number = gr.Slider(1, 2, value=1, step=1, label="Page", visible=False, elem_id="page-picker")
                all_pages = gr.Checkbox(label=f"All pages (up to {MAX_PDF_PAGES_AT_ONCE})", visible=False)
                preview = gr.Image(label="What the model sees", interactive=False, height=360)
                with gr.Accordion("Settings", open=False):
                    max_tokens = gr.Slider(16, 8192, value=MAX_OUTPUT_TOKENS, step=16, label="Max output tokens",
                                           info=f"{MAX_OUTPUT_TOKENS} fits the densest pages; the server's max_model_len "
                                                f"must hold ~{PAGE_PROMPT_TOKENS:,} image tokens plus this",
                                           elem_id="max-tokens")
                    temperature = gr.Slider(0.0, 1.0, value=TEMPERATURE, step=0.05, label="Temperature",
                                            info=f"{TEMPERATURE} is the model's recommendation")
                    encoding = gr.Radio(["PNG", "JPEG"], value="PNG", label="Encoding sent to the server",
                                        info="PNG is lossless; JPEG is smaller for slow links")
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
        # A new file clears the previous result first, so an error never sits next to old text.
        upload.change(lambda: ("", "", ""), None, [rendered, raw, stats], queue=False)
        uploaded = upload.change(on_upload, [upload], [page_number, all_pages, preview],
                                 concurrency_limit=settings.concurrency)
        # A file the preview already refused would only raise the same message again on
        # Extract: the button waits for a file that can be read (one toast per bad upload).
        uploaded.success(lambda: gr.update(interactive=True), None, extract_button, queue=False)
        uploaded.failure(lambda: gr.update(interactive=False), None, extract_button, queue=False)
        page_number.release(on_page_change, [upload, page_number], [preview],
                            concurrency_limit=settings.concurrency)
        extract_button.click(extract, [upload, page_number, all_pages, max_tokens, temperature, encoding],
                             [rendered, raw, stats], concurrency_limit=settings.concurrency, api_name="extract")
        refresh.click(server_status, None, status)
        gr.Timer(15).tick(server_status, None, status)  # the line follows a server restart
    return page


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_server_arguments(parser, url_flag="--server-url")
    parser.add_argument("--host", default=env_default("UI_HOST", "127.0.0.1"),
                        help="interface for the page (env UI_HOST; default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=env_default("UI_PORT", 7860, int),
                        help="page port (env UI_PORT; default 7860)")
    parser.add_argument("--auth", default=env_default("UI_AUTH"),
                        help="require a login, user:password[,user2:password2] (env UI_AUTH). Needed on any "
                             f"address beyond loopback; '{exposure.OPEN_ON_PURPOSE}' serves it open on purpose")
    parser.add_argument("--tls-cert", default=env_default(tls.CERT_ENV),
                        help="serve the page over HTTPS with this certificate (env TLS_CERT; with --tls-key and the "
                             "CA that signed it in TLS_CA)")
    parser.add_argument("--tls-key", default=env_default(tls.KEY_ENV), help="the certificate's key (env TLS_KEY)")
    parser.add_argument("--max-upload-mb", type=float, default=env_default("UI_MAX_UPLOAD_MB", 50.0, float),
                        help="largest accepted upload in MB (env UI_MAX_UPLOAD_MB; default 50)")
    parser.add_argument("--concurrency", type=int, default=env_default("UI_CONCURRENCY", 16, int),
                        help="requests the page sends to vLLM at once (env UI_CONCURRENCY; default 16)")
    parser.add_argument("--timeout", type=float, default=READ_TIMEOUT_S,
                        help=f"seconds to wait for one page's answer (default {READ_TIMEOUT_S:g})")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    api_key = api_key_from_env()
    env = {**os.environ, exposure.AUTH_ENV: args.auth or "", tls.CERT_ENV: args.tls_cert or "",
           tls.KEY_ENV: args.tls_key or ""}
    decision = exposure.check("single", None, args.host, env)
    for problem in decision.problems:
        print(f"error: {problem}", file=sys.stderr)
    if decision.problems:
        return 2
    for warning in decision.warnings:
        print(warning, file=sys.stderr)
    auth = exposure.parse_auth(args.auth)
    try:
        trust = tls.client_trust(args.ca_cert)
    except tls.TlsConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    client = OcrClient(args.url, api_key=api_key, model=args.model, read_timeout=args.timeout, trust=trust)
    max_bytes = int(args.max_upload_mb * 1024 * 1024)
    page = build_ui(client, PageSettings(max_upload_bytes=max_bytes, concurrency=args.concurrency))
    page.queue(default_concurrency_limit=args.concurrency, max_size=256)
    https = {}
    if args.tls_cert:
        # Gradio checks its own URL once at start; it verifies it against the CA (never turned off).
        https = {"ssl_certfile": args.tls_cert, "ssl_keyfile": args.tls_key,
                 "ssl_verify": ssl.create_default_context(cafile=env[tls.CA_ENV])}
    page.launch(server_name=args.host, server_port=args.port, auth=auth, max_file_size=max_bytes,
                show_error=False, footer_links=[], allowed_paths=[str(Path(__file__).parent / "samples")], **https)
    return 0


if __name__ == "__main__":
    sys.exit(main())
