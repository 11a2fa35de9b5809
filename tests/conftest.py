"""Shared fixtures: a Service over a cluster built in the test, served on loopback and called over HTTP;
real certificates for the TLS tests."""

from __future__ import annotations

import asyncio
import os
import shutil
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
import trustme
from hypothesis.internal.conjecture import providers
from hypothesis.internal.constants_ast import Constants

from extender.core.binding import BindRequest
from extender.core.cache import Cache
from extender.core.ledger import Ledger
from extender.core.placement.config import Policy, PolicyConfig
from extender.core.recheck import Recheck
from extender.core.requeue import Requeue
from extender.service.context import Service
from extender.service.transport import HttpServer
from extender.service.verbs import build_server
from extender.sources.file import FileSource
from extender.sources.kube.client import KubeClient
from extender.sources.kube.config import KubeConfig
from extender.sources.kube.informer import NODES, Backoff, Informer, WatchOptions, pods_kind
from tests.apidouble import ApiDouble
from tests.builders import PROFILE, FakeClock, cache_differences, placer_for, quotas_of

CAPTURED = Path(__file__).parent / "fixtures" / "captured"
"""Bodies kube-scheduler v1.31/v1.34 and the Go gpushare extender really sent (copied from shared/contract)."""


def captured(name: str) -> Any:
    return orjson.loads((CAPTURED / name).read_bytes())


class ScriptedSource(FileSource):
    """The file source with the answers a live source gives scripted by the test: readiness (not synced, not the
    leader), the lease's time left, the recheck reads, and a binder of the test's choosing. Each stands for what
    `KubeSource` answers (tested against the API double and the real kube-apiserver in tests/sources, e2e)."""

    def __init__(
        self,
        cluster: Cache,
        binder: Any = None,
        ready: Callable[[], bool] = lambda: True,
        why_not_ready: Callable[[], str] = lambda: NOT_READY,
        binding_time_left: Callable[[], float | None] = lambda: None,
        recheck: Recheck | None = None,
    ) -> None:
        super().__init__(cluster, [])
        if binder is not None:
            self.binder = binder
        self.recheck = recheck
        self._ready, self._why_not_ready, self._time_left = ready, why_not_ready, binding_time_left
        self.failed_binds: list[tuple[BindRequest, str]] = []

    def why_not_ready(self) -> str | None:
        return None if self._ready() else self._why_not_ready()

    def binding_time_left(self) -> float | None:
        return self._time_left()

    def bind_failed(self, request: BindRequest, error: str) -> None:
        self.failed_binds.append((request, error))


NOT_READY = "extender is not ready: its cache has not been filled yet"


FIT_ONLY = PolicyConfig(policy=Policy.FILL)
"""What most service tests run: the filter passes every node that fits, as these tests' assertions read it. The
default policy also narrows the passed nodes to the best one (tests/core/placement/test_fragmentation.py)."""


def make_service(
    cluster: Cache,
    binder: Any = None,
    ledger: Ledger | None = None,
    policy: PolicyConfig | None = None,
    requeue: Callable[[str], None] | None = None,
    expiry_interval: float = 5.0,
    max_body_bytes: int = 32 * 1024 * 1024,
    **source: Any,
) -> Service:
    """A Service over `cluster`; binds go to a FileBinder over it unless another binder is given; `source`
    scripts what a live source would answer (`ScriptedSource`); `requeue` is told when kube-scheduler would be
    asked to retry."""
    quotas = quotas_of(cluster)
    return Service(
        cache=cluster,
        ledger=ledger or Ledger(cluster, 300.0, FakeClock(), quotas),
        placer=placer_for(cluster, policy or FIT_ONLY),
        quotas=quotas,
        source=ScriptedSource(cluster, binder, **source),
        requeue=Requeue(cluster, requeue, quotas=quotas),
        expiry_interval=expiry_interval,
        max_body_bytes=max_body_bytes,
    )


class Client:
    """Calls a running service over real loopback HTTP with aiohttp's client; returns its responses
    (`.status`, `await .json()`, `await .text()`)."""

    def __init__(self, session: aiohttp.ClientSession, base: str) -> None:
        self.session = session
        self.base = base

    async def post(self, path: str, data: bytes = b"") -> aiohttp.ClientResponse:
        return await self.session.post(self.base + path, data=data)

    async def get(self, path: str) -> aiohttp.ClientResponse:
        return await self.session.get(self.base + path)


ClientFor = Callable[[Service], Awaitable[Client]]


@pytest.fixture
async def client_for() -> AsyncIterator[ClientFor]:
    """Start a service on a loopback port (plain HTTP) and return a client for it; all stopped afterwards."""
    servers: list[HttpServer] = []
    sessions: list[aiohttp.ClientSession] = []

    async def start(service: Service) -> Client:
        server = build_server(service)
        await server.start("127.0.0.1", 0)
        servers.append(server)
        session = aiohttp.ClientSession()
        sessions.append(session)
        return Client(session, f"http://127.0.0.1:{server.port}")

    yield start
    for session in sessions:
        await session.close()
    for server in servers:
        await server.stop(grace=1.0)


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


class SecretVolume:
    """A directory laid out as the kubelet mounts a Secret, and updated as it updates one: each version in its
    own `..<timestamp>` directory, `..data` a symlink to the current one, each key a symlink through `..data`.
    `publish` swaps `..data` atomically (a rename over it) and removes the previous version, as the kubelet's
    AtomicWriter does: the paths a program was given never change, so no event fires on them."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.versions = 0
        root.mkdir(parents=True, exist_ok=True)

    def path(self, key: str) -> str:
        return str(self.root / key)

    def publish(self, files: dict[str, bytes]) -> None:
        self.versions += 1
        version = self.root / f"..2026_05_01_10_00_{self.versions:02d}.{os.getpid()}"
        version.mkdir()
        for key, content in files.items():
            (version / key).write_bytes(content)
        data, staged = self.root / "..data", self.root / "..data_tmp"
        previous = os.readlink(data) if data.is_symlink() else None
        staged.symlink_to(version.name)
        staged.replace(data)
        for key in files:
            if not (self.root / key).is_symlink():
                (self.root / key).symlink_to(f"..data/{key}")
        if previous is not None:
            shutil.rmtree(self.root / previous)


async def serve(server: HttpServer, context: ssl.SSLContext | None) -> AsyncIterator[str]:
    """Serve on a loopback port (HTTPS when given a context) and yield the base URL; stop afterwards."""
    await server.start("127.0.0.1", 0, context)
    try:
        yield f"{'https' if context else 'http'}://127.0.0.1:{server.port}"
    finally:
        await server.stop(grace=1.0)


# --- the API server double and a client of ours for it -----------------------------------------------------


@pytest.fixture
async def api() -> AsyncIterator[ApiDouble]:
    """A kube-apiserver double on a loopback port (tests/apidouble.py), for faults the real one will not make."""
    double = ApiDouble()
    await double.start()
    yield double
    await double.stop()


def double_config(api: ApiDouble) -> KubeConfig:
    return KubeConfig(server=api.url, source="the API double", token="test-token", namespace="gpu-extender")


@pytest.fixture
async def kube(api: ApiDouble) -> AsyncIterator[KubeClient]:
    async with KubeClient(double_config(api), timeout=2.0) as client:
        yield client


async def eventually(check: Callable[[], Any], timeout: float = 5.0, what: str = "") -> None:
    """Wait until `check()` is truthy (polled every 10 ms), else fail naming `what` and the last value."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        value = check()
        if value:
            return
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"not reached within {timeout} s: {what or check}; last value {value!r}")
        await asyncio.sleep(0.01)


@dataclass
class Running:
    cluster: Cache
    nodes: Informer
    pods: Informer
    tasks: list[asyncio.Task[None]]

    def differences(self, api: ApiDouble) -> list[str]:
        return cache_differences(self.cluster, api.nodes(), api.pods())

    async def settled(self, api: ApiDouble) -> None:
        await eventually(lambda: not self.differences(api), what="the cache equal to the API")


@pytest.fixture
async def informers(api: ApiDouble, kube: KubeClient) -> AsyncIterator[Running]:
    """Both informers over a fresh cache, with short backoffs; `start()` is up to the test (objects first)."""
    cluster = Cache(PROFILE)
    options = WatchOptions(page_size=2, timeout=30.0, inactivity=5.0)
    running = Running(
        cluster,
        Informer(kube, NODES, cluster.apply_node, cluster.replace_nodes, options, Backoff(0.01, 0.05)),
        Informer(kube, pods_kind(PROFILE), cluster.apply_record, cluster.replace_records, options, Backoff(0.01, 0.05)),
        [],
    )
    yield running
    for task in running.tasks:
        task.cancel()
    await asyncio.gather(*running.tasks, return_exceptions=True)


async def start(running: Running, api: ApiDouble) -> None:
    running.tasks += [asyncio.create_task(running.nodes.run()), asyncio.create_task(running.pods.run())]
    await asyncio.wait_for(asyncio.gather(running.nodes.synced.wait(), running.pods.synced.wait()), 5.0)
    await watching(api, 2)


async def watching(api: ApiDouble, count: int) -> None:
    """Wait until `count` watches are open on the double (a change made earlier would reach them as a list)."""
    await eventually(lambda: api.open_watches >= count, what=f"{count} open watches")


@pytest.fixture(autouse=True)
def no_hypothesis_constants_from_imported_modules(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every Hypothesis test draws the same examples in any process: alone, in a subset, or in the whole suite.

    `derandomize` fixes Hypothesis' seed, but about one draw in twenty is taken from a pool of constants Hypothesis
    reads out of every local (not test, not installed) module imported so far, so the examples depended on which
    modules the tests run before had imported (a state machine failed only in full-suite runs). Here that pool is
    empty, and Hypothesis' memo of it is cleared on the way in and out. This reaches into Hypothesis' internals:
    should they be renamed, `monkeypatch.setattr` fails loudly rather than letting the examples drift again."""
    providers.CONSTANTS_CACHE.cache.clear()
    monkeypatch.setattr(providers, "_get_local_constants", Constants)
    yield
    providers.CONSTANTS_CACHE.cache.clear()
