"""The certificates `extender.tools.certs` writes work for HTTPS with mTLS, by real TLS handshakes on loopback; and
`extender certs` writes them as files or as the Secrets the manifests mount."""

from __future__ import annotations

import asyncio
import base64
import datetime
import ssl
import stat
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from extender.cli import main
from extender.service.tls import server_context
from extender.tools.certs import CertificateError, CertificateFiles, issue_server, load_ca, make_ca, write_certificates

SERVICE_NAME = "gpu-extender.gpu-extender.svc"


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> CertificateFiles:
    return write_certificates(tmp_path_factory.mktemp("certs"), dns_names=["localhost", SERVICE_NAME])


def client_context(files: CertificateFiles, with_certificate: bool = True) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(files.ca_certificate))
    if with_certificate:
        context.load_cert_chain(files.client_certificate, files.client_key)
    return context


async def handshake(files: CertificateFiles, server_hostname: str, client: ssl.SSLContext) -> str:
    """Connect over TLS to a loopback server requiring client certificates; returns the client CN it saw.

    Raises when the client refuses the server; when the server refuses the client, it closes the connection
    (TLS 1.3 reports that after the client's side of the handshake is done), and this raises ConnectionError.
    """
    seen: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peercert") or {}
        subject = dict(pair[0] for pair in peer.get("subject", ()))
        if not seen.done():
            seen.set_result(str(subject.get("commonName", "")))
        writer.write(b"ok")
        await writer.drain()
        writer.close()

    context = server_context(str(files.server_certificate), str(files.server_key), str(files.ca_certificate))
    server = await asyncio.start_server(answer, "127.0.0.1", 0, ssl=context)
    port = server.sockets[0].getsockname()[1]
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client, server_hostname=server_hostname)
        try:
            if await reader.read() != b"ok":
                raise ConnectionError("the server closed the connection without answering")
        finally:
            writer.close()
            await writer.wait_closed()
        return await asyncio.wait_for(seen, 2)
    finally:
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize("name", ["localhost", SERVICE_NAME, "127.0.0.1"])
async def test_server_certificate_verifies_against_the_ca_for_each_of_its_names(
    files: CertificateFiles, name: str
) -> None:
    assert await handshake(files, name, client_context(files)) == "kube-scheduler"


async def test_server_certificate_is_refused_for_a_name_it_does_not_list(files: CertificateFiles) -> None:
    with pytest.raises(ssl.SSLCertVerificationError, match="match"):
        await handshake(files, "other.example", client_context(files))


async def test_a_client_without_a_certificate_is_refused_by_the_server(files: CertificateFiles) -> None:
    with pytest.raises((ssl.SSLError, ConnectionError)):
        await handshake(files, "localhost", client_context(files, with_certificate=False))


async def test_a_certificate_from_another_ca_is_refused(files: CertificateFiles, tmp_path: Path) -> None:
    stranger = write_certificates(tmp_path)
    with pytest.raises(ssl.SSLCertVerificationError):
        await handshake(files, "localhost", client_context(stranger))


async def test_the_serving_certificate_cannot_stand_in_for_a_client_certificate(files: CertificateFiles) -> None:
    impostor = ssl.create_default_context(cafile=str(files.ca_certificate))
    impostor.load_cert_chain(files.server_certificate, files.server_key)
    with pytest.raises((ssl.SSLError, ConnectionError)):
        await handshake(files, "localhost", impostor)


def test_client_certificate_is_for_client_auth_with_the_scheduler_as_cn(files: CertificateFiles) -> None:
    certificate = x509.load_pem_x509_certificate(files.client_certificate.read_bytes())
    usages = certificate.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usages) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    assert certificate.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "kube-scheduler"
    assert not certificate.extensions.get_extension_for_class(x509.BasicConstraints).value.ca


def test_server_certificate_is_for_server_auth_only(files: CertificateFiles) -> None:
    certificate = x509.load_pem_x509_certificate(files.server_certificate.read_bytes())
    usages = certificate.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usages) == [ExtendedKeyUsageOID.SERVER_AUTH]


def test_key_files_are_readable_by_their_owner_only(files: CertificateFiles) -> None:
    for key in (files.server_key, files.client_key):
        assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert stat.S_IMODE(files.ca_certificate.stat().st_mode) == 0o644


def test_the_ca_key_is_written_only_when_asked(tmp_path: Path) -> None:
    assert write_certificates(tmp_path / "without").ca_key is None
    kept = write_certificates(tmp_path / "with", keep_ca_key=True).ca_key
    assert kept is not None and stat.S_IMODE(kept.stat().st_mode) == 0o600


def test_rewriting_over_a_world_readable_key_narrows_its_mode(tmp_path: Path) -> None:
    (tmp_path / "tls.key").write_text("old")
    (tmp_path / "tls.key").chmod(0o644)
    written = write_certificates(tmp_path)
    assert stat.S_IMODE(written.server_key.stat().st_mode) == 0o600


def test_validity_is_configurable() -> None:
    ca = make_ca(valid_for=datetime.timedelta(days=30))
    server = issue_server(ca, valid_for=datetime.timedelta(days=30))
    lifetime = server.certificate.not_valid_after_utc - server.certificate.not_valid_before_utc
    assert datetime.timedelta(days=30) < lifetime <= datetime.timedelta(days=30, minutes=10)


def test_a_serving_certificate_needs_a_name() -> None:
    with pytest.raises(CertificateError, match="at least one"):
        issue_server(make_ca(), dns_names=[], ips=[])


# --- `extender certs` ---------------------------------------------------------------------------------------

SERVICE_NAMES = [
    "gpu-extender",
    "gpu-extender.gpu-extender",
    "gpu-extender.gpu-extender.svc",
    "gpu-extender.gpu-extender.svc.cluster.local",
]


def _certificate(pem: bytes) -> x509.Certificate:
    return x509.load_pem_x509_certificate(pem)


def _usages(certificate: x509.Certificate) -> list[x509.ObjectIdentifier]:
    return list(certificate.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)


def _names(certificate: x509.Certificate) -> tuple[list[str], list[str]]:
    alternatives = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return alternatives.get_values_for_type(x509.DNSName), [
        str(ip) for ip in alternatives.get_values_for_type(x509.IPAddress)
    ]


def _matches(certificate: x509.Certificate, key_pem: bytes) -> bool:
    key = serialization.load_pem_private_key(key_pem, password=None)
    spki = serialization.PublicFormat.SubjectPublicKeyInfo
    return key.public_key().public_bytes(serialization.Encoding.DER, spki) == certificate.public_key().public_bytes(
        serialization.Encoding.DER, spki
    )


def test_certs_writes_the_files_with_the_services_names_and_owner_only_keys(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "certs"
    assert main(["certs", "--out", str(out), "--dns-name", "gpu.example.com", "--ip", "10.0.0.7", "--days", "30"]) == 0
    assert sorted(path.name for path in out.iterdir()) == ["ca.crt", "client.crt", "client.key", "tls.crt", "tls.key"]
    for name, mode in {
        "ca.crt": 0o644,
        "tls.crt": 0o644,
        "client.crt": 0o644,
        "tls.key": 0o600,
        "client.key": 0o600,
    }.items():
        assert stat.S_IMODE((out / name).stat().st_mode) == mode, name
    ca, server, client = (_certificate((out / name).read_bytes()) for name in ("ca.crt", "tls.crt", "client.crt"))
    # 127.0.0.1 always: `extender inspect` through a port-forward, as docs/install/check.md runs it.
    assert _names(server) == ([*SERVICE_NAMES, "gpu.example.com"], ["127.0.0.1", "10.0.0.7"])
    assert _usages(server) == [ExtendedKeyUsageOID.SERVER_AUTH]
    assert _usages(client) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    assert client.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "kube-scheduler"
    for leaf, key in ((server, "tls.key"), (client, "client.key")):
        leaf.verify_directly_issued_by(ca)
        assert _matches(leaf, (out / key).read_bytes())
        assert leaf.not_valid_after_utc - leaf.not_valid_before_utc <= datetime.timedelta(days=30, minutes=10)
    printed = capsys.readouterr().out
    assert f"wrote to {out}" in printed and "--tls-cert" in printed and "tlsConfig.keyFile" in printed


async def test_certs_files_serve_mtls_under_the_services_name(tmp_path: Path) -> None:
    out = tmp_path / "certs"
    assert main(["certs", "--out", str(out), "--ip", "127.0.0.1", "--client-name", "second-scheduler"]) == 0
    files = CertificateFiles(*(out / name for name in ("ca.crt", "tls.crt", "tls.key", "client.crt", "client.key")))
    assert await handshake(files, "gpu-extender.gpu-extender.svc", client_context(files)) == "second-scheduler"


def test_certs_refuses_to_replace_existing_files_unless_forced(tmp_path: Path) -> None:
    out = tmp_path / "certs"
    assert main(["certs", "--out", str(out)]) == 0
    before = (out / "ca.crt").read_bytes()
    assert main(["certs", "--out", str(out)]) == 2
    assert (out / "ca.crt").read_bytes() == before
    assert main(["certs", "--out", str(out), "--force"]) == 0
    assert (out / "ca.crt").read_bytes() != before


def test_certs_renews_under_an_existing_ca(tmp_path: Path) -> None:
    """Renewal without the scheduler trusting anything new: the same ca.crt, new leaves it signed."""
    first, renewed = tmp_path / "first", tmp_path / "renewed"
    assert main(["certs", "--out", str(first), "--keep-ca-key"]) == 0
    assert stat.S_IMODE((first / "ca.key").stat().st_mode) == 0o600
    assert (
        main(["certs", "--out", str(renewed), "--ca-cert", str(first / "ca.crt"), "--ca-key", str(first / "ca.key")])
        == 0
    )
    assert (renewed / "ca.crt").read_bytes() == (first / "ca.crt").read_bytes()
    assert (renewed / "tls.crt").read_bytes() != (first / "tls.crt").read_bytes()
    ca = _certificate((first / "ca.crt").read_bytes())
    _certificate((renewed / "tls.crt").read_bytes()).verify_directly_issued_by(ca)
    _certificate((renewed / "client.crt").read_bytes()).verify_directly_issued_by(ca)
    assert not (renewed / "ca.key").exists()


def test_a_leaf_never_outlives_its_ca(tmp_path: Path) -> None:
    ca = make_ca(valid_for=datetime.timedelta(days=10))
    leaf = issue_server(ca, valid_for=datetime.timedelta(days=10, hours=12))
    assert leaf.certificate.not_valid_after_utc == ca.certificate.not_valid_after_utc
    with pytest.raises(CertificateError, match="the CA is valid until"):
        issue_server(ca, valid_for=datetime.timedelta(days=12))


def test_load_ca_reads_back_a_ca_written_with_its_key(tmp_path: Path) -> None:
    files = write_certificates(tmp_path, keep_ca_key=True)
    assert files.ca_key is not None
    ca = load_ca(files.ca_certificate, files.ca_key)
    issue_server(ca).certificate.verify_directly_issued_by(ca.certificate)


def _secrets(capsys: pytest.CaptureFixture[str], *flags: str) -> dict[str, dict[str, Any]]:
    assert main(["certs", "--secrets", *flags]) == 0
    documents = list(yaml.safe_load_all(capsys.readouterr().out))
    return {document["metadata"]["name"]: document for document in documents}


def _decoded(secret: dict[str, Any]) -> dict[str, bytes]:
    return {key: base64.b64decode(value, validate=True) for key, value in secret["data"].items()}


def test_certs_secrets_are_the_three_the_manifests_mount(capsys: pytest.CaptureFixture[str]) -> None:
    secrets = _secrets(capsys)
    assert sorted(secrets) == ["gpu-extender-client-ca", "gpu-extender-scheduler-client", "gpu-extender-tls"]
    for secret in secrets.values():
        assert secret["apiVersion"] == "v1" and secret["kind"] == "Secret"
        assert secret["metadata"]["namespace"] == "gpu-extender"
    assert secrets["gpu-extender-tls"]["type"] == "kubernetes.io/tls"
    assert secrets["gpu-extender-scheduler-client"]["type"] == "kubernetes.io/tls"
    assert secrets["gpu-extender-client-ca"]["type"] == "Opaque"

    server, client, client_ca = (
        _decoded(secrets[name])
        for name in ("gpu-extender-tls", "gpu-extender-scheduler-client", "gpu-extender-client-ca")
    )
    assert sorted(server) == sorted(client) == ["ca.crt", "tls.crt", "tls.key"]
    assert sorted(client_ca) == ["ca.crt"]
    for pem in (*server.values(), *client.values(), *client_ca.values()):
        assert pem.startswith(b"-----BEGIN ")
    assert server["ca.crt"] == client["ca.crt"] == client_ca["ca.crt"]
    ca = _certificate(client_ca["ca.crt"])
    serving, scheduler = _certificate(server["tls.crt"]), _certificate(client["tls.crt"])
    serving.verify_directly_issued_by(ca)
    scheduler.verify_directly_issued_by(ca)
    assert _matches(serving, server["tls.key"]) and _matches(scheduler, client["tls.key"])
    assert _names(serving) == (SERVICE_NAMES, ["127.0.0.1"])
    assert _usages(serving) == [ExtendedKeyUsageOID.SERVER_AUTH]
    assert _usages(scheduler) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    assert b"PRIVATE KEY" not in client_ca["ca.crt"], "the CA's key is never in a Secret"


def test_certs_secrets_follow_the_namespace_and_extra_names(capsys: pytest.CaptureFixture[str]) -> None:
    secrets = _secrets(capsys, "--namespace", "gpu", "--dns-name", "extender.example", "--ip", "fd00::1")
    assert {secret["metadata"]["namespace"] for secret in secrets.values()} == {"gpu"}
    serving = _certificate(_decoded(secrets["gpu-extender-tls"])["tls.crt"])
    dns, ips = _names(serving)
    service = ["gpu-extender", "gpu-extender.gpu", "gpu-extender.gpu.svc", "gpu-extender.gpu.svc.cluster.local"]
    assert dns == [*service, "extender.example"]
    assert ips == ["127.0.0.1", "fd00::1"]
