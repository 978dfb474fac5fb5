"""The document API: Mistral-OCR-compatible `POST /v1/ocr` in front of the bundle's OCR server.

    python -m ocr_bundle.api                               # API on 127.0.0.1:8090, server at VLLM_URL
    VLLM_API_KEY=s3cret python -m ocr_bundle.api --host 0.0.0.0 --url https://gpu-box:8000 --ca-cert ca.pem

start_optimized.sh runs it beside the page (OCR_API=off turns it off). Precedence: flags >
environment (OCR_API_HOST, OCR_API_PORT, OCR_API_CONCURRENCY, OCR_API_RENDER_WORKERS,
OCR_API_MAX_PAGES, OCR_API_MAX_MB, OCR_API_FETCH, OCR_API_MAX_TOKENS, OCR_API_MAX_ATTEMPTS,
OCR_API_TEMPERATURE, OCR_API_SERVER_WAIT, VLLM_URL, VLLM_API_KEY, VLLM_CA_CERT, TLS_CERT,
TLS_KEY, TLS_CA) > defaults. The key is the OCR server's own (VLLM_API_KEY, from the environment
only) and every route but /health asks for it; with TLS_CERT/TLS_KEY the API serves HTTPS. Beyond
loopback it refuses to start without a key (ALLOW_OPEN_API=1 to mean it) and without HTTPS
(ALLOW_PLAINTEXT=1), as the start script does for the server.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys

from .. import exposure, tls
from ..batch.options import BatchOptions
from ..batch.render_pool import RenderPool
from ..client import OcrClient
from ..settings import (MAX_OUTPUT_TOKENS, READ_TIMEOUT_S, add_server_arguments, api_key_from_env, env_default,
                        number_at_least_zero, port_number, positive_int, positive_number)
from .documents import Limits
from .fair import FairSlots
from .service import DEFAULT_SERVER_WAIT_S, DocumentService

DEFAULT_PORT = 8090  # beside vLLM's 8000, the head's server on 8001 and the page's 7860
DEFAULT_CONCURRENCY = BatchOptions.concurrency  # pages at the OCR server at once, all requests together


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m ocr_bundle.api", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_server_arguments(parser)
    parser.add_argument("--host", default=env_default("OCR_API_HOST", "127.0.0.1"),
                        help="interface to serve on (env OCR_API_HOST; default 127.0.0.1)")
    parser.add_argument("--port", type=port_number, default=env_default("OCR_API_PORT", DEFAULT_PORT, port_number),
                        help=f"port (env OCR_API_PORT; default {DEFAULT_PORT})")
    parser.add_argument("--concurrency", type=positive_int,
                        default=env_default("OCR_API_CONCURRENCY", DEFAULT_CONCURRENCY, positive_int),
                        help="pages at the OCR server at once, shared fairly by all requests (env OCR_API_CONCURRENCY;"
                             f" default {DEFAULT_CONCURRENCY})")
    parser.add_argument("--render-workers", type=positive_int,
                        default=env_default("OCR_API_RENDER_WORKERS", max(1, min(4, (os.cpu_count() or 2) - 1)),
                                            positive_int),
                        help="processes rendering pages (env OCR_API_RENDER_WORKERS; default: CPUs - 1, at most 4)")
    parser.add_argument("--server-wait", type=number_at_least_zero,
                        default=env_default("OCR_API_SERVER_WAIT", DEFAULT_SERVER_WAIT_S, number_at_least_zero),
                        help="seconds a request waits out an OCR server that is away before answering 503 (env "
                             f"OCR_API_SERVER_WAIT; default {DEFAULT_SERVER_WAIT_S:g})")
    parser.add_argument("--max-tokens", type=positive_int,
                        default=env_default("OCR_API_MAX_TOKENS", MAX_OUTPUT_TOKENS, positive_int),
                        help=f"output tokens per page (env OCR_API_MAX_TOKENS; default {MAX_OUTPUT_TOKENS}); a page cut "
                             "there is retried hotter and flagged, as in the converter")
    parser.add_argument("--max-attempts", type=positive_int,
                        default=env_default("OCR_API_MAX_ATTEMPTS", BatchOptions.max_attempts, positive_int),
                        help="tries per page while the reply is cut, loops or does not parse, each hotter (env "
                             f"OCR_API_MAX_ATTEMPTS; default {BatchOptions.max_attempts}, as the converter)")
    parser.add_argument("--temperature", type=number_at_least_zero,
                        default=env_default("OCR_API_TEMPERATURE", None, number_at_least_zero),
                        help="first attempt's temperature (env OCR_API_TEMPERATURE; default: the served family's)")
    parser.add_argument("--timeout", type=positive_number, default=READ_TIMEOUT_S,
                        help=f"seconds to wait for one page's answer (default {READ_TIMEOUT_S:g})")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    decision = exposure.check("single", args.host, None, os.environ)
    for problem in decision.problems:
        print(f"error: {problem}".replace("the vLLM API", "the document API"), file=sys.stderr)
    if decision.problems:
        return 2
    try:
        trust = tls.client_trust(args.ca_cert)
    except tls.TlsConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    import uvicorn

    from .app import build_app

    key = api_key_from_env()
    client = OcrClient(args.url, api_key=key, model=args.model, read_timeout=args.timeout, trust=trust)
    with RenderPool(args.render_workers) as pool:
        service = DocumentService(client, pool, FairSlots(args.concurrency), Limits.from_env(),
                                  BatchOptions(max_attempts=args.max_attempts), max_tokens=args.max_tokens,
                                  temperature=args.temperature,
                                  server_wait_s=args.server_wait)
        https = {}
        if tls.serving():
            https = {"ssl_certfile": os.environ[tls.CERT_ENV], "ssl_keyfile": os.environ[tls.KEY_ENV]}
        print(f"[ocr-api] POST /v1/ocr on {tls.scheme()}://{exposure.url_host(exposure.local_address(args.host))}:"
              f"{args.port}, reading through {args.url} ({args.concurrency} pages at once, "
              f"{args.render_workers} render worker(s); key {'required' if key else 'none'})", flush=True)
        try:
            uvicorn.run(build_app(service, key), host=args.host, port=args.port, log_level="warning",
                        timeout_graceful_shutdown=5, **https)
        finally:
            shutil.rmtree(service.spool, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
