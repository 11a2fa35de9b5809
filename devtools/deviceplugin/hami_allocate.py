"""What HAMi's device plugin (v2.10.0) does to the API objects at `Allocate`: find the pod, pop its container's entry,
check and make its MIG instances, erase the entry, and end the allocation (bind-phase, node lock). One procedure for
both doubles of the plugin: the e2e tier's (kubelet simulated, `tests/e2e/deviceplugin.py`) and the node's
(kubelet real, `devtools/deviceplugin/hami.py`), each giving it a way to call the API.

`plug/` = pkg/device-plugin/nvidiadevice/nvinternal/plugin/ at Project-HAMi/HAMi 4707fb02 (v2.10.0). The rules:
- one call at a time per node (`applyMutex`, plug/server.go:748-752): the caller holds it;
- the pod (`util.GetPendingPod`, pkg/util/util.go:76-137): the one the node's `hami.io/mutex.lock` names, with no
  other check (its absence fails the call and patches nothing; a malformed lock too); without a lock, the first pod
  with `spec.nodeName` = node, phase Pending, `hami.io/bind-time` present, `hami.io/bind-phase` allocating or success,
  `hami.io/vgpu-node` = node. Failing to find it fails the call and touches nothing (plug/server.go:757-761);
- `hami.io/vgpu-devices-to-allocate` decoded (`decodePodSingleDevice`, plug/util.go:94-104); per container request
  of the call, the next non-empty entry popped (`popNextContainerDevices`, plug/util.go:112-128); its GPU count must
  equal kubelet's device IDs ("device number not matched", plug/server.go:802-805); with enableGetPreferredAllocation
  outside MIG mode its UUIDs are replaced by the GPUs behind kubelet's IDs (plug/server.go:807-814, :733-744);
- MIG mode (`GetContainerDeviceStrArray`, plug/util.go:291-369): the container's reservations in
  `hami.io/vgpu-mig-allocations`, one per GPU of the entry in deviceIndex order, naming the entry's GPUs; instances
  no live pod names dropped first (:334-336); each instance made at its profile and placement (`EnsureAllocation`,
  plug/migmgr.go:332-383), refused when the GPU does not offer it or it overlaps an instance already there; then the
  instances' runtime identity written into the reservations with the pod's resourceVersion (`annotateMigRuntimeInfo`,
  plug/server.go:380-423); the container sees the instances' MIG UUIDs, elsewhere the entry's GPU UUIDs;
- the value patched with the popped entries emptied, once per call (`patchErasedAnnotation`, plug/util.go:134-144;
  plug/server.go:903-907); then, read again, when no `NVIDIA` is left: `hami.io/bind-phase: success` and the lock
  released (`PodAllocationTrySuccess`, plug/util.go:371-405);
- any failure after the pod is found: `hami.io/bind-phase: failed` and the lock released (`PodAllocationFailed`,
  plug/util.go:407-414), the call failing with its reason; `-to-allocate` is left as it was;
- the lock released with its owner check (`ReleaseNodeLock`, pkg/util/nodelock/nodelock.go:175-239): a lock naming
  another pod stays; else a merge patch `"hami.io/mutex.lock": null` with the node's resourceVersion, read again and
  retried, 5 tries.

What it checks where the real plugin trusts the scheduler, when `strict` (the e2e tier's "an allocation HAMi's
plugin would accept for that node"): each GPU of the entry registered on the node, its memory and compute within the
GPU's `devmem` and `devcore`. Not strict (the node double, as the real plugin), those go through and are reported as
findings. Strict or not, a MIG profile is matched by its full name among the GPU's (the real plugin resolves
`1g.20gb` as `1g`, plug/migmgr.go:349-353, then checks the placement against that NVML profile's). `refuse` names
pods to refuse on purpose, as a plugin that cannot allocate (a GPU lost from NVML) does. It never imports `extender`.
"""

from __future__ import annotations

import contextlib
import itertools
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from devtools.deviceplugin.hami_protocol import (
    BIND_PHASE,
    BIND_TIME,
    LOCK,
    MIG_ALLOCATIONS,
    RETRIES,
    TO_ALLOCATE,
    VENDOR,
    VGPU_NODE,
    Device,
    Gpu,
    MigFinding,
    MigInstance,
    Obj,
    Reservation,
    container_at,
    container_index,
    decode_entries,
    decode_reservations,
    encode_entries,
    encode_reservations,
    parse_lock,
    physical_device_id,
    pod_key,
    registered_gpus,
)
from devtools.deviceplugin.kube import ApiError

Call = Callable[[str, str, Obj | None], Awaitable[Obj]]
"""An API call: method, path, body (PATCH: a JSON merge patch); raises kube.ApiError on a non-2xx answer."""


class CallFailed(Exception):
    """One Allocate call failed. When a pod was found it has been marked failed and the lock released."""

    def __init__(self, reason: str, pod: Obj | None, found_by: str = "", gone: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.pod = pod
        self.found_by = found_by
        self.gone = gone
        """The pod (`namespace/name`) the node's lock named and the API no longer has, if that is why."""


@dataclass(frozen=True, slots=True)
class Given:
    """What one container request of the call got."""

    container: str
    devices: tuple[Device, ...]
    visible: tuple[str, ...]
    """The device IDs for NVIDIA_VISIBLE_DEVICES: the GPUs' UUIDs, or in MIG mode the instances' MIG UUIDs."""
    entry: str
    """The entry as the annotation wrote it (`uuid,NVIDIA,mem,cores:...`)."""
    findings: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Served:
    pod: Obj
    found_by: str
    """"lock" or "search"."""
    given: tuple[Given, ...]


class MigState:
    """The MIG instances the plugin made, per GPU UUID, and the MIG checks that refused a call. Mutable."""

    def __init__(self) -> None:
        self.instances: dict[str, list[MigInstance]] = {}
        self.findings: list[MigFinding] = []
        self._ids = itertools.count(1)
        self._taken: set[tuple[str, str, str, int, int]] = set()
        """(pod UID, GPU, profile, start, size) of init containers' instances an app container was given too."""

    def release(self, uid: str) -> None:
        for gpu, instances in list(self.instances.items()):
            kept = [instance for instance in instances if instance.uid != uid]
            if len(kept) != len(instances):
                self.instances[gpu] = kept
        self._taken = {taken for taken in self._taken if taken[0] != uid}

    def _made(self, pod: Obj, index: int, reservation: Reservation) -> MigInstance | None:
        """The instance already made at the reservation's GPU, profile and placement that this container is given
        as it is (`EnsureAllocation` returns the instance made at that key, plug/migmgr.go:332-343): one an init
        container of the same pod took (or took first), not yet given to another app container. Another pod's, or
        another app container's, is still refused as an overlap here (the real plugin would share it: a slice
        given twice, which is what the e2e tier must catch)."""
        uid = pod["metadata"]["uid"]
        init = len((pod.get("spec") or {}).get("initContainers") or [])
        for instance in self.instances.get(reservation.gpu, ()):
            spot = (instance.profile, instance.start, instance.size)
            if instance.uid != uid or spot != (reservation.profile, reservation.start, reservation.size):
                continue
            if instance.container < init and (index < init or (uid, reservation.gpu, *spot) not in self._taken):
                return instance
        return None

    def keep_only(self, live: set[str]) -> None:
        """Drop the instances of pods not in `live` (UIDs): the real plugin's reconcile against live pods."""
        for gpu, instances in list(self.instances.items()):
            self.instances[gpu] = [instance for instance in instances if instance.uid in live]

    def adopt(self, pod: Obj) -> None:
        """The instances a pod bound before the plugin started holds: those its reservations give a runtime
        identity for (`primeMigManagerFromAnnotations`, plug/server.go:447-484), every pod's but a deleted or
        ended one's (:455-457): a pod whose `bind-phase` is `failed` keeps its instances until it ends."""
        uid = pod["metadata"]["uid"]
        annotations = pod["metadata"].get("annotations") or {}
        ended = (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")
        if (
            pod["metadata"].get("deletionTimestamp")
            or ended
            or any(instance.uid == uid for instances in self.instances.values() for instance in instances)
        ):
            return
        with contextlib.suppress(ValueError):
            for reservation in decode_reservations(annotations.get(MIG_ALLOCATIONS)):
                if reservation.runtime is not None:
                    self.instances.setdefault(reservation.gpu, []).append(
                        MigInstance(uid, pod_key(pod), reservation.container, reservation.profile,
                                    reservation.start, reservation.size, reservation.runtime)
                    )  # fmt: skip

    def check(
        self, node: str, pod: Obj, position: int, devices: Sequence[Device], gpus: Mapping[str, Gpu], how: str
    ) -> list[Reservation]:
        """The reservations of the container whose entry is at `position`, checked as GetContainerDeviceStrArray
        and EnsureAllocation check them; raises CallFailed, recording the finding."""

        def refuse(kind: str, reason: str) -> CallFailed:
            self.findings.append(MigFinding(kind, pod_key(pod), node, reason))
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
            gpu = gpus.get(device.uuid)
            if gpu is None:
                raise refuse("gpu", f"resolve parent GPU {device.uuid}")
            profile = gpu.profile(reservation.profile)
            spot = (reservation.start, reservation.size)
            if profile is None or spot not in profile.placements:
                offered = sorted(profile.placements) if profile else sorted(known.name for known in gpu.profiles)
                raise refuse(
                    "profile",
                    f"scheduler selected invalid placement {spot} for profile {reservation.profile} on {gpu.uuid} "
                    f"(registered: {offered})",
                )
            shared = self._made(pod, index, reservation)
            held = [
                f"{instance.pod} {instance.profile} at {instance.start}+{instance.size}"
                for instance in self.instances.get(gpu.uuid, ())
                if reservation.cuts(instance.start, instance.size) and instance != shared
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

    def make(self, pod: Obj, made: Sequence[Reservation]) -> tuple[list[str], str]:
        """Make the instances; returns their MIG UUIDs and the reservations annotation with every made instance's
        runtime identity written in."""
        uid = pod["metadata"]["uid"]
        init = len((pod.get("spec") or {}).get("initContainers") or [])
        mig_uuids = []
        for reservation in made:
            shared = self._made(pod, reservation.container, reservation)
            if shared is not None:
                mig_uuids.append(shared.runtime[0])
                if reservation.container >= init:
                    self._taken.add((uid, reservation.gpu, shared.profile, shared.start, shared.size))
                continue
            number = next(self._ids)
            runtime = (f"MIG-{uuid.uuid5(uuid.NAMESPACE_URL, f'{reservation.gpu}/{number}')}", number, 0)
            mig_uuids.append(runtime[0])
            self.instances.setdefault(reservation.gpu, []).append(
                MigInstance(uid, pod_key(pod), reservation.container, reservation.profile, reservation.start,
                            reservation.size, runtime)
            )  # fmt: skip
        listed = decode_reservations((pod["metadata"].get("annotations") or {}).get(MIG_ALLOCATIONS))
        identified = []
        for reservation in listed:
            instance = next(
                (
                    one
                    for one in self.instances.get(reservation.gpu, ())
                    if (one.profile, one.start, one.size) == (reservation.profile, reservation.start, reservation.size)
                ),
                None,
            )
            identified.append(replace(reservation, runtime=instance.runtime) if instance else reservation)
        return mig_uuids, encode_reservations(identified)


class HamiAllocator:
    """HAMi's Allocate against the API, for one plugin (one or many nodes). Mutable: its MIG state and records grow."""

    def __init__(
        self,
        call: Call,
        *,
        strict: bool,
        violations: list[str] | None = None,
        own_gpus: Mapping[str, Gpu] | None = None,
        mig: bool | None = None,
        align: bool = False,
        reconcile_mig: bool = False,
    ) -> None:
        self.call = call
        self.strict = strict
        self.violations = violations if violations is not None else []
        """Lock releases that failed 5 times: a stale lock on the node."""
        self.own_gpus = own_gpus
        """The GPUs the plugin has (NVML's); None: the node's registration (the e2e double)."""
        self.mig_mode = mig
        """MIG operating mode; None: MIG when a registered GPU is (the e2e double)."""
        self.align = align
        """enableGetPreferredAllocation: use the GPUs behind kubelet's device IDs (outside MIG mode)."""
        self.reconcile_mig = reconcile_mig
        """Drop the instances no live pod on the node holds before a MIG call (the node double has no watch)."""
        self.refuse: dict[str, str] = {}
        """Pod names whose allocation is refused on purpose, with the reason given."""
        self.mig = MigState()

    async def pending_pod(self, node: str) -> tuple[Obj, str, dict[str, Gpu]]:
        """GetPendingPod: the pod the lock names, else the first pending pod bound here awaiting its GPUs; with the
        GPUs the plugin knows. Raises CallFailed (no pod)."""
        current = await self.call("GET", f"/api/v1/nodes/{node}", None)
        gpus = dict(self.own_gpus) if self.own_gpus is not None else registered_gpus(current)
        value = (current["metadata"].get("annotations") or {}).get(LOCK)
        try:
            holder = parse_lock(str(value)) if value is not None else None
        except ValueError as error:
            raise CallFailed(str(error), None) from None
        if holder is not None:
            namespace, name = holder
            try:
                return await self.call("GET", f"/api/v1/namespaces/{namespace}/pods/{name}", None), "lock", gpus
            except ApiError as error:
                if error.status == 404:
                    raise CallFailed(
                        f"the lock on {node} names {namespace}/{name}, which is gone", None, gone=f"{namespace}/{name}"
                    ) from None
                raise
        listed = await self.call("GET", f"/api/v1/pods?fieldSelector=spec.nodeName%3D{node}", None)
        for pod in listed["items"]:
            annotations = pod["metadata"].get("annotations") or {}
            if (
                (pod.get("status") or {}).get("phase") == "Pending"
                and BIND_TIME in annotations
                and annotations.get(BIND_PHASE) in ("allocating", "success")
                and annotations.get(VGPU_NODE) == node
            ):
                return pod, "search", gpus
        raise CallFailed(f"no binding pod found on node {node}", None)

    async def allocate(self, node: str, requests: Sequence[Sequence[str]]) -> Served:
        """One Allocate call: `requests` holds kubelet's device IDs per container request. Raises CallFailed."""
        pending, how, gpus = await self.pending_pod(node)
        try:
            return await self._allocate(node, pending, how, gpus, requests)
        except CallFailed as failure:
            self.mig.release(pending["metadata"]["uid"])
            await self.fail(node, pending)
            raise CallFailed(failure.reason, pending, how) from None

    async def _allocate(
        self, node: str, pod: Obj, how: str, gpus: Mapping[str, Gpu], requests: Sequence[Sequence[str]]
    ) -> Served:
        meta = pod["metadata"]
        path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}"
        value = (meta.get("annotations") or {}).get(TO_ALLOCATE)
        if value is None:
            raise CallFailed("device request not found", pod, how)
        try:
            entries = decode_entries(str(value))
        except ValueError as error:
            raise CallFailed(f"{TO_ALLOCATE} unreadable: {error}", pod, how) from None
        mig = self.mig_mode if self.mig_mode is not None else any(gpu.mig for gpu in gpus.values())
        given: list[Given] = []
        for ids in requests:
            position = next((number for number, devices in enumerate(entries) if devices), None)
            if position is None:
                raise CallFailed("no pending device allocation found", pod, how)
            devices = entries[position]
            entries[position] = []
            if len(devices) != len(ids):
                raise CallFailed(
                    f"device number not matched: kubelet asks {len(ids)}, the entry has {len(devices)}", pod, how
                )
            if self.align and not mig:
                behind = [physical_device_id(id_) for id_ in ids]
                devices = [replace(device, uuid=gpu) for device, gpu in zip(devices, behind, strict=True)]
            findings = self._findings(node, devices, gpus)
            if findings and self.strict:
                raise CallFailed(findings[0], pod, how)
            reservations = self.mig.check(node, pod, position, devices, gpus, how) if mig else []
            refusal = self.refuse.get(meta["name"])
            if refusal is not None:
                raise CallFailed(refusal, pod, how)
            visible = tuple(dict.fromkeys(device.uuid for device in devices))
            if mig:
                visible = tuple(await self._make_instances(node, pod, reservations, path, how))
            name = container_at(pod, position) or ""
            given.append(Given(name, tuple(devices), visible, encode_entries([devices])[:-1], tuple(findings)))
        try:
            await self.call("PATCH", path, {"metadata": {"annotations": {TO_ALLOCATE: encode_entries(entries)}}})
        except ApiError as error:
            raise CallFailed(f"erase allocated containers annotation: {error}", pod, how) from None
        after = await self.call("GET", path, None)
        if VENDOR not in str((after["metadata"].get("annotations") or {}).get(TO_ALLOCATE) or ""):
            await self.call("PATCH", path, {"metadata": {"annotations": {BIND_PHASE: "success"}}})
            await self.release(node, pod)
        return Served(pod, how, tuple(given))

    def _findings(self, node: str, devices: Sequence[Device], gpus: Mapping[str, Gpu]) -> list[str]:
        found = []
        for device in devices:
            gpu = gpus.get(device.uuid)
            if gpu is None:
                found.append(f"GPU {device.uuid} is not registered on {node}")
            elif not 0 <= device.memory <= gpu.memory or not 0 <= device.cores <= gpu.cores:
                found.append(
                    f"{device.uuid}: {device.memory} MiB and {device.cores} % compute asked of {gpu.memory} MiB and "
                    f"{gpu.cores} %"
                )
        return found

    async def _make_instances(self, node: str, pod: Obj, made: list[Reservation], path: str, how: str) -> list[str]:
        """Make the container's instances, then write their runtime identity into the pod's reservations with the
        pod's resourceVersion (annotateMigRuntimeInfo); a failed write fails the call."""
        if self.reconcile_mig:
            listed = await self.call("GET", f"/api/v1/pods?fieldSelector=spec.nodeName%3D{node}", None)
            self.mig.keep_only(
                {
                    one["metadata"]["uid"]
                    for one in listed["items"]
                    if not one["metadata"].get("deletionTimestamp")
                    and (one.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
                }
            )
        mig_uuids, identified = self.mig.make(pod, made)
        version = pod["metadata"]["resourceVersion"]
        patch = {"metadata": {"resourceVersion": version, "annotations": {MIG_ALLOCATIONS: identified}}}
        try:
            await self.call("PATCH", path, patch)
        except ApiError as error:
            if error.status != 409:
                raise
            reason = f"record MIG runtime placement: {error}"
            self.mig.findings.append(MigFinding("runtime", pod_key(pod), node, reason))
            raise CallFailed(reason, pod, how) from None
        return mig_uuids

    async def fail(self, node: str, pod: Obj) -> None:
        """PodAllocationFailed: bind-phase failed, and the lock released."""
        path = f"/api/v1/namespaces/{pod['metadata']['namespace']}/pods/{pod['metadata']['name']}"
        await self.call("PATCH", path, {"metadata": {"annotations": {BIND_PHASE: "failed"}}})
        await self.release(node, pod)

    async def release(self, node: str, pod: Obj) -> None:
        """ReleaseNodeLock with the owner check: a lock naming another pod stays; 409 reads the node again."""
        suffix = f",{pod['metadata']['namespace']},{pod['metadata']['name']}"
        for _ in range(RETRIES):
            current = await self.call("GET", f"/api/v1/nodes/{node}", None)
            value = (current["metadata"].get("annotations") or {}).get(LOCK)
            if not value or ("," in value and not value.endswith(suffix)):
                return
            patch = {
                "metadata": {"annotations": {LOCK: None}, "resourceVersion": current["metadata"]["resourceVersion"]}
            }
            try:
                await self.call("PATCH", f"/api/v1/nodes/{node}", patch)
                return
            except ApiError as error:
                if error.status != 409:
                    raise
        self.violations.append(f"could not release the lock on {node} for {pod_key(pod)} in {RETRIES} tries")
