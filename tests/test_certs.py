"""The certificates `extender.certs` writes work for HTTPS with mTLS, by real TLS handshakes on loopback."""

from __future__ import annotations

import asyncio
import datetime
import ssl
import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from extender.certs import CertificateFiles, issue_server, make_ca, write_certificates
from extender.tls import server_context

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
    with pytest.raises(ValueError, match="at least one"):
        issue_server(make_ca(), dns_names=[], ips=[])
