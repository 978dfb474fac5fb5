"""The real vLLM server (CPU backend, tiny checkpoint) answers like the GPU one will."""

from __future__ import annotations

import base64

import pytest
import requests

from conftest import TEST_MAX_MODEL_LEN
from ocr_bundle.client import OcrClient, OcrError
from ocr_bundle.images import prepare_image_bytes, to_data_url
from ocr_bundle.samples import sample_path


def test_models_endpoint_reports_name_and_max_model_len(vllm_server):
    status = OcrClient(vllm_server.url).status()
    assert status.reachable, status.error
    assert status.models == ("lightonocr-tiny",)
    assert status.max_model_len == TEST_MAX_MODEL_LEN
    assert status.version  # vLLM's /version


def test_a4_page_costs_over_2000_prompt_tokens(vllm_server):
    page = prepare_image_bytes(sample_path("english_a4_document.png").read_bytes())
    assert (page.width, page.height) == (1089, 1540)
    body = {"model": "lightonocr-tiny", "max_tokens": 8, "temperature": 0.2, "top_p": 0.9,
            "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": page.data_url}}]}]}
    response = requests.post(f"{vllm_server.url}/v1/chat/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    usage = response.json()["usage"]
    assert usage["prompt_tokens"] > 2000
    assert usage["completion_tokens"] <= 8


def test_streaming_ocr_returns_text_usage_and_ttft(vllm_server):
    page = prepare_image_bytes(sample_path("table_screenshot.png").read_bytes())
    events = list(OcrClient(vllm_server.url).stream_ocr(page.data_url, max_tokens=16, ignore_eos=True))
    deltas, result = events[:-1], events[-1]
    assert deltas and all(isinstance(d, str) for d in deltas)
    assert result.text == "".join(deltas)
    assert result.completion_tokens == 16 and result.prompt_tokens > 100
    assert 0 < result.ttft_s <= result.latency_s
    assert result.finish_reason == "length"


def test_corrupt_image_is_a_400_whose_message_the_client_surfaces(vllm_server):
    corrupt = to_data_url(b"\x89PNG\r\n\x1a\n this is not really a png", "image/png")
    with pytest.raises(OcrError) as caught:
        OcrClient(vllm_server.url).ocr(corrupt, max_tokens=4)
    assert caught.value.status == 400
    assert "could not read the image" in str(caught.value)
    assert "Failed to load image" in str(caught.value)
    # ...and the server still serves the next request.
    page = prepare_image_bytes(sample_path("table_screenshot.png").read_bytes())
    assert OcrClient(vllm_server.url).ocr(page.data_url, max_tokens=2).completion_tokens >= 1


def test_corrupt_image_status_code_raw(vllm_server):
    body = {"model": "lightonocr-tiny", "max_tokens": 4, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(b"junk").decode()}}]}]}
    response = requests.post(f"{vllm_server.url}/v1/chat/completions", json=body, timeout=60)
    assert response.status_code == 400
    assert "Failed to load image" in response.json()["error"]["message"]
