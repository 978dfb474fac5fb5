"""The page's login: its cookie only over HTTPS, password guessing slowed, the password never a flag.

Pure parts with exact answers (the back-off with a fake clock, the header rewriting), then the real
page (app_vllm.py, Gradio, HTTPS with a cluster CA from scripts/make_certs.py) with an HTTP client.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
import requests

from helpers import PYTHON, ROOT, free_port, log_tail, made_certs, start_process, stop_group, wait_for
from ocr_bundle.page_guard import LoginBackoff, secure_response_headers, without_unsecure_cookie


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_failed_logins_double_the_wait_after_the_free_ones_and_a_success_clears_them():
    clock = FakeClock()
    backoff = LoginBackoff(free_failures=3, max_delay_s=8, forget_after_s=60, clock=clock)
    assert [backoff.failed("10.0.0.9") for _ in range(3)] == [0, 0, 0]
    assert backoff.wait_s("10.0.0.9") == 0
    delays = []
    for _ in range(5):
        delays.append(backoff.failed("10.0.0.9"))
        assert backoff.wait_s("10.0.0.9") == delays[-1]
        clock.now += delays[-1]
    assert delays == [1, 2, 4, 8, 8]  # doubling, capped
    assert backoff.wait_s("10.0.0.7") == 0  # per address
    backoff.succeeded("10.0.0.9")
    assert backoff.failures("10.0.0.9") == 0 and backoff.failed("10.0.0.9") == 0
    for _ in range(5):
        backoff.failed("10.0.0.8")
    clock.now += 61  # a quiet minute: forgotten
    assert backoff.failures("10.0.0.8") == 0 and backoff.wait_s("10.0.0.8") == 0


def test_over_https_the_unsecure_cookie_is_neither_set_nor_accepted():
    headers = [(b"content-type", b"application/json"),
               (b"set-cookie", b"access-token-abc=T1; HttpOnly; Path=/; SameSite=none; Secure"),
               (b"set-cookie", b"access-token-unsecure-abc=T1; HttpOnly; Path=/"),
               (b"set-cookie", b"other=1; Path=/")]
    assert secure_response_headers(headers) == [
        (b"content-type", b"application/json"),
        (b"set-cookie", b"access-token-abc=T1; HttpOnly; Path=/; SameSite=none; Secure"),
        (b"set-cookie", b"other=1; Path=/; Secure")]
    request = [(b"host", b"x"), (b"cookie", b"a=1; access-token-unsecure-abc=T1; b=2")]
    assert without_unsecure_cookie(request) == [(b"host", b"x"), (b"cookie", b"a=1; b=2")]
    assert without_unsecure_cookie([(b"cookie", b"access-token-unsecure-abc=T1")]) == []


def test_the_password_is_not_taken_as_a_flag():
    done = subprocess.run([PYTHON, str(ROOT / "app_vllm.py"), "--auth", "alice:secret-pw"], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 2 and "--auth is not accepted" in done.stderr and "UI_AUTH" in done.stderr
    assert "secret-pw" not in done.stderr + done.stdout


@pytest.mark.slow
def test_the_page_over_https_keeps_its_login_cookie_secure_and_slows_guessing(tmp_path: Path):
    certs = made_certs(tmp_path / "certs", "page=127.0.0.1")
    port = free_port()
    env = {"UI_AUTH": "alice:right-password", "TLS_CERT": str(certs / "page" / "cert.pem"),
           "TLS_KEY": str(certs / "page" / "key.pem"), "TLS_CA": str(certs / "ca.pem"), "UI_PORT": str(port),
           "UI_HOST": "127.0.0.1", "VLLM_URL": f"http://127.0.0.1:{free_port()}", "VLLM_API_KEY": ""}
    page = start_process([PYTHON, str(ROOT / "app_vllm.py")], tmp_path / "ui.log", f"https://127.0.0.1:{port}",
                         {**env, "PYTHONPATH": str(ROOT)})
    ca = str(certs / "ca.pem")
    try:
        def up():
            try:
                return requests.get(f"{page.url}/config", verify=ca, timeout=2).status_code == 401
            except requests.RequestException:
                assert page.alive(), log_tail(page.log)
                return False

        wait_for(up, 120, "the page")
        login = requests.post(f"{page.url}/login", data={"username": "alice", "password": "right-password"},
                              verify=ca, timeout=10)
        assert login.status_code == 200
        set_cookies = login.raw.headers.getlist("set-cookie")
        assert set_cookies and all("Secure" in cookie for cookie in set_cookies), set_cookies
        assert not [cookie for cookie in set_cookies if cookie.startswith("access-token-unsecure")]
        (token,) = list(login.cookies)
        assert requests.get(f"{page.url}/config", cookies={token.name: token.value}, verify=ca,
                            timeout=10).status_code == 200
        # The same token under Gradio's unsecure name (what a browser would send over http://) opens nothing.
        unsecure = token.name.replace("access-token-", "access-token-unsecure-", 1)
        assert requests.get(f"{page.url}/config", cookies={unsecure: token.value}, verify=ca,
                            timeout=10).status_code == 401

        answers, started = [], time.monotonic()
        for _ in range(8):
            wrong = requests.post(f"{page.url}/login", data={"username": "alice", "password": "guess"}, verify=ca,
                                  timeout=10)
            answers.append((wrong.status_code, wrong.headers.get("retry-after")))
        assert answers[:6] == [(400, None)] * 6  # five free failures, the sixth sets a 1 s wait
        assert answers[6:] == [(429, "1")] * 2, answers
        # Even the right password waits its turn, then gets in, which clears the count.
        assert requests.post(f"{page.url}/login", data={"username": "alice", "password": "right-password"},
                             verify=ca, timeout=10).status_code == 429
        time.sleep(1.2)
        assert requests.post(f"{page.url}/login", data={"username": "alice", "password": "right-password"},
                             verify=ca, timeout=10).status_code == 200
        wait_for(lambda: "6 failed logins from 127.0.0.1: its next attempt is allowed in 1 s" in log_tail(page.log),
                 10, "the page's log to say it")
        print(f"\n[login] 8 wrong passwords in {time.monotonic() - started:.2f} s: {answers}")
    finally:
        stop_group(page)
