"""Background pollers: GPU memory (NVML, nvidia-smi fallback, none) and vLLM's /metrics.

Behind the head's router (several servers, one endpoint) the /metrics probe reads every
server the router lists, each directly, and the router's own counters come from its
metrics port (ServerMetrics, RouterCounters).

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
from prometheus_client.parser import text_string_to_metric_families

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
    """Pick gauges out of Prometheus text (prometheus_client's parser); the series of each
    gauge (one per engine and label set) are folded with its reducer."""
    found: dict[str, list[float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in wanted:
                found.setdefault(sample.name, []).append(float(sample.value))
    values = {name: wanted[name](vals) for name, vals in found.items()}
    if "vllm:gpu_cache_usage_perc" in values and "vllm:kv_cache_usage_perc" not in values:
        values["vllm:kv_cache_usage_perc"] = values["vllm:gpu_cache_usage_perc"]
    values.pop("vllm:gpu_cache_usage_perc", None)
    return values


def engine_count(text: str) -> int:
    """How many engines a vLLM server's /metrics reports: the values of the `engine` label on
    its running-requests gauge, one per data-parallel replica (remote nodes' included). At
    least 1: a server without the label runs one engine."""
    engines = {sample.labels.get("engine") for family in text_string_to_metric_families(text)
               for sample in family.samples if sample.name == "vllm:num_requests_running"}
    return max(1, len(engines - {None}))


WORKER_SEPARATOR = "|"  # per-server keys: "<server url>|vllm:kv_cache_usage_perc"
WORKER_REFRESH_S = 5.0


def fold(per_server: dict[str, dict[str, float]]) -> dict[str, float]:
    """One set of gauges over several servers: each gauge's reducer over the servers."""
    values: dict[str, list[float]] = {}
    for gauges in per_server.values():
        for name, value in gauges.items():
            values.setdefault(name, []).append(value)
    return {name: VLLM_GAUGES[name](found) for name, found in values.items()}


class ServerMetrics:
    """The probe for vLLM's /metrics at `base_url`: one server, or every server behind a router.

    A vllm-router answers /list_workers with the servers it routes to; each is then read
    directly (the router's own /metrics would show one server per call), and the gauges are
    folded (KV usage: the fullest server; requests: the sum) and kept per server too, under
    "<server>|<gauge>". A server this client cannot reach (the head's own one listens on the
    head's loopback) has no values: n/a in the report, not zero.
    """

    def __init__(self, base_url: str, headers: dict[str, str] | None = None, timeout: float = 2.0,
                 clock: Callable[[], float] = time.monotonic):
        self.base_url = base_url.rstrip("/")
        self.session = requests.Session()
        if headers:
            self.session.headers.update(headers)
        self.timeout = timeout
        self.clock = clock
        self.workers: list[str] | None = None  # None: not behind a router
        self.seen_workers: list[str] = []  # every server listed during the run, in order of appearance
        self._listed_at = -WORKER_REFRESH_S
        self.refresh_workers()

    def refresh_workers(self) -> None:
        self._listed_at = self.clock()
        try:
            response = self.session.get(f"{self.base_url}/list_workers", timeout=self.timeout)
            urls = response.json().get("urls") if response.status_code == 200 else None
        except (requests.RequestException, ValueError, AttributeError):
            urls = None
        if isinstance(urls, list):
            self.workers = [str(url).rstrip("/") for url in urls]
            self.seen_workers += [url for url in self.workers if url not in self.seen_workers]

    def _gauges(self, url: str) -> dict[str, float] | None:
        try:
            response = self.session.get(f"{url}/metrics", timeout=self.timeout)
        except requests.RequestException:
            return None  # a server restarting mid-run is the workload's problem, not the poller's
        return parse_prometheus(response.text) if response.status_code == 200 else None

    def __call__(self) -> dict[str, float]:
        if self.workers is not None and self.clock() - self._listed_at >= WORKER_REFRESH_S:
            self.refresh_workers()
        if self.workers is None:
            return self._gauges(self.base_url) or {}
        per_server = {url: gauges for url in self.workers if (gauges := self._gauges(url)) is not None}
        values = fold(per_server)
        for url, gauges in per_server.items():
            values.update({f"{url}{WORKER_SEPARATOR}{name}": value for name, value in gauges.items()})
        return values


def vllm_metrics_probe(base_url: str, headers: dict[str, str] | None = None, timeout: float = 2.0) -> ServerMetrics:
    return ServerMetrics(base_url, headers, timeout)


# ------------------------------------------------------------------ the router's counters

ROUTER_COUNTERS = {  # counter -> the report's name; summed over labels, except per-server counts
    "vllm_router_retries_total": "retries",
    "vllm_router_retries_exhausted_total": "retries_exhausted",
    "vllm_router_cb_state_transitions_total": "breaker_transitions",
    "vllm_router_request_errors_total": "router_errors",
}
PER_SERVER_COUNTER = "vllm_router_processed_requests_total"


def router_counters(metrics_url: str, timeout: float = 2.0) -> dict | None:
    """The router's counters now (retries, breaker transitions, requests per server), or None
    where its metrics port is not reachable from here."""
    try:
        response = requests.get(metrics_url, timeout=timeout)
    except requests.RequestException:
        return None
    if response.status_code != 200:
        return None
    totals: dict[str, float] = dict.fromkeys(ROUTER_COUNTERS.values(), 0.0)
    per_server: dict[str, float] = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            if sample.name in ROUTER_COUNTERS:
                totals[ROUTER_COUNTERS[sample.name]] += sample.value
            elif sample.name == PER_SERVER_COUNTER:
                server = sample.labels.get("worker") or sample.labels.get("worker_url") or "?"
                per_server[server] = per_server.get(server, 0.0) + sample.value
    return {**totals, "requests_per_server": per_server}


def counter_delta(before: dict | None, after: dict | None) -> dict | None:
    """What the router counted between two readings (None when either is missing)."""
    if before is None or after is None:
        return None
    delta = {name: after[name] - before.get(name, 0.0) for name in ROUTER_COUNTERS.values()}
    delta["requests_per_server"] = {server: count - before["requests_per_server"].get(server, 0.0)
                                    for server, count in after["requests_per_server"].items()}
    return delta
