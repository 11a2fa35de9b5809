"""One node as the cache sees it (`NodeState`): its GPUs, the holds on them, and the summary kept current.

The summary (free memory per GPU, the largest free, totals, the cpu and memory its pods request) is derived
from the devices and the holds by `refresh`, which the cache calls on every change of the node; a filter reads
a few attributes per node name instead of rescanning pods. Nothing here decides placement (`placement/`)
or changes a hold (the cache and the ledger do).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from extender.core import mig
from extender.core.devices import Device, NodeLock
from extender.core.holds import Allocation, Hold


@dataclass(slots=True, eq=False)
class NodeState:
    """One node as the cache sees it. Mutable: its holds change, and its summary follows on every change."""

    name: str
    devices: tuple[Device, ...] = ()
    known: bool = True
    """False for a node we only know from pods bound to it (not listed, or deleted while they still run)."""
    ready: bool = True
    unreadable: str = ""
    """Why the GPUs the node advertises could not be read ("" when they could, or it advertises none)."""
    lock: NodeLock | None = None
    """The device plugin's lock (HAMi), while one is held and not older than the cache's lock timeout."""
    holds: dict[str, Hold] = field(default_factory=dict)
    # the summary, derived from devices and holds by refresh():
    used: list[int] = field(default_factory=list)
    used_cores: list[int] = field(default_factory=list)
    used_slots: list[int] = field(default_factory=list)
    """Container uses per device: what a split count limits (HAMi)."""
    free: list[int] = field(default_factory=list)
    """Memory a new pod can take on each device: 0 on one that takes none (unhealthy, cordoned, out of slots or
    of compute)."""
    free_desc: tuple[int, ...] = ()
    capacity_desc: tuple[int, ...] = ()
    largest_free: int = 0
    largest_free_index: int = -1
    capacity_total: int = 0
    used_total: int = 0
    stray: int = 0
    """Memory held on device indexes this node does not have (a device vanished under running pods)."""
    fit_free: int = -1
    """The largest plain one-GPU demand this node takes now: `largest_free`, or -1 when unknown, not Ready or
    locked."""
    cpu_allocatable: int = 0
    """Millicores (0: the node reports none; then cpu never limits it here)."""
    memory_allocatable: int = 0
    """Bytes (0: unknown, as for cpu)."""
    cpu_requested: int = 0
    """Millicores its pods request: bound ones and those we reserved on it (all pods, GPU or not)."""
    memory_requested: int = 0
    free_gpus: float = 0.0
    """Free GPU in GPUs (each GPU's free memory over its capacity): how empty the node is, for the policy."""
    mig: bool = False
    """Some GPU here is in MIG mode: pods are placed by the general fit, which chooses instances."""
    occupied: list[tuple[tuple[int, int], ...]] = field(default_factory=list)
    """MIG nodes: per device, the (start, size) of the instances its holds reserve."""
    blocked: dict[int, str] = field(default_factory=dict)
    """MIG nodes: devices (by position) that take no new pod, and why: a hold whose instances cannot be known
    (HAMi marks such a GPU unhealthy, `getNodesUsage` in pkg/scheduler/scheduler.go:788-838 at v2.10.0)."""
    _shape_of: tuple[Device, ...] | None = field(default=None, repr=False)
    """The devices `_positions`, `capacity_desc` and `capacity_total` were computed for (`refresh`)."""
    _positions: dict[int, int] = field(default_factory=dict, repr=False)
    """Device index -> its position in `devices`."""

    def position(self, index: int) -> int:
        """Where device `index` sits in `devices`, or -1."""
        for position, device in enumerate(self.devices):
            if device.index == index:
                return position
        return -1

    def takes_new_pods(self, position: int) -> bool:
        """Whether the device at `position` may take another pod at all: usable, a slot left (where slots are
        limited), compute left (where compute is tracked)."""
        device = self.devices[position]
        if not device.usable:
            return False
        if device.slots and self.used_slots[position] >= device.slots:
            return False
        return not (device.cores and self.used_cores[position] >= device.cores)

    def refresh(self) -> None:
        """Recompute the summary from the devices and the holds (the cache calls it on every change of the node,
        a few times per pod bound: kept to plain loops and builtins, about 10 µs for 8 GPUs and 20 pods)."""
        devices = self.devices
        if self._shape_of is not devices:  # what depends on the devices alone, once per new devices
            self._positions = {device.index: position for position, device in enumerate(devices)}
            self.capacity_desc = tuple(sorted((device.capacity for device in devices if device.usable), reverse=True))
            self.capacity_total = sum(device.capacity for device in devices)
            self.mig = any(device.mig for device in devices)
            self._shape_of = devices
        count = len(devices)
        used, cores, slots = [0] * count, [0] * count, [0] * count
        stray = 0
        positions = self._positions
        instances = False
        for hold in self.holds.values():
            for use in hold.allocation.uses:
                if use.instances:
                    instances = True
                position = positions.get(use.index, -1) if use.index >= 0 else -1
                if position < 0:
                    stray += use.memory
                else:
                    used[position] += use.memory
                    cores[position] += use.cores
                    slots[position] += use.slots
        self.used, self.used_cores, self.used_slots = used, cores, slots
        self.stray = stray
        if self.mig or instances or self.blocked:
            self._instances()
        check_mig = self.mig or bool(self.blocked)
        free = []
        free_gpus = 0.0
        for position, device in enumerate(devices):  # `takes_new_pods`, inline
            capacity = device.capacity
            takes = (
                device.healthy
                and not device.cordoned
                and not (device.slots and slots[position] >= device.slots)
                and not (device.cores and cores[position] >= device.cores)
            )
            amount = capacity - used[position] if takes and capacity > used[position] else 0
            if check_mig and (device.mode == mig.MODE or position in self.blocked):
                amount = self._mig_free(position)
            free.append(amount)
            if capacity:
                free_gpus += amount / capacity
        self.free = free
        self.free_desc = tuple(sorted(free, reverse=True))
        self.used_total = sum(used)
        if free:
            largest = max(free)
            self.largest_free, self.largest_free_index = largest, devices[free.index(largest)].index  # first of equals
        else:
            self.largest_free, self.largest_free_index = 0, -1
        self.fit_free = self.largest_free if self.known and self.ready and self.lock is None else -1
        self.free_gpus = free_gpus

    def _instances(self) -> None:
        """`occupied` and `blocked` from the holds (`instances_of`)."""
        occupied, blocked = instances_of(
            self.devices, self._positions, (hold.allocation for hold in self.holds.values())
        )
        self.occupied = [tuple(placements) for placements in occupied]
        self.blocked = blocked

    def _mig_free(self, position: int) -> int:
        """What a MIG GPU can give one more container: the largest profile with a placement free, within the
        memory HAMi counts free; none when it is blocked, unusable or out of its instances (`count`). Compute is
        left to the general fit, which checks what a container asks against it (HAMi's rule, device.go:794-810):
        what the GPU holds is its instances' profile compute, rounded up (7 x 15 on a full A100), which says
        nothing of the memory an instance could still give."""
        device = self.devices[position]
        used = self.used[position]
        if (
            position in self.blocked
            or not device.mig
            or not device.usable
            or (device.slots and self.used_slots[position] >= device.slots)
            or used >= device.capacity
        ):
            return 0
        return min(device.capacity - used, mig.largest_placeable(device.profiles, self.occupied[position]))


def instances_of(
    devices: Sequence[Device], positions: Mapping[int, int], allocations: Iterable[Allocation]
) -> tuple[list[list[tuple[int, int]]], dict[int, str]]:
    """Per device (by position), the (start, size) of the MIG instances the allocations reserve, and the devices
    that take no new pod, with why: a MIG GPU that holds a pod without an instance, a GPU in another mode that
    holds one, and every MIG GPU of a node where an instance names a GPU it does not have, until those pods end
    (HAMi marks them unhealthy: `getNodesUsage`, pkg/scheduler/scheduler.go:788-838 at v2.10.0). The one place
    these rules live: the cache's summary, and preemption's node without its victims, read them from here."""
    occupied: list[list[tuple[int, int]]] = [[] for _ in devices]
    blocked: dict[int, str] = {}
    for allocation in allocations:
        pod = allocation.pod
        for use in allocation.uses:
            position = positions.get(use.index, -1) if use.index >= 0 else -1
            if position < 0:
                if use.instances:
                    gone = f"pod {pod} reserves a MIG instance on GPU {use.uuid or use.index}, not on this node"
                    blocked.update((other, gone) for other, device in enumerate(devices) if device.mig)
                continue
            device = devices[position]
            if use.instances and not device.mig:
                blocked[position] = f"pod {pod} reserves a MIG instance on it, not in MIG mode"
            elif device.mig and not use.instances:
                blocked[position] = f"pod {pod} runs on it without a MIG instance reserved"
            occupied[position].extend((instance.start, instance.size) for instance in use.instances)
    return occupied, blocked


def overcommitted(states: Iterable[NodeState]) -> list[str]:
    """Every device whose holds exceed its memory, compute or slots, as messages; empty when the invariant holds
    (DESIGN §3: `used <= capacity` in every dimension the device plugin enforces)."""
    found = []
    for state in states:
        for position, device in enumerate(state.devices):
            used, cores, slots = state.used[position], state.used_cores[position], state.used_slots[position]
            if used > device.capacity:
                found.append(f"{state.name} GPU {device.index}: used {used} > capacity {device.capacity}")
            if device.cores and cores > device.cores and not device.mig:  # MIG: profile cores may pass 100
                found.append(f"{state.name} GPU {device.index}: compute {cores} > {device.cores}")
            if device.slots and slots > device.slots:
                found.append(f"{state.name} GPU {device.index}: {slots} pods > split count {device.slots}")
            clash = mig.clash(state.occupied[position]) if position < len(state.occupied) else None
            if clash is not None:
                found.append(f"{state.name} GPU {device.index}: MIG instances overlap at slice {clash[0]}")
    return found
