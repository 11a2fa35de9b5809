"""End to end with HAMi's protocol: a real kube-scheduler v1.34.1 calls a real `extender serve --protocol hami` for
pods asking `nvidia.com/gpu`, `gpumem`, `gpumem-percentage` and `gpucores`, on Node objects registered as HAMi's
device plugin registers them, and a double of that plugin (`deviceplugin.py`) does what its `Allocate` does to
the API objects once each pod is bound: finds the pod by the node lock, erases its entries, sets `bind-phase`,
releases the lock. So the lock protocol between the extender and the plugin runs end to end.

Every check of where GPUs went is computed from the API's Pod objects alone (each bound pod's
`hami.io/vgpu-devices-allocated`, read against its own spec and the node's registration), never from the
extender; its `/inspect` is then compared with that. The invariants (no GPU over memory, compute or split count;
every bound pod's allocation what its spec asks, on GPUs its selectors admit) are checked on every poll while a
burst is placed, not only at the end.

Usage per GPU is HAMi's (`CollapseInitContainerUsage`, NOTES.md §3): init containers count at their peak, app
containers add up, a pod takes the larger of the two, field by field; a pod whose plugin refused it
(`bind-phase: failed`) counts until it ends, as hami-scheduler counts it (kubelet fails it at admission; here,
without a kubelet, the test writes that status).

The module shares one extender, one kube-scheduler (its own schedulerName) and four nodes of two GPU models
(A100 40 GB, V100 32 GB; one node has both), 2 to 4 GPUs each, split count 4: 14 GPUs. Each test deletes its
pods and waits until the extender has seen them go.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest

from tests.e2e.conftest import Remember
from tests.e2e.controlplane import (
    EXTENDER_NAMESPACE,
    ApiError,
    ControlPlane,
    eventually,
    hami_overlay_rules,
    node_manifest,
)
from tests.e2e.deviceplugin import (
    ALLOCATED,
    BIND_PHASE,
    BIND_TIME,
    GPU,
    LOCK,
    REGISTER,
    TO_ALLOCATE,
    VGPU_NODE,
    DevicePluginDouble,
    decode_entries,
    lock_holder,
)
from tests.e2e.extender_process import ExtenderProcess, TLSFiles, assert_agrees, serving_with_own_pod
from tests.e2e.scheduler import Scheduler, running_scheduler

pytestmark = pytest.mark.e2e

SCHEDULER_NAME = "hami-e2e-scheduler"
NOBODY = "hami-e2e-nobody"
"""A schedulerName no running scheduler owns: pods that must never be placed."""
TEST_LABEL = "e2e-hami-test"
SELF = "e2e-hami-extender-self"
LEASE_NAME = "e2e-hami"

GPUMEM = "nvidia.com/gpumem"
GPUMEM_PERCENTAGE = "nvidia.com/gpumem-percentage"
GPUCORES = "nvidia.com/gpucores"
USE_TYPE = "nvidia.com/use-gputype"
AVOID_TYPE = "nvidia.com/nouse-gputype"
USE_UUID = "nvidia.com/use-gpuuuid"
VGPU_TIME = "hami.io/vgpu-time"

A100 = ("NVIDIA A100-SXM4-40GB", 40960)
V100 = ("NVIDIA-Tesla V100-PCIE-32GB", 32768)
"""(type as HAMi's plugin writes it, devmem MiB): NVML names, `NVIDIA-` prefixed where they lack it."""
SPLIT = 4
NODE_MODELS: dict[str, tuple[tuple[str, int], ...]] = {
    "e2e-hami-0": (A100,) * 4,
    "e2e-hami-1": (A100,) * 4,
    "e2e-hami-2": (V100,) * 2,
    "e2e-hami-3": (A100, A100, V100, V100),
}
NODES = tuple(NODE_MODELS)

DELAY = 0.25
"""Seconds the double's kubelet takes from a binding to the plugin's Allocate (pod sync and admission)."""
EXTENDER_FLAGS = (  # the production lease timings: a restart takes its lease back at once (same --identity)
    "--protocol", "hami",
    "--lease-namespace", EXTENDER_NAMESPACE, "--lease-name", LEASE_NAME,
    "--reservation-ttl", "10", "--expiry-interval", "1",
    "--pod-name", SELF,
)  # fmt: skip
NODE_LOCK_TIMEOUT = 300.0
"""The extender's --node-lock-timeout, left at its default (HAMi's 5 minutes)."""
SETTLE_TIMEOUT = 90.0


@dataclass(frozen=True, slots=True)
class Gpu:
    node: str
    index: int
    uuid: str
    model: str
    memory: int
    cores: int = 100
    slots: int = SPLIT


def gpu_uuid(node: str, index: int) -> str:
    return f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{node}.{index}.e2e')}"


GPUS: dict[str, Gpu] = {
    gpu_uuid(node, index): Gpu(node, index, gpu_uuid(node, index), model, memory)
    for node, models in NODE_MODELS.items()
    for index, (model, memory) in enumerate(models)
}
"""Every GPU of the module's nodes, by UUID."""


def gpus_of(node: str) -> list[Gpu]:
    return [gpu for gpu in GPUS.values() if gpu.node == node]


# ---- fixtures --------------------------------------------------------------------------------------------


def registration(node: str, rng: random.Random) -> str:
    """`hami.io/node-nvidia-register` as HAMi v2.10's plugin writes it (`getAPIDevices`, `MarshalNodeDevices`):
    every field omitempty (index 0 and numa 0 absent), in Go's random map order over the GPUs."""
    listed = []
    for gpu in gpus_of(node):
        entry: dict[str, Any] = {"id": gpu.uuid}
        if gpu.index:
            entry["index"] = gpu.index
        entry |= {"count": gpu.slots, "devmem": gpu.memory, "devcore": gpu.cores, "type": gpu.model}
        if gpu.index >= 2:
            entry["numa"] = 1
        entry |= {"mode": "hami-core", "health": True}
        listed.append(entry)
    rng.shuffle(listed)
    return orjson.dumps(listed).decode()


def hami_node(name: str, rng: random.Random) -> dict[str, Any]:
    """A Ready node HAMi's plugin serves: its registration, `nvidia.com/gpu` = GPUs x split count (one device ID
    per split), and cpu, memory and pods for kube-scheduler's own filters (tests/builders.py make_hami_node)."""
    manifest = node_manifest(name, gpus=0, annotations={REGISTER: registration(name, rng)})
    gpus = str(len(gpus_of(name)) * SPLIT)
    for part in ("capacity", "allocatable"):
        manifest["status"][part][GPU] = gpus
    return manifest


@pytest.fixture(scope="module")
def hami_nodes(control_plane: ControlPlane) -> Iterator[tuple[str, ...]]:
    rng = random.Random(2100)
    for name in NODES:
        control_plane.request("POST", "/api/v1/nodes", hami_node(name, rng))
    yield NODES
    for name in NODES:
        control_plane.request("DELETE", f"/api/v1/nodes/{name}")


@contextlib.contextmanager
def hami_extender(
    control_plane: ControlPlane, tls: TLSFiles, name: str, lease: str, flags: tuple[str, ...], self_pod: str, node: str
) -> Iterator[ExtenderProcess]:
    """The extender `name` serving with HAMi's protocol, with its own pod on `node`: the extender user's rights as
    manifests/hami/ adds them and a Lease (`lease`) of its own, all removed after (the HAMi e2e modules share it)."""
    lease_rules = [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": [lease],
         "verbs": ["get", "update"]},
    ]  # fmt: skip
    created = control_plane.grant(f"{name}-extender", hami_overlay_rules(), {EXTENDER_NAMESPACE: lease_rules})
    try:
        process = ExtenderProcess(name, control_plane.workdir, control_plane.kubeconfig("extender"), tls, flags)
        with serving_with_own_pod(control_plane, process, self_pod, node) as serving:
            yield serving
    finally:
        for path in (*created, f"/apis/coordination.k8s.io/v1/namespaces/{EXTENDER_NAMESPACE}/leases/{lease}"):
            try:
                control_plane.request("DELETE", path)
            except ApiError as error:
                if error.status != 404:
                    raise


@pytest.fixture(scope="module")
def extender(control_plane: ControlPlane, tls: TLSFiles, hami_nodes: tuple[str, ...]) -> Iterator[ExtenderProcess]:
    with hami_extender(control_plane, tls, "e2e-hami", LEASE_NAME, EXTENDER_FLAGS, SELF, hami_nodes[0]) as serving:
        yield serving


@pytest.fixture(scope="module")
def scheduler(control_plane: ControlPlane, extender: ExtenderProcess) -> Iterator[Scheduler]:
    with running_scheduler(control_plane, extender, SCHEDULER_NAME, "--protocol", "hami") as running:
        yield running


@pytest.fixture
async def plugin(control_plane: ControlPlane, hami_nodes: tuple[str, ...]) -> AsyncIterator[DevicePluginDouble]:
    """HAMi's device plugin (and kubelet's calls to it) on the module's nodes, for one test."""
    double = DevicePluginDouble(control_plane, hami_nodes, delay=DELAY)
    async with double.running():
        yield double


# ---- pods ------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Container:
    """A container's HAMi resources (limits): `gpus` GPUs, each with `mem` MiB, else `pct` % of its memory, else
    the whole of it, and `cores` % compute (None: not asked, HAMi's default 0)."""

    gpus: int = 0
    mem: int | None = None
    pct: int | None = None
    cores: int | None = None
    name: str = "main"

    def limits(self) -> dict[str, str]:
        limits = {}
        for resource, amount in ((GPU, self.gpus), (GPUMEM, self.mem), (GPUMEM_PERCENTAGE, self.pct),
                                 (GPUCORES, self.cores)):  # fmt: skip
            if amount:
                limits[resource] = str(amount)
        return limits

    def memory_on(self, gpu: Gpu) -> int:
        """What HAMi reserves on `gpu` (NOTES.md §2: gpumem, else devmem x pct / 100, else the whole GPU)."""
        if self.mem:
            return self.mem
        return gpu.memory * min(self.pct, 100) // 100 if self.pct and self.pct > 0 else gpu.memory

    @property
    def compute(self) -> int:
        return min(self.cores or 0, 100)


@dataclass(frozen=True, slots=True)
class PodSpec:
    name: str
    containers: tuple[Container, ...]
    init: tuple[Container, ...] = ()
    annotations: dict[str, str] = field(default_factory=dict)

    def manifest(self, label: str, scheduler_name: str) -> dict[str, Any]:
        def container(spec: Container) -> dict[str, Any]:
            return {
                "name": spec.name,
                "image": "registry.example/none:latest",
                "resources": {"limits": spec.limits(), "requests": {"cpu": "10m"}},
            }

        spec: dict[str, Any] = {
            "schedulerName": scheduler_name,
            "containers": [container(one) for one in self.containers],
            "terminationGracePeriodSeconds": 0,
        }
        if self.init:
            spec["initContainers"] = [container(one) for one in self.init]
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": self.name,
                "namespace": "default",
                "labels": {TEST_LABEL: label},
                "annotations": dict(self.annotations),
            },
            "spec": spec,
        }


def one(name: str, gpus: int = 1, mem: int | None = None, pct: int | None = None, cores: int | None = None,
        **annotations: str) -> PodSpec:  # fmt: skip
    return PodSpec(name, (Container(gpus, mem, pct, cores),), annotations=annotations)


MULTI = PodSpec(
    "multi",
    (Container(0, name="sidecar"), Container(1, 6000, None, 20, "main"), Container(1, 3000, None, 10, "aux")),
    init=(Container(1, 2000, None, 10, "prep"),),
)
"""An init container and two GPU app containers beside one without GPUs: three Allocate calls, three entries."""


def burst_specs(prefix: str, count: int, seed: int, selectors: bool = True) -> list[PodSpec]:
    """`count` pods of seeded sizes: mostly one GPU with gpumem and often gpucores, some a percentage of memory,
    some two GPUs, a few a whole card (gpucores 100); with `selectors`, some ask for a GPU model or avoid one."""
    rng = random.Random(seed)
    pods = []
    for number in range(count):
        name = f"{prefix}-{number:02d}"
        kind = rng.choices(["mem", "pct", "two", "whole"], weights=[70, 15, 10, 5])[0]
        if kind == "mem":
            spec = one(
                name, 1, rng.choice([2000, 4000, 6000, 8000, 12000, 16000]), None, rng.choice([None, 10, 20, 30])
            )
        elif kind == "pct":
            # With no gpumem HAMi's webhook would add gpucores 100 when none is asked: ask some.
            spec = one(name, 1, None, rng.choice([10, 25, 50]), rng.choice([10, 20, 30]))
        elif kind == "two":
            spec = one(name, 2, rng.choice([4000, 8000]), None, rng.choice([10, 20]))
        else:
            spec = one(name, 1, None, None, 100)
        if selectors:
            choice = rng.random()
            if choice < 0.12:
                spec.annotations[USE_TYPE] = "V100"
            elif choice < 0.18:
                spec.annotations[AVOID_TYPE] = "V100"
            elif choice < 0.24:
                spec.annotations[USE_TYPE] = "a100"  # case-insensitive, as HAMi upper-cases both
        pods.append(spec)
    return pods


@dataclass(slots=True)
class Workload:
    """The pods one test makes (labelled with its name), all deleted after it."""

    control_plane: ControlPlane
    test: str
    specs: dict[str, PodSpec] = field(default_factory=dict)

    async def create(self, spec: PodSpec, scheduler_name: str = SCHEDULER_NAME) -> dict[str, Any]:
        self.specs[spec.name] = spec
        return await self.control_plane.api(
            "POST", "/api/v1/namespaces/default/pods", spec.manifest(self.test, scheduler_name)
        )

    async def burst(self, specs: Sequence[PodSpec]) -> None:
        """Create these pods at once (concurrent requests, as a Job's controller would)."""
        await asyncio.gather(*(self.create(spec) for spec in specs))

    async def pods(self) -> list[dict[str, Any]]:
        listed = await self.control_plane.api(
            "GET", f"/api/v1/namespaces/default/pods?labelSelector={TEST_LABEL}%3D{self.test}"
        )
        return list(listed["items"])

    async def get(self, name: str) -> dict[str, Any]:
        return await self.control_plane.api("GET", f"/api/v1/namespaces/default/pods/{name}")


@pytest.fixture
async def workload(
    control_plane: ControlPlane, extender: ExtenderProcess, plugin: DevicePluginDouble, request: pytest.FixtureRequest
) -> AsyncIterator[Workload]:
    """The test's pods; after it: deleted, every lock left on the nodes removed, and the extender seen empty."""
    test = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[-60:].strip("-")
    made = Workload(control_plane, test)
    yield made

    async def delete(name: str) -> None:
        try:
            await control_plane.delete(f"/api/v1/namespaces/default/pods/{name}")
        except ApiError as error:
            if error.status != 404:
                raise

    await asyncio.gather(*(delete(name) for name in made.specs))
    await eventually(lambda: _none_left(made), what="the test's pods deleted")
    for node in NODES:
        await control_plane.api("PATCH", f"/api/v1/nodes/{node}", {"metadata": {"annotations": {LOCK: None}}})
    if extender.running():
        await start_clean(extender)


async def _none_left(workload: Workload) -> bool:
    return not await workload.pods()


async def start_clean(extender: ExtenderProcess) -> None:
    await extender.until_empty(NODES)


# ---- what the API says -------------------------------------------------------------------------------------


def key_of(pod: dict[str, Any]) -> str:
    return f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"


def annotations_of(obj: dict[str, Any]) -> dict[str, str]:
    return dict(obj["metadata"].get("annotations") or {})


SUFFIXES = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30}


def quantity(text: str) -> int:
    """A whole Kubernetes quantity: the API server writes 4000 back as "4k" (its canonical form)."""
    number = text.rstrip("kKMGi")
    return int(number) * SUFFIXES[text[len(number) :]]


def containers_of(pod: dict[str, Any]) -> tuple[list[Container], list[Container]]:
    """The pod's GPU containers (init, app) as its own spec asks, never from our annotations."""

    def read(container: dict[str, Any]) -> Container:
        limits = (container.get("resources") or {}).get("limits") or {}

        def amount(resource: str) -> int | None:
            return quantity(limits[resource]) if resource in limits else None

        return Container(amount(GPU) or 0, amount(GPUMEM), amount(GPUMEM_PERCENTAGE), amount(GPUCORES),
                         container["name"])  # fmt: skip

    spec = pod["spec"]
    init = [read(c) for c in spec.get("initContainers") or () if read(c).gpus]
    app = [read(c) for c in spec.get("containers") or () if read(c).gpus]
    return init, app


def admits(annotations: dict[str, str], gpu: Gpu) -> bool:
    """HAMi's CheckType / CheckUUID (NOTES.md §7): upper-cased substrings of the type, exact UUIDs."""

    def names(key: str, upper: bool) -> list[str]:
        return [part.strip().upper() if upper else part.strip() for part in annotations.get(key, "").split(",")
                if part.strip()]  # fmt: skip

    model = gpu.model.upper()
    wanted, avoided, uuids = names(USE_TYPE, True), names(AVOID_TYPE, True), names(USE_UUID, False)
    if wanted and not any(name in model for name in wanted):
        return False
    if any(name in model for name in avoided):
        return False
    return not uuids or gpu.uuid in uuids


Usage = dict[str, list[int]]
"""Per GPU UUID: [memory MiB, compute %, slots]."""


def collapse(entries: list[list[tuple[str, int, int]]], init: int) -> Usage:
    """One pod's use of each GPU (HAMi's CollapseInitContainerUsage): init entries at their peak (one slot), app
    entries summed (a slot each), the larger of the two, field by field."""
    peak: Usage = {}
    total: Usage = {}
    for number, entry in enumerate(entries):
        for gpu, memory, cores in entry:
            if number < init:
                old = peak.get(gpu, [0, 0, 1])
                peak[gpu] = [max(old[0], memory), max(old[1], cores), 1]
            else:
                old = total.setdefault(gpu, [0, 0, 0])
                old[0], old[1], old[2] = old[0] + memory, old[1] + cores, old[2] + 1
    return {
        gpu: [max(peak.get(gpu, [0])[0], total.get(gpu, [0])[0]),
              max(peak.get(gpu, [0, 0])[1], total.get(gpu, [0, 0])[1]),
              max(peak.get(gpu, [0, 0, 0])[2], total.get(gpu, [0, 0, 0])[2], 1)]
        for gpu in peak.keys() | total.keys()
    }  # fmt: skip


@dataclass(frozen=True, slots=True)
class State:
    """The cluster as the API shows it: per GPU UUID what the bound pods hold, and who."""

    pods: list[dict[str, Any]]
    locks: dict[str, str]
    """Node -> its `hami.io/mutex.lock` value, for the nodes that have one."""
    used: Usage
    holders: dict[str, set[str]]
    exclusive: dict[str, str]
    """GPU UUID -> the pod holding it whole (100 % compute)."""
    problems: list[str]

    def mine(self, test: str) -> list[dict[str, Any]]:
        return [pod for pod in self.pods if (pod["metadata"].get("labels") or {}).get(TEST_LABEL) == test]

    def use_of(self, gpu: str) -> list[int]:
        return self.used.get(gpu, [0, 0, 0])


def failed(pod: dict[str, Any]) -> bool:
    return annotations_of(pod).get(BIND_PHASE) == "failed"


def ended(pod: dict[str, Any]) -> bool:
    """Succeeded or Failed: it holds nothing (HAMi's `IsPodInTerminatedState`, pkg/util/util.go:300-305)."""
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def allocation_problems(pod: dict[str, Any]) -> tuple[list[list[tuple[str, int, int]]], int, list[str]]:
    """A bound pod's allocation read from its annotations and checked against its spec and its node's GPUs:
    (entries as (uuid, MiB, %) per GPU container, how many are init containers, problems)."""
    node, annotations, key = pod["spec"]["nodeName"], annotations_of(pod), key_of(pod)
    missing = [name for name in (VGPU_NODE, VGPU_TIME, TO_ALLOCATE, ALLOCATED, BIND_PHASE, BIND_TIME)
               if name not in annotations]  # fmt: skip
    if missing:
        return [], 0, [f"{key} bound to {node} without {', '.join(missing)}: {annotations}"]
    problems = []
    if annotations[VGPU_NODE] != node:
        problems.append(f"{key} bound to {node} but {VGPU_NODE} is {annotations[VGPU_NODE]}")
    if annotations[BIND_PHASE] not in ("allocating", "success"):
        problems.append(f"{key}: {BIND_PHASE} {annotations[BIND_PHASE]!r}")
    for name in (VGPU_TIME, BIND_TIME):
        if not annotations[name].isdigit() or not 1_600_000_000 < int(annotations[name]) < 4_000_000_000:
            problems.append(f"{key}: {name} is not Unix seconds: {annotations[name]!r}")
    text = annotations[ALLOCATED]
    try:
        decoded = decode_entries(text)
    except ValueError as error:
        return [], 0, [*problems, f"{key}: {ALLOCATED} unreadable: {error}: {text!r}"]
    init, app = containers_of(pod)
    if decoded[-1] or not all(decoded[:-1]) or len(decoded) - 1 != len(init) + len(app):
        problems.append(f"{key}: {ALLOCATED} {text!r} is not one entry per GPU container ({len(init)} + {len(app)})")
        return [], 0, problems
    entries = []
    for container, devices in zip([*init, *app], decoded[:-1], strict=True):
        where = f"{key} container {container.name}"
        if len(devices) != container.gpus or len({device.uuid for device in devices}) != len(devices):
            problems.append(f"{where} asks {container.gpus} distinct GPUs, given {devices}")
        entry = []
        for device in devices:
            gpu = GPUS.get(device.uuid)
            if gpu is None or gpu.node != node:
                problems.append(f"{where} given {device.uuid}, not a GPU of {node}")
                continue
            if device.kind != "NVIDIA":
                problems.append(f"{where}: type field {device.kind!r}, not NVIDIA (the plugin looks for it)")
            if (device.memory, device.cores) != (container.memory_on(gpu), container.compute):
                problems.append(
                    f"{where} asks {container.memory_on(gpu)} MiB and {container.compute} % on {gpu.uuid}, given "
                    f"{device.memory} MiB and {device.cores} %"
                )
            if not admits(annotations, gpu):
                problems.append(f"{where} placed on {gpu.model} {gpu.uuid}, which its selectors exclude")
            entry.append((device.uuid, device.memory, device.cores))
        entries.append(entry)
    return entries, len(init), problems


def state_of(pods: list[dict[str, Any]], nodes: list[dict[str, Any]]) -> State:
    """Sum what the bound pods hold per GPU (those that ended excepted), checking each on the way."""
    used: Usage = {}
    holders: dict[str, set[str]] = {}
    exclusive: dict[str, str] = {}
    problems: list[str] = []
    for pod in pods:
        node = pod["spec"].get("nodeName")
        if node not in NODE_MODELS or pod["metadata"].get("deletionTimestamp") or ended(pod):
            continue
        if not any(containers_of(pod)):
            continue  # no GPU container: no allocation (the extender's own pod is bound to a node of ours)
        entries, init, found = allocation_problems(pod)
        problems += found
        for held, (memory, cores, slots) in collapse(entries, init).items():
            total = used.setdefault(held, [0, 0, 0])
            total[0], total[1], total[2] = total[0] + memory, total[1] + cores, total[2] + slots
            holders.setdefault(held, set()).add(key_of(pod))
            if cores >= 100:
                exclusive[held] = key_of(pod)
    for held, (memory, cores, slots) in sorted(used.items()):
        gpu = GPUS[held]
        where = f"{gpu.node} GPU {gpu.index} ({held})"
        if memory > gpu.memory or cores > gpu.cores or slots > gpu.slots:
            problems.append(
                f"{where} holds {memory} of {gpu.memory} MiB, {cores} of {gpu.cores} % compute, {slots} of {gpu.slots} "
                f"slots: {sorted(holders[held])}"
            )
        if held in exclusive and holders[held] != {exclusive[held]}:
            problems.append(f"{where} is held whole by {exclusive[held]} but shared: {sorted(holders[held])}")
    locks = {
        node["metadata"]["name"]: annotations_of(node)[LOCK]
        for node in nodes
        if node["metadata"]["name"] in NODE_MODELS and LOCK in annotations_of(node)
    }
    return State(pods, locks, used, holders, exclusive, problems)


async def api_state(control_plane: ControlPlane) -> State:
    """Every pod and node of the cluster, placed from the API."""
    pods, nodes = await asyncio.gather(control_plane.list_pods(), control_plane.api("GET", "/api/v1/nodes"))
    return state_of(list(pods["items"]), list(nodes["items"]))


def serves(container: Container, gpu: Gpu, used: list[int], annotations: dict[str, str]) -> bool:
    """Whether `gpu`, holding `used`, takes the container (HAMi's Fit, NOTES.md §3 rows 3-11)."""
    memory, cores, slots = used
    return (
        admits(annotations, gpu)
        and slots < gpu.slots
        and gpu.memory - memory >= container.memory_on(gpu)
        and gpu.cores - cores >= container.compute
        and not (gpu.cores == 100 and container.compute == 100 and slots > 0)
        and not (cores >= gpu.cores and container.compute == 0)
    )


def fits_now(pod: dict[str, Any], state: State) -> str | None:
    """A node where the pod could be placed now, from the API's state alone (None: nowhere). Init containers are
    placed against the node as it is, app containers one after the other; every choice of GPUs is tried."""
    init, app = containers_of(pod)
    annotations = annotations_of(pod)
    for node in NODES:
        gpus = gpus_of(node)

        def place(rest: list[Container], app_used: Usage, gpus: list[Gpu] = gpus) -> bool:
            if not rest:
                return True
            container, *others = rest
            is_init = len(rest) > len(app)
            base = state.used if is_init else app_used
            serving = [gpu for gpu in gpus if serves(container, gpu, base.get(gpu.uuid, [0, 0, 0]), annotations)]
            for chosen in itertools.combinations(serving, container.gpus):
                after = app_used
                if not is_init:
                    after = {gpu: list(use) for gpu, use in app_used.items()}
                    for gpu in chosen:
                        use = after.setdefault(gpu.uuid, [0, 0, 0])
                        use[0], use[1], use[2] = (
                            use[0] + container.memory_on(gpu),
                            use[1] + container.compute,
                            use[2] + 1,
                        )
                if place(others, after):
                    return True
            return False

        if place([*init, *app], {gpu: list(use) for gpu, use in state.used.items()}):
            return node
    return None


def describe(state: State, test: str) -> str:
    lines = ["pods:"]
    for pod in sorted(state.mine(test), key=key_of):
        annotations = annotations_of(pod)
        init, app = containers_of(pod)
        asks = "; ".join(f"{c.gpus}x{c.mem or (f'{c.pct}%' if c.pct else 'all')}/{c.compute}%" for c in [*init, *app])
        where = pod["spec"].get("nodeName") or "-"
        selectors = ",".join(f"{k.split('/')[1]}={v}" for k, v in annotations.items() if k in (USE_TYPE, AVOID_TYPE))
        lines.append(
            f"  {key_of(pod):28} {asks:32} {selectors:22} {where:11} {annotations.get(BIND_PHASE, '-'):10} "
            f"{annotations.get(ALLOCATED, '')}"
        )
    lines.append("GPUs (MiB, %, slots):")
    for gpu in GPUS.values():
        memory, cores, slots = state.use_of(gpu.uuid)
        lines.append(
            f"  {gpu.node}/{gpu.index} {gpu.model[-14:]:14} {memory:6}/{gpu.memory} {cores:3}% {slots}/{gpu.slots}"
        )
    lines.append(f"locks: {state.locks}")
    return "\n".join(lines)


async def diagnostics(
    control_plane: ControlPlane, test: str, extender: ExtenderProcess, scheduler: Scheduler, plugin: DevicePluginDouble
) -> str:
    return "\n\n".join(
        [
            describe(await api_state(control_plane), test),
            f"plugin double: {len(plugin.accepted)} accepted, refused {plugin.refused}, violations {plugin.violations}",
            f"extender {extender.name} log tail:\n{extender.tail()}",
            f"kube-scheduler log tail:\n{scheduler.tail()}",
        ]
    )


async def settle(
    control_plane: ControlPlane,
    workload: Workload,
    extender: ExtenderProcess,
    scheduler: Scheduler,
    plugin: DevicePluginDouble,
    timeout: float = SETTLE_TIMEOUT,
) -> State:
    """Wait until every pod of the workload is bound and through its plugin (allocated or refused) or fits
    nowhere now, and no node is locked. The invariants are checked on every poll."""
    deadline = time.monotonic() + timeout
    while True:
        state = await api_state(control_plane)
        if state.problems or plugin.violations:
            pytest.fail(
                "invariant broken while placing:\n"
                + "\n".join(state.problems + plugin.violations)
                + "\n\n"
                + await diagnostics(control_plane, workload.test, extender, scheduler, plugin)
            )
        mine = state.mine(workload.test)
        waiting = [
            key_of(pod)
            for pod in mine
            if (
                not plugin.admitted(pod["metadata"]["uid"])
                if pod["spec"].get("nodeName")
                else fits_now(pod, state) is not None
            )
        ]
        if len(mine) == len(workload.specs) and not waiting and not state.locks:
            return state
        if time.monotonic() > deadline:
            pytest.fail(
                f"still waiting after {timeout:.0f} s: {waiting}\n\n"
                + await diagnostics(control_plane, workload.test, extender, scheduler, plugin)
            )
        await asyncio.sleep(0.25)


async def inspect_differences(extender: ExtenderProcess, state: State) -> list[str]:
    """How the extender's /inspect differs from the API's state on our nodes (empty when equal): every GPU's
    memory, compute, slots and pods, and every node's lock."""
    report = await extender.inspect()
    problems = [] if report["reservations"] == 0 else [f"{report['reservations']} reservations left"]
    shown = {node["name"]: node for node in report["nodes"]}
    for name in NODES:
        node = shown.get(name)
        if node is None or not node["known"]:
            problems.append(f"{name} not in the extender's cache")
            continue
        lock = state.locks.get(name)
        holder = lock_holder(lock) if lock else None
        expected_lock = f"{holder[0]}/{holder[1]}" if holder else None
        if (node.get("lock") or {}).get("pod") != expected_lock:
            problems.append(f"{name}: extender shows lock {node.get('lock')}, the API {lock}")
        for device in node["devices"]:
            gpu = GPUS.get(device.get("uuid", ""))
            if gpu is None or gpu.node != name:
                problems.append(f"{name}: unknown device {device}")
                continue
            pods = {holder["pod"] for holder in device["pods"]}
            shown_use = [device["used"], device.get("used_cores"), device.get("used_slots")]
            if shown_use != state.use_of(gpu.uuid) or pods != state.holders.get(gpu.uuid, set()):
                problems.append(
                    f"{name} GPU {gpu.index}: extender {shown_use} {sorted(pods)}, API {state.use_of(gpu.uuid)} "
                    f"{sorted(state.holders.get(gpu.uuid, set()))}"
                )
            if (device["index"], device["capacity"], device.get("cores"), device.get("slots"), device.get("model")) != (
                gpu.index, gpu.memory, gpu.cores, gpu.slots, gpu.model
            ):  # fmt: skip
                problems.append(f"{name} GPU {gpu.index} read as {device}")
            if any(holder["state"] != "observed" for holder in device["pods"]):
                problems.append(f"{name} GPU {gpu.index} holds unobserved pods: {device['pods']}")
    return problems


async def assert_extender_agrees(control_plane: ControlPlane, extender: ExtenderProcess) -> None:
    """The extender's view equals the API's (allowing its watch a moment to catch up)."""

    async def differences() -> list[str]:
        return await inspect_differences(extender, await api_state(control_plane))

    await assert_agrees(extender, differences)


def assert_allocated_once(state: State, test: str, plugin: DevicePluginDouble) -> list[dict[str, Any]]:
    """Every bound pod of the test went through the plugin exactly once, found by its lock, with exactly the
    entries its annotations record; the plugin never found a lock (or pod) other than the pod kubelet admitted.
    Returns the bound pods."""
    bound = [pod for pod in state.mine(test) if pod["spec"].get("nodeName")]
    by_uid: dict[str, list[Any]] = {}
    for allocation in plugin.allocations:
        by_uid.setdefault(allocation.uid, []).append(allocation)
    problems = list(plugin.violations)
    for pod in bound:
        done = by_uid.get(pod["metadata"]["uid"], [])
        if len(done) != 1:
            problems.append(f"{key_of(pod)} went through the plugin {len(done)} times: {done}")
            continue
        (allocation,) = done
        recorded = tuple(entry for entry in annotations_of(pod)[ALLOCATED].split(";") if entry)
        if not failed(pod) and (not allocation.accepted or allocation.entries != recorded):
            problems.append(f"{key_of(pod)} records {recorded}, the plugin gave {allocation}")
        if set(allocation.found_by) != {"lock"}:
            problems.append(f"{key_of(pod)}: the plugin found it by {allocation.found_by}, not by the node lock")
        # Every entry consumed, one kubelet call each: the erase patch blanks the entry and adds a `;` per round
        # trip, so n entries end as 2n `;` (NOTES.md §6: `;;` for one, `;;;;` for two).
        if not failed(pod) and annotations_of(pod)[TO_ALLOCATE] != ";" * (2 * len(recorded)):
            problems.append(f"{key_of(pod)}: {TO_ALLOCATE} left as {annotations_of(pod)[TO_ALLOCATE]!r}")
    assert not problems, "\n".join(problems)
    return bound


# ---- metrics ---------------------------------------------------------------------------------------------


async def lock_figures(extender: ExtenderProcess) -> dict[str, int]:
    """Binds by outcome, and filter rejections because a node was locked, from /metrics."""
    text = await extender.metrics()
    figures = {
        f"binds/{match.group(1)}": int(float(match.group(2)))
        for match in re.finditer(r'^extender_binds_total\{outcome="(\w+)"\} (\S+)$', text, re.M)
    }
    locked = re.search(r'^extender_filter_rejections_total\{cause="locked"\} (\S+)$', text, re.M)
    figures["filter_rejections/locked"] = int(float(locked.group(1))) if locked else 0
    filters = re.search(r'^extender_requests_total\{outcome="ok",verb="filter"\} (\S+)$', text, re.M)
    figures["filters"] = int(float(filters.group(1))) if filters else 0
    return figures


def difference(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {key: value - before.get(key, 0) for key, value in after.items() if value - before.get(key, 0)}


async def binds_failed_on_locks(control_plane: ControlPlane, workload: Workload) -> int:
    """The extender's FailedBinding Events on the test's pods that name a node lock (from the API)."""
    listed = await control_plane.api("GET", "/api/v1/namespaces/default/events")
    return sum(
        int(event.get("count") or 1)
        for event in listed["items"]
        if event.get("reason") == "FailedBinding"
        and (event.get("involvedObject") or {}).get("name") in workload.specs
        and "is locked for pod" in str(event.get("message"))
    )


# ---- tests -----------------------------------------------------------------------------------------------


async def test_a_burst_of_hami_pods_is_placed_within_every_gpu_and_through_the_node_lock(
    control_plane: ControlPlane,
    extender: ExtenderProcess,
    scheduler: Scheduler,
    plugin: DevicePluginDouble,
    workload: Workload,
) -> None:
    """40 pods at once: one with an init container and two GPU app containers, then 39 of seeded sizes (gpumem,
    gpumem-percentage, gpucores, two GPUs, whole cards; some selecting or avoiding a GPU model), near the
    cluster's capacity. Prints what the node lock cost: the plugin's time from binding to allocation, how long
    each lock was held, binds failed on a lock (each an error, so a backoff, for the pod in kube-scheduler)
    and nodes the filter refused as locked."""
    await start_clean(extender)
    before = await lock_figures(extender)
    scheduler_log = len(scheduler.log())
    started = time.monotonic()
    await workload.create(MULTI)  # first: kube-scheduler takes pods oldest first, so it meets empty GPUs
    await workload.burst(burst_specs("burst", 39, seed=11))
    state = await settle(control_plane, workload, extender, scheduler, plugin)
    elapsed = time.monotonic() - started

    bound = assert_allocated_once(state, workload.test, plugin)
    pending = [pod for pod in state.mine(workload.test) if not pod["spec"].get("nodeName")]
    assert len(bound) >= 30, describe(state, workload.test)
    assert "default/multi" in {key_of(pod) for pod in bound}
    assert not plugin.refused
    await assert_extender_agrees(control_plane, extender)
    figures = difference(await lock_figures(extender), before)
    figures["FailedBinding events naming a lock"] = await binds_failed_on_locks(control_plane, workload)
    figures["kube-scheduler 'Failed to bind pod'"] = scheduler.log()[scheduler_log:].count("Failed to bind pod")
    print(
        f"\nHAMi burst on {len(NODES)} nodes / {len(GPUS)} GPUs (split {SPLIT}): {len(bound)} bound, "
        f"{len(pending)} pending (fit nowhere) after {elapsed:.1f} s"
        f"\nnode lock: {plugin.latency_summary()}; {plugin.locks.summary()}"
        f"\nextender: {figures}"
    )


async def test_a_burst_survives_the_extender_killed_while_every_node_waits_for_its_plugin(
    control_plane: ControlPlane,
    extender: ExtenderProcess,
    scheduler: Scheduler,
    plugin: DevicePluginDouble,
    workload: Workload,
) -> None:
    """Killed mid-burst at a moment every node is locked for a pod bound there whose plugin has not allocated yet
    (the double paused: a slow kubelet), so no bind is between its lock and its binding (what happens when one is:
    `test_the_pod_a_lock_names_is_placed_on_its_node`). The restarted extender must rebuild the allocations, the
    ones still `allocating` included, and the locks from the API, and honour them when the plugin goes on."""
    await start_clean(extender)
    await workload.burst(burst_specs("before", 16, seed=23))
    await eventually(lambda: _accepted(plugin, 4), interval=0.05, what="the first allocations")
    plugin.pause()

    async def every_node_waits() -> bool:
        state = await api_state(control_plane)
        bound = {key_of(pod): pod["spec"].get("nodeName") for pod in state.pods}
        holders = {node: lock_holder(value) for node, value in state.locks.items()}
        return all(
            (held := holders.get(node)) is not None and bound.get(f"{held[0]}/{held[1]}") == node for node in NODES
        )

    await eventually(every_node_waits, what="every node locked for a pod bound there, awaiting its plugin")
    try:
        await _kill_and_restart(control_plane, extender, scheduler, plugin, workload)
    finally:
        plugin.resume()
        if not extender.running():  # the module's other tests need it
            extender.start()
            extender.wait_until(200)


async def _accepted(plugin: DevicePluginDouble, count: int) -> bool:
    return len(plugin.accepted) >= count


async def _kill_and_restart(
    control_plane: ControlPlane,
    extender: ExtenderProcess,
    scheduler: Scheduler,
    plugin: DevicePluginDouble,
    workload: Workload,
) -> None:
    assert extender.signal(signal.SIGKILL) == -signal.SIGKILL
    at_kill = await api_state(control_plane)
    assert not at_kill.problems, at_kill.problems
    allocated_at_kill = {
        key_of(pod): annotations_of(pod)[ALLOCATED]
        for pod in at_kill.mine(workload.test)
        if pod["spec"].get("nodeName")
    }
    refused = scheduler.log().count("connection refused")
    await workload.burst(burst_specs("after", 8, seed=29, selectors=False))

    async def scheduler_found_it_down() -> bool:
        return scheduler.log().count("connection refused") > refused

    await eventually(scheduler_found_it_down, what="kube-scheduler calling the dead extender")
    assert not [pod for pod in (await api_state(control_plane)).mine(workload.test)
                if pod["metadata"]["name"].startswith("after-") and pod["spec"].get("nodeName")]  # fmt: skip

    restarted = time.monotonic()
    extender.start()
    ready_after = extender.wait_until(200)
    await assert_extender_agrees(control_plane, extender)  # locks held, allocations still `allocating` counted
    plugin.resume()
    state = await settle(control_plane, workload, extender, scheduler, plugin)
    settled_after = time.monotonic() - restarted

    bound = assert_allocated_once(state, workload.test, plugin)
    kept = {key_of(pod): annotations_of(pod)[ALLOCATED] for pod in bound if key_of(pod) in allocated_at_kill}
    assert kept == allocated_at_kill, "an allocation made before the kill was lost or rewritten"
    assert any(pod["metadata"]["name"].startswith("after-") for pod in bound), describe(state, workload.test)
    assert not plugin.refused
    await assert_extender_agrees(control_plane, extender)
    print(
        f"\nkilled with {len(allocated_at_kill)} pods bound, every node locked; ready {ready_after:.1f} s after the "
        f"restart, all placed {settled_after:.1f} s after it: {len(bound)} bound, "
        f"{len(state.mine(workload.test)) - len(bound)} pending; {plugin.latency_summary()}"
    )


async def test_a_pod_its_plugin_could_not_allocate_holds_its_gpu_until_it_ends(
    control_plane: ControlPlane,
    extender: ExtenderProcess,
    scheduler: Scheduler,
    plugin: DevicePluginDouble,
    workload: Workload,
) -> None:
    """The plugin refuses a pod that holds a whole GPU (`bind-phase: failed`): the pod stays bound with its
    allocation recorded and, as hami-scheduler counts it (sch/scheduler.go:144-153, 185-190: bind-phase is never
    read), its GPU stays taken until the pod ends, for HAMi's plugin keeps what it made for a pod not yet ended
    (plug/server.go:358-378). A pod that needs that very GPU is refused meanwhile; once the first is Failed
    (kubelet's UnexpectedAdmissionError, written by the test as kubelet, absent here, would), it is placed there."""
    await start_clean(extender)
    target = gpus_of("e2e-hami-2")[0]
    plugin.refuse["doomed"] = "e2e: the GPU vanished from NVML"
    await workload.create(one("doomed", 1, None, None, 100, **{USE_UUID: target.uuid}))

    async def refused() -> dict[str, Any] | None:
        pod = await workload.get("doomed")
        return pod if failed(pod) else None

    doomed = await eventually(refused, what="the plugin refusing the pod")
    assert doomed["spec"]["nodeName"] == target.node
    assert annotations_of(doomed)[ALLOCATED] == f"{target.uuid},NVIDIA,{target.memory},100:;"
    assert [allocation.reason for allocation in plugin.refused] == ["e2e: the GPU vanished from NVML"]
    assert LOCK not in annotations_of(await control_plane.api("GET", f"/api/v1/nodes/{target.node}"))
    await workload.create(one("heir", 1, None, None, 100, **{USE_UUID: target.uuid}))

    async def waiting() -> bool:
        pod = await workload.get("heir")
        conditions = (pod.get("status") or {}).get("conditions") or ()
        unschedulable = any(c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable" for c in conditions)
        return unschedulable and not pod["spec"].get("nodeName")

    await eventually(waiting, timeout=20, what="the pod needing the refused pod's GPU refused while it is Pending")
    report = await extender.inspect()
    (node,) = [node for node in report["nodes"] if node["name"] == target.node]
    device = next(device for device in node["devices"] if device["uuid"] == target.uuid)
    assert device["used"] == target.memory, device
    path = "/api/v1/namespaces/default/pods/doomed/status"
    await control_plane.api("PATCH", path, {"status": {"phase": "Failed", "reason": "UnexpectedAdmissionError"}})
    state = await settle(control_plane, workload, extender, scheduler, plugin)
    heir = next(pod for pod in state.mine(workload.test) if pod["metadata"]["name"] == "heir")
    assert heir["spec"].get("nodeName") == target.node, describe(state, workload.test)
    assert annotations_of(heir)[BIND_PHASE] == "success"
    assert annotations_of(heir)[ALLOCATED] == f"{target.uuid},NVIDIA,{target.memory},100:;"
    assert state.holders[target.uuid] == {"default/heir"}
    assert_allocated_once(state, workload.test, plugin)
    await assert_extender_agrees(control_plane, extender)


async def test_pods_selecting_a_gpu_model_land_only_on_gpus_of_that_model(
    control_plane: ControlPlane,
    extender: ExtenderProcess,
    scheduler: Scheduler,
    plugin: DevicePluginDouble,
    workload: Workload,
) -> None:
    await start_clean(extender)
    specs = [
        *(one(f"v100-{number}", 1, 8000, None, 20, **{USE_TYPE: "V100"}) for number in range(4)),
        one("v100-pair", 2, 4000, None, 10, **{USE_TYPE: "Tesla V100"}),
        *(one(f"not-v100-{number}", 1, 8000, None, 20, **{AVOID_TYPE: "v100"}) for number in range(3)),
        *(one(f"a100-{number}", 1, None, 25, 30, **{USE_TYPE: "H100, A100"}) for number in range(2)),
    ]
    await workload.burst(specs)
    state = await settle(control_plane, workload, extender, scheduler, plugin)
    bound = assert_allocated_once(state, workload.test, plugin)
    assert len(bound) == len(specs), describe(state, workload.test)
    models = {
        pod["metadata"]["name"]: {
            GPUS[device.uuid].model for entry in decode_entries(annotations_of(pod)[ALLOCATED]) for device in entry
        }
        for pod in bound
    }
    assert all(models[name] == {V100[0]} for name in models if name.startswith("v100-")), models
    assert all(models[name] == {A100[0]} for name in models if not name.startswith("v100-")), models
    await assert_extender_agrees(control_plane, extender)


async def test_a_quota_counts_the_whole_card_hami_gives_and_a_compute_limit_of_0_keeps_pods_off_its_model(
    control_plane: ControlPlane,
    extender: ExtenderProcess,
    scheduler: Scheduler,
    plugin: DevicePluginDouble,
    cleanup: Remember,
    workload: Workload,
) -> None:
    """HAMi's own quota keys, as hami-scheduler enforces them in Fit (`pkg/device/nvidia/device.go:666-692`,
    `pkg/device/quota.go:62-95`): four pods asking a whole card (`nvidia.com/gpu: 1`, no memory: Kubernetes'
    own quota would count nothing) under 81,920 MiB of GPU memory and 0 % of V100 compute. Each is given a
    whole A100 (40,960 MiB), none a V100: two are placed, the other two wait, saying why."""
    await start_clean(extender)
    path = "/api/v1/namespaces/default/resourcequotas/hami-team"
    hard = {"limits.nvidia.com/gpumem": "81920", "limits.nvidia.com/gpucores.V100": "0"}
    await control_plane.api(
        "POST", "/api/v1/namespaces/default/resourcequotas", {"metadata": {"name": "hami-team"}, "spec": {"hard": hard}}
    )
    cleanup(path)

    async def seen() -> bool:
        return any(entry["name"] == "hami-team" for entry in (await extender.inspect())["quotas"])

    await eventually(seen, what="the quota in the extender's /inspect")
    await workload.burst([one(f"card-{number}", 1, None, None, 100) for number in range(4)])

    async def placed() -> tuple[list[dict[str, Any]], list[dict[str, Any]]] | None:
        pods = await workload.pods()
        bound = [pod for pod in pods if pod["spec"].get("nodeName")]
        waiting = [pod for pod in pods if not pod["spec"].get("nodeName")]
        refused = all(
            condition.get("reason") == "Unschedulable"
            for pod in waiting
            for condition in (pod.get("status") or {}).get("conditions") or ()
            if condition.get("type") == "PodScheduled"
        )
        admitted = all(plugin.admitted(pod["metadata"]["uid"]) for pod in bound)
        return (bound, waiting) if len(bound) == 2 and len(waiting) == 2 and refused and admitted else None

    bound, waiting = await eventually(placed, timeout=60, what="2 placed, 2 refused")
    state = await api_state(control_plane)
    assert not state.problems, state.problems
    given = {
        (GPUS[device.uuid].model, device.memory)
        for pod in bound
        for entry in decode_entries(annotations_of(pod)[ALLOCATED])
        for device in entry
    }
    assert given == {A100}, "a whole A100 each"
    reason = "namespace default uses 81920 of its 81920 MiB of GPU memory (ResourceQuota hami-team); this pod needs"
    events = await control_plane.api("GET", "/api/v1/namespaces/default/events")
    for pod in waiting:
        messages = [
            str(event.get("message"))
            for event in events["items"]
            if event.get("reason") == "FailedScheduling"
            and (event.get("involvedObject") or {}).get("uid") == pod["metadata"]["uid"]
        ]
        assert any(reason in message for message in messages), messages
    await assert_extender_agrees(control_plane, extender)


def rfc3339(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


async def lock_node(control_plane: ControlPlane, node: str, since: float, pod: str) -> None:
    """Write the node's lock for `pod` as the extender does before a binding (nodelock.py)."""
    value = f"{rfc3339(since)},default,{pod}"
    await control_plane.api("PATCH", f"/api/v1/nodes/{node}", {"metadata": {"annotations": {LOCK: value}}})


async def allocated_on(workload: Workload, plugin: DevicePluginDouble, name: str, node: str) -> bool:
    """Whether the pod is bound to `node` and its plugin has allocated it."""
    pod = await workload.get(name)
    return pod["spec"].get("nodeName") == node and any(
        allocation.uid == pod["metadata"]["uid"] for allocation in plugin.accepted
    )


def pinned_to(node: str, name: str) -> PodSpec:
    """A small pod that only the GPUs of `node` may take."""
    return one(name, 1, 4000, None, 10, **{USE_UUID: ",".join(gpu.uuid for gpu in gpus_of(node))})


async def test_a_lock_that_grows_stale_on_a_quiet_node_stops_refusing_pods(
    control_plane: ControlPlane,
    extender: ExtenderProcess,
    scheduler: Scheduler,
    plugin: DevicePluginDouble,
    workload: Workload,
) -> None:
    """A lock whose pod exists but is never bound there (an abandoned bind), written 2 s short of the lock
    timeout: once it is older, the node takes pods again though the Node object never changes (the bind takes
    the stale lock over)."""
    await start_clean(extender)
    node = "e2e-hami-2"
    await workload.create(one("never-bound", 1, 4000, None, 10), scheduler_name=NOBODY)
    await lock_node(control_plane, node, time.time() - NODE_LOCK_TIMEOUT + 2, "never-bound")
    await workload.create(pinned_to(node, "waiting"))
    await eventually(
        lambda: allocated_on(workload, plugin, "waiting", node),
        timeout=15,
        what="the pod placed once the lock is stale",
    )
    assert [allocation.found_by for allocation in plugin.accepted] == [("lock",)]


async def test_the_pod_a_lock_names_is_placed_on_its_node(
    control_plane: ControlPlane,
    extender: ExtenderProcess,
    scheduler: Scheduler,
    plugin: DevicePluginDouble,
    workload: Workload,
) -> None:
    """What a SIGKILL between the lock and the Binding leaves: the node locked, fresh, for a pod still pending."""
    await start_clean(extender)
    node = "e2e-hami-2"
    await lock_node(control_plane, node, time.time(), "orphan-holder")
    await workload.create(pinned_to(node, "orphan-holder"))
    await eventually(
        lambda: allocated_on(workload, plugin, "orphan-holder", node), timeout=4, what="the lock's own pod placed"
    )
    assert [allocation.found_by for allocation in plugin.accepted] == [("lock",)]


def binding_args(pod: dict[str, Any], node: str) -> dict[str, str]:
    meta = pod["metadata"]
    return {"PodName": meta["name"], "PodNamespace": meta["namespace"], "PodUID": meta["uid"], "Node": node}


async def filter_reply(extender: ExtenderProcess, pod: dict[str, Any], node: str) -> dict[str, Any]:
    return dict(await extender.post("filter", {"Pod": pod, "NodeNames": [node]}))


async def bind_by_hand(extender: ExtenderProcess, pod: dict[str, Any], node: str) -> None:
    """Filter then bind the pod to `node` through the extender, as kube-scheduler would."""

    async def passes() -> bool:
        return (await filter_reply(extender, pod, node)).get("NodeNames") == [node]

    await eventually(passes, what=f"{key_of(pod)} fitting {node}")
    assert (await extender.post("bind", binding_args(pod, node)))["Error"] == ""


async def test_a_bind_refused_for_a_locked_node_counts_as_refused(
    control_plane: ControlPlane, extender: ExtenderProcess, workload: Workload
) -> None:
    await start_clean(extender)
    node = "e2e-hami-2"
    await workload.create(one("holder", 1, 4000, None, 10), scheduler_name=NOBODY)
    await lock_node(control_plane, node, time.time(), "holder")
    second = await workload.create(pinned_to(node, "second"), scheduler_name=NOBODY)

    async def refused_as_locked() -> bool:
        reply = await filter_reply(extender, second, node)
        return "is locked for pod default/holder" in (reply.get("FailedNodes") or {}).get(node, "")

    await eventually(refused_as_locked, what="the filter refusing the locked node")
    before = await lock_figures(extender)
    error = (await extender.post("bind", binding_args(second, node)))["Error"]
    assert "is locked for pod default/holder" in error
    assert not (await workload.get("second"))["spec"].get("nodeName")
    assert difference(await lock_figures(extender), before) == {"binds/refused": 1}


async def test_a_bind_to_a_node_its_plugin_is_about_to_release_waits_for_the_lock(
    control_plane: ControlPlane, extender: ExtenderProcess, plugin: DevicePluginDouble, workload: Workload
) -> None:
    await start_clean(extender)
    node = "e2e-hami-2"
    first = await workload.create(pinned_to(node, "first"), scheduler_name=NOBODY)
    second = await workload.create(pinned_to(node, "second"), scheduler_name=NOBODY)
    plugin.pause()  # kubelet slow to admit `first`: its lock stays held until resumed
    await bind_by_hand(extender, first, node)
    binding = asyncio.create_task(extender.post("bind", binding_args(second, node)))
    await asyncio.sleep(0.5)  # not an assertion: how long the plugin keeps the lock
    plugin.resume()
    assert (await binding)["Error"] == ""
    await eventually(
        lambda: allocated_on(workload, plugin, "second", node), what="the second pod allocated after the first"
    )
    assert [allocation.pod for allocation in plugin.accepted] == ["default/first", "default/second"]


def test_serve_help_documents_the_hami_flags() -> None:
    shown = subprocess.run([sys.executable, "-m", "extender", "serve", "--help"], capture_output=True, text=True)
    assert shown.returncode == 0, shown.stderr[-400:]
    assert "--protocol" in shown.stdout and "--node-lock-timeout" in shown.stdout
