"""The node cache: nodes, their devices, and every allocation of device memory, observed or reserved.

One mutable structure, fed by `apply_*`/`replace` (from a file or a watch) and by the ledger (reservations).
Every allocation is a `Hold` keyed by pod UID, in exactly one node's table: a pod that the API shows bound
with our annotations is *observed*; one we decided but the API has not shown back yet is *reserved*. An
observed pod replaces a reservation of the same UID, so nothing is counted twice.

Each node's summary (`nodes.NodeState`) is kept up to date on every change, and so are the indexes the filter
reads (`memo.FitIndex`, `memo.NodeMemo`). What else follows the cache, the quota book (`quota/`) and what the
placement policy learns and remembers (`placement/`), listens to it (`Listener`): the cache tells each change
and knows nothing of what they do with it. This module does no I/O and never decides placement; reservations'
rules are `ledger.py`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Protocol

from extender.core import objects
from extender.core.devices import Device, NodeLock
from extender.core.groups import NO_CRDS, Jobs, PodGroups
from extender.core.holds import Allocation, Hold, HoldState
from extender.core.memo import FitIndex, Lru, NodeMemo
from extender.core.nodes import NodeState, overcommitted
from extender.core.objects import Raw
from extender.core.pods import PodRecord, pod_record
from extender.core.protocols import DeviceProtocol
from extender.core.resources import node_allocatable, node_ready

VERSIONS_KEPT = 8
"""resourceVersions remembered per node (`Cache.take_lock`): more than the API's news brings for one node in the
time a write's reply takes to be read (its own write, the plugin's release, a handshake, another writer's)."""
GONE_KEPT = 4096  # UIDs kept in `Cache._gone`: far more pods than are deleted while one reply is on its way


class Listener(Protocol):
    """What follows the cache's changes: told after each, in the order they were made (once per node at the end
    of a batch of changes)."""

    def node_changed(self, state: NodeState) -> None:
        """The node's GPUs, holds, readiness, lock or requested cpu and memory changed; its summary is current."""

    def node_forgotten(self, name: str) -> None:
        """The node is gone from the cache (deleted, and no pod holds anything there any more)."""

    def pod_arrived(self, record: PodRecord) -> None:
        """A pod the cache had not seen (or had forgotten) is in it now, as `record`."""


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
        self._orphans: dict[str, NodeLock] = {}
        """Node -> its lock, where the API has shown the lock's pod deleted: the node takes pods again (the next
        bind takes the lock over, as HAMi's rule lets it: `sources/kube/nodelock.py`), not after 5 minutes."""
        self._versions: dict[str, tuple[str, ...]] = {}
        """Node -> the resourceVersions of its last `VERSIONS_KEPT` states the API's news applied, newest first:
        how `take_lock` tells a write it made from one the news has already shown, or gone past."""
        self._gone: Lru[str, bool] = Lru(GONE_KEPT)
        """UIDs of the last `GONE_KEPT` pods shown gone: a read that crossed the deletion (a bind's read-back,
        `sources/kube/binder.py`) must not bring one back, with a hold nothing would remove."""
        self._offered: dict[str, tuple[Device, ...]] = {}
        """The GPUs each node offers, before the operators' unhealthy lists are applied."""
        self._unhealthy: dict[str, frozenset[int]] = {}
        """GPU indexes operators marked unhealthy, by node (gpushare's `kube-system/unhealthy-gpu-<node>`)."""
        self._lowest: dict[str, int | None] = {}
        """`lowest_priority` by node, until the node changes."""
        self._placed: dict[str, tuple[str, int, int]] = {}
        """Pod UID -> (node, millicores, bytes) it requests there: bound, or reserved by us."""
        self._requested: dict[str, list[int]] = {}
        """Node -> [millicores, bytes] its pods request (`_placed` summed)."""
        self.listeners: list[Listener] = []
        """Told of every change (`listen`)."""
        self.groups = Jobs()
        """Every job's pods, by UID: what `core/jobs.py` plans."""
        self.podgroups: PodGroups = NO_CRDS
        """The cluster's PodGroups (None per CRD not installed), kept by the sources: the minimum of a job that names
        one, read when its members are filtered and bound (`groups.resolve`)."""

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
        self._lowest.pop(state.name, None)
        for listener in self.listeners:
            listener.node_changed(state)

    def listen(self, listener: Listener) -> None:
        """Tell `listener` of every change from now on."""
        self.listeners.append(listener)

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
                if self.nodes.get(state.name) is state:  # not one forgotten meanwhile (its listeners were told so)
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
            for listener in self.listeners:
                listener.node_forgotten(state.name)

    def apply_node(self, node: Raw, deleted: bool = False) -> None:
        name = objects.name(node)
        if not name:
            return
        if deleted:
            self._locks.pop(name, None)
            self._orphans.pop(name, None)
            self._versions.pop(name, None)
            self._offered.pop(name, None)
            state = self.nodes.get(name)
            if state is not None:
                state.known, state.devices, state.ready = False, (), True
                self._changed(state)
                self._forget_if_empty(state)
            return
        state = self._state(name)
        version = objects.resource_version(node)
        if version:
            self._versions[name] = (version, *self._versions.get(name, ())[: VERSIONS_KEPT - 1])
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
        if self._orphans and self._orphans.get(state.name) != lock:
            self._orphans.pop(state.name, None)
        holds = lock is not None and self.clock() - lock.since <= self.lock_timeout and state.name not in self._orphans
        state.lock = lock if holds else None

    def _orphan_locks(self, holder: str) -> None:
        """The pod `holder` (namespace/name) was deleted: a lock held for it holds its node no more. Its device
        plugin never allocates a pod deleted before kubelet admitted it, so never releases that lock; HAMi's
        bind takes such a lock over at once, and the filter, which refuses locked nodes, now agrees."""
        for name, lock in self._locks.items():
            if lock.pod == holder:
                self._orphans[name] = lock
                state = self.nodes.get(name)
                if state is not None and state.lock is not None:
                    state.lock = None
                    self._changed(state)

    def take_lock(self, node: str, lock: NodeLock | None, version: str = "") -> None:
        """This replica took (or released: None) the device plugin's lock on the node, or read it so: count it before
        the watch shows it. `version` is the node's resourceVersion that the write made (or the read showed): when the
        API's news has already applied it, the cache holds that state or a later one, and this call changes nothing.
        Else a lock taken, then removed by another writer, could arrive here after the watch showed both: the node would
        count as locked, nothing correcting it, for the lock's 5 minutes. Versions are compared for equality only (the
        API's rule: they are opaque), so a relist that went past the write without showing its version lets the write's
        state stand until the node's next news (or a release's read of it: `NodeLocker.release`)."""
        state = self.nodes.get(node)
        if version and version in self._versions.get(node, ()):
            return
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
            self._forget_pod(uid, gone=deleted)
            if deleted and not record.finished and self._locks:  # a DELETED that is not a pod finishing
                self._orphan_locks(record.key)  # (the watch's selector drops finished pods: a DELETED too)
            return
        if uid in self._gone:  # a UID is never reused: a pod shown gone stays gone
            return
        previous = self.pods.get(uid)
        self.pods[uid] = record
        arrived = previous is None
        self.groups.move(uid, previous.group if previous is not None else None, record.group, record.written)
        if arrived:
            for listener in self.listeners:
                listener.pod_arrived(record)
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
            if current is not None and not current.observed and current.allocation == allocation:
                # Our own decision, now shown bound: the same GPUs, so only its state changes (no summary to redo).
                self.restate(Hold(current.allocation, HoldState.OBSERVED, since=record.assume_time))
            elif current is None or not current.observed or current.allocation != allocation:
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
        """The pod is gone from the API (read there directly, ahead of the watch): free what it held, for good
        (a watch event for it already on its way changes nothing)."""
        with self._batched():
            self._forget_pod(uid, gone=True)

    def _forget_pod(self, uid: str, gone: bool = False) -> None:
        if gone:
            self._gone.put(uid, True)
        record = self.pods.pop(uid, None)
        if record is not None:
            self.groups.move(uid, record.group, None)
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

        Reservations of pods the cache has never seen are kept, and an absent pod is not taken as gone for good
        (`_gone`): it may be newer than the listing, its bind racing the list; the ledger's TTL bounds them.
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
        """Every device whose holds exceed its memory, compute or slots, as messages (`nodes.overcommitted`)."""
        return overcommitted(self.nodes.values())
