"""The document API (python -m ocr_bundle.api, POST /v1/ocr) in a process of its own, as the start
script runs it: against the scripted server for what a real server cannot be made to do on demand
(errors, a server away, slow pages for fairness and cancellation), against the trained reader on the
real vLLM CPU server for the words, through plain HTTP, Mistral's own SDK and LiteLLM.
The grounding model's pictures: test_grounding_model.py."""

from __future__ import annotations

import base64
import io
import json
import os
import socket
import threading
import time
from pathlib import Path

import pytest
import requests
from PIL import Image

from helpers import PYTHON, ROOT, Started, free_port, start_process, stop_group, wait_for, wait_until_ready
from scripted_server import Reply, ScriptedServer
from test_faults import encrypted_pdf

import sys

sys.path.insert(0, str(ROOT / "scripts"))
from make_pdf import image_pdf, jpeg_of, pictures_pdf  # noqa: E402

KEY = "document-api-test-key"


def start_api(tmp_path: Path, server_url: str, **env: str) -> Started:
    port = free_port()
    started = start_process([PYTHON, "-m", "ocr_bundle.api", "--url", server_url, "--port", str(port),
                             "--render-workers", "1"], tmp_path / f"api-{port}.log", f"http://127.0.0.1:{port}",
                            {"VLLM_API_KEY": KEY, **env})
    wait_until_ready(started, "/health", 60)
    return started


def pdf_url(pdf: bytes) -> str:
    return "data:application/pdf;base64," + base64.b64encode(pdf).decode()


def blank_pdf(pages: int) -> bytes:
    return image_pdf(pages, jpeg_of(Image.new("RGB", (120, 160), "white")), (72, 96), label=False)


def png_url(size=(64, 48)) -> str:
    buffer = io.BytesIO()
    Image.new("RGB", size, "white").save(buffer, "PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def ocr(api: Started, body: dict | bytes, key: str | None = KEY, timeout: float = 60) -> requests.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return requests.post(f"{api.url}/v1/ocr", data=data, headers={"Content-Type": "application/json", **headers},
                         timeout=timeout)


def document(pdf: bytes, **fields) -> dict:
    return {"model": "any", "document": {"type": "document_url", "document_url": pdf_url(pdf)}, **fields}


@pytest.fixture(scope="module")
def scripted():
    with ScriptedServer() as server:
        yield server


@pytest.fixture(scope="module")
def api(scripted, tmp_path_factory):
    started = start_api(tmp_path_factory.mktemp("api"), scripted.url, OCR_API_MAX_PAGES="8", OCR_API_MAX_MB="0.5",
                        OCR_API_CONCURRENCY="2")
    yield started
    stop_group(started)


@pytest.fixture
def answering(scripted):
    """The scripted server answering each page with its request's index, at `delay` seconds a page."""
    settings = {"delay": 0.0}

    def answer(request):
        time.sleep(settings["delay"])
        return Reply(text=f"text of request {request.index}")
    scripted.responder = answer
    yield settings
    scripted.responder = lambda request: Reply()


# ------------------------------------------------------------------ the shape

def test_a_pdf_comes_back_page_by_page_in_mistrals_shape(api, answering):
    answer = ocr(api, document(blank_pdf(3)))
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert [page["index"] for page in body["pages"]] == [0, 1, 2]
    assert all(page["markdown"].startswith("text of request") for page in body["pages"])
    assert body["pages"][0]["images"] == [] and body["pages"][0]["dimensions"]["dpi"] == 200
    assert body["usage_info"] == {"pages_processed": 3, "doc_size_bytes": len(blank_pdf(3))}
    assert body["model"] == "scripted-ocr"
    asked = ocr(api, document(blank_pdf(3), pages=[2, 0])).json()
    assert [page["index"] for page in asked["pages"]] == [2, 0] and asked["usage_info"]["pages_processed"] == 2
    image = ocr(api, {"document": {"type": "image_url", "image_url": png_url()}}).json()
    assert image["pages"][0]["dimensions"]["width"] == 64 and len(image["pages"]) == 1


def test_stream_gives_one_line_per_page_then_the_usage(api, answering):
    headers = {"Authorization": f"Bearer {KEY}"}
    with requests.post(f"{api.url}/v1/ocr", json=document(blank_pdf(3), stream=True), headers=headers, stream=True,
                       timeout=60) as answer:
        lines = [json.loads(line) for line in answer.iter_lines() if line]
    assert sorted(line["page"]["index"] for line in lines[:3]) == [0, 1, 2]
    assert lines[3]["usage_info"]["pages_processed"] == 3


# ------------------------------------------------------------------ errors: input → status → message

ERRORS = [
    ("not JSON", b"{document", 400, "not JSON"),
    ("no document", {"model": "x"}, 400, "'document' is required"),
    ("a file id", {"document": {"type": "file", "file_id": "abc"}}, 400, "not supported here"),
    ("a remote URL", {"document": {"type": "document_url", "document_url": "https://example.com/a.pdf"}}, 400,
     "not fetched by this server"),
    ("bad base64", {"document": {"type": "document_url", "document_url": "data:application/pdf;base64,%%%"}}, 400,
     "base64 is not valid"),
    ("not a data URL", {"document": {"type": "document_url", "document_url": "file:///etc/passwd"}}, 400,
     "base64 data URL"),
    ("a corrupt PDF", document(b"%PDF-1.7\n" + b"\x00garbage" * 50), 400, "damaged"),
    ("an encrypted PDF", None, 400, "encrypted"),
    ("a text file", {"document": {"type": "document_url", "document_url": "data:text/plain;base64,"
                                  + base64.b64encode(b"just words, no picture").decode()}}, 400, "not an image or PDF"),
    ("a page out of range", document(blank_pdf(2), pages=[0, 2]), 400, "page 2 does not exist"),
    ("pages not a list", document(blank_pdf(2), pages="0-1"), 400, "'pages' must be a list"),
    ("an unknown drop label", document(blank_pdf(1), drop=["title"]), 400, "'drop' takes header"),
    ("too many pages", document(blank_pdf(9)), 413, "over the limit of 8 (OCR_API_MAX_PAGES)"),
    ("too many pages asked", document(blank_pdf(1), pages=list(range(9))), 413, "over the limit of 8"),
    ("too many bytes", document(os.urandom(600_000)), 413, "OCR_API_MAX_MB"),
]


@pytest.mark.parametrize("what, body, status, message", ERRORS, ids=[e[0] for e in ERRORS])
def test_each_bad_request_gets_its_status_and_reason(api, answering, what, body, status, message):
    before = api_pages_sent(api)
    answer = ocr(api, document(encrypted_pdf()) if body is None else body)
    assert answer.status_code == status, answer.text
    error = answer.json()
    assert error["object"] == "error" and error["code"] == status and message in error["message"], error
    assert api_pages_sent(api) == before  # refused before any page went out


def test_a_server_that_is_away_is_a_503_with_retry_after(tmp_path):
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        nobody = f"http://127.0.0.1:{closed.getsockname()[1]}"
    api = start_api(tmp_path, nobody, OCR_API_SERVER_WAIT="1")
    try:
        for answer in (ocr(api, document(blank_pdf(1))),
                       requests.get(f"{api.url}/v1/models", headers={"Authorization": f"Bearer {KEY}"}, timeout=30)):
            assert answer.status_code == 503 and answer.headers["Retry-After"] == "10", answer.text
            assert "not available" in answer.json()["message"]
    finally:
        stop_group(api)


# ------------------------------------------------------------------ doors

def api_routes(api: Started) -> list[tuple[str, str]]:
    """Every route the running app has, read from the app the process builds (not a list written here)."""
    from ocr_bundle.api.app import build_app
    from ocr_bundle.api.fair import FairSlots
    from ocr_bundle.api.service import DocumentService

    app = build_app(DocumentService(None, None, FairSlots(1), spool=Path("/nonexistent")), KEY)
    return sorted({(method, getattr(route, "path", "")) for route in app.routes for method in
                   getattr(route, "methods", ()) if method != "HEAD"}) + [("GET", "/no/such/route")]


def test_every_route_but_health_needs_the_key(api, answering):
    routes = api_routes(api)
    assert {("POST", "/v1/ocr"), ("GET", "/v1/models"), ("GET", "/metrics"), ("GET", "/health")} <= set(routes)
    for method, path in routes:
        path = path.replace("{path:path}", "anything")
        for key in (None, "wrong-key", KEY[:-1]):
            answer = requests.request(method, api.url + path, headers={"Authorization": f"Bearer {key}"} if key
                                      else {}, json={}, timeout=30)
            expected = 200 if path == "/health" else 401
            assert answer.status_code == expected, (method, path, key, answer.status_code)
        keyed = requests.request(method, api.url + path, headers={"Authorization": f"Bearer {KEY}"}, json={},
                                 timeout=30)
        assert keyed.status_code != 401, (method, path)


def test_the_key_is_on_no_command_line_and_in_no_file(api):
    cmdline = Path(f"/proc/{api.process.pid}/cmdline").read_bytes()
    assert KEY.encode() not in cmdline
    assert KEY not in api.log.read_text()


# ------------------------------------------------------------------ load: fairness and cancellation

def api_pages_sent(api: Started) -> float:
    text = requests.get(f"{api.url}/metrics", headers={"Authorization": f"Bearer {KEY}"}, timeout=10).text
    return float(next(line.split()[1] for line in text.splitlines() if line.startswith("ocr_api_pages_sent ")))


def test_ten_short_requests_finish_before_one_long_one(scripted, answering, tmp_path):
    """Two slots, 0.05 s a page: a 200-page document alone would take 5 s; ten one-page requests
    arriving once it runs each get a slot in turn, not after its 200 pages."""
    api = start_api(tmp_path, scripted.url, OCR_API_CONCURRENCY="2", OCR_API_MAX_PAGES="1000")
    answering["delay"] = 0.05
    finished: dict[str, float] = {}
    try:
        long = threading.Thread(target=lambda: (ocr(api, document(blank_pdf(200)), timeout=120),
                                                finished.setdefault("long", time.monotonic())))
        long.start()
        wait_for(lambda: api_pages_sent(api) >= 10, 60, "the long document under way")
        shorts = [threading.Thread(target=lambda i=i: (ocr(api, document(blank_pdf(1))),
                                                       finished.setdefault(f"short {i}", time.monotonic())))
                  for i in range(10)]
        for thread in shorts:
            thread.start()
        for thread in [*shorts, long]:
            thread.join(120)
    finally:
        stop_group(api)
    assert len(finished) == 11
    assert max(v for k, v in finished.items() if k != "long") < finished["long"] - 2.0, finished


def test_a_client_that_goes_away_stops_its_pages_not_yet_sent(scripted, answering, tmp_path):
    api = start_api(tmp_path, scripted.url, OCR_API_CONCURRENCY="2", OCR_API_MAX_PAGES="1000")
    answering["delay"] = 0.2
    try:
        with pytest.raises(requests.exceptions.ReadTimeout):
            ocr(api, document(blank_pdf(100)), timeout=1.5)  # the client gives up and closes the connection
        time.sleep(1.0)
        stopped_at = api_pages_sent(api)
        time.sleep(2.0)
        assert api_pages_sent(api) <= stopped_at + 2  # at most the pages in flight when it noticed
        assert stopped_at < 30, stopped_at  # 100 pages at 2 x 5 a second would be 20 s
        metrics = requests.get(f"{api.url}/metrics", headers={"Authorization": f"Bearer {KEY}"}, timeout=10).text
        assert "ocr_api_requests_in_flight 0.0" in metrics
    finally:
        stop_group(api)


def test_metrics_count_requests_and_pages(api, answering):
    before = requests.get(f"{api.url}/metrics", headers={"Authorization": f"Bearer {KEY}"}, timeout=10).text
    assert ocr(api, document(blank_pdf(2))).status_code == 200
    after = requests.get(f"{api.url}/metrics", headers={"Authorization": f"Bearer {KEY}"}, timeout=10).text

    def value(text: str, name: str) -> float:
        return float(next((line.split()[-1] for line in text.splitlines() if line.startswith(name)), 0))
    assert value(after, 'ocr_api_requests_total{status="200"}') == value(before, 'ocr_api_requests_total{status="200"}') + 1
    assert value(after, "ocr_api_pages_total") == value(before, "ocr_api_pages_total") + 2


# ------------------------------------------------------------------ the words, through clients nobody here wrote

@pytest.fixture(scope="module")
def reader_api(reader_server, tmp_path_factory):
    started = start_api(tmp_path_factory.mktemp("reader-api"), reader_server.url, OCR_API_MAX_TOKENS="16",
                        OCR_API_TEMPERATURE="0")
    yield started
    stop_group(started)


def reader_pdf() -> bytes:
    import train_reader

    return pictures_pdf([jpeg_of(train_reader.render_line(f"page {n}"), 95) for n in range(1, 4)])


def test_each_page_of_a_pdf_gives_its_words_over_http(reader_api):
    answer = ocr(reader_api, document(reader_pdf()), timeout=300)
    assert answer.status_code == 200, answer.text
    assert [page["markdown"].strip() for page in answer.json()["pages"]] == ["page 1", "page 2", "page 3"]


def test_mistrals_own_sdk_reads_the_pdf(reader_api):
    from mistralai.client import Mistral

    client = Mistral(api_key=KEY, server_url=reader_api.url)
    response = client.ocr.process(model="lightonocr", document={"type": "document_url",
                                                                 "document_url": pdf_url(reader_pdf())}, pages=[2, 0])
    assert [(page.index, page.markdown.strip()) for page in response.pages] == [(2, "page 3"), (0, "page 1")]
    assert response.usage_info.pages_processed == 2


def test_litellm_reads_the_pdf(reader_api, monkeypatch):
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network: its bundled price list
    import litellm

    response = litellm.ocr(model="mistral/lightonocr", document={"type": "document_url",
                                                                  "document_url": pdf_url(reader_pdf())},
                           api_base=f"{reader_api.url}/v1", api_key=KEY)
    assert [page.markdown.strip() for page in response.pages] == ["page 1", "page 2", "page 3"]


def test_the_page_reads_all_pages_of_a_pdf_through_the_document_api(reader_server, reader_api, tmp_path):
    from ocr_bundle.api.remote import DocumentApi
    from ocr_bundle.client import OcrClient
    from ocr_bundle.page import PAGE_SEPARATOR, OcrPage, PageSettings

    pdf = tmp_path / "three pages.pdf"
    pdf.write_bytes(reader_pdf())
    page = OcrPage(OcrClient(reader_server.url), PageSettings(document_api=DocumentApi(reader_api.url, KEY)))
    updates = list(page.extract(str(pdf), all_pages=True))
    assert [stats for _, _, stats, _ in updates[:-1]] == [f"Read {n} of 3 pages (document API)…" for n in (1, 2, 3)]
    text, _, stats, _ = updates[-1]
    assert [part.strip() for part in text.split(PAGE_SEPARATOR)] == ["page 1", "page 2", "page 3"]
    assert "through the document API" in stats


def test_beyond_loopback_it_refuses_to_start_without_a_key_or_https(tmp_path):
    """The start script's exposure rules, in the API itself: refused before it listens (exit 2)."""
    import subprocess

    for env, says in (({"VLLM_API_KEY": ""}, "refusing to serve the document API on 0.0.0.0 without an API key"),
                      ({"VLLM_API_KEY": KEY}, "HTTPS")):
        done = subprocess.run([PYTHON, "-m", "ocr_bundle.api", "--host", "0.0.0.0", "--port", str(free_port())],
                              cwd=ROOT, capture_output=True, text=True, timeout=60,
                              env={**os.environ, "ALLOW_OPEN_API": "", "ALLOW_PLAINTEXT": "", "TLS_CERT": "",
                                   "TLS_KEY": "", "TLS_CA": "", **env})
        assert done.returncode == 2 and says in done.stderr, done.stderr
        assert KEY not in done.stdout + done.stderr
