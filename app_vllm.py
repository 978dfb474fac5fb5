#!/usr/bin/env python3
"""Gradio page for LightOnOCR-2-1B served by vLLM: upload an image or a PDF, read the text.

    python app_vllm.py                                   # server at http://127.0.0.1:8000, page on :7860
    VLLM_API_KEY=s3cret UI_AUTH=alice:pw python app_vllm.py --server-url https://gpu-box:8000 --ca-cert ca.pem

Precedence: flags > environment (VLLM_URL, VLLM_MODEL, VLLM_API_KEY, VLLM_CA_CERT, UI_HOST,
UI_PORT, UI_MAX_UPLOAD_MB, UI_CONCURRENCY, OCR_API_URL, TLS_CERT, TLS_KEY, TLS_CA) > defaults. The login,
UI_AUTH=user:password[,user2:password2], comes from the environment only (a flag would show the
password to every user: ps). With TLS_CERT/TLS_KEY the page serves HTTPS (TLS_CA: the CA that
signed them) and its login cookie is Secure only; beyond loopback it refuses plain HTTP unless
ALLOW_PLAINTEXT=1. Failed logins from one address are slowed down (ocr_bundle/page_guard.py).
The page only talks HTTP to the vLLM server; it never loads the model. Pages are prepared
here, once per click (EXIF orientation, RGB, longest edge 1540 px, PNG), so the server receives
what the model was trained on. Every failure becomes a message on the page, never a stack trace.
"""

from __future__ import annotations

import argparse
import os
import ssl
import sys
from pathlib import Path

from starlette.middleware import Middleware

from ocr_bundle import exposure, tls
from ocr_bundle.api.documents import Limits
from ocr_bundle.api.remote import DocumentApi
from ocr_bundle.client import OcrClient
from ocr_bundle.images import MAX_PDF_PAGES_AT_ONCE
from ocr_bundle.page import PageSettings, build_ui
from ocr_bundle.page_guard import PageGuard
from ocr_bundle.settings import (READ_TIMEOUT_S, add_server_arguments, api_key_from_env, env_default, port_number,
                                 positive_int, positive_number, refuse_secret_on_command_line)

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_server_arguments(parser, url_flag="--server-url")
    parser.add_argument("--host", default=env_default("UI_HOST", "127.0.0.1"),
                        help="interface for the page (env UI_HOST; default 127.0.0.1)")
    parser.add_argument("--port", type=port_number, default=env_default("UI_PORT", 7860, port_number),
                        help="page port (env UI_PORT; default 7860)")
    # The login holds passwords: from the environment only (UI_AUTH), like the key.
    refuse_secret_on_command_line(parser, "--auth", exposure.AUTH_ENV)
    parser.add_argument("--tls-cert", default=env_default(tls.CERT_ENV),
                        help="serve the page over HTTPS with this certificate (env TLS_CERT; with --tls-key and the "
                             "CA that signed it in TLS_CA)")
    parser.add_argument("--tls-key", default=env_default(tls.KEY_ENV), help="the certificate's key (env TLS_KEY)")
    parser.add_argument("--max-upload-mb", type=positive_number,
                        default=env_default("UI_MAX_UPLOAD_MB", 50.0, positive_number),
                        help="largest accepted upload in MB (env UI_MAX_UPLOAD_MB; default 50)")
    parser.add_argument("--concurrency", type=positive_int, default=env_default("UI_CONCURRENCY", 16, positive_int),
                        help="requests the page sends to vLLM at once (env UI_CONCURRENCY; default 16)")
    parser.add_argument("--document-api-url", default=env_default("OCR_API_URL"),
                        help="the document API (python -m ocr_bundle.api) that reads \"All pages\" of a PDF (env "
                             "OCR_API_URL; start_optimized.sh sets it; default: none, the page reads them itself, "
                             f"up to {MAX_PDF_PAGES_AT_ONCE})")
    parser.add_argument("--timeout", type=positive_number, default=READ_TIMEOUT_S,
                        help=f"seconds to wait for one page's answer (default {READ_TIMEOUT_S:g})")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    api_key = api_key_from_env()
    env = {**os.environ, tls.CERT_ENV: args.tls_cert or "", tls.KEY_ENV: args.tls_key or ""}
    decision = exposure.check("single", None, args.host, env)
    for problem in decision.problems:
        print(f"error: {problem}", file=sys.stderr)
    if decision.problems:
        return 2
    for warning in decision.warnings:
        print(warning, file=sys.stderr)
    auth = exposure.parse_auth(env.get(exposure.AUTH_ENV))
    try:
        trust = tls.client_trust(args.ca_cert)
    except tls.TlsConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    client = OcrClient(args.url, api_key=api_key, model=args.model, read_timeout=args.timeout, trust=trust)
    max_bytes = int(args.max_upload_mb * 1024 * 1024)
    document_api = DocumentApi(args.document_api_url, api_key, trust) if args.document_api_url else None
    page = build_ui(client, PageSettings(max_upload_bytes=max_bytes, concurrency=args.concurrency,
                                         document_api=document_api, document_api_max_pages=Limits.from_env().max_pages))
    page.queue(default_concurrency_limit=args.concurrency, max_size=256)
    https = {}
    if args.tls_cert:
        # Gradio checks its own URL once at start; it verifies it against the CA (never turned off).
        https = {"ssl_certfile": args.tls_cert, "ssl_keyfile": args.tls_key,
                 "ssl_verify": ssl.create_default_context(cafile=env[tls.CA_ENV])}
    # Around every route: over HTTPS no cookie without Secure, and password guessing slowed (page_guard.py).
    guard = Middleware(PageGuard, https=bool(args.tls_cert))
    page.launch(server_name=args.host, server_port=args.port, auth=auth, max_file_size=max_bytes,
                show_error=False, footer_links=[], allowed_paths=[str(Path(__file__).parent / "samples")],
                app_kwargs={"middleware": [guard]}, **https)
    return 0


if __name__ == "__main__":
    sys.exit(main())
