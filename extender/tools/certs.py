"""Certificates for HTTPS with mutual TLS: a private CA, a serving certificate and a client certificate.

It exists so that the extender can speak HTTPS with mTLS without anyone running openssl first: `extender demo`
uses it for its loopback server and its scheduler-like client, and `extender certs` writes what a cluster
without cert-manager needs (the Service's serving certificate, kube-scheduler's client certificate and the CA
both sides trust), as files or as Secret manifests. Given an existing CA it issues new leaves under it, so the
certificates can be renewed without the scheduler having to trust a new CA.

Keys are ECDSA P-256; the CA may only sign leaf certificates (path length 0), the serving certificate is only
good for `serverAuth` on the names it lists, the client certificate only for `clientAuth`. It must never write
a private key readable by anyone but its owner (mode 0600), nor write the CA's key unless asked to.
"""

from __future__ import annotations

import base64
import datetime
import errno
import ipaddress
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.asymmetric.types import CertificatePublicKeyTypes
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from extender.core.errors import UserError

DEFAULT_VALIDITY = datetime.timedelta(days=365)
CLOCK_SKEW = datetime.timedelta(minutes=5)
"""Certificates start this long before now, so a peer whose clock is a little behind accepts them."""

LOOPBACK_NAMES = ("localhost",)
LOOPBACK_IPS = ("127.0.0.1", "::1")

SERVICE = "gpu-extender"
"""The extender's Service (and default namespace) in `manifests/`."""
SERVER_SECRET = "gpu-extender-tls"
"""`kubernetes.io/tls` Secret of the extender: tls.crt, tls.key, and ca.crt (the CA that signed them)."""
CLIENT_CA_SECRET = "gpu-extender-client-ca"
"""Secret holding ca.crt alone: the extender's `--client-ca`."""
SCHEDULER_SECRET = "gpu-extender-scheduler-client"
"""`kubernetes.io/tls` Secret of the scheduler: its client certificate and key, and ca.crt to verify us."""

SigningKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey
"""What a CA may sign with: ours are ECDSA P-256; a CA brought along may be RSA."""


class CertificateError(UserError):
    """A CA file that cannot be used, or a certificate that cannot be issued as asked; the message says why."""


def service_dns_names(namespace: str, service: str = SERVICE) -> list[str]:
    """The names a client inside the cluster may use for a Service, shortest first."""
    return [service, f"{service}.{namespace}", f"{service}.{namespace}.svc", f"{service}.{namespace}.svc.cluster.local"]


@dataclass(frozen=True, slots=True)
class Issued:
    """A certificate and its private key."""

    certificate: x509.Certificate
    key: SigningKey

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
    subject: str, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey, expires: datetime.datetime
) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(expires)
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
        _builder(common_name, name, key.public_key(), datetime.datetime.now(datetime.UTC) + valid_for)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(signing_certificates=True), critical=True)
        .sign(key, hashes.SHA256())
    )
    return Issued(certificate, key)


def _public_der(key: CertificatePublicKeyTypes) -> bytes:
    return key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def _read(path: str | Path, role: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as error:
        raise CertificateError(f"{role} {path}: {error.strerror}") from None


def load_ca(certificate_path: str | Path, key_path: str | Path) -> Issued:
    """An existing CA from PEM files (its key unencrypted, ECDSA or RSA), checked to be a CA that can sign now
    and to match its key; a `ValueError` naming the file otherwise."""
    certificate_pem, key_pem = _read(certificate_path, "CA certificate"), _read(key_path, "CA key")
    try:
        certificate = x509.load_pem_x509_certificate(certificate_pem)
    except ValueError:
        raise CertificateError(f"CA certificate {certificate_path}: not a PEM certificate") from None
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError) as error:
        raise CertificateError(f"CA key {key_path}: not an unencrypted PEM private key ({error})") from None
    if not isinstance(key, SigningKey):
        raise CertificateError(f"CA key {key_path}: {type(key).__name__} keys are not supported (ECDSA or RSA)")
    if _public_der(key.public_key()) != _public_der(certificate.public_key()):
        raise CertificateError(f"CA key {key_path} does not belong to the certificate {certificate_path}")
    try:
        is_ca = certificate.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    except x509.ExtensionNotFound:
        is_ca = False
    if not is_ca:
        raise CertificateError(f"CA certificate {certificate_path} is not a CA certificate (basicConstraints CA:TRUE)")
    if certificate.not_valid_after_utc <= datetime.datetime.now(datetime.UTC):
        raise CertificateError(
            f"CA certificate {certificate_path} expired on {certificate.not_valid_after_utc:%Y-%m-%d}"
        )
    return Issued(certificate, key)


def _authority_key_identifier(ca: Issued) -> x509.AuthorityKeyIdentifier:
    """Point at the CA's own subject key identifier when it has one (a CA brought along may compute it another
    way than we would)."""
    try:
        identifier = ca.certificate.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    except x509.ExtensionNotFound:
        return x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key())
    return x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(identifier)


def _issue(
    ca: Issued,
    common_name: str,
    usage: x509.ObjectIdentifier,
    valid_for: datetime.timedelta,
    names: x509.SubjectAlternativeName | None = None,
) -> Issued:
    """A leaf certificate signed by `ca`; it never outlives the CA (cut to the CA's end when that is less than a
    day short of `valid_for`, refused when more)."""
    key = _new_key()
    ca_expires = ca.certificate.not_valid_after_utc
    expires = datetime.datetime.now(datetime.UTC) + valid_for
    if expires - ca_expires > datetime.timedelta(days=1):
        raise CertificateError(
            f"the CA is valid until {ca_expires:%Y-%m-%d}, before a certificate valid for {valid_for.days} days "
            "would expire: ask for fewer days or make a new CA"
        )
    builder = (
        _builder(common_name, ca.certificate.subject, key.public_key(), min(expires, ca_expires))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(signing_certificates=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(_authority_key_identifier(ca), critical=False)
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
        raise CertificateError("a serving certificate needs at least one DNS name or IP address")
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


@dataclass(frozen=True, slots=True)
class Certificates:
    """One set: a CA, a serving certificate and a client certificate it signed."""

    ca: Issued
    server: Issued
    client: Issued


def issue_certificates(
    dns_names: Iterable[str] = LOOPBACK_NAMES,
    ips: Iterable[str] = LOOPBACK_IPS,
    client_name: str = "kube-scheduler",
    valid_for: datetime.timedelta = DEFAULT_VALIDITY,
    ca: Issued | None = None,
) -> Certificates:
    """A serving and a client certificate signed by `ca`, or by a new CA made for them."""
    ca = ca or make_ca(valid_for=valid_for)
    return Certificates(ca, issue_server(ca, dns_names, ips, valid_for), issue_client(ca, client_name, valid_for))


FILE_NAMES = ("ca.crt", "tls.crt", "tls.key", "client.crt", "client.key")
"""What `write_certificates` writes, and `ca.key` when asked."""


def write_certificates(
    directory: str | Path,
    dns_names: Iterable[str] = LOOPBACK_NAMES,
    ips: Iterable[str] = LOOPBACK_IPS,
    client_name: str = "kube-scheduler",
    valid_for: datetime.timedelta = DEFAULT_VALIDITY,
    keep_ca_key: bool = False,
    ca: Issued | None = None,
    replace: bool = True,
) -> CertificateFiles:
    """Make a serving and a client certificate (and a CA, unless `ca` is given), write them as PEM into
    `directory`, return the paths.

    Names follow Kubernetes' conventions: `ca.crt`, `tls.crt`/`tls.key` (a `kubernetes.io/tls` Secret) and
    `client.crt`/`client.key`. Existing files of those names are replaced, unless `replace` is false: then
    `FileExistsError` names the first one found, before anything is written.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    if not replace:
        for name in (*FILE_NAMES, "ca.key") if keep_ca_key else FILE_NAMES:
            if (directory / name).exists():
                raise FileExistsError(errno.EEXIST, "already exists", str(directory / name))
    issued = issue_certificates(dns_names, ips, client_name, valid_for, ca)
    return CertificateFiles(
        ca_certificate=_write(directory / "ca.crt", issued.ca.certificate_pem, 0o644),
        server_certificate=_write(directory / "tls.crt", issued.server.certificate_pem, 0o644),
        server_key=_write(directory / "tls.key", issued.server.key_pem, 0o600),
        client_certificate=_write(directory / "client.crt", issued.client.certificate_pem, 0o644),
        client_key=_write(directory / "client.key", issued.client.key_pem, 0o600),
        ca_key=_write(directory / "ca.key", issued.ca.key_pem, 0o600) if keep_ca_key else None,
    )


def _secret(name: str, namespace: str, kind: str, data: dict[str, bytes]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app.kubernetes.io/part-of": SERVICE}},
        "type": kind,
        "data": {key: base64.b64encode(value).decode("ascii") for key, value in data.items()},
    }


def secrets(issued: Certificates, namespace: str) -> list[dict[str, Any]]:
    """The three Secrets of `SERVER_SECRET`, `CLIENT_CA_SECRET` and `SCHEDULER_SECRET`; never the CA's key."""
    ca = issued.ca.certificate_pem
    return [
        _secret(
            SERVER_SECRET,
            namespace,
            "kubernetes.io/tls",
            {"tls.crt": issued.server.certificate_pem, "tls.key": issued.server.key_pem, "ca.crt": ca},
        ),
        _secret(CLIENT_CA_SECRET, namespace, "Opaque", {"ca.crt": ca}),
        _secret(
            SCHEDULER_SECRET,
            namespace,
            "kubernetes.io/tls",
            {"tls.crt": issued.client.certificate_pem, "tls.key": issued.client.key_pem, "ca.crt": ca},
        ),
    ]


def secrets_yaml(issued: Certificates, namespace: str) -> str:
    """`secrets()` as a YAML stream for `kubectl apply -f -`."""
    return yaml.safe_dump_all(secrets(issued, namespace), sort_keys=False, width=1_000_000)
