"""The fragmentation measure by brute force, from its definition: nothing here comes from `extender.core.placement`.

The ATC'23 paper "Beware of Fragmentation" (Weng et al.; hkust-adsl/kubernetes-scheduler-simulator,
`pkg/utils/frag.go` `NodeGpuShareFragAmount`), for a node and the typical pods with their popularity p:

- a typical pod that cannot run on the node at all (too little free cpu or memory, fewer GPUs with room for it
  than it asks) finds *all* the node's free GPU a fragment;
- one that can run finds a fragment in the free GPU of the GPUs it cannot use;
- F = the sum over the typical pods of p x its fragment, in GPUs (each GPU's free memory over its capacity).

Generalised as the measure's documentation says (`core/placement/measure.py`): a GPU can be used by a pod when
something is free on it, the largest instance one new pod can get there holds the pod's memory (on a HAMi-core or
gpushare GPU, its free memory; on a MIG GPU, the largest profile with a placement free), its compute left holds
the pod's (where compute is tracked), and its model is one the pod allows. A percent pod needs that share of the
GPU's memory, rounded down as HAMi rounds it (`memreq = Totalmem * MemPercentagereq / 100` in int32,
pkg/device/nvidia/device.go:780-782 at v2.10.0). Pods asking no GPU are no typical pods (their fragment never
tells nodes apart).

And our term beside the paper's: the free GPU the node's free cpu and memory cannot feed, at the cpu and memory
the typical pods bring per GPU they take (weighted by popularity; a pod's GPUs counted as its larger share of
memory or compute), weighted `STARVED`.

Plain loops over plain values, written for reading, not speed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

STARVED = 0.5
"""The weight of the starved GPU beside the paper's F (the product's `STARVED_WEIGHT`, a setting of the policy)."""


@dataclass(frozen=True)
class Gpu:
    capacity: int
    """Memory, in the protocol's unit."""
    free: int
    """Memory free for the measure: what is wasted if no pod can use it (0 on a GPU that takes no new pod)."""
    largest: int
    """The most memory one new pod can get on it."""
    compute_left: int | None
    """% of compute left; None where the device plugin does not track compute (gpushare, MIG)."""
    model: str


@dataclass(frozen=True)
class Node:
    cpu: float
    """Millicores free (`math.inf` where the node reports no allocatable cpu)."""
    memory: float
    """Bytes free (likewise)."""
    gpus: tuple[Gpu, ...]


@dataclass(frozen=True)
class TypicalPod:
    cpu: int
    """Millicores."""
    memory: int
    """Bytes."""
    gpus: int
    mib: int
    """Memory per GPU (0: by percent)."""
    percent: int = 0
    cores: int = 0
    models: tuple[str, ...] = ()


def need(pod: TypicalPod, capacity: int) -> int:
    if pod.mib:
        return pod.mib
    return capacity * min(pod.percent, 100) // 100


def usable(pod: TypicalPod, gpu: Gpu) -> bool:
    return (
        gpu.free > 0
        and gpu.largest >= need(pod, gpu.capacity)
        and (gpu.compute_left is None or gpu.compute_left >= pod.cores)
        and (not pod.models or gpu.model in pod.models)
    )


def free_gpu(node: Node) -> float:
    return sum(gpu.free / gpu.capacity for gpu in node.gpus if gpu.capacity > 0)


def fragment(node: Node, pod: TypicalPod) -> float:
    """The free GPU of the node that this typical pod cannot use."""
    runs = (
        node.cpu >= pod.cpu
        and node.memory >= pod.memory
        and sum(1 for gpu in node.gpus if usable(pod, gpu)) >= pod.gpus
    )
    if not runs:
        return free_gpu(node)
    return sum(gpu.free / gpu.capacity for gpu in node.gpus if gpu.capacity > 0 and not usable(pod, gpu))


def paper_f(node: Node, workload: Sequence[tuple[TypicalPod, float]]) -> float:
    """F: the typical pods' fragments weighted by their popularity (weights normalised to sum 1)."""
    total = sum(weight for _, weight in workload)
    if not total or not free_gpu(node):
        return 0.0
    return sum(weight / total * fragment(node, pod) for pod, weight in workload)


def gpus_taken(pod: TypicalPod, capacity: int) -> float:
    share = min(need(pod, capacity) / capacity, 1.0)
    if pod.cores:
        share = max(share, min(pod.cores, 100) / 100)
    return pod.gpus * share


def starved(node: Node, workload: Sequence[tuple[TypicalPod, float]]) -> float:
    """Of the node's free GPU, what its free cpu and memory cannot feed at the typical pods' rates (per GPU of the
    node's first GPU's size)."""
    free = free_gpu(node)
    if not free or not workload:
        return 0.0
    capacity = node.gpus[0].capacity
    gpus = sum(weight * gpus_taken(pod, capacity) for pod, weight in workload)
    if not gpus:
        return 0.0
    cpu_rate = sum(weight * pod.cpu for pod, weight in workload) / gpus
    memory_rate = sum(weight * pod.memory for pod, weight in workload) / gpus
    fed = free
    if cpu_rate > 0:
        fed = min(fed, node.cpu / cpu_rate)
    if memory_rate > 0:
        fed = min(fed, node.memory / memory_rate)
    return free - fed


def measure(node: Node, workload: Sequence[tuple[TypicalPod, float]]) -> float:
    """What the policy minimises: F plus `STARVED` x the starved GPU."""
    if not free_gpu(node):
        return 0.0
    return paper_f(node, workload) + STARVED * starved(node, workload)


def mig_gpu(
    capacity: int,
    model: str,
    profiles: Sequence[tuple[int, Sequence[tuple[int, int]]]],
    instances: Sequence[tuple[int, int, int]],
    split: int,
) -> Gpu:
    """A MIG GPU whose `profiles` are (memory, placements) and that holds `instances` (start, size, memory): its
    free memory is that of its free memory slices (what is wasted if no pod can use them), within what HAMi counts
    free; the largest instance a new pod can get is the largest profile with a placement overlapping none held.
    A GPU holding `split` instances takes none more."""
    used = sum(memory for _, _, memory in instances)
    slices = max(start + size for _, placements in profiles for start, size in placements)
    taken = {piece for start, size, _ in instances for piece in range(start, start + size)}
    if len(instances) >= split:
        return Gpu(capacity, 0, 0, None, model)
    room = capacity - used
    free = min(capacity * (slices - len(taken)) // slices, room)

    def placeable(placements: Sequence[tuple[int, int]]) -> bool:
        return any(not taken & set(range(start, start + size)) for start, size in placements)

    largest = max((memory for memory, placements in profiles if placeable(placements)), default=0)
    return Gpu(capacity, max(free, 0), max(min(largest, room), 0), None, model)


def shared_gpu(capacity: int, used: int, cores: int | None, pods: int, split: int, model: str) -> Gpu:
    """A GPU shared by memory (and compute, where `cores` is tracked): nothing free once it runs `split` pods (0: no
    limit) or its compute is all taken."""
    full = (split and pods >= split) or (cores is not None and cores >= 100)
    free = 0 if full else max(capacity - used, 0)
    return Gpu(capacity, free, free, None if cores is None else 100 - cores, model)


UNREPORTED = math.inf
