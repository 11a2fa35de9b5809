"""Shared fixtures: a Service over a cluster built in the test, served by aiohttp's test client."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest
import trustme
from aiohttp import web
from aiohttp.test_utils import TestClient

from extender.cluster import Cluster
from extender.ledger import Ledger
from extender.policy import PolicyConfig
from extender.server import Service, build_app
from extender.sources.file import FileBinder
from tests.builders import FakeClock

CAPTURED = Path(__file__).parent / "fixtures" / "captured"
"""Bodies kube-scheduler v1.31/v1.34 and the Go gpushare extender really sent (copied from shared/contract)."""


def captured(name: str) -> Any:
    return orjson.loads((CAPTURED / name).read_bytes())


def make_service(cluster: Cluster, binder: Any = None, **kwargs: Any) -> Service:
    """A Service over `cluster`; binds go to a FileBinder over it unless another binder is given."""
    return Service(
        cluster=cluster,
        ledger=kwargs.pop("ledger", None) or Ledger(cluster, 300.0, FakeClock()),
        binder=binder if binder is not None else FileBinder(cluster, []),
        policy=kwargs.pop("policy", None) or PolicyConfig(),
        **kwargs,
    )


ClientFor = Callable[[Service], Awaitable[TestClient[Any, Any]]]


@pytest.fixture
def client_for(aiohttp_client: Any) -> ClientFor:
    async def start(service: Service) -> TestClient[Any, Any]:
        client: TestClient[Any, Any] = await aiohttp_client(build_app(service))
        return client

    return start


@dataclass(frozen=True, slots=True)
class Pki:
    """Real certificates (trustme) as PEM files: a CA, its server and client certificates, and strangers'."""

    ca: str
    server_cert: str
    """Valid for 127.0.0.1 and localhost."""
    server_key: str
    client_cert: str
    """CN kube-scheduler, signed by `ca`."""
    client_key: str
    client_pem: str
    """The client's key and certificate chain in one file."""
    stranger_cert: str
    """A client certificate signed by another CA."""
    stranger_key: str
    other_ca: str
    """The CA that signed the stranger's certificate and nothing else here."""


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    folder = tmp_path_factory.mktemp("pki")
    ca, other = trustme.CA(), trustme.CA()
    server, client = ca.issue_cert("127.0.0.1", "localhost"), ca.issue_cert("kube-scheduler")
    stranger = other.issue_cert("kube-scheduler")
    files = {name: folder / f"{name}.pem" for name in Pki.__slots__}  # type: ignore[attr-defined]
    ca.cert_pem.write_to_path(str(files["ca"]))
    other.cert_pem.write_to_path(str(files["other_ca"]))
    for leaf, cert, key in (
        (server, "server_cert", "server_key"),
        (client, "client_cert", "client_key"),
        (stranger, "stranger_cert", "stranger_key"),
    ):
        files[cert].write_bytes(b"".join(blob.bytes() for blob in leaf.cert_chain_pems))
        leaf.private_key_pem.write_to_path(str(files[key]))
    client.private_key_and_cert_chain_pem.write_to_path(str(files["client_pem"]))
    return Pki(**{name: str(path) for name, path in files.items()})


async def serve_app(app: web.Application, context: ssl.SSLContext | None) -> AsyncIterator[str]:
    """Serve `app` on a loopback port (HTTPS when given a context) and yield its base URL."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"{'https' if context else 'http'}://127.0.0.1:{port}"
    finally:
        await runner.cleanup()
