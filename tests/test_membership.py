"""The router's settings and a server's membership, without vLLM (tests/test_router.py runs them for real)."""

from __future__ import annotations

import os
import subprocess
import sys

from helpers import ROOT
from ocr_bundle.loadtest.pollers import counter_delta, fold
from ocr_bundle.serve.membership import Router, RouterUnreachable, advertised_url
from ocr_bundle.serve.router import router_arguments


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def test_the_router_fails_over_fast_and_bounds_a_request_by_the_worst_page():
    args = router_arguments("0.0.0.0", 8000, 29000, 300)
    assert flag(args, "--policy") == "round_robin"  # not cache_aware, which keeps picking a dead server
    assert flag(args, "--request-timeout-secs") == "300"  # not the router's 30 minutes
    assert int(flag(args, "--health-check-interval-secs")) <= 5 and int(flag(args, "--cb-failure-threshold")) <= 3
    assert flag(args, "--prometheus-host") == "127.0.0.1"


def test_the_key_never_reaches_a_command_line():
    done = subprocess.run([sys.executable, "-m", "ocr_bundle.serve.router", "--dry-run", "--port", "8123"],
                          capture_output=True, text=True, cwd=ROOT, env={**os.environ, "VLLM_API_KEY": "s3cret-9"})
    assert done.returncode == 0, done.stderr
    assert "--port 8123" in done.stdout and "--api-key <VLLM_API_KEY>" in done.stdout and "s3cret-9" not in done.stdout


def test_the_advertised_address_is_the_one_the_router_can_reach():
    assert advertised_url("10.1.2.3", 8000, "http://10.1.2.1:8000") == "http://10.1.2.3:8000"
    assert advertised_url("localhost", 8002, "http://127.0.0.1:8000") == "http://127.0.0.1:8002"
    # Bound to every interface: this machine's address on the route to the head.
    assert advertised_url("0.0.0.0", 8002, "http://127.0.0.1:8000") == "http://127.0.0.1:8002"


def test_a_router_that_is_not_there_is_unreachable_not_an_error_to_give_up_on():
    router = Router("http://127.0.0.1:9", timeout_s=2)
    try:
        router.members()
    except RouterUnreachable as exc:
        assert "127.0.0.1:9" in str(exc)
    else:
        raise AssertionError("a closed port answered")


def test_gauges_fold_over_servers_and_router_counters_are_differences():
    folded = fold({"a": {"vllm:kv_cache_usage_perc": 0.2, "vllm:num_requests_running": 3},
                   "b": {"vllm:kv_cache_usage_perc": 0.7, "vllm:num_requests_running": 5}})
    assert folded == {"vllm:kv_cache_usage_perc": 0.7, "vllm:num_requests_running": 8}
    before = {"retries": 1.0, "retries_exhausted": 0.0, "breaker_transitions": 0.0, "router_errors": 0.0,
              "requests_per_server": {"a": 10.0}}
    after = {"retries": 7.0, "retries_exhausted": 0.0, "breaker_transitions": 2.0, "router_errors": 0.0,
             "requests_per_server": {"a": 30.0, "b": 12.0}}
    delta = counter_delta(before, after)
    assert delta["retries"] == 6 and delta["breaker_transitions"] == 2
    assert delta["requests_per_server"] == {"a": 20.0, "b": 12.0}
    assert counter_delta(None, after) is None
