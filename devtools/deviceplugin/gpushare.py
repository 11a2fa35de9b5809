"""A node-side double of the gpushare device plugin that kubelet really calls: `aliyun.com/gpu-mem` over kubelet's
device-plugin API, and what its `Allocate` reads and writes in the API.

Read from AliyunContainerService/gpushare-device-plugin at commit 45fb8b88692250cff2d53cb64b0a41864a5fcaf3 (master,
2022-04-21; `nv/` = pkg/gpu/nvidia/), with the flags of its DaemonSet (`device-plugin-ds.yaml`: `--memory-unit=GiB`,
no `--query-kubelet`, no `--health-check`):
- socket `aliyungpushare.sock`, resource `aliyun.com/gpu-mem` (nv/const.go:11-13); Register with no options, and
  GetDevicePluginOptions empty (nv/server.go:85-87, :149-169): kubelet never asks GetPreferredAllocation, which this
  plugin does not implement; PreStartContainer answers empty (nv/server.go:191-193);
- ListAndWatch: per GPU, as many devices as the FIRST GPU has memory units (`gpuMemory` is set once, from the first
  device NVML lists: MiB / 1024 with GiB, nv/nvidia.go:34-45, :70-72), IDs `<UUID>-_-<j>` (nv/nvidia.go:26-28,
  :73-85), all Healthy; sent once (no health check runs without `--health-check`, nv/server.go:172-185);
- at each (re)start, `aliyun.com/gpu-count` = number of GPUs patched into the Node's status capacity and
  allocatable unless capacity already says so (`patchGPUCount`, nv/podmanager.go:74-99), and the node label
  `cgpu.disable.isolation=true` read (nv/podmanager.go:59-72);
- Allocate (nv/allocate.go:42-198), one call at a time (`m.Lock()`): the units asked = device IDs over the call's
  container requests (:54-56); the candidates = the node's pods listed by the API with `status.phase=Pending`
  (nv/podmanager.go:142-160) whose containers' `aliyun.com/gpu-mem` limits add up to more than 0, with
  `ALIYUN_COM_GPU_MEM_ASSUME_TIME` and `ALIYUN_COM_GPU_MEM_ASSIGNED` = "false" (nv/podutils.go:78-131), oldest
  assume time first (nv/podmanager.go:215-262); the first whose total equals the units asked is the pod (:78-88);
  its GPU is `ALIYUN_COM_GPU_MEM_IDX` (Atoi; absent or unreadable: -1, nv/podutils.go:37-61), which must be a GPU's
  index (its /dev/nvidia minor, nv/nvidia.go:63-67; nv/server.go:72-83); each container gets
  `NVIDIA_VISIBLE_DEVICES=<idx>`, `ALIYUN_COM_GPU_MEM_IDX=<idx>`, `..._POD=<units asked>`, `..._CONTAINER=<its
  units>`, `..._DEV=<units per GPU>` and `CGPU_DISABLE=true` with the label (:113-128); then the pod is patched
  (strategic merge) `ALIYUN_COM_GPU_MEM_ASSIGNED: "true"` and a new `..._ASSUME_TIME` (nv/podutils.go:27-35;
  :130-149, retried once on a conflict);
- no pod found, on a node of one GPU: that GPU, `NVIDIA_VISIBLE_DEVICES=<its UUID>`, no patch (:151-177);
- otherwise (no pod found, its index -1 or unknown, the list or the patch failed): still an answer, never a gRPC
  error, every container with `NVIDIA_VISIBLE_DEVICES=no-gpu-has-<units>GiB-to-run`, `..._IDX=-1`, `..._POD`,
  `..._CONTAINER`, `..._DEV` (`buildErrResponse`, :24-39; :64-66, :107-110, :179-184). kubelet admits the pod.

A pod our extender placed on several GPUs carries `gpu-extender.io/device-indexes` and no `ALIYUN_COM_GPU_MEM_IDX`
but is a candidate all the same (ASSIGNED false, an assume time): matched, its index is -1, so it gets the answer
above and stays ASSIGNED=false (the double does exactly that, and records it). Under NVIDIA's container runtime that
value names no device and the container cannot start ("nvidia-container-cli: device error: unknown device id:
no-gpu-has-10MiB-to-run", AliyunContainerService/gpushare-scheduler-extender issue #80), so the pod stays Pending and
the oldest candidate of its size: every later pod of the same total on the node is matched to it and gets no GPU.
`refuse` names pods to answer that way on purpose: the plugin's only way of failing one.
It never imports `extender`.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from decimal import ROUND_CEILING, Decimal, InvalidOperation

import grpc

from devtools.deviceplugin.gpus import GpuFile
from devtools.deviceplugin.kube import STRATEGIC_PATCH, ApiError, KubeApi, Obj
from devtools.deviceplugin.kubeletapi import (
    VERSION,
    AllocateError,
    ContainerAllocation,
    Device,
    Options,
    PreferredRequest,
    RegisterRequest,
)
from devtools.deviceplugin.record import AllocateRecord, GivenGpu, Recorder

log = logging.getLogger("devtools.deviceplugin")

RESOURCE = "aliyun.com/gpu-mem"
COUNT = "aliyun.com/gpu-count"
SOCKET = "aliyungpushare.sock"
VISIBLE = "NVIDIA_VISIBLE_DEVICES"
IDX = "ALIYUN_COM_GPU_MEM_IDX"
POD = "ALIYUN_COM_GPU_MEM_POD"
CONTAINER = "ALIYUN_COM_GPU_MEM_CONTAINER"
DEV = "ALIYUN_COM_GPU_MEM_DEV"
ASSIGNED = "ALIYUN_COM_GPU_MEM_ASSIGNED"
ASSUME_TIME = "ALIYUN_COM_GPU_MEM_ASSUME_TIME"
CGPU_LABEL = "cgpu.disable.isolation"
CONFLICT = "the object has been modified; please apply your changes to the latest version and try again"
"""`OptimisticLockErrorMsg` (nv/const.go:15): the one patch error retried, when the error's text is exactly it."""
SUFFIXES: dict[str, Decimal | int] = {
    "": 1,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
    "m": Decimal("0.001"),
}
SUFFIXES |= {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}


def quantity(text: object) -> int:
    """`resource.Quantity.Value()`: the amount rounded up to a whole number; 0 when unreadable."""
    match = re.fullmatch(r"([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)([kMGTPEm]|[KMGTPE]i)?", str(text).strip())
    if match is None:
        return 0
    try:
        value = Decimal(match.group(1)) * Decimal(SUFFIXES[match.group(2) or ""])
    except InvalidOperation:
        return 0
    return int(value.to_integral_value(rounding=ROUND_CEILING))


def atoi(text: object) -> int | None:
    """Go's strconv.Atoi: an optional sign and decimal digits, else None."""
    return int(str(text)) if isinstance(text, str) and re.fullmatch(r"[+-]?[0-9]+", text) else None


def pod_units(pod: Obj) -> int:
    """`getGPUMemoryFromPodResource` (nv/podutils.go:121-131): limits of the app containers only, summed."""
    containers = (pod.get("spec") or {}).get("containers") or []
    return sum(quantity(((c.get("resources") or {}).get("limits") or {}).get(RESOURCE, 0)) for c in containers)


def assume_time(pod: Obj) -> int:
    """`getAssumeTimeFromPodAnnotation` (nv/podutils.go:63-75): ParseUint, 0 when unreadable."""
    value = ((pod.get("metadata") or {}).get("annotations") or {}).get(ASSUME_TIME, "")
    return int(value) if isinstance(value, str) and value.isdigit() else 0


def is_assumed(pod: Obj) -> bool:
    """`isGPUMemoryAssumedPod` (nv/podutils.go:78-119)."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    return pod_units(pod) > 0 and ASSUME_TIME in annotations and annotations.get(ASSIGNED) == "false"


@dataclass(frozen=True, slots=True)
class Found:
    pod: Obj | None
    why: str
    """Why no GPU is given ("" when one is)."""
    listed: bool = True
    """False: the list of candidates failed (then not even a one-GPU node gives its GPU, nv/allocate.go:62-66)."""


class GpushareDouble:
    """The gpushare plugin on one node. Mutable: the node label read at each start, the lock of Allocate."""

    socket_name = SOCKET
    retry_after: float | None = None

    def __init__(self, api: KubeApi, node: str, gpus: GpuFile, recorder: Recorder, refuse: frozenset[str]) -> None:
        self.api = api
        self.node = node
        self.gpus = gpus
        self.recorder = recorder
        self.refuse = refuse
        first = gpus.gpus[0].memory
        self.units = first // 1024 if gpus.memory_unit == "GiB" else first
        """`gpuMemory`: units per GPU, from the first GPU alone (nv/nvidia.go:70-72)."""
        self.by_index = {gpu.index: gpu for gpu in gpus.gpus}
        self.disable_cgpu = False
        self._lock = asyncio.Lock()

    # ---- kubelet's API -----------------------------------------------------------------------------------------

    def register_request(self) -> RegisterRequest:
        return RegisterRequest(VERSION, SOCKET, RESOURCE)

    def options(self) -> Options:
        return Options()

    async def list_and_watch(self) -> AsyncIterator[list[Device]]:
        yield [Device(f"{gpu.uuid}-_-{j}") for gpu in self.gpus.gpus for j in range(self.units)]
        await asyncio.Event().wait()  # no health check: nothing more is ever sent

    async def preferred(self, requests: list[PreferredRequest]) -> list[list[str]]:
        raise AllocateError("unknown method GetPreferredAllocation", grpc.StatusCode.UNIMPLEMENTED)

    async def before_serving(self) -> None:
        node = await self.api.call("GET", f"/api/v1/nodes/{self.node}")
        self.disable_cgpu = (node["metadata"].get("labels") or {}).get(CGPU_LABEL) == "true"
        count = len(self.gpus.gpus)
        if quantity(((node.get("status") or {}).get("capacity") or {}).get(COUNT, -1)) != count:
            patch: Obj = {"status": {"capacity": {COUNT: str(count)}, "allocatable": {COUNT: str(count)}}}
            await self.api.call("PATCH", f"/api/v1/nodes/{self.node}/status", patch, STRATEGIC_PATCH)
            log.info("node %s: %s patched to %d", self.node, COUNT, count)

    async def after_registering(self) -> None:
        return None

    async def stopped(self) -> None:
        return None

    async def allocate(self, requests: list[list[str]]) -> list[ContainerAllocation]:
        asked = sum(len(ids) for ids in requests)
        ids = tuple(id_ for request in requests for id_ in request)
        async with self._lock:
            found = await self._find(asked)
            pod = found.pod
            index = atoi(((pod["metadata"].get("annotations") or {}).get(IDX)) if pod else None)
            gpu = self.by_index.get(index) if index is not None and index >= 0 else None
            why = found.why
            if pod is not None and gpu is None:
                why = f"{IDX} {index if index is not None else 'absent'} names no GPU of {self.node}"
            if pod is not None and pod["metadata"]["name"] in self.refuse:
                why, gpu = "refused on purpose", None
            if pod is not None and gpu is not None:
                try:
                    await self._assign(pod)
                except ApiError as error:
                    why, gpu = f"patch {ASSIGNED}: {error}", None
            if pod is None and found.listed and len(self.gpus.gpus) == 1:  # one GPU: no pod needed, none patched
                gpu, why = self.gpus.gpus[0], ""
                answers = [self._env(request, asked, gpu.uuid, gpu.index) for request in requests]
            elif gpu is not None:
                answers = [self._env(request, asked, str(gpu.index), gpu.index) for request in requests]
            else:
                answers = [self._env(request, asked, f"no-gpu-has-{asked}{self.gpus.memory_unit}-to-run", -1)
                           for request in requests]  # fmt: skip
            given = (GivenGpu(gpu.index, gpu.uuid, asked),) if gpu is not None else ()
            meta = pod["metadata"] if pod else {}
            name = f"{meta['namespace']}/{meta['name']}" if pod else None
            record = AllocateRecord(
                "gpushare", self.node, name, meta.get("uid"), None, ids, given, answers[0].envs[VISIBLE], True, why
            )
            self.recorder.write(record)
            log.info(
                "Allocate %d %s on %s: pod %s, %s=%s%s", asked, self.gpus.memory_unit, self.node, name or "none",
                VISIBLE, answers[0].envs[VISIBLE], f" ({why})" if why else "",
            )  # fmt: skip
            return answers

    # ---- the API -----------------------------------------------------------------------------------------------

    async def _find(self, asked: int) -> Found:
        selector = f"spec.nodeName%3D{self.node}%2Cstatus.phase%3DPending"
        try:
            listed = await self.api.call("GET", f"/api/v1/pods?fieldSelector={selector}")
        except ApiError as error:
            return Found(None, f"failed to get pods assigned to node {self.node}: {error}", listed=False)
        candidates = [pod for pod in listed["items"] if is_assumed(pod)]
        candidates.sort(key=assume_time)
        pod = next((pod for pod in candidates if pod_units(pod) == asked), None)
        return Found(pod, "" if pod else f"no assumed pod on {self.node} asks {asked} {self.gpus.memory_unit}")

    async def _assign(self, pod: Obj) -> None:
        path = f"/api/v1/namespaces/{pod['metadata']['namespace']}/pods/{pod['metadata']['name']}"
        patch: Obj = {"metadata": {"annotations": {ASSIGNED: "true", ASSUME_TIME: str(time.time_ns())}}}
        try:
            await self.api.call("PATCH", path, patch, STRATEGIC_PATCH)
        except ApiError as error:
            if error.message != CONFLICT:  # compared whole, so a 409's "Operation cannot be fulfilled ..." never is
                raise
            await self.api.call("PATCH", path, patch, STRATEGIC_PATCH)

    def _env(self, request: list[str], asked: int, visible: str, index: int) -> ContainerAllocation:
        envs = {
            VISIBLE: visible,
            IDX: str(index),
            POD: str(asked),
            CONTAINER: str(len(request)),
            DEV: str(self.units),
        }
        if self.disable_cgpu and index >= 0:
            envs["CGPU_DISABLE"] = "true"
        return ContainerAllocation(envs)
