"""`extender inspect` against the real app served over HTTPS on loopback: the table, and every fixable error."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from extender import cli
from extender.app import file_service
from extender.core.holds import Allocation, Hold, HoldState
from extender.core.protocols.hami import lock_value
from extender.service.routing import Request, Response, Router
from extender.service.tls import server_context
from extender.service.transport import HttpServer
from extender.service.verbs import build_server
from extender.settings import Protocol, Settings
from extender.tools.inspect import InspectError, bar, fetch_and_render, render_table, short_model
from tests.builders import bound_pod, make_hami_node, make_node, make_quota, running_hami_pod
from tests.conftest import Pki, serve

RESERVED_AGE = 600.0
"""Seconds ago the test reservation was made: shows as "10m ago" however slow the test runs."""


def write_cluster(folder: Path) -> str:
    objects = [
        make_node("gpu-node-1", gpus=2, mem=16),
        make_node("gpu-node-2", gpus=1, mem=16, ready=False),
        bound_pod("share-1", "gpu-node-1", (0,), 12),
        bound_pod("share-2", "gpu-node-1", (0,), 4),
    ]
    path = folder / "cluster.yaml"
    path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": objects}))
    return str(path)


def extender_server(tmp_path: Path) -> HttpServer:
    service = file_service(Settings(), write_cluster(tmp_path))
    waiting = Allocation.uniform("uid-waiting", "default/waiting", "gpu-node-1", (1,), 8)
    service.cache.hold(Hold(waiting, HoldState.RESERVED, since=time.time() - RESERVED_AGE))
    return build_server(service)


@pytest.fixture
async def https_url(tmp_path: Path, pki: Pki) -> AsyncIterator[str]:
    async for url in serve(extender_server(tmp_path), server_context(pki.server_cert, pki.server_key)):
        yield url


@pytest.fixture
async def mtls_url(tmp_path: Path, pki: Pki) -> AsyncIterator[str]:
    async for url in serve(extender_server(tmp_path), server_context(pki.server_cert, pki.server_key, pki.ca)):
        yield url


async def inspect(
    url: str, node: str = "", ca: str = "", cert: str = "", insecure: bool = False, as_json: bool = False
) -> str:
    """The sync CLI call, run in a thread while the server answers on this test's loop."""
    return await asyncio.to_thread(fetch_and_render, url, node, ca, cert, "", insecure, as_json)


async def test_table_names_nodes_gpus_pods_and_reservations(https_url: str, pki: Pki) -> None:
    table = await inspect(https_url, ca=pki.ca)
    lines = table.splitlines()
    assert lines[0].startswith("gpu-node-1  ready  24/32 GiB used  2 GPUs")
    gpu0 = next(line for line in lines if "GPU 0" in line)
    assert "16/16 GiB" in gpu0 and "free 0" in gpu0 and "[" + "#" * 20 + "]" in gpu0
    assert "default/share-1 12 GiB observed" in gpu0
    assert any(line.strip() == "default/share-2 4 GiB observed" for line in lines)
    gpu1 = next(line for line in lines if "GPU 1" in line)
    assert "8/16 GiB" in gpu1 and "default/waiting 8 GiB reserved 10m ago" in gpu1
    assert any(line.startswith("gpu-node-2  NOT READY  0/16 GiB used  1 GPU") for line in lines)
    assert lines[-1] == "2 nodes, 3 GPUs, 2 pods in the cache, 1 reserved; extender ready"


STANDBY = "extender is not the leader: lease gpu-extender/gpu-extender is held by gpu-extender-0"
"""What a standby's source says (`KubeSource.why_not_ready`): its cache is full, it only does not lead."""


async def test_a_standby_says_it_is_not_the_leader_not_that_its_cache_is_empty(
    tmp_path: Path, pki: Pki, monkeypatch: pytest.MonkeyPatch
) -> None:
    service = file_service(Settings(), write_cluster(tmp_path))
    monkeypatch.setattr(service.source, "why_not_ready", lambda: STANDBY)
    async for url in serve(build_server(service), server_context(pki.server_cert, pki.server_key)):
        lines = (await inspect(url, ca=pki.ca)).splitlines()
        assert lines[-1] == f"2 nodes, 3 GPUs, 2 pods in the cache, 0 reserved; {STANDBY}"
        report = json.loads(await inspect(url, ca=pki.ca, as_json=True))
        assert report["ready"] is False and report["why_not_ready"] == STANDBY


def test_a_report_without_the_reason_says_not_ready_alone() -> None:
    assert render_table({"nodes": [], "pods": 0, "reservations": 0, "ready": False}).endswith("; extender NOT READY\n")


async def test_one_node_shows_only_that_node(https_url: str, pki: Pki) -> None:
    table = await inspect(https_url, node="gpu-node-2", ca=pki.ca)
    assert table.splitlines()[0].startswith("gpu-node-2  NOT READY")
    assert "gpu-node-1" not in table
    assert "GPU 0  0/16 GiB  free 16  [" + "." * 20 + "]  -" in table


async def test_json_is_the_servers_report(https_url: str, pki: Pki) -> None:
    report = json.loads(await inspect(https_url, node="gpu-node-1", ca=pki.ca, as_json=True))
    assert report["name"] == "gpu-node-1" and report["unit"] == "GiB"
    assert [device["used"] for device in report["devices"]] == [16, 8]


async def test_unknown_node_is_an_error_with_the_servers_message(https_url: str, pki: Pki) -> None:
    with pytest.raises(InspectError) as raised:
        await inspect(https_url, node="nope", ca=pki.ca)
    assert str(raised.value) == f"{https_url}/inspect/nope: node nope is not in the extender's cache"


async def test_a_certificate_from_another_ca_fails_verification_clearly(https_url: str, pki: Pki) -> None:
    with pytest.raises(InspectError) as raised:
        await inspect(https_url, ca=pki.other_ca)
    message = str(raised.value)
    assert message.startswith(f"{https_url}/inspect: TLS verification failed")
    assert "--ca" in message and "\n" not in message


async def test_insecure_skips_verification(https_url: str) -> None:
    assert "gpu-node-1" in await inspect(https_url, insecure=True)


async def test_mtls_needs_a_client_certificate(mtls_url: str, pki: Pki) -> None:
    with pytest.raises(InspectError, match="client certificate"):
        await inspect(mtls_url, ca=pki.ca)
    assert "gpu-node-1" in await inspect(mtls_url, ca=pki.ca, cert=pki.client_pem)


async def test_an_answer_that_is_not_json_is_an_error() -> None:
    def hello(request: Request) -> Response:
        return Response(200, b"hello", "text/plain")

    router = Router()
    router.add("GET", "/inspect", hello)
    async for url in serve(HttpServer(router, max_body_bytes=1024), None):
        with pytest.raises(InspectError, match=r"/inspect: the answer is not JSON"):
            await inspect(url)


async def test_a_refused_connection_names_the_url() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(InspectError, match=rf"^https://127.0.0.1:{port}/inspect: connection refused"):
        await inspect(f"https://127.0.0.1:{port}", insecure=True)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"url": "127.0.0.1:8443"}, "must be an http:// or https:// URL"),
        ({"ca": "/nonexistent/ca.pem"}, "CA file not found: /nonexistent/ca.pem"),
        ({"cert": "/nonexistent/client.pem"}, "client certificate or key not found"),
    ],
)
def test_unusable_arguments_are_errors_before_connecting(arguments: dict[str, Any], message: str) -> None:
    given: dict[str, Any] = {
        "url": "https://127.0.0.1:1",
        "node": "",
        "ca": "",
        "cert": "",
        "key": "",
        "insecure": False,
        "as_json": False,
    }
    with pytest.raises(InspectError, match=message):
        fetch_and_render(**(given | arguments))


async def test_cli_prints_a_fixable_error_in_one_line(
    https_url: str, pki: Pki, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["inspect", "nope", "--url", https_url, "--ca", pki.ca]
    assert await asyncio.to_thread(cli.main, argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == f"extender inspect: {https_url}/inspect/nope: node nope is not in the extender's cache\n"


@pytest.mark.parametrize(
    ("used", "capacity", "filled"),
    [(0, 16, 0), (1, 16, 2), (8, 16, 10), (12, 16, 15), (16, 16, 20), (20, 16, 20), (0, 0, 0)],
    ids=["empty", "any-use-shows:ceil(20/16)=2", "half", "ceil(12*20/16)=15", "full", "over-capped", "no-capacity"],
)
def test_bar_fills_the_used_share_rounded_up(used: int, capacity: int, filled: int) -> None:
    assert bar(used, capacity).count("#") == filled
    assert len(bar(used, capacity)) == 22


# --- what HAMi's plugin tracks besides memory: compute, slots, the model, cordons, the node lock -----------

LOCK_AGE = 120.0
"""Seconds ago the test node lock was taken: shows as "2m ago", and is within the 300 s lock timeout."""


def hami_server(folder: Path) -> HttpServer:
    """gpu-a100: 2 A100s, GPU 1 cordoned, locked for default/waiting; GPU 0 holds a (10240 MiB, 30 %) and b
    (4096 MiB, 0 %)."""
    lock = lock_value(time.time() - LOCK_AGE, "default", "waiting")
    node = make_hami_node("gpu-a100", gpus=2, **{"hami.io/device-cordon": "GPU-gpu-a100-1", "hami.io/mutex.lock": lock})
    objects = [node, running_hami_pod("a", "gpu-a100", 0, 10240, 30), running_hami_pod("b", "gpu-a100", 0, 4096, 0)]
    path = folder / "hami.yaml"
    path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": objects}))
    service = file_service(Settings(protocol=Protocol.HAMI), str(path))
    return build_server(service)


@pytest.fixture
async def hami_url(tmp_path: Path, pki: Pki) -> AsyncIterator[str]:
    async for url in serve(hami_server(tmp_path), server_context(pki.server_cert, pki.server_key)):
        yield url


async def test_hami_gpus_show_compute_and_slots_beside_memory(hami_url: str, pki: Pki) -> None:
    lines = (await inspect(hami_url, ca=pki.ca)).splitlines()
    assert lines[0] == "gpu-a100  ready  14336/81920 MiB used  2 GPUs"
    gpu0 = next(line for line in lines if "GPU 0" in line)
    # the bar: 14336 * 20 / 40960 = 7 of 20
    cells = ["14336/40960 MiB", "free 26624", "[" + "#" * 7 + "." * 13 + "]", "compute 30/100 %", "slots 2/10"]
    assert all(cell in gpu0 for cell in cells), gpu0
    assert gpu0.index("MiB") < gpu0.index("compute") < gpu0.index("slots") < gpu0.index("default/a")


async def test_hami_gpus_name_their_model_and_a_cordon(hami_url: str, pki: Pki) -> None:
    lines = (await inspect(hami_url, ca=pki.ca)).splitlines()
    assert "  GPU 0 A100-SXM4-40GB  " in next(line for line in lines if "GPU 0" in line)
    gpu1 = next(line for line in lines if "GPU 1" in line)
    assert gpu1.startswith("  GPU 1 A100-SXM4-40GB cordoned  0/40960 MiB ")
    assert all(cell in gpu1 for cell in ("free 0 ", "compute 0/100 %", "slots 0/10"))


async def test_hami_columns_align_across_gpus(hami_url: str, pki: Pki) -> None:
    lines = (await inspect(hami_url, ca=pki.ca)).splitlines()
    gpu0, gpu1 = (next(line for line in lines if f"GPU {index}" in line) for index in (0, 1))
    assert gpu0.index("compute") == gpu1.index("compute") and gpu0.index("slots") == gpu1.index("slots")


async def test_hami_pods_show_their_compute_share(hami_url: str, pki: Pki) -> None:
    table = await inspect(hami_url, ca=pki.ca)
    assert "default/a 10240 MiB 30 % compute observed" in table
    assert "default/b 4096 MiB 0 % compute observed" in table


async def test_a_locked_node_says_for_which_pod_and_since_when(hami_url: str, pki: Pki) -> None:
    lines = (await inspect(hami_url, node="gpu-a100", ca=pki.ca)).splitlines()
    assert lines[1] == (
        "  node lock held for default/waiting, taken 2m ago: new pods bind here once the device plugin releases it"
    )


@pytest.mark.parametrize(
    ("model", "short"),
    [
        ("NVIDIA A100-SXM4-40GB", "A100-SXM4-40GB"),
        ("NVIDIA H100 80GB HBM3", "H100 80GB HBM3"),
        ("NVIDIA-Tesla V100-PCIE-32GB", "V100-PCIE-32GB"),  # HAMi prefixes "NVIDIA-" to NVML's "Tesla V100-..."
        ("NVIDIA-Tesla T4", "T4"),
        ("NVIDIA", "NVIDIA"),
    ],
)
def test_short_model_drops_the_vendor_hami_puts_first(model: str, short: str) -> None:
    assert short_model(model) == short


# --- ResourceQuotas ---------------------------------------------------------------------------------------


def quota_server(folder: Path) -> HttpServer:
    """A cluster file with ResourceQuotas: ml-a holds 12 GiB on an A100 node; one key of ml-b unreadable."""
    node = make_node("a100", gpus=2, mem=16)
    node["metadata"]["labels"]["nvidia.com/gpu.product"] = "NVIDIA-A100-SXM4-40GB"
    objects = [
        node,
        bound_pod("train", "a100", (0,), 12, namespace="ml-a"),
        make_quota("team", "ml-a", **{"limits.aliyun.com/gpu-mem": "40", "limits.aliyun.com/gpu-count.A100": "2"}),
        make_quota("odd", "ml-b", **{"limits.aliyun.com/gpu-mem": "1.5", "limits.aliyun.com/gpu-count": "4"}),
        make_quota("cpu-only", "ml-b", **{"limits.cpu": "4"}),
    ]
    path = folder / "quotas.yaml"
    path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": objects}))
    return build_server(file_service(Settings(), str(path)))


async def test_quotas_show_what_each_namespace_uses_of_each_gpu_limit(tmp_path: Path) -> None:
    async for url in serve(quota_server(tmp_path), None):
        lines = (await inspect(url)).splitlines()
        start = lines.index("ResourceQuotas (what each namespace is given of each GPU limit):")
        assert lines[start + 1 :] == [
            "  ml-a/team  gpus A100  1/2        [##########..........]",
            "             memory     12/40 GiB  [######..............]",
            "  ml-b/odd   gpus       0/4        [....................]",
            "    unread: limits.aliyun.com/gpu-mem: '1.5' is not a whole number; HAMi reads only whole numbers too",
            "",
            "1 node, 2 GPUs, 1 pods in the cache, 0 reserved; extender ready",
        ]
        report = json.loads(await inspect(url, as_json=True))
        assert [quota["name"] for quota in report["quotas"]] == ["team", "odd"], "one without GPU keys is not kept"
