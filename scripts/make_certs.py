#!/usr/bin/env python3
"""Certificates for a private cluster: one CA, and per machine a certificate for serving and for
being a client, each with the names clients use to reach that machine.

    python3 scripts/make_certs.py head=10.0.0.1,head.lan node1=10.0.0.2 node2=10.0.0.3
    python3 scripts/make_certs.py node3=10.0.0.4                  # later: the same CA signs a new machine

Writes into --out (default ./certs):

    ca.pem                the CA's certificate: every machine and every client needs it (public)
    ca-key.pem            the CA's private key (mode 0600): it signs new machines. Keep it here, copy it nowhere
    MACHINE/cert.pem      the machine's certificate: its names plus 127.0.0.1, ::1 and localhost (the
                          start script checks its own services over loopback); good for serving (TLS
                          server) and for presenting to servers (TLS client: the gateway to the nodes)
    MACHINE/key.pem       its private key (mode 0600)
    MACHINE/ca.pem        a copy of the CA's certificate, so one folder is all a machine needs

and prints, per machine, what to copy and the variables to start it with. Keys are ECDSA P-256.
An existing CA in --out is reused (so machines can be added later); an existing machine's
certificate is kept unless --renew, and only while it is still good: signed by this CA, naming every
address asked for, valid, with its key (otherwise it is renewed, saying why). Needs the `cryptography` package (requirements-bundle.txt).
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

LOOPBACK_NAMES = ("127.0.0.1", "::1", "localhost")
MACHINE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
DNS_NAME = re.compile(r"^(?=.{1,253}$)([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}"
                      r"[A-Za-z0-9])?)*$")
RESERVED_NAMES = ("ca.pem", "ca-key.pem")  # the CA's files, beside the machines' folders
SKEW = datetime.timedelta(minutes=5)  # valid from a little before now: clocks of a cluster differ a little


@dataclass(frozen=True)
class Machine:
    name: str
    addresses: tuple[str, ...]  # as given: IP addresses and DNS names

    @property
    def sans(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys([*self.addresses, *LOOPBACK_NAMES]))


def parse_machine(text: str) -> Machine:
    """'node1=10.0.0.2,node1.lan' → Machine; raises ValueError with a message for people."""
    name, sep, addresses = text.partition("=")
    if not sep or not MACHINE_NAME.match(name):
        raise ValueError(f"{text!r}: give each machine as NAME=ADDRESS[,ADDRESS...], e.g. node1=10.0.0.2 (NAME: "
                         "letters, digits, . _ -; it names the machine's folder)")
    if name in RESERVED_NAMES:
        raise ValueError(f"{text!r}: {name} is the name of the CA's own file in the output folder: name the machine "
                         "otherwise")
    parsed = []
    for address in filter(None, (part.strip() for part in addresses.split(","))):
        try:
            parsed.append(str(ipaddress.ip_address(address.strip("[]"))))
        except ValueError:
            if not DNS_NAME.match(address):
                raise ValueError(f"{text!r}: {address!r} is neither an IP address nor a host name") from None
            parsed.append(address.lower())
    if not parsed:
        raise ValueError(f"{text!r}: no address: clients must reach {name} by at least one (its IP or host name)")
    return Machine(name, tuple(parsed))


def _general_name(value: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(value))
    except ValueError:
        return x509.DNSName(value)


def make_ca(days: int, now: datetime.datetime, common_name: str = "LightOnOCR bundle cluster CA"
            ) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    public = key.public_key()
    certificate = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - SKEW).not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                     crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .sign(key, hashes.SHA256())
    )
    return certificate, key


def make_machine_certificate(machine: Machine, ca: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey, days: int,
                             now: datetime.datetime) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    public = key.public_key()
    certificate = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, machine.name)]))
        .issuer_name(ca.subject).public_key(public).serial_number(x509.random_serial_number())
        .not_valid_before(now - SKEW).not_valid_after(min(now + datetime.timedelta(days=days), ca.not_valid_after_utc))
        .add_extension(x509.SubjectAlternativeName([_general_name(value) for value in machine.sans]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False, key_cert_sign=False,
                                     crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
        # Server (it serves HTTPS) and client (the gateway presents it to the servers behind it).
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                       critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return certificate, key


def certificate_pem(certificate: x509.Certificate) -> bytes:
    return certificate.public_bytes(serialization.Encoding.PEM)


def key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def write_file(path: Path, data: bytes, mode: int) -> None:
    """Atomically, with `mode` from the first byte (a key is never readable by others, not even briefly)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temporary, mode)  # the umask may have taken bits away from a public file
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def load_or_make_ca(out: Path, days: int, now: datetime.datetime
                    ) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey, bool]:
    """The CA in `out` (reused), or a new one written there; True when new."""
    ca_path, ca_key_path = out / "ca.pem", out / "ca-key.pem"
    if ca_path.exists() != ca_key_path.exists():
        raise ValueError(f"{out} holds one of ca.pem and ca-key.pem but not the other: give another --out, or put "
                         "the missing one back")
    if ca_path.exists():
        ca = x509.load_pem_x509_certificate(ca_path.read_bytes())
        ca_key = serialization.load_pem_private_key(ca_key_path.read_bytes(), password=None)
        if ca.public_key().public_numbers() != ca_key.public_key().public_numbers():
            raise ValueError(f"{ca_key_path} is not the key of {ca_path}")
        if ca.not_valid_after_utc <= now:
            raise ValueError(f"the CA in {ca_path} expired on {ca.not_valid_after_utc:%Y-%m-%d}: make a new cluster "
                             "(another --out) and give every machine its new files")
        return ca, ca_key, False
    ca, ca_key = make_ca(days, now)
    write_file(ca_key_path, key_pem(ca_key), 0o600)
    write_file(ca_path, certificate_pem(ca), 0o644)
    return ca, ca_key, True


def why_not_kept(folder: Path, machine: Machine, ca: x509.Certificate, now: datetime.datetime) -> str | None:
    """Why a machine's existing certificate cannot be kept (None: it can): it must be signed by this
    CA (a CA made again after the old one was lost signs nothing that exists), name every address
    asked for, be valid now, and go with the key beside it."""
    try:
        certificate = x509.load_pem_x509_certificate((folder / "cert.pem").read_bytes())
        key = serialization.load_pem_private_key((folder / "key.pem").read_bytes(), password=None)
    except (OSError, ValueError) as exc:
        return f"cannot be read ({exc})"
    try:
        certificate.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return f"is not signed by the CA in {folder.parent}/ca.pem (made again?): it would not verify against it"
    if certificate.public_key().public_numbers() != key.public_key().public_numbers():
        return "does not go with the key.pem beside it"
    if not certificate.not_valid_before_utc <= now < certificate.not_valid_after_utc:
        return f"is not valid now (until {certificate.not_valid_after_utc:%Y-%m-%d})"
    names = {str(value) for value in
             certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
             .get_values_for_type(x509.IPAddress)}
    names |= set(certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
                 .get_values_for_type(x509.DNSName))
    missing = [address for address in machine.sans if address not in names]
    if missing:
        return f"does not name {', '.join(missing)}"
    if not (folder / "ca.pem").exists() or (folder / "ca.pem").read_bytes() != certificate_pem(ca):
        return "has a ca.pem beside it that is not this CA"
    return None


def environment_line(folder: Path) -> str:
    return f"TLS_CERT={folder}/cert.pem TLS_KEY={folder}/key.pem TLS_CA={folder}/ca.pem"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("machines", nargs="+", metavar="NAME=ADDRESS[,ADDRESS...]",
                        help="each machine: a name (its folder) and the addresses clients and the gateway use to "
                             "reach it (IP addresses, host names)")
    parser.add_argument("--out", type=Path, default=Path("certs"), help="where to write (default ./certs)")
    parser.add_argument("--days", type=int, default=365, help="machine certificates' validity (default 365)")
    parser.add_argument("--ca-days", type=int, default=3650, help="a new CA's validity (default 3650)")
    parser.add_argument("--renew", action="store_true",
                        help="replace the certificates of machines that have one already (default: keep them)")
    args = parser.parse_args(argv)
    try:
        machines = [parse_machine(text) for text in args.machines]
        if len({machine.name for machine in machines}) != len(machines):
            raise ValueError("a machine is named twice")
        if min(args.days, args.ca_days) < 1:
            raise ValueError("--days and --ca-days must be at least 1")
        now = datetime.datetime.now(datetime.timezone.utc)
        out = args.out.resolve()
        ca, ca_key, new_ca = load_or_make_ca(out, args.ca_days, now)
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{'made' if new_ca else 'reusing'} the cluster's CA: {out}/ca.pem (public: every machine and client needs "
          f"it), its key {out}/ca-key.pem (private: keep it here, it signs new machines)")
    for machine in machines:
        folder = out / machine.name
        if (folder / "cert.pem").exists() and not args.renew:
            stale = why_not_kept(folder, machine, ca, now)
            if stale is None:
                print(f"\n{machine.name}: has a certificate already ({folder}/cert.pem), kept (--renew replaces it)")
                continue
            print(f"\n{machine.name}: its certificate in {folder} {stale}: renewed (a new key and certificate; copy "
                  "the folder to the machine again)")
        certificate, key = make_machine_certificate(machine, ca, ca_key, args.days, now)
        write_file(folder / "key.pem", key_pem(key), 0o600)
        write_file(folder / "cert.pem", certificate_pem(certificate), 0o644)
        write_file(folder / "ca.pem", certificate_pem(ca), 0o644)
        print(f"\n{machine.name}: {', '.join(machine.sans)}; valid until "
              f"{certificate.not_valid_after_utc:%Y-%m-%d}\n"
              f"  copy {folder}/ to that machine at the same path, e.g.\n"
              f"    ssh {machine.addresses[0]} mkdir -p {out} && scp -rp {folder} {machine.addresses[0]}:{out}/\n"
              f"  then start it there with\n    {environment_line(folder)}")
    print(f"\nclients: --ca-cert {out}/ca.pem (or VLLM_CA_CERT={out}/ca.pem); curl --cacert {out}/ca.pem")
    return 0


if __name__ == "__main__":
    sys.exit(main())
