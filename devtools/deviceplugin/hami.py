"""A node-side double of HAMi's NVIDIA device plugin (v2.10.0) that kubelet really calls: `nvidia.com/gpu` over
kubelet's device-plugin API, its registration on the Node, and its `Allocate` (hami_allocate.py) with HAMi-core's
environment.

Read from Project-HAMi/HAMi commit 4707fb02c91c545bc7343ce26dba4c32919f9a3e (v2.10.0); `plug/` =
pkg/device-plugin/nvidiadevice/nvinternal/plugin/, chart defaults from charts/hami/values.yaml:
- socket `nvidia-gpu.sock`, resource `nvidia.com/gpu` (plug/server.go:171-176, :211); Register with options
  `GetPreferredAllocationAvailable` = config.json `enablegetpreferredallocation` (default false, :582-589);
  GetDevicePluginOptions always says true (:599-604), and kubelet goes by the latter (manager.go:225-229 at
  v1.34.1), so kubelet asks GetPreferredAllocation whenever it has a choice; PreStartContainer answers empty;
- ListAndWatch: per GPU `deviceSplitCount` devices `<UUID>-<i>` (rm/devices.go:195-225), in MIG mode too; sent
  once (health changes come from NVML events, none here; an unhealthy GPU in the file is sent Unhealthy);
- `hami.io/node-nvidia-register` (register.go:92-207, :258-310): a JSON array, per GPU `id, index, count, devmem,
  devcore, type, numa, mode, migProfiles, health`, Go's omitempty (index 0, numa 0, health false left out); devmem
  the MiB x deviceMemoryScaling unless MIG; devcore 100 x deviceCoreScaling (100 in MIG mode; the file's `cores`
  stands for that 100: leave it so to stay faithful); type prefixed
  `NVIDIA-` unless it starts with NVIDIA; count the split count, in MIG mode the most instances of a profile, and a
  GPU without profiles left out; written right after kubelet took the registration, then every 30 s (5 s after an
  error), patched only when the text changed since this start (`deviceCache`, :271-276); with `topologyScore`
  (ENABLE_TOPOLOGY_SCORE) `hami.io/node-nvidia-score` too (:279-300; pair scores calculate_score.go:190-286).
  The v2.10 plugin writes no `hami.io/node-handshake`: only the scheduler does (pkg/device/devices.go:576-615);
- Allocate (plug/server.go:747-912): hami_allocate.py; then per container `NVIDIA_VISIBLE_DEVICES` = the entry's
  GPU UUIDs (MIG: the instances' UUIDs; :914-953, :1036-1059) and, outside MIG mode, HAMi-core's
  `CUDA_DEVICE_MEMORY_LIMIT_<i>=<MiB>m`, `CUDA_DEVICE_SM_LIMIT=<first GPU's cores>`,
  `CUDA_DEVICE_MEMORY_SHARED_CACHE=<hook>/vgpu/<uuid>.cache`, `CUDA_OVERSUBSCRIBE=true` when memory scaling > 1,
  `LIBCUDA_LOG_LEVEL` (chart 1), `GPU_CORE_UTILIZATION_POLICY=disable` with disableCoreLimit (:832-847); a failure
  is a gRPC error (kubelet fails the pod, UnexpectedAdmissionError) after `bind-phase: failed`;
- GetPreferredAllocation (:631-713): for each container request, replicas of the GPUs of the pod's next non-empty
  entries, in order, from kubelet's available IDs; an answer without that container when it cannot.

Left out: HAMi-core's mounts (libvgpu.so, ld.so.preload, the cache directory, /tmp/vgpulock, :848-897) name files
its image installs on the host, which do not exist here; CDI, device specs, IMEX; NVML health events; the MIG
manager's GPU reset at start. It never imports `extender`.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator
from typing import Any

import orjson

from devtools.deviceplugin.gpus import PCIE_SCORES, GpuFile, GpuSpec
from devtools.deviceplugin.hami_allocate import CallFailed, HamiAllocator
from devtools.deviceplugin.hami_protocol import (
    GPU,
    MIG_MODE,
    REGISTER,
    SCORE,
    TO_ALLOCATE,
    Device,
    Gpu,
    MigProfile,
    decode_entries,
    physical_device_id,
    pod_key,
)
from devtools.deviceplugin.kube import ApiError, KubeApi
from devtools.deviceplugin.kubeletapi import (
    HEALTHY,
    UNHEALTHY,
    VERSION,
    AllocateError,
    ContainerAllocation,
    Options,
    PreferredRequest,
    RegisterRequest,
)
from devtools.deviceplugin.kubeletapi import Device as KubeletDevice
from devtools.deviceplugin.record import AllocateRecord, GivenGpu, Recorder

log = logging.getLogger("devtools.deviceplugin")

SOCKET = "nvidia-gpu.sock"
REGISTER_EVERY = 30.0
RETRY_REGISTER = 5.0


def registration(gpus: GpuFile) -> list[dict[str, Any]]:
    """getAPIDevices + MarshalNodeDevices: what the plugin writes in `hami.io/node-nvidia-register`."""
    settings = gpus.hami
    mig = settings.operating_mode == MIG_MODE
    listed = []
    for gpu in gpus.gpus:
        if mig and not gpu.mig_profiles:
            continue  # "skip MIG device with no discovered profile capacity"
        memory = gpu.memory if mig or settings.memory_scaling == 1 else int(gpu.memory * settings.memory_scaling)
        count = max(profile.instances for profile in gpu.mig_profiles) if mig else settings.split_count
        entry: dict[str, Any] = {"id": gpu.uuid}
        if gpu.index:
            entry["index"] = gpu.index
        entry |= {
            "count": count,
            "devmem": memory,
            "devcore": 100 if mig else int(settings.core_scaling * gpu.cores),
            "type": gpu.model if gpu.model.startswith("NVIDIA") else f"NVIDIA-{gpu.model}",
        }
        if gpu.numa:
            entry["numa"] = gpu.numa
        entry["mode"] = settings.operating_mode
        if mig:
            entry["migProfiles"] = [
                {"name": p.name, "memoryMB": p.memory, "core": p.core, "sliceCount": p.slices,
                 "placements": [{"start": start, "size": size} for start, size in p.placements]}
                for p in gpu.mig_profiles
            ]  # fmt: skip
        if gpu.healthy:
            entry["health"] = True
        listed.append(entry)
    return listed


def pair_scores(gpus: GpuFile, registered: list[str]) -> list[dict[str, Any]]:
    """`hami.io/node-nvidia-score`: per registered GPU, its score with each other one (the PCIe link's, plus 100 a
    NVLink link; 0 when the two GPUs disagree on their links, calculate_score.go:211-228)."""
    by_uuid = {gpu.uuid: gpu for gpu in gpus.gpus}
    pcie = PCIE_SCORES[gpus.hami.pcie]

    def score(one: GpuSpec, other: GpuSpec) -> int:
        there, back = one.nvlink.get(other.uuid, 0), other.nvlink.get(one.uuid, 0)
        if bool(there) != bool(back):
            return 0
        return pcie + 100 * there

    return [
        {"uuid": a, "score": {b: score(by_uuid[a], by_uuid[b]) for b in sorted(registered) if b != a}}
        for a in registered
    ]


def own_gpus(gpus: GpuFile) -> dict[str, Gpu]:
    """The GPUs as the plugin knows them (and registers them), for the Allocate procedure's checks."""
    return {
        entry["id"]: Gpu(
            entry["id"], entry["type"], entry["devmem"], entry["devcore"], entry["count"], entry["mode"],
            tuple(MigProfile(p["name"], p["memoryMB"], p["core"], frozenset((s["start"], s["size"]) for s in
                  p["placements"])) for p in entry.get("migProfiles", ())),
        )
        for entry in registration(gpus)
    }  # fmt: skip


class HamiDouble:
    """HAMi's plugin on one node. Mutable: the registration loop of the current start, the last text written."""

    socket_name = SOCKET
    retry_after: float | None = 30.0

    def __init__(
        self, api: KubeApi, node: str, gpus: GpuFile, recorder: Recorder, refuse: frozenset[str], strict: bool = False
    ) -> None:
        self.api = api
        self.node = node
        self.gpus = gpus
        self.recorder = recorder
        self.mig = gpus.hami.operating_mode == MIG_MODE
        self.allocator = HamiAllocator(
            api.call, strict=strict, own_gpus=own_gpus(gpus), mig=self.mig,
            align=gpus.hami.enable_preferred_allocation, reconcile_mig=True,
        )  # fmt: skip
        self.allocator.refuse.update({name: "refused on purpose" for name in refuse})
        self.by_uuid = {gpu.uuid: gpu for gpu in gpus.gpus}
        self.register_every = REGISTER_EVERY
        self.registered_annotation = asyncio.Event()
        """Set each time the registration is patched onto the Node (tests wait on it)."""
        self._written = ""
        self._loop: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()

    # ---- lifecycle ---------------------------------------------------------------------------------------------

    def register_request(self) -> RegisterRequest:
        return RegisterRequest(
            VERSION, SOCKET, GPU, Options(get_preferred_allocation_available=self.gpus.hami.enable_preferred_allocation)
        )

    async def before_serving(self) -> None:
        self._written = ""  # a new plugin object each start: its deviceCache is empty

    async def after_registering(self) -> None:
        self._loop = asyncio.create_task(self._register_loop())

    async def stopped(self) -> None:
        if self._loop is not None:
            self._loop.cancel()
            await asyncio.gather(self._loop, return_exceptions=True)
            self._loop = None

    async def _register_loop(self) -> None:
        while True:
            try:
                await self.register_in_annotation()
                await asyncio.sleep(self.register_every)
            except ApiError as error:
                log.error("register annotation on %s: %s; retrying in %.0f s", self.node, error, RETRY_REGISTER)
                await asyncio.sleep(RETRY_REGISTER)

    async def register_in_annotation(self) -> bool:
        listed = registration(self.gpus)
        text = orjson.dumps(listed).decode()
        if text == self._written:
            return False
        annotations = {REGISTER: text}
        if self.gpus.hami.topology_score:
            annotations[SCORE] = orjson.dumps(pair_scores(self.gpus, [entry["id"] for entry in listed])).decode()
        await self.api.call("PATCH", f"/api/v1/nodes/{self.node}", {"metadata": {"annotations": annotations}})
        self._written = text
        log.info("node %s: %s patched with %d GPUs", self.node, REGISTER, len(listed))
        self.registered_annotation.set()
        return True

    # ---- kubelet's API -----------------------------------------------------------------------------------------

    def options(self) -> Options:
        return Options(get_preferred_allocation_available=True)

    async def list_and_watch(self) -> AsyncIterator[list[KubeletDevice]]:
        yield [
            KubeletDevice(f"{gpu.uuid}-{i}", HEALTHY if gpu.healthy else UNHEALTHY)
            for gpu in self.gpus.gpus
            for i in range(self.gpus.hami.split_count)
        ]
        await asyncio.Event().wait()  # no NVML health events here

    async def preferred(self, requests: list[PreferredRequest]) -> list[list[str]]:
        entries: list[list[Device]] = []
        try:
            pod, _, _ = await self.allocator.pending_pod(self.node)
            entries = decode_entries(str((pod["metadata"].get("annotations") or {}).get(TO_ALLOCATE) or ""))
        except (CallFailed, ApiError, ValueError):
            pass
        wanted = [entry for entry in entries if entry]
        chosen = []
        for number, request in enumerate(requests):
            if number < len(wanted):
                picked = select_preferred(request, wanted[number])
                if picked is not None:
                    chosen.append(picked)
        return chosen

    async def allocate(self, requests: list[list[str]]) -> list[ContainerAllocation]:
        async with self._lock:
            try:
                served = await self.allocator.allocate(self.node, requests)
            except CallFailed as failure:
                self._record_refusal(requests, failure.pod, failure.reason, failure.found_by)
                raise AllocateError(failure.reason) from None
            except ApiError as error:
                self._record_refusal(requests, None, str(error), "")
                raise AllocateError(str(error)) from None
        answers = []
        meta = served.pod["metadata"]
        for ids, given in zip(requests, served.given, strict=True):
            envs = {"NVIDIA_VISIBLE_DEVICES": ",".join(given.visible)}
            if not self.mig:
                envs |= self._hami_core(given.devices)
            answers.append(ContainerAllocation(envs))
            gpus = tuple(
                GivenGpu(self.by_uuid[d.uuid].index if d.uuid in self.by_uuid else None, d.uuid, d.memory, d.cores)
                for d in given.devices
            )
            self.recorder.write(
                AllocateRecord(
                    "hami", self.node, pod_key(served.pod), meta["uid"], given.container, tuple(ids), gpus,
                    envs["NVIDIA_VISIBLE_DEVICES"], True, "", served.found_by, given.findings,
                )
            )  # fmt: skip
            log.info(
                "Allocate %s/%s on %s (found by %s): %s%s", pod_key(served.pod), given.container, self.node,
                served.found_by, given.entry, f"; findings: {'; '.join(given.findings)}" if given.findings else "",
            )  # fmt: skip
        return answers

    def _hami_core(self, devices: tuple[Device, ...]) -> dict[str, str]:
        settings = self.gpus.hami
        envs = {f"CUDA_DEVICE_MEMORY_LIMIT_{i}": f"{device.memory}m" for i, device in enumerate(devices)}
        envs["CUDA_DEVICE_SM_LIMIT"] = str(devices[0].cores)
        envs["CUDA_DEVICE_MEMORY_SHARED_CACHE"] = f"{settings.hook_path}/vgpu/{uuid.uuid4()}.cache"
        if settings.memory_scaling > 1:
            envs["CUDA_OVERSUBSCRIBE"] = "true"
        if settings.lib_cuda_log_level:
            envs["LIBCUDA_LOG_LEVEL"] = settings.lib_cuda_log_level
        if settings.disable_core_limit:
            envs["GPU_CORE_UTILIZATION_POLICY"] = "disable"
        return envs

    def _record_refusal(self, requests: list[list[str]], pod: dict[str, Any] | None, reason: str, how: str) -> None:
        ids = tuple(id_ for request in requests for id_ in request)
        uid = pod["metadata"]["uid"] if pod else None
        name = pod_key(pod) if pod else None
        self.recorder.write(AllocateRecord("hami", self.node, name, uid, None, ids, (), None, False, reason, how))
        log.warning("Allocate refused on %s: pod %s: %s", self.node, name or "none", reason)


def select_preferred(request: PreferredRequest, desired: list[Device]) -> list[str] | None:
    """selectPreferredDeviceIDsFromAnnotatedDevices (plug/server.go:671-713); None where it errs."""
    if len(desired) < request.size:
        return None
    required = set(request.must_include)
    required_by_gpu: dict[str, int] = {}
    for id_ in request.must_include:
        required_by_gpu[physical_device_id(id_)] = required_by_gpu.get(physical_device_id(id_), 0) + 1
    selected = list(request.must_include)
    available_by_gpu: dict[str, list[str]] = {}
    for id_ in request.available:
        if id_ not in required:
            available_by_gpu.setdefault(physical_device_id(id_), []).append(id_)
    for device in desired[: request.size]:
        gpu = physical_device_id(device.uuid)
        if required_by_gpu.get(gpu, 0) > 0:
            required_by_gpu[gpu] -= 1
            continue
        candidates = available_by_gpu.get(gpu) or []
        if not candidates:
            return None
        selected.append(candidates.pop(0))
    return selected if len(selected) == request.size else None
