#!/usr/bin/env python3
"""Threaded stress test for LightOnOCR-2-1B on vLLM: throughput, latency, GPU memory, KV cache.

    python stress_test.py                                        # samples, concurrency 1,2,4, 8 requests each
    python stress_test.py --images pages/ --concurrency 1,4,16,64 --requests 64 --out reports/h200
    python stress_test.py --ignore-eos --max-tokens 1000         # fixed output length: repeatable timing
    python stress_test.py --compare reports/before/results.json  # before/after table with ratios
    python stress_test.py --concurrency 256 --requests 1024 --ramp 40 ...  # the rate with every slot busy
    CUDA_VISIBLE_DEVICES=0,1 python stress_test.py ...           # memory of GPUs 0 and 1 only (or --gpus 0,1)

Each image (or PDF page) is prepared and encoded once, into the exact request body every
request reuses; one HTTP session per worker thread. GPU memory is sampled in the
background (NVML, else nvidia-smi, else n/a) together with vLLM's /metrics (KV-cache
usage, running/waiting requests). Reports: a table on stdout, results.json, report.md
and plot.png in --out (the numbers are written first: a plot that fails is a warning).
Ctrl-C stops the level: no new requests, those in flight get --grace seconds, and the
report is written, marked interrupted; a second Ctrl-C exits at once. Exit status: 0 ok;
1 error rate above --max-error-rate; 2 the run could not start (bad arguments, server
unreachable, no usable image); 130 interrupted.

Precedence: flags > environment (VLLM_URL, VLLM_API_KEY, VLLM_MODEL) > defaults.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import platform
import socket
import sys
import threading
import time
import warnings
from functools import partial
from pathlib import Path

from ocr_bundle.client import ServerUnusable, connect
from ocr_bundle.interrupts import GracefulInterrupt
from ocr_bundle.loadtest.pollers import (
    GpuInfo,
    PeriodicPoller,
    ServerMetrics,
    counter_delta,
    devices_in_use,
    gateway_counters,
    open_gpu_probe,
    per_server_stats,
)
from ocr_bundle.loadtest.replay import Replayer, Workload, calculate_metrics, load_workloads
from ocr_bundle.loadtest.sustained import sustained_rate
from ocr_bundle.loadtest.report import aligned_table, client_verdict, compare, write_reports
from ocr_bundle.progress import progress_bar
from ocr_bundle.samples import find_images
from ocr_bundle.settings import (
    DEFAULT_ROUTER_METRICS_URL,
    READ_TIMEOUT_S,
    TEMPERATURE,
    TOP_P,
    add_server_arguments,
    api_key_from_env,
    env_default,
    fraction,
    int_at_least_zero,
    number_at_least_zero,
    positive_fraction,
    positive_int,
    positive_number,
)


def concurrency_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of integers: {text!r}") from exc
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError("concurrency levels must be integers >= 1")
    return values


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_server_arguments(parser)
    parser.add_argument("--images", nargs="+", metavar="PATH",
                        help="image/PDF files or folders (default: the bundled sample pages)")
    parser.add_argument("--concurrency", type=concurrency_list, default=[1, 2, 4],
                        help="comma-separated levels (default 1,2,4)")
    parser.add_argument("--requests", type=positive_int, default=8, help="requests per level (default 8)")
    parser.add_argument("--requests-per-concurrency", type=number_at_least_zero, default=0.0,
                        help="at least this many requests per unit of concurrency (e.g. 2 → 128 at 64); "
                             "default 0: --requests only")
    parser.add_argument("--ramp", type=number_at_least_zero, default=0.0, metavar="SECONDS",
                        help="spread each level's first sends over this many seconds (about one page's latency) "
                             "and report the sustained pages/s: every slot busy, arrivals spread, no drain (it opens a page's "
                             "latency after the ramp: give it ~4x the concurrency in requests); "
                             "identical pages sent at once are answered in waves (default 0: all at once)")
    parser.add_argument("--warmup", type=int_at_least_zero, default=2,
                        help="unmeasured requests before the first level (default 2)")
    parser.add_argument("--max-tokens", type=positive_int, default=1024, help="max_tokens per request (default 1024)")
    parser.add_argument("--temperature", type=number_at_least_zero,
                        help=f"default: the model family's ({TEMPERATURE}; 3-1B 0.1)")
    parser.add_argument("--top-p", type=positive_fraction,
                        help=f"top_p (default: the model family's, {TOP_P}; 3-1B 1.0)")
    parser.add_argument("--grounding", action="store_true", help="LightOnOCR-3's grounding requests (layout blocks)")
    parser.add_argument("--ignore-eos", action="store_true",
                        help="generate exactly --max-tokens tokens per page (vLLM extension): repeatable timing")
    parser.add_argument("--stream", action=argparse.BooleanOptionalAction, default=True,
                        help="stream answers to measure time to first token (default on)")
    parser.add_argument("--encoding", choices=("PNG", "JPEG"), default="PNG", help="page encoding sent (default PNG)")
    parser.add_argument("--raw", action="store_true",
                        help="send files as they are (no resize/re-encode): measures the server's own image handling")
    parser.add_argument("--timeout", type=positive_number, default=READ_TIMEOUT_S,
                        help=f"seconds allowed per request (default {READ_TIMEOUT_S:g})")
    parser.add_argument("--sample-interval", type=positive_number, default=0.2,
                        help="seconds between GPU memory / metrics samples (default 0.2)")
    parser.add_argument("--out", type=Path, default=None,
                        help="report folder (default reports/stress-YYYYmmdd-HHMMSS)")
    parser.add_argument("--compare", type=Path, help="an earlier results.json to compare against (before vs after)")
    parser.add_argument("--label", default="", help="free text stored in the report (e.g. the server flags)")
    parser.add_argument("--max-error-rate", type=fraction, default=0.0,
                        help="exit 1 when failed/sent exceeds this fraction (default 0: any error fails)")
    parser.add_argument("--gpus", default=None,
                        help="GPU indices whose memory to measure, e.g. 0,1 (default: CUDA_VISIBLE_DEVICES, else every "
                             "GPU NVML sees; NVML counts other tenants' GPUs too)")
    parser.add_argument("--grace", type=number_at_least_zero, default=30.0,
                        help="after Ctrl-C, seconds requests in flight may take to finish (default 30)")
    parser.add_argument("--router-metrics", default=env_default("ROUTER_METRICS_URL", DEFAULT_ROUTER_METRICS_URL),
                        help="behind the head's gateway: its Prometheus metrics (retries, breaker transitions, "
                             "requests per server), read before and after each level (env ROUTER_METRICS_URL; "
                             f"default {DEFAULT_ROUTER_METRICS_URL}, the gateway's port on the head; n/a elsewhere)")
    parser.add_argument("--server-metrics", type=lambda text: [url for url in text.split(",") if url], default=[],
                        help="servers whose /metrics to read directly for per-server rows, comma-separated URLs "
                             "(behind the gateway, every server's rows come from its /engine_metrics already). "
                             "No key is sent: /metrics is open on every server")
    parser.add_argument("--quiet", action="store_true", help="no progress bar per level")
    return parser


def read_idle_memory(gpu_probe) -> float | None:
    """GPU memory in use before the load; n/a (with a warning) if the probe fails."""
    try:
        return gpu_probe()["gpu_used_mib"]
    except Exception as exc:  # the run goes on without it
        warnings.warn(f"GPU memory cannot be read ({type(exc).__name__}: {exc}): idle memory n/a", RuntimeWarning,
                      stacklevel=2)
        return None


def run_level(replayer: Replayer, workloads: list[Workload], concurrency: int, args: argparse.Namespace,
              stop: threading.Event, gpu_poller: PeriodicPoller | None, metrics_poller: PeriodicPoller) -> dict:
    """One concurrency level: the requests, with a live progress bar, and its metrics."""
    count = max(args.requests, int(args.requests_per_concurrency * concurrency))
    bar = progress_bar(count, "req", f"c={concurrency}", disable=args.quiet)
    failures = 0

    def on_result(result) -> None:
        nonlocal failures
        failures += not result.ok
        bar.set_postfix_str(f"errors={failures}", refresh=False)
        bar.update(1)

    servers: ServerMetrics = metrics_poller.probe
    read_gateway = partial(gateway_counters, args.router_metrics, tls_options=replayer.client.tls_options)
    gateway_before = read_gateway() if servers.behind_gateway else None
    start = time.monotonic()
    try:
        run = replayer.run(workloads, concurrency, count, stop, args.grace, on_result, ramp_s=args.ramp)
    finally:
        bar.close()
    end = time.monotonic()
    metrics = calculate_metrics(run.results, concurrency)
    if gpu_poller:
        window = gpu_poller.window("gpu_used_mib", start, end)
        metrics.gpu_memory = {"peak_mib": window.peak, "mean_mib": window.mean, "samples": window.samples,
                              "per_device": {}}
        for key in gpu_poller.keys():
            if key != "gpu_used_mib" and key.endswith("_used_mib"):
                device = gpu_poller.window(key, start, end)
                index = key.removesuffix("_used_mib").removeprefix("gpu")
                metrics.gpu_memory["per_device"][index] = {"peak_mib": device.peak, "mean_mib": device.mean}
    kv = metrics_poller.window("vllm:kv_cache_usage_perc", start, end)
    metrics.vllm = {
        "kv_cache_usage_peak": kv.peak,
        "kv_cache_usage_mean": kv.mean,
        "running_peak": metrics_poller.window("vllm:num_requests_running", start, end).peak,
        "waiting_peak": metrics_poller.window("vllm:num_requests_waiting", start, end).peak,
    }
    if servers.per_server:
        metrics.vllm["servers"] = per_server_stats(metrics_poller, servers.seen_servers, start, end)
    if servers.behind_gateway:
        metrics.vllm["gateway"] = counter_delta(gateway_before, read_gateway())
    level = metrics.to_dict()
    # Only a spread start has a steady stretch to measure: sent at once, identical pages come back in waves.
    level["sustained"] = sustained_rate(run.results, concurrency) if args.ramp > 0 else None
    level["window"] = {"start": start, "end": end}
    level["requests_planned"] = count
    level["cancelled"], level["abandoned"] = run.cancelled, run.abandoned
    level["results"] = [{"concurrency": concurrency, **r.__dict__} for r in run.results]
    note = f" (interrupted: {run.cancelled} never sent, {run.abandoned} abandoned in flight)" if stop.is_set() else ""
    sustained = level["sustained"]
    steady = "" if sustained is None else f"sustained {sustained['pages_per_s']:.2f} pages/s, "
    print(f"concurrency {concurrency}: {metrics.ok}/{metrics.requests} ok, {metrics.pages_per_s:.2f} pages/s, {steady}"
          f"p50 {metrics.latency_p50_s or float('nan'):.2f} s{note}", flush=True)
    return level


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    started_at = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    try:
        client, status = connect(args.url, api_key_from_env(), args.model, read_timeout=args.timeout,
                                 ca_cert=args.ca_cert)
    except ServerUnusable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    model = client.model()
    family = status.family(model)  # its sampling, unless the flags say otherwise
    args.temperature = family.temperature if args.temperature is None else args.temperature
    args.top_p = family.top_p if args.top_p is None else args.top_p
    try:
        paths = find_images(args.images)
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    prep_start = time.perf_counter()
    if args.grounding and family.grounding != "blocks":
        print(f"error: --grounding needs a LightOnOCR-3 model: {model} is {family.name}", file=sys.stderr)
        return 2
    workloads = load_workloads(paths, model, raw=args.raw, encoding=args.encoding, max_tokens=args.max_tokens,
                               temperature=args.temperature, top_p=args.top_p, stream=args.stream,
                               ignore_eos=args.ignore_eos, grounding=args.grounding)
    prep_s = time.perf_counter() - prep_start
    usable = [w for w in workloads if w.body is not None]
    for w in workloads:
        if w.body is None:
            print(f"warning: {w.error}", file=sys.stderr)
    print(f"{len(usable)} page(s) ready of {len(workloads)} input(s) in {prep_s:.2f} s "
          f"({sum(len(w.body) for w in usable) / 1e6:.1f} MB of request bodies, encoded once); "
          f"model {model} ({family.name}: temperature {args.temperature:g}, top_p {args.top_p:g}), "
          f"vLLM {status.version}, max_model_len {status.max_model_len}")
    if not workloads:
        print("error: no image to send", file=sys.stderr)
        return 2

    replayer = Replayer(client, args.max_tokens, args.stream, args.timeout)
    stop = threading.Event()

    def stop_sending() -> None:
        print(f"\nstopping: no new requests; those in flight get up to {args.grace:g} s; the report follows "
              "(Ctrl-C again to exit at once)", file=sys.stderr, flush=True)
        stop.set()

    levels, request_rows = [], []
    gpu_info, gpu_idle, memory_series = GpuInfo("none", reason="not measured"), None, {}
    with GracefulInterrupt(stop_sending, "without a report") as interrupt, contextlib.ExitStack() as running:
        gpu_probe, gpu_info = open_gpu_probe(devices=devices_in_use(args.gpus))
        if gpu_probe is not None:
            running.callback(gpu_probe.close)  # NVML shutdown, whatever happens from here
            gpu_idle = read_idle_memory(gpu_probe)
        else:
            print(f"GPU memory: n/a ({gpu_info.reason})")
        gpu_poller = running.enter_context(PeriodicPoller(
            gpu_probe, args.sample_interval if gpu_info.backend == "nvml" else max(args.sample_interval, 1.0),
            "gpu")) if gpu_probe else None
        servers = ServerMetrics(client.base_url, args.server_metrics, tls_options=client.tls_options)  # no key: metrics routes are open
        if servers.behind_gateway:
            print(f"behind a gateway: servers' metrics from {client.base_url}/engine_metrics, its counters from "
                  f"{args.router_metrics}")
        metrics_poller = running.enter_context(PeriodicPoller(servers, max(args.sample_interval, 0.25), "vllm-metrics"))
        if args.warmup > 0 and usable:
            warm = replayer.run(usable, min(args.concurrency), args.warmup, stop, args.grace).results
            failed = sum(not r.ok for r in warm)
            print(f"warm-up: {len(warm)} request(s), {failed} failed"
                  + (f" ({warm[0].error if failed == len(warm) else 'some'})" if failed else ""))
        for concurrency in args.concurrency:
            if stop.is_set():
                break
            levels.append(run_level(replayer, workloads, concurrency, args, stop, gpu_poller, metrics_poller))
            request_rows += levels[-1].pop("results")
        memory_series = ({key: gpu_poller.series(key) for key in gpu_poller.keys() if key.endswith("_used_mib")}
                         if gpu_poller else {})

    report = {
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "environment": {
            "started_at": started_at, "client_host": socket.gethostname(), "python": platform.python_version(),
            "client_cpus": os.cpu_count(), "server_url": client.base_url, "model": model,
            "vllm_version": status.version, "max_model_len": status.max_model_len,
            "gpu": {"backend": gpu_info.backend, "names": list(gpu_info.names), "total_mib": gpu_info.total_mib,
                    "devices": list(gpu_info.devices), "reason": gpu_info.reason},
            "label": args.label,
            "servers": servers.seen_servers if servers.per_server else None,
            "behind_gateway": servers.behind_gateway,
        },
        "images": [w.name for w in workloads],
        "preparation_s": prep_s,
        "gpu_idle_mib": gpu_idle,
        "levels": levels,
        "requests": request_rows,
        "gpu_memory_series": [[t, v] for t, v in memory_series.get("gpu_used_mib", [])],
        "gpu_memory_series_per_device": {key.removesuffix("_used_mib").removeprefix("gpu"): [[t, v] for t, v in series]
                                         for key, series in memory_series.items() if key != "gpu_used_mib"},
        "interrupted": interrupt.interrupted,
    }
    if args.compare:
        try:
            report["comparison"] = compare(json.loads(args.compare.read_text()), report)
        except (OSError, ValueError, KeyError) as exc:
            print(f"warning: cannot compare with {args.compare}: {exc}", file=sys.stderr)
    out = args.out or Path("reports") / f"stress-{dt.datetime.now():%Y%m%d-%H%M%S}"
    paths = write_reports(report, memory_series, out)

    print()
    print(aligned_table(report))
    print()
    print(client_verdict(report))
    if report.get("comparison"):
        print("\n" + report["comparison"])
    sent = sum(level["requests"] for level in levels)
    failed = sum(level["errors"] for level in levels)
    for level in levels:
        for message, n in level["errors_by_message"].items():
            print(f"  c={level['concurrency']}: {n} × {message}")
    print("\nreports: " + ", ".join(str(p) for p in paths.values()))
    if interrupt.interrupted:
        print("interrupted: the report covers the requests that finished", file=sys.stderr)
        return interrupt.exit_code
    rate = failed / sent if sent else 1.0
    if rate > args.max_error_rate:
        print(f"FAILED: {failed} of {sent} requests failed ({rate:.1%} > --max-error-rate {args.max_error_rate:.1%})",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
