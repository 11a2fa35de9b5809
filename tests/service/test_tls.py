"""HTTPS with real certificates (trustme, extender.tools.certs), and mutual TLS: without a certificate signed by the
client CA, no verb is served; with the scheduler's certificate, every verb is. Rotation: files swapped as the
kubelet swaps a mounted Secret are served to new connections, while connections already open keep working."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import socket
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import orjson
import pytest
from cryptography import x509

from extender.service.tls import ReloadingContext, TLSConfigError, server_context
from extender.service.verbs import build_server
from extender.tools.certs import Issued, issue_client, issue_server, make_ca
from tests.builders import make_cluster, make_node, make_pod
from tests.conftest import Pki, SecretVolume, make_service, serve


async def _serve(context: ssl.SSLContext) -> AsyncIterator[str]:
    async for url in serve(build_server(make_service(make_cluster(make_node("n1")))), context):
        yield url


@pytest.fixture
async def https_url(pki: Pki) -> AsyncIterator[str]:
    async for url in _serve(server_context(pki.server_cert, pki.server_key)):
        yield url


@pytest.fixture
async def mtls_url(pki: Pki) -> AsyncIterator[str]:
    """Served as `extender serve` serves: through a ReloadingContext's listening context."""
    async for url in _serve(ReloadingContext(pki.server_cert, pki.server_key, client_ca=pki.ca).listening):
        yield url


def client_context(pki: Pki, cert: str = "", key: str = "") -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=pki.ca)
    if cert:
        context.load_cert_chain(cert, key)
    return context


FILTER = orjson.dumps({"Pod": make_pod("p", gpu_mem=4), "NodeNames": ["n1"]})
BIND = orjson.dumps({"PodName": "p", "PodNamespace": "default", "PodUID": "u", "Node": "n1"})


async def _post(url: str, verb: str, body: bytes, context: ssl.SSLContext | bool) -> int:
    async with aiohttp.ClientSession() as session, session.post(f"{url}/{verb}", data=body, ssl=context) as response:
        await response.read()
        return response.status


async def test_https_serves_a_client_that_trusts_the_ca(pki: Pki, https_url: str) -> None:
    assert await _post(https_url, "filter", FILTER, client_context(pki)) == 200


async def test_https_certificate_is_refused_by_a_client_that_does_not_trust_it(https_url: str) -> None:
    with pytest.raises(aiohttp.ClientConnectorCertificateError):
        await _post(https_url, "filter", FILTER, ssl.create_default_context())


@pytest.mark.parametrize("verb", ["filter", "prioritize", "bind", "preempt"])
async def test_mtls_refuses_a_client_without_a_certificate(pki: Pki, mtls_url: str, verb: str) -> None:
    with pytest.raises(aiohttp.ClientError):
        await _post(mtls_url, verb, FILTER, client_context(pki))


@pytest.mark.parametrize("verb", ["filter", "prioritize", "bind", "preempt"])
async def test_mtls_refuses_a_certificate_from_another_ca(pki: Pki, mtls_url: str, verb: str) -> None:
    with pytest.raises(aiohttp.ClientError):
        await _post(mtls_url, verb, FILTER, client_context(pki, pki.stranger_cert, pki.stranger_key))


async def test_mtls_serves_the_schedulers_certificate_every_verb(pki: Pki, mtls_url: str) -> None:
    context = client_context(pki, pki.client_cert, pki.client_key)
    assert await _post(mtls_url, "filter", FILTER, context) == 200
    assert await _post(mtls_url, "prioritize", FILTER, context) == 200
    assert await _post(mtls_url, "bind", BIND, context) == 200
    assert (
        await _post(mtls_url, "preempt", orjson.dumps({"Pod": make_pod(), "NodeNameToMetaVictims": {}}), context) == 200
    )


async def test_alpn_settles_on_http_1_1_when_h2_is_offered(pki: Pki, https_url: str) -> None:
    """Go's client (kube-scheduler) offers h2 first; we must answer with HTTP/1.1, not break."""
    context = client_context(pki)
    context.set_alpn_protocols(["h2", "http/1.1"])
    host, port = https_url.removeprefix("https://").split(":")
    _, writer = await asyncio.open_connection(host, int(port), ssl=context)
    assert writer.get_extra_info("ssl_object").selected_alpn_protocol() == "http/1.1"
    writer.close()
    await writer.wait_closed()


def test_missing_or_mismatched_files_are_named(pki: Pki, tmp_path: Path) -> None:
    with pytest.raises(TLSConfigError, match=r"not found: .*absent\.crt"):
        server_context(str(tmp_path / "absent.crt"), pki.server_key)
    with pytest.raises(TLSConfigError, match="cannot use certificate"):
        server_context(pki.server_cert, pki.client_key)
    with pytest.raises(TLSConfigError, match="client CA not found"):
        server_context(pki.server_cert, pki.server_key, client_ca=str(tmp_path / "none.crt"))


# --- rotation ----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Rotation:
    """Two serving certificates (new keys each) and a client certificate from one CA, and a client
    certificate from a second CA; the volume the server reads them from."""

    ca: Issued
    server_a: Issued
    server_b: Issued
    client: Issued
    other_ca: Issued
    other_client: Issued
    volume: SecretVolume

    def publish(self, server: Issued, client_ca: Issued | None = None, key: Issued | None = None) -> None:
        self.volume.publish(
            {
                "tls.crt": server.certificate_pem,
                "tls.key": (key or server).key_pem,
                "ca.crt": (client_ca or self.ca).certificate_pem,
            }
        )

    def client_context(self, client: Issued | None = None) -> ssl.SSLContext:
        """Trusts `ca` (both serving certificates) and presents `client` (default: the scheduler's)."""
        context = ssl.create_default_context(cadata=self.ca.certificate_pem.decode())
        context.set_alpn_protocols(["h2", "http/1.1"])
        client = client or self.client
        folder = self.volume.root.parent
        cert, key = folder / f"client-{client.certificate.serial_number}.crt", folder / "client.key"
        cert.write_bytes(client.certificate_pem)
        key.write_bytes(client.key_pem)
        context.load_cert_chain(cert, key)
        return context


@pytest.fixture
def rotation(tmp_path: Path) -> Rotation:
    ca, other_ca = make_ca(), make_ca("another CA")
    made = Rotation(
        ca=ca,
        server_a=issue_server(ca),
        server_b=issue_server(ca),
        client=issue_client(ca),
        other_ca=other_ca,
        other_client=issue_client(other_ca),
        volume=SecretVolume(tmp_path / "tls"),
    )
    made.publish(made.server_a)
    return made


@pytest.fixture
def reloading(rotation: Rotation) -> ReloadingContext:
    volume = rotation.volume
    return ReloadingContext(volume.path("tls.crt"), volume.path("tls.key"), volume.path("ca.crt"))


@pytest.fixture
async def rotating_url(reloading: ReloadingContext) -> AsyncIterator[str]:
    async for url in _serve(reloading.listening):
        yield url


class Connection:
    """One HTTPS connection kept alive across requests, as kube-scheduler's Go client keeps its own."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, url: str, context: ssl.SSLContext) -> Connection:
        host, port = url.removeprefix("https://").split(":")
        return cls(*await asyncio.open_connection(host, int(port), ssl=context, server_hostname="localhost"))

    @property
    def server_certificate(self) -> int:
        """The serial number of the certificate the server presented on this connection."""
        der = self.writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        return x509.load_der_x509_certificate(der).serial_number

    @property
    def alpn(self) -> str | None:
        return str(self.writer.get_extra_info("ssl_object").selected_alpn_protocol())

    async def filter(self) -> int:
        """POST /filter on this connection; the status. A server that refused us raises (TLS 1.3 tells the
        client after its side of the handshake, so the refusal shows on the first read)."""
        self.writer.write(b"POST /filter HTTP/1.1\r\nHost: localhost\r\nContent-Length: %d\r\n\r\n" % len(FILTER))
        self.writer.write(FILTER)
        head = await asyncio.wait_for(self.reader.readuntil(b"\r\n\r\n"), 5)
        length = re.search(rb"Content-Length: (\d+)", head)
        await self.reader.readexactly(int(length[1]) if length else 0)
        return int(head.split()[1])

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ssl.SSLError, ConnectionError):
            await self.writer.wait_closed()


async def _new_connection_serves(url: str, context: ssl.SSLContext) -> int:
    """The serial of the certificate a new connection gets, after a request on it succeeded."""
    connection = await Connection.open(url, context)
    try:
        assert await connection.filter() == 200
        return connection.server_certificate
    finally:
        await connection.close()


async def test_a_rotated_certificate_is_served_to_new_connections_while_an_old_keep_alive_one_still_works(
    rotation: Rotation, reloading: ReloadingContext, rotating_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    old = await Connection.open(rotating_url, rotation.client_context())
    assert await old.filter() == 200
    assert old.server_certificate == rotation.server_a.certificate.serial_number

    rotation.publish(rotation.server_b)  # the old version's files are gone now, as the kubelet leaves them
    with caplog.at_level(logging.INFO, logger="extender.service.tls"):
        assert reloading.reload()

    assert await _new_connection_serves(rotating_url, rotation.client_context()) == (
        rotation.server_b.certificate.serial_number
    )
    assert await old.filter() == 200
    assert await old.filter() == 200
    assert old.server_certificate == rotation.server_a.certificate.serial_number
    await old.close()
    reloaded = [record.getMessage() for record in caplog.records if "reloaded" in record.getMessage()]
    assert len(reloaded) == 1
    until = rotation.server_b.certificate.not_valid_after_utc.strftime("%Y-%m-%dT%H:%M:%SZ")
    assert f"CN=localhost, valid until {until}" in reloaded[0]


async def test_after_a_swap_alpn_and_client_certificates_still_apply(
    rotation: Rotation, reloading: ReloadingContext, rotating_url: str
) -> None:
    """The swapped-in context brings its own ALPN; the client certificate stays required for every verb."""
    rotation.publish(rotation.server_b)
    assert reloading.reload()
    connection = await Connection.open(rotating_url, rotation.client_context())
    assert connection.alpn == "http/1.1"
    await connection.close()
    for verb in ("filter", "prioritize", "bind", "preempt"):
        with pytest.raises(aiohttp.ClientError):
            await _post(
                rotating_url, verb, FILTER, ssl.create_default_context(cadata=rotation.ca.certificate_pem.decode())
            )
        with pytest.raises(aiohttp.ClientError):
            await _post(rotating_url, verb, FILTER, rotation.client_context(rotation.other_client))


async def test_a_rotated_client_ca_refuses_the_old_cas_clients_and_serves_the_new_ones(
    rotation: Rotation, reloading: ReloadingContext, rotating_url: str
) -> None:
    old_client = await Connection.open(rotating_url, rotation.client_context())
    assert await old_client.filter() == 200
    with pytest.raises((ssl.SSLError, ConnectionError, asyncio.IncompleteReadError)):
        await (await Connection.open(rotating_url, rotation.client_context(rotation.other_client))).filter()

    rotation.publish(rotation.server_b, client_ca=rotation.other_ca)
    assert reloading.reload()

    assert await _new_connection_serves(rotating_url, rotation.client_context(rotation.other_client)) == (
        rotation.server_b.certificate.serial_number
    )
    with pytest.raises((ssl.SSLError, ConnectionError, asyncio.IncompleteReadError)):
        await (await Connection.open(rotating_url, rotation.client_context())).filter()
    assert await old_client.filter() == 200, "a connection already open is not cut by a new client CA"
    await old_client.close()


async def test_a_broken_swap_keeps_serving_the_old_certificate_and_warns_once(
    rotation: Rotation, reloading: ReloadingContext, rotating_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    rotation.publish(rotation.server_b, key=rotation.server_a)  # the new certificate with the old key
    with caplog.at_level(logging.DEBUG, logger="extender.service.tls"):
        assert not reloading.reload()
        assert not reloading.reload()  # tried again, not warned again
    warnings = [record for record in caplog.records if record.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "still serving the previous certificate" in warnings[0].getMessage()
    assert "KEY_VALUES_MISMATCH" in warnings[0].getMessage()
    assert await _new_connection_serves(rotating_url, rotation.client_context()) == (
        rotation.server_a.certificate.serial_number
    )

    rotation.publish(rotation.server_b)  # the writer finished
    assert reloading.reload()
    assert await _new_connection_serves(rotating_url, rotation.client_context()) == (
        rotation.server_b.certificate.serial_number
    )


async def test_missing_files_keep_the_old_certificate(
    rotation: Rotation, reloading: ReloadingContext, rotating_url: str
) -> None:
    (rotation.volume.root / "..data").unlink()
    assert not reloading.reload()
    assert await _new_connection_serves(rotating_url, rotation.client_context()) == (
        rotation.server_a.certificate.serial_number
    )


def test_unchanged_files_are_not_reloaded(rotation: Rotation, reloading: ReloadingContext) -> None:
    assert not reloading.reload()
    rotation.publish(rotation.server_a)  # same contents, new version: loaded again, harmlessly
    assert reloading.reload()
    assert not reloading.reload()


def test_a_file_rewritten_in_place_is_reloaded(tmp_path: Path) -> None:
    """Not only symlink swaps: a certificate and key overwritten where they are (a hostPath, a copy) too."""
    ca = make_ca()
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    first, second = issue_server(ca), issue_server(ca, dns_names=["a-much-longer-name.example"])
    cert.write_bytes(first.certificate_pem)
    key.write_bytes(first.key_pem)
    reloading = ReloadingContext(str(cert), str(key))
    cert.write_bytes(second.certificate_pem)
    key.write_bytes(second.key_pem)
    assert reloading.reload()
    assert "CN=a-much-longer-name.example" in reloading.describe()


async def test_watch_picks_up_a_swap_within_its_interval(
    rotation: Rotation, reloading: ReloadingContext, rotating_url: str
) -> None:
    watching = asyncio.create_task(reloading.watch(0.05))
    try:
        rotation.publish(rotation.server_b)
        deadline = asyncio.get_running_loop().time() + 5
        serial = rotation.server_a.certificate.serial_number
        while serial != rotation.server_b.certificate.serial_number:
            assert asyncio.get_running_loop().time() < deadline, "the swap was not picked up"
            await asyncio.sleep(0.02)
            serial = await _new_connection_serves(rotating_url, rotation.client_context())
    finally:
        watching.cancel()


def _filter_on(url: str, context: ssl.SSLContext, session: ssl.SSLSession | None = None) -> tuple[ssl.SSLSession, bool]:
    """POST /filter on a blocking connection that offers `session` for resumption (asyncio's connections cannot);
    the connection's session, resumed or new, and whether it was resumed. A refused handshake raises."""
    host, port = url.removeprefix("https://").split(":")
    with (
        socket.create_connection((host, int(port)), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname="localhost", session=session) as connection,
    ):
        connection.sendall(b"POST /filter HTTP/1.1\r\nHost: localhost\r\nContent-Length: %d\r\n\r\n" % len(FILTER))
        connection.sendall(FILTER)
        assert connection.recv(16).startswith(b"HTTP/1.1 200")
        assert connection.session is not None
        return connection.session, connection.session_reused


def _filter_resuming(url: str, context: ssl.SSLContext, session: ssl.SSLSession | None = None) -> ssl.SSLSession:
    """`_filter_on`, asserting that an offered session was resumed."""
    made, resumed = _filter_on(url, context, session)
    assert resumed == (session is not None)
    return made


async def test_a_session_made_before_the_client_ca_changed_is_not_resumed(
    rotation: Rotation, reloading: ReloadingContext, rotating_url: str
) -> None:
    """A resumed session skips the client certificate check: after the client CA changed, a client of the old
    CA must not get in on a session it made before. (TLS 1.2: TLS 1.3 sessions are not resumable at all, below.)"""
    context = rotation.client_context()
    context.maximum_version = ssl.TLSVersion.TLSv1_2
    session = await asyncio.to_thread(_filter_resuming, rotating_url, context)
    await asyncio.to_thread(_filter_resuming, rotating_url, context, session)

    rotation.publish(rotation.server_b)  # a new serving certificate, the same client CA: sessions still resume
    assert reloading.reload()
    await asyncio.to_thread(_filter_resuming, rotating_url, context, session)

    rotation.publish(rotation.server_b, client_ca=rotation.other_ca)
    assert reloading.reload()
    with pytest.raises((ssl.SSLError, ConnectionError)):
        await asyncio.to_thread(_filter_resuming, rotating_url, context, session)


async def test_tls13_handshakes_issue_no_session_tickets(rotation: Rotation, rotating_url: str) -> None:
    """No TLS 1.3 tickets (`server_context`: they cost a third of a handshake and kube-scheduler drops them): the
    session a TLS 1.3 client gets carries no ticket, so offering it back makes a full handshake, not a resumed
    one. The client certificate is checked again each time."""
    context = rotation.client_context()
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    session = await asyncio.to_thread(_filter_resuming, rotating_url, context)
    assert not session.has_ticket
    again, resumed = await asyncio.to_thread(_filter_on, rotating_url, context, session)
    assert not resumed
    assert not again.has_ticket
