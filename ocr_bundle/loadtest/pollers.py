"""Background pollers: GPU memory (NVML, nvidia-smi fallback, none) and vLLM's /metrics.

Behind the head's gateway (several servers, one endpoint) the /metrics probe reads every
server's metrics from the gateway's /engine_metrics (and any server the user names), and the
gateway's own counters come from its metrics port (ServerMetrics, gateway_counters).

One `PeriodicPoller` calls a probe function in a daemon thread and keeps a time series;
the stress test reads peak/mean over each concurrency level's time window. A probe that
fails makes the poller warn once and stop polling — the workload always runs.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import requests

from ocr_bundle import prometheus

Probe = Callable[[], dict[str, float]]


@dataclass(frozen=True)
class Sample:
    t: float  # clock() seconds
    values: dict[str, float]


@dataclass(frozen=True)
class WindowStats:
    peak: float | None
    mean: float | None
    samples: int


class PeriodicPoller:
    """Calls `probe` every `interval_s` in a thread; a context manager."""

    def __init__(self, probe: Probe, interval_s: float, name: str, clock: Callable[[], float] = time.monotonic):
        self.probe = probe
        self.interval_s = interval_s
        self.name = name
        self.clock = clock
        self.samples: list[Sample] = []
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def poll_once(self) -> dict[str, float] | None:
        if self.error is not None:
            return None
        try:
            values = self.probe()
        except Exception as exc:  # any probe failure: report, keep the workload running
            self.error = f"{type(exc).__name__}: {exc}"
            warnings.warn(f"{self.name} polling stopped: {self.error}", RuntimeWarning, stacklevel=2)
            return None
        with self._lock:
            self.samples.append(Sample(self.clock(), values))
        return values

    def _run(self) -> None:
        while not self._stop.is_set() and self.error is None:
            self.poll_once()
            self._stop.wait(self.interval_s)

    def __enter__(self) -> PeriodicPoller:
        self._thread = threading.Thread(target=self._run, name=f"{self.name}-poller", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def window(self, key: str, start: float, end: float) -> WindowStats:
        with self._lock:
            values = [s.values[key] for s in self.samples if start <= s.t <= end and key in s.values]
        if not values:
            return WindowStats(None, None, 0)
        return WindowStats(max(values), sum(values) / len(values), len(values))

    def keys(self) -> list[str]:
        """Every value name seen so far, sorted."""
        with self._lock:
            return sorted({key for sample in self.samples for key in sample.values})

    def series(self, key: str) -> list[tuple[float, float]]:
        with self._lock:
            return [(s.t, s.values[key]) for s in self.samples if key in s.values]


# ------------------------------------------------------------------ GPU memory


@dataclass(frozen=True)
class GpuInfo:
    backend: str  # "nvml" | "nvidia-smi" | "none"
    names: tuple[str, ...] = ()
    total_mib: float | None = None
    reason: str | None = None  # why "none"
    devices: tuple[int, ...] = ()  # the machine's indices of the GPUs measured


def devices_in_use(requested: str | None = None, environ: dict[str, str] | None = None) -> tuple[int, ...] | None:
    """GPU indices to measure: `requested` ("0,2"), else CUDA_VISIBLE_DEVICES when it lists
    indices, else None (every GPU). NVML counts every GPU of the machine, other tenants' too,
    so a report covers only the devices the server uses. (CUDA numbers devices fastest
    first unless CUDA_DEVICE_ORDER=PCI_BUS_ID; NVML in bus order; on a machine of
    identical GPUs the two agree.)"""
    text = requested if requested is not None else (environ if environ is not None else os.environ).get(
        "CUDA_VISIBLE_DEVICES")
    if text is None or not text.strip():
        return None
    parts = [part.strip() for part in text.split(",") if part.strip()]
    if not all(part.isdigit() for part in parts):
        return None  # UUIDs or MIG names: measure every GPU rather than guess
    return tuple(int(part) for part in parts)


def per_device(values_mib: Sequence[float], devices: Sequence[int]) -> dict[str, float]:
    """{"gpu_used_mib": total, "gpu0_used_mib": ..., "gpu1_used_mib": ...}."""
    out = {f"gpu{index}_used_mib": value for index, value in zip(devices, values_mib)}
    out["gpu_used_mib"] = float(sum(values_mib))
    return out


class NvmlMemoryProbe:
    """Used device memory per GPU and summed, in MiB, through NVML (nvidia-ml-py)."""

    def __init__(self, nvml=None, devices: Sequence[int] | None = None):
        if nvml is None:
            import pynvml as nvml  # nvidia-ml-py
        self.nvml = nvml
        nvml.nvmlInit()
        try:
            count = nvml.nvmlDeviceGetCount()
            if count < 1:
                raise RuntimeError("NVML sees no GPU")
            self.devices = tuple(devices) if devices is not None else tuple(range(count))
            missing = [index for index in self.devices if not 0 <= index < count]
            if missing:
                raise RuntimeError(f"no GPU {missing[0]} (NVML sees {count})")
            self.handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in self.devices]
            names = [nvml.nvmlDeviceGetName(h) for h in self.handles]
            self.names = tuple(n.decode() if isinstance(n, bytes) else str(n) for n in names)
            self.total_mib = sum(nvml.nvmlDeviceGetMemoryInfo(h).total for h in self.handles) / 2**20
        except Exception:
            nvml.nvmlShutdown()
            raise

    def __call__(self) -> dict[str, float]:
        return per_device([self.nvml.nvmlDeviceGetMemoryInfo(h).used / 2**20 for h in self.handles], self.devices)

    def close(self) -> None:
        self.nvml.nvmlShutdown()


class NvidiaSmiMemoryProbe:
    """The same through `nvidia-smi` (slower: one process per sample)."""

    QUERY = ["nvidia-smi", "--query-gpu=index,memory.used,memory.total,name", "--format=csv,noheader,nounits"]

    def __init__(self, run=subprocess.run, devices: Sequence[int] | None = None):
        self.run = run
        self.wanted = None if devices is None else set(devices)
        rows = self._rows()
        self.devices = tuple(int(r[0]) for r in rows)
        self.names = tuple(r[3] for r in rows)
        self.total_mib = sum(float(r[2]) for r in rows)

    def _rows(self) -> list[list[str]]:
        out = self.run(self.QUERY, capture_output=True, text=True, timeout=10, check=True).stdout
        rows = [[c.strip() for c in line.split(",", 3)] for line in out.strip().splitlines() if line.strip()]
        rows = [r for r in rows if self.wanted is None or int(r[0]) in self.wanted]
        if not rows:
            raise RuntimeError("nvidia-smi lists no GPU" + (" of those asked for" if self.wanted else ""))
        return rows

    def __call__(self) -> dict[str, float]:
        return per_device([float(r[1]) for r in self._rows()], self.devices)

    def close(self) -> None:
        pass


def open_gpu_probe(nvml=None, smi_run=None, devices: Sequence[int] | None = None) -> tuple[Probe | None, GpuInfo]:
    """NVML first, nvidia-smi second, else no probe ('n/a' in reports) with the reason."""
    reasons = []
    try:
        probe = NvmlMemoryProbe(nvml, devices)
        return probe, GpuInfo("nvml", probe.names, probe.total_mib, devices=probe.devices)
    except Exception as exc:
        reasons.append(f"NVML: {exc}")
    if smi_run is not None or shutil.which("nvidia-smi"):
        try:
            probe = NvidiaSmiMemoryProbe(smi_run or subprocess.run, devices)
            return probe, GpuInfo("nvidia-smi", probe.names, probe.total_mib, devices=probe.devices)
        except Exception as exc:
            reasons.append(f"nvidia-smi: {exc}")
    else:
        reasons.append("nvidia-smi: not installed")
    return None, GpuInfo("none", reason="; ".join(reasons))


# ------------------------------------------------------------------ vLLM /metrics

# Gauges worth watching under load; summed over engines (data parallel) except the KV usage,
# of which the fullest engine is what matters.
VLLM_GAUGES = {
    "vllm:kv_cache_usage_perc": max,
    "vllm:gpu_cache_usage_perc": max,  # name before vLLM 0.10
    "vllm:num_requests_running": sum,
    "vllm:num_requests_waiting": sum,
}


def parse_prometheus(text: str, wanted: dict[str, Callable] = VLLM_GAUGES) -> dict[str, float]:
    """Pick gauges out of Prometheus text (ocr_bundle.prometheus); the series of each gauge (one
    per engine and label set) are folded with its reducer. ValueError for text that is not Prometheus."""
    return current_names(prometheus.fold(text, wanted))


def current_names(gauges: dict[str, float]) -> dict[str, float]:
    """The KV usage under its current name, whichever vLLM reported it."""
    old = gauges.pop("vllm:gpu_cache_usage_perc", None)
    if old is not None:
        gauges.setdefault("vllm:kv_cache_usage_perc", old)
    return gauges


def engine_count(text: str) -> int:
    """How many engines a vLLM server's /metrics reports: the values of the `engine` label on
    its running-requests gauge, one per data-parallel replica (remote nodes' included). At
    least 1: a server without the label runs one engine."""
    engines = {sample.labels.get("engine") for sample in prometheus.samples(text)
               if sample.name == "vllm:num_requests_running"}
    return max(1, len(engines - {None}))


SERVER_SEPARATOR = "|"  # per-server keys: "<server url>|vllm:kv_cache_usage_perc"
GATEWAY_SERVER_LABEL = "worker_addr"  # the label SMG's /engine_metrics puts on each server's series


def fold(per_server: dict[str, dict[str, float]]) -> dict[str, float]:
    """One set of gauges over several servers: each gauge's reducer over the servers."""
    values: dict[str, list[float]] = {}
    for gauges in per_server.values():
        for name, value in gauges.items():
            values.setdefault(name, []).append(value)
    return {name: VLLM_GAUGES[name](found) for name, found in values.items()}


def gauges_by_server(text: str, label: str = GATEWAY_SERVER_LABEL) -> dict[str, dict[str, float]]:
    """The gateway's /engine_metrics (every server's vLLM metrics, each series labelled with its
    server) → the gauges of each server."""
    series: dict[str, dict[str, list[float]]] = {}
    for sample in prometheus.samples(text):
        if sample.name in VLLM_GAUGES and label in sample.labels:
            series.setdefault(sample.labels[label].rstrip("/"), {}).setdefault(sample.name, []).append(sample.value)
    return {server: current_names({name: VLLM_GAUGES[name](values) for name, values in found.items()})
            for server, found in series.items()}


class ServerMetrics:
    """The probe for vLLM's /metrics at `base_url`: one server, or every server behind a gateway.

    No request of it carries a key: /metrics (vLLM) and /engine_metrics (the gateway) are open
    by design, and a key goes nowhere but where the user sent it. A vLLM server answers /metrics
    itself. The head's gateway (SMG) has no /metrics on its public port; its /engine_metrics
    holds every server's metrics, each labelled with its server, and gives the folded gauges
    (KV usage: the fullest server; requests: the sum) and each server's under
    "<server>|<gauge>". `extra_servers` are read directly as well (--server-metrics: URLs the
    user gave). A source that does not answer, or answers with something that is not Prometheus
    text, costs only its own values for that sample: n/a in the report, not zero. Over HTTPS it
    verifies as the run's client does (`tls_options`: the client's verify= and cert=).
    """

    def __init__(self, base_url: str, extra_servers: Sequence[str] = (), timeout: float = 2.0,
                 tls_options: dict | None = None):
        self.base_url = base_url.rstrip("/")
        self.extra_servers = [url.rstrip("/") for url in extra_servers]
        self.session = requests.Session()
        self.tls_options = tls_options or {}
        self.timeout = timeout
        self.behind_gateway = self._text(f"{self.base_url}/metrics") is None and \
            self._text(f"{self.base_url}/engine_metrics") is not None
        self.seen_servers: list[str] = list(self.extra_servers)  # every server seen during the run, in order

    @property
    def per_server(self) -> bool:
        return self.behind_gateway or bool(self.extra_servers)

    def _text(self, url: str) -> str | None:
        try:
            response = self.session.get(url, timeout=self.timeout, allow_redirects=False, **self.tls_options)
        except requests.RequestException:
            return None  # a server restarting mid-run is the workload's problem, not the poller's
        return response.text if response.status_code == 200 else None

    def _gauges(self, url: str) -> dict[str, float] | None:
        text = self._text(f"{url}/metrics")
        try:
            return parse_prometheus(text) if text is not None else None
        except ValueError:
            return None

    def __call__(self) -> dict[str, float]:
        if not self.per_server:
            return self._gauges(self.base_url) or {}
        per_server: dict[str, dict[str, float]] = {}
        if self.behind_gateway and (text := self._text(f"{self.base_url}/engine_metrics")) is not None:
            try:
                per_server.update(gauges_by_server(text))
            except ValueError:
                pass
        for url in self.extra_servers:
            if (gauges := self._gauges(url)) is not None:
                per_server[url] = gauges
        self.seen_servers += [url for url in per_server if url not in self.seen_servers]
        values = fold(per_server)
        for url, gauges in per_server.items():
            values.update({f"{url}{SERVER_SEPARATOR}{name}": value for name, value in gauges.items()})
        return values


def per_server_stats(metrics_poller: PeriodicPoller, servers: list[str], start: float, end: float) -> dict:
    """Each server's KV peak and request peaks over a level; None for a server never read (n/a)."""
    stats = {}
    for server in servers:
        kv, running, waiting = (metrics_poller.window(f"{server}{SERVER_SEPARATOR}vllm:{gauge}", start, end)
                                for gauge in ("kv_cache_usage_perc", "num_requests_running", "num_requests_waiting"))
        stats[server] = ({"kv_cache_usage_peak": kv.peak, "running_peak": running.peak, "waiting_peak": waiting.peak}
                         if running.samples else None)
    return stats


# ------------------------------------------------------------------ the gateway's counters

GATEWAY_COUNTERS = {  # counter -> the report's name; summed over labels, except per-server counts
    "smg_worker_retries_total": "retries",
    "smg_worker_retries_exhausted_total": "retries_exhausted",
    "smg_worker_cb_transitions_total": "breaker_transitions",
    "smg_router_request_errors_total": "gateway_errors",
}
PER_SERVER_COUNTER = "smg_worker_requests_total"


def gateway_counters(metrics_url: str, timeout: float = 2.0, tls_options: dict | None = None) -> dict | None:
    """The gateway's counters now (retries, breaker transitions, requests per server), or None
    where its metrics port is not reachable from here (it listens on the head's loopback). SMG
    drops a server's per-server series when the server leaves its pool (a lost one is removed
    by its keeper): requests per server count the servers in the pool when it is read."""
    try:
        response = requests.get(metrics_url, timeout=timeout, allow_redirects=False, **(tls_options or {}))
        if response.status_code != 200:
            return None
        found = list(prometheus.samples(response.text))
    except (requests.RequestException, ValueError):
        return None
    totals: dict[str, float] = dict.fromkeys(GATEWAY_COUNTERS.values(), 0.0)
    per_server: dict[str, float] = {}
    for sample in found:
        if sample.name in GATEWAY_COUNTERS:
            totals[GATEWAY_COUNTERS[sample.name]] += sample.value
        elif sample.name == PER_SERVER_COUNTER:
            server = sample.labels.get("worker", "?").rstrip("/")
            per_server[server] = per_server.get(server, 0.0) + sample.value
    return {**totals, "requests_per_server": per_server}


def counter_delta(before: dict | None, after: dict | None) -> dict | None:
    """What the gateway counted between two readings (None when either is missing)."""
    if before is None or after is None:
        return None
    delta = {name: after[name] - before.get(name, 0.0) for name in GATEWAY_COUNTERS.values()}
    delta["requests_per_server"] = {server: count - before["requests_per_server"].get(server, 0.0)
                                    for server, count in after["requests_per_server"].items()}
    return delta
