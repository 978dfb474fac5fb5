"""The page in a real browser: headless Debian Chromium driven by Playwright, against real vLLM."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from helpers import PYTHON, ROOT, free_port, set_output_budget, start_process, stop_group, wait_until_ready
from ocr_bundle.samples import sample_path

ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--no-first-run", "--disable-sync", "--disable-quic"]


@pytest.fixture(scope="module")
def page_server(vllm_server, tmp_path_factory):
    port = free_port()
    log = tmp_path_factory.mktemp("ui") / "ui.log"
    started = start_process([PYTHON, str(ROOT / "app_vllm.py"), "--server-url", vllm_server.url, "--port", str(port),
                             "--max-upload-mb", "5"], log, f"http://127.0.0.1:{port}")
    try:
        wait_until_ready(started, "/config", 120)
        yield started
    finally:
        stop_group(started)


@pytest.fixture()
def browser_page():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        try:
            yield page
        finally:
            browser.close()


def upload(page, path: Path) -> None:
    """As a person does: clear the previous file (the drop zone returns), then pick the new one."""
    clear = page.locator("#upload button[aria-label='Clear']")
    if clear.count():
        clear.first.click()
    page.set_input_files("#upload input[type=file]", str(path))


def test_upload_extract_and_errors_in_a_browser(page_server, browser_page, tmp_path: Path):
    from playwright.sync_api import expect

    page = browser_page
    page.goto(page_server.url, wait_until="networkidle")
    expect(page.locator("#server-status")).to_contain_text("lightonocr-tiny", timeout=30_000)
    expect(page.locator("#server-status")).to_contain_text("max_model_len 4096")

    # A small output budget: 4,096 random tokens on 2 CPU cores would only measure the CPU.
    set_output_budget(page, 64)
    upload(page, sample_path("english_a4_document.png"))
    page.locator("#extract").click()
    stats = page.locator("#stats")
    expect(stats).to_contain_text("output tokens", timeout=120_000)
    output_tokens = int(re.search(r"\+ ([\d,]+) output tokens", stats.inner_text()).group(1).replace(",", ""))
    assert 1 <= output_tokens <= 64, stats.inner_text()
    assert re.search(r"[\d,]+ prompt \+ [\d,]+ output tokens", stats.inner_text())
    assert "1089×1540" in stats.inner_text()
    page.get_by_role("tab", name="Raw text").click()
    raw = page.locator("#raw textarea").input_value()
    assert raw.strip()  # random words from the random-weight model, streamed in
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "page-after-extract.png"), full_page=True)

    # A text file dressed as an image: a clear message, no stack trace...
    bad = tmp_path / "scan 1 — é.png"
    bad.write_text("definitely not an image")
    upload(page, bad)
    expect(page.get_by_text(re.compile("not an image"))).to_be_visible(timeout=30_000)
    # The toast fades in (a script transition): wait until it and its ancestors are opaque.
    page.wait_for_function("""() => {
        let node = document.querySelector('[data-testid="toast-text"]');
        if (!node) return false;
        for (; node; node = node.parentElement) if (getComputedStyle(node).opacity !== '1') return false;
        return true; }""", timeout=10_000)
    page.screenshot(path=str(ARTIFACTS / "page-error.png"))
    assert "Traceback" not in page.content()
    expect(page.locator("#raw textarea")).to_have_value("")  # the old result was cleared
    # One toast for one bad file: Extract waits for a file that can be read, so the message is not raised twice.
    expect(page.locator("#extract")).to_be_disabled()
    assert page.locator('[data-testid="toast-body"]').count() == 1
    assert "(2)" not in page.locator('[data-testid="toast-body"]').inner_text()

    # ...and the page keeps working.
    upload(page, sample_path("table_screenshot.png"))
    expect(page.locator("#extract")).to_be_enabled()
    page.locator("#extract").click()
    expect(stats).to_contain_text("1160×554", timeout=120_000)
