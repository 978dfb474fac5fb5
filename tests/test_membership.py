"""The gateway's settings and a server's membership, without vLLM or SMG (tests/test_gateway.py
runs them for real). The mistakes a person makes when joining a machine are refused before
vLLM starts; a stand-in gateway (standard library) answers what SMG would, or what a wrong
URL would, and records every request and the key it carried."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable

import pytest

from helpers import ROOT
from ocr_bundle.loadtest.pollers import counter_delta, fold, gauges_by_server
from ocr_bundle.serve.gateway import gateway_arguments
from ocr_bundle.serve.membership import Gateway, GatewayRefused, GatewayUnreachable, advertised_url, keep, preflight
from stand_in import StandIn

ADMIN, CLIENT = "admin-key-1", "client-key-1"


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def smg(pool: list[str] | None = None) -> Callable:
    """What SMG answers: /liveness to anyone, the pool to the admin key, chat to the client key."""
    pool = [] if pool is None else pool

    def answer(method: str, path: str, key: str | None):
        if path == "/liveness":
            return 200, "OK", {}
        if path.startswith("/workers"):
            if key != ADMIN:
                return 401, '{"error": "unauthorized"}', {}
            if method == "POST":
                pool.append("http://127.0.0.1:9999")
                return 202, '{"status": "accepted"}', {}
            return 200, json.dumps({"workers": [{"id": str(i), "url": url} for i, url in enumerate(pool)]}), {}
        if path == "/v1/chat/completions":
            return (400, '{"error": "bad body"}', {}) if key == CLIENT else (401, '{"error": "unauthorized"}', {})
        return 404, "", {}
    return answer


def test_the_gateway_fails_over_fast_and_bounds_a_request_by_the_worst_page():
    args = gateway_arguments("0.0.0.0", 8000, 29000, 300)
    assert flag(args, "--policy") == "round_robin"
    assert flag(args, "--request-timeout-secs") == "300"
    assert int(flag(args, "--health-check-interval-secs")) <= 5 and int(flag(args, "--cb-failure-threshold")) <= 3
    assert flag(args, "--prometheus-host") == "127.0.0.1"


def test_the_gateway_keys_never_reach_a_command_line_and_it_needs_an_admin_key():
    def dry_run(env):
        return subprocess.run([sys.executable, "-m", "ocr_bundle.serve.gateway", "--dry-run", "--port", "8123"],
                              capture_output=True, text=True, cwd=ROOT, env={**os.environ, **env})

    done = dry_run({"VLLM_API_KEY": "s3cret-9", "ROUTER_ADMIN_KEY": "adm1n-9"})
    assert done.returncode == 0, done.stderr
    assert "--port 8123" in done.stdout and "--api-key <VLLM_API_KEY>" in done.stdout
    assert "s3cret-9" not in done.stdout + done.stderr and "adm1n-9" not in done.stdout + done.stderr
    refused = dry_run({"VLLM_API_KEY": "s3cret-9", "ROUTER_ADMIN_KEY": ""})
    assert refused.returncode == 2 and "ROUTER_ADMIN_KEY is not set" in refused.stderr


def test_the_advertised_address_is_the_one_the_gateway_can_reach():
    assert advertised_url("10.1.2.3", 8000, "http://10.1.2.1:8000") == "http://10.1.2.3:8000"
    assert advertised_url("localhost", 8002, "http://127.0.0.1:8000") == "http://127.0.0.1:8002"
    # Bound to every interface: this machine's address on the route to the head.
    assert advertised_url("0.0.0.0", 8002, "http://127.0.0.1:8000") == "http://127.0.0.1:8002"


def test_a_gateway_that_is_not_there_is_unreachable_not_an_error_to_give_up_on():
    with pytest.raises(GatewayUnreachable, match="127.0.0.1:9"):
        Gateway("http://127.0.0.1:9", ADMIN, timeout_s=2).servers()


def test_preflight_accepts_a_gateway_that_takes_both_keys():
    with StandIn(smg()) as gateway:
        preflight(Gateway(gateway.url, ADMIN, CLIENT), "http://127.0.0.1:8001")
        # The client key went only to the one chat check, the admin key only to the pool.
        assert {(path, key) for _, path, key, _ in gateway.seen} == {
            ("/liveness", None), ("/workers", ADMIN), ("/v1/chat/completions", CLIENT)}


@pytest.mark.parametrize("admin, client, message", [
    ("wrong", CLIENT, r"refused ROUTER_ADMIN_KEY \(401\)"),
    (ADMIN, "wrong", "refuses this machine's VLLM_API_KEY"),
])
def test_preflight_refuses_a_key_the_gateway_refuses(admin, client, message):
    with StandIn(smg()) as gateway, pytest.raises(GatewayRefused, match=message):
        preflight(Gateway(gateway.url, admin, client), "http://127.0.0.1:8001")


@pytest.mark.parametrize("what, answer", [
    ("a keyed vLLM server", lambda method, path, key: (401, '{"error": "Unauthorized"}', {})),
    ("the page", lambda method, path, key: (404, "<html>Not Found</html>", {})),
    ("vllm-router", lambda method, path, key: (200, '{"urls": []}', {}) if path == "/list_workers" else (404, "", {})),
])
def test_preflight_refuses_a_join_url_that_is_not_a_gateway(what, answer):
    with StandIn(answer) as impostor, pytest.raises(GatewayRefused, match="is not a gateway"):
        preflight(Gateway(impostor.url, ADMIN, CLIENT), "http://127.0.0.1:8001")
    assert all(key is None for _, _, key, _ in impostor.seen), what  # no key went to it


def test_no_key_follows_a_redirect():
    with StandIn(smg()) as elsewhere:
        def redirect(method, path, key):
            return (200, "OK", {}) if path == "/liveness" else (307, "", {"Location": f"{elsewhere.url}{path}"})

        with StandIn(redirect) as gateway, pytest.raises(GatewayRefused, match="redirects to"):
            preflight(Gateway(gateway.url, ADMIN, CLIENT), "http://127.0.0.1:8001")
        assert elsewhere.seen == []


def test_preflight_refuses_an_address_the_gateway_cannot_reach_without_contacting_it():
    # 192.0.2.1 is a documentation address: the check refuses before any traffic.
    with pytest.raises(GatewayRefused, match="cannot reach http://127.0.0.1:8001"):
        preflight(Gateway("http://192.0.2.1:8000", ADMIN, CLIENT), "http://127.0.0.1:8001")
    with StandIn(smg()) as gateway, pytest.raises(GatewayRefused, match="the gateway's own address"):
        preflight(Gateway(gateway.url, ADMIN, CLIENT), gateway.url)


def test_the_keeper_never_gives_up_while_its_server_lives(monkeypatch):
    """Down, refused, down again: each failure is logged and tried again; then it joins, and on
    stop it leaves."""
    outcomes = [GatewayUnreachable("down"), GatewayRefused("refused (401)"), GatewayUnreachable("down"), None]
    stop, said, calls = threading.Event(), [], []

    class FlakyGateway:
        url = "http://gateway"
        trust = None  # plain HTTP

        def __init__(self):
            self.pool: dict[str, dict] = {}

        def servers(self):
            outcome = outcomes.pop(0) if outcomes else None
            calls.append(outcome)
            if outcome is not None:
                raise outcome
            if self.pool and len(calls) > 6:
                stop.set()
            return dict(self.pool)

        def add(self, server):
            self.pool[server] = {"id": "1"}

        def remove(self, server):
            self.pool.pop(server, None)

    gateway = FlakyGateway()
    monkeypatch.setattr("ocr_bundle.serve.membership.server_healthy", lambda url, trust: True)
    monkeypatch.setattr("ocr_bundle.serve.membership.drain", lambda *args: None)
    rc = keep(gateway, "http://127.0.0.1:8001", lambda: True, stop, said.append, interval_s=0.01)
    assert rc == 0
    assert sum("trying again" in line for line in said) == 3
    assert any("joined the gateway" in line for line in said) and said[-1].startswith("left the gateway")
    assert gateway.pool == {}


def test_gauges_fold_over_servers_and_gateway_counters_are_differences():
    folded = fold({"a": {"vllm:kv_cache_usage_perc": 0.2, "vllm:num_requests_running": 3},
                   "b": {"vllm:kv_cache_usage_perc": 0.7, "vllm:num_requests_running": 5}})
    assert folded == {"vllm:kv_cache_usage_perc": 0.7, "vllm:num_requests_running": 8}
    before = {"retries": 1.0, "retries_exhausted": 0.0, "breaker_transitions": 0.0, "gateway_errors": 0.0,
              "requests_per_server": {"a": 10.0}}
    after = {"retries": 7.0, "retries_exhausted": 0.0, "breaker_transitions": 2.0, "gateway_errors": 0.0,
             "requests_per_server": {"a": 30.0, "b": 12.0}}
    delta = counter_delta(before, after)
    assert delta["retries"] == 6 and delta["breaker_transitions"] == 2
    assert delta["requests_per_server"] == {"a": 20.0, "b": 12.0}
    assert counter_delta(None, after) is None


def test_the_gateway_engine_metrics_split_by_server():
    text = "\n".join([
        "# TYPE vllm:num_requests_running gauge",
        'vllm:num_requests_running{engine="0",worker_addr="http://a:1"} 3',
        'vllm:num_requests_running{engine="1",worker_addr="http://a:1"} 2',
        'vllm:kv_cache_usage_perc{engine="0",worker_addr="http://a:1"} 0.25',
        'vllm:num_requests_running{engine="0",worker_addr="http://b:2"} 7',
        'vllm:request_success_total{engine="0",worker_addr="http://b:2"} 70',
    ])
    assert gauges_by_server(text) == {"http://a:1": {"vllm:num_requests_running": 5.0,
                                                     "vllm:kv_cache_usage_perc": 0.25},
                                      "http://b:2": {"vllm:num_requests_running": 7.0}}


def test_the_start_script_refuses_a_join_url_that_is_not_a_gateway_before_vllm_starts(tmp_path):
    """The head's page (or its vLLM port) given as JOIN: exit 2 with the reason, nothing started."""
    page = lambda method, path, key: (404, "<html>Not Found</html>", {})  # noqa: E731
    with StandIn(page) as not_a_gateway:
        env = {**os.environ, "RUN_DIR": str(tmp_path / "run"), "JOIN": not_a_gateway.url, "MODEL": "/nowhere",
               "VLLM_API_KEY": CLIENT, "ROUTER_ADMIN_KEY": ADMIN, "HOST": "127.0.0.1", "PORT": "9"}
        done = subprocess.run([str(ROOT / "start_optimized.sh")], capture_output=True, text=True, timeout=60,
                              cwd=ROOT, env=env)
    assert done.returncode == 2 and "is not a gateway" in done.stderr, done.stdout + done.stderr
    assert [path.name for path in (tmp_path / "run").glob("*")] == [".lock"]  # the RUN_DIR's lock alone
    assert all(key is None for _, _, key, _ in not_a_gateway.seen)  # no key went to it
