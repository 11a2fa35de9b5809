"""End to end with HAMi's topology features (v2.10.0): a real kube-scheduler v1.34.1 calls a real `extender serve
--protocol hami` on 8-GPU NVLink boxes and a PCIe box whose Node objects carry `hami.io/node-nvidia-score` as HAMi's
device plugin writes it, and the plugin double (`deviceplugin.py`) allocates every pod bound.

The boxes (`BOXES`): two NVLink boxes of eight A100-SXM4-80GB in two islands of four, each island on its own CPU
(NUMA 0 and 1), and one box of four A100 80GB PCIe on one CPU. HAMi's paths at tag v2.10.0 (commit 4707fb02),
`nv/` = pkg/device/nvidia/: the plugin publishes the scores only with `ENABLE_TOPOLOGY_SCORE=true`, as
`json.Marshal` of one `{"uuid", "score"}` per GPU (pkg/device-plugin/nvidiadevice/nvinternal/plugin/
register.go:279-301, nv/calculate_score.go:165-172), each GPU's entry holding every other GPU
(nv/calculate_score.go:190-209). A pair's score is the sum of its links (nv/calculate_score.go:211-285): the
PCIe path NVML finds for every pair (nv/links.go:125-148; nv/calculate_score.go:115-124) and the NVLinks, when
any (nv/links.go:151-195, 264-279; nv/calculate_score.go:126-132). So two GPUs of one island, under one CPU and
joined by two NVLinks, score 20 (`P2PLinkSameCPU`) + 200 (`TwoNVLINKLinks`) = 220; two of different islands,
across the CPUs' interconnect, 10 (`P2PLinkCrossCPU`); two of the PCIe box, under its one CPU, 20. Two NVLinks a
pair rather than NV12's twelve: inside an island every pair is alike and any NVLink pair outweighs any PCIe
path, so 200 or 1,200 changes no choice the extender makes (it compares sums of pairs, and its node term counts
a pair as at most one NVLink, `topology.NVLINK`); 200 is the box of the unit tests
(tests/core/protocols/test_hami_topology.py), and keeps the numbers readable.

What is checked, from the API's Pod objects alone (`hami.io/vgpu-devices-allocated` read against the pod's spec
and the node's registration and scores), on every poll while a burst is placed for the invariants, at the end
for the rest:
- every pod bound went through the plugin once, by the node lock; no GPU holds more memory, compute or pods
  than it registers;
- **topology-aware** pods (`hami.io/gpu-scheduler-policy: topology-aware`) asking k of 2 or 4 GPUs: their GPUs'
  pairs sum (HAMi's `computeBestCombination`, nv/device.go:953-978) at least as high as any k GPUs of their node
  that could still hold them at the end, their own allocation taken away (`link_problems`). Sound, though the
  moment of placement is gone: during a burst pods only arrive (none is refused or deleted), so a GPU that could
  hold the pod at the end could at its placement, and the set chosen then was the best linked of a larger
  choice. On an NVLink box it says: one island, whenever an island still has k GPUs that could hold the pod. It
  fails for a choice blind to the links: every test starts from `holders`, GPUs held so that binpack's order
  (the fullest first, then the lower index) crosses islands, and
  `test_a_topology_aware_pod_takes_the_intact_island_where_binpack_would_cross_it` computes that order in the
  test before each pod;
- **numa-bind** pods (`nvidia.com/numa-bind: "true"`): their GPUs on one NUMA node (`numa` of the registration).

The module shares one extender, one kube-scheduler (its own schedulerName) and the three boxes. What is not about
topology (pods, the workload, HAMi's usage arithmetic, a GPU's fit, the plugin's one pass per pod) comes from
test_hami.py.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import re
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import pytest

from tests.e2e.controlplane import EXTENDER_NAMESPACE, ApiError, ControlPlane, eventually, node_manifest
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
from tests.e2e.extender_process import ExtenderProcess, TLSFiles, assert_agrees
from tests.e2e.scheduler import Scheduler, running_scheduler
from tests.e2e.test_hami import (
    DELAY,
    USE_TYPE,
    USE_UUID,
    VGPU_TIME,
    Container,
    Gpu,
    PodSpec,
    State,
    Usage,
    Workload,
    annotations_of,
    assert_allocated_once,
    collapse,
    containers_of,
    ended,
    gpu_uuid,
    hami_extender,
    key_of,
    one,
    serves,
)

pytestmark = pytest.mark.e2e

SCHEDULER_NAME = "hami-topology-e2e-scheduler"
SELF = "e2e-hami-topology-extender-self"
LEASE_NAME = "e2e-hami-topology"
EXTENDER_FLAGS = (
    "--protocol", "hami",
    "--lease-namespace", EXTENDER_NAMESPACE, "--lease-name", LEASE_NAME,
    "--reservation-ttl", "10", "--expiry-interval", "1",
    "--pod-name", SELF,
)  # fmt: skip
SETTLE_TIMEOUT = 60.0

SCORES = "hami.io/node-nvidia-score"
POLICY = "hami.io/gpu-scheduler-policy"
TOPOLOGY_AWARE = {POLICY: "topology-aware"}
NUMA_BIND = {"nvidia.com/numa-bind": "true"}

CROSS_CPU = 10
"""`P2PLinkCrossCPU` (nv/calculate_score.go:234-235): a PCIe path across the CPUs' interconnect."""
SAME_CPU = 20
"""`P2PLinkSameCPU` (nv/calculate_score.go:236-237): a PCIe path under one CPU."""
TWO_NVLINKS = 200
"""`TwoNVLINKLinks` (nv/calculate_score.go:248-249)."""
SPLIT = 10
"""The registered `count` of every GPU: pods one GPU takes at most."""
A100_80 = ("NVIDIA A100-SXM4-80GB", 81920)
A100_PCIE = ("NVIDIA A100 80GB PCIe", 81920)
"""(type, devmem MiB): NVML's names and total memory (test_hami_mig.py's MIG GPUs are the same A100_80)."""


@dataclass(frozen=True, slots=True)
class Box:
    """A server's GPUs and their wiring: islands of `island` GPUs joined by NVLink, island i under CPU i (NUMA
    node i); `island` 0: PCIe alone, every GPU under one CPU."""

    model: tuple[str, int]
    gpus: int
    island: int = 0

    def numa(self, index: int) -> int:
        return index // self.island if self.island else 0

    def score(self, a: int, b: int) -> int:
        """The pair's score as HAMi's plugin sums its links (nv/calculate_score.go:211-285)."""
        if not self.island:
            return SAME_CPU
        return SAME_CPU + TWO_NVLINKS if self.numa(a) == self.numa(b) else CROSS_CPU

    def island_of(self, index: int) -> int | None:
        """The NVLink island of its GPU `index` (None on a box without NVLink)."""
        return self.numa(index) if self.island else None

    def linked(self, gpus: Sequence[Gpu]) -> int:
        """What HAMi's `computeBestCombination` sums for a set of its GPUs: the scores of its pairs
        (nv/device.go:953-978)."""
        return sum(self.score(a.index, b.index) for a, b in itertools.combinations(gpus, 2))


NVLINK_BOX = Box(A100_80, 8, island=4)
PCIE_BOX = Box(A100_PCIE, 4)
BOXES = {"e2e-topo-nvlink-0": NVLINK_BOX, "e2e-topo-nvlink-1": NVLINK_BOX, "e2e-topo-pcie": PCIE_BOX}
NODES = tuple(BOXES)
GPUS: dict[str, Gpu] = {
    gpu_uuid(node, index): Gpu(node, index, gpu_uuid(node, index), *box.model, slots=SPLIT)
    for node, box in BOXES.items()
    for index in range(box.gpus)
}
"""Every GPU of the module's nodes, by UUID (test_hami.py's Gpu: its `slots` is the registered count)."""


def gpus_of(node: str) -> list[Gpu]:
    return [gpu for gpu in GPUS.values() if gpu.node == node]


def numa_of(gpu: Gpu) -> int:
    return BOXES[gpu.node].numa(gpu.index)


# ---- fixtures --------------------------------------------------------------------------------------------


def registration_and_scores(node: str, rng: random.Random) -> dict[str, str]:
    return box_annotations(BOXES[node], gpus_of(node), rng)


def box_annotations(box: Box, gpus: Sequence[Gpu], rng: random.Random) -> dict[str, str]:
    """`hami.io/node-nvidia-register` and `hami.io/node-nvidia-score` of a node wired as `box` (`gpus`: its GPUs)
    as HAMi v2.10's plugin writes them: the GPUs in one (Go's random map) order for both (register.go:259-280);
    registration fields omitempty (`numa` 0 absent); each score entry with every other GPU, keyed by UUID in
    `json.Marshal`'s sorted order."""
    gpus = list(gpus)
    rng.shuffle(gpus)
    listed, scores = [], []
    for gpu in gpus:
        entry: dict[str, Any] = {"id": gpu.uuid}
        if gpu.index:
            entry["index"] = gpu.index
        entry |= {"count": gpu.slots, "devmem": gpu.memory, "devcore": gpu.cores, "type": gpu.model}
        if box.numa(gpu.index):
            entry["numa"] = box.numa(gpu.index)
        entry |= {"mode": "hami-core", "health": True}
        listed.append(entry)
        peers = sorted((other for other in gpus if other is not gpu), key=lambda other: other.uuid)
        scores.append({"uuid": gpu.uuid, "score": {other.uuid: box.score(gpu.index, other.index) for other in peers}})
    return {REGISTER: orjson.dumps(listed).decode(), SCORES: orjson.dumps(scores).decode()}


def hami_node(name: str, rng: random.Random) -> dict[str, Any]:
    """A Ready node HAMi's plugin serves: its registration and scores, `nvidia.com/gpu` = GPUs x split count."""
    manifest = node_manifest(name, gpus=0, annotations=registration_and_scores(name, rng))
    for part in ("capacity", "allocatable"):
        manifest["status"][part][GPU] = str(sum(gpu.slots for gpu in gpus_of(name)))
    return manifest


@pytest.fixture(scope="module")
def topology_nodes(control_plane: ControlPlane) -> Iterator[tuple[str, ...]]:
    rng = random.Random(2100)
    for name in NODES:
        control_plane.request("POST", "/api/v1/nodes", hami_node(name, rng))
    yield NODES
    for name in NODES:
        control_plane.request("DELETE", f"/api/v1/nodes/{name}")


@pytest.fixture(scope="module")
def extender(control_plane: ControlPlane, tls: TLSFiles, topology_nodes: tuple[str, ...]) -> Iterator[ExtenderProcess]:
    with hami_extender(
        control_plane, tls, "e2e-hami-topology", LEASE_NAME, EXTENDER_FLAGS, SELF, topology_nodes[0]
    ) as serving:
        yield serving


@pytest.fixture(scope="module")
def scheduler(control_plane: ControlPlane, extender: ExtenderProcess) -> Iterator[Scheduler]:
    with running_scheduler(control_plane, extender, SCHEDULER_NAME, "--protocol", "hami") as running:
        yield running


@pytest.fixture
async def plugin(control_plane: ControlPlane, topology_nodes: tuple[str, ...]) -> AsyncIterator[DevicePluginDouble]:
    """HAMi's device plugin (and kubelet's calls to it) on the module's nodes, for one test."""
    double = DevicePluginDouble(control_plane, topology_nodes, delay=DELAY)
    async with double.running():
        yield double


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

    async def none_left() -> bool:
        return not await made.pods()

    await asyncio.gather(*(delete(name) for name in made.specs))
    await eventually(none_left, what="the test's pods deleted")
    for node in NODES:
        await control_plane.api("PATCH", f"/api/v1/nodes/{node}", {"metadata": {"annotations": {LOCK: None}}})
    if extender.running():
        await start_clean(extender)


async def start_clean(extender: ExtenderProcess) -> None:
    await extender.until_empty(NODES)


# ---- pods ------------------------------------------------------------------------------------------------


def burst_specs(prefix: str, seed: int, four: int, two: int, numa: int, single: int) -> list[PodSpec]:
    """Shuffled: `four` and `two` topology-aware pods asking 4 and 2 GPUs, `numa` numa-bind pods asking 2 GPUs of
    an NVLink box (`use-gputype: SXM4`: where NUMA nodes differ), `single` one-GPU pods with no policy. Each asks
    4 to 30 GB of each of its GPUs' 80 GB and some compute, so GPUs are shared."""
    rng = random.Random(seed)
    specs = [
        *(one(f"{prefix}-topo4-{n}", 4, rng.choice([16000, 20000, 24000]), None, rng.choice([10, 20]),
              **TOPOLOGY_AWARE) for n in range(four)),
        *(one(f"{prefix}-topo2-{n}", 2, rng.choice([12000, 20000, 30000]), None, rng.choice([10, 20, 30]),
              **TOPOLOGY_AWARE) for n in range(two)),
        *(one(f"{prefix}-numa2-{n}", 2, rng.choice([16000, 24000]), None, rng.choice([10, 20]),
              **NUMA_BIND, **{USE_TYPE: "SXM4"}) for n in range(numa)),
        *(one(f"{prefix}-one-{n}", 1, rng.choice([4000, 8000, 16000]), None, rng.choice([None, 10, 20]))
          for n in range(single)),
    ]  # fmt: skip
    rng.shuffle(specs)
    return specs


async def burst(workload: Workload, specs: Sequence[PodSpec]) -> None:
    """Create these pods at once, for this module's scheduler."""
    await asyncio.gather(*(workload.create(spec, SCHEDULER_NAME) for spec in specs))


def holders() -> list[PodSpec]:
    """Pods each pinned to one GPU of an NVLink box, holding GPUs so that binpack's order (the fullest first, then
    the lower index) crosses islands: on box 1, GPU 1 whole and GPU 0 in part (for 4 GPUs binpack takes 0, 2, 3,
    4); on box 0, GPUs 3 and 4 in part (for 2 GPUs binpack takes 3 and 4)."""
    one_box, zero_box = gpus_of("e2e-topo-nvlink-1"), gpus_of("e2e-topo-nvlink-0")
    return [
        one("whole", 1, None, None, 100, **{USE_UUID: one_box[1].uuid}),
        one("part-1-0", 1, 30000, None, 30, **{USE_UUID: one_box[0].uuid}),
        one("part-0-3", 1, 30000, None, 30, **{USE_UUID: zero_box[3].uuid}),
        one("part-0-4", 1, 20000, None, 20, **{USE_UUID: zero_box[4].uuid}),
    ]


def pinned(spec: PodSpec, node: str) -> PodSpec:
    """The pod, which only the GPUs of `node` may take (`nvidia.com/use-gpuuuid`)."""
    spec.annotations[USE_UUID] = ",".join(gpu.uuid for gpu in gpus_of(node))
    return spec


# ---- what the API says -------------------------------------------------------------------------------------


def allocation_of(pod: dict[str, Any]) -> tuple[list[list[tuple[str, int, int]]], int, list[str]]:
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
    try:
        decoded = decode_entries(annotations[ALLOCATED])
    except ValueError as error:
        return [], 0, [*problems, f"{key}: {ALLOCATED} unreadable: {error}"]
    init, app = containers_of(pod)
    if decoded[-1] or not all(decoded[:-1]) or len(decoded) - 1 != len(init) + len(app):
        return [], 0, [*problems, f"{key}: {ALLOCATED} {annotations[ALLOCATED]!r} is not one entry per GPU container"]
    entries = []
    for container, devices in zip([*init, *app], decoded[:-1], strict=True):
        where = f"{key} container {container.name}"
        if len(devices) != container.gpus or len({device.uuid for device in devices}) != len(devices):
            problems.append(f"{where} asks {container.gpus} distinct GPUs, given {devices}")
        for device in devices:
            gpu = GPUS.get(device.uuid)
            if gpu is None or gpu.node != node:
                problems.append(f"{where} given {device.uuid}, not a GPU of {node}")
            elif (device.memory, device.cores) != (container.memory_on(gpu), container.compute):
                problems.append(f"{where} asks {container.memory_on(gpu)} MiB and {container.compute} % on "
                                f"{gpu.uuid}, given {device.memory} MiB and {device.cores} %")  # fmt: skip
        entries.append([(device.uuid, device.memory, device.cores) for device in devices])
    return entries, len(init), problems


def state_of(pods: list[dict[str, Any]], nodes: list[dict[str, Any]]) -> State:
    """Sum what the bound pods hold per GPU (those that ended excepted), checking each on the way."""
    used: Usage = {}
    holders: dict[str, set[str]] = {}
    exclusive: dict[str, str] = {}
    problems: list[str] = []
    for pod in pods:
        node = pod["spec"].get("nodeName")
        if node not in BOXES or pod["metadata"].get("deletionTimestamp") or ended(pod) or not any(containers_of(pod)):
            continue  # the extender's own pod has no GPU container
        entries, init, found = allocation_of(pod)
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
                f"{where} holds {memory} of {gpu.memory} MiB, {cores} of {gpu.cores} % compute, {slots} of "
                f"{gpu.slots} slots: {sorted(holders[held])}"
            )
        if held in exclusive and holders[held] != {exclusive[held]}:
            problems.append(f"{where} is held whole by {exclusive[held]} but shared: {sorted(holders[held])}")
    locks = {
        node["metadata"]["name"]: annotations_of(node)[LOCK]
        for node in nodes
        if node["metadata"]["name"] in BOXES and LOCK in annotations_of(node)
    }
    return State(pods, locks, used, holders, exclusive, problems)


async def api_state(control_plane: ControlPlane) -> State:
    pods, nodes = await asyncio.gather(control_plane.list_pods(), control_plane.api("GET", "/api/v1/nodes"))
    return state_of(list(pods["items"]), list(nodes["items"]))


def serving(container: Container, node: str, used: Usage, annotations: dict[str, str]) -> list[Gpu]:
    """The GPUs of `node` that take the container, holding `used` (test_hami.py's `serves`: HAMi's Fit)."""
    return [gpu for gpu in gpus_of(node) if serves(container, gpu, used.get(gpu.uuid, [0, 0, 0]), annotations)]


def fits_now(pod: dict[str, Any], state: State) -> bool:
    """Whether the pod, of one GPU container, could be placed now: on as many GPUs of one node as it asks, of
    one NUMA node when it binds to one."""
    (container,) = containers_of(pod)[1]
    annotations = annotations_of(pod)
    for node in NODES:
        gpus = serving(container, node, state.used, annotations)
        numas = {numa_of(gpu) for gpu in gpus}
        groups = [[gpu for gpu in gpus if numa_of(gpu) == numa] for numa in numas] if binds_numa(pod) else [gpus]
        if any(len(group) >= container.gpus for group in groups):
            return True
    return False


def given(pod: dict[str, Any]) -> list[Gpu]:
    """The GPUs of the pod's one GPU container, from its allocation."""
    return [GPUS[device.uuid] for device in decode_entries(annotations_of(pod)[ALLOCATED])[0]]


def topology_aware(pod: dict[str, Any]) -> bool:
    return "topology-aware" in annotations_of(pod).get(POLICY, "")


def binds_numa(pod: dict[str, Any]) -> bool:
    return annotations_of(pod).get("nvidia.com/numa-bind") == "true"


def without(state: State, pod: dict[str, Any]) -> Usage:
    """What the GPUs hold at the end, but for the pod's own allocation."""
    used = {uuid: list(use) for uuid, use in state.used.items()}
    entries, init, _ = allocation_of(pod)
    for uuid, use in collapse(entries, init).items():
        used[uuid] = [total - own for total, own in zip(used[uuid], use, strict=True)]
    return used


def link_problems(pod: dict[str, Any], state: State) -> tuple[list[str], bool]:
    """For a topology-aware pod asking several GPUs: whether its GPUs are linked at least as well as any set of
    as many GPUs of its node that could hold it at the end, its own allocation taken away (see the module's
    docstring: a lower bound on what it had to choose from). Also whether an island could still hold it whole,
    the case where a set across islands fails this."""
    (container,) = containers_of(pod)[1]
    node = pod["spec"]["nodeName"]
    candidates = serving(container, node, without(state, pod), annotations_of(pod))
    return best_linked_problems(pod, BOXES[node], given(pod), candidates)


def best_linked_problems(
    pod: dict[str, Any], box: Box, gpus: Sequence[Gpu], candidates: Sequence[Gpu]
) -> tuple[list[str], bool]:
    """`link_problems` for a pod of one GPU container given `gpus` of a node wired as `box`, `candidates` the GPUs
    of that node that could hold it at the end, its own allocation taken away."""
    (container,) = containers_of(pod)[1]
    best = max(itertools.combinations(candidates, container.gpus), key=box.linked, default=())
    island_free = any(
        sum(box.island_of(gpu.index) == island for gpu in candidates) >= container.gpus
        for island in {box.island_of(gpu.index) for gpu in candidates} - {None}
    )
    if box.linked(gpus) >= box.linked(best):
        return [], island_free
    return [
        f"{key_of(pod)} on {pod['spec']['nodeName']} given GPUs {[gpu.index for gpu in gpus]}, linked "
        f"{box.linked(gpus)}; GPUs {[gpu.index for gpu in best]}, linked {box.linked(best)}, could hold it even at "
        "the end"
    ], island_free


def placement_problems(state: State, test: str) -> tuple[list[str], int, int]:
    """Every bound topology-aware pod asking several GPUs checked by `link_problems`, every numa-bind pod on one
    NUMA node: (problems, topology-aware pods checked, of which an island could still hold whole)."""
    problems: list[str] = []
    checked = island_free = 0
    for pod in state.mine(test):
        if not pod["spec"].get("nodeName"):
            continue
        if topology_aware(pod) and len(given(pod)) > 1:
            found, whole = link_problems(pod, state)
            problems += found
            checked += 1
            island_free += whole
        numas = {numa_of(gpu) for gpu in given(pod)}
        if binds_numa(pod) and len(numas) > 1:
            gpus = [gpu.index for gpu in given(pod)]
            problems.append(f"{key_of(pod)} on {pod['spec']['nodeName']} binds to one NUMA node, given GPUs {gpus}")
    return problems, checked, island_free


def binpack_choice(spec: PodSpec, node: str, state: State) -> list[Gpu]:
    """The GPUs a choice blind to links and NUMA would give the pod: those that serve it, the fullest first by
    HAMi's fill (`ComputeScore`, pkg/scheduler/policy/gpu_policy.go:194-221, weights 1), then the lower index."""
    (container,) = spec.containers

    def fill(gpu: Gpu) -> float:
        memory, cores, slots = state.use_of(gpu.uuid)
        return slots / gpu.slots + cores / gpu.cores + memory / gpu.memory

    candidates = serving(container, node, state.used, spec.annotations)
    return sorted(candidates, key=lambda gpu: (-fill(gpu), gpu.index))[: container.gpus]


def describe(state: State, test: str) -> str:
    lines = ["pods:"]
    for pod in sorted(state.mine(test), key=key_of):
        annotations = annotations_of(pod)
        asks = "; ".join(f"{c.gpus}x{c.mem}/{c.compute}%" for c in containers_of(pod)[1])
        where = pod["spec"].get("nodeName") or "-"
        gpus = " ".join(f"{gpu.index}/numa{numa_of(gpu)}" for gpu in given(pod)) if ALLOCATED in annotations else ""
        policy = "numa-bind" if binds_numa(pod) else annotations.get(POLICY, "-")
        lines.append(
            f"  {key_of(pod):34} {asks:12} {policy:15} {where:18} {annotations.get(BIND_PHASE, '-'):10} GPUs {gpus}"
        )
    lines.append("GPUs (MiB, %, slots):")
    for gpu in GPUS.values():
        memory, cores, slots = state.use_of(gpu.uuid)
        lines.append(
            f"  {gpu.node}/{gpu.index} numa{numa_of(gpu)} {memory:6}/{gpu.memory} {cores:3}% {slots}/{gpu.slots}"
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
    """Wait until every pod of the workload is bound and through its plugin or fits nowhere now, and no node is
    locked. The invariants and the double's violations are checked on every poll."""
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
            if (not plugin.admitted(pod["metadata"]["uid"]) if pod["spec"].get("nodeName") else fits_now(pod, state))
        ]
        if len(mine) == len(workload.specs) and not waiting and not state.locks:
            return state
        if time.monotonic() > deadline:
            pytest.fail(
                f"still waiting after {timeout:.0f} s: {waiting}\n\n"
                + await diagnostics(control_plane, workload.test, extender, scheduler, plugin)
            )
        await asyncio.sleep(0.25)


async def assert_placed_by_topology(
    control_plane: ControlPlane, state: State, test: str, extender: ExtenderProcess, scheduler: Scheduler,
    plugin: DevicePluginDouble, tolerated: int = 0,
) -> tuple[int, int]:  # fmt: skip
    """`placement_problems` finds none, but for at most `tolerated` sets less linked than the best
    (`fail_on_topology`); returns (topology-aware pods checked, of which an island could hold)."""
    problems, checked, island_free = placement_problems(state, test)
    await fail_on_topology(problems, tolerated, lambda: diagnostics(control_plane, test, extender, scheduler, plugin))
    return checked, island_free


async def fail_on_topology(problems: list[str], tolerated: int, diagnosing: Callable[[], Awaitable[str]]) -> None:
    """Fail with `problems` and the diagnostics, unless they are at most `tolerated` sets less linked than the best
    the GPUs could still hold at the end. In a burst the GPUs that could hold a pod at the end are not always those
    it could have had: another pod's assumption (its filter's hold, `core/assume.py`) may sit on a GPU when this
    pod is placed, then move when that pod's bind decides again (the typical shapes rebuilt meanwhile), or when
    its bind is refused on the node's lock and kube-scheduler tries it again later, freeing the GPU; seen once in
    about eight runs. The sequential test here checks every set exactly."""
    linked = [problem for problem in problems if ", linked " in problem]
    if len(problems) - len(linked) + max(len(linked) - tolerated, 0) > 0:
        pytest.fail("placed against the pods' topology:\n" + "\n".join(problems) + "\n\n" + await diagnosing())


async def inspect_differences(extender: ExtenderProcess, state: State) -> list[str]:
    """How the extender's /inspect differs from the API's state on our nodes (empty when equal): every node read
    (its scores decoded: a node whose scores HAMi could not decode is unreadable), every GPU's memory, compute,
    slots and pods, and every node's lock."""
    report = await extender.inspect()
    problems = [] if report["reservations"] == 0 else [f"{report['reservations']} reservations left"]
    shown = {node["name"]: node for node in report["nodes"]}
    for name in NODES:
        node = shown.get(name)
        if node is None or not node["known"] or node.get("problem"):
            problems.append(f"{name} not read by the extender: {node}")
            continue
        lock = state.locks.get(name)
        holder = lock_holder(lock) if lock else None
        if (node.get("lock") or {}).get("pod") != (f"{holder[0]}/{holder[1]}" if holder else None):
            problems.append(f"{name}: extender shows lock {node.get('lock')}, the API {lock}")
        if {device.get("uuid") for device in node["devices"]} != {gpu.uuid for gpu in gpus_of(name)}:
            problems.append(f"{name}: the extender's GPUs {node['devices']}")
        for device in node["devices"]:
            gpu = GPUS.get(device.get("uuid", ""))
            if gpu is None or gpu.node != name:
                continue
            pods = {holder["pod"] for holder in device["pods"]}
            shown_use = [device["used"], device.get("used_cores"), device.get("used_slots")]
            if shown_use != state.use_of(gpu.uuid) or pods != state.holders.get(gpu.uuid, set()):
                problems.append(
                    f"{name} GPU {gpu.index}: extender {shown_use} {sorted(pods)}, API {state.use_of(gpu.uuid)} "
                    f"{sorted(state.holders.get(gpu.uuid, set()))}"
                )
            if any(holder["state"] != "observed" for holder in device["pods"]):
                problems.append(f"{name} GPU {gpu.index} holds unobserved pods: {device['pods']}")
    return problems


async def assert_extender_agrees(control_plane: ControlPlane, extender: ExtenderProcess) -> None:
    async def differences() -> list[str]:
        return await inspect_differences(extender, await api_state(control_plane))

    await assert_agrees(extender, differences)


# ---- tests -----------------------------------------------------------------------------------------------


async def test_a_burst_gives_topology_aware_pods_an_island_and_numa_bound_pods_one_numa_node(
    control_plane: ControlPlane,
    extender: ExtenderProcess,
    scheduler: Scheduler,
    plugin: DevicePluginDouble,
    workload: Workload,
) -> None:
    """After the `holders`, 22 pods at once: 4 topology-aware pods asking 4 GPUs, 6 asking 2, 4 numa-bind pods
    asking 2 GPUs of an NVLink box, 8 one-GPU pods with no policy; about half the GPU memory. Every pod is bound and
    allocated, no GPU is over its memory, compute or count, every topology-aware pod is linked as well as its node
    allowed (one island where an island could hold it), every numa-bind pod on one NUMA node."""
    await start_clean(extender)
    await burst(workload, holders())
    await settle(control_plane, workload, extender, scheduler, plugin)
    started = time.monotonic()
    await burst(workload, burst_specs("burst", seed=11, four=4, two=6, numa=4, single=8))
    state = await settle(control_plane, workload, extender, scheduler, plugin)
    elapsed = time.monotonic() - started

    bound = assert_allocated_once(state, workload.test, plugin)
    assert len(bound) == len(workload.specs), describe(state, workload.test)
    assert not plugin.refused
    checked, island_free = await assert_placed_by_topology(
        control_plane, state, workload.test, extender, scheduler, plugin, tolerated=1
    )
    assert checked == 10 and island_free, describe(state, workload.test)  # the check bit somewhere
    await assert_extender_agrees(control_plane, extender)
    print(
        f"\ntopology burst on {len(NODES)} nodes / {len(GPUS)} GPUs: {len(bound)} bound after {elapsed:.1f} s; "
        f"{checked} topology-aware pods checked, {island_free} of them where an island could still hold them; "
        f"{plugin.latency_summary()}\n{describe(state, workload.test)}"
    )


async def test_a_topology_aware_pod_takes_the_intact_island_where_binpack_would_cross_it(
    control_plane: ControlPlane,
    extender: ExtenderProcess,
    scheduler: Scheduler,
    plugin: DevicePluginDouble,
    workload: Workload,
) -> None:
    """After the `holders`, pods pinned to one NVLink box, one at a time, each where binpack's order would cross
    islands (computed in the test from the API's state before the pod is sent):
    - box 1: for 4 GPUs binpack takes 0, 2, 3, 4; the topology-aware pod gets island 1 (4-7), the only set of four
      within one island. Then for a numa-bind pod asking 2, binpack takes GPU 0 and GPU 4 (island 1 now the
      fuller): it gets two GPUs of one NUMA node;
    - box 0: for 2 GPUs binpack takes 3 and 4; the topology-aware pod gets two GPUs of one island.
    So the burst's checks, run here on each, fail for a choice blind to the links or to NUMA."""
    await start_clean(extender)
    await burst(workload, holders())
    state = await settle(control_plane, workload, extender, scheduler, plugin)
    steps = [
        ("e2e-topo-nvlink-1", one("topo4", 4, 20000, None, 20, **TOPOLOGY_AWARE)),
        ("e2e-topo-nvlink-1", one("numa2", 2, 20000, None, 20, **NUMA_BIND)),
        ("e2e-topo-nvlink-0", one("topo2", 2, 20000, None, 20, **TOPOLOGY_AWARE)),
    ]
    for node, spec in steps:
        spec = pinned(spec, node)
        blind = binpack_choice(spec, node, state)
        assert len({numa_of(gpu) for gpu in blind}) == 2, f"{spec.name}: binpack would give {blind}"
        await workload.create(spec, SCHEDULER_NAME)
        state = await settle(control_plane, workload, extender, scheduler, plugin)
        (pod,) = [pod for pod in state.mine(workload.test) if pod["metadata"]["name"] == spec.name]
        assert pod["spec"].get("nodeName") == node, describe(state, workload.test)
        problems, _, _ = placement_problems(state, workload.test)
        assert not problems, "\n".join([*problems, describe(state, workload.test)])
        gpus = given(pod)
        assert len({numa_of(gpu) for gpu in gpus}) == 1, describe(state, workload.test)
        if spec.name == "topo4":
            assert {gpu.index for gpu in gpus} == {4, 5, 6, 7}, describe(state, workload.test)
        print(f"\n{spec.name} on {node}: binpack {[gpu.index for gpu in blind]}, given {[gpu.index for gpu in gpus]}")
    assert_allocated_once(state, workload.test, plugin)
    await assert_extender_agrees(control_plane, extender)


async def test_a_topology_burst_survives_the_extender_killed_while_every_node_waits_for_its_plugin(
    control_plane: ControlPlane,
    extender: ExtenderProcess,
    scheduler: Scheduler,
    plugin: DevicePluginDouble,
    workload: Workload,
) -> None:
    """test_hami.py's restart, with topology: a burst, the first allocations made, then the plugin paused (a slow
    kubelet) until every node is locked for a pod bound there; SIGKILL, a second burst while the extender is
    down, a restart. The restarted extender rebuilds the allocations from the API alone: none made before the
    kill is lost or given twice, every pod is placed, and the topology and NUMA checks hold for all."""
    await start_clean(extender)
    await burst(workload, holders())
    await settle(control_plane, workload, extender, scheduler, plugin)
    await burst(workload, burst_specs("before", seed=23, four=3, two=5, numa=3, single=5))

    async def first_allocated() -> bool:
        return len(plugin.accepted) >= len(holders()) + 4

    await eventually(first_allocated, interval=0.05, what="the first allocations")
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
    await burst(workload, burst_specs("after", seed=29, four=1, two=3, numa=2, single=2))

    async def scheduler_found_it_down() -> bool:
        return scheduler.log().count("connection refused") > refused

    await eventually(scheduler_found_it_down, what="kube-scheduler calling the dead extender")
    restarted = time.monotonic()
    extender.start()
    ready_after = extender.wait_until(200)
    await assert_extender_agrees(control_plane, extender)  # locks held, allocations still `allocating` counted
    plugin.resume()
    state = await settle(control_plane, workload, extender, scheduler, plugin)
    settled_after = time.monotonic() - restarted

    bound = assert_allocated_once(state, workload.test, plugin)
    assert len(bound) == len(workload.specs), describe(state, workload.test)
    kept = {key_of(pod): annotations_of(pod)[ALLOCATED] for pod in bound if key_of(pod) in allocated_at_kill}
    assert kept == allocated_at_kill, "an allocation made before the kill was lost or rewritten"
    assert not plugin.refused
    checked, island_free = await assert_placed_by_topology(
        control_plane, state, workload.test, extender, scheduler, plugin, tolerated=1
    )
    await assert_extender_agrees(control_plane, extender)
    print(
        f"\nkilled with {len(allocated_at_kill)} pods bound, every node locked; ready {ready_after:.1f} s after the "
        f"restart, all placed {settled_after:.1f} s after it: {len(bound)} bound; {checked} topology-aware pods "
        f"checked, {island_free} where an island could still hold them; {plugin.latency_summary()}"
    )
