"""Client pieces that need no server: error formats, request body, configuration precedence."""

from __future__ import annotations

import json

import pytest
import requests

from ocr_bundle.client import (
    OcrClient,
    base_url_from_env,
    build_chat_request,
    error_message_from_response,
    explain_http_error,
)


def response(status: int, body: bytes, reason: str = "") -> requests.Response:
    made = requests.Response()
    made.status_code, made._content, made.reason = status, body, reason
    return made


@pytest.mark.parametrize("body, expected", [
    (b'{"error": {"message": "Failed to load image", "code": 400}}', "Failed to load image"),  # OpenAI style
    (b'{"object": "error", "message": "old style", "code": 400}', "old style"),                # older vLLM
    (b'{"detail": "Not Found"}', "Not Found"),                                                  # FastAPI
    (b'<html>502 Bad Gateway</html>', "<html>502 Bad Gateway</html>"),                          # a proxy
    (b"", "Service Unavailable"),
])
def test_error_message_in_every_format(body, expected):
    assert error_message_from_response(response(503, body, "Service Unavailable")) == expected


def test_explanations_say_what_to_do():
    assert "--max-model-len" in explain_http_error(400, "This model's maximum context length is 4096 tokens.")
    assert "VLLM_API_KEY" in explain_http_error(401, "Unauthorized")
    assert "overloaded or restarting" in explain_http_error(503, "busy")


def test_request_body_is_the_image_alone_with_recommended_sampling():
    body = build_chat_request("m", "data:image/png;base64,AAAA", max_tokens=100, ignore_eos=True)
    assert body["messages"] == [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]
    assert (body["temperature"], body["top_p"], body["ignore_eos"]) == (0.2, 0.9, True)
    assert body["stream_options"] == {"include_usage": True}
    assert "ignore_eos" not in build_chat_request("m", "u", stream=False)
    json.dumps(body)


def test_configuration_precedence(monkeypatch):
    monkeypatch.setenv("VLLM_URL", "http://env-host:9000/v1/")
    monkeypatch.setenv("VLLM_API_KEY", "env-key")
    assert base_url_from_env() == "http://env-host:9000"
    assert base_url_from_env("http://flag:1") == "http://flag:1"
    client = OcrClient(api_key="flag-key")
    assert client.base_url == "http://env-host:9000" and client.headers()["Authorization"] == "Bearer flag-key"
    monkeypatch.delenv("VLLM_API_KEY")
    assert "Authorization" not in OcrClient("http://x").headers()


def test_a_read_timeout_in_the_middle_of_a_stream_is_a_timeout_not_a_broken_connection():
    """requests reports it as a ConnectionError wrapping urllib3's ReadTimeoutError."""
    from urllib3.exceptions import ReadTimeoutError

    from ocr_bundle.client import _transport_kind, _transport_message

    mid_stream = requests.ConnectionError(ReadTimeoutError(None, None, "Read timed out."))
    assert _transport_kind(mid_stream) == "timeout"
    assert "did not answer in time (read timeout)" in _transport_message(mid_stream, "http://x", mid_stream=True)
    broken = requests.ConnectionError("Connection reset by peer")
    assert _transport_kind(broken) == "connection"
    assert "broke during the answer" in _transport_message(broken, "http://x", mid_stream=True)
