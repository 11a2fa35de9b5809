"""HAMi's device plugin's double (devtools/deviceplugin/hami.py) as kubelet calls it: registration with kubelet and
on the Node, devices, GetPreferredAllocation, Allocate for pods placed by annotations and the node lock, MIG, refusals.

kubelet is the fake of tests/deviceplugin/kubelet.py; the API is the e2e tier's real kube-apiserver, where each test
makes its own Node and Pods as HAMi's scheduler (or our extender in HAMi's protocol) leaves them at bind."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import orjson
import pytest

from devtools.deviceplugin import kubeletapi
from devtools.deviceplugin.gpus import GpuFile, load_gpus
from devtools.deviceplugin.hami import HamiDouble
from devtools.deviceplugin.hami_protocol import (
    ALLOCATED,
    BIND_PHASE,
    BIND_TIME,
    GPU,
    LOCK,
    MIG_ALLOCATIONS,
    REGISTER,
    TO_ALLOCATE,
    VGPU_NODE,
    decode_reservations,
)
from devtools.deviceplugin.kube import KubeApi
from devtools.deviceplugin.record import Recorder, read_records
from tests.deviceplugin.conftest import make_node, make_pod, serving, wait
from tests.deviceplugin.kubelet import FakeKubelet
from tests.e2e.conftest import Remember
from tests.e2e.controlplane import ControlPlane

pytestmark = pytest.mark.e2e

GPUS = Path(__file__).resolve().parents[2] / "devtools" / "deviceplugin" / "gpus-hami.yaml"
A100, T4 = "GPU-0a1b2c3d-0000-1111-2222-333344445555", "GPU-9f8e7d6c-aaaa-bbbb-cccc-ddddeeeeffff"

Make = Callable[..., Awaitable[dict[str, Any]]]


@pytest.fixture
async def node(control_plane: ControlPlane, cleanup: Remember, request: pytest.FixtureRequest) -> str:
    name = f"hm-{request.node.name[5:40].replace('_', '-')}-{os.getpid() % 1000}".lower().strip("-")
    await control_plane.api("POST", "/api/v1/nodes", make_node(name))
    cleanup(f"/api/v1/nodes/{name}")
    return name


@pytest.fixture
def make(control_plane: ControlPlane, cleanup: Remember, node: str) -> Make:
    """A pod bound to the test's node as HAMi's Bind leaves it: its entries, bind-phase allocating, and (unless
    `lock=False`) the node's lock naming it (protocols/hami.md §5)."""

    async def create(name: str, entry: str, gpus: int = 1, lock: bool = True, **extra: str) -> dict[str, Any]:
        now = str(int(time.time()))
        annotations = {VGPU_NODE: node, "hami.io/vgpu-time": now, TO_ALLOCATE: entry, ALLOCATED: entry,
                       BIND_PHASE: "allocating", BIND_TIME: now} | extra  # fmt: skip
        pod = make_pod(name, node, {GPU: str(gpus)}, annotations)
        created = await control_plane.api("POST", "/api/v1/namespaces/default/pods", pod)
        cleanup(f"/api/v1/namespaces/default/pods/{name}")
        if lock:
            value = f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())},default,{name}"
            await control_plane.api("PATCH", f"/api/v1/nodes/{node}", {"metadata": {"annotations": {LOCK: value}}})
        return created

    return create


async def annotations(control_plane: ControlPlane, path: str) -> dict[str, str]:
    return dict((await control_plane.api("GET", path))["metadata"].get("annotations") or {})


@contextlib.asynccontextmanager
async def running(
    api: KubeApi, node: str, kubelet: FakeKubelet, gpus: GpuFile, record: Path, refuse: frozenset[str] = frozenset()
) -> AsyncIterator[HamiDouble]:
    recorder = Recorder(record)
    double = HamiDouble(api, node, gpus, recorder, refuse)
    async with serving(double, kubelet):
        await wait(double.registered_annotation, "the registration on the Node")
        yield double
    recorder.close()


@pytest.fixture
async def plugin(api: KubeApi, node: str, kubelet: FakeKubelet, tmp_path: Path) -> AsyncIterator[HamiDouble]:
    refuse = frozenset({"doomed"})
    async with running(api, node, kubelet, load_gpus(GPUS), tmp_path / "allocations.jsonl", refuse) as double:
        yield double


async def test_it_registers_with_kubelet_and_says_it_has_preferred_allocation(
    plugin: HamiDouble, kubelet: FakeKubelet
) -> None:
    """plug/server.go:569-604: Register carries `GetPreferredAllocationAvailable` = the node config's switch (off by
    default), GetDevicePluginOptions always says true, and kubelet goes by the latter."""
    options = kubeletapi.Options(get_preferred_allocation_available=False)
    assert kubelet.registrations == [kubeletapi.RegisterRequest("v1beta1", "nvidia-gpu.sock", GPU, options)]
    assert kubelet.plugins[GPU].options.get_preferred_allocation_available


async def test_it_registers_its_gpus_on_the_node_as_the_v2_10_plugin_writes_them(
    plugin: HamiDouble, control_plane: ControlPlane, node: str
) -> None:
    """register.go:92-207 and MarshalNodeDevices: Go's field order and omitempty (index 0 and numa 0 left out),
    type prefixed NVIDIA- unless it starts so, hami-core mode; no handshake annotation (the plugin writes none)."""
    found = await annotations(control_plane, f"/api/v1/nodes/{node}")
    assert orjson.loads(found[REGISTER]) == [
        {"id": A100, "count": 10, "devmem": 40960, "devcore": 100, "type": "NVIDIA A100-SXM4-40GB",
         "mode": "hami-core", "health": True},
        {"id": T4, "index": 1, "count": 10, "devmem": 15360, "devcore": 100, "type": "NVIDIA-Tesla T4",
         "mode": "hami-core", "health": True},
    ]  # fmt: skip
    assert list(orjson.loads(found[REGISTER])[1]) == ["id", "index", "count", "devmem", "devcore", "type", "mode",
                                                      "health"]  # fmt: skip
    assert "hami.io/node-handshake" not in found


async def test_it_lists_split_count_replicas_of_each_gpu(plugin: HamiDouble, kubelet: FakeKubelet) -> None:
    """rm/devices.go:195-225: `<UUID>-<i>` for i below deviceSplitCount (10), Healthy."""
    ids = [device.id for device in kubelet.plugins[GPU].devices]
    assert ids == [f"{gpu}-{i}" for gpu in (A100, T4) for i in range(10)]


async def test_allocate_serves_the_locked_pod_with_hami_core_limits_and_ends_its_allocation(
    plugin: HamiDouble, kubelet: FakeKubelet, make: Make, control_plane: ControlPlane, node: str, tmp_path: Path
) -> None:
    """The pod the node lock names (pkg/util/util.go:120-137): kubelet first asks GetPreferredAllocation and gets a
    replica of the entry's GPU (plug/server.go:631-713); Allocate gives the entry's GPU with HAMi-core's limits
    (:832-847), erases the entry (`;;`), sets bind-phase success and releases the lock (plug/util.go:371-405)."""
    await make("p1", f"{T4},NVIDIA,3000,30:;")
    [answer] = await kubelet.admit(GPU, 1)
    assert kubelet.plugins[GPU].allocated <= {f"{T4}-{i}" for i in range(10)}, "the preferred replica, on the T4"
    envs = dict(answer.envs)
    assert envs.pop("CUDA_DEVICE_MEMORY_SHARED_CACHE").startswith("/usr/local/vgpu/")
    assert envs == {"NVIDIA_VISIBLE_DEVICES": T4, "CUDA_DEVICE_MEMORY_LIMIT_0": "3000m", "CUDA_DEVICE_SM_LIMIT": "30",
                    "LIBCUDA_LOG_LEVEL": "1"}  # fmt: skip
    assert answer.mounts == ()
    pod = await annotations(control_plane, "/api/v1/namespaces/default/pods/p1")
    assert pod[TO_ALLOCATE] == ";;" and pod[BIND_PHASE] == "success"
    assert LOCK not in await annotations(control_plane, f"/api/v1/nodes/{node}")
    [record] = read_records(tmp_path / "allocations.jsonl")
    assert (record["pod"], record["container"], record["found_by"], record["accepted"]) == ("default/p1", "main",
                                                                                            "lock", True)  # fmt: skip
    assert record["gpus"] == [{"index": 1, "uuid": T4, "memory": 3000, "cores": 30}]


async def test_without_a_lock_the_pending_pod_awaiting_its_gpus_is_found(
    plugin: HamiDouble, kubelet: FakeKubelet, make: Make, tmp_path: Path
) -> None:
    """GetPendingPod's search (pkg/util/util.go:84-117): Pending, bind-time, bind-phase allocating, vgpu-node."""
    await make("free", f"{A100},NVIDIA,1000,0:;", lock=False)
    [answer] = await kubelet.admit(GPU, 1)
    assert answer.envs["NVIDIA_VISIBLE_DEVICES"] == A100
    assert read_records(tmp_path / "allocations.jsonl")[0]["found_by"] == "search"


async def test_a_count_mismatch_fails_the_call_marks_the_pod_failed_and_releases_the_lock(
    plugin: HamiDouble, kubelet: FakeKubelet, make: Make, control_plane: ControlPlane, node: str, tmp_path: Path
) -> None:
    """kubelet hands 2 devices, the entry has 1: "device number not matched" (plug/server.go:802-805), a gRPC error
    (kubelet: UnexpectedAdmissionError) after bind-phase failed and the lock released (plug/util.go:407-414)."""
    await make("two", f"{T4},NVIDIA,3000,30:;", gpus=2)
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await kubelet.admit(GPU, 2)
    assert "device number not matched" in str(refused.value.details())
    pod = await annotations(control_plane, "/api/v1/namespaces/default/pods/two")
    assert pod[BIND_PHASE] == "failed" and pod[TO_ALLOCATE] == f"{T4},NVIDIA,3000,30:;"
    assert LOCK not in await annotations(control_plane, f"/api/v1/nodes/{node}")
    [record] = read_records(tmp_path / "allocations.jsonl")
    assert not record["accepted"] and record["pod"] == "default/two" and record["gpus"] == []


async def test_a_pod_named_to_refuse_is_failed_as_the_plugin_fails_one(
    plugin: HamiDouble, kubelet: FakeKubelet, make: Make, control_plane: ControlPlane
) -> None:
    """`refuse`: as a GPU lost from NVML would, a gRPC error and bind-phase failed."""
    await make("doomed", f"{T4},NVIDIA,3000,30:;")
    with pytest.raises(grpc.aio.AioRpcError):
        await kubelet.admit(GPU, 1)
    assert (await annotations(control_plane, "/api/v1/namespaces/default/pods/doomed"))[BIND_PHASE] == "failed"


async def test_no_pod_to_serve_fails_the_call_and_touches_nothing(
    plugin: HamiDouble, kubelet: FakeKubelet, tmp_path: Path
) -> None:
    """GetPendingPod finds none: the call fails and nothing is patched (plug/server.go:757-761)."""
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await kubelet.admit(GPU, 1)
    assert "no binding pod found" in str(refused.value.details())
    [record] = read_records(tmp_path / "allocations.jsonl")
    assert not record["accepted"] and record["pod"] is None


async def test_in_mig_mode_it_registers_profiles_and_gives_the_reserved_instance(
    api: KubeApi, node: str, kubelet: FakeKubelet, make: Make, control_plane: ControlPlane, tmp_path: Path
) -> None:
    """`operatingmode: mig`: only the GPU with profiles is registered, with them (register.go:190-201); Allocate makes
    the reserved instance and gives its MIG UUID, no HAMi-core limits (plug/server.go:820-836), and writes the
    instance's runtime identity into the reservation (:380-423)."""
    gpus = load_gpus(GPUS)
    mig = dataclasses.replace(gpus, hami=dataclasses.replace(gpus.hami, operating_mode="mig"))
    async with running(api, node, kubelet, mig, tmp_path / "mig.jsonl"):
        registered = orjson.loads((await annotations(control_plane, f"/api/v1/nodes/{node}"))[REGISTER])
        assert [(g["id"], g["count"], g["mode"]) for g in registered] == [(A100, 7, "mig")]
        placements = [{"start": 0, "size": 4}, {"start": 4, "size": 4}]
        expected = {"name": "3g.20gb", "memoryMB": 19968, "core": 43, "sliceCount": 3, "placements": placements}
        assert registered[0]["migProfiles"][2] == expected
        reservation = [{"containerIndex": 0, "deviceIndex": 0, "gpuUUID": A100, "profile": "3g.20gb",
                        "placement": {"start": 4, "size": 4}}]  # fmt: skip
        await make("m1", f"{A100},NVIDIA,19968,43:;", **{MIG_ALLOCATIONS: orjson.dumps(reservation).decode()})
        [answer] = await kubelet.admit(GPU, 1)
        assert list(answer.envs) == ["NVIDIA_VISIBLE_DEVICES"] and answer.envs["NVIDIA_VISIBLE_DEVICES"].startswith(
            "MIG-"
        )
        [made] = decode_reservations(
            (await annotations(control_plane, "/api/v1/namespaces/default/pods/m1"))[MIG_ALLOCATIONS]
        )
        assert made.runtime is not None and made.runtime[0] == answer.envs["NVIDIA_VISIBLE_DEVICES"]


async def test_it_registers_again_when_kubelet_recreates_its_socket(
    plugin: HamiDouble, kubelet: FakeKubelet, control_plane: ControlPlane, node: str
) -> None:
    """kubelet.sock created again: every plugin stopped and started (cmd/device-plugin/nvidia/main.go:314-318), so it
    registers again and, a new plugin with an empty deviceCache, writes the Node's registration again."""
    await control_plane.api("PATCH", f"/api/v1/nodes/{node}", {"metadata": {"annotations": {REGISTER: None}}})
    plugin.registered_annotation.clear()
    kubelet.registered.clear()
    await kubelet.restart()
    await wait(kubelet.registered, "a second registration")
    await wait(plugin.registered_annotation, "the registration written again")
    assert len(kubelet.registrations) == 2
    assert REGISTER in await annotations(control_plane, f"/api/v1/nodes/{node}")
