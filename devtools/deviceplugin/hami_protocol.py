"""HAMi v2.10.0's NVIDIA protocol as its device plugin reads and writes it: annotation keys, the node registration,
the per-container device entries, the MIG reservations, the node lock's value. Pure data and codecs, no I/O.

Shared by the two doubles of HAMi's plugin: the API-side one of the e2e tier (`tests/e2e/deviceplugin.py`, kubelet's
admission simulated) and the node-side one that kubelet really calls (`devtools/deviceplugin/hami.py`), so both read
the protocol one way. Read from Project-HAMi/HAMi commit 4707fb02c91c545bc7343ce26dba4c32919f9a3e (tag v2.10.0);
`plug/` = pkg/device-plugin/nvidiadevice/nvinternal/plugin/. It must never import `extender`: it is HAMi's side of
the protocol, written independently, so that it checks the extender's reading rather than repeating it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson

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


def pod_key(pod: Obj) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace')}/{meta.get('name')}"


def lock_holder(value: str) -> tuple[str, str] | None:
    """(namespace, name) of a lock `<RFC3339>,<ns>,<name>`; None for a legacy bare time or a malformed value."""
    parts = value.split(",")
    return (parts[1], parts[2]) if len(parts) == 3 else None


SCORE = "hami.io/node-nvidia-score"
"""Node: the GPU pair scores, with ENABLE_TOPOLOGY_SCORE (plug/register.go:279-301)."""


def parse_lock(value: str) -> tuple[str, str] | None:
    """HAMi's ParseNodeLock (pkg/util/nodelock/nodelock.go:293-304): (namespace, name) of `<RFC3339>,<ns>,<name>`;
    None for a legacy bare time (then the plugin searches for the pod); ValueError for what it cannot parse, which
    fails the Allocate call (pkg/util/util.go:127-130)."""
    parts = value.split(",")
    if len(parts) not in (1, 3):
        raise ValueError(f"malformed lock annotation: expected 3 parts, got {len(parts)} from {value}")
    try:
        datetime.fromisoformat(parts[0].replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"lock annotation {value!r}: time not RFC 3339") from None
    return (parts[1], parts[2]) if len(parts) == 3 else None


def physical_device_id(device_id: str) -> str:
    """The GPU UUID behind one of kubelet's device IDs (`physicalDeviceID`, plug/server.go:715-731): an annotated
    `uuid::n` loses its annotation; a replica `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx-<n>` (six dashes, numeric
    tail) loses `-<n>`."""
    if "::" in device_id:
        return device_id.split("::")[0]
    if device_id.count("-") == 6:
        head, _, tail = device_id.rpartition("-")
        if tail.isdigit():
            return head
    return device_id
