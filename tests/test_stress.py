"""stress_test.py end to end against the real CPU vLLM server."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from PIL import Image

from helpers import PYTHON, ROOT, free_port
from ocr_bundle.samples import sample_path


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

    # A second run compares itself with the first, as the article's before/after.
    again = stress("--concurrency", "2", "--requests", "2", "--warmup", "0", "--max-tokens", "8", "--ignore-eos",
                   "--out", str(tmp_path / "after"), "--compare", str(out / "results.json"), url=vllm_server.url)
    assert again.returncode == 0, again.stderr
    comparison = json.loads((tmp_path / "after" / "results.json").read_text())["comparison"]
    assert "| 2 | pages/s |" in comparison and "×" in comparison


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
