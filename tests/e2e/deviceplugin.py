"""A stand-in for HAMi's device plugin (v2.10.0) on the e2e tier's nodes: what its `Allocate` does to the API
objects, so the node-lock protocol between the extender and the plugin runs end to end against a real
kube-apiserver.

What it stands for (tests/fixtures/hami/NOTES.md §5-6; `plug/` = pkg/device-plugin/nvidiadevice/nvinternal/plugin/):
- **kubelet's admission.** A pod bound to a node is admitted by that node's kubelet, one pod at a time, `delay`
  seconds after the binding shows in the API (the pod's sync and admission; configurable). kubelet calls the
  plugin's `Allocate` once per container that asks `nvidia.com/gpu`, init containers first, in spec order, with as
  many device IDs as the container asks; the first failing call rejects the pod (no further calls).
- **`Allocate`** (`plug/server.go:747-912`), one call at a time per node (HAMi's `applyMutex`), as
  `devtools/deviceplugin/hami_allocate.py` does it and cites it rule by rule: the pod the node's lock names (else the
  first pending pod awaiting its GPUs), its next non-empty entry of `hami.io/vgpu-devices-to-allocate` popped and
  erased (`;;` for a one-container pod), `hami.io/bind-phase: success` and the lock released (owner check, 5 tries)
  when no `NVIDIA` entry is left, `failed` and the lock released on any failure.
- **MIG** (`--operatingmode mig`: here, a node whose registration has a GPU of `"mode":"mig"`), in the same call,
  before the entry is erased (`GetContainerDeviceStrArray`, `plug/util.go:291-360`): the container's reservations
  in `hami.io/vgpu-mig-allocations` (its index counted init containers first; one per GPU of the entry, in
  deviceIndex order, naming the entry's GPUs), each instance made as reserved, the profile and placement among the
  GPU's registered ones (`migProfiles`, read from the same NVML calls, `plug/register.go:209-254`), none
  overlapping an instance made for a pod that still exists (NVML refuses the overlap, and a repeat of a live
  instance's profile and placement is handed that instance, `migmgr.go:338-343`, two pods on one instance: both
  count as an overlap); here an instance goes when its pod is deleted or finishes, or when its allocation is
  refused (a terminating pod keeps it; the real plugin drops instances no live pod names before each call and every
  5 s, `plug/util.go:334-336`, `plug/server.go:341-345,358-378`); then the instances' runtime identity written back
  with the pod's resourceVersion (`annotateMigRuntimeInfo`, `plug/server.go:380-423`: a 409 fails the call). A
  failing step refuses the pod as any failure does, and is recorded in `mig_findings`.

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

The protocol's codecs and the `Allocate` procedure are shared with the node's double that a real kubelet calls
(`python -m devtools.deviceplugin --protocol hami`); this module keeps kubelet's side, simulated, and the records.
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

from devtools.deviceplugin.hami_allocate import CallFailed, HamiAllocator
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
    Device,
    Gpu,
    MigFinding,
    MigInstance,
    MigProfile,
    Reservation,
    decode_entries,
    decode_reservations,
    encode_entries,
    encode_reservations,
    lock_holder,
    pod_key,
    registered_gpus,
)
from tests.e2e.controlplane import ApiError, ControlPlane

__all__ = [
    "ALLOCATED",
    "BIND_PHASE",
    "BIND_TIME",
    "GPU",
    "LOCK",
    "MIG_ALLOCATIONS",
    "REGISTER",
    "TO_ALLOCATE",
    "VGPU_NODE",
    "Allocation",
    "CallFailed",
    "Device",
    "DevicePluginDouble",
    "Gpu",
    "MigFinding",
    "MigInstance",
    "MigProfile",
    "Reservation",
    "Stats",
    "decode_entries",
    "decode_reservations",
    "encode_entries",
    "encode_reservations",
    "gpu_calls",
    "lock_holder",
    "pod_key",
    "registered_gpus",
]

log = logging.getLogger(__name__)

Obj = dict[str, Any]


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
        self.allocator = HamiAllocator(self._call, strict=True, violations=self.violations)
        """HAMi's Allocate procedure (devtools/deviceplugin/hami_allocate.py), checking entries strictly."""
        self.refuse: dict[str, str] = self.allocator.refuse
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

    @property
    def mig_instances(self) -> dict[str, list[MigInstance]]:
        """MIG nodes: per GPU UUID, the instances made and not yet released."""
        return self.allocator.mig.instances

    @property
    def mig_findings(self) -> list[MigFinding]:
        """Every MIG check that refused an allocation."""
        return self.allocator.mig.findings

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
            self.allocator.mig.release(uid)
            return
        self._pods[uid] = pod
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            self.allocator.mig.release(uid)
        if uid in self._admitted or meta.get("deletionTimestamp") or not gpu_calls(pod):
            return
        self._admitted.add(uid)
        if initial:
            self.allocator.mig.adopt(pod)
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
                served = await self.allocator.allocate(node, [[f"{GPU}-{number}" for number in range(count)]])
            except CallFailed as failure:
                if failure.pod is None and failure.gone in ("", pod_key(current)) and not await self._live(current):
                    return  # deleted while kubelet admitted it: its Allocate fails, and nothing needs the answer
                if failure.pod is not None:
                    self._check_found(node, current, failure.pod, failure.found_by)
                reason = failure.reason
                if failure.found_by:
                    found_by.append(failure.found_by)
                break
            self._check_found(node, current, served.pod, served.found_by)
            entries.append(served.given[0].entry)
            found_by.append(served.found_by)
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

    def _check_found(self, node: str, admitted: Obj, found: Obj, how: str) -> None:
        """The plugin found another pod than the one kubelet admits: on a real node, one pod's GPUs given to another's
        containers."""
        if found["metadata"]["uid"] != admitted["metadata"]["uid"]:
            self.violations.append(
                f"kubelet on {node} admitted {pod_key(admitted)} but the plugin found {pod_key(found)} by {how}"
            )
