"""How much GPU a node leaves unusable for the pods that come: the measure the default policy minimises.

The measure is the one of "Beware of Fragmentation" (Weng et al., USENIX ATC'23; hkust-adsl/kubernetes-
scheduler-simulator `pkg/utils/frag.go` `NodeGpuShareFragAmount`), generalised to what our protocols know.
For a node and one typical shape (`workload.py`):

- if the shape cannot run on the node at all (not enough free cpu or memory, fewer GPUs of an allowed model
  with room for it than it asks), *all* of the node's free GPU is fragment for it;
- else the free GPU on the GPUs it cannot use (too little memory or compute left, a model it does not allow)
  is fragment for it.

The node's fragmentation F is the sum over the typical shapes of their weight x their fragment, in GPUs (each
GPU's free memory over its capacity, so every GPU counts one whatever its size; a GPU that takes no new pod,
out of slots or compute, has none free). Placing a pod changes F; the policy places it where F grows least
(`fragmentation.added_fragmentation`), on the GPUs where it grows least. A node with nothing free has F = 0: a full
node is no waste.

One term is ours, added to the paper's (`STARVED_WEIGHT` x `starved`): the free GPU the node's free cpu and
memory cannot feed. The paper's measure looks one pod ahead: a node with two free GPUs and the cpu of one
typical pod and a half counts no fragment for that pod, yet the second GPU will starve once the first is
taken. The typical shapes bring, on average, so many millicores and bytes with each GPU they take
(`Classes.rates`; a share pod's with the share it takes); the free GPU beyond what the node's free cpu and
memory can feed at those rates is counted too. Measured with `make bench-placement` (fast mode, trace
`default`, seed 42): the paper's measure alone 95.2 % of the GPUs allocated at 130 % arrived, with this term at
weight 0.25, 0.5, 1 and 2: 95.9, 96.0, 96.0, 96.0 %. The gain comes from the nodes whose cpu per GPU is
scarce (8 GPUs and 96 cores): fewer of their GPUs are left without cpu at the end.

What it costs and how it is kept cheap: F is one pass over the typical shapes' distinct GPU parts (`GpuGroup`),
each a bisection of the node's GPUs sorted by free memory when they are all of one size and model (a pass over
them otherwise). It depends on the node's free cpu only through how many of the shapes' cpu asks it covers (the
same for memory), and not on the order of the GPUs, so it is memoised by that (`FragmentMemo`): identical
nodes, the common case in a cluster, share one entry, and a node's F is computed once per change. The memo is
dropped when the shapes are rebuilt.

Pure arithmetic over values the cache gives (`room_of`, `gpu_room`: a node as the measure sees it); no I/O, no
state beyond the memo.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from extender.core import mig
from extender.core.mig import MigInstance
from extender.core.nodes import NodeState
from extender.core.placement.workload import Classes, Shape

GpuRoom = tuple[int, int, int, str, int]
"""One GPU as the measure sees it: (memory free, memory capacity, compute free or -1 when its plugin does not
track compute, model, the most one new pod can take). The last is the first, but on a MIG GPU the first is the
memory of its free slices (what is wasted if no pod can use them) and the last the largest instance that can
still be placed in them (what a pod can take). Sorted tuples of these are memo keys."""

STARVED_WEIGHT = 0.5
"""Weight of the free GPU the node's cpu and memory cannot feed (`starved`), against the paper's measure."""
UNLIMITED = 2**62
"""Free cpu or memory of a node that does not report it: nothing is ever short of it."""
MEMO_LIMIT = 200_000
"""Entries kept before the memo starts over: about 30 MB at most."""


@dataclass(frozen=True, slots=True)
class Room:
    """A node as the measure sees it."""

    cpu: int
    """Millicores free (`UNLIMITED` when unknown)."""
    memory: int
    """Bytes free."""
    gpus: tuple[GpuRoom, ...]


def room_of(state: NodeState) -> Room:
    """The node as the measure sees it: free cpu and memory (`UNLIMITED` where the node reports none), its GPUs."""
    return Room(
        state.cpu_allocatable - state.cpu_requested if state.cpu_allocatable else UNLIMITED,
        state.memory_allocatable - state.memory_requested if state.memory_allocatable else UNLIMITED,
        tuple(gpu_room(state, position) for position in range(len(state.devices))),
    )


def gpu_room(
    state: NodeState, position: int, memory: int = 0, cores: int = 0, instances: Sequence[MigInstance] | None = None
) -> GpuRoom:
    """One GPU of the node as the measure sees it, after `memory` and `cores` more are taken on it (on a MIG GPU:
    `instances` more, or where none are given, the instance `mig.choose` would make for `memory`)."""
    device = state.devices[position]
    if state.mig and device.mig:
        return _mig_room(state, position, memory, instances)
    free = state.free[position] - memory
    left = device.cores - state.used_cores[position] - cores if device.cores else -1
    if left == 0 or (device.slots and state.used_slots[position] + (1 if memory or cores else 0) >= device.slots):
        free = 0
    free = max(free, 0)
    return (free, device.capacity, left, device.model, free)


def _mig_room(state: NodeState, position: int, memory: int, instances: Sequence[MigInstance] | None) -> GpuRoom:
    """`gpu_room` of a MIG GPU. Compute is not its limit (`NodeState._mig_free`): -1, as on a GPU whose plugin
    does not track it."""
    device = state.devices[position]
    occupied = list(state.occupied[position])
    used, used_slots = state.used[position], state.used_slots[position]
    if instances is None and memory and position not in state.blocked:
        try:
            instances = (mig.choose(device.profiles, occupied, memory)[1],)
        except ValueError:  # it cannot take that much: nothing changes
            instances = ()
    for instance in instances or ():
        profile = mig.profile_named(device.profiles, instance.profile)
        occupied.append((instance.start, instance.size))
        used, used_slots = used + (profile.memory if profile else 0), used_slots + 1
    total = mig.slices(device.profiles)
    if position in state.blocked or not device.usable or not total or (device.slots and used_slots >= device.slots):
        return (0, device.capacity, -1, device.model, 0)
    room = device.capacity - used
    free = min(device.capacity * (total - sum(size for _, size in occupied)) // total, room)
    largest = min(mig.largest_placeable(device.profiles, occupied), room)
    return (max(free, 0), device.capacity, -1, device.model, max(largest, 0))


def free_gpus(gpus: Sequence[GpuRoom]) -> float:
    """Free GPU in GPUs."""
    return sum(gpu[0] / gpu[1] for gpu in gpus if gpu[1] > 0)


def starved(cpu: int, memory: int, total: float, rates: tuple[float, float]) -> float:
    """Of a node's `total` free GPU, how much its free `cpu` and `memory` cannot feed at the typical shapes'
    `rates` (millicores and bytes per GPU: `Classes.rates`)."""
    cpu_rate, memory_rate = rates
    fed = total
    if cpu_rate > 0:
        fed = min(fed, cpu / cpu_rate)
    if memory_rate > 0:
        fed = min(fed, memory / memory_rate)
    return total - fed


def fragment(cpu: int, memory: int, gpus: Sequence[GpuRoom], classes: Classes) -> float:
    """F for a node with this free `cpu`, `memory` and these `gpus` (see the module docstring). The GPUs are judged
    once per distinct GPU part of the shapes (`GpuGroup`); each shape of a group then only compares its cpu and
    memory. On a node whose GPUs share one size and model and track no compute (gpushare's, nearly always), a
    group is judged by one bisection of the GPUs sorted by free memory instead of a pass over them."""
    total = free_gpus(gpus)
    if not total:
        return 0.0
    first = gpus[0]
    if all(gpu[1] == first[1] and gpu[2] < 0 and gpu[3] == first[3] and gpu[0] == gpu[4] for gpu in gpus):
        return _uniform(cpu, memory, gpus, classes, total)
    return _general(cpu, memory, gpus, classes, total)


def _general(cpu: int, memory: int, gpus: Sequence[GpuRoom], classes: Classes, total: float) -> float:
    """`fragment` on any node: each group's GPU part judged on each GPU."""
    value = 0.0
    runs = classes.running(bisect_right(classes.cpu_steps, cpu), bisect_right(classes.memory_steps, memory))
    for group, running in zip(classes.groups, runs, strict=True):
        if running:
            shape = group.shape
            usable = 0
            unusable = 0.0
            for gpu in gpus:
                if serves(shape, gpu):
                    usable += 1
                elif gpu[1] > 0:
                    unusable += gpu[0] / gpu[1]
            value += running * (total if usable < shape.devices else unusable)
        value += (group.weight - running) * total
    return value


def _uniform(cpu: int, memory: int, gpus: Sequence[GpuRoom], classes: Classes, total: float) -> float:
    """`fragment` where every GPU has the same capacity and model and no compute is tracked, summed by how many
    GPUs each group finds too small rather than group by group.

    With the GPUs' free memory ascending and `below[k]` the free GPU of the first `k`, a group whose threshold
    (the memory it needs free on one GPU, `GpuKind`) lies above `k` of them and that asks at most the `n - k`
    left contributes `running x below[k] + (weight - running) x total`, and any other `weight x total`. So F =
    sum over k of below[k] x A[k], plus total x (W - sum of A[k]), where A[k] is the running weight of the groups
    whose thresholds fall between the k-th and the (k+1)-th GPU's free memory and that ask few enough GPUs: a
    difference of two prefix sums per k (`GpuKind.prefixes`, computed once per pair of ranks). That is n + 1
    steps a node instead of one per group, and the same steps in arrays for thousands of nodes at once
    (`batch.measures` performs exactly these operations, in this order, so the two agree to the bit)."""
    capacity, model = gpus[0][1], gpus[0][3]
    frees = sorted(gpu[0] for gpu in gpus)
    below = [0.0]  # below[k]: free GPU on the k GPUs with the least free memory
    for free in frees:
        below.append(below[-1] + free / capacity)
    count = len(frees)
    kind = classes.kind(capacity, model)
    prefixes = kind.prefixes(classes, bisect_right(classes.cpu_steps, cpu), bisect_right(classes.memory_steps, memory))
    thresholds, last, groups = kind.thresholds, kind.most_devices, len(kind.thresholds)
    low = 0
    taken = 0.0
    value = 0.0
    for k in range(count + 1):
        high = bisect_right(thresholds, frees[k]) if k < count else groups
        row = prefixes[min(count - k, last)]
        part = row[high] - row[low]
        taken = taken + part
        value = value + below[k] * part
        low = high
    return value + total * (kind.weight - taken)


def uniform_measure(frees: Sequence[int], cpu: int, memory: int, capacity: int, model: str, classes: Classes) -> float:
    """What the policy minimises (`FragmentMemo.measure`) for a node whose GPUs are all of one `capacity` and
    `model`, no compute tracked, with these amounts free (ascending): the very steps `FragmentMemo.measure` and
    `_uniform` take for such a node, in their order, without building the GPUs' tuples."""
    return uniform_measurer(len(frees), cpu, memory, capacity, model, classes)(frees)


def uniform_measurer(
    count: int, cpu: int, memory: int, capacity: int, model: str, classes: Classes
) -> Callable[[Sequence[int]], float]:
    """`uniform_measure` for nodes of `count` GPUs with this free cpu and memory, what does not depend on the
    GPUs' free memory looked up once: the filter judges the GPUs a pod could take on a node (a measure each)
    with one of these, three times faster than the general way (measured)."""
    kind = classes.kind(capacity, model)
    prefixes = kind.prefixes(classes, bisect_right(classes.cpu_steps, cpu), bisect_right(classes.memory_steps, memory))
    last, groups, weight = kind.most_devices, len(kind.thresholds), kind.weight
    rows = [prefixes[min(count - k, last)] for k in range(count + 1)]
    final = rows[count]
    highs: dict[int, int] = {}
    thresholds = kind.thresholds
    rates = classes.rates(capacity)

    def measure(frees: Sequence[int]) -> float:
        below = 0.0  # free GPU on the GPUs before the k-th, summed in order: `_uniform`'s below[k]
        taken = 0.0
        value = 0.0
        low = 0
        for k, free in enumerate(frees):
            high = highs.get(free)
            if high is None:
                high = highs[free] = bisect_right(thresholds, free)
            row = rows[k]
            part = row[high] - row[low]
            taken = taken + part
            value = value + below * part
            low = high
            below = below + free / capacity
        part = final[groups] - final[low]
        taken = taken + part
        value = value + below * part
        if not below:
            return 0.0
        value = value + below * (weight - taken)
        return value + STARVED_WEIGHT * starved(cpu, memory, below, rates)

    return measure


class FragmentMemo:
    """What the policy minimises per node state, for one build of the shapes (a new build starts it over).
    Mutable."""

    def __init__(self) -> None:
        self.version = -1
        self._values: dict[tuple[int, int, tuple[GpuRoom, ...]], tuple[float, float]] = {}
        self.computed = 0
        """F computed rather than found (for the tests and `make bench`)."""

    def measure(self, cpu: int, memory: int, gpus: tuple[GpuRoom, ...], classes: Classes) -> float:
        """F (memoised by the node's state as F sees it: how many of the shapes' cpu and memory asks the free cpu
        and memory cover, and the GPUs in any order) plus `STARVED_WEIGHT` x the starved GPU."""
        if classes.version != self.version:
            self.version = classes.version
            self._values = {}
        ordered = tuple(sorted(gpus))
        key = (bisect_right(classes.cpu_steps, cpu), bisect_right(classes.memory_steps, memory), ordered)
        found = self._values.get(key)
        if found is None:
            if len(self._values) >= MEMO_LIMIT:
                self._values = {}
            # Computed over the GPUs in sorted order, whatever order they came in: sums of the same terms in
            # another order differ in their last bits, and the value must not depend on which order was seen
            # first (the memo's key is the sorted tuple), nor differ from the batch computation (`batch.py`).
            found = self._values[key] = (fragment(cpu, memory, ordered, classes), free_gpus(ordered))
            self.computed += 1
        value, total = found
        if not total:
            return value
        return value + STARVED_WEIGHT * starved(cpu, memory, total, classes.rates(gpus[0][1]))

    def of(self, room: Room, classes: Classes) -> float:
        return self.measure(room.cpu, room.memory, room.gpus, classes)


def serves(shape: Shape, gpu: GpuRoom) -> bool:
    """Whether this GPU could take one of the shape's GPUs now: memory and compute left, a model it allows."""
    free, capacity, cores, model, largest = gpu
    return (
        bool(free) and largest >= shape.need(capacity) and (cores < 0 or cores >= shape.cores) and shape.admits(model)
    )
