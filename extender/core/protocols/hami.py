"""HAMi's NVIDIA protocol: what its device plugin registers on a node and reads from a pod (HAMi v2.10.0).

We replace hami-scheduler and keep HAMi's device plugin (with HAMi-core, which enforces a container's memory
and compute limits inside it). The formats are HAMi's own code at tag v2.10.0 (commit 4707fb02), summarised
in `shared/protocols/hami.md` and verified in `tests/fixtures/hami/NOTES.md` (file and line for each rule):

- **Node**: `hami.io/node-nvidia-register`, a JSON array of GPUs (`id` UUID, `index`, `count` = split count,
  `devmem` MiB, `devcore` = compute, 100 a card, `type`, `numa`, `mode`, `health` a JSON bool; every field
  omitted when empty, so a GPU without `health` is unhealthy). Only GPUs whose type names NVIDIA are offered.
  `hami.io/device-cordon` (UUIDs) keeps new pods off GPUs. A node with no registration, or whose allocatable
  `nvidia.com/gpu` is 0 (the plugin is not running), has no GPUs here; HAMi keeps a vanished registration's
  GPUs cached, which we do not. `hami.io/mutex.lock` is the plugin's node lock (`<RFC3339>,<ns>,<name>`).
- **Pod**: per container (init containers first), limits before requests: `nvidia.com/gpu` GPUs,
  `nvidia.com/gpumem` MiB on each (x `memory_factor`), else `nvidia.com/gpumem-percentage` of each GPU's
  memory (over 100: 100; 0 or less: ignored), else `default_memory`, else the whole GPU; `nvidia.com/gpucores`
  % compute on each (else `default_cores`; over 100: 100). HAMi silently drops a container whose gpumem is
  unreadable (`4Gi`); we refuse the pod with a 400 naming it. A container asking memory or compute without
  `nvidia.com/gpu` would get no GPU from kubelet: HAMi's admission webhook adds it, and we refuse such a pod
  with a message saying so.
- **Selectors and policies** (pod annotations): `nvidia.com/use-gputype` / `nouse-gputype` (upper-cased
  substrings of the GPU type), `nvidia.com/use-gpuuuid` / `nouse-gpuuuid` (exact UUIDs), `nvidia.com/vgpu-mode`
  (the GPU's mode a substring of it: an empty value admits only GPUs registered without one, as in HAMi,
  pkg/device/nvidia/device.go:495-498), `nvidia.com/numa-bind`, `hami.io/gpu-scheduler-policy` (binpack, spread,
  mutex; comma lists) and `hami.io/node-scheduler-policy` (binpack, spread). HAMi reads an unknown policy as
  spread; we refuse it.
- **Allocation**: `hami.io/vgpu-devices-to-allocate` (the plugin erases what it has allocated) and
  `hami.io/vgpu-devices-allocated` (the record), one entry per GPU container, init containers first, each
  `<uuid>,NVIDIA,<MiB>,<compute>:` per GPU and `;` after each container; `hami.io/vgpu-node`,
  `hami.io/vgpu-time`, `hami.io/bind-phase: allocating`, `hami.io/bind-time`. We write them all in the Binding,
  so they are on the pod the moment `spec.nodeName` is; HAMi's label `hami.io/vgpu-node` is not (a Binding
  carries annotations only, and the plugin reads the annotation). A pod whose `bind-phase` is `failed` (the plugin
  could not allocate) is counted until it ends, as HAMi counts it (pkg/scheduler/scheduler.go:144-153, 185-190):
  the plugin keeps its MIG instances while it is Pending (`activeMigAllocationKeys`, plugin/server.go:358-378).
"""

from __future__ import annotations

import contextlib
import datetime
from collections.abc import Sequence
from dataclasses import dataclass, replace

import orjson

from extender.core import objects
from extender.core.devices import (
    NO_DEMAND,
    WHOLE_GPU,
    Demand,
    Device,
    NodeDevices,
    NodeLock,
    Request,
    Selectors,
    Strategy,
)
from extender.core.holds import Allocation, Grant
from extender.core.objects import Raw, as_object
from extender.core.protocols import NOTHING_RECORDED, QuotaResources, Recorded, hami_policy
from extender.core.protocols.gofields import MAX_INT32, field
from extender.core.protocols.hami_mig import (
    MIG_ALLOCATIONS,
    decode_instances,
    encode_instances,
    read_profiles,
    with_instances,
)
from extender.core.resources import (
    MAX_DEVICES,
    InvalidPod,
    InvalidQuantity,
    check_pod_shape,
    container_amount,
    containers,
    parse_count,
    where,
)

REGISTER = "hami.io/node-nvidia-register"
CORDON = "hami.io/device-cordon"
LOCK = "hami.io/mutex.lock"
GPU = "nvidia.com/gpu"
GPUMEM = "nvidia.com/gpumem"
GPUMEM_PERCENTAGE = "nvidia.com/gpumem-percentage"
GPUCORES = "nvidia.com/gpucores"
TO_ALLOCATE = "hami.io/vgpu-devices-to-allocate"
ALLOCATED = "hami.io/vgpu-devices-allocated"
VGPU_NODE = "hami.io/vgpu-node"
VGPU_TIME = "hami.io/vgpu-time"
BIND_PHASE = "hami.io/bind-phase"
BIND_TIME = "hami.io/bind-time"
USE_TYPE = "nvidia.com/use-gputype"
AVOID_TYPE = "nvidia.com/nouse-gputype"
USE_UUID = "nvidia.com/use-gpuuuid"
AVOID_UUID = "nvidia.com/nouse-gpuuuid"
VGPU_MODE = "nvidia.com/vgpu-mode"
NUMA_BIND = "nvidia.com/numa-bind"
GPU_POLICY = "hami.io/gpu-scheduler-policy"
NODE_POLICY = "hami.io/node-scheduler-policy"

VENDOR = "NVIDIA"
"""The type field of every allocation entry: the plugin's "all allocated?" test looks for it."""
TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
"""What Go's `strconv.ParseBool` reads as true (`nvidia.com/numa-bind`)."""


@dataclass(frozen=True, slots=True)
class Hami:
    """HAMi's protocol, with the scheduler-side defaults HAMi's chart sets (`device-configmap.yaml`)."""

    default_memory: int = 0
    """MiB per GPU for a container asking neither gpumem nor a percentage (0: the whole GPU)."""
    default_cores: int = 0
    """% compute per GPU for a container asking no gpucores."""
    memory_factor: int = 1
    """What one unit of `nvidia.com/gpumem` is worth in MiB (HAMi's memoryFactor)."""
    topology_multi_gpu: bool = False
    """Every pod asking several GPUs in one container gets the best-linked set, as if it asked
    `topology-aware` (`--hami-topology-all`)."""

    @property
    def name(self) -> str:
        return "hami"

    @property
    def unit(self) -> str:
        return "MiB"

    @property
    def managed_resources(self) -> tuple[str, ...]:
        return (GPU, GPUMEM, GPUMEM_PERCENTAGE, GPUCORES)

    @property
    def advertised_resources(self) -> tuple[str, ...]:
        return (GPU,)

    @property
    def node_lock(self) -> str | None:
        return LOCK

    @property
    def quota_resources(self) -> QuotaResources:
        """HAMi's own quota keys, `limits.nvidia.com/gpumem` (in units of `memory_factor` MiB) and
        `limits.nvidia.com/gpucores`, and `limits.nvidia.com/gpu`, which HAMi does not read (`core/quota/`)."""
        return QuotaResources(memory=GPUMEM, gpus=GPU, cores=GPUCORES, memory_factor=self.memory_factor)

    @property
    def model_label(self) -> str:
        """None: a GPU's model is in HAMi's registration, and a pod's in its `use-gputype` selectors."""
        return ""

    @property
    def unhealthy_namespace(self) -> str | None:
        return None

    def unhealthy_gpus(self, configmap: Raw) -> tuple[str, frozenset[int]] | None:
        return None

    # -- nodes

    def node_devices(self, node: Raw) -> NodeDevices:
        annotations = objects.annotations_of(node)
        lock = read_lock(annotations.get(LOCK))
        listed = annotations.get(REGISTER)
        if listed is None:
            return NodeDevices((), f"no {REGISTER}: HAMi's device plugin has not registered this node", lock)
        allocatable = as_object(as_object(node.get("status")).get("allocatable")).get(GPU)
        try:
            if not allocatable or parse_count(allocatable) == 0:
                return NodeDevices((), f"allocatable {GPU} is 0: HAMi's device plugin is not serving here", lock)
        except InvalidQuantity as error:
            return NodeDevices((), f"allocatable {GPU} {error}", lock)
        try:
            devices = _registered(listed, _cordoned(annotations.get(CORDON)))
        except ValueError as error:
            return NodeDevices((), f"{REGISTER} unreadable: {error}", lock)
        try:
            devices = hami_policy.with_links(devices, annotations.get(hami_policy.SCORES))
        except ValueError as error:
            return NodeDevices((), f"{hami_policy.SCORES} unreadable: {error}", lock)
        if not devices:
            return NodeDevices((), f"{REGISTER} lists no NVIDIA GPU", lock)
        return NodeDevices(devices, "", lock)

    # -- pods

    def pod_demand(self, pod: Raw) -> Demand:
        check_pod_shape(pod)
        requests = [request for found in containers(pod) if (request := self._request(found, pod)) is not None]
        if not requests:
            return NO_DEMAND
        annotations = objects.annotations_of(pod)
        asked = _selectors(annotations, pod)
        node_strategy = _strategy(annotations.get(NODE_POLICY), NODE_POLICY, pod)
        selectors, device_strategy = asked.selectors, asked.strategy
        if self.topology_multi_gpu and not selectors.topology and any(request.devices > 1 for request in requests):
            selectors = replace(selectors, topology=True)
        if len(requests) == 1 and not requests[0].init:
            only = requests[0]
            return Demand(
                memory=only.memory * only.devices,
                devices=only.devices,
                cores=only.cores,
                percent=only.percent,
                selectors=selectors,
                node_strategy=node_strategy,
                device_strategy=device_strategy,
            )
        return Demand(
            memory=sum(request.memory * request.devices for request in requests),
            devices=sum(request.devices for request in requests),
            containers=tuple(requests),
            selectors=selectors,
            node_strategy=node_strategy,
            device_strategy=device_strategy,
        )

    def refusal(self, demand: Demand) -> str | None:
        """None: HAMi's device plugin runs every demand it can read, several GPUs and containers included."""
        return None

    def _request(self, found: tuple[Raw, str], pod: Raw) -> Request | None:
        container, kind = found
        gpus = container_amount(pod, container, GPU, kind)
        memory = container_amount(pod, container, GPUMEM, kind)
        percent = container_amount(pod, container, GPUMEM_PERCENTAGE, kind)
        cores = container_amount(pod, container, GPUCORES, kind)
        if not gpus:
            if any(amount for amount in (memory, percent, cores)):
                raise InvalidPod(
                    f"{where(pod, container, kind)} asks {GPUMEM}, {GPUMEM_PERCENTAGE} or {GPUCORES} without {GPU}: "
                    f"kubelet would give it no GPU. HAMi's admission webhook adds {GPU} to such pods; keep it installed"
                )
            return None
        if gpus > MAX_DEVICES:
            raise InvalidPod(f"{where(pod, container, kind)}: {GPU} {gpus} is more GPUs than any node has")
        mib = (memory or 0) * self.memory_factor
        if mib > MAX_INT32:
            raise InvalidPod(f"{where(pod, container, kind)}: {GPUMEM} {memory} is more MiB than HAMi can record")
        share = min(percent or 0, 100)
        if not mib and not share:
            mib = self.default_memory
            share = 0 if mib else 100
        compute = min(self.default_cores if cores is None else cores, WHOLE_GPU)
        return Request(gpus, mib, 0 if mib else share, compute, init=kind == "init container")

    # -- allocations

    def allocation_annotations(self, allocation: Allocation, devices: Sequence[Device], since: float) -> dict[str, str]:
        uuids = {device.index: device.uuid for device in devices}
        encoded = encode(allocation.containers, uuids)
        stamp = str(int(since))
        annotations = {
            VGPU_NODE: allocation.node,
            VGPU_TIME: stamp,
            TO_ALLOCATE: encoded,
            ALLOCATED: encoded,
            BIND_PHASE: "allocating",
            BIND_TIME: stamp,
        }
        reservations = encode_instances(allocation.containers, uuids)
        if reservations:
            annotations[MIG_ALLOCATIONS] = reservations
        return annotations

    def recorded(self, pod: Raw, demand: Demand | None) -> Recorded:
        annotations = objects.annotations_of(pod)
        node = str(as_object(pod.get("spec")).get("nodeName") or "") or str(annotations.get(VGPU_NODE) or "")
        if not node:
            return NOTHING_RECORDED
        try:
            entries = decode(str(annotations.get(ALLOCATED) or ""))
        except ValueError:
            return NOTHING_RECORDED
        since = _seconds(annotations.get(VGPU_TIME)) or _seconds(annotations.get(BIND_TIME))
        if not entries:
            return Recorded(node, None, since)
        requests = demand.requests if demand is not None and not demand.is_zero else ()
        init = sum(1 for request in requests if request.init) if len(requests) == len(entries) else 0
        with contextlib.suppress(ValueError):  # HAMi ignores reservations it cannot decode (scheduler.go:760-765)
            entries = with_instances(entries, decode_instances(annotations.get(MIG_ALLOCATIONS)))
        key = objects.key(objects.namespace(pod), objects.name(pod))
        return Recorded(node, Allocation(objects.uid(pod), key, node, entries, init), since)


def encode(containers: Sequence[Sequence[Grant]], uuids: dict[int, str]) -> str:
    """`<uuid>,NVIDIA,<MiB>,<compute>:` per GPU, `;` after each container (HAMi's EncodePodSingleDevice)."""
    return "".join(
        "".join(
            f"{grant.uuid or uuids.get(grant.index, '')},{VENDOR},{grant.memory},{grant.cores}:" for grant in grants
        )
        + ";"
        for grants in containers
    )


def decode(text: str) -> tuple[tuple[Grant, ...], ...]:
    """The GPU containers' grants (by UUID: index -1 until the cache resolves them), skipping the empty entries
    of containers without GPUs and those the plugin has erased. ValueError when unreadable."""
    if len(text) > 64 * 1024:
        raise ValueError("too long")
    found = []
    for entry in text.split(";"):
        grants = []
        for device in entry.split(":"):
            if "," not in device:
                continue
            fields = device.split(",")
            if len(fields) < 4 or not fields[0]:
                raise ValueError(f"device entry {device[:80]!r}: expected uuid,type,memory,cores")
            memory, cores = _int32(fields[2]), _int32(fields[3])
            grants.append(Grant(-1, memory, min(cores, WHOLE_GPU), fields[0]))
        if grants:
            found.append(tuple(grants))
    return tuple(found)


def read_lock(value: object) -> NodeLock | None:
    """`<RFC3339>,<namespace>,<name>` (or a bare time, HAMi's legacy form). One that cannot be read counts as
    abandoned long ago (time 0), so the next bind takes it over; HAMi instead refuses every bind there."""
    if not isinstance(value, str) or not value:
        return None
    stamp, _, holder = value.partition(",")
    try:
        since = datetime.datetime.fromisoformat(stamp.strip().replace("Z", "+00:00")).timestamp()
    except ValueError:
        return NodeLock(0.0, "")
    namespace, _, name = holder.partition(",")
    return NodeLock(since, objects.key(namespace, name) if namespace and name else "")


def lock_value(now: float, namespace: str, name: str) -> str:
    """The lock value for a pod (HAMi's GenerateNodeLockKeyByPod)."""
    return f"{objects.rfc3339(now)},{namespace},{name}"


# -- reading, bounded


def _registered(text: object, cordoned: frozenset[str]) -> tuple[Device, ...]:
    if not isinstance(text, str):
        raise ValueError("not a string")
    try:
        entries = orjson.loads(text)
    except orjson.JSONDecodeError:
        raise ValueError("not JSON (HAMi v2.8 and later write a JSON array)") from None
    if not isinstance(entries, list):
        raise ValueError("expected a JSON array of GPUs")
    if len(entries) > MAX_DEVICES:
        raise ValueError(f"{len(entries)} GPUs is more than {MAX_DEVICES}")
    devices: dict[int, Device] = {}
    for entry in entries:
        if not isinstance(entry, dict):
            raise ValueError("each GPU must be an object")
        model = field(entry, "type", str, "")
        if VENDOR.lower() not in model.lower():
            continue
        index = field(entry, "index", int, 0)
        if index < 0 or index in devices:
            raise ValueError(f"bad or repeated GPU index {index}")
        uuid = field(entry, "id", str, "")
        devices[index] = Device(
            index,
            field(entry, "devmem", int, 0),
            healthy=field(entry, "health", bool, False),
            cores=field(entry, "devcore", int, 0),
            slots=field(entry, "count", int, 0),
            model=model,
            uuid=uuid,
            numa=field(entry, "numa", int, 0),
            mode=field(entry, "mode", str, ""),
            cordoned=uuid in cordoned,
            profiles=read_profiles(entry.get("migProfiles")),
        )
    return tuple(devices[index] for index in sorted(devices))


def _cordoned(value: object) -> frozenset[str]:
    return (
        frozenset(part.strip() for part in value.split(",") if part.strip()) if isinstance(value, str) else frozenset()
    )


def _int32(text: str) -> int:
    """A decimal int32 as HAMi's `strconv.ParseInt(s, 10, 32)` reads one (pkg/device/devices.go:512 at v2.10.0,
    DecodeContainerDevices), leading zeros included ("0000000016" is 16); a sign, a negative or anything past
    2^31-1 is refused. Bounded: the digits past the zeros are at most 10 before `int` is asked."""
    digits = text.lstrip("0") or ("0" if text else "")
    value = int(digits) if digits.isascii() and digits.isdigit() and len(digits) <= 10 else -1
    if not 0 <= value <= MAX_INT32:
        raise ValueError(f"{text[:40]!r} is not a whole number of at most 2^31-1")
    return value


def _seconds(value: object) -> float:
    text = str(value or "")
    return float(text) if text.isascii() and text.isdigit() and len(text) <= 12 else 0.0


def _names(value: object, upper: bool) -> tuple[str, ...]:
    if not isinstance(value, str):
        return ()
    parts = (part.strip() for part in value.split(","))
    return tuple(part.upper() if upper else part for part in parts if part)


@dataclass(frozen=True, slots=True)
class _Asked:
    selectors: Selectors
    strategy: Strategy | None


def _selectors(annotations: Raw, pod: Raw) -> _Asked:
    """The pod's GPU selectors and its own GPU strategy; InvalidPod naming an annotation HAMi would refuse."""
    try:
        policy = hami_policy.gpu_policy(annotations.get(GPU_POLICY))
    except ValueError as error:
        raise InvalidPod(f"pod {objects.pod_key(pod)}: {GPU_POLICY}: {error}") from None
    try:
        weights = hami_policy.weights(annotations.get(hami_policy.WEIGHTS))
    except ValueError as error:
        raise InvalidPod(f"pod {objects.pod_key(pod)}: {hami_policy.WEIGHTS}: {error}") from None
    modes = annotations.get(VGPU_MODE)
    numa_bind = annotations.get(NUMA_BIND) in TRUE
    order = policy.order
    if numa_bind and order and order[0] != hami_policy.NUMA:
        # HAMi makes numa the chain's first key, so that a NUMA node's GPUs are walked together (gpu_policy.go:137-147)
        order = (hami_policy.NUMA, *(key for key in order if key != hami_policy.NUMA))
    selectors = Selectors(
        use_models=_names(annotations.get(USE_TYPE), upper=True),
        avoid_models=_names(annotations.get(AVOID_TYPE), upper=True),
        use_uuids=_names(annotations.get(USE_UUID), upper=False),
        avoid_uuids=_names(annotations.get(AVOID_UUID), upper=False),
        modes=modes if isinstance(modes, str) else None,
        numa_bind=numa_bind,
        exclusive=policy.exclusive,
        topology=policy.topology,
        order=order,
        weights=weights,
    )
    return _Asked(selectors, policy.strategy)


def _strategy(value: object, annotation: str, pod: Raw) -> Strategy | None:
    if value is None or value == "":
        return None
    try:
        return Strategy(str(value))
    except ValueError:
        raise InvalidPod(
            f"pod {objects.pod_key(pod)}: {annotation} {str(value)[:40]!r} is not binpack or spread"
        ) from None
