"""The one endpoint in front of every machine's server: SMG, the gateway that checks keys.

Each machine runs its own complete vLLM server (all its GPUs, data parallel); the head also
runs this gateway on PORT (`ROUTER=on`), and servers join and leave its pool at run time
through its admin API (membership.py). SMG (PyPI `smg`, the Shepherd Model Gateway, successor
of the SGLang and vLLM routers) checks the keys itself:

- clients send VLLM_API_KEY; without it, or with another one, the gateway answers 401 and no
  server sees the request. The gateway sends the same key on to the servers, each of which
  requires it on every route (route_keys.py), so a server cannot be used around the gateway.
- the pool (`/workers`: list, add, replace, remove) needs ROUTER_ADMIN_KEY, a key of its own,
  which joining machines hold and clients never do: the client key is refused there.
- open without a key: a short list of health and information routes, each for a reason
  (gateway_doors.OPEN_WHY), none of which runs OCR or changes the pool; everything else is 401 or
  404. The table of every route SMG has and its door is read out of the installed SMG itself
  (scripts/smg_doors.py → smg_doors.json), and tests/test_gateway.py tries each on the running gateway.

The failover settings, and why (SMG's defaults in brackets):

    --policy round_robin            [cache_aware] every OCR request costs about the same (one
                                    page image, no shared prefix: prefix caching is off), so an
                                    even split is the right one
    --retry-max-retries 5           a request that fails on a lost server (reset, refused, 5xx) is
                                    sent again, round robin picks another server; non-streamed
                                    requests only: a stream already started is not replayed
    --cb-failure-threshold 3        three failures in a row take a server out of rotation
    --cb-timeout-duration-secs 15   then one trial request every 15 s brings it back
    --health-check-interval-secs 5  /health every 5 s, 2 failures mark a server down and
    --health-failure-threshold 2    1 success marks it up: a restarted server takes work
    --health-success-threshold 1    again within ~5 s of answering
    --request-timeout-secs 300      the worst page: 4,096 tokens (MAX_OUTPUT_TOKENS) at ~29
                                    tokens/s per sequence, which is what one H200 gives each of
                                    256 concurrent pages at saturation (7.4 pages/s x 1,000 tokens
                                    / 256), is 141 s, plus a queue wait of the same order. A host
                                    that vanishes without a reset holds its requests this long,
                                    then they are retried elsewhere. ROUTER_REQUEST_TIMEOUT
                                    changes it (slower GPUs, CPU serving).
    --worker-startup-timeout-secs 30 a server joins only once it answers /health and has read
                                    its warm-up page, so adding it need not wait long

The keys are read from the environment and handed to SMG inside this process, never on a
command line (`ps` shows command lines to every user); SMG renames the process `smg::router`.

With TLS_CERT, TLS_KEY and TLS_CA (ocr_bundle.tls) the gateway serves HTTPS with that
certificate (plain HTTP to it gets a TLS alert, no answer), verifies every server against
TLS_CA and presents the same certificate to them as its client certificate: the servers
behind it require one signed by the cluster's CA, so nobody else can use them directly.

    python -m ocr_bundle.serve.gateway --host 0.0.0.0 --port 8000        # with the Python that has smg

Standard library only at import; smg is imported when the gateway starts.
"""

from __future__ import annotations

import argparse
import os
import sys

from ocr_bundle import tls
from ocr_bundle.exposure import ADMIN_KEY_ENV, KEY_ENV
from ocr_bundle.settings import ROUTER_METRICS_PORT, env_default, port_number, positive_int

DEFAULT_REQUEST_TIMEOUT_S = 300
ADMIN_KEY_ID = "bundle-admin"  # SMG's control-plane key entry: id:name:role:key

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


def gateway_arguments(host: str, port: int, metrics_port: int, request_timeout_s: int) -> list[str]:
    """SMG's command-line arguments, the keys excepted."""
    return ["--host", host, "--port", str(port), *FAILOVER,
            "--request-timeout-secs", str(request_timeout_s),
            # Its Prometheus metrics (requests, retries, breaker and health per server) stay on this
            # machine: the stress test reads them here.
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port)]


def tls_arguments(cert: str | None, key: str | None, ca: str | None) -> list[str]:
    """HTTPS for clients, verification of the servers, and the client certificate the servers require."""
    if not cert:
        return []
    return ["--tls-cert-path", cert, "--tls-key-path", key or "", "--ca-cert-paths", ca or "",
            "--client-cert-path", cert, "--client-key-path", key or ""]


def key_arguments(key: str | None, admin_key: str) -> list[str]:
    """The keys as SMG's parser takes them: parsed in this process, never an argv."""
    return [*(["--api-key", key] if key else []),
            "--control-plane-api-keys", f"{ADMIN_KEY_ID}:bundle admin:admin:{admin_key}"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=f"Run SMG with the bundle's failover settings ({KEY_ENV} and "
                                                 f"{ADMIN_KEY_ENV} from the environment).")
    parser.add_argument("--host", default=env_default("HOST", "127.0.0.1"))
    parser.add_argument("--port", type=port_number, default=env_default("PORT", 8000, port_number))
    parser.add_argument("--metrics-port", type=port_number,
                        default=env_default("ROUTER_METRICS_PORT", ROUTER_METRICS_PORT, port_number),
                        help=f"its Prometheus metrics on 127.0.0.1 (env ROUTER_METRICS_PORT; default "
                             f"{ROUTER_METRICS_PORT})")
    parser.add_argument("--request-timeout", type=positive_int,
                        default=env_default("ROUTER_REQUEST_TIMEOUT", DEFAULT_REQUEST_TIMEOUT_S, positive_int),
                        help=f"seconds before the gateway gives up on a server's answer and retries elsewhere (env "
                             f"ROUTER_REQUEST_TIMEOUT; default {DEFAULT_REQUEST_TIMEOUT_S}: the worst page, see above)")
    parser.add_argument("--dry-run", action="store_true", help="print the gateway's arguments, start nothing")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    arguments = gateway_arguments(args.host, args.port, args.metrics_port, args.request_timeout)
    cert, cert_key, ca = (os.environ.get(name) or None for name in (tls.CERT_ENV, tls.KEY_ENV, tls.CA_ENV))
    arguments += tls_arguments(cert, cert_key, ca)
    problems, _ = tls.certificate_problems(cert, cert_key, ca, ["127.0.0.1"])
    if problems:
        print("\n".join(f"error: {problem}" for problem in problems), file=sys.stderr)
        return 2
    key, admin_key = os.environ.get(KEY_ENV) or None, os.environ.get(ADMIN_KEY_ENV) or None
    print(f"[gateway] smg {' '.join(arguments)}{' --api-key <' + KEY_ENV + '>' if key else ''} "
          f"--control-plane-api-keys '{ADMIN_KEY_ID}:bundle admin:admin:<{ADMIN_KEY_ENV}>'", flush=True)
    if not admin_key:
        print(f"error: {ADMIN_KEY_ENV} is not set: the gateway's pool would be open to anyone", file=sys.stderr)
        return 2
    if args.dry_run:
        return 0
    try:
        from smg.launch_router import launch_router, parse_router_args
    except ImportError as exc:
        print(f"error: smg cannot be imported by this Python ({exc}): pip install -r requirements.txt",
              file=sys.stderr)
        return 2
    launch_router(parse_router_args([*arguments, *key_arguments(key, admin_key)]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
