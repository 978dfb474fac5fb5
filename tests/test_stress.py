"""stress_test.py end to end against the real CPU vLLM server."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
import warnings
from pathlib import Path

import pytest
from PIL import Image

from helpers import PYTHON, ROOT, free_port, running_requests, wait_for
from ocr_bundle.samples import sample_path
from test_pollers import FakeNvml


def stress(*argv: str, url: str) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, str(ROOT / "stress_test.py"), "--url", url, *argv], capture_output=True,
                          text=True, timeout=600, cwd=ROOT, env={**os.environ, "VLLM_API_KEY": ""})


def test_full_run_at_1_2_4_writes_every_report(vllm_server, tmp_path: Path):
    out = tmp_path / "run"
    done = stress("--concurrency", "1,2,4", "--requests", "4", "--warmup", "1", "--max-tokens", "8",
                  "--ignore-eos", "--out", str(out), url=vllm_server.url)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((out / "results.json").read_text())
    assert [lv["concurrency"] for lv in report["levels"]] == [1, 2, 4]
    assert all(lv["requests"] == 4 and lv["errors"] == 0 and lv["ok"] == 4 for lv in report["levels"])
    assert len(report["requests"]) == 12
    assert all(r["completion_tokens"] == 8 and r["prompt_tokens"] > 100 for r in report["requests"])
    assert report["environment"]["vllm_version"] and report["environment"]["max_model_len"] == 4096
    assert report["environment"]["gpu"]["backend"] == "none"  # no GPU here: memory is n/a, not invented
    assert all(lv["vllm"]["running_peak"] is not None for lv in report["levels"])
    assert sorted(report["images"]) == sorted(["english_a4_document.png", "chinese_mixed_flyer.png",
                                               "table_screenshot.png"])
    markdown = (out / "report.md").read_text()
    assert "| conc | reqs | errors | pages/s" in markdown and "not the bottleneck" in markdown
    assert (out / "plot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "conc  reqs  errors  pages/s" in done.stdout  # the aligned table on stdout

    # A second run compares itself with the first, as the article's before/after; its first sends spread (--ramp).
    again = stress("--concurrency", "2", "--requests", "4", "--warmup", "0", "--max-tokens", "8", "--ignore-eos",
                   "--ramp", "0.5", "--out", str(tmp_path / "after"), "--compare", str(out / "results.json"),
                   url=vllm_server.url)
    assert again.returncode == 0, again.stderr
    after = json.loads((tmp_path / "after" / "results.json").read_text())
    assert "| 2 | pages/s |" in after["comparison"] and "×" in after["comparison"]
    first, second = sorted(r["start_s"] for r in after["requests"])[:2]
    assert second - first >= 0.2  # 0.5 s over two slots: the second send a quarter-second after the first
    assert "sustained" in after["levels"][0] and "sustained pages/s" in (tmp_path / "after" / "report.md").read_text()


def corrupt_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "mixed"
    folder.mkdir()
    Image.open(sample_path("table_screenshot.png")).save(folder / "good1.png")
    Image.open(sample_path("table_screenshot.png")).convert("L").save(folder / "good2.png")
    (folder / "notes.png").write_text("this is a text file with a .png name")
    (folder / "truncated.png").write_bytes(sample_path("table_screenshot.png").read_bytes()[:500])
    return folder


def test_half_corrupt_images_are_counted_grouped_and_set_the_exit_code(vllm_server, tmp_path: Path):
    folder = corrupt_folder(tmp_path)
    common = ["--images", str(folder), "--concurrency", "2", "--requests", "8", "--warmup", "0",
              "--max-tokens", "4", "--ignore-eos"]
    tolerant = stress(*common, "--max-error-rate", "0.6", "--out", str(tmp_path / "a"), url=vllm_server.url)
    assert tolerant.returncode == 0, tolerant.stderr
    level = json.loads((tmp_path / "a" / "results.json").read_text())["levels"][0]
    assert (level["requests"], level["ok"], level["errors"]) == (8, 4, 4)
    assert sorted(level["errors_by_message"].values()) == [2, 2]
    assert any("notes.png" in m and "not an image" in m for m in level["errors_by_message"])

    # --raw sends the files as they are: now the server refuses them, and any error fails the run.
    strict = stress(*common, "--raw", "--out", str(tmp_path / "b"), url=vllm_server.url)
    assert strict.returncode == 1
    assert "FAILED: 4 of 8 requests failed" in strict.stderr
    level = json.loads((tmp_path / "b" / "results.json").read_text())["levels"][0]
    assert level["errors"] == 4 and all("400" in m for m in level["errors_by_message"])
    assert "Traceback" not in strict.stderr


def test_nothing_listening_is_a_clear_error(tmp_path: Path):
    done = stress("--out", str(tmp_path / "x"), url=f"http://127.0.0.1:{free_port()}")
    assert done.returncode == 2
    assert "cannot use the vLLM server" in done.stderr and "Cannot reach" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "x").exists()


def test_ctrl_c_during_a_level_writes_the_report_marked_interrupted(vllm_server, tmp_path: Path):
    out = tmp_path / "interrupted"
    run = subprocess.Popen([PYTHON, str(ROOT / "stress_test.py"), "--url", vllm_server.url, "--concurrency", "2",
                            "--requests", "40", "--warmup", "0", "--max-tokens", "400", "--ignore-eos",
                            "--grace", "60", "--out", str(out)], cwd=ROOT, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, env={**os.environ, "VLLM_API_KEY": ""})
    wait_for(lambda: running_requests(vllm_server.url) >= 2, 120, "two requests in flight")
    run.send_signal(signal.SIGINT)
    interrupted_at = time.monotonic()
    stdout, stderr = run.communicate(timeout=120)
    assert run.returncode == 130, stderr
    assert time.monotonic() - interrupted_at < 60  # the two in flight finish; 38 queued are never sent
    report = json.loads((out / "results.json").read_text())
    level = report["levels"][0]
    assert report["interrupted"] is True
    assert level["requests_planned"] == 40 and level["requests"] + level["cancelled"] + level["abandoned"] == 40
    assert level["cancelled"] >= 30 and level["requests"] >= 2
    assert "(INTERRUPTED)" in (out / "report.md").read_text() and "never sent" in (out / "report.md").read_text()
    assert "stopping: no new requests" in stderr and "Traceback" not in stderr


def test_a_long_level_shows_live_progress(vllm_server, tmp_path: Path):
    done = stress("--concurrency", "2", "--requests", "6", "--warmup", "0", "--max-tokens", "4", "--ignore-eos",
                  "--out", str(tmp_path / "p"), url=vllm_server.url)
    assert done.returncode == 0, done.stderr
    assert re.search(r"c=2: 100%.*6/6", done.stderr), done.stderr
    quiet = stress("--concurrency", "2", "--requests", "2", "--warmup", "0", "--max-tokens", "4", "--quiet",
                   "--out", str(tmp_path / "q"), url=vllm_server.url)
    assert "c=2:" not in quiet.stderr


class FailingNvml(FakeNvml):
    """Starts fine, then every memory read fails: the NVML handle must still be shut down."""

    def nvmlDeviceGetMemoryInfo(self, handle):
        if self.calls >= 1:
            raise RuntimeError("GPU is lost")
        return super().nvmlDeviceGetMemoryInfo(handle)


def test_nvml_is_shut_down_even_when_the_first_read_fails(vllm_server, tmp_path: Path, monkeypatch):
    import stress_test
    from ocr_bundle.loadtest import pollers

    nvml = FailingNvml(used_mib=((1000,),))
    monkeypatch.setattr(stress_test, "open_gpu_probe", lambda devices=None: pollers.open_gpu_probe(nvml=nvml))
    with pytest.warns(RuntimeWarning, match="GPU is lost"):
        code = stress_test.main(["--url", vllm_server.url, "--concurrency", "1", "--requests", "1", "--warmup", "0",
                                 "--max-tokens", "2", "--quiet", "--out", str(tmp_path / "nvml")])
    assert code == 0
    assert nvml.initialised and nvml.shut_down
    report = json.loads((tmp_path / "nvml" / "results.json").read_text())
    assert report["gpu_idle_mib"] is None and report["environment"]["gpu"]["backend"] == "nvml"


def test_one_level_with_flat_gpu_memory_plots_cleanly(tmp_path: Path):
    """What an H200 produced at --concurrency 1: NVML flat at ~131.7 GB. The level label used to
    sit at y=0 of an axis autoscaled around 131 GB; matplotlib failed to lay the figure out."""
    from ocr_bundle.loadtest.report import plot

    level = {"concurrency": 1, "pages_per_s": 0.35, "latency_p50_s": 2.8, "latency_p99_s": 3.1, "ttft_p50_s": 0.18,
             "window": {"start": 100.0, "end": 130.0}}
    report = {"levels": [level], "environment": {"model": "m", "started_at": "2026-11-30"}}
    series = {"gpu_used_mib": [(100.0 + i * 0.2, 134_860.0) for i in range(150)]}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "Tight layout not applied" and the like fail the test
        plot(report, series, tmp_path / "plot.png")
    assert Image.open(tmp_path / "plot.png").size == (1600, 450)


def test_a_failing_plot_is_a_warning_after_the_numbers_are_written(tmp_path: Path, monkeypatch):
    from ocr_bundle.loadtest import report as reports

    def broken_plot(*args):
        raise RuntimeError("FT_Render_Glyph failed: raster overflow")

    monkeypatch.setattr(reports, "plot", broken_plot)
    report = {"levels": [], "environment": {}, "args": {}, "images": []}
    with pytest.warns(RuntimeWarning, match="raster overflow"):
        paths = reports.write_reports(report, {}, tmp_path / "r")
    assert set(paths) == {"json", "markdown"} and json.loads(paths["json"].read_text())["levels"] == []
    assert not (tmp_path / "r" / "plot.png").exists()
