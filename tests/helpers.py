"""Process helpers for the tests: real processes in their own process groups, deadlines.

Starting, readiness and stopping go through ocr_bundle.serve.processes, the implementation the
shell scripts and the GPU driver use too."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
READER_CHECKPOINT = ROOT / "tests" / "fixtures" / "lightonocr-reader"  # scripts/train_reader.py wrote it
# scripts/train_grounding.py wrote it; "LightOnOCR-3-1B" in its name is how clients know it grounds
GROUNDING_CHECKPOINT = ROOT / "tests" / "fixtures" / "lightonocr-3-1b-grounding"

from ocr_bundle.loadtest.pollers import parse_prometheus  # noqa: E402
from ocr_bundle.serve.processes import NotReady, Service, stop, wait_ready  # noqa: E402

if TYPE_CHECKING:
    from ocr_bundle.inputs import InputFile


def as_input(path: Path) -> InputFile:
    """A file as the converter takes it when named on its own: its name is its path in the corpus."""
    from pathlib import PurePath

    from ocr_bundle.inputs import InputFile

    return InputFile(Path(os.path.abspath(path)), PurePath(Path(path).name))


_GIVEN_PORTS: set[int] = set()


def free_port() -> int:
    """A port nothing listens on, and one this test session has not handed out before: two calls in a
    row could otherwise get the same port from the kernel (a CI run started vLLM and the page on one)."""
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        if port not in _GIVEN_PORTS:
            _GIVEN_PORTS.add(port)
            return port


def log_tail(path: Path, lines: int = 60) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


@dataclass
class Started:
    process: subprocess.Popen
    log: Path
    url: str
    service: Service

    def alive(self) -> bool:
        self.process.poll()  # reap an exited leader: a zombie is not alive
        return self.service.leader_alive()


def start_process(command: list[str], log: Path, url: str, env: dict[str, str] | None = None) -> Started:
    """Start `command` in its own session (process group), output to `log`."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as handle:
        process = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT, cwd=ROOT,
                                   env={**os.environ, **(env or {})}, start_new_session=True)
    return Started(process, log, url, Service.of(process.pid))


def wait_until_ready(started: Started, path: str, deadline_s: float) -> None:
    """Poll `url+path` until it answers 200, failing fast if the process dies."""
    try:
        wait_ready(started.url + path, started.alive, deadline_s, name=Path(started.process.args[1]).name)
    except NotReady as exc:
        raise RuntimeError(f"{exc}; log tail:\n{log_tail(started.log)}") from exc


def stop_group(started: Started, grace_s: float = 20.0) -> None:
    """Stop the leader, then its whole process group (vLLM forks engine processes)."""
    stop(started.service, "test process", grace_s, say=lambda _: None, reap=started.process.poll)
    try:
        started.process.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass


def server_requests(url: str, tls_options: dict | None = None) -> float:
    """Requests the vLLM server has finished, for any reason (aborted ones included). `tls_options`:
    verify= and cert= for a server over HTTPS (behind a gateway: a cluster machine's certificate)."""
    text = requests.get(f"{url}/metrics", timeout=10, **(tls_options or {})).text
    return parse_prometheus(text, {"vllm:request_success_total": sum}).get("vllm:request_success_total", 0.0)


def running_requests(url: str, waiting_too: bool = False) -> float:
    """Requests the vLLM server is running now (and waiting to run, if asked)."""
    wanted = {"vllm:num_requests_running": sum, "vllm:num_requests_waiting": sum}
    values = parse_prometheus(requests.get(f"{url}/metrics", timeout=10).text, wanted)
    return values.get("vllm:num_requests_running", 0.0) + (values.get("vllm:num_requests_waiting", 0.0)
                                                           if waiting_too else 0.0)


def wait_for(condition, timeout_s: float, what: str, interval_s: float = 0.1):
    """Poll `condition()` until it returns something true; that value. Fails after the deadline."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        value = condition()
        if value:
            return value
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")


def made_certs(out: Path, *machines: str) -> Path:
    """scripts/make_certs.py as a user runs it: the cluster's CA in `out`, a folder per NAME=ADDRESS."""
    done = subprocess.run([PYTHON, str(ROOT / "scripts" / "make_certs.py"), "--out", str(out), *machines],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return out


def set_output_budget(page, tokens: int) -> None:
    """In the page (a Playwright page), open Settings and set Max output tokens to `tokens`.

    It types only once the opened accordion shows the slider's own value, and returns only once
    the slider has taken the new one, typing again if it has not: CI runs caught the page asking
    for 4,096 tokens after a fill typed while the page was still wiring its inputs (a busy machine),
    so the typed value never reached the slider."""
    from playwright.sync_api import expect

    from ocr_bundle.settings import MAX_OUTPUT_TOKENS

    page.get_by_text("Settings").click()
    budget = page.locator("#max-tokens input[type=number]")
    slider = page.locator("#max-tokens input[type=range]")
    expect(budget).to_have_value(str(MAX_OUTPUT_TOKENS))
    for attempt in range(4):
        budget.fill(str(tokens))
        budget.press("Enter")
        try:
            expect(slider).to_have_value(str(tokens), timeout=5_000)
            return
        except AssertionError:
            if attempt == 3:
                raise
