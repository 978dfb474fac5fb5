"""Safe by default: beyond loopback, the API needs a key and the page a login, unless the user
says they are meant to be open. The rule (ocr_bundle.exposure) and each place that applies it:
the start script, the launcher, the page. Nothing here binds a port or sends traffic: every
refusal comes before anything starts (192.0.2.1 is a documentation address, never reached)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from helpers import PYTHON, ROOT
from ocr_bundle.exposure import api_problem, is_loopback, page_problem, parse_auth

FAR = "192.0.2.1"


@pytest.mark.parametrize("host, loopback", [
    ("127.0.0.1", True), ("127.8.9.10", True), ("::1", True), ("[::1]", True), ("localhost", True),
    ("0.0.0.0", False), ("::", False), ("10.0.0.5", False), (FAR, False), ("gpu-box.example.org", False),
])
def test_what_counts_as_loopback(host, loopback):
    assert is_loopback(host) is loopback


def test_the_rule():
    assert api_problem("127.0.0.1", has_key=False, open_on_purpose=False) is None
    assert "without an API key" in api_problem(FAR, has_key=False, open_on_purpose=False)
    assert api_problem(FAR, has_key=True, open_on_purpose=False) is None
    assert api_problem("0.0.0.0", has_key=False, open_on_purpose=True) is None
    assert page_problem("localhost", auth=None, has_key=True) is None
    refused = page_problem("0.0.0.0", auth=None, has_key=True)
    assert "without a login" in refused and "the key would protect nothing" in refused and "UI_AUTH=none" in refused
    assert page_problem("0.0.0.0", auth="none", has_key=True) is None
    assert page_problem("0.0.0.0", auth="alice:pw", has_key=True) is None


def run(command: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items()
             if k not in ("VLLM_API_KEY", "UI_AUTH", "ALLOW_OPEN_API", "ALLOW_PLAINTEXT", "TLS_CERT", "TLS_KEY",
                          "TLS_CA", "VLLM_CA_CERT")}
    return subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=ROOT, env={**clean, **env})


@pytest.mark.parametrize("env, message", [
    ({"HOST": FAR}, f"refusing to serve the vLLM API on {FAR} without an API key"),
    ({"HOST": "0.0.0.0", "VLLM_API_KEY": "k"}, "refusing to serve the page on 0.0.0.0 without a login"),
    ({"UI_HOST": FAR}, f"refusing to serve the page on {FAR} without a login"),
    ({"JOIN": "http://10.0.0.1:8000", "HOST": "0.0.0.0", "ALLOW_OPEN_API": "1"},
     "refusing to start a joining server on 0.0.0.0 without an API key"),
    ({"ROUTER": "on", "HOST": FAR, "UI": "off"}, f"refusing to serve the vLLM API on {FAR} without an API key"),
    ({"ROUTER": "on", "VLLM_API_KEY": "k", "UI": "off"}, "the gateway (ROUTER=on) needs ROUTER_ADMIN_KEY"),
    ({"ROUTER": "on", "VLLM_API_KEY": "k", "ROUTER_ADMIN_KEY": "k", "UI": "off"},
     "ROUTER_ADMIN_KEY must differ from VLLM_API_KEY"),
    ({"JOIN": "http://192.0.2.1:8000", "VLLM_API_KEY": "k", "ROUTER_ADMIN_KEY": "a"},
     "HOST=127.0.0.1 is this machine's loopback address: the gateway at 192.0.2.1 cannot reach it"),
    ({"JOIN": "http://127.0.0.1:8000", "VLLM_API_KEY": "k"}, "a joining server needs ROUTER_ADMIN_KEY"),
    ({"UI_AUTH": "alice"}, "UI_AUTH must look like user:password"),
    ({"HOST": FAR, "VLLM_API_KEY": "k", "UI": "off"}, f"refusing to serve the vLLM API on {FAR} in plain HTTP"),
    ({"UI_HOST": "0.0.0.0", "UI_AUTH": "me:pw"}, "refusing to serve the page on 0.0.0.0 in plain HTTP"),
    ({"ROUTER": "on", "HOST": "0.0.0.0", "VLLM_API_KEY": "k", "ROUTER_ADMIN_KEY": "a", "UI": "off"},
     "refusing to serve the gateway on 0.0.0.0 in plain HTTP"),
    ({"JOIN": "http://192.0.2.1:8000", "HOST": "0.0.0.0", "VLLM_API_KEY": "k", "ROUTER_ADMIN_KEY": "a"},
     "refusing to serve the vLLM API on 0.0.0.0 in plain HTTP"),
    ({"TLS_CERT": "/nowhere/cert.pem"}, "TLS_CERT and TLS_KEY go together"),
    ({"STOP_GRACE": "2.5"}, "STOP_GRACE must be a whole number, 0 or more, not '2.5'"),
    ({"PORT": "99999"}, "PORT must be a port from 1 to 65535, not '99999'"),  # went to vLLM's argv
    ({"ROUTER": "on", "PORT": "http"}, "PORT must be a port from 1 to 65535, not 'http'"),  # before bash's PORT + 1
    ({"STARTUP_TIMEOUT": "15m", "UI_PORT": "0"},
     "UI_PORT must be a port from 1 to 65535, not '0'; STARTUP_TIMEOUT must be a number above 0, not '15m'"),
])
def test_the_start_script_refuses_an_unprotected_address_before_starting_anything(tmp_path, env, message):
    run_dir = tmp_path / "run"
    done = run([str(ROOT / "start_optimized.sh")], {"RUN_DIR": str(run_dir), "MODEL": "/nowhere", **env})
    assert done.returncode == 2, done.stdout + done.stderr
    assert message in done.stderr and "Traceback" not in done.stderr
    assert not any(run_dir.glob("*.pid")) and not any(run_dir.glob("*.log"))  # nothing was started


@pytest.mark.parametrize("env, message", [
    ({"NODES": "2", "NODE_RANK": "1", "HEAD_ADDRESS": "10.0.0.1"}, "NODES/NODE_RANK/HEAD_ADDRESS"),
    ({"ROUTER": "on", "JOIN": "http://10.0.0.1:8000"}, "exclude each other"),
    ({"JOIN": "10.0.0.1", "VLLM_API_KEY": "k", "ROUTER_ADMIN_KEY": "a"}, "JOIN must be the gateway's endpoint"),
    ({"ROUTER": "yes"}, "ROUTER must be on, only or off"),
])
def test_the_start_script_explains_a_wrong_multi_machine_setting_before_starting_anything(tmp_path, env, message):
    run_dir = tmp_path / "run"
    done = run([str(ROOT / "start_optimized.sh")], {"RUN_DIR": str(run_dir), "MODEL": "/nowhere", **env})
    assert done.returncode == 2 and message in done.stderr, done.stdout + done.stderr
    assert not any(run_dir.glob("*.pid"))


def test_the_stop_script_refuses_a_grace_it_cannot_use_and_stops_nothing(tmp_path):
    done = run([str(ROOT / "stop_optimized.sh")], {"RUN_DIR": str(tmp_path), "STOP_GRACE": "2.5"})
    assert done.returncode == 2 and "STOP_GRACE must be a whole number, 0 or more, not '2.5'" in done.stderr


def test_the_launcher_refuses_an_unprotected_address_and_accepts_an_explicit_opt_out(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    refused = run([PYTHON, str(ROOT / "start_vllm_server.py"), "--host", FAR, "--dry-run"], {})
    assert refused.returncode == 2 and f"refusing to serve the vLLM API on {FAR}" in refused.stderr
    # With the opt-out the exposure check passes; what fails next is the checkpoint, not the address.
    opened = run([PYTHON, str(ROOT / "start_vllm_server.py"), "--host", FAR, "--model", str(tmp_path), "--dry-run"],
                 {"ALLOW_OPEN_API": "1", "ALLOW_PLAINTEXT": "1"})
    assert "refusing to serve" not in opened.stderr and "not a LightOnOCR checkpoint" in opened.stderr


def test_no_script_takes_a_key_on_its_command_line():
    """A command line is visible to every user (ps): each script refuses --api-key and says why."""
    for script in ("batch_ocr.py", "stress_test.py", "quality_check.py", "app_vllm.py", "start_vllm_server.py"):
        done = run([PYTHON, str(ROOT / script), "--api-key", "s3cret"], {})
        assert done.returncode == 2 and "is not accepted" in done.stderr and "VLLM_API_KEY" in done.stderr, script
    passthrough = run([PYTHON, str(ROOT / "start_vllm_server.py"), "--dry-run", "--device", "cpu", "--",
                       "--api-key", "s3cret"], {"VLLM_API_KEY": "k"})
    assert passthrough.returncode == 2 and "visible to every user" in passthrough.stderr


def test_ui_auth_is_parsed_once_and_never_echoed():
    assert parse_auth("a:b,c:d:e") == [("a", "b"), ("c", "d:e")]
    assert parse_auth(None) is None and parse_auth("none") is None
    with pytest.raises(ValueError) as refused:
        parse_auth("alice:pw,bob")
    assert "pw" not in str(refused.value)


def test_the_page_refuses_to_serve_beyond_loopback_without_a_login():
    refused = run([PYTHON, str(ROOT / "app_vllm.py"), "--host", FAR], {"VLLM_API_KEY": "k"})
    assert refused.returncode == 2
    assert f"refusing to serve the page on {FAR} without a login" in refused.stderr
    assert "the key would protect nothing" in refused.stderr and "Traceback" not in refused.stderr


def test_the_exposure_check_runs_with_the_standard_library_alone():
    """The start script runs it with the system's python3, which may have no third-party package."""
    done = subprocess.run([sys.executable, "-S", "-m", "ocr_bundle.exposure", "--api-host", "0.0.0.0",
                           "--page-host", "0.0.0.0"], capture_output=True, text=True, timeout=30, cwd=ROOT,
                          env={"PYTHONPATH": str(ROOT), "ALLOW_OPEN_API": "1", "UI_AUTH": "none",
                               "ALLOW_PLAINTEXT": "1"})
    assert done.returncode == 0, done.stderr
    assert "no API key, on purpose" in done.stderr and "no login, on purpose (UI_AUTH=none)" in done.stderr
    assert "the vLLM API on 0.0.0.0 serves plain HTTP, on purpose (ALLOW_PLAINTEXT=1)" in done.stderr
    assert "the page on 0.0.0.0 serves plain HTTP, on purpose" in done.stderr
