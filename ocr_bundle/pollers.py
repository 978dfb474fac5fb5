"""Background samplers: GPU memory (NVML, nvidia-smi fallback, none) and vLLM's /metrics.

One `PeriodicSampler` polls a probe function in a daemon thread and keeps a time series;
the stress test reads peak/mean over each concurrency level's time window. A probe that
fails makes the sampler warn once and stop sampling — the workload always runs.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import requests

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


class PeriodicSampler:
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

    def sample_once(self) -> dict[str, float] | None:
        if self.error is not None:
            return None
        try:
            values = self.probe()
        except Exception as exc:  # any probe failure: report, keep the workload running
            self.error = f"{type(exc).__name__}: {exc}"
            warnings.warn(f"{self.name} sampling stopped: {self.error}", RuntimeWarning, stacklevel=2)
            return None
        with self._lock:
            self.samples.append(Sample(self.clock(), values))
        return values

    def _run(self) -> None:
        while not self._stop.is_set() and self.error is None:
            self.sample_once()
            self._stop.wait(self.interval_s)

    def __enter__(self) -> PeriodicSampler:
        self._thread = threading.Thread(target=self._run, name=f"{self.name}-sampler", daemon=True)
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


class NvmlMemoryProbe:
    """Used device memory summed over all GPUs, in MiB, through NVML (nvidia-ml-py)."""

    def __init__(self, nvml=None):
        if nvml is None:
            import pynvml as nvml  # nvidia-ml-py
        self.nvml = nvml
        nvml.nvmlInit()
        try:
            count = nvml.nvmlDeviceGetCount()
            if count < 1:
                raise RuntimeError("NVML sees no GPU")
            self.handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
            names = [nvml.nvmlDeviceGetName(h) for h in self.handles]
            self.names = tuple(n.decode() if isinstance(n, bytes) else str(n) for n in names)
            self.total_mib = sum(nvml.nvmlDeviceGetMemoryInfo(h).total for h in self.handles) / 2**20
        except Exception:
            nvml.nvmlShutdown()
            raise

    def __call__(self) -> dict[str, float]:
        used = sum(self.nvml.nvmlDeviceGetMemoryInfo(h).used for h in self.handles)
        return {"gpu_used_mib": used / 2**20}

    def close(self) -> None:
        self.nvml.nvmlShutdown()


class NvidiaSmiMemoryProbe:
    """The same through `nvidia-smi` (slower: one process per sample)."""

    QUERY = ["nvidia-smi", "--query-gpu=memory.used,memory.total,name", "--format=csv,noheader,nounits"]

    def __init__(self, run=subprocess.run):
        self.run = run
        rows = self._rows()
        self.names = tuple(r[2] for r in rows)
        self.total_mib = sum(float(r[1]) for r in rows)

    def _rows(self) -> list[list[str]]:
        out = self.run(self.QUERY, capture_output=True, text=True, timeout=10, check=True).stdout
        rows = [[c.strip() for c in line.split(",", 2)] for line in out.strip().splitlines() if line.strip()]
        if not rows:
            raise RuntimeError("nvidia-smi lists no GPU")
        return rows

    def __call__(self) -> dict[str, float]:
        return {"gpu_used_mib": sum(float(r[0]) for r in self._rows())}

    def close(self) -> None:
        pass


def open_gpu_probe(nvml=None, smi_run=None) -> tuple[Probe | None, GpuInfo]:
    """NVML first, nvidia-smi second, else no probe ('n/a' in reports) with the reason."""
    reasons = []
    try:
        probe = NvmlMemoryProbe(nvml)
        return probe, GpuInfo("nvml", probe.names, probe.total_mib)
    except Exception as exc:
        reasons.append(f"NVML: {exc}")
    if smi_run is not None or shutil.which("nvidia-smi"):
        try:
            probe = NvidiaSmiMemoryProbe(smi_run or subprocess.run)
            return probe, GpuInfo("nvidia-smi", probe.names, probe.total_mib)
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
    """Pick gauges out of Prometheus text; labels are folded with each gauge's reducer."""
    found: dict[str, list[float]] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_labels, _, value = line.rpartition(" ")
        name = name_labels.split("{", 1)[0]
        if name in wanted:
            try:
                found.setdefault(name, []).append(float(value))
            except ValueError:
                continue
    values = {name: wanted[name](vals) for name, vals in found.items()}
    if "vllm:gpu_cache_usage_perc" in values and "vllm:kv_cache_usage_perc" not in values:
        values["vllm:kv_cache_usage_perc"] = values["vllm:gpu_cache_usage_perc"]
    values.pop("vllm:gpu_cache_usage_perc", None)
    return values


def vllm_metrics_probe(base_url: str, headers: dict[str, str] | None = None, timeout: float = 2.0) -> Probe:
    session = requests.Session()
    if headers:
        session.headers.update(headers)

    def probe() -> dict[str, float]:
        try:
            response = session.get(f"{base_url}/metrics", timeout=timeout)
        except requests.RequestException:
            return {}  # a server restarting mid-run is the workload's problem, not the sampler's
        return parse_prometheus(response.text) if response.status_code == 200 else {}

    return probe
