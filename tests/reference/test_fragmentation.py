"""The product's fragmentation measure against the brute-force reference (`fgd.py`), on random nodes and workloads.

Each example draws one node and its pods, and a workload of typical pods, in the reference's own terms; from those
it builds the Kubernetes objects the product reads (the node, the pods bound there with their allocations, one pod
per typical pod for the workload to learn). The reference is computed from the draws alone; the product from the
objects, by all three of its forms: the uniform one (gpushare's nodes), the general one (HAMi's: compute tracked,
MIG), and the arrays (`batch.measures`). Free cpu and memory are often exactly what a typical pod asks, or one
short of it: the boundary where it can or cannot run.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from extender.core.cache import Cache
from extender.core.holds import Grant
from extender.core.mig import MigInstance
from extender.core.placement.batch import measures
from extender.core.placement.learned import Learned
from extender.core.placement.measure import UNLIMITED, fragment, room_of
from extender.core.placement.workload import Workload, shape_of
from extender.core.pods import pod_record
from extender.core.protocols import DeviceProtocol
from extender.core.protocols.hami import encode
from extender.core.protocols.hami_mig import encode_instances
from tests.builders import HAMI, PROFILE, make_hami_pod, make_node, make_pod
from tests.property.fresh import property_settings
from tests.reference import fgd

EXAMPLES = 300
GIB = 1024**3
CPUS = (0, 500, 1000, 2000, 4000)
MEMORIES = (0, GIB, 4 * GIB)
A100_40GB = (  # HAMi's `a100MigProfiles`, pkg/device/nvidia/mig_capability_test.go:27-33 at v2.10.0
    ("1g.5gb", 5120, 14, 1, tuple((start, 1) for start in range(7))),
    ("2g.10gb", 10240, 28, 2, tuple((start, 2) for start in (0, 2, 4))),
    ("3g.20gb", 20480, 42, 3, tuple((start, 4) for start in (0, 4))),
)
A100_80GB = (  # every profile NVML offers on an A100-SXM4-80GB (bench/placement/mig.py)
    ("1g.10gb", 9856, 15, 1, tuple((start, 1) for start in range(7))),
    ("1g.20gb", 19968, 15, 1, tuple((start, 2) for start in (0, 2, 4, 6))),
    ("2g.20gb", 19968, 29, 2, tuple((start, 2) for start in (0, 2, 4))),
    ("3g.40gb", 40192, 43, 3, tuple((start, 4) for start in (0, 4))),
    ("4g.40gb", 40192, 58, 4, ((0, 4),)),
    ("7g.80gb", 80384, 100, 7, ((0, 8),)),
)
TABLES = {40960: A100_40GB, 81920: A100_80GB}
SYSTEM_CPU, SYSTEM_MEMORY = 100, 64 * 1024**2
SYSTEM_POD = {
    "kind": "Pod",
    "metadata": {"name": "system", "namespace": "kube-system", "uid": "uid-system", "annotations": {}},
    "spec": {
        "nodeName": "n",
        "containers": [{"name": "agent", "resources": {"requests": {"cpu": "100m", "memory": str(SYSTEM_MEMORY)}}}],
    },
    "status": {"phase": "Running"},
}
"""A pod asking no GPU on every node: its cpu and memory count as the GPU pods' do (and a node's allocatable is
never 0, which reads as not reported)."""
MIG_SPLIT = 7


@dataclass
class Drawn:
    """One node and its pods as drawn: the objects the product reads, and the node as the reference sees it."""

    objects: list[dict[str, Any]] = field(default_factory=list)
    gpus: list[fgd.Gpu] = field(default_factory=list)
    cpu_requested: int = 0
    memory_requested: int = 0
    pods: int = 0

    def name(self) -> str:
        self.pods += 1
        return f"running-{self.pods}"


def free_amount(draw: Callable[[st.SearchStrategy[Any]], Any], asked: tuple[int, ...]) -> int | None:
    """Free cpu or memory: often exactly what a typical pod asks, or one short of it (None: not reported)."""
    choices = st.sampled_from(asked)
    amount: int | None = draw(
        st.one_of(st.none(), choices, choices.map(lambda amount: max(amount - 1, 0)), st.integers(0, 2 * max(asked)))
    )
    return amount


def typical_pods(draw: Callable[[st.SearchStrategy[Any]], Any], hami: bool) -> list[tuple[fgd.TypicalPod, int]]:
    pods = []
    for _ in range(draw(st.integers(1, 6))):
        cpu, memory = draw(st.sampled_from(CPUS)), draw(st.sampled_from(MEMORIES))
        if hami:
            percent = draw(st.sampled_from((0, 0, 10, 25, 33, 50, 100)))
            mib = 0 if percent else draw(st.sampled_from((1000, 5120, 9856, 10000, 15000, 19968, 20480, 41000)))
            gpus, cores = draw(st.sampled_from((1, 1, 2))), draw(st.sampled_from((0, 20, 50, 100)))
            pod = fgd.TypicalPod(cpu, memory, gpus, mib, percent, cores)
        else:
            models = draw(st.sampled_from(((), ("T4",))))
            pod = fgd.TypicalPod(cpu, memory, 1, draw(st.integers(1, 16)), models=models)
        pods.append((pod, draw(st.integers(1, 5))))
    return pods


def typical_object(pod: fgd.TypicalPod, number: int, hami: bool) -> dict[str, Any]:
    """The pod object of a typical pod (for the product to learn its shape)."""
    if not hami:
        return make_pod(
            f"typical-{number}", gpu_mem=pod.mib, cpu=f"{pod.cpu}m", memory=str(pod.memory), models=pod.models
        )
    limits = {"nvidia.com/gpu": str(pod.gpus), "nvidia.com/gpucores": str(pod.cores)}
    limits |= {"nvidia.com/gpumem": str(pod.mib)} if pod.mib else {"nvidia.com/gpumem-percentage": str(pod.percent)}
    made = make_hami_pod(f"typical-{number}")
    made["spec"]["containers"] = [
        {"name": "main", "resources": {"limits": limits, "requests": {"cpu": f"{pod.cpu}m", "memory": str(pod.memory)}}}
    ]
    return made


def set_allocatable(node: dict[str, Any], cpu: int | None, memory: int | None) -> None:
    for section in ("capacity", "allocatable"):
        resources = node["status"].setdefault(section, {})
        resources.pop("cpu", None)
        resources.pop("memory", None)
        if cpu is not None:
            resources["cpu"] = f"{cpu}m"
        if memory is not None:
            resources["memory"] = str(memory)


def requests(draw: st.DrawFn, drawn: Drawn) -> dict[str, str]:
    cpu, memory = draw(st.sampled_from((0, 250, 1000))), draw(st.sampled_from((0, GIB)))
    drawn.cpu_requested += cpu
    drawn.memory_requested += memory
    return {"cpu": f"{cpu}m", "memory": str(memory)}


@st.composite
def gpushare_nodes(draw: st.DrawFn) -> tuple[dict[str, Any], Drawn]:
    gpus, size, model = draw(st.integers(1, 8)), draw(st.sampled_from((8, 16))), draw(st.sampled_from(("", "T4")))
    drawn = Drawn()
    for index in range(gpus):
        used = 0
        for _ in range(draw(st.integers(0, 2))):
            amount = draw(st.integers(1, size - used)) if used < size else 0
            if amount:
                pod = make_pod(drawn.name(), gpu_mem=amount, node="n", indexes=(index,), phase="Running")
                pod["spec"]["containers"][0]["resources"]["requests"] = requests(draw, drawn)
                drawn.objects.append(pod)
                used += amount
        drawn.gpus.append(fgd.shared_gpu(size, used, None, 0, 0, model))
    node = make_node("n", gpus=gpus, mem=size, model=model)
    return node, drawn


@st.composite
def hami_nodes(draw: st.DrawFn) -> tuple[dict[str, Any], Drawn]:
    kind = draw(st.sampled_from(("core", "mig", "mixed")))
    gpus = draw(st.integers(1, 4 if kind == "core" else 2))
    devmem, split = draw(st.sampled_from(sorted(TABLES))), draw(st.sampled_from((2, 4, 10)))
    model = f"NVIDIA A100 {devmem // 1024}GB"
    table = TABLES[devmem]
    modes = {"core": ["hami-core"] * gpus, "mig": ["mig"] * gpus, "mixed": ["mig", "hami-core"][:gpus]}[kind]
    register: list[dict[str, Any]] = []
    drawn = Drawn()
    for index, mode in enumerate(modes):
        uuid = f"GPU-n-{index}"
        count = MIG_SPLIT if mode == "mig" else split
        entry: dict[str, Any] = {"id": uuid, "index": index, "count": count, "devmem": devmem, "devcore": 100,
                                 "type": model, "mode": mode, "health": True}  # fmt: skip
        if mode == "mig":
            entry["migProfiles"] = [
                {"name": name, "memoryMB": memory, "core": core, "sliceCount": slices,
                 "placements": [{"start": start, "size": size} for start, size in placements]}
                for name, memory, core, slices, placements in table
            ]  # fmt: skip
            instances: list[tuple[int, int, int]] = []
            for _ in range(draw(st.integers(0, 5))):
                name, memory, core, _, placements = draw(st.sampled_from(table))
                free = [(start, size) for start, size in placements if not any(
                    start < other + other_size and other < start + size for other, other_size, _ in instances
                )]  # fmt: skip
                if free:
                    start, size = draw(st.sampled_from(free))
                    grant = Grant(index, memory, core, uuid, MigInstance(name, start, size))
                    drawn.objects.append(running_hami(drawn.name(), grant, requests(draw, drawn)))
                    instances.append((start, size, memory))
            profiles = [(memory, placements) for _, memory, _, _, placements in table]
            drawn.gpus.append(fgd.mig_gpu(devmem, model, profiles, instances, MIG_SPLIT))
        else:
            used = cores = pods = 0
            for _ in range(draw(st.integers(0, 3))):
                memory, core = draw(st.integers(1, devmem // 3)), draw(st.sampled_from((0, 10, 30, 50)))
                grant = Grant(index, memory, core, uuid)
                drawn.objects.append(running_hami(drawn.name(), grant, requests(draw, drawn)))
                used, cores, pods = used + memory, cores + core, pods + 1
            drawn.gpus.append(fgd.shared_gpu(devmem, used, cores, pods, split, model))
        register.append(entry)
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": "n", "annotations": {"hami.io/node-nvidia-register": orjson.dumps(register).decode()}},
        "status": {
            "allocatable": {"nvidia.com/gpu": str(sum(entry["count"] for entry in register))},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }
    return node, drawn


def running_hami(name: str, grant: Grant, requested: dict[str, str]) -> dict[str, Any]:
    """A pod HAMi bound to the GPU of `grant` (with its MIG instance, if any), as its annotations record it."""
    pod = make_hami_pod(name, mem=grant.memory, cores=grant.cores)
    pod["spec"]["containers"][0]["resources"]["requests"] = requested
    pod["spec"]["nodeName"] = "n"
    pod["status"]["phase"] = "Running"
    annotations = {"hami.io/vgpu-node": "n", "hami.io/vgpu-devices-allocated": encode(((grant,),), {}),
                   "hami.io/bind-phase": "success"}  # fmt: skip
    if grant.instance is not None:
        annotations["hami.io/vgpu-mig-allocations"] = encode_instances(((grant,),), {})
    pod["metadata"]["annotations"] |= annotations
    return pod


def learned_workload(protocol: DeviceProtocol, pods: list[tuple[fgd.TypicalPod, int]], hami: bool) -> Workload:
    """The workload the product learns from one pod object per typical pod, seen `count` times each at time 0 (every
    shape kept: coverage 1), its typical shapes built."""
    workload = Workload(coverage=1.0)
    for number, (pod, count) in enumerate(pods):
        record = pod_record(typical_object(pod, number, hami), protocol)
        workload.observe(shape_of(record.demand, record.cpu, record.memory, record.models), 0.0, count)
    workload.classes(0.0)
    return workload


def compare(
    protocol: DeviceProtocol, hami: bool, node_drawn: tuple[dict[str, Any], Drawn], draw: st.DataObject
) -> None:
    node, drawn = node_drawn
    pods = typical_pods(draw.draw, hami)
    asked_cpu = tuple(pod.cpu for pod, _ in pods)
    asked_memory = tuple(pod.memory for pod, _ in pods)
    free_cpu, free_memory = free_amount(draw.draw, asked_cpu), free_amount(draw.draw, asked_memory)
    set_allocatable(
        node,
        None if free_cpu is None else free_cpu + drawn.cpu_requested + SYSTEM_CPU,
        None if free_memory is None else free_memory + drawn.memory_requested + SYSTEM_MEMORY,
    )
    cache = Cache(protocol)
    cache.replace([node], [*drawn.objects, SYSTEM_POD])
    state = cache.nodes["n"]
    assert not state.unreadable and len(state.devices) == len(drawn.gpus)
    learned = Learned(cache)
    classes = learned_workload(protocol, pods, hami).built
    reference_node = fgd.Node(
        math.inf if free_cpu is None else free_cpu, math.inf if free_memory is None else free_memory, tuple(drawn.gpus)
    )
    weighted = [(pod, float(count)) for pod, count in pods]
    expected = fgd.measure(reference_node, weighted)
    room = room_of(state)
    assert fragment(room.cpu, room.memory, room.gpus, classes) == pytest.approx(
        fgd.paper_f(reference_node, weighted), rel=1e-9, abs=1e-12
    )
    assert learned.measure(state, classes) == pytest.approx(expected, rel=1e-9, abs=1e-12)
    if not hami:
        capacity, model = state.devices[0].capacity, state.devices[0].model
        batch = measures(
            np.array([[gpu.free for gpu in drawn.gpus]], dtype=np.int64),
            np.array([UNLIMITED if free_cpu is None else free_cpu], dtype=np.int64),
            np.array([UNLIMITED if free_memory is None else free_memory], dtype=np.int64),
            capacity,
            model,
            classes,
        )
        assert float(batch[0]) == pytest.approx(expected, rel=1e-9, abs=1e-12)


@property_settings(EXAMPLES)
@given(gpushare_nodes(), st.data())
def test_the_measure_of_gpushare_nodes_is_the_papers_by_all_its_forms(
    node_drawn: tuple[dict[str, Any], Drawn], data: st.DataObject
) -> None:
    compare(PROFILE, False, node_drawn, data)


@property_settings(EXAMPLES)
@given(hami_nodes(), st.data())
def test_the_measure_of_hami_nodes_with_compute_percent_and_mig_is_the_papers(
    node_drawn: tuple[dict[str, Any], Drawn], data: st.DataObject
) -> None:
    compare(HAMI, True, node_drawn, data)
