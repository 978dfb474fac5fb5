"""Stress-test reports: aligned table, JSON, Markdown, PNG plot, before/after comparison.

All of them are rendered from the same report dict (what the JSON file holds), so the
numbers always agree, and a saved JSON can be re-rendered or compared later.
"""

from __future__ import annotations

import warnings
from pathlib import Path

from ..files import atomic_write_json, atomic_write_text
from ..headroom import headroom_verdict
from ..tables import aligned
from ..tables import markdown as markdown_table

Series = dict[str, list[tuple[float, float]]]  # "gpu_used_mib" (all devices), "gpu0_used_mib", ...

# (key in level metrics, column title, format)
COLUMNS = [
    ("concurrency", "conc", "{:d}"),
    ("requests", "reqs", "{:d}"),
    ("errors", "errors", "{:d}"),
    ("pages_per_s", "pages/s", "{:.2f}"),
    ("sustained.pages_per_s", "sustained pages/s", "{:.2f}"),  # with --ramp only
    ("output_tokens_per_s", "out tok/s", "{:,.0f}"),
    ("latency_mean_s", "lat mean s", "{:.2f}"),
    ("latency_p50_s", "p50 s", "{:.2f}"),
    ("latency_p90_s", "p90 s", "{:.2f}"),
    ("latency_p99_s", "p99 s", "{:.2f}"),
    ("ttft_p50_s", "TTFT p50 s", "{:.2f}"),
    ("ttft_p99_s", "TTFT p99 s", "{:.2f}"),
    ("gpu_memory.peak_mib", "GPU peak MiB", "{:,.0f}"),
    ("gpu_memory.mean_mib", "GPU mean MiB", "{:,.0f}"),
    ("vllm.kv_cache_usage_peak", "KV peak %", "{:.1%}"),
    ("vllm.running_peak", "run peak", "{:.0f}"),
    ("vllm.waiting_peak", "wait peak", "{:.0f}"),
]


def lookup(level: dict, dotted: str):
    value = level
    for part in dotted.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def fmt(value, spec: str) -> str:
    if value is None:
        return "n/a"
    try:
        return spec.format(value)
    except (ValueError, TypeError):
        return str(value)


def rows(report: dict) -> tuple[list[str], list[list[str]]]:
    header = [title for _, title, _ in COLUMNS]
    body = [[fmt(lookup(level, key), spec) for key, _, spec in COLUMNS] for level in report["levels"]]
    return header, body


def aligned_table(report: dict) -> str:
    return aligned(*rows(report))


def client_verdict(report: dict) -> str:
    """Could the client have limited the measured rate?"""
    lines = []
    for level in report["levels"]:
        capacity, measured = level.get("client_max_pages_per_s"), level.get("pages_per_s") or 0
        if capacity is None or measured <= 0:
            continue
        lines.append(f"- concurrency {level['concurrency']}: client CPU {level['client_cpu_per_request_s'] * 1000:.1f} ms "
                     f"per request (one core): {headroom_verdict(capacity, measured, remedy='--no-stream')}")
    return "\n".join(lines)


def markdown_report(report: dict) -> str:
    env, args = report["environment"], report["args"]
    gpu = env.get("gpu") or {}
    parts = [
        f"# Stress test — {env.get('model')}" + (" (INTERRUPTED)" if report.get("interrupted") else ""),
        "",
        f"- When: {env.get('started_at')}; server {env.get('server_url')} (vLLM {env.get('vllm_version')}, "
        f"max_model_len {env.get('max_model_len')})",
        f"- GPU: {', '.join(gpu.get('names') or []) or 'n/a'} (memory via {gpu.get('backend', 'none')}"
        f"{'; ' + gpu['reason'] if gpu.get('reason') else ''}); idle used memory "
        f"{fmt(report.get('gpu_idle_mib'), '{:,.0f}')} MiB of {fmt(gpu.get('total_mib'), '{:,.0f}')} MiB",
        f"- Images: {', '.join(report.get('images', []))}",
        f"- Requests per level {args.get('requests')}, warm-up {args.get('warmup')}, max_tokens "
        f"{args.get('max_tokens')}, ignore_eos {args.get('ignore_eos')}, stream {args.get('stream')}, "
        f"temperature {args.get('temperature')}, top_p {args.get('top_p')}"
        + (", grounding requests (layout blocks)" if args.get("grounding") else ""),
        "",
        markdown_table(*rows(report)),
        "",
        *interruption_lines(report),
        *per_device_lines(report),
        *per_server_lines(report),
        "Throughput counts successful pages over the level's wall time. GPU memory is device memory "
        "used (vLLM reserves `--gpu-memory-utilization` of the card at start, so it mostly measures that "
        "flag); the KV-cache columns come from vLLM's /metrics and show how much of that reservation the "
        "load actually needed.",
        "",
        "## Is the client the bottleneck?",
        "",
        client_verdict(report) or "n/a",
    ]
    errors = [(level["concurrency"], msg, n) for level in report["levels"]
              for msg, n in level["errors_by_message"].items()]
    if errors:
        parts += ["", "## Errors", "", markdown_table(["concurrency", "count", "message"],
                                                         [[str(c), str(n), m.replace("|", "\\|")] for c, m, n in errors])]
    if report.get("comparison"):
        parts += ["", "## Before / after", "", report["comparison"]]
    return "\n".join(parts) + "\n"


def interruption_lines(report: dict) -> list[str]:
    if not report.get("interrupted"):
        return []
    lines = ["**Interrupted (Ctrl-C)**: the numbers cover the requests that finished."]
    for level in report["levels"]:
        if level.get("cancelled") or level.get("abandoned"):
            lines.append(f"- concurrency {level['concurrency']}: {level['requests']} of {level['requests_planned']} "
                         f"requests finished; {level['cancelled']} never sent, {level['abandoned']} abandoned in flight")
    return lines + [""]


def per_device_lines(report: dict) -> list[str]:
    """GPU memory of each device measured, when there are several (data parallel replicas)."""
    lines = []
    for level in report["levels"]:
        devices = (level.get("gpu_memory") or {}).get("per_device") or {}
        if len(devices) > 1:
            cells = ", ".join(f"GPU {index} peak {fmt(value['peak_mib'], '{:,.0f}')} MiB"
                              for index, value in sorted(devices.items(), key=lambda item: int(item[0])))
            lines.append(f"- concurrency {level['concurrency']}: {cells}")
    return (["GPU memory per device:", ""] + lines + [""]) if lines else []


def per_server_lines(report: dict) -> list[str]:
    """Per server: each one's KV and request peaks; behind the gateway, what it counted (retries,
    breaker transitions, requests per server)."""
    servers = report["environment"].get("servers")
    if servers is None:
        return []
    behind = report["environment"].get("behind_gateway")
    lines = [f"{'Behind a gateway (SMG)' if behind else 'Per server'}: {len(servers)} server(s) seen during the run: "
             f"{', '.join(servers) or 'none'}.", ""]
    for level in report["levels"]:
        vllm = level.get("vllm") or {}
        cells = []
        for server, stats in (vllm.get("servers") or {}).items():
            cells.append(f"{server} n/a (no metrics read)" if stats is None else
                         f"{server} KV peak {fmt(stats['kv_cache_usage_peak'], '{:.1%}')}, running peak "
                         f"{fmt(stats['running_peak'], '{:.0f}')}, waiting peak {fmt(stats['waiting_peak'], '{:.0f}')}")
        counted = ""
        if behind:
            gateway = vllm.get("gateway")
            if gateway is None:
                counted = " Gateway counters n/a (its metrics port is on the head's loopback)"
            else:
                per_server = ", ".join(f"{server} {count:.0f}"
                                       for server, count in gateway["requests_per_server"].items())
                counted = (f" Gateway: {gateway['retries']:.0f} retries ({gateway['retries_exhausted']:.0f} "
                           f"exhausted), {gateway['breaker_transitions']:.0f} breaker transitions, "
                           f"{gateway['gateway_errors']:.0f} errors; requests per server: {per_server or 'none'}")
        lines.append(f"- concurrency {level['concurrency']}: {'; '.join(cells) or 'no server read'}.{counted}")
    return lines + [""]


COMPARED = [
    ("pages_per_s", "pages/s", "{:.2f}"),
    ("sustained.pages_per_s", "sustained pages/s", "{:.2f}"),
    ("output_tokens_per_s", "output tok/s", "{:,.0f}"),
    ("latency_mean_s", "latency mean s", "{:.2f}"),
    ("latency_p99_s", "latency p99 s", "{:.2f}"),
    ("ttft_p50_s", "TTFT p50 s", "{:.2f}"),
    ("gpu_memory.peak_mib", "GPU peak MiB", "{:,.0f}"),
    ("errors", "errors", "{:d}"),
]


def compare(before: dict, after: dict) -> str:
    """Markdown table: each metric at each common concurrency, before, after, after/before."""
    by_level = {level["concurrency"]: level for level in before["levels"]}
    body = []
    for level in after["levels"]:
        old = by_level.get(level["concurrency"])
        if old is None:
            continue
        for key, title, spec in COMPARED:
            b, a = lookup(old, key), lookup(level, key)
            ratio = f"{a / b:.2f}×" if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b else "n/a"
            body.append([str(level["concurrency"]), title, fmt(b, spec), fmt(a, spec), ratio])
    if not body:
        return "No concurrency level in common with the earlier run."
    return markdown_table(["concurrency", "metric", "before", "after", "after / before"], body)


def plot(report: dict, memory_series: Series, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    levels = report["levels"]
    conc = [lv["concurrency"] for lv in levels]
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    try:
        axes[0].plot(conc, [lv["pages_per_s"] for lv in levels], "o-")
        axes[0].set(title="Throughput", xlabel="concurrency", ylabel="pages/s")
        axes[0].set_ylim(bottom=0)
        for key, label in (("latency_p50_s", "p50"), ("latency_p99_s", "p99"), ("ttft_p50_s", "TTFT p50")):
            axes[1].plot(conc, [lv[key] if lv[key] is not None else float("nan") for lv in levels], "o-", label=label)
        axes[1].set(title="Latency", xlabel="concurrency", ylabel="seconds")
        axes[1].legend()
        total = memory_series.get("gpu_used_mib") or []
        if total:
            t0 = total[0][0]
            devices = sorted((key for key in memory_series if key != "gpu_used_mib"),
                             key=lambda key: int(key.removeprefix("gpu").removesuffix("_used_mib")))
            lines = [("gpu_used_mib", "all GPUs measured")] + ([(key, key.removesuffix("_used_mib").upper())
                                                               for key in devices] if len(devices) > 1 else [])
            for key, label in lines:
                axes[2].plot([t - t0 for t, _ in memory_series[key]], [v / 1024 for _, v in memory_series[key]],
                             label=label)
            # Levels as shaded spans labelled at the top of the axes (axes coordinates): a label placed
            # at a data value falls far outside a flat memory curve's tiny autoscaled range.
            label_at = axes[2].get_xaxis_transform()
            for lv in levels:
                window = lv.get("window") or {}
                if "start" in window:
                    axes[2].axvspan(window["start"] - t0, window["end"] - t0, alpha=0.1)
                    axes[2].text(window["start"] - t0, 0.98, f"c={lv['concurrency']}", fontsize=8,
                                 va="top", transform=label_at, clip_on=True)
            peak = max(v for key, _ in lines for _, v in memory_series[key]) / 1024
            axes[2].set_ylim(0, max(peak * 1.15, 1))  # from zero: what is reserved reads as such; room for labels
            axes[2].set(title="GPU memory used", xlabel="seconds", ylabel="GiB")
            if len(lines) > 1:
                axes[2].legend(fontsize=8, loc="lower right")
        else:
            axes[2].text(0.5, 0.5, "GPU memory: n/a (no GPU)", ha="center", va="center", transform=axes[2].transAxes)
            axes[2].set(title="GPU memory used")
        for axis in axes[:2]:
            if len(conc) > 1:
                axis.set_xscale("log", base=2)
            axis.set_xticks(conc, [str(c) for c in conc])
            axis.grid(alpha=0.3)
        fig.suptitle(f"{report['environment'].get('model')} — {report['environment'].get('started_at')}")
        fig.tight_layout()
        fig.savefig(path, dpi=100)
    finally:
        plt.close(fig)


def write_reports(report: dict, memory_series: Series, out_dir: Path) -> dict[str, Path]:
    """results.json and report.md first (the numbers), then the plot: a plot that fails is a
    warning, never a lost report or a changed exit status."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / "results.json", "markdown": out_dir / "report.md", "plot": out_dir / "plot.png"}
    atomic_write_json(paths["json"], report)
    atomic_write_text(paths["markdown"], markdown_report(report))
    try:
        plot(report, memory_series, paths["plot"])
    except Exception as exc:  # matplotlib missing, a font or layout failure: the numbers are safe
        warnings.warn(f"no plot ({type(exc).__name__}: {exc}); the numbers are in {paths['json']}", RuntimeWarning,
                      stacklevel=2)
        paths["plot"].unlink(missing_ok=True)
        del paths["plot"]
    return paths
