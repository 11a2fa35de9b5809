"""A stand-in for HAMi's device plugin (v2.10.0) on the e2e tier's nodes: what its `Allocate` does to the API
objects, so the node-lock protocol between the extender and the plugin runs end to end against a real
kube-apiserver.

What it stands for (tests/fixtures/hami/NOTES.md §5-6; `plug/` = pkg/device-plugin/nvidiadevice/nvinternal/plugin/):
- **kubelet's admission.** A pod bound to a node is admitted by that node's kubelet, one pod at a time, `delay`
  seconds after the binding shows in the API (the pod's sync and admission; configurable). kubelet calls the
  plugin's `Allocate` once per container that asks `nvidia.com/gpu`, init containers first, in spec order, with as
  many device IDs as the container asks; the first failing call rejects the pod (no further calls).
- **`Allocate`** (`plug/server.go:747-912`), one call at a time per node (HAMi's `applyMutex`):
  1. find the pod (`util.GetPendingPod`, `pkg/util/util.go:76-137`): the pod named by the node's
     `hami.io/mutex.lock`, with no other check (NotFound: the call fails and nothing is patched); without a lock,
     the first pod with `spec.nodeName` = node, phase Pending, `hami.io/bind-time` present, `hami.io/bind-phase`
     allocating or success and `hami.io/vgpu-node` = node;
  2. decode `hami.io/vgpu-devices-to-allocate` and pop its next non-empty container entry (`popNextContainerDevices`,
     `plug/util.go:112`); its device count must equal kubelet's ("device number not matched");
  3. patch the value with that entry erased (`patchErasedAnnotation`, `plug/util.go:134`: `;;` for a one-container
     pod, one more `;` per round trip on others);
  4. when no `NVIDIA` entry is left (`PodAllocationTrySuccess`, `plug/util.go:371-405`): `hami.io/bind-phase:
     success`, then release the lock with the owner check (`ReleaseNodeLock`, `pkg/util/nodelock/nodelock.go:175`:
     a lock naming another pod is left alone; a merge patch `"hami.io/mutex.lock": null` carrying the node's
     resourceVersion, read again and retried on 409, 5 tries);
  5. on any failure (`PodAllocationFailed`, `plug/util.go:407`): `hami.io/bind-phase: failed` and the lock released
     the same way; `…-to-allocate` is left as it was.
- **MIG** (`--operatingmode mig`: here, a node whose registration has a GPU of `"mode":"mig"`), in the same call,
  before the entry is erased (`GetContainerDeviceStrArray`, `plug/util.go:291-360`; `migmgr.go` = `plug/migmgr.go`):
  1. the container: the one at the popped entry's position, init containers first (`popNextContainerDevices`,
     `plug/util.go:112-128`), its index found again by its name (`plug/util.go:302-318`); so the index is the
     entry's position among the GPU containers, as HAMi's scheduler numbers them (`EncodeMigAllocations` over the
     compact entries, `pkg/device/nvidia/mig_allocations.go:48-77`);
  2. `hami.io/vgpu-mig-allocations` decoded by `DecodeMigAllocations` (`mig_allocations.go:79-112`: absent is
     none; an incomplete reservation, a partial runtime identity or a repeated (containerIndex, deviceIndex) fails
     the call), the container's reservations sorted by deviceIndex, as many as the entry has GPUs ("container %s
     has %d MIG reservations, requested %d devices", `plug/util.go:320-333`), reservation i naming the entry's GPU
     i (`plug/util.go:351-353`);
  3. each instance made as reserved (`EnsureAllocation`, `migmgr.go:332-383`), which checks the placement
     against NVML's possible placements for the profile (`:362-379`): here, the profile must be one the GPU
     registered (`migProfiles`, which the plugin reads from the same NVML calls, `plug/register.go:209-254`) with
     that exact placement among its placements; NVML refuses an instance that overlaps one already on the GPU
     (`CreateGpuInstanceWithPlacement`, `:380-383`), and a reservation repeating a live instance's profile and
     placement is handed that instance (`:338-343`, two pods on one instance): both count here as an overlap
     with the instances it made for pods that still exist (the real plugin drops the instances no live pod's
     reservations name, deleted, terminating or finished, before each call and every 5 s, `plug/util.go:334-336`,
     `plug/server.go:341-345,358-378`; here an instance goes when its pod is deleted or finishes, or when its
     allocation is refused: a terminating pod keeps it);
  4. the instances' runtime identity written back into the reservations (`migUUID`, `gpuInstanceID`,
     `computeInstanceID`: `annotateMigRuntimeInfo`, `plug/server.go:380-423`, a merge patch carrying the pod's
     resourceVersion, so a 409 fails the call).
  A failing step refuses the pod as any failure does, and is recorded in `mig_findings`.

What it checks on top, where the real plugin trusts the scheduler (this is "an allocation HAMi's device plugin would
accept for that node"): each GPU of the entry is registered on the node (UUID in `hami.io/node-nvidia-register`),
and its memory and compute are within that GPU's `devmem` and `devcore`; on a MIG node, the profile, by its full
name, and the placement among the GPU's registered ones (the real plugin resolves a profile by its slice count
alone, `1g.20gb` as `1g`, `migmgr.go:349-353`, and checks the placement against that NVML profile's).
An entry that fails is refused as the plugin refuses (bind-phase failed, lock released), with the reason recorded;
a pod deleted between kubelet's admission and its Allocate is dropped, not counted as refused (`_live`).
`refuse` makes it refuse named pods on purpose, as a plugin that cannot allocate does (a GPU lost from NVML, a count
mismatch).

What it records, for the tests: every allocation accepted or refused (the pod kubelet admitted, how each call
found its pod, the entries it gave, the time from the binding to the end of the allocation), every lock
seen on the nodes and how long it was held, and `violations`: the plugin finding a lock (or, without one, a pod)
other than the pod kubelet admits, which on a real node gives one pod's GPUs to another's containers; and a pod
bound to a node while another pod there is still `allocating` (the lock did not serialise the two). On MIG nodes:
`mig_instances`, per GPU the instances made and not yet released (pod, container, profile, placement), and
`mig_findings`, every MIG check that refused an allocation, by kind (`mig_overlaps`: the placements that cut an
instance a live pod holds, which on a real node fail the pod or give two pods one instance).

What it leaves out: no kubelet (pods stay Pending: nothing runs them, and a refused pod is not failed by kubelet
with UnexpectedAdmissionError, so a test sees what `bind-phase: failed` alone does), no containers, no NVML, no
HAMi-core (no CUDA_DEVICE_MEMORY_LIMIT / SM_LIMIT envs or mounts), no GetPreferredAllocation, no registration loop
(the tests write each node's registration once), no handshake; on MIG nodes no GPU reset at start, no MIG devices
(kubelet's `MIG-` device IDs), and no rollback of a refused call's instances one by one (all of the pod's go at
once). Pods already bound when it starts are not admitted (kubelet's checkpoint has them); the MIG instances their
reservations name with a runtime identity are taken as made (`primeMigManagerFromAnnotations`,
`plug/server.go:447-484`).

Like controlplane.py it never imports `extender`: it is HAMi's side of the protocol, written independently.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import statistics
import time
import uuid
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import aiohttp
import orjson

from tests.e2e.controlplane import ApiError, ControlPlane

log = logging.getLogger(__name__)

Obj = dict[str, Any]

LOCK = "hami.io/mutex.lock"
REGISTER = "hami.io/node-nvidia-register"
TO_ALLOCATE = "hami.io/vgpu-devices-to-allocate"
ALLOCATED = "hami.io/vgpu-devices-allocated"
BIND_PHASE = "hami.io/bind-phase"
BIND_TIME = "hami.io/bind-time"
VGPU_NODE = "hami.io/vgpu-node"
MIG_ALLOCATIONS = "hami.io/vgpu-mig-allocations"
MIG_MODE = "mig"
"""A GPU's `mode` when its plugin runs in MIG mode (`nvidia.MigMode`)."""
GPU = "nvidia.com/gpu"
VENDOR = "NVIDIA"
"""The plugin's "anything left to allocate?" test: the value still names this common word (`plug/util.go:371`)."""
RETRIES = 5
"""HAMi's nodelock DefaultStrategy: 5 steps."""


@dataclass(frozen=True, slots=True)
class MigProfile:
    """One profile a MIG-mode GPU registers (`migProfiles`, `pkg/device/devices.go:79-90`)."""

    name: str
    memory: int
    """memoryMB."""
    cores: int
    """core: % of the GPU's compute."""
    placements: frozenset[tuple[int, int]]
    """(start, size) of each placement NVML allows it."""


@dataclass(frozen=True, slots=True)
class Gpu:
    """One GPU as the node's registration lists it."""

    uuid: str
    model: str
    memory: int
    """devmem, MiB."""
    cores: int
    """devcore, 100 a card."""
    slots: int
    """count: the split count (MIG: the most instances of any profile)."""
    mode: str = ""
    profiles: tuple[MigProfile, ...] = ()
    """MIG mode: what instances may be made, and where."""

    @property
    def mig(self) -> bool:
        return self.mode == MIG_MODE

    def profile(self, name: str) -> MigProfile | None:
        return next((profile for profile in self.profiles if profile.name == name), None)


def registered_gpus(node: Obj) -> dict[str, Gpu]:
    """The GPUs of `hami.io/node-nvidia-register` (HAMi v2.8+ JSON), by UUID; {} when absent or unreadable."""
    text = ((node.get("metadata") or {}).get("annotations") or {}).get(REGISTER)
    try:
        listed = orjson.loads(text) if isinstance(text, str) else []
        return {
            str(gpu["id"]): Gpu(str(gpu["id"]), str(gpu.get("type", "")), gpu.get("devmem", 0),
                                gpu.get("devcore", 0), gpu.get("count", 0), str(gpu.get("mode", "")),
                                tuple(_profile(entry) for entry in gpu.get("migProfiles") or ()))
            for gpu in listed if isinstance(gpu, dict) and gpu.get("id")
        }  # fmt: skip
    except (orjson.JSONDecodeError, AttributeError, TypeError, ValueError):
        return {}


def _profile(entry: Obj) -> MigProfile:
    placements = frozenset((int(spot["start"]), int(spot["size"])) for spot in entry.get("placements") or ())
    return MigProfile(str(entry["name"]), int(entry.get("memoryMB", 0)), int(entry.get("core", 0)), placements)


@dataclass(frozen=True, slots=True)
class Device:
    """One GPU of a container entry: `<uuid>,NVIDIA,<MiB>,<compute>:`."""

    uuid: str
    kind: str
    memory: int
    cores: int


def decode_entries(text: str) -> list[list[Device]]:
    """HAMi's DecodePodDevices for one vendor: per container (`;`-separated, empty ones kept), its devices
    (`:`-separated). ValueError when a device is not `uuid,type,memory,cores` with whole numbers."""
    entries = []
    for entry in text.split(";"):
        devices = []
        for part in entry.split(":"):
            if not part:
                continue
            fields = part.split(",")
            if len(fields) != 4 or not fields[0]:
                raise ValueError(f"device {part!r}: expected uuid,type,memory,cores")
            devices.append(Device(fields[0], fields[1], int(fields[2]), int(fields[3])))
        entries.append(devices)
    return entries


def encode_entries(entries: list[list[Device]]) -> str:
    """HAMi's EncodePodSingleDevice: each device `uuid,type,mem,cores:`, each container followed by `;`."""
    return "".join("".join(f"{d.uuid},{d.kind},{d.memory},{d.cores}:" for d in devices) + ";" for devices in entries)


@dataclass(frozen=True, slots=True)
class Reservation:
    """One entry of `hami.io/vgpu-mig-allocations`: the instance to make on one GPU of one container
    (`MigAllocation`, `pkg/device/nvidia/mig_allocations.go:37-46`)."""

    container: int
    """containerIndex."""
    device: int
    """deviceIndex: the GPU's position in the container's entry."""
    gpu: str
    profile: str
    start: int
    size: int
    runtime: tuple[str, int, int] | None = None
    """(migUUID, gpuInstanceID, computeInstanceID) once the plugin has made it."""

    def cuts(self, start: int, size: int) -> bool:
        """Whether its placement overlaps (start, size) (`migPlacementsOverlap`,
        pkg/device/nvidia/mig_topology.go:78-80)."""
        return self.start < start + size and start < self.start + self.size


def _whole(entry: Obj, name: str, unsigned: bool = False) -> int:
    """A JSON number Go's decoder puts in an int (uint32 when `unsigned`); absent is 0."""
    value = entry.get(name, 0)
    if isinstance(value, bool) or not isinstance(value, int) or (unsigned and not 0 <= value < 2**32):
        raise ValueError(f"{name} {value!r} is not a whole number")
    return value


def _text(entry: Obj, name: str) -> str:
    value = entry.get(name, "")
    if not isinstance(value, str):
        raise ValueError(f"{name} {value!r} is not a string")
    return value


def decode_reservations(text: object) -> list[Reservation]:
    """HAMi's DecodeMigAllocations (`mig_allocations.go:79-112`): absent or "" is none; ValueError for what is not a
    JSON array of reservations, one incomplete (a negative index, no GPU, no profile, a placement of size 0), one
    with a partial runtime identity, or a second for the same (containerIndex, deviceIndex)."""
    if text is None or text == "":
        return []
    if not isinstance(text, str):
        raise ValueError("not a string")
    try:
        listed = orjson.loads(text)
    except orjson.JSONDecodeError as error:
        raise ValueError(f"not JSON: {error}") from None
    if listed is None:
        return []
    if not isinstance(listed, list):
        raise ValueError("not a JSON array")
    found: list[Reservation] = []
    for number, entry in enumerate(listed):
        placement = entry.get("placement") if isinstance(entry, dict) else None
        if not isinstance(entry, dict) or not isinstance(placement or {}, dict):
            raise ValueError(f"MIG allocation {number} is not an object")
        container, device = _whole(entry, "containerIndex"), _whole(entry, "deviceIndex")
        gpu, profile = _text(entry, "gpuUUID"), _text(entry, "profile")
        start, size = _whole(placement or {}, "start", True), _whole(placement or {}, "size", True)
        if container < 0 or device < 0 or not gpu or not profile or not size:
            raise ValueError(f"MIG allocation {number} is incomplete")
        mig_uuid = _text(entry, "migUUID")
        instance, compute = entry.get("gpuInstanceID"), entry.get("computeInstanceID")
        present = sum((bool(mig_uuid), instance is not None, compute is not None))
        if present not in (0, 3):
            raise ValueError(f"MIG allocation {number} has partial runtime identity")
        if any((known.container, known.device) == (container, device) for known in found):
            raise ValueError(f"duplicate MIG allocation for container {container} device {device}")
        runtime = None
        if present:
            runtime = (mig_uuid, _whole(entry, "gpuInstanceID", True), _whole(entry, "computeInstanceID", True))
        found.append(Reservation(container, device, gpu, profile, start, size, runtime))
    return found


def encode_reservations(reservations: Iterable[Reservation]) -> str:
    """What `json.Marshal` of HAMi's `[]MigAllocation` writes (runtime fields omitted until set)."""
    listed = []
    for reservation in reservations:
        entry: Obj = {
            "containerIndex": reservation.container,
            "deviceIndex": reservation.device,
            "gpuUUID": reservation.gpu,
            "profile": reservation.profile,
            "placement": {"start": reservation.start, "size": reservation.size},
        }
        if reservation.runtime is not None:
            mig_uuid, instance, compute = reservation.runtime
            entry |= {"migUUID": mig_uuid, "gpuInstanceID": instance, "computeInstanceID": compute}
        listed.append(entry)
    return orjson.dumps(listed).decode()


def container_at(pod: Obj, position: int) -> str | None:
    """The name of the container at `position`, init containers first (`popNextContainerDevices`), or None."""
    spec = pod.get("spec") or {}
    listed = [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]
    return str(listed[position].get("name")) if 0 <= position < len(listed) else None


def container_index(pod: Obj, name: str) -> int:
    """The container's index found by its name, init containers first (`plug/util.go:302-318`); -1: none."""
    spec = pod.get("spec") or {}
    listed = [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]
    return next((number for number, container in enumerate(listed) if container.get("name") == name), -1)


@dataclass(frozen=True, slots=True)
class MigInstance:
    """A MIG instance the plugin made on a GPU, held until its pod is deleted, finishes or is refused."""

    uid: str
    pod: str
    container: int
    profile: str
    start: int
    size: int
    runtime: tuple[str, int, int]
    """(migUUID, gpuInstanceID, computeInstanceID)."""


@dataclass(frozen=True, slots=True)
class MigFinding:
    """A MIG check that refused an allocation."""

    kind: str
    """"reservations" (unreadable, or not one per GPU of the container), "gpu" (naming another GPU than the
    entry's), "profile" (not a registered profile and placement of the GPU), "overlap" (cutting an instance a pod
    that still exists holds), "runtime" (its identity could not be written back)."""
    pod: str
    node: str
    reason: str


def gpu_calls(pod: Obj) -> list[int]:
    """kubelet's Allocate calls for the pod: the device count of each container asking nvidia.com/gpu, init
    containers first (limits, else requests, as kubelet reads extended resources)."""
    spec = pod.get("spec") or {}
    calls = []
    for container in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        resources = container.get("resources") or {}
        count = (resources.get("limits") or {}).get(GPU) or (resources.get("requests") or {}).get(GPU)
        if count and int(count) > 0:
            calls.append(int(count))
    return calls


def pod_key(pod: Obj) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace')}/{meta.get('name')}"


def lock_holder(value: str) -> tuple[str, str] | None:
    """(namespace, name) of a lock `<RFC3339>,<ns>,<name>`; None for a legacy bare time or a malformed value."""
    parts = value.split(",")
    return (parts[1], parts[2]) if len(parts) == 3 else None


@dataclass(frozen=True, slots=True)
class Allocation:
    """What the plugin did for one pod kubelet admitted."""

    pod: str
    """The pod kubelet admitted (`namespace/name`)."""
    uid: str
    node: str
    accepted: bool
    reason: str
    """Why it was refused ("" when accepted)."""
    entries: tuple[str, ...]
    """The container entries given, one per Allocate call, as the annotation wrote them."""
    found_by: tuple[str, ...]
    """How each call found its pod: "lock" or "search"."""
    bound_at: float
    """time.monotonic() when the double saw the pod bound."""
    done_at: float

    @property
    def latency(self) -> float:
        """From the binding (as the watch showed it) to the end of the allocation."""
        return self.done_at - self.bound_at


class CallFailed(Exception):
    """One Allocate call failed: the pod found is marked failed (when one was found) and the lock released."""

    def __init__(self, reason: str, pod: Obj | None, found_by: str = "", gone: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.pod = pod
        self.found_by = found_by
        self.gone = gone
        """The pod (`namespace/name`) the node's lock named and the API no longer has, if that is why."""


@dataclass(slots=True)
class Stats:
    """Figures of the locks seen on the nodes. Mutable: filled as the watch goes."""

    taken: int = 0
    held: list[float] = field(default_factory=list)
    """Seconds each released lock was held, from its appearance to its removal (as the node watch showed them)."""

    def summary(self) -> str:
        if not self.held:
            return f"{self.taken} locks taken, none released"
        held = sorted(self.held)
        return (
            f"{self.taken} locks taken; held median {statistics.median(held) * 1000:.0f} ms, "
            f"p90 {held[int(0.9 * (len(held) - 1))] * 1000:.0f} ms, max {held[-1] * 1000:.0f} ms"
        )


class DevicePluginDouble:
    """HAMi's device plugin (and kubelet's admission calls to it) on `nodes`. Mutable: started, paused, stopped;
    its records grow. Runs on the test's event loop: `async with plugin.running(): ...`."""

    def __init__(self, control_plane: ControlPlane, nodes: Iterable[str], delay: float = 0.25) -> None:
        self.control_plane = control_plane
        self.nodes = frozenset(nodes)
        self.delay = delay
        """Seconds from a binding to kubelet's first Allocate call for the pod (its sync and admission)."""
        self.allocations: list[Allocation] = []
        self.violations: list[str] = []
        self.locks = Stats()
        self.refuse: dict[str, str] = {}
        """Pod names whose allocation the plugin refuses on purpose, with the reason it gives."""
        self.mig_instances: dict[str, list[MigInstance]] = {}
        """MIG nodes: per GPU UUID, the instances made and not yet released."""
        self.mig_findings: list[MigFinding] = []
        self._instance_ids = itertools.count(1)
        self._open = asyncio.Event()
        self._open.set()
        self._queues: dict[str, asyncio.Queue[tuple[Obj, float]]] = {node: asyncio.Queue() for node in self.nodes}
        self._admitted: set[str] = set()
        self._pods: dict[str, Obj] = {}
        """Every pod on our nodes, as the watch shows it, by UID."""
        self._lock_seen: dict[str, tuple[str, float]] = {}
        self._session: aiohttp.ClientSession | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._token = control_plane.users["admin"].token

    # ---- lifecycle -------------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[DevicePluginDouble]:
        connector = aiohttp.TCPConnector(ssl=self.control_plane.ssl_context)
        async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=30)) as session:
            self._session = session
            pods_ready, nodes_ready = asyncio.Event(), asyncio.Event()
            self._tasks = [
                asyncio.create_task(self._follow("/api/v1/pods", self._pod_event, pods_ready)),
                asyncio.create_task(self._follow("/api/v1/nodes", self._node_event, nodes_ready)),
                *(asyncio.create_task(self._kubelet(node)) for node in sorted(self.nodes)),
            ]
            try:
                await asyncio.wait_for(asyncio.gather(pods_ready.wait(), nodes_ready.wait()), 30)
                yield self
            finally:
                for task in self._tasks:
                    task.cancel()
                await asyncio.gather(*self._tasks, return_exceptions=True)
                self._session = None

    def pause(self) -> None:
        """Hold every allocation not yet begun (a kubelet that is slow to admit): the locks stay held."""
        self._open.clear()

    def resume(self) -> None:
        self._open.set()

    # ---- what it did -----------------------------------------------------------------------------------

    def admitted(self, uid: str) -> bool:
        """Whether kubelet has admitted the pod: its allocation is recorded, accepted or refused."""
        return any(allocation.uid == uid for allocation in self.allocations)

    @property
    def accepted(self) -> list[Allocation]:
        return [allocation for allocation in self.allocations if allocation.accepted]

    @property
    def refused(self) -> list[Allocation]:
        return [allocation for allocation in self.allocations if not allocation.accepted]

    @property
    def mig_overlaps(self) -> list[MigFinding]:
        """The reservations refused because they cut an instance a live pod holds."""
        return [finding for finding in self.mig_findings if finding.kind == "overlap"]

    def latency_summary(self) -> str:
        """Binding to allocation, over the accepted allocations."""
        latencies = sorted(allocation.latency for allocation in self.accepted)
        if not latencies:
            return "no allocation"
        return (
            f"{len(latencies)} allocations, binding to allocation median {statistics.median(latencies) * 1000:.0f} "
            f"ms, p90 {latencies[int(0.9 * (len(latencies) - 1))] * 1000:.0f} ms, max {latencies[-1] * 1000:.0f} ms "
            f"(kubelet delay {self.delay * 1000:.0f} ms)"
        )

    # ---- the API ---------------------------------------------------------------------------------------

    def _headers(self, content_type: str | None = None) -> dict[str, str]:
        headers = {"Accept": "application/json", "Authorization": f"Bearer {self._token}"}
        if content_type:
            headers["Content-Type"] = content_type
        return headers

    async def _call(self, method: str, path: str, body: Obj | None = None) -> Obj:
        assert self._session is not None
        content_type = "application/merge-patch+json" if method == "PATCH" else None
        data = orjson.dumps(body) if body is not None else None
        async with self._session.request(
            method, self.control_plane.url + path, data=data, headers=self._headers(content_type)
        ) as answer:
            raw = await answer.read()
            if answer.status >= 300:
                raise ApiError(method, path, answer.status, raw)
            return dict(orjson.loads(raw or b"{}"))

    async def _follow(self, path: str, handle: Any, ready: asyncio.Event) -> None:
        """List then watch `path` for ever (relisting after an ERROR event, such as a 410 or an API server whose
        watch cache lags, or a dropped watch), each object to `handle`. Only the first list is what the plugin
        finds at its start (`initial`: bound before it, kubelet's checkpoint has them); a relist is what changed
        while the watch was down, as an informer's replace: what it lists is handled as events (a pod bound in
        the gap is admitted, not adopted unallocated), and what it no longer lists as deleted."""
        known: dict[str, Obj] = {}
        while True:
            try:
                listed = await self._call("GET", path)
                listed_uids = {item["metadata"]["uid"] for item in listed["items"]}
                for uid in [uid for uid in known if uid not in listed_uids]:
                    handle("DELETED", known.pop(uid), initial=False)
                for item in listed["items"]:
                    known[item["metadata"]["uid"]] = item
                    handle("ADDED", item, initial=not ready.is_set())
                ready.set()
                version = listed["metadata"]["resourceVersion"]
                assert self._session is not None
                url = f"{self.control_plane.url}{path}?watch=1&allowWatchBookmarks=true&resourceVersion={version}"
                async with self._session.get(
                    url, headers=self._headers(), timeout=aiohttp.ClientTimeout(total=None, sock_read=None)
                ) as answer:
                    if answer.status >= 300:
                        raise ApiError("GET", path, answer.status, await answer.read())
                    async for line in answer.content:
                        if not line.strip():
                            continue
                        event = orjson.loads(line)
                        if event["type"] == "ERROR":
                            log.warning("device-plugin double: watch of %s ended: %s; relisting", path, event["object"])
                            break
                        if event["type"] != "BOOKMARK":
                            obj = event["object"]
                            if event["type"] == "DELETED":
                                known.pop(obj["metadata"]["uid"], None)
                            else:
                                known[obj["metadata"]["uid"]] = obj
                            handle(event["type"], obj, initial=False)
            except asyncio.CancelledError:
                raise
            except Exception as error:  # a dropped watch: list again, as an informer does
                log.warning("device-plugin double: watch of %s: %s; relisting", path, error)
            await asyncio.sleep(0.2)

    # ---- watching --------------------------------------------------------------------------------------

    def _node_event(self, kind: str, node: Obj, initial: bool) -> None:
        name = node["metadata"]["name"]
        if name not in self.nodes:
            return
        value = None if kind == "DELETED" else (node["metadata"].get("annotations") or {}).get(LOCK)
        seen = self._lock_seen.get(name)
        now = time.monotonic()
        if seen is not None and seen[0] != value:
            del self._lock_seen[name]
            if not initial:
                self.locks.held.append(now - seen[1])
        if value is not None and (seen is None or seen[0] != value):
            self._lock_seen[name] = (value, now)
            if not initial:
                self.locks.taken += 1

    def _pod_event(self, kind: str, pod: Obj, initial: bool) -> None:
        meta, spec = pod["metadata"], pod.get("spec") or {}
        uid, node = meta["uid"], spec.get("nodeName")
        if kind == "DELETED" or node not in self.nodes:
            self._pods.pop(uid, None)
            self._release_instances(uid)
            return
        self._pods[uid] = pod
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            self._release_instances(uid)
        if uid in self._admitted or meta.get("deletionTimestamp") or not gpu_calls(pod):
            return
        self._admitted.add(uid)
        if initial:
            self._adopt_instances(pod)
            return  # bound before the plugin started: kubelet's checkpoint has it
        others = [
            pod_key(other)
            for other in self._pods.values()
            if other["metadata"]["uid"] != uid
            and other["spec"].get("nodeName") == node
            and (other["metadata"].get("annotations") or {}).get(BIND_PHASE) == "allocating"
        ]
        if others:
            self.violations.append(
                f"{pod_key(pod)} bound to {node} while {', '.join(sorted(others))} still allocating there "
                f"(lock on the node as last seen: {self._lock_seen.get(node, ('none',))[0]})"
            )
        self._queues[node].put_nowait((pod, time.monotonic()))

    # ---- kubelet and Allocate --------------------------------------------------------------------------

    async def _kubelet(self, node: str) -> None:
        """Admit the pods bound to `node`, one at a time, each `delay` after its binding."""
        queue = self._queues[node]
        while True:
            pod, bound_at = await queue.get()
            await asyncio.sleep(max(0.0, bound_at + self.delay - time.monotonic()))
            await self._open.wait()
            try:
                await self._admit(node, pod, bound_at)
            except asyncio.CancelledError:
                raise
            except ApiError as error:
                if error.status == 404:
                    continue  # deleted while being admitted: kubelet drops it
                self.violations.append(f"the double failed on {pod_key(pod)} on {node}: {error}")
            except Exception as error:  # the API failed us: say so in the records, keep serving the node
                log.exception("device-plugin double: admitting %s on %s", pod_key(pod), node)
                self.violations.append(f"the double failed on {pod_key(pod)} on {node}: {error!r}")

    async def _admit(self, node: str, pod: Obj, bound_at: float) -> None:
        meta = pod["metadata"]
        current = await self._live(pod)
        if current is None:
            return  # deleted before kubelet got to it
        entries: list[str] = []
        found_by: list[str] = []
        reason = ""
        for count in gpu_calls(current):
            try:
                entry, how = await self._allocate(node, current, count)
            except CallFailed as failure:
                if failure.pod is None and failure.gone in ("", pod_key(current)) and not await self._live(current):
                    return  # deleted while kubelet admitted it: its Allocate fails, and nothing needs the answer
                reason = failure.reason
                if failure.found_by:
                    found_by.append(failure.found_by)
                if failure.pod is not None:
                    self._release_instances(failure.pod["metadata"]["uid"])
                    await self._fail(node, failure.pod, failure.reason)
                break
            entries.append(entry)
            found_by.append(how)
        self.allocations.append(
            Allocation(
                pod_key(current), meta["uid"], node, not reason, reason, tuple(entries), tuple(found_by), bound_at,
                time.monotonic(),
            )
        )  # fmt: skip

    async def _live(self, pod: Obj) -> Obj | None:
        """`pod` as the API has it now; None once it is deleted (or being deleted, or its name is another pod's). Read
        when kubelet admits the pod, and again when its Allocate found no pod to give the GPUs to. Under churn a pod
        can live a second: deleted between kubelet's admission and its Allocate, where HAMi's GetPendingPod then
        finds the lock naming that pod, gone, or no lock and no pod awaiting its GPUs. HAMi's Allocate fails there
        and leaves the lock (it does not release it when GetPendingPod fails, `nvinternal/plugin/server.go:757-761`
        at v2.10.0; the next LockNode takes it over as its pod is gone, `util/nodelock/nodelock.go:269-288`), as the
        double does, but no pod is refused: there is none. A lock naming another pod, gone, is still a refusal
        (the caller's check): the lock was not the admitted pod's."""
        meta = pod["metadata"]
        try:
            current = await self._call("GET", f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}")
        except ApiError as error:
            if error.status == 404:
                return None
            raise
        if current["metadata"]["uid"] != meta["uid"] or current["metadata"].get("deletionTimestamp"):
            return None
        return current

    async def _allocate(self, node: str, admitted: Obj, count: int) -> tuple[str, str]:
        """One Allocate call for `count` devices of a container of `admitted`; returns the entry given and how its
        pod was found. Raises CallFailed."""
        pending, how, gpus = await self._pending_pod(node)
        if pending["metadata"]["uid"] != admitted["metadata"]["uid"]:
            self.violations.append(
                f"kubelet on {node} admitted {pod_key(admitted)} but the plugin found {pod_key(pending)} by {how}"
            )
        annotations = pending["metadata"].get("annotations") or {}
        try:
            entries = decode_entries(str(annotations.get(TO_ALLOCATE) or ""))
        except ValueError as error:
            raise CallFailed(f"{TO_ALLOCATE} unreadable: {error}", pending, how) from None
        position = next((number for number, devices in enumerate(entries) if devices), None)
        if position is None:
            raise CallFailed("no devices left to allocate", pending, how)
        devices = entries[position]
        if len(devices) != count:
            raise CallFailed(
                f"device number not matched: kubelet asks {count}, the entry has {len(devices)}", pending, how
            )
        for device in devices:
            gpu = gpus.get(device.uuid)
            if gpu is None:
                raise CallFailed(f"GPU {device.uuid} is not registered on {node}", pending, how)
            if not 0 <= device.memory <= gpu.memory or not 0 <= device.cores <= gpu.cores:
                raise CallFailed(
                    f"{device.uuid}: {device.memory} MiB and {device.cores} % compute asked of {gpu.memory} MiB and "
                    f"{gpu.cores} %",
                    pending,
                    how,
                )
        mig = any(gpu.mig for gpu in gpus.values())
        reservations = self._mig_reservations(node, pending, position, devices, gpus, how) if mig else []
        refusal = self.refuse.get(pending["metadata"]["name"])
        if refusal is not None:
            raise CallFailed(refusal, pending, how)
        path = f"/api/v1/namespaces/{pending['metadata']['namespace']}/pods/{pending['metadata']['name']}"
        if mig:
            await self._make_instances(node, pending, reservations, path, how)
        given = encode_entries([devices])[:-1]
        entries[position] = []
        await self._call("PATCH", path, {"metadata": {"annotations": {TO_ALLOCATE: encode_entries(entries)}}})
        after = await self._call("GET", path)
        if VENDOR not in str((after["metadata"].get("annotations") or {}).get(TO_ALLOCATE) or ""):
            await self._call("PATCH", path, {"metadata": {"annotations": {BIND_PHASE: "success"}}})
            await self._release(node, pending)
        return given, how

    # ---- MIG -------------------------------------------------------------------------------------------

    def _mig_reservations(
        self, node: str, pod: Obj, position: int, devices: list[Device], gpus: dict[str, Gpu], how: str
    ) -> list[Reservation]:
        """The reservations of the container whose entry is at `position`, checked as GetContainerDeviceStrArray
        and EnsureAllocation check them (module docstring); raises CallFailed, recording the finding."""

        def refuse(kind: str, reason: str) -> CallFailed:
            self.mig_findings.append(MigFinding(kind, pod_key(pod), node, reason))
            return CallFailed(reason, pod, how)

        name = container_at(pod, position)
        if name is None:
            raise refuse("reservations", f"container index {position} out of range")
        index = container_index(pod, name)
        try:
            listed = decode_reservations((pod["metadata"].get("annotations") or {}).get(MIG_ALLOCATIONS))
        except ValueError as error:
            raise refuse("reservations", f"decode scheduler MIG allocations: {error}") from None
        mine = sorted((one for one in listed if one.container == index), key=lambda one: one.device)
        if len(mine) != len(devices):
            raise refuse(
                "reservations", f"container {name} has {len(mine)} MIG reservations, requested {len(devices)} devices"
            )
        made: list[Reservation] = []
        for reservation, device in zip(mine, devices, strict=True):
            if reservation.gpu != device.uuid:
                raise refuse("gpu", f"MIG reservation GPU {reservation.gpu} does not match allocated GPU {device.uuid}")
            gpu = gpus[device.uuid]
            profile = gpu.profile(reservation.profile)
            spot = (reservation.start, reservation.size)
            if profile is None or spot not in profile.placements:
                offered = sorted(profile.placements) if profile else sorted(known.name for known in gpu.profiles)
                raise refuse(
                    "profile",
                    f"scheduler selected invalid placement {spot} for profile {reservation.profile} on {gpu.uuid} "
                    f"(registered: {offered})",
                )
            held = [
                f"{instance.pod} {instance.profile} at {instance.start}+{instance.size}"
                for instance in self.mig_instances.get(gpu.uuid, ())
                if reservation.cuts(instance.start, instance.size)
            ]
            held += [
                f"{pod_key(pod)} {other.profile} at {other.start}+{other.size} (this call)"
                for other in made
                if other.gpu == gpu.uuid and reservation.cuts(other.start, other.size)
            ]
            if held:
                raise refuse(
                    "overlap",
                    f"{reservation.profile} at {reservation.start}+{reservation.size} on {gpu.uuid} overlaps "
                    f"{', '.join(held)}",
                )
            made.append(reservation)
        return made

    async def _make_instances(self, node: str, pod: Obj, made: list[Reservation], path: str, how: str) -> None:
        """Make the container's instances, then write every made instance's runtime identity into the pod's
        reservations with the pod's resourceVersion (annotateMigRuntimeInfo); a failed write fails the call."""
        uid = pod["metadata"]["uid"]
        for reservation in made:
            number = next(self._instance_ids)
            runtime = (f"MIG-{uuid.uuid5(uuid.NAMESPACE_URL, f'{reservation.gpu}/{number}')}", number, 0)
            self.mig_instances.setdefault(reservation.gpu, []).append(
                MigInstance(uid, pod_key(pod), reservation.container, reservation.profile, reservation.start,
                            reservation.size, runtime)
            )  # fmt: skip
        listed = decode_reservations((pod["metadata"].get("annotations") or {}).get(MIG_ALLOCATIONS))
        identified = []
        for reservation in listed:
            instance = next(
                (
                    one
                    for one in self.mig_instances.get(reservation.gpu, ())
                    if (one.profile, one.start, one.size) == (reservation.profile, reservation.start, reservation.size)
                ),
                None,
            )
            identified.append(replace(reservation, runtime=instance.runtime) if instance else reservation)
        patch = {
            "metadata": {
                "resourceVersion": pod["metadata"]["resourceVersion"],
                "annotations": {MIG_ALLOCATIONS: encode_reservations(identified)},
            }
        }
        try:
            await self._call("PATCH", path, patch)
        except ApiError as error:
            if error.status != 409:
                raise
            reason = f"record MIG runtime placement: {error}"
            self.mig_findings.append(MigFinding("runtime", pod_key(pod), node, reason))
            raise CallFailed(reason, pod, how) from None

    def _release_instances(self, uid: str) -> None:
        for gpu, instances in list(self.mig_instances.items()):
            kept = [instance for instance in instances if instance.uid != uid]
            if len(kept) != len(instances):
                self.mig_instances[gpu] = kept

    def _adopt_instances(self, pod: Obj) -> None:
        """The instances a pod bound before the plugin started holds: those its reservations give a runtime
        identity for (`primeMigManagerFromAnnotations`)."""
        uid = pod["metadata"]["uid"]
        annotations = pod["metadata"].get("annotations") or {}
        if annotations.get(BIND_PHASE) == "failed" or any(
            instance.uid == uid for instances in self.mig_instances.values() for instance in instances
        ):
            return
        with contextlib.suppress(ValueError):
            for reservation in decode_reservations(annotations.get(MIG_ALLOCATIONS)):
                if reservation.runtime is not None:
                    self.mig_instances.setdefault(reservation.gpu, []).append(
                        MigInstance(uid, pod_key(pod), reservation.container, reservation.profile,
                                    reservation.start, reservation.size, reservation.runtime)
                    )  # fmt: skip

    # ---- the pod and the lock --------------------------------------------------------------------------

    async def _pending_pod(self, node: str) -> tuple[Obj, str, dict[str, Gpu]]:
        """HAMi's GetPendingPod: the pod the lock names, else the first pending pod bound here that awaits its
        GPUs; with the node's registered GPUs."""
        current = await self._call("GET", f"/api/v1/nodes/{node}")
        gpus = registered_gpus(current)
        value = (current["metadata"].get("annotations") or {}).get(LOCK)
        holder = lock_holder(value) if value else None
        if holder is not None:
            namespace, name = holder
            try:
                return await self._call("GET", f"/api/v1/namespaces/{namespace}/pods/{name}"), "lock", gpus
            except ApiError as error:
                if error.status == 404:
                    raise CallFailed(
                        f"the lock on {node} names {namespace}/{name}, which is gone", None, gone=f"{namespace}/{name}"
                    ) from None
                raise
        listed = await self._call("GET", f"/api/v1/pods?fieldSelector=spec.nodeName%3D{node}")
        for pod in listed["items"]:
            annotations = pod["metadata"].get("annotations") or {}
            if (
                (pod.get("status") or {}).get("phase") == "Pending"
                and BIND_TIME in annotations
                and annotations.get(BIND_PHASE) in ("allocating", "success")
                and annotations.get(VGPU_NODE) == node
            ):
                return pod, "search", gpus
        raise CallFailed(f"no pod on {node} awaits its GPUs", None)

    async def _fail(self, node: str, pod: Obj, reason: str) -> None:
        """PodAllocationFailed: bind-phase failed, and the lock released (the reason goes to the records)."""
        path = f"/api/v1/namespaces/{pod['metadata']['namespace']}/pods/{pod['metadata']['name']}"
        await self._call("PATCH", path, {"metadata": {"annotations": {BIND_PHASE: "failed"}}})
        await self._release(node, pod)

    async def _release(self, node: str, pod: Obj) -> None:
        """ReleaseNodeLock with the owner check: a lock naming another pod stays; 409 reads the node again."""
        suffix = f",{pod['metadata']['namespace']},{pod['metadata']['name']}"
        for _ in range(RETRIES):
            current = await self._call("GET", f"/api/v1/nodes/{node}")
            value = (current["metadata"].get("annotations") or {}).get(LOCK)
            if not value or ("," in value and not value.endswith(suffix)):
                return
            patch = {
                "metadata": {"annotations": {LOCK: None}, "resourceVersion": current["metadata"]["resourceVersion"]}
            }
            try:
                await self._call("PATCH", f"/api/v1/nodes/{node}", patch)
                return
            except ApiError as error:
                if error.status != 409:
                    raise
        self.violations.append(f"could not release the lock on {node} for {pod_key(pod)} in {RETRIES} tries")
