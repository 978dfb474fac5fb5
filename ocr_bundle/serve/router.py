"""The one endpoint in front of every machine's server: vLLM's own router, vllm-router.

Each machine runs its own complete vLLM server (all its GPUs, data parallel); the head also
runs this router on PORT, and servers join and leave it at run time (membership.py). A node
lost under load costs only its in-flight requests, and the router retries those on another
server: no client sees the loss, no restart of the others is needed.

The failover settings, and why (the router's defaults in brackets):

    --policy round_robin            [cache_aware] every OCR request costs about the same (one
                                    page image, no shared prefix: prefix caching is off), so an
                                    even split is the right one; cache_aware keeps choosing a dead
                                    server until its breaker opens (seen on this bundle's tests)
    --retry-max-retries 5           a request that fails on a lost server (reset, refused, 5xx) is
                                    sent again, round robin picks another server; non-streamed
                                    requests only: a stream already started is not replayed
    --cb-failure-threshold 3        [10] three failures in a row take a server out of rotation
    --cb-timeout-duration-secs 15   [60] then one trial request every 15 s brings it back
    --health-check-interval-secs 5  [60] /health every 5 s, 2 failures mark a server down and
    --health-failure-threshold 2    [3]  1 success marks it up: a restarted server takes work
    --health-success-threshold 1         again within ~5 s of answering
    --request-timeout-secs 300      [1800] the worst page: 4,096 tokens (MAX_OUTPUT_TOKENS) at
                                    ~29 tokens/s per sequence, which is what one H200 gives each of
                                    256 concurrent pages at saturation (7.4 pages/s x 1,000 tokens
                                    / 256), is 141 s, plus a queue wait of the same order. A host
                                    that vanishes without a reset holds its requests this long,
                                    then they are retried elsewhere. ROUTER_REQUEST_TIMEOUT
                                    changes it (slower GPUs, CPU serving).
    --worker-startup-timeout-secs 30 [600] a server joins only once it answers /health and has
                                    read its warm-up page, so registration need not wait long

The key: clients must send VLLM_API_KEY, and the router sends the same key to the servers.
It is read from the environment and handed to the router inside this process, never on a
command line (`ps` shows command lines to every user).

    python -m ocr_bundle.serve.router --host 0.0.0.0 --port 8000        # with the Python that has vllm-router

Standard library only at import; vllm_router is imported when the router starts.
"""

from __future__ import annotations

import argparse
import os
import sys

from ocr_bundle.settings import ROUTER_METRICS_PORT, env_default

DEFAULT_REQUEST_TIMEOUT_S = 300

FAILOVER = [
    "--policy", "round_robin",
    "--retry-max-retries", "5",
    "--cb-failure-threshold", "3",
    "--cb-timeout-duration-secs", "15",
    "--health-check-interval-secs", "5",
    "--health-check-timeout-secs", "5",
    "--health-failure-threshold", "2",
    "--health-success-threshold", "1",
    "--worker-startup-timeout-secs", "30",
    "--worker-startup-check-interval", "1",
]


def router_arguments(host: str, port: int, metrics_port: int, request_timeout_s: int) -> list[str]:
    """vllm-router's command-line arguments, the key excepted."""
    return ["--host", host, "--port", str(port), *FAILOVER,
            "--request-timeout-secs", str(request_timeout_s),
            # Its Prometheus metrics (retries, breaker transitions, requests per server) stay on
            # this machine: the stress test reads them here.
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port)]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="Run vllm-router with the bundle's failover settings "
                                                 "(VLLM_API_KEY from the environment).")
    parser.add_argument("--host", default=env_default("HOST", "127.0.0.1"))
    parser.add_argument("--port", type=int, default=env_default("PORT", 8000, int))
    parser.add_argument("--metrics-port", type=int, default=env_default("ROUTER_METRICS_PORT", ROUTER_METRICS_PORT, int),
                        help=f"its Prometheus metrics on 127.0.0.1 (env ROUTER_METRICS_PORT; default "
                             f"{ROUTER_METRICS_PORT})")
    parser.add_argument("--request-timeout", type=int,
                        default=env_default("ROUTER_REQUEST_TIMEOUT", DEFAULT_REQUEST_TIMEOUT_S, int),
                        help=f"seconds before the router gives up on a server's answer and retries elsewhere (env "
                             f"ROUTER_REQUEST_TIMEOUT; default {DEFAULT_REQUEST_TIMEOUT_S}: the worst page, see above)")
    parser.add_argument("--dry-run", action="store_true", help="print the router's arguments, start nothing")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    arguments = router_arguments(args.host, args.port, args.metrics_port, args.request_timeout)
    key = os.environ.get("VLLM_API_KEY")
    print(f"[router] vllm-router {' '.join(arguments)}{' --api-key <VLLM_API_KEY>' if key else ''}", flush=True)
    if args.dry_run:
        return 0
    try:
        from vllm_router.launch_router import main as launch_router
    except ImportError as exc:
        print(f"error: vllm-router cannot be imported by this Python ({exc}): pip install -r requirements.txt",
              file=sys.stderr)
        return 2
    # The router parses sys.argv; /proc/PID/cmdline keeps the command this process was started with.
    sys.argv = ["vllm-router", *arguments, *(["--api-key", key] if key else [])]
    launch_router()
    return 0


if __name__ == "__main__":
    sys.exit(main())
