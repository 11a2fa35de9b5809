"""The node cache: nodes, their devices, and every allocation of device memory, observed or reserved.

One mutable structure, fed by `apply_*`/`replace` (from a file or a watch) and by the ledger (reservations).
Every allocation is a `Hold` keyed by pod UID, in exactly one node's table: a pod that the API shows bound
with our annotations is *observed*; one we decided but the API has not shown back yet is *reserved*. An
observed pod replaces a reservation of the same UID, so nothing is counted twice.

Each `NodeState` keeps its summary (free memory per device, largest free, totals) up to date on every change,
so a filter reads a few attributes per node name instead of rescanning pods. This module does no I/O and
never decides placement: that is `policy.py`, and reservations' rules are `ledger.py`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

from extender.core import objects
from extender.core.devices import Demand, Device, NodeLock
from extender.core.fragmentation import UNLIMITED, FragmentMemo, GpuRoom, Room
from extender.core.holds import Allocation, Hold, HoldState
from extender.core.memo import FitIndex, Lru, NodeMemo
from extender.core.objects import Raw, as_object, pod_priority
from extender.core.protocols import DeviceProtocol
from extender.core.quota import Quotas
from extender.core.resources import InvalidPod, node_allocatable, node_ready, pod_request, required_values
from extender.core.workload import Classes, Shape, Workload, shape_of

TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
ASKED_LIMIT = 20_000
"""Pods remembered as learned from their filter request: kube-scheduler filters a pod moments before the watch
shows it, or moments after."""


@dataclass(frozen=True, slots=True)
class PodRecord:
    """The fields of a pod the extender uses; the cache keeps only these."""

    uid: str
    namespace: str
    name: str
    node_name: str
    demand: Demand | None
    """None when the pod's GPU request is unreadable (`unreadable` says why)."""
    allocation: Allocation | None
    """What its annotations say it was given, if anything."""
    assume_time: float
    unreadable: str = ""
    finished: bool = False
    """Succeeded or Failed: it holds nothing any more."""
    priority: int = 0
    """`spec.priority` (set by admission from its PriorityClass): who may be preempted for whom."""
    cpu: int = 0
    """Millicores requested, as kube-scheduler counts them on the node."""
    memory: int = 0
    """Bytes requested."""
    models: tuple[str, ...] = ()
    """GPU models it requires by node affinity on the protocol's model label (empty: any)."""

    @property
    def key(self) -> str:
        return objects.key(self.namespace, self.name)

    @property
    def shape(self) -> Shape | None:
        """What it asks of a node, for the learned workload (None: no GPU)."""
        return shape_of(self.demand, self.cpu, self.memory, self.models)


def pod_record(pod: Raw, protocol: DeviceProtocol) -> PodRecord:
    """Reduce a pod object to a PodRecord; an unreadable GPU request becomes `unreadable`, never an exception."""
    uid, namespace, name = objects.uid(pod), objects.namespace(pod), objects.name(pod)
    node = str(as_object(pod.get("spec")).get("nodeName") or "")
    unreadable = ""
    demand: Demand | None
    try:
        demand = protocol.pod_demand(pod)
    except InvalidPod as error:
        demand, unreadable = None, str(error)
    recorded = protocol.recorded(pod, demand)
    finished = as_object(pod.get("status")).get("phase") in TERMINAL_PHASES
    label = protocol.model_label
    return PodRecord(
        uid,
        namespace,
        name,
        node,
        demand,
        recorded.allocation,
        recorded.since,
        unreadable,
        finished,
        pod_priority(pod),
        pod_request(pod, "cpu", scale=3),
        pod_request(pod, "memory"),
        required_values(pod, label) if label else (),
    )


# --- nodes ------------------------------------------------------------------------------------------------


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
    _room: Room | None = None
    _measured: tuple[int, float] = (-1, 0.0)
    """(build of the typical shapes, the node's measure then): `measure` until the next change."""

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
        count = len(self.devices)
        used, cores, slots = [0] * count, [0] * count, [0] * count
        stray = 0
        positions = {device.index: position for position, device in enumerate(self.devices)}
        for hold in self.holds.values():
            for use in hold.allocation.uses:
                position = positions.get(use.index, -1) if use.index >= 0 else -1
                if position < 0:
                    stray += use.memory
                else:
                    used[position] += use.memory
                    cores[position] += use.cores
                    slots[position] += use.slots
        self.used, self.used_cores, self.used_slots = used, cores, slots
        self.stray = stray
        self.free = [
            max(0, device.capacity - amount) if self.takes_new_pods(position) else 0
            for position, (device, amount) in enumerate(zip(self.devices, used, strict=True))
        ]
        self.free_desc = tuple(sorted(self.free, reverse=True))
        self.capacity_desc = tuple(sorted((device.capacity for device in self.devices if device.usable), reverse=True))
        self.capacity_total = sum(device.capacity for device in self.devices)
        self.used_total = sum(used)
        if self.free:
            best = max(range(len(self.free)), key=self.free.__getitem__)  # the first of equals: lowest index
            self.largest_free, self.largest_free_index = self.free[best], self.devices[best].index
        else:
            self.largest_free, self.largest_free_index = 0, -1
        self.fit_free = self.largest_free if self.known and self.ready and self.lock is None else -1
        self.free_gpus = sum(
            free / device.capacity for free, device in zip(self.free, self.devices, strict=True) if device.capacity
        )
        self._room = None
        self._measured = (-1, 0.0)

    def measure(self, classes: Classes, memo: FragmentMemo) -> float:
        """What the fragmentation policy minimises, for this node as it is (kept until the next change)."""
        version, value = self._measured
        if version != classes.version:
            room = self.room()
            value = memo.measure(room.cpu, room.memory, room.gpus, classes)
            self._measured = (classes.version, value)
        return value

    def room(self) -> Room:
        """The node as the fragmentation measure sees it (`fragmentation.Room`), kept until the next change."""
        room = self._room
        if room is None:
            room = self._room = Room(
                self.cpu_allocatable - self.cpu_requested if self.cpu_allocatable else UNLIMITED,
                self.memory_allocatable - self.memory_requested if self.memory_allocatable else UNLIMITED,
                tuple(self.gpu_room(position) for position in range(len(self.devices))),
            )
        return room

    def gpu_room(self, position: int, memory: int = 0, cores: int = 0) -> GpuRoom:
        """One GPU as the measure sees it, after `memory` and `cores` more are taken on it."""
        device = self.devices[position]
        free = self.free[position] - memory
        left = device.cores - self.used_cores[position] - cores if device.cores else -1
        if left == 0 or (device.slots and self.used_slots[position] + (1 if memory or cores else 0) >= device.slots):
            free = 0
        return (max(free, 0), device.capacity, left, device.model)


def _marked(devices: tuple[Device, ...], unhealthy: frozenset[int] | None) -> tuple[Device, ...]:
    """The devices with those listed unhealthy marked so (their memory kept: pods on them still count)."""
    if not unhealthy:
        return devices
    return tuple(replace(device, healthy=False) if device.index in unhealthy else device for device in devices)


def _resolved(allocation: Allocation, state: NodeState) -> Allocation:
    """The allocation with GPUs named by UUID given their index on the node (where the node has them)."""
    return allocation.resolve({device.uuid: device.index for device in state.devices if device.uuid})


class Cache:
    """Nodes, pods and holds. Mutable; single-threaded (one asyncio loop), so no operation is interleaved."""

    def __init__(
        self,
        protocol: DeviceProtocol,
        lock_timeout: float = 300.0,
        clock: Callable[[], float] = time.time,
        workload: Workload | None = None,
    ) -> None:
        self.protocol = protocol
        self.lock_timeout = lock_timeout
        """Seconds after which a device plugin's node lock counts as abandoned (HAMi's --node-lock-timeout)."""
        self.clock = clock
        self.nodes: dict[str, NodeState] = {}
        self.pods: dict[str, PodRecord] = {}
        self._hold_node: dict[str, str] = {}
        self.reserved: dict[str, Hold] = {}
        """Holds not yet observed, by pod UID: what the ledger expires."""
        self.abandoned: set[str] = set()
        """Pods whose reservation ended without a binding (expired, or its bind failed): their annotations
        alone never reserve again; only a binding (or a new reservation) counts them."""
        self.fit_index = FitIndex()
        self.memo = NodeMemo()
        self._batch: dict[str, NodeState] | None = None
        self._locks: dict[str, NodeLock] = {}
        """Every node lock the API shows, fresh or not, by node."""
        self._offered: dict[str, tuple[Device, ...]] = {}
        """The GPUs each node offers, before the operators' unhealthy lists are applied."""
        self._unhealthy: dict[str, frozenset[int]] = {}
        """GPU indexes operators marked unhealthy, by node (gpushare's `kube-system/unhealthy-gpu-<node>`)."""
        self.workload = workload if workload is not None else Workload()
        """The shapes of the pods seen, learned as each first appears (`workload.py`)."""
        self._lowest: dict[str, int | None] = {}
        """`lowest_priority` by node, until the node changes."""
        self._asked: Lru[str, bool] = Lru(ASKED_LIMIT)
        """Pods learned from a filter request before the watch showed them (`asked`), so they count once."""
        self.fragments = FragmentMemo()
        """Fragmentation by node state, for the typical shapes of the last build (`fragmentation.py`)."""
        self.fragment_tables = NodeMemo()
        """What placing each pod ask adds to each node's fragmentation (`policy.fragmentation_values`)."""
        self._placed: dict[str, tuple[str, int, int]] = {}
        """Pod UID -> (node, millicores, bytes) it requests there: bound, or reserved by us."""
        self._requested: dict[str, list[int]] = {}
        """Node -> [millicores, bytes] its pods request (`_placed` summed)."""
        self.quotas = Quotas(protocol.quota_resources, protocol.unit, lambda: self.nodes.values())
        """ResourceQuotas' GPU limits, and what each namespace holds under them, following the holds (`quota.py`)."""

    def _changed(self, state: NodeState) -> None:
        """Recompute a node's summary after any change, and the indexes built on it (once per node at the end
        of a batch, when one is open)."""
        if self._batch is not None:
            self._batch[state.name] = state
            return
        state.cpu_requested, state.memory_requested = self._requested.get(state.name) or (0, 0)
        state.refresh()
        self.fit_index.update(state)
        self.memo.forget(state.name)
        self.fragment_tables.forget(state.name)
        self._lowest.pop(state.name, None)
        self.quotas.node_changed(state)

    @contextmanager
    def _batched(self) -> Iterator[None]:
        """Make many changes, then refresh each node they touched once: a pod that moves its hold, or a list of
        100,000 pods, costs one summary per node instead of one per change. Nothing reads a summary meanwhile
        (no await happens inside)."""
        if self._batch is not None:
            yield
            return
        self._batch = {}
        try:
            yield
        finally:
            touched, self._batch = self._batch, None
            for state in touched.values():
                self._changed(state)

    # -- holds

    def hold_of(self, uid: str) -> Hold | None:
        node = self._hold_node.get(uid)
        return self.nodes[node].holds.get(uid) if node is not None else None

    def hold(self, hold: Hold) -> None:
        """Record a hold, replacing any other hold of the same pod (on any node)."""
        uid = hold.allocation.pod_uid
        with self._batched():
            self.release(uid)
            state = self._state(hold.allocation.node)
            if not hold.allocation.resolved:
                hold = replace(hold, allocation=_resolved(hold.allocation, state))
            state.holds[uid] = hold
            self._hold_node[uid] = state.name
            if not hold.observed:
                self.reserved[uid] = hold
            self._changed(state)
            self._account(uid)

    def restate(self, hold: Hold) -> None:
        """Swap in the same allocation in another state (the ledger's transitions): the memory counted does
        not change, so neither does any summary."""
        uid = hold.allocation.pod_uid
        current = self.hold_of(uid)
        if current is None or current.allocation != hold.allocation:
            raise ValueError(f"restate of pod {uid}: it holds {current}, not {hold.allocation}")
        self.nodes[hold.allocation.node].holds[uid] = hold
        if hold.observed:
            self.reserved.pop(uid, None)
        else:
            self.reserved[uid] = hold

    def release(self, uid: str, abandon: bool = False) -> Hold | None:
        """Free a pod's memory; returns what it held. With `abandon`, annotations already written on the pod no
        longer reserve anything by themselves when the API shows them (only a binding does)."""
        if abandon:
            self.abandoned.add(uid)
        node = self._hold_node.pop(uid, None)
        if node is None:
            return None
        self.reserved.pop(uid, None)
        state = self.nodes[node]
        with self._batched():
            hold = state.holds.pop(uid)
            self._changed(state)
            self._account(uid)
        self._forget_if_empty(state)
        return hold

    # -- nodes

    def _state(self, name: str) -> NodeState:
        state = self.nodes.get(name)
        if state is None:
            state = self.nodes[name] = NodeState(name, known=False)
            self._changed(state)
        return state

    def _forget_if_empty(self, state: NodeState) -> None:
        if not state.known and not state.holds:
            del self.nodes[state.name]
            self.fit_index.forget(state.name)
            self.memo.forget(state.name)
            self.fragment_tables.forget(state.name)

    def apply_node(self, node: Raw, deleted: bool = False) -> None:
        name = objects.name(node)
        if not name:
            return
        if deleted:
            self._locks.pop(name, None)
            self._offered.pop(name, None)
            state = self.nodes.get(name)
            if state is not None:
                state.known, state.devices, state.ready = False, (), True
                self._changed(state)
                self._forget_if_empty(state)
            return
        state = self._state(name)
        found = self.protocol.node_devices(node)
        state.known = True
        self._offered[name] = found.devices
        state.devices, state.unreadable = _marked(found.devices, self._unhealthy.get(name)), found.unreadable
        state.ready = node_ready(node)
        state.cpu_allocatable = node_allocatable(node, "cpu", scale=3)
        state.memory_allocatable = node_allocatable(node, "memory")
        self._set_lock(state, found.lock)
        for uid, hold in list(state.holds.items()):  # GPUs named by UUID before the node told their indexes
            if not hold.allocation.resolved:
                state.holds[uid] = replace(hold, allocation=_resolved(hold.allocation, state))
                if uid in self.reserved:
                    self.reserved[uid] = state.holds[uid]
        self._changed(state)

    # -- unhealthy GPUs listed by operators (gpushare)

    def apply_unhealthy(self, node: str, indexes: frozenset[int] | None) -> None:
        """The GPUs of `node` listed unhealthy (None: the list is gone). They keep their memory and their pods, and
        take no new pod."""
        if indexes:
            self._unhealthy[node] = indexes
        else:
            self._unhealthy.pop(node, None)
        state = self.nodes.get(node)
        if state is not None and state.known:
            state.devices = _marked(self._offered.get(node, ()), indexes)
            self._changed(state)

    def replace_unhealthy(self, listed: dict[str, frozenset[int]]) -> None:
        """Swap in a full listing of the unhealthy lists: nodes absent from it have none."""
        with self._batched():
            for node in set(self._unhealthy) - set(listed):
                self.apply_unhealthy(node, None)
            for node, indexes in listed.items():
                self.apply_unhealthy(node, indexes)

    # -- node locks (HAMi's device plugin)

    def _set_lock(self, state: NodeState, lock: NodeLock | None) -> None:
        if lock is None:
            self._locks.pop(state.name, None)
        else:
            self._locks[state.name] = lock
        state.lock = lock if lock is not None and self.clock() - lock.since <= self.lock_timeout else None

    def take_lock(self, node: str, lock: NodeLock | None) -> None:
        """This replica took (or released: None) the device plugin's lock on the node: count it before the
        watch shows it."""
        state = self.nodes.get(node)
        if state is not None:
            self._set_lock(state, lock)
            self._changed(state)

    def expire_locks(self) -> list[str]:
        """Let nodes whose lock is older than `lock_timeout` take pods again (their plugin never released it:
        the next bind takes it over); returns their names."""
        now = self.clock()
        expired = []
        for name, lock in list(self._locks.items()):
            state = self.nodes.get(name)
            if state is not None and state.lock is not None and now - lock.since > self.lock_timeout:
                state.lock = None
                self._changed(state)
                expired.append(name)
        return expired

    def node_view(self, node: Raw) -> NodeState:
        """The state of a node the scheduler sent as a whole object: the cache's if known, else built from it."""
        name = objects.name(node)
        state = self.nodes.get(name)
        if state is not None and state.known:
            return state
        found = self.protocol.node_devices(node)
        view = NodeState(name, found.devices, True, node_ready(node), found.unreadable, found.lock)
        if state is not None:
            view.holds = dict(state.holds)
        view.cpu_allocatable = node_allocatable(node, "cpu", scale=3)
        view.memory_allocatable = node_allocatable(node, "memory")
        view.cpu_requested, view.memory_requested = self._requested.get(name) or (0, 0)
        view.refresh()
        return view

    # -- pods

    def lowest_priority(self, name: str) -> int | None:
        """The lowest priority of the pods the API shows holding GPUs on the node (what a preemption could evict
        there), None when there are none; kept until the node changes."""
        if name in self._lowest:
            return self._lowest[name]
        state = self.nodes.get(name)
        priorities = [
            record.priority
            for uid, hold in (state.holds.items() if state is not None else ())
            if hold.observed and (record := self.pods.get(uid)) is not None
        ]
        lowest = self._lowest[name] = min(priorities, default=None)
        return lowest

    def classes(self) -> Classes:
        """The typical shapes of the learned workload now (`workload.Workload.classes`)."""
        return self.workload.classes(self.clock())

    def asked(self, uid: str, shape: Shape | None) -> None:
        """A filter request for a pod: learn its shape now if the watch has not shown it yet (a pod is first seen
        by whichever comes first, so its own placement already counts it, as the pods before it)."""
        if uid and uid not in self.pods and self._asked.touch(uid) is None:
            self._asked.put(uid, True)
            self.workload.observe(shape, self.clock())

    def apply_pod(self, pod: Raw, deleted: bool = False) -> None:
        self.apply_record(pod_record(pod, self.protocol), deleted)

    def apply_record(self, record: PodRecord, deleted: bool = False) -> None:
        """A pod was added, changed or deleted (a watch event, a bind in the file source)."""
        with self._batched():
            self._apply_record(record, deleted)

    def _apply_record(self, record: PodRecord, deleted: bool) -> None:
        uid = record.uid
        if not uid:
            return
        if deleted or record.finished:
            self._forget_pod(uid)
            return
        if uid not in self.pods and self._asked.pop(uid, None) is None:
            self.workload.observe(record.shape, self.clock())
        self.pods[uid] = record
        self._settle_record(uid, record)
        self._account(uid)

    def _settle_record(self, uid: str, record: PodRecord) -> None:
        """The pod's hold as its record now says (observed, reserved again, or released)."""
        allocation = record.allocation
        current = self.hold_of(uid)
        if allocation is not None and not allocation.resolved and allocation.node in self.nodes:
            allocation = _resolved(allocation, self.nodes[allocation.node])
        if allocation is not None and record.node_name:
            self.abandoned.discard(uid)
            if current is None or not current.observed or current.allocation != allocation:
                self.hold(Hold(allocation, HoldState.OBSERVED, since=record.assume_time))
        elif allocation is not None:
            if current is None and uid not in self.abandoned:
                # Annotated but never bound (a crash between patch and binding, in tools that write the two
                # apart): a reservation again, counted from its assume time, so the ledger's TTL frees it if
                # the binding never comes.
                self.hold(Hold(allocation, HoldState.RESERVED, since=record.assume_time))
        elif current is not None and current.observed:
            self.release(uid)

    def forget_pod(self, uid: str) -> None:
        """The pod is gone from the API (read there directly, ahead of the watch): free what it held.

        A watch event for it that was already on its way may count it again for a moment; its DELETED event
        follows in the same stream.
        """
        with self._batched():
            self._forget_pod(uid)

    def _forget_pod(self, uid: str) -> None:
        self.pods.pop(uid, None)
        self.abandoned.discard(uid)
        self.release(uid)
        self._account(uid)

    def _account(self, uid: str) -> None:
        """Count the pod's cpu and memory where it now runs or is reserved (kube-scheduler counts a pod on its node
        from the moment it assumes it; we from our reservation or the watch's binding), and nowhere else."""
        record = self.pods.get(uid)
        placed = None
        if record is not None:
            node = record.node_name or self._hold_node.get(uid, "")
            if node and (record.cpu or record.memory):
                placed = (node, record.cpu, record.memory)
        previous = self._placed.get(uid)
        if placed == previous:
            return
        if previous is not None:
            del self._placed[uid]
            self._add_requests(previous, -1)
        if placed is not None:
            self._placed[uid] = placed
            self._add_requests(placed, 1)

    def _add_requests(self, placed: tuple[str, int, int], sign: int) -> None:
        node, cpu, memory = placed
        totals = self._requested.setdefault(node, [0, 0])
        totals[0] += sign * cpu
        totals[1] += sign * memory
        if totals == [0, 0]:
            del self._requested[node]
        state = self.nodes.get(node)
        if state is not None:
            self._changed(state)

    def replace(self, nodes: list[Raw], pods: list[Raw]) -> None:
        """Swap in a full listing of nodes and pods (see `replace_nodes`, `replace_pods`)."""
        self.replace_nodes(nodes)
        self.replace_pods(pods)

    def replace_nodes(self, nodes: list[Raw]) -> None:
        """Swap in a full listing of nodes: a known node absent from it was deleted meanwhile."""
        listed = {objects.name(node) for node in nodes}
        for name, state in list(self.nodes.items()):
            if state.known and name not in listed:
                self.apply_node({"metadata": {"name": name}}, deleted=True)
        for node in nodes:
            self.apply_node(node)

    def replace_pods(self, pods: list[Raw]) -> None:
        self.replace_records([pod_record(pod, self.protocol) for pod in pods])

    def replace_records(self, records: list[PodRecord]) -> None:
        """Swap in a full listing of pods: a pod absent from it was deleted (or finished) meanwhile, and
        frees what it held, even a reservation.

        Reservations of pods the cache has never seen are kept (the pod may be newer than the listing, its
        bind racing the list); the ledger's TTL bounds them.
        """
        listed = {record.uid for record in records}
        with self._batched():
            for uid in list(self.pods):
                if uid not in listed:
                    self._forget_pod(uid)
            for record in records:
                self._apply_record(record, False)

    # -- checks

    def overcommitted(self) -> list[str]:
        """Every device whose holds exceed its memory, compute or slots, as messages; empty when the invariant
        holds (DESIGN §3: `used <= capacity` in every dimension the device plugin enforces)."""
        found = []
        for state in self.nodes.values():
            for position, device in enumerate(state.devices):
                used, cores, slots = state.used[position], state.used_cores[position], state.used_slots[position]
                if used > device.capacity:
                    found.append(f"{state.name} GPU {device.index}: used {used} > capacity {device.capacity}")
                if device.cores and cores > device.cores:
                    found.append(f"{state.name} GPU {device.index}: compute {cores} > {device.cores}")
                if device.slots and slots > device.slots:
                    found.append(f"{state.name} GPU {device.index}: {slots} pods > split count {device.slots}")
        return found
