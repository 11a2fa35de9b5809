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

What it checks on top, where the real plugin trusts the scheduler (this is "an allocation HAMi's device plugin would
accept for that node"): each GPU of the entry is registered on the node (UUID in `hami.io/node-nvidia-register`),
and its memory and compute are within that GPU's `devmem` and `devcore`; an entry that fails is refused as the
plugin refuses (bind-phase failed, lock released), with the reason recorded. `refuse` makes it refuse named pods on
purpose, as a plugin that cannot allocate does (a GPU lost from NVML, a count mismatch).

What it records, for the tests: every allocation accepted or refused (the pod kubelet admitted, how each call
found its pod, the entries it gave, the time from the binding to the end of the allocation), every lock
seen on the nodes and how long it was held, and `violations`: the plugin finding a lock (or, without one, a pod)
other than the pod kubelet admits, which on a real node gives one pod's GPUs to another's containers; and a pod
bound to a node while another pod there is still `allocating` (the lock did not serialise the two).

What it leaves out: no kubelet (pods stay Pending: nothing runs them, and a refused pod is not failed by kubelet
with UnexpectedAdmissionError, so a test sees what `bind-phase: failed` alone does), no containers, no NVML, no
HAMi-core (no CUDA_DEVICE_MEMORY_LIMIT / SM_LIMIT envs or mounts), no MIG, no GetPreferredAllocation, no
registration loop (the tests write each node's registration once), no handshake. Pods already bound when it starts
are not admitted (kubelet's checkpoint has them).

Like controlplane.py it never imports `extender`: it is HAMi's side of the protocol, written independently.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import statistics
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
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
GPU = "nvidia.com/gpu"
VENDOR = "NVIDIA"
"""The plugin's "anything left to allocate?" test: the value still names this common word (`plug/util.go:371`)."""
RETRIES = 5
"""HAMi's nodelock DefaultStrategy: 5 steps."""


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
    """count: the split count."""


def registered_gpus(node: Obj) -> dict[str, Gpu]:
    """The GPUs of `hami.io/node-nvidia-register` (HAMi v2.8+ JSON), by UUID; {} when absent or unreadable."""
    text = ((node.get("metadata") or {}).get("annotations") or {}).get(REGISTER)
    try:
        listed = orjson.loads(text) if isinstance(text, str) else []
    except orjson.JSONDecodeError:
        return {}
    return {
        str(gpu["id"]): Gpu(str(gpu["id"]), str(gpu.get("type", "")), gpu.get("devmem", 0), gpu.get("devcore", 0),
                            gpu.get("count", 0))
        for gpu in listed if isinstance(gpu, dict) and gpu.get("id")
    }  # fmt: skip


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

    def __init__(self, reason: str, pod: Obj | None, found_by: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.pod = pod
        self.found_by = found_by


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
        """List then watch `path` for ever (relisting after a 410 or a dropped watch), each object to `handle`."""
        while True:
            try:
                listed = await self._call("GET", path)
                for item in listed["items"]:
                    handle("ADDED", item, initial=True)
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
                            break
                        if event["type"] != "BOOKMARK":
                            handle(event["type"], event["object"], initial=False)
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
            return
        self._pods[uid] = pod
        if uid in self._admitted or meta.get("deletionTimestamp") or not gpu_calls(pod):
            return
        self._admitted.add(uid)
        if initial:
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
        try:
            current = await self._call("GET", f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}")
        except ApiError as error:
            if error.status == 404:
                return  # deleted before kubelet got to it
            raise
        if current["metadata"]["uid"] != meta["uid"] or current["metadata"].get("deletionTimestamp"):
            return
        entries: list[str] = []
        found_by: list[str] = []
        reason = ""
        for count in gpu_calls(current):
            try:
                entry, how = await self._allocate(node, current, count)
            except CallFailed as failure:
                reason = failure.reason
                if failure.found_by:
                    found_by.append(failure.found_by)
                if failure.pod is not None:
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
        refusal = self.refuse.get(pending["metadata"]["name"])
        if refusal is not None:
            raise CallFailed(refusal, pending, how)
        given = encode_entries([devices])[:-1]
        entries[position] = []
        path = f"/api/v1/namespaces/{pending['metadata']['namespace']}/pods/{pending['metadata']['name']}"
        await self._call("PATCH", path, {"metadata": {"annotations": {TO_ALLOCATE: encode_entries(entries)}}})
        after = await self._call("GET", path)
        if VENDOR not in str((after["metadata"].get("annotations") or {}).get(TO_ALLOCATE) or ""):
            await self._call("PATCH", path, {"metadata": {"annotations": {BIND_PHASE: "success"}}})
            await self._release(node, pending)
        return given, how

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
                    raise CallFailed(f"the lock on {node} names {namespace}/{name}, which is gone", None) from None
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
