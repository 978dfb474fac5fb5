"""A page through every engine before the start script says the server is ready.

    python -m ocr_bundle.serve.warmup [--url http://127.0.0.1:8000] [--image PATH] [--timeout S]
    (with TLS_CERT, TLS_KEY, TLS_CA in the environment: over HTTPS, presenting this machine's certificate)

A fresh engine's first page pays one-time costs: on a GPU, the vision encoder's
torch.compile (15-44 s on an H200, when the launcher turns it on: ocr_bundle.serve.tuning), plus
kernel selection and memory pools. /health answers long before that. One page per engine
(vLLM's data-parallel replicas, counted from /metrics), all at once so the load balancer
spreads them, with one output token each, pays those costs here instead of in a user's first
page. Prints one line; exits 1 with the server's reason when a page fails.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

from .. import tls
from ..client import OcrClient, OcrError, build_chat_request
from ..images import prepare_image_bytes
from ..loadtest.pollers import engine_count
from ..samples import sample_path
from ..settings import READ_TIMEOUT_S, positive_number

WARMUP_PAGE = sample_path("english_a4_document.png")  # a full A4 page: the encoder's usual shape


def engines_of(client: OcrClient) -> int:
    try:
        response = requests.get(f"{client.base_url}/metrics", timeout=10, **client.tls_options)
    except requests.RequestException:
        return 1
    return engine_count(response.text) if response.status_code == 200 else 1


def warm_up(client: OcrClient, image: Path = WARMUP_PAGE, engines: int | None = None) -> tuple[int, float]:
    """Send `engines` pages at once (default: as many as the server has engines); returns
    (pages, seconds). Raises OcrError if any page fails."""
    engines = engines or engines_of(client)
    body = json.dumps(build_chat_request(client.model(), prepare_image_bytes(image.read_bytes()).data_url,
                                         max_tokens=1, stream=False)).encode()
    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=engines) as pool:
        list(pool.map(lambda _: client.complete_body(body, max_tokens=1), range(engines)))  # re-raises a failure
    return engines, time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default=None, help="the vLLM server (env VLLM_URL; default http://127.0.0.1:8000)")
    parser.add_argument("--image", type=Path, default=WARMUP_PAGE)
    parser.add_argument("--timeout", type=positive_number, default=READ_TIMEOUT_S,
                        help=f"seconds per page (default {READ_TIMEOUT_S:g})")
    args = parser.parse_args(argv)
    # The start script's own check: this machine's TLS (TLS_CA, and its certificate, which a server
    # behind a gateway requires of every client).
    client = OcrClient(args.url, read_timeout=args.timeout, trust=tls.machine_trust())
    try:
        pages, seconds = warm_up(client, args.image)
    except (OcrError, OSError) as exc:
        print(f"warm-up page failed: {exc}", file=sys.stderr)
        return 1
    print(f"warm-up: {pages} page{'s' if pages > 1 else ''} (one per engine) in {seconds:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
