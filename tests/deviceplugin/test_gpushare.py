"""The gpushare device plugin's double (devtools/deviceplugin/gpushare.py) as kubelet calls it: registration, devices,
the Node's gpu-count, and Allocate for pods the extender placed by annotations, for none, and for several GPUs.

kubelet is the fake of tests/deviceplugin/kubelet.py (its registration server, its device choice, its Allocate call
per container); the API is the e2e tier's real kube-apiserver, where each test makes its own Node and Pods."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from devtools.deviceplugin import kubeletapi
from devtools.deviceplugin.gpus import GpuFile, load_gpus
from devtools.deviceplugin.gpushare import GpushareDouble
from devtools.deviceplugin.kube import KubeApi
from devtools.deviceplugin.record import Recorder, read_records
from tests.deviceplugin.conftest import make_node, make_pod, serving, wait
from tests.deviceplugin.kubelet import FakeKubelet
from tests.e2e.conftest import Remember
from tests.e2e.controlplane import ControlPlane

pytestmark = pytest.mark.e2e

GPUS = Path(__file__).resolve().parents[2] / "devtools" / "deviceplugin" / "gpus-gpushare.yaml"
RESOURCE = "aliyun.com/gpu-mem"
MEM, COUNT = "aliyun.com/gpu-mem", "aliyun.com/gpu-count"
IDX, ASSIGNED, ASSUME = "ALIYUN_COM_GPU_MEM_IDX", "ALIYUN_COM_GPU_MEM_ASSIGNED", "ALIYUN_COM_GPU_MEM_ASSUME_TIME"

Make = Callable[..., Awaitable[dict[str, Any]]]


@pytest.fixture
async def node(control_plane: ControlPlane, cleanup: Remember, request: pytest.FixtureRequest) -> str:
    name = f"gs-{request.node.name[5:40].replace('_', '-')}-{os.getpid() % 1000}".lower().strip("-")
    await control_plane.api("POST", "/api/v1/nodes", make_node(name))
    cleanup(f"/api/v1/nodes/{name}")
    return name


@pytest.fixture
def make(control_plane: ControlPlane, cleanup: Remember, node: str) -> Make:
    """Create a pod bound to the test's node, asking `units` of gpu-mem, with annotations."""

    async def create(name: str, units: int, annotations: dict[str, str], gpus: int | None = None) -> dict[str, Any]:
        limits = {MEM: str(units)} | ({COUNT: str(gpus)} if gpus else {})
        pod = await control_plane.api(
            "POST", "/api/v1/namespaces/default/pods", make_pod(name, node, limits, annotations)
        )
        cleanup(f"/api/v1/namespaces/default/pods/{name}")
        return pod

    return create


def placed(index: int, units: int, assume_ns: int) -> dict[str, str]:
    """The annotations our extender's Binding writes for a one-GPU pod (DESIGN §4)."""
    return {IDX: str(index), "ALIYUN_COM_GPU_MEM_POD": str(units), "ALIYUN_COM_GPU_MEM_DEV": "16",
            ASSIGNED: "false", ASSUME: str(assume_ns), "gpu-extender.io/device-indexes": str(index)}  # fmt: skip


@pytest.fixture
async def plugin(
    api: KubeApi, node: str, kubelet: FakeKubelet, tmp_path: Path
) -> AsyncIterator[tuple[GpushareDouble, Path]]:
    record = tmp_path / "allocations.jsonl"
    recorder = Recorder(record)
    double = GpushareDouble(api, node, load_gpus(GPUS), recorder, frozenset({"doomed"}))
    async with serving(double, kubelet):
        yield double, record
    recorder.close()


async def test_it_registers_its_socket_and_gpu_mem_with_no_options(
    plugin: tuple[GpushareDouble, Path], kubelet: FakeKubelet, control_plane: ControlPlane, node: str
) -> None:
    """As gpushare's Register (nv/server.go:149-169): v1beta1, its socket's name, aliyun.com/gpu-mem, no options;
    GetDevicePluginOptions empty, so kubelet never asks GetPreferredAllocation. At start it patched the Node's
    aliyun.com/gpu-count (nv/podmanager.go:74-99)."""
    assert kubelet.registrations == [kubeletapi.RegisterRequest("v1beta1", "aliyungpushare.sock", RESOURCE, None)]
    assert kubelet.plugins[RESOURCE].options == kubeletapi.Options()
    status = (await control_plane.api("GET", f"/api/v1/nodes/{node}"))["status"]
    assert status["capacity"][COUNT] == "2" and status["allocatable"][COUNT] == "2"


async def test_it_lists_one_device_per_gib_of_the_first_gpu_on_every_gpu(
    plugin: tuple[GpushareDouble, Path], kubelet: FakeKubelet
) -> None:
    """nv/nvidia.go:53-89: `<UUID>-_-<j>` for j below the first GPU's memory in GiB (16384 MiB: 16), Healthy."""
    gpus = load_gpus(GPUS).gpus
    devices = kubelet.plugins[RESOURCE].devices
    assert [d.id for d in devices] == [f"{gpu.uuid}-_-{j}" for gpu in gpus for j in range(16)]
    assert {d.health for d in devices} == {"Healthy"}


async def test_allocate_gives_the_annotated_gpu_and_marks_the_pod_assigned(
    plugin: tuple[GpushareDouble, Path], kubelet: FakeKubelet, make: Make, control_plane: ControlPlane
) -> None:
    """A pod the extender placed on GPU 1 with 4 GiB: the env names index 1 (nv/allocate.go:113-128), the pod is
    patched ASSIGNED=true with a new assume time (nv/podutils.go:27-35), the record says so."""
    now = time.time_ns()
    await make("p4", 4, placed(1, 4, now))
    [answer] = await kubelet.admit(RESOURCE, 4)
    assert answer.envs == {"NVIDIA_VISIBLE_DEVICES": "1", IDX: "1", "ALIYUN_COM_GPU_MEM_POD": "4",
                           "ALIYUN_COM_GPU_MEM_CONTAINER": "4", "ALIYUN_COM_GPU_MEM_DEV": "16"}  # fmt: skip
    annotations = (await control_plane.api("GET", "/api/v1/namespaces/default/pods/p4"))["metadata"]["annotations"]
    assert annotations[ASSIGNED] == "true" and int(annotations[ASSUME]) > now
    [record] = read_records(plugin[1])
    assert record["pod"] == "default/p4" and record["accepted"] and record["container"] is None
    assert [(gpu["index"], gpu["memory"]) for gpu in record["gpus"]] == [(1, 4)]


async def test_the_oldest_assumed_pod_of_the_size_asked_is_the_one_served(
    plugin: tuple[GpushareDouble, Path], kubelet: FakeKubelet, make: Make
) -> None:
    """Candidates sorted by assume time, the first whose gpu-mem equals the units asked (nv/podmanager.go:240-262,
    nv/allocate.go:78-88): the older of two 4 GiB pods, whatever kubelet admitted; a 2 GiB pod is not a match."""
    await make("newer", 4, placed(0, 4, 2_000))
    await make("older", 4, placed(1, 4, 1_000))
    await make("small", 2, placed(0, 2, 500))
    [answer] = await kubelet.admit(RESOURCE, 4)
    assert answer.envs[IDX] == "1"
    assert read_records(plugin[1])[0]["pod"] == "default/older"


async def test_no_pod_found_is_an_answer_naming_no_gpu_not_an_error(
    plugin: tuple[GpushareDouble, Path], kubelet: FakeKubelet
) -> None:
    """`buildErrResponse` (nv/allocate.go:24-39, :179-184): kubelet gets envs, not a gRPC error, so the pod is
    admitted with `NVIDIA_VISIBLE_DEVICES=no-gpu-has-3GiB-to-run` and index -1."""
    [answer] = await kubelet.admit(RESOURCE, 3)
    assert answer.envs == {"NVIDIA_VISIBLE_DEVICES": "no-gpu-has-3GiB-to-run", IDX: "-1",
                           "ALIYUN_COM_GPU_MEM_POD": "3", "ALIYUN_COM_GPU_MEM_CONTAINER": "3",
                           "ALIYUN_COM_GPU_MEM_DEV": "16"}  # fmt: skip
    [record] = read_records(plugin[1])
    assert record["accepted"] and record["pod"] is None and record["gpus"] == []
    assert "no assumed pod" in record["reason"]


async def test_a_pod_on_several_gpus_gets_no_gpu_and_then_takes_the_next_pods_match(
    plugin: tuple[GpushareDouble, Path], kubelet: FakeKubelet, make: Make, control_plane: ControlPlane
) -> None:
    """Our extender's multi-GPU allocation (`gpu-extender.io/device-indexes: 0,1`, no ALIYUN_COM_GPU_MEM_IDX) is
    still a candidate (ASSIGNED false, an assume time): matched by its 8 units, its index reads -1
    (nv/podutils.go:37-61), so it gets the no-GPU answer and stays unassigned (nv/allocate.go:90-110). Pending, it
    stays the oldest candidate of 8 units: the next one-GPU pod of 8 units is answered with it, and gets no GPU."""
    several = placed(0, 8, 1_000) | {"gpu-extender.io/device-indexes": "0,1"}
    del several[IDX]
    await make("wide", 8, several, gpus=2)
    [answer] = await kubelet.admit(RESOURCE, 8)
    assert answer.envs["NVIDIA_VISIBLE_DEVICES"] == "no-gpu-has-8GiB-to-run" and answer.envs[IDX] == "-1"
    wide = (await control_plane.api("GET", "/api/v1/namespaces/default/pods/wide"))["metadata"]["annotations"]
    assert wide[ASSIGNED] == "false"
    await make("next", 8, placed(1, 8, 2_000))
    [answer] = await kubelet.admit(RESOURCE, 8)
    assert answer.envs["NVIDIA_VISIBLE_DEVICES"] == "no-gpu-has-8GiB-to-run"
    records = read_records(plugin[1])
    assert [(r["pod"], r["gpus"]) for r in records] == [("default/wide", []), ("default/wide", [])]
    assert "ALIYUN_COM_GPU_MEM_IDX absent" in records[0]["reason"]


async def test_a_pod_named_to_refuse_gets_the_no_gpu_answer(
    plugin: tuple[GpushareDouble, Path], kubelet: FakeKubelet, make: Make, control_plane: ControlPlane
) -> None:
    """`refuse`: the plugin's one way of failing a pod, the error response; it stays unassigned."""
    await make("doomed", 4, placed(0, 4, 1_000))
    [answer] = await kubelet.admit(RESOURCE, 4)
    assert answer.envs[IDX] == "-1"
    doomed = (await control_plane.api("GET", "/api/v1/namespaces/default/pods/doomed"))["metadata"]["annotations"]
    assert doomed[ASSIGNED] == "false"
    assert read_records(plugin[1])[0]["reason"] == "refused on purpose"


async def test_a_one_gpu_node_gives_its_gpu_without_a_pod(
    api: KubeApi, node: str, kubelet: FakeKubelet, tmp_path: Path
) -> None:
    """nv/allocate.go:151-177: no pod found on a node of one GPU: that GPU, named by UUID, and nothing patched."""
    one = load_gpus(GPUS)
    double = GpushareDouble(api, node, GpuFile(one.gpus[:1]), Recorder(None), frozenset())
    async with serving(double, kubelet):
        [answer] = await kubelet.admit(RESOURCE, 2)
    assert answer.envs["NVIDIA_VISIBLE_DEVICES"] == one.gpus[0].uuid and answer.envs[IDX] == "0"


async def test_it_registers_again_when_kubelet_recreates_its_socket(
    plugin: tuple[GpushareDouble, Path], kubelet: FakeKubelet, socket_dir: Path
) -> None:
    """kubelet restarting wipes the directory's sockets and listens anew; the plugin's inotify watch sees
    kubelet.sock created and restarts: serves its socket again and registers (nv/gpumanager.go:82-87)."""
    kubelet.registered.clear()
    await kubelet.restart()
    await wait(kubelet.registered, "a second registration")
    assert len(kubelet.registrations) == 2 and (socket_dir / "aliyungpushare.sock").is_socket()
    await wait(kubelet.plugins[RESOURCE].listed, "the device list after the restart")
    assert len(kubelet.plugins[RESOURCE].devices) == 32
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await kubelet.plugins[RESOURCE].call("GetPreferredAllocation")(
            kubeletapi.to_preferred_request([kubeletapi.PreferredRequest(("a",), (), 1)])
        )
    assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED


async def test_sigterm_stops_the_process_and_removes_its_socket(
    control_plane: ControlPlane, node: str, kubelet: FakeKubelet, socket_dir: Path, tmp_path: Path
) -> None:
    """The command as the node runs it: registered, then SIGTERM (gpumanager.go:92-105): socket gone, exit 0."""
    kubelet.registered.clear()
    process = subprocess.Popen(
        [sys.executable, "-m", "devtools.deviceplugin", "--protocol", "gpushare", "--node", node, "--kubeconfig",
         str(control_plane.kubeconfig("admin")), "--gpus", str(GPUS), "--socket-dir", str(socket_dir)],
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        await wait(kubelet.registered, "the process's registration")
        assert (socket_dir / "aliyungpushare.sock").is_socket()
        process.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(process.wait, 20)
    finally:
        process.kill()
    log = process.stderr.read() if process.stderr else ""
    assert code == 0, log
    assert not (socket_dir / "aliyungpushare.sock").exists()
    assert "registered aliyun.com/gpu-mem with kubelet" in log and "stopped: socket" in log
