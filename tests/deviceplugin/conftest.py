"""Fixtures for the device-plugin doubles' tests: the e2e tier's real control plane (etcd + kube-apiserver v1.34.1)
for the API, a fake kubelet on a short temporary socket directory, and builders of Nodes and Pods placed by
annotations, as an extender's Binding would leave them (`spec.nodeName` and the protocol's annotations).

kubelet's API comes from the Go module cache like the control plane's binaries: without Go the tier is skipped,
with Go a missing proto fails it (as tests/e2e/conftest.py does for the binaries).
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from devtools.deviceplugin import kubeletapi
from devtools.deviceplugin.kube import KubeApi, load_kubeconfig
from devtools.deviceplugin.runner import NodeDouble, Runner
from tests.deviceplugin.kubelet import FakeKubelet
from tests.e2e.conftest import cleanup, control_plane
from tests.e2e.controlplane import ControlPlane, go_toolchain, node_manifest

__all__ = ["cleanup", "control_plane"]

WAIT = 20.0
"""Seconds any awaited event may take before the test fails (each takes milliseconds)."""


@pytest.fixture(scope="session")
def kubelet_messages() -> None:
    try:
        kubeletapi.messages()
    except kubeletapi.ApiUnavailable as error:
        if go_toolchain() is None:
            pytest.skip(f"device-plugin tests skipped: {error}")
        pytest.fail(str(error), pytrace=False)


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    """A short path: a unix socket's path must fit in 108 bytes, and pytest's tmp_path may not."""
    folder = Path(tempfile.mkdtemp(prefix="dp-", dir="/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
async def kubelet(kubelet_messages: None, socket_dir: Path) -> AsyncIterator[FakeKubelet]:
    fake = FakeKubelet(socket_dir)
    await fake.start()
    yield fake
    await fake.stop()


@pytest.fixture
async def api(control_plane: ControlPlane) -> AsyncIterator[KubeApi]:
    """The doubles' own API client, from the control plane's admin kubeconfig (token and CA file)."""
    async with KubeApi.session(load_kubeconfig(control_plane.kubeconfig("admin"))) as session:
        yield session


async def wait(event: asyncio.Event, what: str) -> None:
    try:
        await asyncio.wait_for(event.wait(), WAIT)
    except TimeoutError:
        raise AssertionError(f"not seen within {WAIT} s: {what}") from None


@contextlib.asynccontextmanager
async def serving(double: NodeDouble, kubelet: FakeKubelet) -> AsyncIterator[Runner]:
    """The double's runner in this event loop, until the block ends; entered once kubelet has its registration and
    its first device list."""
    runner = Runner(double, kubelet.socket_dir)
    kubelet.registered.clear()
    task = asyncio.create_task(runner.run())
    try:
        await wait(kubelet.registered, "the plugin's registration")
        for plugin in kubelet.plugins.values():
            await wait(plugin.listed, "the plugin's first device list")
        yield runner
    finally:
        runner.stop_requested.set()
        assert await asyncio.wait_for(task, WAIT) == 0


def make_node(name: str, labels: Mapping[str, str] | None = None) -> dict[str, Any]:
    """A Ready Node with no GPU resources: the plugin under test is the one to report them."""
    return node_manifest(name, gpus=0, labels=labels)


def make_pod(
    name: str,
    node: str,
    limits: Mapping[str, str],
    annotations: Mapping[str, str] | None = None,
    containers: Sequence[str] = ("main",),
) -> dict[str, Any]:
    """A Pod bound to `node` at creation, each container asking `limits`, with `annotations`: what a scheduler
    extender's Binding leaves (the API server resets its status: phase Pending)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "annotations": dict(annotations or {})},
        "spec": {
            "nodeName": node,
            "containers": [
                {"name": c, "image": "registry.example/none:latest", "resources": {"limits": dict(limits)}}
                for c in containers
            ],
            "terminationGracePeriodSeconds": 0,
        },
    }
