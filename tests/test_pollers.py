"""GPU memory polling with a fake NVML / fake nvidia-smi / no GPU, and /metrics parsing."""

from __future__ import annotations

import subprocess
from types import SimpleNamespace

import pytest

from ocr_bundle.loadtest.pollers import PeriodicPoller, devices_in_use, engine_count, open_gpu_probe, parse_prometheus

MIB = 2**20


class FakeNvml:
    """Two GPUs whose used memory follows a script; records init/shutdown."""

    def __init__(self, used_mib=((1000, 2000), (1500, 2500)), fail_init: bool = False):
        self.script = list(used_mib)
        self.calls = 0
        self.fail_init = fail_init
        self.initialised = self.shut_down = False

    def nvmlInit(self):
        if self.fail_init:
            raise RuntimeError("NVML Shared Library Not Found")
        self.initialised = True

    def nvmlShutdown(self):
        self.shut_down = True

    def nvmlDeviceGetCount(self):
        return len(self.script[0])

    def nvmlDeviceGetHandleByIndex(self, index):
        return index

    def nvmlDeviceGetName(self, handle):
        return b"NVIDIA H200"

    def nvmlDeviceGetMemoryInfo(self, handle):
        row = self.script[min(self.calls // 2, len(self.script) - 1)]
        self.calls += 1
        return SimpleNamespace(used=row[handle] * MIB, total=143771 * MIB)


def test_nvml_probe_sums_devices_and_shuts_down():
    nvml = FakeNvml()
    probe, info = open_gpu_probe(nvml=nvml)
    assert info.backend == "nvml" and info.names == ("NVIDIA H200", "NVIDIA H200")
    assert info.total_mib == 2 * 143771
    # total_mib read one row (2 calls); next reads follow the script
    assert probe() == {"gpu_used_mib": 4000.0, "gpu0_used_mib": 1500.0, "gpu1_used_mib": 2500.0}
    probe.close()
    assert nvml.shut_down


def test_nvidia_smi_is_the_fallback():
    def fake_run(cmd, **kwargs):
        assert cmd[0] == "nvidia-smi"
        return subprocess.CompletedProcess(cmd, 0, stdout="0, 1200, 143771, NVIDIA H200\n1, 300, 143771, NVIDIA H200\n")

    probe, info = open_gpu_probe(nvml=FakeNvml(fail_init=True), smi_run=fake_run)
    assert info.backend == "nvidia-smi" and info.names == ("NVIDIA H200", "NVIDIA H200")
    assert probe() == {"gpu_used_mib": 1500.0, "gpu0_used_mib": 1200.0, "gpu1_used_mib": 300.0}
    probe, info = open_gpu_probe(nvml=FakeNvml(fail_init=True), smi_run=fake_run, devices=[1])
    assert info.devices == (1,) and probe() == {"gpu_used_mib": 300.0, "gpu1_used_mib": 300.0}


def test_no_gpu_gives_no_probe_and_a_reason():
    def failing_run(cmd, **kwargs):
        raise FileNotFoundError("nvidia-smi")

    probe, info = open_gpu_probe(nvml=FakeNvml(fail_init=True), smi_run=failing_run)
    assert probe is None and info.backend == "none"
    assert "NVML Shared Library Not Found" in info.reason and "nvidia-smi" in info.reason


def test_sampler_windows_with_a_fake_clock():
    clock = iter([1.0, 2.0, 3.0, 4.0])
    values = iter([10.0, 30.0, 20.0, 50.0])
    sampler = PeriodicPoller(lambda: {"m": next(values)}, 0.01, "test", clock=lambda: next(clock))
    for _ in range(4):
        sampler.poll_once()
    window = sampler.window("m", 1.5, 3.5)
    assert (window.peak, window.mean, window.samples) == (30.0, 25.0, 2)
    assert sampler.window("m", 10, 20).peak is None
    assert sampler.series("m")[0] == (1.0, 10.0)


def test_a_failing_probe_warns_once_and_the_workload_continues():
    def broken():
        raise RuntimeError("GPU fell off the bus")

    with pytest.warns(RuntimeWarning, match="GPU fell off the bus"):
        with PeriodicPoller(broken, 0.001, "gpu") as sampler:
            sampler._stop.wait(0.05)
    assert sampler.samples == [] and "GPU fell off the bus" in sampler.error


def test_sampler_thread_collects_and_stops():
    with PeriodicPoller(lambda: {"m": 1.0}, 0.005, "t") as sampler:
        sampler._stop.wait(0.1)
    assert len(sampler.samples) >= 3
    assert not sampler._thread.is_alive()


def test_parse_prometheus_folds_engines():
    text = """# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.5
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 4.0
vllm:num_requests_waiting{engine="0",model_name="m"} 1.0
vllm:num_requests_waiting_by_reason{engine="0",model_name="m",reason="capacity"} 9.0
"""
    assert parse_prometheus(text) == {"vllm:kv_cache_usage_perc": 0.5, "vllm:num_requests_running": 7.0,
                                      "vllm:num_requests_waiting": 1.0}
    assert parse_prometheus('vllm:gpu_cache_usage_perc{a="b"} 0.1') == {"vllm:kv_cache_usage_perc": 0.1}
    assert engine_count(text) == 2  # the data-parallel replicas the warm-up sends a page to
    assert engine_count('vllm:num_requests_running{model_name="m"} 0.0') == 1
    assert engine_count("") == 1


def test_only_the_devices_in_use_are_measured():
    # A machine of 4 GPUs (another tenant on 0 and 3); the server uses 1 and 2.
    nvml = FakeNvml(used_mib=((90000, 1000, 2000, 80000),))
    probe, info = open_gpu_probe(nvml=nvml, devices=devices_in_use(environ={"CUDA_VISIBLE_DEVICES": "1,2"}))
    assert info.devices == (1, 2) and info.total_mib == 2 * 143771
    assert probe() == {"gpu_used_mib": 3000.0, "gpu1_used_mib": 1000.0, "gpu2_used_mib": 2000.0}
    assert devices_in_use("0, 3") == (0, 3)  # --gpus wins over the environment
    assert devices_in_use(environ={}) is None and devices_in_use(environ={"CUDA_VISIBLE_DEVICES": "GPU-3f2a"}) is None
    def no_smi(*args, **kwargs):
        raise OSError("nvidia-smi: not installed")

    missing, info = open_gpu_probe(nvml=FakeNvml(), smi_run=no_smi, devices=[5])
    assert missing is None and "no GPU 5" in info.reason


def test_parse_prometheus_ignores_other_metrics_and_comments():
    text = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 2.0
# TYPE vllm:request_success_total counter
vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"} 5.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="m"} 7.0
"""
    assert parse_prometheus(text) == {"vllm:num_requests_running": 2.0}
    assert parse_prometheus(text, {"vllm:request_success_total": sum}) == {"vllm:request_success_total": 12.0}


def test_prometheus_text_labels_escapes_and_what_is_not_prometheus():
    from ocr_bundle import prometheus

    text = 'm{a="x\\"y",b="1,2"} 3 1700000000\nm_total 4e3\n# comment\nn{} NaN\n'
    found = list(prometheus.samples(text))
    assert [(s.name, s.labels, s.value) for s in found[:2]] == [("m", {"a": 'x"y', "b": "1,2"}, 3.0),
                                                                 ("m_total", {}, 4000.0)]
    assert found[2].value != found[2].value  # NaN
    for garbage in ("<html><body>Not Found</body></html>", 'm{a="x} 1', "m one"):
        with pytest.raises(ValueError, match="not Prometheus text"):
            list(prometheus.samples(garbage))


def test_a_bad_metrics_source_costs_only_its_own_row_and_no_key_is_sent():
    from ocr_bundle.loadtest.pollers import SERVER_SEPARATOR, ServerMetrics
    from stand_in import StandIn

    good_text = 'vllm:num_requests_running{engine="0"} 3\nvllm:kv_cache_usage_perc{engine="0"} 0.5\n'
    with StandIn(lambda method, path, key: (200, good_text, {})) as good, \
            StandIn(lambda method, path, key: (200, "<html>a proxy's login page</html>", {})) as bad:
        probe = ServerMetrics(good.url, [good.url, bad.url])
        values = probe()
    assert values[f"{good.url}{SERVER_SEPARATOR}vllm:num_requests_running"] == 3.0
    assert not any(key.startswith(bad.url) for key in values)
    assert values["vllm:kv_cache_usage_perc"] == 0.5
    assert all(key is None for _, _, key, _ in good.seen + bad.seen)

