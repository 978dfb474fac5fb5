"""Several servers behind the head's gateway (SMG), through the bundle's own scripts, on the CPU backend,
over TLS as the README's cluster recipe runs it.

One head (ROUTER=on: the gateway on PORT, its own server on SERVER_PORT, the page) and one
machine joining it (JOIN=https://...), both on this host with their own ports, run directories
and certificates (scripts/make_certs.py, a CA made for this module), started once for this
module. Every connection is HTTPS; the servers behind the gateway require a client certificate
signed by the cluster's CA, which the gateway (and each machine's own checks) present. The tests
run in file order: every door is tried; what TLS refuses is tried; a server is killed mid-batch
and restarted, killed mid-stress-run and restarted, stopped with stop_optimized.sh mid-batch,
restarted by its scripts mid-batch; then the head is stopped. Every start and stop of both machines runs
under strace (execve only), and the last test reads every command line started from start to stop:
none holds a key or the page's password.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import itertools
import json
import os
import re
import signal
import ssl
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import requests
from PIL import Image

from conftest import TEST_MAX_MODEL_LEN
from helpers import PYTHON, ROOT, free_port, made_certs, server_requests, set_output_budget, wait_for
from ocr_bundle.batch.manifest import load_record
from ocr_bundle.loadtest.pollers import gateway_counters
from ocr_bundle import tls
from ocr_bundle.serve.gateway_doors import OPEN_WHY, DoorTable
from ocr_bundle.serve.membership import Gateway, GatewayUnreachable
from ocr_bundle.serve.processes import Service, read_pid_file
from ocr_bundle.serve.route_keys import breaks_key_rule, logged_routes
from stand_in import StandIn, https_context

sys.path.insert(0, str(ROOT / "scripts"))
from make_pdf import image_pdf, jpeg_of  # noqa: E402

KEY = "gateway-test-key"
ADMIN_KEY = "gateway-test-admin-key"
SERVER_ARGS = ("--max-model-len", str(TEST_MAX_MODEL_LEN), "--cpu-kv-cache-gb", "1")

PAGE_USER, PAGE_PASSWORD = "alice", "page-test-password"
SECRETS = (KEY, ADMIN_KEY, PAGE_PASSWORD)
# Routes of vLLM and of older routers that the gateway must not have (refused: 401, 403, 404 or 405).
NOT_ON_THE_GATEWAY = [("POST", "/invocations"), ("POST", "/add_worker"), ("GET", "/list_workers"),
                      ("POST", "/tokenize"), ("POST", "/pooling"), ("GET", "/metrics")]
REFUSED = {401, 403, 404, 405}

pytestmark = [pytest.mark.slow, pytest.mark.needs_vllm]


_RUNS = itertools.count()


@dataclass
class Traced:
    """A script run under strace: it ends when the script does (its exit status in a file), while strace
    follows what it started (the services) until they end too."""

    tracer: subprocess.Popen
    base: Path  # base.trace (strace's), base.out (the script's output), base.rc (its exit status)
    command: list[str]

    def result(self, timeout: float) -> subprocess.CompletedProcess:
        rc_file, out_file = Path(f"{self.base}.rc"), Path(f"{self.base}.out")
        wait_for(lambda: rc_file.exists() or self.tracer.poll() is not None, timeout, f"{self.command[0]} to end")
        wait_for(lambda: rc_file.exists() and rc_file.read_text().strip(), 10, "its exit status")
        return subprocess.CompletedProcess(self.command, int(rc_file.read_text()),
                                          out_file.read_text(errors="replace"), "")


@dataclass
class Node:
    env: dict[str, str]
    traces: Path  # every start and stop runs under strace: the command line of every program it starts
    cpus: set[int] | None = None  # the machine's cores: its scripts and everything they start run there
    runs: list[Traced] = field(default_factory=list)

    def _on_its_cores(self) -> None:
        if self.cpus is not None:
            os.sched_setaffinity(0, self.cpus)

    @property
    def run_dir(self) -> Path:
        return Path(self.env["RUN_DIR"])

    def begin(self, name: str) -> Traced:
        """Start a script as its machine runs it, with every execve recorded (argv only, no environment)."""
        argv = [str(ROOT / name), *(SERVER_ARGS if name == "start_optimized.sh" else ())]
        self.traces.mkdir(parents=True, exist_ok=True)
        base = self.traces / f"{next(_RUNS):02d}-{self.run_dir.name}-{name}"
        wrapper = 'rc=0; "$@" >"$0.out" 2>&1 </dev/null || rc=$?; echo "$rc" >"$0.rc"'
        tracer = subprocess.Popen(["strace", "-f", "-qq", "--seccomp-bpf", "-e", "trace=execve", "-e", "signal=none",
                                   "-s", "100000", "-o", f"{base}.trace", "--", "bash", "-c", wrapper, str(base),
                                   *argv], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL, cwd=ROOT, env={**os.environ, **self.env},
                                  preexec_fn=self._on_its_cores)
        traced = Traced(tracer, base, argv)
        self.runs.append(traced)
        return traced

    def script(self, name: str, timeout: float = 600) -> subprocess.CompletedProcess:
        return self.begin(name).result(timeout)

    def service(self, name: str) -> Service | None:
        return read_pid_file(self.run_dir / f"{name}.pid")

    def kill_server(self) -> None:
        """SIGKILL the whole vLLM process group: a machine lost, no goodbye."""
        os.killpg(self.service("vllm").pid, signal.SIGKILL)


@dataclass
class Cluster:
    head: Node
    node: Node
    gateway_url: str
    head_server_url: str
    node_url: str
    metrics_url: str
    certs: Path  # make_certs.py's folder: ca.pem, head/, node/

    @property
    def ca(self) -> str:
        return str(self.certs / "ca.pem")

    @property
    def client_tls(self) -> dict:
        """What a client holds: the CA, no certificate of its own."""
        return {"verify": self.ca}

    @property
    def machine_tls(self) -> dict:
        """What a machine of the cluster holds (the head's certificate): the servers' checks need it."""
        return {"verify": self.ca, "cert": (str(self.certs / "head" / "cert.pem"), str(self.certs / "head" / "key.pem"))}

    @property
    def gateway(self) -> Gateway:
        head = self.certs / "head"
        return Gateway(self.gateway_url, ADMIN_KEY, KEY,
                       trust=tls.Trust(self.ca, "TLS_CA", str(head / "cert.pem"), str(head / "key.pem")))

    def served(self, server_url: str) -> float:
        return server_requests(server_url, self.machine_tls)

    def members(self) -> list[str]:
        return list(self.gateway.servers())


@pytest.fixture(scope="module")
def cluster(tiny_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("cluster")
    certs = made_certs(root / "certs", "head=127.0.0.1", "node=127.0.0.1")
    gateway_port, server_port, node_port, metrics_port = (free_port() for _ in range(4))
    common = {"MODEL": str(tiny_checkpoint), "PYTHON": PYTHON, "VLLM_API_KEY": KEY, "ROUTER_ADMIN_KEY": ADMIN_KEY,
              "HOST": "127.0.0.1", "STOP_GRACE": "20", "UI_AUTH": "", "VLLM_CA_CERT": ""}
    traces = root / "traces"

    def machine(name: str) -> dict[str, str]:  # the variables make_certs.py printed for it
        return {"TLS_CERT": str(certs / name / "cert.pem"), "TLS_KEY": str(certs / name / "key.pem"),
                "TLS_CA": str(certs / name / "ca.pem")}

    # Two machines on 2 cores: each engine on a core of its own (vLLM's CPU backend binds every engine to
    # core 0 by default, and a node starting beside a busy head then waits minutes for it), and the node's
    # whole process tree on its core: a CI run saw the restarted node's API server confined to core 0,
    # beside the head's busy engine, and not ready after 15 minutes.
    head = Node({**common, **machine("head"), "VLLM_CPU_OMP_THREADS_BIND": "0", "RUN_DIR": str(root / "head"),
                 "ROUTER": "on", "UI_AUTH": f"{PAGE_USER}:{PAGE_PASSWORD}",
                 "PORT": str(gateway_port), "SERVER_PORT": str(server_port), "UI_PORT": str(free_port()),
                 "OCR_API_PORT": str(free_port()),
                 "UI_HOST": "127.0.0.1", "ROUTER_METRICS_PORT": str(metrics_port)}, traces)
    node = Node({**common, **machine("node"), "VLLM_CPU_OMP_THREADS_BIND": "1", "RUN_DIR": str(root / "node"),
                 "PORT": str(node_port), "JOIN": f"https://127.0.0.1:{gateway_port}"}, traces, cpus={1})
    # Both at once, as two machines would: the node keeps trying until the head's gateway answers.
    starts = [head.begin("start_optimized.sh"), node.begin("start_optimized.sh")]
    results = [start.result(timeout=900) for start in starts]
    try:
        for result in results:
            assert result.returncode == 0, result.stdout
        yield Cluster(head, node, f"https://127.0.0.1:{gateway_port}", f"https://127.0.0.1:{server_port}",
                      f"https://127.0.0.1:{node_port}", f"http://127.0.0.1:{metrics_port}/metrics", certs)
    finally:
        for machine in (node, head):
            machine.script("stop_optimized.sh")


def a_pdf(path: Path, pages: int) -> Path:
    path.write_bytes(image_pdf(pages, jpeg_of(Image.new("RGB", (300, 400), "white")), (150, 200)))
    return path


def batch(cluster: Cluster, pdf: Path, out: Path, concurrency: int = 4) -> subprocess.Popen:
    return subprocess.Popen([PYTHON, str(ROOT / "batch_ocr.py"), str(pdf), "--out", str(out), "--url",
                             cluster.gateway_url, "--ca-cert", cluster.ca, "--max-tokens", "24", "--max-attempts", "1",
                             "--concurrency", str(concurrency), "--quiet"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
                            env={**os.environ, "VLLM_API_KEY": KEY})


def kill_once_serving(cluster: Cluster, served_before: float) -> float:
    """SIGKILL the joining server once it has answered a few requests of the run; when."""
    wait_for(lambda: cluster.served(cluster.node_url) >= served_before + 3, 300, "the joined server to take work")
    cluster.node.kill_server()
    return time.monotonic()


def assert_every_page_once(out: Path, pages: int) -> None:
    manifest = json.loads(next(out.rglob("manifest.json")).read_text())
    records = manifest["pages"]
    assert len(records) == pages
    # Converted, every one ("flagged": the random-weight model ran into --max-tokens, as it does alone).
    assert {record["status"] for record in records.values()} <= {"ok", "flagged"}
    # One attempt each: the gateway hid the loss; no page was sent twice by the client.
    assert {record["attempts"] for record in records.values()} == {1}


def restart_node(cluster: Cluster) -> float:
    """The lost machine comes back through the start script; seconds until it is in the pool again."""
    start = time.monotonic()
    # The start script's own limit (STARTUP_TIMEOUT, 900 s) bounds it: on 2 cores busy with a batch, a
    # CI run once saw the node's engine process take 9 minutes to start.
    started = cluster.node.script("start_optimized.sh", timeout=960)
    assert started.returncode == 0, started.stdout + started.stderr + machine_state()
    wait_for(lambda: cluster.node_url in cluster.members(), 30, "the restarted server to rejoin")
    return time.monotonic() - start


def machine_state() -> str:
    """What a failed start met: free memory, and every process confined to some cores or not running."""
    lines = [next(line for line in Path("/proc/meminfo").read_text().splitlines() if line.startswith("MemAvailable"))]
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(line.split(":\t", 1) for line in status.read_text().splitlines() if ":\t" in line)
            command = (status.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:120]
        except OSError:
            continue
        confined = fields.get("Cpus_allowed_list", "").strip() != f"0-{os.cpu_count() - 1}"
        if command and (confined or fields.get("State", "")[:1] in "DZ"):
            lines.append(f"{status.parent.name} {fields['State'].strip()} cpus={fields['Cpus_allowed_list'].strip()} "
                         f"rss={fields.get('VmRSS', '-').strip()} {command}")
    return "\n---- machine ----\n" + "\n".join(lines)


def knock(url: str, method: str, key: str | None, tls_options: dict, body: bool = False) -> int | tuple[int, str]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        response = requests.request(method, url, headers=headers, json={}, timeout=30, allow_redirects=False,
                                    **tls_options)
    except requests.RequestException as exc:
        return (0, str(exc)) if body else 0
    return (response.status_code, response.text[:300]) if body else response.status_code


KEYS = {"none": None, "wrong": "not-the-key", "client": KEY, "admin": ADMIN_KEY}


def test_every_door_of_every_port_needs_its_key(cluster: Cluster, tmp_path: Path):
    """The door table: every route of the running servers (from their own route listing) and of
    the gateway (ocr_bundle/serve/smg_doors.json, read out of the installed SMG by
    scripts/smg_doors.py), without a key, with a wrong one, with the client key, with the admin key.
    Only the allow-lists answer without a key (each open gateway route with its reason, OPEN_WHY);
    only the client key reaches a server; only the admin key reaches the pool."""
    table, wrong = [], []
    for port, url, log in (("head server", cluster.head_server_url, cluster.head.run_dir / "vllm.log"),
                           ("joined server", cluster.node_url, cluster.node.run_dir / "vllm.log")):
        routes = logged_routes(log.read_text(errors="replace"))
        assert ("POST", "/invocations") in routes and ("POST", "/v1/chat/completions") in routes and len(routes) > 20
        for method, path in routes:
            # As a machine of the cluster (with its certificate): the keys are what is tried here.
            answers = {name: knock(f"{url}{path}", method, key, cluster.machine_tls) for name, key in KEYS.items()}
            table.append((port, method, path, answers))
            if breaks_key_rule(path, answers):
                wrong.append((port, method, path, answers))
    doors = DoorTable.load()
    assert doors.smg_version == importlib.metadata.version("smg"), "smg_doors.json is for another SMG: run " \
        "scripts/smg_doors.py"
    for route in doors.routes:
        replies = {name: knock(f"{cluster.gateway_url}{route.path}", route.method, key, cluster.client_tls, body=True)
                   for name, key in KEYS.items()}
        answers = {name: status for name, (status, _) in replies.items()}
        table.append((f"gateway {route.door}", route.method, route.path, answers))
        opener = {"open": "none", "client": "client", "admin": "admin"}[route.door]
        status, said = replies[opener]
        if status == 404 and "unknown_url" in said:  # the route must be there: the table is this SMG's
            wrong.append(("gateway: no such route", route.method, route.path, replies))
        elif route.door == "open":
            # Open at the gateway; a server behind it may still want the key (/get_model_info: 401).
            if route.path not in OPEN_WHY:
                wrong.append(("gateway: open, and OPEN_WHY does not say why", route.method, route.path, answers))
        elif status in (0, 401, 403) or any(answers[name] not in REFUSED for name in KEYS if name != opener):
            wrong.append(("gateway", route.method, route.path, answers))
    for method, path in NOT_ON_THE_GATEWAY:
        answers = {name: knock(f"{cluster.gateway_url}{path}", method, key, cluster.client_tls)
                   for name, key in KEYS.items()}
        table.append(("gateway absent", method, path, answers))
        if any(code not in REFUSED for code in answers.values()):
            wrong.append(("gateway", method, path, answers))
    lines = [f"{port:15} {method:6} {path:42} " + " ".join(f"{name}={code}" for name, code in answers.items())
             for port, method, path, answers in table]
    (tmp_path / "doors.txt").write_text("\n".join(lines) + "\n")
    counts = {door: sum(route.door == door for route in doors.routes) for door in ("open", "client", "admin")}
    print(f"\n[doors] gateway (SMG {doors.smg_version}): {len(doors.routes)} routes, {counts}; open: "
          f"{' '.join(sorted(doors.open_paths()))}\n[doors] port, route, answer without a key / wrong key / "
          "client key / admin key\n" + "\n".join(lines))
    assert not wrong, wrong


def test_only_the_admin_key_changes_the_pool(cluster: Cluster):
    servers = sorted(cluster.members())
    assert servers == sorted([cluster.head_server_url, cluster.node_url])
    outsider = f"https://127.0.0.1:{free_port()}"
    for key in (None, "not-the-key", KEY):
        assert knock(f"{cluster.gateway_url}/workers", "GET", key, cluster.client_tls) == 401
        answer = requests.post(f"{cluster.gateway_url}/workers", json={"url": outsider}, timeout=10,
                               headers={"Authorization": f"Bearer {key}"} if key else {}, **cluster.client_tls)
        assert answer.status_code == 401, answer.text
        record = cluster.gateway.servers()[cluster.node_url]
        assert knock(f"{cluster.gateway_url}/workers/{record['id']}", "DELETE", key, cluster.client_tls) == 401
    assert sorted(cluster.members()) == servers
    # A chat through the gateway reaches a key-protected server: the gateway sends the key on.
    model = requests.get(f"{cluster.gateway_url}/v1/models", timeout=10, **cluster.client_tls).json()["data"][0]["id"]
    served = cluster.served(cluster.node_url) + cluster.served(cluster.head_server_url)
    for _ in range(2):
        chat = requests.post(f"{cluster.gateway_url}/v1/chat/completions", headers={"Authorization": f"Bearer {KEY}"},
                             json={"model": model, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]},
                             timeout=120, **cluster.client_tls)
        assert chat.status_code == 200, chat.text
    assert cluster.served(cluster.node_url) + cluster.served(cluster.head_server_url) == served + 2


def refused_by_tls(url: str, **options) -> bool:
    """True when no HTTP answer comes back (the TLS layer said no, or the server hung up)."""
    try:
        requests.get(url, timeout=20, headers={"Authorization": f"Bearer {KEY}"}, **options)
    except requests.RequestException:
        return True
    return False


def converter(url: str, out: Path, *flags: str) -> subprocess.CompletedProcess:
    """batch_ocr.py as a user runs it, with the key, the environment's CA settings cleared."""
    env = {k: v for k, v in os.environ.items() if k not in ("VLLM_CA_CERT", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE")}
    return subprocess.run([PYTHON, str(ROOT / "batch_ocr.py"), str(ROOT / "samples" / "table_screenshot.png"),
                           "--url", url, "--out", str(out), "--max-tokens", "8", "--max-attempts", "1", "--quiet",
                           *flags], capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env={**env, "VLLM_API_KEY": KEY})


def test_what_tls_refuses(cluster: Cluster, tmp_path: Path):
    """The refusal table: plain HTTP to every port, a client without the CA or with another one,
    the client key sent straight to a server without the cluster's client certificate. Each
    refusal leaves the servers untouched and is explained to the person who ran the client."""
    other = made_certs(tmp_path / "other-certs", "intruder=127.0.0.1")
    intruder = (str(other / "intruder" / "cert.pem"), str(other / "intruder" / "key.pem"))
    page_url = f"https://127.0.0.1:{cluster.head.env['UI_PORT']}"
    served = cluster.served(cluster.node_url) + cluster.served(cluster.head_server_url)
    rows = []
    for port, url in (("gateway", cluster.gateway_url), ("node", cluster.node_url), ("page", page_url)):
        assert refused_by_tls(url.replace("https://", "http://") + "/health"), port
        rows.append((f"plain HTTP to the {port}", "no HTTP answer"))
    plain = converter(cluster.gateway_url.replace("https://", "http://"), tmp_path / "plain")
    assert plain.returncode == 2 and "closed the connection on a plain-HTTP request" in plain.stderr, plain.stderr
    rows.append(("batch_ocr.py --url http://gateway", plain.stderr.strip().splitlines()[-1]))
    no_ca = converter(cluster.gateway_url, tmp_path / "no-ca")
    assert no_ca.returncode == 2 and "TLS: cannot verify" in no_ca.stderr, no_ca.stderr
    assert "not signed by a CA this client trusts" in no_ca.stderr and "--ca-cert or VLLM_CA_CERT" in no_ca.stderr
    rows.append(("batch_ocr.py, no CA", no_ca.stderr.strip().splitlines()[-1]))
    wrong_ca = converter(cluster.gateway_url, tmp_path / "wrong-ca", "--ca-cert", str(other / "ca.pem"))
    assert wrong_ca.returncode == 2 and f"the CA file {other / 'ca.pem'} (from --ca-cert)" in wrong_ca.stderr
    rows.append(("batch_ocr.py --ca-cert <another CA>", wrong_ca.stderr.strip().splitlines()[-1]))
    direct = converter(cluster.node_url, tmp_path / "direct", "--ca-cert", cluster.ca)
    assert direct.returncode == 2 and "end requests to the gateway" in direct.stderr, direct.stderr
    rows.append(("batch_ocr.py --url <node>, the client key, no client certificate",
                 direct.stderr.strip().splitlines()[-1]))
    for server in (cluster.node_url, cluster.head_server_url):
        assert refused_by_tls(f"{server}/v1/models", verify=cluster.ca)  # the key, the CA, no certificate
        assert refused_by_tls(f"{server}/v1/models", verify=cluster.ca, cert=intruder)  # another CA's certificate
    rows.append(("the node, the client key, a certificate of another CA", "no HTTP answer"))
    assert cluster.served(cluster.node_url) + cluster.served(cluster.head_server_url) == served  # nothing ran
    # The same request from a machine of the cluster goes through: it is the certificate that was missing.
    assert requests.get(f"{cluster.node_url}/v1/models", headers={"Authorization": f"Bearer {KEY}"}, timeout=20,
                        **cluster.machine_tls).status_code == 200
    print("\n[tls] what is refused, and what the client says\n" + "\n".join(f"{what:68} {said}" for what, said in rows))


def test_a_server_whose_certificate_comes_from_another_ca_is_never_added(cluster: Cluster, tmp_path: Path):
    """A server added with the admin key but holding no certificate of the cluster's CA: the gateway
    refuses its certificate, never lists it, and sends it no request (so no client key)."""
    context = https_context(made_certs(tmp_path / "other-certs", "impostor=127.0.0.1") / "impostor")
    model = {"data": [{"id": "lightonocr-tiny", "object": "model", "max_model_len": TEST_MAX_MODEL_LEN}]}
    with StandIn(lambda method, path, key: (200, json.dumps(model) if path == "/v1/models" else "{}",
                                            {"Content-Type": "application/json"}), tls=context) as impostor:
        with pytest.raises(GatewayUnreachable, match="has not added it"):
            cluster.gateway.add(impostor.url, wait_s=20)
        assert impostor.url not in cluster.members()
        assert impostor.seen == []  # no request got through the handshake: no key left the gateway
    assert sorted(cluster.members()) == sorted([cluster.head_server_url, cluster.node_url])


def test_the_page_over_https_in_a_browser(cluster: Cluster):
    """The head's page in Chromium over HTTPS: it trusts the head's certificate by its public key
    (an SPKI pin, as a browser that imported the cluster's CA would trust it; nothing is turned
    off: without the pin the page is refused, ERR_CERT_AUTHORITY_INVALID). It logs in: every cookie
    the browser then holds is Secure, and none is Gradio's unsecure copy of the login token."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    from playwright.sync_api import expect, sync_playwright

    from ocr_bundle.samples import sample_path
    from test_browser import CHROMIUM, CHROMIUM_ARGS, upload

    head = x509.load_pem_x509_certificate((cluster.certs / "head" / "cert.pem").read_bytes())
    pin = base64.b64encode(hashlib.sha256(head.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)).digest()).decode()
    url = f"https://127.0.0.1:{cluster.head.env['UI_PORT']}"
    with sync_playwright() as playwright:
        for pinned in (False, True):
            args = [*CHROMIUM_ARGS, *([f"--ignore-certificate-errors-spki-list={pin}"] if pinned else [])]
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=args, headless=True)
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 1000})
                if not pinned:
                    with pytest.raises(Exception, match="ERR_CERT_AUTHORITY_INVALID"):
                        page.goto(url)
                    continue
                page.goto(url, wait_until="networkidle")
                # The login, as the page's own form sends it (through the browser: its cookies land there).
                status = page.evaluate("""([user, password]) => fetch('/login', {method: 'POST',
                    body: new URLSearchParams({username: user, password: password})}).then(r => r.status)""",
                                       [PAGE_USER, PAGE_PASSWORD])
                assert status == 200
                cookies = page.context.cookies()
                print("\n[cookies] " + "; ".join(f"{c['name'][:28]}... secure={c['secure']} httpOnly={c['httpOnly']} "
                                                 f"sameSite={c['sameSite']}" for c in cookies))
                assert cookies and all(cookie["secure"] for cookie in cookies), cookies
                assert not [cookie for cookie in cookies if cookie["name"].startswith("access-token-unsecure")]
                page.goto(url, wait_until="networkidle")
                expect(page.locator("#server-status")).to_contain_text("lightonocr-tiny", timeout=30_000)
                set_output_budget(page, 16)  # the slider's least
                upload(page, sample_path("table_screenshot.png"))
                page.locator("#extract").click()
                expect(page.locator("#stats")).to_contain_text("output tokens", timeout=120_000)
            finally:
                browser.close()


def command_lines() -> list[str]:
    """Every process's command line, as any user of the machine sees it (`ps`)."""
    lines = []
    for entry in Path("/proc").iterdir():
        try:
            lines.append((entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
        except (OSError, ValueError):
            continue
    return lines


def test_no_key_is_written_anywhere_nor_on_a_command_line(cluster: Cluster, tmp_path: Path):
    """Every client with the key (converter, stress test, quality check, the page) and every
    service of both machines: nothing they wrote, and no command line, holds either key."""
    env = {**os.environ, "VLLM_API_KEY": KEY}
    url = cluster.gateway_url
    common = ["--max-tokens", "8", "--quiet", "--ca-cert", cluster.ca]
    runs = {
        "batch": [PYTHON, str(ROOT / "batch_ocr.py"), str(a_pdf(tmp_path / "doc.pdf", 3)), "--url", url,
                  "--out", str(tmp_path / "batch"), "--max-attempts", "1", *common],
        "stress": [PYTHON, str(ROOT / "stress_test.py"), "--url", url, "--concurrency", "2", "--requests", "2",
                   "--warmup", "0", "--no-stream", "--out", str(tmp_path / "stress"), *common],
    }
    sys.path.insert(0, str(ROOT / "scripts"))
    import make_bench

    make_bench.write_bench(tmp_path / "bench", 2)
    runs["quality"] = [PYTHON, str(ROOT / "quality_check.py"), str(tmp_path / "bench"), "--url", url, "--out",
                       str(tmp_path / "quality"), "--max-attempts", "1", *common]
    outputs = {}
    for name, command in runs.items():
        done = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
        outputs[name] = done.stdout + done.stderr
        assert done.returncode in (0, 1), f"{name}: {outputs[name][-2000:]}"  # 1: random text scores badly
    # The page: the head's page holds the key and sends it; one page through it.
    from gradio_client import Client, handle_file

    from ocr_bundle.samples import sample_path

    page = Client(f"https://127.0.0.1:{cluster.head.env['UI_PORT']}", verbose=False, auth=(PAGE_USER, PAGE_PASSWORD),
                  ssl_verify=ssl.create_default_context(cafile=cluster.ca))
    stats = page.predict(handle_file(str(sample_path("table_screenshot.png"))), 1, False, 16, 0.2, "PNG", False, [],
                         api_name="/extract")[2]
    assert "output tokens" in stats
    written = [path for folder in (tmp_path, cluster.head.run_dir, cluster.node.run_dir)
               for path in folder.rglob("*") if path.is_file()]
    assert any(path.name == "run-summary.json" for path in written) and any(path.name == "results.json"
                                                                           for path in written)
    for secret in SECRETS:
        holding = [str(path) for path in written if secret.encode() in path.read_bytes()]
        assert not holding, f"a key was written to {holding}"
        assert not [name for name, output in outputs.items() if secret in output]
        assert not [line for line in command_lines() if secret in line]


def test_a_batch_survives_a_server_killed_mid_run_and_the_server_rejoins(cluster: Cluster, tmp_path: Path):
    pages = 40
    pdf = a_pdf(tmp_path / "doc.pdf", pages)
    counted_before = gateway_counters(cluster.metrics_url)
    served_before = cluster.served(cluster.node_url)
    started = time.monotonic()
    run = batch(cluster, pdf, tmp_path / "out")
    killed_at = kill_once_serving(cluster, served_before)
    output = run.communicate(timeout=600)[0]
    elapsed = time.monotonic() - started
    assert run.returncode == 0, output
    assert_every_page_once(tmp_path / "out", pages)
    counted = gateway_counters(cluster.metrics_url)
    retries = counted["retries"] - counted_before["retries"]
    print(f"\n[failover] batch: {pages}/{pages} pages, exit 0, {elapsed:.1f} s, {retries:.0f} gateway retries, "
          f"finished {time.monotonic() - killed_at:.1f} s after the kill")
    assert elapsed < 300 / 2  # well under the gateway's request timeout: nothing waited for it
    # The dead server's membership keeper takes it out of the pool.
    wait_for(lambda: cluster.node_url not in cluster.members(), 30, "the killed server to leave the pool")

    rejoin_s = restart_node(cluster)
    before = cluster.served(cluster.node_url)
    second = batch(cluster, a_pdf(tmp_path / "again.pdf", 8), tmp_path / "again")
    assert second.communicate(timeout=300)[0] is not None and second.returncode == 0
    took = cluster.served(cluster.node_url) - before
    print(f"[failover] restarted server back in the pool {rejoin_s:.1f} s after its start script began; "
          f"it answered {took:.0f} of the next 8 pages")
    assert took >= 2  # round robin: about half


def test_a_stress_run_accounts_for_every_request_when_a_server_dies(cluster: Cluster, tmp_path: Path):
    requests_sent = 40
    served_before = cluster.served(cluster.node_url)
    run = subprocess.Popen(
        [PYTHON, str(ROOT / "stress_test.py"), "--url", cluster.gateway_url, "--ca-cert", cluster.ca,
         "--concurrency", "4", "--requests",
         str(requests_sent), "--warmup", "0", "--max-tokens", "24", "--no-stream", "--quiet", "--out",
         str(tmp_path / "report"), "--router-metrics", cluster.metrics_url],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT, env={**os.environ, "VLLM_API_KEY": KEY})
    kill_once_serving(cluster, served_before)
    output = run.communicate(timeout=600)[0]
    assert run.returncode == 0, output
    report = json.loads((tmp_path / "report" / "results.json").read_text())
    level = report["levels"][0]
    assert level["requests"] == requests_sent and level["ok"] == requests_sent and level["errors"] == 0
    assert sorted(report["environment"]["servers"]) == sorted([cluster.head_server_url, cluster.node_url])
    gateway = level["vllm"]["gateway"]
    # SMG drops a server's series when it leaves the pool: the survivor's count is what remains.
    assert gateway is not None and gateway["requests_per_server"].get(cluster.head_server_url, 0) > 0
    # Each server's rows came from the gateway's /engine_metrics; the killed one has samples from before its death.
    assert set(level["vllm"]["servers"]) == {cluster.head_server_url, cluster.node_url}
    markdown = (tmp_path / "report" / "report.md").read_text()
    assert "Behind a gateway" in markdown and "retries" in markdown
    print(f"\n[failover] stress: {level['ok']}/{requests_sent} ok, {gateway['retries']:.0f} gateway retries, "
          f"{gateway['breaker_transitions']:.0f} breaker transitions")
    restart_node(cluster)


def test_a_server_stopped_by_its_script_leaves_the_gateway_and_fails_no_request(cluster: Cluster, tmp_path: Path):
    pages = 24
    served_before = cluster.served(cluster.node_url)
    run = batch(cluster, a_pdf(tmp_path / "doc.pdf", pages), tmp_path / "out")
    wait_for(lambda: cluster.served(cluster.node_url) >= served_before + 2, 300, "the joined server to take work")
    stopped = cluster.node.script("stop_optimized.sh")
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert "left the gateway" in (cluster.node.run_dir / "membership.log").read_text()
    assert cluster.node_url not in cluster.members()
    output = run.communicate(timeout=600)[0]
    assert run.returncode == 0, output
    assert_every_page_once(tmp_path / "out", pages)


def test_a_server_started_and_stopped_by_its_scripts_during_a_batch_fails_no_page(cluster: Cluster, tmp_path: Path):
    """The node starts, joins, takes pages and is stopped again, all while one batch runs through
    the gateway; then the batch is stopped with Ctrl-C (too long to finish: it only has to outlast
    the node's start on 2 busy cores). No page recorded failed or took a second attempt."""
    assert cluster.node.script("stop_optimized.sh").returncode == 0  # stopped already after the previous test
    # One page at a time: enough to keep the batch running through the node's whole start and stop,
    # and light enough that the node can start on these 2 cores.
    run = batch(cluster, a_pdf(tmp_path / "doc.pdf", 4000), tmp_path / "out", concurrency=1)
    rejoin_s = restart_node(cluster)
    wait_for(lambda: cluster.served(cluster.node_url) >= 3, 120, "the restarted server to take work")
    stopped = cluster.node.script("stop_optimized.sh")
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert run.poll() is None, "the batch ended before the node's stop: nothing was tested"
    converted_after_stop = len(load_record(next((tmp_path / "out").rglob("manifest.json")).parent)["pages"])
    time.sleep(2)  # pages sent after the node left go to the head's server alone
    run.send_signal(signal.SIGINT)  # graceful: the pages in flight finish, nothing new is sent
    output = run.communicate(timeout=300)[0]
    assert run.returncode == 130 and "pending" in output, output  # interrupted, pages left to convert
    summary = json.loads((tmp_path / "out" / "run-summary.json").read_text())["pages"]
    records = json.loads(next((tmp_path / "out").rglob("manifest.json")).read_text())["pages"]
    assert summary["failed"] == 0 and len(records) >= converted_after_stop > 0
    assert {record["status"] for record in records.values()} <= {"ok", "flagged"}
    assert {record["attempts"] for record in records.values()} == {1}
    print(f"\n[restart] {len(records)} pages, none failed, while the node started (in the pool {rejoin_s:.1f} s after "
          "its start script began), took pages and stopped")


def test_stopping_the_head_stops_its_gateway_page_and_server_and_nothing_else(cluster: Cluster):
    services = {name: cluster.head.service(name) for name in ("gateway", "vllm", "membership", "ui")}
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


def execve_lines(trace: Path) -> list[str]:
    return [line for line in trace.read_text(errors="replace").splitlines() if " execve(" in line]


def test_no_secret_on_any_command_line_from_start_to_stop(cluster: Cluster):
    """Every program that any start or stop of either machine started during this module (the scripts, the
    launcher, vLLM and its engines, the gateway, the membership keeper, the page, every check and helper),
    as strace saw its execve: no command line holds the client key, the admin key or the page's password.
    Secrets go through the environment, which strace was not asked to print."""
    for machine in (cluster.node, cluster.head):
        assert machine.script("stop_optimized.sh").returncode == 0  # both stopped by now: this stops nothing
    runs = cluster.node.runs + cluster.head.runs
    for run in runs:  # each strace ends once everything its script started has ended
        run.tracer.wait(timeout=120)
    traces = sorted(Path(f"{run.base}.trace") for run in runs)
    lines = [line for trace in traces for line in execve_lines(trace)]
    holding = [line[:300] for line in lines if any(secret in line for secret in SECRETS)]
    programs = {re.search(r'execve\("([^"]+)"', line).group(1).rsplit("/", 1)[-1] for line in lines}
    print(f"\n[execve] {len(runs)} starts and stops, {len(lines)} execve calls ({len(programs)} programs: "
          f"{' '.join(sorted(programs)[:40])} ...); holding a key or the page's password: {len(holding)}")
    # What must have been seen for the check to mean anything: the services were started under the trace.
    seen = "\n".join(lines)
    for started in ("ocr_bundle.serve.gateway", "ocr_bundle.serve.membership\", \"keep", "app_vllm.py",
                    "ocr_bundle.serve.vllm_serve", "stop_optimized.sh"):
        assert started in seen, started
    assert not holding, holding
