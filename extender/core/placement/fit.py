"""The general fit: a pod's containers placed on a node's GPUs in memory, compute and slots (HAMi's model).

A plain demand (memory alone, any GPU) is judged from the node summaries by `judge.py`, in a few attribute
reads. Everything else comes here: compute shares, percentages of a GPU's memory, several GPU containers,
init containers, GPU selectors, NUMA binding, a pod's own strategy. Per container, init containers first:

- an init container runs alone, before the others: it is placed against the node as it is;
- app containers run together: each is placed against the node plus the app containers placed before it;
- one container's GPUs are distinct; two containers may share a GPU (a slot each);
- on a MIG GPU every container's instance lives as long as the pod, so later containers are placed beside the
  earlier ones' instances; but a container may take the very instance (profile and placement) an init container
  of the pod took, as HAMi places it (each container against the GPU without the pod's init containers) and its
  device plugin gives it (the instance made at that profile and placement, whoever asked it first).

A GPU serves a container when it is usable (healthy, not cordoned), the pod's selectors admit it, it has a
slot left, and room for the container's memory and compute; a container asking a whole 100-compute GPU needs
one no pod uses; one asking no compute needs a GPU whose compute is not all taken (HAMi's rules, on MIG GPUs
too, where a container's compute is checked against the profile compute its GPU's instances hold); on a MIG
GPU, an instance that holds it must be placeable. Among the GPUs that serve, binpack takes the fullest first,
spread the emptiest, by the fill of all three dimensions (HAMi's score); ties go to the lower index, so one
state always gives one answer. A pod's own chain of keys (HAMi's comma list) is HAMi's order to the end: its
ties go to the higher index, as HAMi's Fit walks its list sorted by index from the end. With numa-bind, a
container's GPUs come from one NUMA node, the GPUs walked NUMA node by NUMA node as HAMi walks them.

When a container cannot be placed, the refusal names the dimension that failed in plain words ("needs 30 % of
a GPU's compute; the most free is 20 % (GPU 2 of 4)"), and whether evicting pods could ever help
(FAILED) or not (UNRESOLVABLE: no GPU here could ever serve it).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from extender.core import mig
from extender.core.devices import WHOLE_GPU, Demand, Device, Request, Selectors, Strategy
from extender.core.holds import Grant
from extender.core.placement import topology


class Verdict(enum.IntEnum):
    FITS = 0
    FAILED = 1
    """Does not fit now; evicting pods could make room."""
    UNRESOLVABLE = 2
    """No device here could ever hold the demand: preemption cannot help."""


class Cause(enum.StrEnum):
    """Why a node was refused, in one word: the label of `extender_filter_rejections_total`."""

    NONE = "none"
    NOT_IN_CACHE = "not_in_cache"
    NOT_READY = "not_ready"
    LOCKED = "locked"
    NO_GPUS = "no_gpus"
    TOO_SMALL = "too_small"
    """No GPU here is that large (memory or compute)."""
    TOO_FEW = "too_few"
    """Fewer GPUs here than asked could ever serve (or than the device plugin gives a pod: gpushare's, one)."""
    NO_MATCH = "no_match"
    """No GPU here matches the pod's selectors (or none is usable)."""
    MEMORY = "memory"
    COMPUTE = "compute"
    SLOTS = "slots"
    EXCLUSIVE = "exclusive"
    NUMA = "numa"
    SLICES = "slices"
    """No MIG instance that holds it can be placed in the GPU's free slices."""
    QUOTA = "quota"
    """The namespace's ResourceQuota has no room left for what the pod would be given here (`quota/`)."""
    JOB_HOLD = "job_hold"
    """The node's cpu or memory left is held for members of a job placed whole that are still to bind (`jobs.py`)."""


class Judgement(NamedTuple):
    verdict: Verdict
    reason: str
    """What a person can act on ("" when it fits)."""
    cause: Cause = Cause.NONE


FITS = Judgement(Verdict.FITS, "")


@dataclass(frozen=True, slots=True)
class Usage:
    """What the node's GPUs hold, per position: the base a container is placed against. Mutable lists."""

    memory: list[int]
    cores: list[int]
    slots: list[int]
    occupied: list[list[tuple[int, int]]] | None = None
    """MIG nodes: per position, the (start, size) of the instances held (`NodeState.occupied`)."""
    blocked: dict[int, str] | None = None
    """MIG nodes: positions that take no new pod, and why (`NodeState.blocked`)."""

    def copy(self) -> Usage:
        occupied = None if self.occupied is None else [list(placements) for placements in self.occupied]
        return Usage(list(self.memory), list(self.cores), list(self.slots), occupied, self.blocked)

    def add(self, position: int, grant: Grant) -> None:
        self.memory[position] += grant.memory
        self.cores[position] += grant.cores
        self.slots[position] += 1

    def reserve(self, position: int, grant: Grant) -> None:
        """The grant's MIG instance, if any, is held from now on (by every container of the pod, init or not: an
        instance lives as long as its pod)."""
        if grant.instance is not None and self.occupied is not None:
            self.occupied[position].append((grant.instance.start, grant.instance.size))


@dataclass(frozen=True, slots=True)
class Placement:
    """Per GPU container (init containers first), the GPUs it gets."""

    containers: tuple[tuple[Grant, ...], ...]
    init_containers: int


Rank = Callable[[int, Request], float]
"""How good giving this device (by position) to this request is, lower first: overrides the strategy's order,
which then only breaks ties (the fragmentation policy's added fragmentation)."""


def place(
    demand: Demand, devices: Sequence[Device], usage: Usage, strategy: Strategy, unit: str, rank: Rank | None = None
) -> Placement | Judgement:
    """Place every container of the demand on these devices, or say why not (a Judgement that does not fit)."""
    app = usage.copy()
    initial = usage if usage.occupied is None else usage.copy()  # MIG: instances of earlier containers count
    shared = None if usage.occupied is None else _Shared([[] for _ in devices], [[] for _ in devices])
    placed: list[tuple[Grant, ...]] = []
    requests = demand.requests
    for number, request in enumerate(requests):
        base = initial if request.init else app
        label = f"container {number + 1} of {len(requests)}: " if len(requests) > 1 else ""
        shareable = None if shared is None else shared.shareable(request.init)
        chosen = _place_one(request, demand.selectors, devices, base, strategy, unit, label, rank, shareable)
        if isinstance(chosen, Judgement):
            return chosen
        for position, grant in chosen:
            if not request.init:
                app.add(position, grant)
            if grant.instance is not None and (shared is None or not shared.take(position, grant.instance, request)):
                app.reserve(position, grant)
                initial.reserve(position, grant)
        placed.append(tuple(grant for _, grant in chosen))
    return Placement(tuple(placed), sum(1 for request in requests if request.init))


@dataclass(frozen=True, slots=True)
class _Shared:
    """MIG: per position, the instances the pod's init containers took, and those of them an app container has
    taken too (an init container has ended when the app containers run, so one of them may take its instance;
    two app containers run together and may not share one). Mutable lists."""

    init: list[list[mig.MigInstance]]
    taken: list[list[mig.MigInstance]]

    def shareable(self, init: bool) -> list[list[mig.MigInstance]]:
        """Per position, the instances a container of this kind may take as they are."""
        if init:
            return self.init
        return [[one for one in held if one not in taken] for held, taken in zip(self.init, self.taken, strict=True)]

    def take(self, position: int, instance: mig.MigInstance, request: Request) -> bool:
        """Record the instance a container was given; whether it is one it shares (nothing more to reserve)."""
        if request.init:
            if instance in self.init[position]:
                return True
            self.init[position].append(instance)
            return False
        if instance in self.init[position] and instance not in self.taken[position]:
            self.taken[position].append(instance)
            return True
        return False


def _score(device: Device, position: int, usage: Usage, weights: tuple[int, int, int] = (1, 1, 1)) -> float:
    """How full the device is, over the dimensions its plugin tracks, each weighed by the pod's (slot, core,
    memory) weights (HAMi's per-GPU score, `ComputeScore`, pkg/scheduler/policy/gpu_policy.go:194-221)."""
    slot, core, memory = weights
    score = memory * usage.memory[position] / device.capacity if device.capacity else 0.0
    if device.cores:
        score += core * usage.cores[position] / device.cores
    if device.slots:
        score += slot * usage.slots[position] / device.slots
    return score


def _order(
    selectors: Selectors, strategy: Strategy, devices: Sequence[Device], usage: Usage
) -> Callable[[int], tuple[float, ...]]:
    """The devices' order, best first. By the pod's chain of keys where it gave one (binpack: fullest first;
    spread: emptiest; numa: by NUMA node, the highest first), then the higher index: HAMi sorts by the chain, then
    by index, ascending (`lessByChain`, pkg/scheduler/policy/gpu_policy.go:132-167) and its Fit walks the list
    from the end (pkg/device/nvidia/device.go:727). Else by the strategy, then the lower index; with numa-bind, by
    NUMA node first, as HAMi keeps a NUMA node's GPUs together: binpack walks the lowest first, spread the highest
    (gpu_policy.go:100-113)."""
    weights = selectors.weights
    if not selectors.order:
        sign = -1.0 if strategy is Strategy.BINPACK else 1.0
        if selectors.numa_bind:
            side = -sign
            return lambda p: (side * devices[p].numa, sign * _score(devices[p], p, usage, weights), devices[p].index)
        return lambda p: (sign * _score(devices[p], p, usage, weights), devices[p].index)

    def chained(p: int) -> tuple[float, ...]:
        score = _score(devices[p], p, usage, weights)
        keys = {"binpack": -score, "spread": score, "numa": -float(devices[p].numa)}
        return (*(keys[word] for word in selectors.order), -devices[p].index)

    return chained


Shareable = Sequence[Sequence[mig.MigInstance]] | None
"""MIG: per position, the instances of the pod's init containers a container may take as they are (`_Shared`)."""


def _blocker(
    request: Request, selectors: Selectors, device: Device, position: int, usage: Usage, shareable: Shareable = None
) -> Cause:
    """The first reason this device cannot serve the request now (NONE when it can), in the order of HAMi's Fit
    (pkg/device/nvidia/device.go:730-827): compute before the MIG instance, on MIG GPUs too."""
    if not device.usable or not selectors.admits(device):
        return Cause.NO_MATCH
    if device.slots and usage.slots[position] >= device.slots:
        return Cause.SLOTS
    if selectors.exclusive and usage.slots[position] > 0:
        return Cause.EXCLUSIVE
    if device.capacity - usage.memory[position] < request.memory_on(device):
        return Cause.MEMORY
    occupied = usage.occupied
    if occupied is not None and usage.blocked and position in usage.blocked:
        return Cause.SLICES
    cores = request.cores
    if device.cores:
        if device.cores - usage.cores[position] < cores:
            return Cause.COMPUTE
        if device.cores == WHOLE_GPU and cores == WHOLE_GPU and usage.slots[position] > 0:
            return Cause.EXCLUSIVE
        if not cores and usage.cores[position] >= device.cores:
            return Cause.COMPUTE
    if occupied is not None and device.mig:
        held = shareable[position] if shareable is not None else ()
        chosen = _mig_choice(device, occupied[position], held, request.memory_on(device))
        return Cause.NONE if chosen is not None else Cause.SLICES
    return Cause.NONE


def _mig_choice(
    device: Device, occupied: mig.Occupied, shareable: Sequence[mig.MigInstance], memory: int
) -> tuple[mig.MigProfile, mig.MigInstance] | None:
    """The profile and instance a container gets on a MIG GPU, or None. HAMi places a container against the GPU
    without the pod's init containers (pkg/scheduler/score.go:226-286), and its device plugin gives a container
    the instance already made at its profile and placement (`EnsureAllocation`, plugin/migmgr.go:339-343): so the
    instance chosen without them is taken when it is one of them. Otherwise a new instance, beside them (HAMi's
    plugin would fail to make one that overlaps them, migmgr.go:380-383)."""
    if shareable:
        others = list(occupied)
        for instance in shareable:
            others.remove((instance.start, instance.size))
        if mig.placeable(device.profiles, others, memory) is not None:
            profile, instance = mig.choose(device.profiles, others, memory)
            if instance in shareable:
                return profile, instance
    if mig.placeable(device.profiles, occupied, memory) is None:
        return None
    return mig.choose(device.profiles, occupied, memory)


def _could_ever(request: Request, selectors: Selectors, device: Device) -> bool:
    """Whether the device could serve the request on an empty node (else evicting pods cannot help)."""
    if not device.usable or not selectors.admits(device):
        return False
    if device.capacity < request.memory_on(device):
        return False
    if device.mig and all(profile.memory < request.memory_on(device) for profile in device.profiles):
        return False
    return not (device.cores and device.cores < request.cores)


def _place_one(
    request: Request,
    selectors: Selectors,
    devices: Sequence[Device],
    usage: Usage,
    strategy: Strategy,
    unit: str,
    label: str,
    rank: Rank | None = None,
    shareable: Shareable = None,
) -> list[tuple[int, Grant]] | Judgement:
    serving = [
        position
        for position, device in enumerate(devices)
        if _blocker(request, selectors, device, position, usage, shareable) is Cause.NONE
    ]
    order = _order(selectors, strategy, devices, usage)
    if rank is None:
        serving.sort(key=order)
    else:
        serving.sort(key=lambda p: (rank(p, request), *order(p)))
    if selectors.numa_bind:
        serving = _one_numa_node(serving, devices, request.devices, last=selectors.topology)
    if selectors.topology and len(serving) > request.devices:
        serving = topology.best_linked(serving, devices, request.devices)
    if len(serving) >= request.devices:
        return [(p, _grant(request, devices[p], p, usage, shareable)) for p in serving[: request.devices]]
    numa = bool(serving) or selectors.numa_bind
    return _refusal(request, selectors, devices, usage, unit, label, numa, shareable)


def _grant(request: Request, device: Device, position: int, usage: Usage, shareable: Shareable = None) -> Grant:
    """What the request takes of a device that serves it: its memory and compute; on a MIG GPU, an instance, and
    the memory and compute of its profile (what HAMi records, `AddResourceUsage` in device.go:645-664)."""
    memory = request.memory_on(device)
    if not device.mig or usage.occupied is None:
        return Grant(device.index, memory, request.cores, device.uuid)
    held = shareable[position] if shareable is not None else ()
    chosen = _mig_choice(device, usage.occupied[position], held, memory)
    if chosen is None:
        raise ValueError(f"no MIG profile of at least {memory} MiB has a placement free")
    profile, instance = chosen
    return Grant(device.index, profile.memory, profile.cores, device.uuid, instance)


def _one_numa_node(serving: list[int], devices: Sequence[Device], count: int, last: bool = False) -> list[int]:
    """The serving devices of the first NUMA node (in the order given) that has `count` of them. With `last` (a
    topology-aware container) that of the last NUMA node when it has enough: HAMi's Fit collects the candidates
    of each NUMA node it walks afresh and judges only the last (pkg/device/nvidia/device.go:746-754, 850-869),
    refusing the container when that one has too few; here the first NUMA node that has enough is taken then."""
    groups: dict[int, list[int]] = {}
    for position in serving:
        groups.setdefault(devices[position].numa, []).append(position)
    ordered = list(groups.values())
    if last and ordered and len(ordered[-1]) >= count:
        return ordered[-1]
    for group in ordered:
        if len(group) >= count:
            return group
    return []


def _refusal(
    request: Request,
    selectors: Selectors,
    devices: Sequence[Device],
    usage: Usage,
    unit: str,
    label: str,
    numa: bool,
    shareable: Shareable = None,
) -> Judgement:
    total, count = len(devices), request.devices
    need = describe(request, unit)
    ever = [p for p, device in enumerate(devices) if _could_ever(request, selectors, device)]
    if len(ever) < count:
        admitted = [device for device in devices if device.usable and selectors.admits(device)]
        if not admitted:
            what = "usable" if selectors.any else "matching the pod's GPU selectors"
            return Judgement(Verdict.UNRESOLVABLE, f"{label}no GPU here is {what}", Cause.NO_MATCH)
        if count == 1:
            largest = max(admitted, key=lambda device: (device.capacity, device.cores))
            largest_has = f"{largest.capacity} {unit}" + (f" and {largest.cores} % compute" if largest.cores else "")
            reason = f"{label}needs {need} on one GPU; the largest GPU here has {largest_has}"
            return Judgement(Verdict.UNRESOLVABLE, reason, Cause.TOO_SMALL)
        reason = f"{label}needs {count} GPUs with {need} each; {len(ever)} of {total} GPUs here are that large"
        return Judgement(Verdict.UNRESOLVABLE, reason, Cause.TOO_FEW)
    causes = [_blocker(request, selectors, devices[p], p, usage, shareable) for p in ever]
    serving = causes.count(Cause.NONE)
    if numa and serving >= count:
        reason = f"{label}needs {count} GPUs with {need} free each on one NUMA node; no NUMA node here has that"
        return Judgement(Verdict.FAILED, reason, Cause.NUMA)
    cause = max((Cause.MEMORY, Cause.COMPUTE, Cause.SLOTS, Cause.EXCLUSIVE, Cause.SLICES), key=causes.count)
    if count > 1:
        what = {
            Cause.MEMORY: f"{need} free",
            Cause.COMPUTE: f"{need} free",
            Cause.SLOTS: "a pod slot left",
            Cause.EXCLUSIVE: "no pod on them",
            Cause.SLICES: "a MIG instance that holds it free",
        }[cause]
        return Judgement(
            Verdict.FAILED, f"{label}needs {count} GPUs with {what} each; {serving} of {total} have that", cause
        )
    if cause is Cause.SLOTS:
        most = max(devices[p].slots for p in ever)
        detail = f"every GPU here that could hold it runs its most pods ({most} each)"
        return Judgement(Verdict.FAILED, f"{label}needs {need} on one GPU; {detail}", cause)
    if cause is Cause.EXCLUSIVE:
        reason = f"{label}needs a GPU to itself ({need}); every GPU here that could hold it runs a pod"
        return Judgement(Verdict.FAILED, reason, cause)
    if cause is Cause.SLICES:
        short = [p for p, blocker in zip(ever, causes, strict=True) if blocker is Cause.SLICES]
        return Judgement(
            Verdict.FAILED, f"{label}needs {need} on a MIG GPU; {_slices_left(short, devices, usage)}", cause
        )
    if cause is Cause.COMPUTE:
        short = [p for p, blocker in zip(ever, causes, strict=True) if blocker is Cause.COMPUTE]
        best = max(short, key=lambda p: (devices[p].cores - usage.cores[p], -devices[p].index))
        most = max(0, devices[best].cores - usage.cores[best])
        detail = f"the most free is {most} % (GPU {devices[best].index} of {total})"
        what = f"{request.cores} % of a GPU's compute" if request.cores else "a GPU with compute left"
        return Judgement(Verdict.FAILED, f"{label}needs {what}; {detail}", cause)
    short = [p for p, blocker in zip(ever, causes, strict=True) if blocker is Cause.MEMORY]
    best = max(short, key=lambda p: (devices[p].capacity - usage.memory[p], -devices[p].index))
    most = max(0, devices[best].capacity - usage.memory[best])
    detail = f"largest free is {most} {unit} (GPU {devices[best].index} of {total})"
    return Judgement(
        Verdict.FAILED, f"{label}needs {request.memory_on(devices[best])} {unit} on one GPU; {detail}", cause
    )


def _slices_left(short: list[int], devices: Sequence[Device], usage: Usage) -> str:
    """What the free slices of the MIG GPUs refused still allow, at best ("the free slices of GPU 2 allow
    1g.5gb at most")."""
    blocked = usage.blocked or {}
    best: tuple[int, int, str] | None = None
    for position in short:
        if position in blocked:
            continue
        occupied = usage.occupied[position] if usage.occupied is not None else []
        for profile in devices[position].profiles:
            if mig.free_placements(profile, occupied):
                candidate = (profile.memory, -devices[position].index, profile.name)
                if best is None or candidate > best:
                    best = candidate
    if best is not None:
        return f"the free slices of GPU {-best[1]} allow {best[2]} at most"
    if blocked and all(position in blocked for position in short):
        position = short[0]
        return f"GPU {devices[position].index} takes no new pod: {blocked[position]}"
    return "no MIG GPU here that could hold it has a slice free"


def describe(request: Request, unit: str) -> str:
    """What one GPU must give: "4000 MiB", "50 % of its memory", with ", 30 % compute" when asked."""
    memory = (
        f"{request.memory} {unit}" if request.memory or not request.percent else f"{request.percent} % of its memory"
    )
    return f"{memory} and {request.cores} % compute" if request.cores else memory
