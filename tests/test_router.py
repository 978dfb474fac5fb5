"""Several servers behind the head's router, through the bundle's own scripts, on the CPU backend.

One head (ROUTER=on: vllm-router on PORT, its own server on SERVER_PORT, the page) and one
machine joining it (JOIN=...), both on this host with their own ports and run directories,
started once for this module. The tests run in file order: a server is killed mid-batch and
restarted, killed mid-stress-run and restarted, stopped with stop_optimized.sh mid-batch;
then the head is stopped.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests
from PIL import Image

from conftest import TEST_MAX_MODEL_LEN
from helpers import PYTHON, ROOT, free_port, server_requests, wait_for
from ocr_bundle.loadtest.pollers import router_counters
from ocr_bundle.serve.membership import Router
from ocr_bundle.serve.processes import Service, read_pid_file

sys.path.insert(0, str(ROOT / "scripts"))
from make_pdf import image_pdf, jpeg_of  # noqa: E402

KEY = "router-test-key"
SERVER_ARGS = ("--max-model-len", str(TEST_MAX_MODEL_LEN), "--cpu-kv-cache-gb", "1")

pytestmark = [pytest.mark.slow, pytest.mark.needs_vllm]


@dataclass
class Node:
    env: dict[str, str]

    @property
    def run_dir(self) -> Path:
        return Path(self.env["RUN_DIR"])

    def script(self, name: str, timeout: float = 600) -> subprocess.CompletedProcess:
        argv = SERVER_ARGS if name == "start_optimized.sh" else ()
        return subprocess.run([str(ROOT / name), *argv], capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                              env={**os.environ, **self.env})

    def start(self) -> subprocess.Popen:
        return subprocess.Popen([str(ROOT / "start_optimized.sh"), *SERVER_ARGS], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, cwd=ROOT, env={**os.environ, **self.env})

    def service(self, name: str) -> Service | None:
        return read_pid_file(self.run_dir / f"{name}.pid")

    def kill_server(self) -> None:
        """SIGKILL the whole vLLM process group: a machine lost, no goodbye."""
        os.killpg(self.service("vllm").pid, signal.SIGKILL)


@dataclass
class Cluster:
    head: Node
    worker: Node
    router_url: str
    head_server_url: str
    worker_url: str
    metrics_url: str

    @property
    def router(self) -> Router:
        return Router(self.router_url, KEY)

    def members(self) -> list[str]:
        return self.router.members()


@pytest.fixture(scope="module")
def cluster(tiny_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("cluster")
    router_port, server_port, worker_port, metrics_port = (free_port() for _ in range(4))
    common = {"MODEL": str(tiny_checkpoint), "PYTHON": PYTHON, "VLLM_API_KEY": KEY, "HOST": "127.0.0.1",
              "STOP_GRACE": "20", "UI_AUTH": ""}
    head = Node({**common, "RUN_DIR": str(root / "head"), "ROUTER": "on", "PORT": str(router_port),
                 "SERVER_PORT": str(server_port), "UI_PORT": str(free_port()), "UI_HOST": "127.0.0.1",
                 "ROUTER_METRICS_PORT": str(metrics_port)})
    worker = Node({**common, "RUN_DIR": str(root / "worker"), "PORT": str(worker_port),
                   "JOIN": f"http://127.0.0.1:{router_port}"})
    # Both at once, as two machines would: the worker keeps trying until the head's router answers.
    starts = [head.start(), worker.start()]
    outputs = [start.communicate(timeout=900)[0] for start in starts]
    try:
        for start, output in zip(starts, outputs):
            assert start.returncode == 0, output
        yield Cluster(head, worker, f"http://127.0.0.1:{router_port}", f"http://127.0.0.1:{server_port}",
                      f"http://127.0.0.1:{worker_port}", f"http://127.0.0.1:{metrics_port}/metrics")
    finally:
        for node in (worker, head):
            node.script("stop_optimized.sh")


def a_pdf(path: Path, pages: int) -> Path:
    path.write_bytes(image_pdf(pages, jpeg_of(Image.new("RGB", (300, 400), "white")), (150, 200)))
    return path


def batch(cluster: Cluster, pdf: Path, out: Path) -> subprocess.Popen:
    return subprocess.Popen([PYTHON, str(ROOT / "batch_ocr.py"), str(pdf), "--out", str(out), "--url",
                             cluster.router_url, "--max-tokens", "24", "--max-attempts", "1", "--concurrency", "4",
                             "--quiet"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
                            env={**os.environ, "VLLM_API_KEY": KEY})


def kill_once_serving(cluster: Cluster, served_before: float) -> float:
    """SIGKILL the joining server once it has answered a few requests of the run; when."""
    wait_for(lambda: server_requests(cluster.worker_url) >= served_before + 3, 300, "the worker to take work")
    cluster.worker.kill_server()
    return time.monotonic()


def assert_every_page_once(out: Path, pages: int) -> None:
    manifest = json.loads(next(out.rglob("manifest.json")).read_text())
    records = manifest["pages"]
    assert len(records) == pages
    # Converted, every one ("flagged": the random-weight model ran into --max-tokens, as it does alone).
    assert {record["status"] for record in records.values()} <= {"ok", "flagged"}
    # One attempt each: the router hid the loss; no page was sent twice by the client.
    assert {record["attempts"] for record in records.values()} == {1}


def restart_worker(cluster: Cluster) -> float:
    """The lost machine comes back through the start script; seconds until it is in the list again."""
    start = time.monotonic()
    started = cluster.worker.script("start_optimized.sh")
    assert started.returncode == 0, started.stdout + started.stderr
    wait_for(lambda: cluster.worker_url in cluster.members(), 30, "the restarted server to rejoin")
    return time.monotonic() - start


def test_both_servers_joined_and_every_door_needs_the_key(cluster: Cluster):
    """vllm-router 0.1.17 passes the client's Authorization header on and does not check it
    itself: the key is enforced by every server behind it, the head's own included."""
    assert sorted(cluster.members()) == sorted([cluster.head_server_url, cluster.worker_url])
    for url in (cluster.router_url, cluster.worker_url, cluster.head_server_url):
        assert requests.get(f"{url}/v1/models", timeout=10).status_code == 401, url
        assert requests.get(f"{url}/v1/models", headers={"Authorization": "Bearer wrong"},
                            timeout=10).status_code == 401, url
    answer = requests.get(f"{cluster.router_url}/v1/models", headers={"Authorization": f"Bearer {KEY}"}, timeout=10)
    assert answer.status_code == 200 and answer.json()["data"]
    # The router sends the key on: a chat request through it reaches a key-protected server.
    served = server_requests(cluster.worker_url) + server_requests(cluster.head_server_url)
    for _ in range(2):
        chat = requests.post(f"{cluster.router_url}/v1/chat/completions", headers={"Authorization": f"Bearer {KEY}"},
                             json={"model": answer.json()["data"][0]["id"], "max_tokens": 4,
                                   "messages": [{"role": "user", "content": "hi"}]}, timeout=120)
        assert chat.status_code == 200, chat.text
    assert server_requests(cluster.worker_url) + server_requests(cluster.head_server_url) == served + 2


def test_a_batch_survives_a_server_killed_mid_run_and_the_server_rejoins(cluster: Cluster, tmp_path: Path):
    pages = 40
    pdf = a_pdf(tmp_path / "doc.pdf", pages)
    counted_before = router_counters(cluster.metrics_url)
    served_before = server_requests(cluster.worker_url)
    started = time.monotonic()
    run = batch(cluster, pdf, tmp_path / "out")
    killed_at = kill_once_serving(cluster, served_before)
    output = run.communicate(timeout=600)[0]
    elapsed = time.monotonic() - started
    assert run.returncode == 0, output
    assert_every_page_once(tmp_path / "out", pages)
    counted = router_counters(cluster.metrics_url)
    retries = counted["retries"] - counted_before["retries"]
    print(f"\n[failover] batch: {pages}/{pages} pages, exit 0, {elapsed:.1f} s, {retries:.0f} router retries, "
          f"finished {time.monotonic() - killed_at:.1f} s after the kill")
    assert elapsed < 300 / 2  # well under the router's request timeout: nothing waited for it
    # The dead server's membership keeper takes it off the list.
    wait_for(lambda: cluster.worker_url not in cluster.members(), 30, "the killed server to leave the list")

    rejoin_s = restart_worker(cluster)
    before = server_requests(cluster.worker_url)
    second = batch(cluster, a_pdf(tmp_path / "again.pdf", 8), tmp_path / "again")
    assert second.communicate(timeout=300)[0] is not None and second.returncode == 0
    took = server_requests(cluster.worker_url) - before
    print(f"[failover] restarted server back in the list {rejoin_s:.1f} s after its start script began; "
          f"it answered {took:.0f} of the next 8 pages")
    assert took >= 2  # round robin: about half


def test_a_stress_run_accounts_for_every_request_when_a_server_dies(cluster: Cluster, tmp_path: Path):
    requests_sent = 40
    served_before = server_requests(cluster.worker_url)
    run = subprocess.Popen(
        [PYTHON, str(ROOT / "stress_test.py"), "--url", cluster.router_url, "--concurrency", "4", "--requests",
         str(requests_sent), "--warmup", "0", "--max-tokens", "24", "--no-stream", "--quiet", "--out",
         str(tmp_path / "report"), "--router-metrics", cluster.metrics_url],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT, env={**os.environ, "VLLM_API_KEY": KEY})
    kill_once_serving(cluster, served_before)
    output = run.communicate(timeout=600)[0]
    assert run.returncode == 0, output
    report = json.loads((tmp_path / "report" / "results.json").read_text())
    level = report["levels"][0]
    assert level["requests"] == requests_sent and level["ok"] == requests_sent and level["errors"] == 0
    assert sorted(report["environment"]["servers"]) == sorted([cluster.head_server_url, cluster.worker_url])
    router = level["vllm"]["router"]
    assert router is not None and sum(router["requests_per_server"].values()) >= requests_sent
    # Each server was read directly; the killed one has samples from before its death.
    assert set(level["vllm"]["servers"]) == {cluster.head_server_url, cluster.worker_url}
    markdown = (tmp_path / "report" / "report.md").read_text()
    assert "Behind a router" in markdown and "retries" in markdown
    print(f"\n[failover] stress: {level['ok']}/{requests_sent} ok, {router['retries']:.0f} router retries, "
          f"{router['breaker_transitions']:.0f} breaker transitions")
    restart_worker(cluster)


def test_a_server_stopped_by_its_script_leaves_the_router_and_fails_no_request(cluster: Cluster, tmp_path: Path):
    pages = 24
    served_before = server_requests(cluster.worker_url)
    run = batch(cluster, a_pdf(tmp_path / "doc.pdf", pages), tmp_path / "out")
    wait_for(lambda: server_requests(cluster.worker_url) >= served_before + 2, 300, "the worker to take work")
    stopped = cluster.worker.script("stop_optimized.sh")
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert "left the router" in (cluster.worker.run_dir / "membership.log").read_text()
    assert cluster.worker_url not in cluster.members()
    output = run.communicate(timeout=600)[0]
    assert run.returncode == 0, output
    assert_every_page_once(tmp_path / "out", pages)


def test_stopping_the_head_stops_its_router_page_and_server_and_nothing_else(cluster: Cluster):
    services = {name: cluster.head.service(name) for name in ("router", "vllm", "membership", "ui")}
    assert all(service is not None and service.alive() for service in services.values()), services
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
    try:
        stopped = cluster.head.script("stop_optimized.sh")
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        assert not any(service.alive() for service in services.values())
        assert not list(cluster.head.run_dir.glob("*.pid"))
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()
