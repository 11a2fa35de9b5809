"""Shared fixtures: a Service over a cluster built in the test, served by aiohttp's test client."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
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
