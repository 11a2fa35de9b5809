"""Certificates for HTTPS with mutual TLS: a private CA, a serving certificate and a client certificate.

It exists so that the extender can speak HTTPS with mTLS without anyone running openssl first: `extender demo`
uses it for its loopback server and its scheduler-like client, and a later `extender certs` command will use it
to write the files a cluster needs (the Service's serving certificate, kube-scheduler's client certificate and
the CA both sides trust).

Keys are ECDSA P-256; the CA may only sign leaf certificates (path length 0), the serving certificate is only
good for `serverAuth` on the names it lists, the client certificate only for `clientAuth`. It must never write
a private key readable by anyone but its owner (mode 0600), nor write the CA's key unless asked to.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

DEFAULT_VALIDITY = datetime.timedelta(days=365)
CLOCK_SKEW = datetime.timedelta(minutes=5)
"""Certificates start this long before now, so a peer whose clock is a little behind accepts them."""

LOOPBACK_NAMES = ("localhost",)
LOOPBACK_IPS = ("127.0.0.1", "::1")


@dataclass(frozen=True, slots=True)
class Issued:
    """A certificate and its private key."""

    certificate: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    @property
    def certificate_pem(self) -> bytes:
        return self.certificate.public_bytes(serialization.Encoding.PEM)

    @property
    def key_pem(self) -> bytes:
        return self.key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )


@dataclass(frozen=True, slots=True)
class CertificateFiles:
    """Where `write_certificates` put each PEM file."""

    ca_certificate: Path
    """The CA both sides trust: the server's `--client-ca`, the scheduler's `tlsConfig.caFile`."""
    server_certificate: Path
    """The server's `--tls-cert`."""
    server_key: Path
    """The server's `--tls-key` (mode 0600)."""
    client_certificate: Path
    """The scheduler's `tlsConfig.certFile`."""
    client_key: Path
    """The scheduler's `tlsConfig.keyFile` (mode 0600)."""
    ca_key: Path | None = None
    """The CA's key, only when asked for (mode 0600): whoever holds it can mint clients the server accepts."""


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _builder(
    subject: str, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey, valid_for: datetime.timedelta
) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(now + valid_for)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
    )


def _key_usage(*, signing_certificates: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=signing_certificates,
        crl_sign=signing_certificates,
        encipher_only=False,
        decipher_only=False,
    )


def make_ca(common_name: str = "gpu-extender CA", valid_for: datetime.timedelta = DEFAULT_VALIDITY) -> Issued:
    """A self-signed CA that may sign leaf certificates only."""
    key = _new_key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    certificate = (
        _builder(common_name, name, key.public_key(), valid_for)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(signing_certificates=True), critical=True)
        .sign(key, hashes.SHA256())
    )
    return Issued(certificate, key)


def _issue(
    ca: Issued,
    common_name: str,
    usage: x509.ObjectIdentifier,
    valid_for: datetime.timedelta,
    names: x509.SubjectAlternativeName | None = None,
) -> Issued:
    key = _new_key()
    builder = (
        _builder(common_name, ca.certificate.subject, key.public_key(), valid_for)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(signing_certificates=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()), critical=False)
    )
    if names is not None:
        builder = builder.add_extension(names, critical=False)
    return Issued(builder.sign(ca.key, hashes.SHA256()), key)


def issue_server(
    ca: Issued,
    dns_names: Iterable[str] = LOOPBACK_NAMES,
    ips: Iterable[str] = LOOPBACK_IPS,
    valid_for: datetime.timedelta = DEFAULT_VALIDITY,
) -> Issued:
    """A serving certificate for the given DNS names and IP addresses (clients match only these: no CN fallback)."""
    dns = list(dns_names)
    addresses = [ipaddress.ip_address(ip) for ip in ips]
    if not dns and not addresses:
        raise ValueError("a serving certificate needs at least one DNS name or IP address")
    names = x509.SubjectAlternativeName(
        [x509.DNSName(name) for name in dns] + [x509.IPAddress(address) for address in addresses]
    )
    common_name = dns[0] if dns else str(addresses[0])
    return _issue(ca, common_name, ExtendedKeyUsageOID.SERVER_AUTH, valid_for, names)


def issue_client(
    ca: Issued, common_name: str = "kube-scheduler", valid_for: datetime.timedelta = DEFAULT_VALIDITY
) -> Issued:
    """A client certificate (`clientAuth`) naming the caller in its CN."""
    return _issue(ca, common_name, ExtendedKeyUsageOID.CLIENT_AUTH, valid_for)


def _write(path: Path, data: bytes, mode: int) -> Path:
    """Write `data` so that the file never exists with wider permissions than `mode`, even for a moment."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(descriptor, "wb") as file:
        os.fchmod(file.fileno(), mode)  # an existing file keeps its old mode through O_CREAT
        file.write(data)
    return path


def write_certificates(
    directory: str | Path,
    dns_names: Iterable[str] = LOOPBACK_NAMES,
    ips: Iterable[str] = LOOPBACK_IPS,
    client_name: str = "kube-scheduler",
    valid_for: datetime.timedelta = DEFAULT_VALIDITY,
    keep_ca_key: bool = False,
) -> CertificateFiles:
    """Make a CA, a serving and a client certificate, write them as PEM into `directory`, return the paths.

    Names follow Kubernetes' conventions: `ca.crt`, `tls.crt`/`tls.key` (a `kubernetes.io/tls` Secret) and
    `client.crt`/`client.key`. Existing files of those names are replaced.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    ca = make_ca(valid_for=valid_for)
    server = issue_server(ca, dns_names, ips, valid_for)
    client = issue_client(ca, client_name, valid_for)
    return CertificateFiles(
        ca_certificate=_write(directory / "ca.crt", ca.certificate_pem, 0o644),
        server_certificate=_write(directory / "tls.crt", server.certificate_pem, 0o644),
        server_key=_write(directory / "tls.key", server.key_pem, 0o600),
        client_certificate=_write(directory / "client.crt", client.certificate_pem, 0o644),
        client_key=_write(directory / "client.key", client.key_pem, 0o600),
        ca_key=_write(directory / "ca.key", ca.key_pem, 0o600) if keep_ca_key else None,
    )
