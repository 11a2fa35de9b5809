"""HTTPS with real certificates (trustme), and mutual TLS: without a certificate signed by the client CA,
no verb is served; with the scheduler's certificate, every verb is."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import orjson
import pytest

from extender.server import build_server
from extender.tls import TLSConfigError, server_context
from tests.builders import make_cluster, make_node, make_pod
from tests.conftest import Pki, make_service, serve


async def _serve(context: ssl.SSLContext) -> AsyncIterator[str]:
    async for url in serve(build_server(make_service(make_cluster(make_node("n1")))), context):
        yield url


@pytest.fixture
async def https_url(pki: Pki) -> AsyncIterator[str]:
    async for url in _serve(server_context(pki.server_cert, pki.server_key)):
        yield url


@pytest.fixture
async def mtls_url(pki: Pki) -> AsyncIterator[str]:
    async for url in _serve(server_context(pki.server_cert, pki.server_key, client_ca=pki.ca)):
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


@pytest.mark.parametrize("verb", ["filter", "bind"])
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
    import asyncio

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
