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

from collections import OrderedDict
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

from extender.core import objects
from extender.core.objects import Raw, as_object, pod_priority
from extender.core.resources import Demand, Device, InvalidPod, Profile, ceil_div, node_devices, node_ready, pod_demand

TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


@dataclass(frozen=True, slots=True)
class Allocation:
    """Device memory given to one pod on one node: `per_device` on each of `indexes`."""

    pod_uid: str
    pod: str
    """`namespace/name`, for people."""
    node: str
    indexes: tuple[int, ...]
    per_device: int

    @property
    def memory(self) -> int:
        return self.per_device * len(self.indexes)


@dataclass(frozen=True, slots=True)
class Hold:
    """An allocation as the cache counts it."""

    allocation: Allocation
    observed: bool
    """True once the API shows the pod bound with our annotations; False while only reserved."""
    since: float
    """Unix seconds: the assume time (when the decision was made)."""
    bound: bool = False
    """A reservation whose binding the API accepted; waiting for the watch to show it."""
    uncertain_since: float | None = None
    """When the binding of this reservation failed in a way that may have landed all the same (a timeout), by
    the ledger's clock; None otherwise. Kept until the watch shows the pod or the TTL frees it."""

    @property
    def uncertain(self) -> bool:
        return self.uncertain_since is not None


@dataclass(frozen=True, slots=True)
class PodRecord:
    """The fields of a pod the extender uses; the cache keeps only these."""

    uid: str
    namespace: str
    name: str
    node_name: str
    demand: Demand | None
    """None when the pod's GPU request is unreadable (`problem` says why)."""
    allocation: Allocation | None
    """What its annotations say it was given, if anything."""
    assume_time: float
    problem: str = ""
    finished: bool = False
    """Succeeded or Failed: it holds nothing any more."""
    priority: int = 0
    """`spec.priority` (set by admission from its PriorityClass): who may be preempted for whom."""

    @property
    def key(self) -> str:
        return objects.key(self.namespace, self.name)


# --- the annotation protocol ------------------------------------------------------------------------------


def allocation_annotations(
    allocation: Allocation, device_capacity: int, now: float, profile: Profile
) -> dict[str, str]:
    """The pod annotations that record an allocation durably (DESIGN §4)."""
    annotations = {
        profile.pod_memory_annotation: str(allocation.memory),
        profile.device_memory_annotation: str(device_capacity),
        profile.assigned_annotation: "false",
        profile.assume_time_annotation: str(int(now * 1e9)),
        profile.indexes_annotation: ",".join(str(index) for index in allocation.indexes),
        profile.node_annotation: allocation.node,
    }
    if len(allocation.indexes) == 1:
        annotations[profile.index_annotation] = str(allocation.indexes[0])
    return annotations


def _read_allocation(
    uid: str, key: str, node: str, annotations: dict[str, Any], demand: Demand | None, profile: Profile
) -> Allocation | None:
    listed = annotations.get(profile.indexes_annotation) or annotations.get(profile.index_annotation)
    if not listed or not node:
        return None
    try:
        indexes = tuple(int(part) for part in str(listed).split(","))
        memory = (
            int(annotations[profile.pod_memory_annotation]) if profile.pod_memory_annotation in annotations else None
        )
    except ValueError:
        return None
    if memory is None:
        memory = demand.memory if demand else 0
    if any(index < 0 for index in indexes) or memory < 0:
        return None
    return Allocation(uid, key, node, indexes, ceil_div(memory, len(indexes)))


def _assume_time(annotations: dict[str, Any], profile: Profile) -> float:
    try:
        return int(annotations.get(profile.assume_time_annotation, 0)) / 1e9
    except (TypeError, ValueError):
        return 0.0


def pod_record(pod: Raw, profile: Profile) -> PodRecord:
    """Reduce a pod object to a PodRecord; an unreadable GPU request becomes `problem`, never an exception."""
    uid, namespace, name = objects.uid(pod), objects.namespace(pod), objects.name(pod)
    node = str(as_object(pod.get("spec")).get("nodeName") or "")
    annotations = objects.annotations_of(pod)
    problem = ""
    demand: Demand | None
    try:
        demand = pod_demand(pod, profile)
    except InvalidPod as error:
        demand, problem = None, str(error)
    key = objects.key(namespace, name)
    on_node = node or str(annotations.get(profile.node_annotation) or "")
    allocation = _read_allocation(uid, key, on_node, annotations, demand, profile)
    finished = (pod.get("status") or {}).get("phase") in TERMINAL_PHASES
    assume_time = _assume_time(annotations, profile)
    priority = pod_priority(pod)
    return PodRecord(uid, namespace, name, node, demand, allocation, assume_time, problem, finished, priority)


# --- nodes ------------------------------------------------------------------------------------------------


@dataclass(slots=True, eq=False)
class NodeState:
    """One node as the cache sees it. Mutable: its holds change, and its summary follows on every change."""

    name: str
    devices: tuple[Device, ...] = ()
    known: bool = True
    """False for a node we only know from pods bound to it (not listed, or deleted while they still run)."""
    ready: bool = True
    problem: str = ""
    holds: dict[str, Hold] = field(default_factory=dict)
    # the summary, derived from devices and holds by refresh():
    used: list[int] = field(default_factory=list)
    free: list[int] = field(default_factory=list)
    free_desc: tuple[int, ...] = ()
    capacity_desc: tuple[int, ...] = ()
    largest_free: int = 0
    largest_free_index: int = -1
    capacity_total: int = 0
    used_total: int = 0
    stray: int = 0
    """Memory held on device indexes this node does not have (a device vanished under running pods)."""
    fit_free: int = -1
    """The largest one-GPU demand this node takes now: `largest_free`, or -1 when unknown or not Ready."""

    def position(self, index: int) -> int:
        """Where device `index` sits in `devices`, or -1."""
        for position, device in enumerate(self.devices):
            if device.index == index:
                return position
        return -1

    def refresh(self) -> None:
        used = [0] * len(self.devices)
        stray = 0
        positions = {device.index: position for position, device in enumerate(self.devices)}
        for hold in self.holds.values():
            allocation = hold.allocation
            for index in allocation.indexes:
                position = positions.get(index)
                if position is None:
                    stray += allocation.per_device
                else:
                    used[position] += allocation.per_device
        self.used = used
        self.stray = stray
        self.free = [max(0, device.capacity - amount) for device, amount in zip(self.devices, used, strict=True)]
        self.free_desc = tuple(sorted(self.free, reverse=True))
        self.capacity_desc = tuple(sorted((device.capacity for device in self.devices), reverse=True))
        self.capacity_total = sum(device.capacity for device in self.devices)
        self.used_total = sum(used)
        if self.free:
            best = max(range(len(self.free)), key=self.free.__getitem__)  # the first of equals: lowest index
            self.largest_free, self.largest_free_index = self.free[best], self.devices[best].index
        else:
            self.largest_free, self.largest_free_index = 0, -1
        self.fit_free = self.largest_free if self.known and self.ready else -1


class FitIndex:
    """For the one-GPU demands asked recently, the set of nodes that can take each now.

    A filter then costs one set membership per node name (C speed: `fitting.issuperset(names)` when all fit)
    instead of a Python loop. Kept current by the cache on every node change; bounded to the `limit` demand
    sizes used most recently (a cluster's pods come in a handful of sizes).
    """

    def __init__(self, limit: int = 32) -> None:
        self.limit = limit
        self._sets: OrderedDict[int, set[str]] = OrderedDict()

    def fitting(self, need: int, nodes: Mapping[str, NodeState]) -> set[str]:
        """The names of the nodes whose largest free GPU holds `need` (known and Ready ones only)."""
        names = self._sets.get(need)
        if names is None:
            names = self._sets[need] = {name for name, state in nodes.items() if state.fit_free >= need}
            if len(self._sets) > self.limit:
                self._sets.popitem(last=False)
        elif need != next(reversed(self._sets)):
            self._sets.move_to_end(need)
        return names

    def update(self, state: NodeState) -> None:
        for need, names in self._sets.items():
            if state.fit_free >= need:
                names.add(state.name)
            else:
                names.discard(state.name)

    def forget(self, name: str) -> None:
        for names in self._sets.values():
            names.discard(name)


class NodeMemo:
    """Answers derived from node states (a verdict, a score), one table per question, by node name.

    A question is a string naming the demand and whatever else the answer depends on (the policy's
    `judge_key`, the server's reply keys). A node's answers are dropped from every table when the node
    changes, so a table never holds a stale answer. One dict per question, not one per node: at 5,000
    nodes, per-node dicts cost a cache miss each. Bounded to the `limit` questions asked most recently.
    """

    def __init__(self, limit: int = 64) -> None:
        self.limit = limit
        self._tables: OrderedDict[str, dict[str, Any]] = OrderedDict()

    def table(self, question: str) -> dict[str, Any]:
        table = self._tables.get(question)
        if table is None:
            table = self._tables[question] = {}
            if len(self._tables) > self.limit:
                self._tables.popitem(last=False)
        else:
            self._tables.move_to_end(question)
        return table

    def forget(self, name: str) -> None:
        for table in self._tables.values():
            table.pop(name, None)


class Cache:
    """Nodes, pods and holds. Mutable; single-threaded (one asyncio loop), so no operation is interleaved."""

    def __init__(self, profile: Profile) -> None:
        self.profile = profile
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

    def _changed(self, state: NodeState) -> None:
        """Recompute a node's summary after any change, and the indexes built on it (once per node at the end
        of a batch, when one is open)."""
        if self._batch is not None:
            self._batch[state.name] = state
            return
        state.refresh()
        self.fit_index.update(state)
        self.memo.forget(state.name)

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
            state.holds[uid] = hold
            self._hold_node[uid] = state.name
            if not hold.observed:
                self.reserved[uid] = hold
            self._changed(state)

    def mark_bound(self, uid: str) -> None:
        self._mark(uid, bound=True, uncertain_since=None)

    def mark_uncertain(self, uid: str, since: float) -> None:
        self._mark(uid, bound=False, uncertain_since=since)

    def _mark(self, uid: str, bound: bool, uncertain_since: float | None) -> None:
        hold = self.reserved.get(uid)
        if hold is not None and (hold.bound, hold.uncertain_since) != (bound, uncertain_since):
            marked = replace(hold, bound=bound, uncertain_since=uncertain_since)
            self.reserved[uid] = marked
            self.nodes[hold.allocation.node].holds[uid] = marked

    def release(self, uid: str) -> Hold | None:
        """Free a pod's memory; returns what it held."""
        node = self._hold_node.pop(uid, None)
        if node is None:
            return None
        self.reserved.pop(uid, None)
        state = self.nodes[node]
        hold = state.holds.pop(uid)
        self._changed(state)
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

    def apply_node(self, node: Raw, deleted: bool = False) -> None:
        name = objects.name(node)
        if not name:
            return
        if deleted:
            state = self.nodes.get(name)
            if state is not None:
                state.known, state.devices, state.ready = False, (), True
                self._changed(state)
                self._forget_if_empty(state)
            return
        state = self._state(name)
        found = node_devices(node, self.profile)
        state.known = True
        state.devices, state.problem = found.devices, found.problem
        state.ready = node_ready(node)
        self._changed(state)

    def describe(self, node: Raw) -> NodeState:
        """The state of a node the scheduler sent as a whole object: the cache's if known, else built from it."""
        name = objects.name(node)
        state = self.nodes.get(name)
        if state is not None and state.known:
            return state
        found = node_devices(node, self.profile)
        view = NodeState(name, found.devices, True, node_ready(node), found.problem)
        if state is not None:
            view.holds = dict(state.holds)
        view.refresh()
        return view

    # -- pods

    def apply_pod(self, pod: Raw, deleted: bool = False) -> None:
        self.apply_record(pod_record(pod, self.profile), deleted)

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
        self.pods[uid] = record
        allocation = record.allocation
        current = self.hold_of(uid)
        if allocation is not None and record.node_name:
            self.abandoned.discard(uid)
            if current is None or not current.observed or current.allocation != allocation:
                self.hold(Hold(allocation, observed=True, since=record.assume_time))
        elif allocation is not None:
            if current is None and uid not in self.abandoned:
                # Annotated but never bound (a crash between patch and binding, in tools that write the two
                # apart): a reservation again, counted from its assume time, so the ledger's TTL frees it if
                # the binding never comes.
                self.hold(Hold(allocation, observed=False, since=record.assume_time))
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
        self.replace_records([pod_record(pod, self.profile) for pod in pods])

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
            for uid in list(self._hold_node):
                hold = self.hold_of(uid)
                if hold is not None and hold.observed and uid not in listed:
                    self.release(uid)
            for record in records:
                self._apply_record(record, False)

    # -- checks

    def overcommitted(self) -> list[str]:
        """Every device whose holds exceed its capacity, as messages; empty when the invariant holds."""
        return [
            f"{state.name} GPU {device.index}: used {used} > capacity {device.capacity}"
            for state in self.nodes.values()
            for device, used in zip(state.devices, state.used, strict=True)
            if used > device.capacity
        ]
