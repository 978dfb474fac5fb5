"""ocr_bundle.serve.warmup: one page per engine before start_optimized.sh says the server is ready,
against the session's real vLLM server (CPU build, tiny checkpoint)."""

from __future__ import annotations

import subprocess

import pytest
import requests

from helpers import PYTHON, ROOT
from ocr_bundle.client import OcrClient, OcrError
from ocr_bundle.loadtest.pollers import engine_count
from ocr_bundle.serve.warmup import warm_up

pytestmark = pytest.mark.slow


def test_one_page_reaches_the_one_engine(vllm_server):
    metrics = requests.get(f"{vllm_server.url}/metrics", timeout=10).text
    assert engine_count(metrics) == 1  # the real server labels its gauges engine="0"
    pages, seconds = warm_up(OcrClient(vllm_server.url))
    assert pages == 1 and 0 < seconds < 120


def test_the_command_says_what_it_did(vllm_server):
    done = subprocess.run([PYTHON, "-m", "ocr_bundle.serve.warmup", "--url", vllm_server.url], cwd=ROOT,
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("warm-up: 1 page (one per engine) in ")


def test_a_server_that_cannot_read_the_page_fails_the_warm_up(vllm_server, tmp_path):
    # Past /health but not usable: here, a model name the server does not serve.
    with pytest.raises(OcrError, match="does not exist|not found|404"):
        warm_up(OcrClient(vllm_server.url, model="no-such-model"))
    nobody = subprocess.run([PYTHON, "-m", "ocr_bundle.serve.warmup", "--url", "http://127.0.0.1:9"], cwd=ROOT,
                            capture_output=True, text=True, timeout=60)
    assert nobody.returncode == 1 and nobody.stderr.startswith("warm-up page failed: ")
