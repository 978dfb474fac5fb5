"""TLS without a model: the cluster's certificates (scripts/make_certs.py), the checks a machine's
certificate passes before anything starts (ocr_bundle.tls, through the start script), what a
client trusts, and what every client says when a certificate does not verify, against real
HTTPS servers on this machine (the standard library's, with the certificates made here)."""

from __future__ import annotations

import datetime
import os
import ssl
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import requests
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from helpers import PYTHON, ROOT
from ocr_bundle import tls
from ocr_bundle.client import OcrClient, ServerUnusable, connect
from ocr_bundle.exposure import check
from ocr_bundle.serve.membership import Gateway, GatewayRefused, preflight
from ocr_bundle.serve.processes import NotReady, wait_ready
from stand_in import StandIn, https_context

sys.path.insert(0, str(ROOT / "scripts"))
import make_certs  # noqa: E402

FAR = "192.0.2.1"


def make(out: Path, *machines: str, extra: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, str(ROOT / "scripts" / "make_certs.py"), "--out", str(out), *extra, *machines],
                          capture_output=True, text=True, timeout=60)


@pytest.fixture(scope="module")
def cluster_certs(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("certs") / "certs"
    done = make(out, f"head={FAR},head.lan", "node1=127.0.0.1")
    assert done.returncode == 0, done.stderr
    return out


@pytest.fixture(scope="module")
def other_ca(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("other") / "certs"
    assert make(out, "intruder=127.0.0.1").returncode == 0
    return out


def names(path: Path) -> set[str]:
    certificate = x509.load_pem_x509_certificate(path.read_bytes())
    alternative = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return {str(value) for value in alternative.get_values_for_type(x509.DNSName)} | \
        {str(value) for value in alternative.get_values_for_type(x509.IPAddress)}


def test_make_certs_writes_a_ca_and_per_machine_certificates_with_their_names_and_private_keys(cluster_certs):
    out = cluster_certs
    assert names(out / "head" / "cert.pem") == {FAR, "head.lan", "127.0.0.1", "::1", "localhost"}
    assert names(out / "node1" / "cert.pem") == {"127.0.0.1", "::1", "localhost"}
    for key in (out / "ca-key.pem", out / "head" / "key.pem", out / "node1" / "key.pem"):
        assert stat.S_IMODE(key.stat().st_mode) == 0o600, key
    for public in (out / "ca.pem", out / "head" / "cert.pem", out / "head" / "ca.pem"):
        assert stat.S_IMODE(public.stat().st_mode) == 0o644, public
    assert (out / "head" / "ca.pem").read_bytes() == (out / "ca.pem").read_bytes()
    ca = x509.load_pem_x509_certificate((out / "ca.pem").read_bytes())
    head = x509.load_pem_x509_certificate((out / "head" / "cert.pem").read_bytes())
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert not head.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    usages = set(head.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)
    assert usages == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}  # serves, and is the gateway's client
    head.verify_directly_issued_by(ca)  # raises if the chain is wrong
    # The chain as OpenSSL sees it, for each name: what every client will check.
    assert tls.certificate_problems(str(out / "head" / "cert.pem"), str(out / "head" / "key.pem"),
                                    str(out / "ca.pem"), [FAR, "head.lan", "127.0.0.1", "localhost"]) == ([], [])


def test_make_certs_reuses_the_ca_keeps_existing_machines_and_prints_each_machines_variables(cluster_certs):
    before = (cluster_certs / "node1" / "cert.pem").read_bytes()
    done = make(cluster_certs, "node1=127.0.0.1", "node2=10.0.0.3")
    assert done.returncode == 0, done.stderr
    assert "reusing the cluster's CA" in done.stdout and "node1: has a certificate already" in done.stdout
    assert (cluster_certs / "node1" / "cert.pem").read_bytes() == before
    node2 = cluster_certs / "node2"
    assert f"TLS_CERT={node2}/cert.pem TLS_KEY={node2}/key.pem TLS_CA={node2}/ca.pem" in done.stdout
    assert tls.certificate_problems(str(node2 / "cert.pem"), str(node2 / "key.pem"), str(cluster_certs / "ca.pem"),
                                    ["10.0.0.3"]) == ([], [])
    renewed = make(cluster_certs, "node1=127.0.0.1", extra=("--renew",))
    assert renewed.returncode == 0 and (cluster_certs / "node1" / "cert.pem").read_bytes() != before


@pytest.mark.parametrize("machine, message", [
    ("node1", "give each machine as NAME=ADDRESS"), ("node1=", "no address"), ("../x=10.0.0.1", "NAME=ADDRESS"),
    ("n=10.0.0.1,not a name", "neither an IP address nor a host name"),
    ("ca.pem=10.0.0.1", "the name of the CA's own file"), ("ca-key.pem=10.0.0.1", "the name of the CA's own file"),
])
def test_make_certs_refuses_a_machine_it_cannot_name(tmp_path, machine, message):
    done = make(tmp_path / "certs", machine)
    assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "certs").exists()


def test_make_certs_renews_a_kept_certificate_that_no_longer_verifies(tmp_path):
    """The CA lost and made again: a machine's old certificate would not verify against the new one, so it is
    renewed (saying why) instead of kept; one that lacks an address asked for, likewise."""
    out = tmp_path / "certs"
    assert make(out, "node=127.0.0.1").returncode == 0
    before = (out / "node" / "cert.pem").read_bytes()
    (out / "ca.pem").unlink()
    (out / "ca-key.pem").unlink()
    again = make(out, "node=127.0.0.1")
    assert again.returncode == 0, again.stderr
    assert "made the cluster's CA" in again.stdout
    assert f"node: its certificate in {out / 'node'} is not signed by the CA in {out}/ca.pem" in again.stdout
    assert "renewed" in again.stdout and (out / "node" / "cert.pem").read_bytes() != before
    node = out / "node"
    assert tls.certificate_problems(str(node / "cert.pem"), str(node / "key.pem"), str(node / "ca.pem"),
                                    ["127.0.0.1"]) == ([], [])
    kept = make(out, "node=127.0.0.1")
    assert "node: has a certificate already" in kept.stdout
    named = make(out, "node=127.0.0.1,node.lan")
    assert "does not name node.lan: renewed" in named.stdout and "node.lan" in names(node / "cert.pem")


def test_a_plain_machine_verifies_an_https_gateway_with_the_ca_alone(cluster_certs):
    """TLS is on when this machine has a certificate (tls.serving); TLS_CA alone is trust, not serving."""
    ca = str(cluster_certs / "ca.pem")
    assert tls.machine_trust({"TLS_CA": ca}) == tls.Trust(ca, "TLS_CA")
    assert tls.scheme({"TLS_CA": ca}) == "http" and not tls.serving({"TLS_CA": ca})
    assert tls.machine_trust({}) is None
    served = {"TLS_CERT": "c.pem", "TLS_KEY": "k.pem", "TLS_CA": ca}
    assert tls.serving(served) and tls.machine_trust(served) == tls.Trust(ca, "TLS_CA", "c.pem", "k.pem")
    joining = {"VLLM_API_KEY": "k", "ROUTER_ADMIN_KEY": "a", "TLS_CA": ca}
    assert check("join", "127.0.0.1", None, joining, "https://127.0.0.1:8000").problems == []
    assert "set TLS_CA" in check("join", "127.0.0.1", None, {**joining, "TLS_CA": ""},
                                 "https://127.0.0.1:8000").problems[0]


def test_a_head_that_does_not_resolve_is_refused_in_one_line():
    done = subprocess.run([PYTHON, "-m", "ocr_bundle.serve.membership", "preflight", "--gateway",
                           "https://head.invalid:8000", "--bind", "0.0.0.0", "--port", "8000"], capture_output=True,
                          text=True, timeout=60, cwd=ROOT, env={**os.environ, "VLLM_API_KEY": "k",
                                                               "ROUTER_ADMIN_KEY": "a", "PYTHONPATH": str(ROOT)})
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        done.stderr.strip()] and "cannot resolve head.invalid (https://head.invalid:8000)" in done.stderr


def expired_certificate(tmp_path: Path, ca_dir: Path) -> tuple[str, str]:
    """A certificate of the cluster's CA that expired yesterday (made as make_certs makes them)."""
    from cryptography.hazmat.primitives import serialization

    ca = x509.load_pem_x509_certificate((ca_dir / "ca.pem").read_bytes())
    ca_key = serialization.load_pem_private_key((ca_dir / "ca-key.pem").read_bytes(), password=None)
    then = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(days=3)
    certificate, key = make_certs.make_machine_certificate(make_certs.parse_machine("old=127.0.0.1"), ca, ca_key, 2,
                                                           then)
    make_certs.write_file(tmp_path / "old.pem", make_certs.certificate_pem(certificate), 0o644)
    make_certs.write_file(tmp_path / "old-key.pem", make_certs.key_pem(key), 0o600)
    return str(tmp_path / "old.pem"), str(tmp_path / "old-key.pem")


def test_a_machines_certificate_is_checked_before_anything_starts(cluster_certs, other_ca, tmp_path):
    head, node = cluster_certs / "head", cluster_certs / "node1"
    cert, key, ca = str(head / "cert.pem"), str(head / "key.pem"), str(cluster_certs / "ca.pem")
    problems, _ = tls.certificate_problems(cert, key, ca, ["10.9.9.9"])
    assert "does not name 10.9.9.9" in problems[0] and f"it names {FAR}, head.lan" in problems[0]
    problems, _ = tls.certificate_problems(cert, str(node / "key.pem"), ca, ["127.0.0.1"])
    assert "do not go together" in problems[0]
    problems, _ = tls.certificate_problems(cert, key, str(other_ca / "ca.pem"), ["127.0.0.1"])
    assert f"is not signed by TLS_CA={other_ca / 'ca.pem'}" in problems[0]
    problems, _ = tls.certificate_problems(cert, key, None, ["127.0.0.1"])
    assert "TLS_CA is needed with TLS_CERT" in problems[0]
    old, old_key = expired_certificate(tmp_path, cluster_certs)
    problems, _ = tls.certificate_problems(old, old_key, ca, ["127.0.0.1"])
    assert "has expired" in problems[0]
    soon = datetime.datetime.now(datetime.timezone.utc).timestamp() + 350 * 86400  # 15 days before it ends
    problems, warnings = tls.certificate_problems(cert, key, ca, ["127.0.0.1"], now=soon)
    assert not problems and "expires in 15 days" in warnings[0]
    readable = tmp_path / "readable-key.pem"
    readable.write_bytes(Path(key).read_bytes())
    readable.chmod(0o644)
    problems, _ = tls.certificate_problems(cert, str(readable), ca, ["127.0.0.1"])
    assert "can be read by other users" in problems[0] and f"chmod 600 {readable}" in problems[0]


def test_the_exposure_rule_wants_https_beyond_loopback_and_a_certificate_that_names_each_address(cluster_certs):
    node = cluster_certs / "node1"
    tls_env = {"TLS_CERT": str(node / "cert.pem"), "TLS_KEY": str(node / "key.pem"), "TLS_CA": str(node / "ca.pem"),
               "VLLM_API_KEY": "k", "UI_AUTH": "me:pw"}
    plain = check("single", "0.0.0.0", "0.0.0.0", {"VLLM_API_KEY": "k", "UI_AUTH": "me:pw"})
    assert [p for p in plain.problems if "in plain HTTP" in p] == plain.problems and len(plain.problems) == 2
    assert not check("single", "127.0.0.1", "127.0.0.1", {}).problems  # loopback: nothing crosses a network
    allowed = check("single", "0.0.0.0", None, {"VLLM_API_KEY": "k", "ALLOW_PLAINTEXT": "1"})
    assert not allowed.problems and "serves plain HTTP, on purpose" in allowed.warnings[-1]
    assert check("single", "0.0.0.0", "0.0.0.0", tls_env) == check("single", "0.0.0.0", "0.0.0.0", tls_env)
    assert not check("single", "0.0.0.0", "0.0.0.0", tls_env).problems
    # A joining server: its certificate must name the address the gateway reaches it at.
    joining = {**tls_env, "ROUTER_ADMIN_KEY": "a"}
    assert "does not name 10.0.0.9" in " ".join(check("join", "0.0.0.0", None, joining, "https://10.0.0.1:8000",
                                                       tls_names=["10.0.0.9"]).problems)
    assert "is plain HTTP but this machine serves TLS" in " ".join(
        check("join", "0.0.0.0", None, joining, "http://10.0.0.1:8000").problems)
    no_ca = {k: v for k, v in joining.items() if k not in ("TLS_CERT", "TLS_KEY", "TLS_CA")}
    assert "set TLS_CA" in " ".join(check("join", "0.0.0.0", None, {**no_ca, "ALLOW_PLAINTEXT": "1"},
                                          "https://10.0.0.1:8000").problems)


def test_the_start_script_refuses_a_certificate_that_does_not_name_this_machine(cluster_certs, tmp_path):
    head = cluster_certs / "head"  # names 192.0.2.1 and head.lan, not 10.0.0.7
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TLS_", "VLLM_", "UI_", "ALLOW_"))}
    done = subprocess.run([str(ROOT / "start_optimized.sh")], capture_output=True, text=True, timeout=60, cwd=ROOT,
                          env={**env, "RUN_DIR": str(tmp_path / "run"), "MODEL": "/nowhere", "HOST": "10.0.0.7",
                               "UI": "off", "VLLM_API_KEY": "k", "TLS_CERT": str(head / "cert.pem"),
                               "TLS_KEY": str(head / "key.pem"), "TLS_CA": str(cluster_certs / "ca.pem")})
    assert done.returncode == 2, done.stdout + done.stderr
    assert "does not name 10.0.0.7" in done.stderr and "Traceback" not in done.stderr
    assert not any((tmp_path / "run").glob("*.pid"))


def test_a_clients_trust_comes_from_the_flag_then_the_environment(cluster_certs, tmp_path):
    ca = str(cluster_certs / "ca.pem")
    assert tls.client_trust(None, {}) == tls.Trust()
    assert tls.client_trust(ca, {"VLLM_CA_CERT": "/elsewhere"}) == tls.Trust(ca, "--ca-cert")
    for name in ("VLLM_CA_CERT", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE"):
        assert tls.client_trust(None, {name: ca}) == tls.Trust(ca, name)
    assert tls.client_trust(None, {"REQUESTS_CA_BUNDLE": "/x", "VLLM_CA_CERT": ca}).source == "VLLM_CA_CERT"
    with pytest.raises(tls.TlsConfigError, match="--ca-cert: /nowhere/ca.pem: no such file"):
        tls.client_trust("/nowhere/ca.pem", {})
    (tmp_path / "notes.txt").write_text("not a certificate")
    with pytest.raises(tls.TlsConfigError, match="holds no PEM certificate"):
        tls.client_trust(str(tmp_path / "notes.txt"), {})
    with pytest.raises(ServerUnusable, match="no such file"):
        connect("https://127.0.0.1:9", None, None, ca_cert="/nowhere/ca.pem")


def models(method: str, path: str, key: str | None) -> tuple[int, str, dict]:
    if path == "/v1/models":
        return 200, '{"data": [{"id": "m", "max_model_len": 4096}]}', {"Content-Type": "application/json"}
    return (200, "OK", {}) if path in ("/health", "/liveness") else (404, "", {})


def test_every_client_explains_a_certificate_it_cannot_verify(cluster_certs, other_ca):
    ca = str(cluster_certs / "ca.pem")
    with StandIn(models, tls=https_context(cluster_certs / "node1")) as server:
        assert OcrClient(server.url, trust=tls.Trust(ca, "--ca-cert")).status().models == ("m",)
        for trust, expected in ((tls.Trust(), "not signed by a CA this client trusts"),
                                (tls.Trust(str(other_ca / "ca.pem"), "VLLM_CA_CERT"), "not signed by a CA")):
            error = OcrClient(server.url, trust=trust).status().error
            assert f"TLS: cannot verify {server.url}" in error and expected in error, error
            assert trust.describe() in error and "--ca-cert or VLLM_CA_CERT" in error
        plain = OcrClient(server.url.replace("https://", "http://")).status().error
        assert "closed the connection on a plain-HTTP request" in plain and "use https://" in plain
        # The start script's readiness wait ends at once, explained, instead of waiting out its timeout.
        with pytest.raises(NotReady, match="not signed by a CA this client trusts"):
            wait_ready(f"{server.url}/health", lambda: True, 60, trust=tls.Trust(str(other_ca / "ca.pem"), "TLS_CA"))
        assert wait_ready(f"{server.url}/health", lambda: True, 10, trust=tls.Trust(ca, "TLS_CA")) < 10
    # Its certificate names 127.0.0.1, ::1 and localhost: served at 127.0.0.2, it is refused by name.
    with StandIn(models, tls=https_context(cluster_certs / "node1"), host="127.0.0.2") as elsewhere:
        error = OcrClient(elsewhere.url, trust=tls.Trust(ca, "--ca-cert")).status().error
        assert "does not name the host in the URL" in error and "127.0.0.2" in error, error


def test_a_client_names_an_expired_certificate(cluster_certs, tmp_path):
    old, old_key = expired_certificate(tmp_path, cluster_certs)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(old, old_key)
    ca = str(cluster_certs / "ca.pem")
    with StandIn(models, tls=context) as server:
        error = OcrClient(server.url, trust=tls.Trust(ca, "VLLM_CA_CERT")).status().error
    assert f"TLS: cannot verify {server.url}: its certificate has expired" in error, error
    assert f"the CA file {ca} (from VLLM_CA_CERT)" in error and "make_certs.py" in error


def test_a_server_that_requires_a_client_certificate_accepts_the_clusters_only(cluster_certs, other_ca):
    ca = cluster_certs / "ca.pem"
    with StandIn(models, tls=https_context(cluster_certs / "node1", ca)) as server:
        head = cluster_certs / "head"
        gateway_like = tls.Trust(str(ca), "TLS_CA", str(head / "cert.pem"), str(head / "key.pem"))
        assert OcrClient(server.url, trust=gateway_like).status().reachable
        error = OcrClient(server.url, trust=tls.Trust(str(ca), "--ca-cert")).status().error
        # The standard library's server sends a TLS alert (uvicorn's, vLLM's, just closes: tests/test_gateway.py).
        # (or hangs up mid-handshake, when the alert loses the race with the close)
        assert "requires a client certificate" in error and "end requests to the gateway" in error, error
        outsider = other_ca / "intruder"
        with pytest.raises(requests.RequestException):
            requests.get(f"{server.url}/v1/models", verify=str(ca), timeout=10,
                         cert=(str(outsider / "cert.pem"), str(outsider / "key.pem")))
        assert [path for _, path, _, _ in server.seen] == ["/v1/models", "/version"]  # the cluster's client alone


def test_joining_refuses_a_gateway_whose_certificate_does_not_verify_before_sending_a_key(cluster_certs, other_ca):
    node = cluster_certs / "node1"
    trust = tls.Trust(str(node / "ca.pem"), "TLS_CA", str(node / "cert.pem"), str(node / "key.pem"))
    with StandIn(models, tls=https_context(other_ca / "intruder")) as impostor:
        with pytest.raises(GatewayRefused, match="not signed by a CA this client trusts"):
            preflight(Gateway(impostor.url, "admin-key", "client-key", trust=trust), "https://10.0.0.2:8000")
        assert impostor.seen == []  # no request, so no key, reached it
    done = subprocess.run([sys.executable, "-m", "ocr_bundle.serve.membership", "preflight", "--gateway",
                           "https://127.0.0.1:9", "--bind", "127.0.0.1", "--port", "8002"],
                          capture_output=True, text=True, timeout=30, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "TLS_CERT": str(node / "cert.pem"),
                               "TLS_KEY": str(node / "key.pem"), "TLS_CA": str(node / "ca.pem")})
    assert done.returncode == 3, done.stderr  # nothing listens there yet: the keeper will join it later


@pytest.mark.slow  # SMG, the gateway, is in the CPU environment (requirements-cpu.txt), not requirements-bundle.txt
@pytest.mark.parametrize("with_tls", [False, True], ids=["plain", "tls"])
def test_a_gateway_alone_starts_and_prints_how_to_reach_it(cluster_certs, tmp_path, with_tls):
    """ROUTER=only (the gateway, no server here), plain and over HTTPS, through the start and stop
    scripts: the banner's lines are right, and the TLS gateway answers HTTPS only."""
    from helpers import free_port

    port = free_port()
    node = cluster_certs / "node1"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TLS_", "VLLM_", "UI_", "ALLOW_"))}
    env.update({"RUN_DIR": str(tmp_path / "run"), "ROUTER": "only", "UI": "off", "PORT": str(port), "PYTHON": PYTHON,
                "ROUTER_METRICS_PORT": str(free_port()), "VLLM_API_KEY": "client-key", "ROUTER_ADMIN_KEY": "admin-key",
                "OCR_API_PORT": str(free_port())})
    if with_tls:
        env.update({"TLS_CERT": str(node / "cert.pem"), "TLS_KEY": str(node / "key.pem"), "TLS_CA": str(node / "ca.pem")})
    scheme = "https" if with_tls else "http"
    try:
        started = subprocess.run([str(ROOT / "start_optimized.sh")], capture_output=True, text=True, timeout=120,
                                 cwd=ROOT, env=env)
        assert started.returncode == 0, started.stdout + started.stderr
        assert f"vLLM API:  {scheme}://127.0.0.1:{port}/v1" in started.stdout
        assert f"Join:      on another machine: JOIN={scheme}://127.0.0.1:{port}" in started.stdout
        if with_tls:
            assert f"curl --cacert {node / 'ca.pem'} " in started.stdout and f"--ca-cert {node / 'ca.pem'}" in started.stdout
            assert "TLS_CERT=<its cert.pem>" in started.stdout
            assert requests.get(f"https://127.0.0.1:{port}/liveness", verify=str(node / "ca.pem"), timeout=10).text == "OK"
            documents = f"https://127.0.0.1:{env['OCR_API_PORT']}"  # the document API: HTTPS too, keyed
            assert f"Documents: {documents}/v1/ocr" in started.stdout
            assert requests.get(f"{documents}/v1/models", verify=str(node / "ca.pem"), timeout=10).status_code == 401
            with pytest.raises(requests.ConnectionError):
                requests.get(f"http://127.0.0.1:{port}/liveness", timeout=10)
        else:
            assert "--cacert" not in started.stdout and "TLS_CERT" not in started.stdout
            assert requests.get(f"http://127.0.0.1:{port}/liveness", timeout=10).text == "OK"
    finally:
        stopped = subprocess.run([str(ROOT / "stop_optimized.sh")], capture_output=True, text=True, timeout=120,
                                 cwd=ROOT, env=env)
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
