"""TLS: the certificate a machine serves with, the CA a client trusts, and what did not match.

The start script serves the API (vLLM), the page and, on the head, the gateway over HTTPS when
this machine has a certificate (environment, never a flag's value that matters: paths only):

    TLS_CERT, TLS_KEY   this machine's certificate and private key (scripts/make_certs.py makes them).
                        Behind a gateway the same pair is the client certificate this machine
                        presents: the gateway to every server, a server's own checks to itself
    TLS_CA              the cluster's CA: what the start script, the gateway and the page verify
                        servers against, and what a server behind a gateway requires of the client
                        certificates it accepts (the gateway's)
    ALLOW_PLAINTEXT=1   serve plain HTTP beyond loopback on purpose (exposure.py refuses it otherwise)

Clients (batch_ocr.py, stress_test.py, quality_check.py, the page) verify against, in this order:
`--ca-cert FILE`, VLLM_CA_CERT, REQUESTS_CA_BUNDLE, SSL_CERT_FILE, else the public CAs that
requests ships (certifi). Nothing here ever turns verification off.

A failed verification is explained, not dumped: which URL, which CA file (and where it came
from), and what did not match (not signed by that CA, a name the certificate does not hold,
expired), with what to do. `certificate_problems` makes the same checks before anything
starts, with no network: an in-memory TLS handshake between this machine's certificate and a
client that trusts TLS_CA, once per name the start script will use.

Standard library only: the start script runs this with the system's python3.
"""

from __future__ import annotations

import os
import ssl
import stat
import time
from collections.abc import Mapping
from dataclasses import dataclass

CERT_ENV, KEY_ENV, CA_ENV, PLAINTEXT_ENV = "TLS_CERT", "TLS_KEY", "TLS_CA", "ALLOW_PLAINTEXT"
CLIENT_CA_ENV = "VLLM_CA_CERT"
# Where a client's CA comes from, strongest first (the flag is looked at before these).
CLIENT_CA_SOURCES = (CLIENT_CA_ENV, "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE")
EXPIRY_WARNING_DAYS = 30
MAKE_CERTS = "python3 scripts/make_certs.py"


class TlsConfigError(ValueError):
    """A TLS setting that cannot work (a missing or unreadable file, a key that is not the certificate's)."""


@dataclass(frozen=True)
class Trust:
    """What a client verifies servers against, and the client certificate it presents (if any).

    ca: a CA file, or None for the default store. source: where `ca` came from, for messages.
    """

    ca: str | None = None
    source: str | None = None
    client_cert: str | None = None
    client_key: str | None = None

    def describe(self) -> str:
        if self.ca is None:
            return f"the public CAs requests ships (no --ca-cert or {CLIENT_CA_ENV} given)"
        return f"the CA file {self.ca}" + (f" (from {self.source})" if self.source else "")

    def requests_options(self) -> dict:
        """verify= and cert= for every requests call. Passed per call on purpose: a Session's own
        `verify` is overridden by REQUESTS_CA_BUNDLE in the environment (requests' merge rules)."""
        return {"verify": self.ca or True,
                "cert": (self.client_cert, self.client_key) if self.client_cert else None}

    def ssl_context(self) -> ssl.SSLContext:
        """For urllib: verifies the server's certificate and name, presents the client certificate."""
        context = ssl.create_default_context(cafile=self.ca)
        if self.client_cert:
            context.load_cert_chain(self.client_cert, self.client_key)
        return context


def _readable_file(path: str, what: str) -> str:
    expanded = os.path.expanduser(path)
    if not os.path.isfile(expanded):
        raise TlsConfigError(f"{what} {path}: no such file")
    if not os.access(expanded, os.R_OK):
        raise TlsConfigError(f"{what} {path}: not readable by this user")
    return expanded


def client_trust(ca_flag: str | None = None, env: Mapping[str, str] = os.environ) -> Trust:
    """A client's trust: --ca-cert, else VLLM_CA_CERT, REQUESTS_CA_BUNDLE, SSL_CERT_FILE, else the
    default store. Raises TlsConfigError for a file that is not there or holds no certificate."""
    for source, value in (("--ca-cert", ca_flag), *((name, env.get(name)) for name in CLIENT_CA_SOURCES)):
        if value:
            path = _readable_file(value, f"{source}:")
            try:
                ssl.create_default_context(cafile=path)
            except ssl.SSLError as exc:
                raise TlsConfigError(f"{source}: {value} holds no PEM certificate ({exc.reason or exc})") from None
            return Trust(path, source)
    return Trust()


def serving(env: Mapping[str, str] = os.environ) -> bool:
    """Whether this machine serves HTTPS: the one decision of "TLS is on", for the start script
    (`python3 -m ocr_bundle.tls scheme`), the exposure rule, the gateway, membership and the checks.
    A certificate makes it so; TLS_CA alone does not (a plain machine that trusts an HTTPS gateway)."""
    return bool(env.get(CERT_ENV))


def machine_trust(env: Mapping[str, str] = os.environ) -> Trust | None:
    """This machine's own TLS, for the start script's tools (readiness, warm-up, membership):
    TLS_CA to verify, TLS_CERT/TLS_KEY presented as the client certificate when it serves HTTPS.
    TLS_CA alone: a plain-HTTP machine that verifies an HTTPS gateway with it. None with neither."""
    if serving(env):
        return Trust(env.get(CA_ENV) or None, CA_ENV, env.get(CERT_ENV), env.get(KEY_ENV) or None)
    if env.get(CA_ENV):
        return Trust(env[CA_ENV], CA_ENV)
    return None


def scheme(env: Mapping[str, str] = os.environ) -> str:
    return "https" if serving(env) else "http"


# ---------------------------------------------------------------- explaining a failure
def ssl_error_of(exc: BaseException) -> ssl.SSLError | None:
    """The ssl error inside whatever wraps it (requests → urllib3 → ssl; urllib → URLError)."""
    seen: set[int] = set()
    stack: list[object] = [exc]
    while stack:
        item = stack.pop()
        if not isinstance(item, BaseException) or id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, ssl.SSLError):
            return item
        stack += [*item.args, getattr(item, "reason", None), item.__cause__, item.__context__]
    return None


UNTRUSTED, WRONG_NAME, EXPIRED, NOT_YET_VALID = (2, 18, 19, 20, 21), (62, 64), (10,), (9,)


def explain(exc: BaseException, url: str, trust: Trust) -> str | None:
    """A message for people when `exc` is a TLS failure talking to `url` (None when it is not)."""
    error = ssl_error_of(exc)
    if error is None:
        return None
    trusted = f"Trusted: {trust.describe()}"
    if isinstance(error, ssl.SSLCertVerificationError):
        code, message = error.verify_code, error.verify_message or str(error)
        if code in UNTRUSTED:  # self-signed, self-signed in the chain, an issuer it does not know
            what = (f"its certificate is not signed by a CA this client trusts ({message}). {trusted}. Pass the "
                    f"cluster's CA (ca.pem from scripts/make_certs.py) with --ca-cert or {CLIENT_CA_ENV}")
        elif code in WRONG_NAME:
            what = (f"its certificate does not name the host in the URL ({message}). Use a name the certificate "
                    f"holds, or make one that holds this one ({MAKE_CERTS} --help). {trusted}")
        elif code in EXPIRED:
            what = f"its certificate has expired: make new certificates ({MAKE_CERTS}) and restart the server. {trusted}"
        elif code in NOT_YET_VALID:
            what = f"its certificate is not valid yet (is this machine's clock right?). {trusted}"
        else:
            what = f"its certificate was refused ({message}). {trusted}"
        return f"TLS: cannot verify {url}: {what}"
    reason = (error.reason or str(error)).upper()
    if "WRONG_VERSION_NUMBER" in reason or "RECORD_LAYER_FAILURE" in reason or "PACKET_LENGTH_TOO_LONG" in reason:
        return f"TLS: {url} does not speak TLS (a plain-HTTP server?): use http:// for it, or serve it with TLS_CERT"
    if "CERTIFICATE_REQUIRED" in reason or "HANDSHAKE_FAILURE" in reason or "UNKNOWN_CA" in reason:
        return (f"TLS: {url} requires a client certificate signed by its cluster's CA: a server behind a gateway "
                "accepts the gateway only. Send requests to the gateway")
    if isinstance(error, ssl.SSLEOFError) or "EOF" in reason:  # the server hung up mid-handshake
        return (f"TLS: {url} ended the connection during the handshake: it requires a client certificate signed "
                "by its cluster's CA (a server behind a gateway accepts the gateway only: send requests to the "
                "gateway), or it is stopping")
    return f"TLS: the connection to {url} failed ({error.reason or error}). {trusted}"


# ---------------------------------------------------------------- checks before anything starts
def _handshake(cert: str, key: str, ca: str, name: str) -> dict:
    """A TLS handshake in memory: a server with `cert`/`key`, a client that trusts `ca` and
    connects to `name`. Returns the certificate as the client saw it; raises ssl.SSLError
    exactly as a client of the real server would."""
    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_context.load_cert_chain(cert, key)
    client_context = ssl.create_default_context(cafile=ca)
    client_in, client_out, server_in, server_out = (ssl.MemoryBIO() for _ in range(4))
    client = client_context.wrap_bio(client_in, client_out, server_hostname=name)
    server = server_context.wrap_bio(server_in, server_out, server_side=True)
    done = {"client": False, "server": False}
    for _ in range(20):
        for side, end in (("client", client), ("server", server)):
            if not done[side]:
                try:
                    end.do_handshake()
                    done[side] = True
                except ssl.SSLWantReadError:
                    pass
        server_in.write(client_out.read())
        client_in.write(server_out.read())
        if all(done.values()):
            return client.getpeercert()
    raise ssl.SSLError("the in-memory handshake did not finish")


def key_mode_problem(key: str) -> str | None:
    mode = stat.S_IMODE(os.stat(key).st_mode)
    if mode & 0o077:
        return (f"{KEY_ENV}={key} can be read by other users of this machine (mode {mode:o}): it is this machine's "
                f"private key. chmod 600 {key}")
    return None


def certificate_problems(cert: str | None, key: str | None, ca: str | None, names: list[str],
                         now: float | None = None) -> tuple[list[str], list[str]]:
    """(problems, warnings) for serving with `cert`/`key` to clients that trust `ca` and reach
    this machine by each of `names`. Checked with no network and before anything starts."""
    if not cert and not key:
        return [], []
    if not cert or not key:
        return [f"{CERT_ENV} and {KEY_ENV} go together: set both (this machine's certificate and its key; "
                f"{MAKE_CERTS} makes them)"], []
    if not ca:
        return [f"{CA_ENV} is needed with {CERT_ENV}: the CA that signed the certificates, which this machine's "
                "checks, its page and its gateway verify against (ca.pem from scripts/make_certs.py)"], []
    try:
        cert, key, ca = (_readable_file(path, name) for path, name in ((cert, CERT_ENV), (key, KEY_ENV),
                                                                        (ca, CA_ENV)))
    except TlsConfigError as exc:
        return [str(exc)], []
    problems = [problem for problem in [key_mode_problem(key)] if problem]
    warnings = []
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert, key)
    except ssl.SSLError as exc:
        return problems + [f"{CERT_ENV}={cert} and {KEY_ENV}={key} do not go together ({exc.reason or exc}): "
                           "the key must be the certificate's own"], []
    try:
        ssl.create_default_context(cafile=ca)
    except ssl.SSLError as exc:
        return problems + [f"{CA_ENV}={ca} holds no PEM certificate ({exc.reason or exc})"], []
    for name in dict.fromkeys(names):
        try:
            seen = _handshake(cert, key, ca, name.strip("[]"))
        except ssl.SSLCertVerificationError as exc:
            if exc.verify_code in WRONG_NAME:
                problems.append(f"{CERT_ENV}={cert} does not name {name}, an address this machine's services are "
                                f"reached at (it names {', '.join(names_of(cert)) or 'nothing'}). Make its "
                                f"certificate with that address: {MAKE_CERTS} NAME={name},...")
            elif exc.verify_code in UNTRUSTED:
                problems.append(f"{CERT_ENV}={cert} is not signed by {CA_ENV}={ca} ({exc.verify_message}): give "
                                "the CA that signed it (the ca.pem beside it from scripts/make_certs.py)")
            elif exc.verify_code in EXPIRED:
                problems.append(f"{CERT_ENV}={cert} has expired: make new certificates ({MAKE_CERTS} --renew ...)")
            else:
                problems.append(f"{CERT_ENV}={cert} is refused by a client that trusts {CA_ENV}={ca}: "
                                f"{exc.verify_message}")
            continue
        except ssl.SSLError as exc:
            problems.append(f"{CERT_ENV}={cert} cannot serve TLS to a client that trusts {CA_ENV}={ca}: "
                            f"{exc.reason or exc}")
            continue
        left_days = (ssl.cert_time_to_seconds(seen["notAfter"]) - (now or time.time())) / 86400
        if left_days < EXPIRY_WARNING_DAYS:
            warnings.append(f"WARNING: {CERT_ENV}={cert} expires in {left_days:.0f} days ({seen['notAfter']}): "
                            f"make new certificates before then ({MAKE_CERTS})")
    return problems, list(dict.fromkeys(warnings))


def names_of(cert: str) -> list[str]:
    """The DNS names and IP addresses a certificate holds (its subject alternative names)."""
    decoded = ssl._ssl._test_decode_cert(os.path.expanduser(cert))  # noqa: SLF001 (stdlib's only PEM decoder)
    return [value for kind, value in decoded.get("subjectAltName", ()) if kind in ("DNS", "IP Address")]


if __name__ == "__main__":  # the start script: `python3 -m ocr_bundle.tls scheme` prints http or https
    import sys

    if sys.argv[1:] != ["scheme"]:
        sys.exit("usage: python3 -m ocr_bundle.tls scheme")
    print(scheme())
