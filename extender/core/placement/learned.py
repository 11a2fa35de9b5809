"""What the placement policy learns from the cache, and what it remembers of the nodes between requests.

`Learned` listens to the cache (`cache.Listener`): each pod that appears there for the first time is one observation of
its shape for the learned workload (`workload.py`), and so is a pod a filter asks about before the watch shows it
(`asked`), once. On every change of a node it forgets what it remembered of that node: the node as the measure sees it
(`room`), its measure (`measure`), what each pod ask would add to it (`values`) and which GPUs it would take
(`choices`), read by `fragmentation.py`. Built over a cache that already holds pods (a cluster file, a restart's first
list), it learns them first, as the cache had shown them one by one.

The cache tells; it never calls in here by name. Mutable; single-threaded like the cache.
"""

from __future__ import annotations

from extender.core.cache import Cache
from extender.core.memo import Lru, NodeMemo, SlotMemo
from extender.core.nodes import NodeState
from extender.core.placement.arrays import NodeArrays
from extender.core.placement.measure import FragmentMemo, Room, room_of
from extender.core.placement.workload import Classes, Shape, Workload, shape_of
from extender.core.pods import PodRecord

ASKED_LIMIT = 20_000
"""Pods remembered as learned from their filter request: kube-scheduler filters a pod moments before the watch
shows it, or moments after."""


class Learned:
    """The learned workload and the memos of the measure, following one cache. Mutable."""

    def __init__(self, cache: Cache, workload: Workload | None = None) -> None:
        self.cache = cache
        self.workload = workload if workload is not None else Workload()
        """The shapes of the pods seen, learned as each first appears."""
        self.fragments = FragmentMemo()
        """Fragmentation by node state, for the typical shapes of the last build (`measure.py`)."""
        self.values = SlotMemo()
        """What placing each pod ask adds to each node's fragmentation, by node slot (`fragmentation.py`)."""
        self.choices = NodeMemo()
        """The GPUs each pod ask would take on each node, beside `values` (what an assumption holds: `assume.py`)."""
        self._asked: Lru[str, bool] = Lru(ASKED_LIMIT)
        """Pods learned from a filter request before the cache had them (`asked`), so they count once."""
        self._rooms: dict[str, Room] = {}
        self._measured: dict[str, tuple[int, float]] = {}
        """Node -> (build of the typical shapes, its measure then), until the node changes; in its row of `arrays`
        instead for a node that has one."""
        self.arrays = NodeArrays()
        """The nodes whose GPUs can be judged in arrays, as arrays (`arrays.py`, for `batch.py`)."""
        for record in list(cache.pods.values()):
            self.pod_arrived(record)
        for state in cache.nodes.values():
            self.arrays.update(state)
        cache.listen(self)

    def classes(self) -> Classes:
        """The typical shapes of the learned workload now (`workload.Workload.classes`)."""
        return self.workload.classes(self.cache.clock())

    def asked(self, uid: str, shape: Shape | None) -> None:
        """A filter request for a pod: learn its shape now if the cache has not shown it yet (a pod is first seen
        by whichever comes first, so its own placement already counts it, as the pods before it)."""
        if uid and uid not in self.cache.pods and self._asked.touch(uid) is None:
            self._asked.put(uid, True)
            self.workload.observe(shape, self.cache.clock())

    def room(self, state: NodeState) -> Room:
        """The node as the measure sees it (`measure.room_of`), remembered until it changes (a node the scheduler
        sent whole, not the cache's, is computed afresh)."""
        name = state.name
        room = self._rooms.get(name)
        if room is None or self.cache.nodes.get(name) is not state:
            room = room_of(state)
            if self.cache.nodes.get(name) is state:
                self._rooms[name] = room
        return room

    def measure(self, state: NodeState, classes: Classes | None = None) -> float:
        """What the fragmentation policy minimises, for this node as it is (remembered until it changes)."""
        classes = classes if classes is not None else self.classes()
        value = self.remembered(state, classes)
        if value is None:
            room = self.room(state)
            value = self.fragments.measure(room.cpu, room.memory, room.gpus, classes)
            self.remember(state, classes, value)
        return value

    def remembered(self, state: NodeState, classes: Classes) -> float | None:
        """The node's measure for this build of the typical shapes, when it is remembered."""
        if self.cache.nodes.get(state.name) is not state:
            return None
        rows = self.arrays.located.get(state.name)
        if rows is not None:
            row = rows.row_of[state.name]
            return float(rows.measured[row]) if rows.build[row] == classes.version else None
        found = self._measured.get(state.name)
        return found[1] if found is not None and found[0] == classes.version else None

    def remember(self, state: NodeState, classes: Classes, value: float) -> None:
        """Keep the node's measure until it changes (only for the cache's own nodes, not views of whole nodes)."""
        if self.cache.nodes.get(state.name) is not state:
            return
        rows = self.arrays.located.get(state.name)
        if rows is not None:
            row = rows.row_of[state.name]
            rows.measured[row], rows.build[row] = value, classes.version
        else:
            self._measured[state.name] = (classes.version, value)

    # -- cache.Listener

    def node_changed(self, state: NodeState) -> None:
        self._forget(state.name)
        self.values.forget(self.arrays.update(state))

    def node_forgotten(self, name: str) -> None:
        self._forget(name)
        slot = self.arrays.forget(name)
        if slot is not None:
            self.values.forget(slot)

    def pod_arrived(self, record: PodRecord) -> None:
        if self._asked.pop(record.uid, None) is None:
            shape = shape_of(record.demand, record.cpu, record.memory, record.models)
            self.workload.observe(shape, self.cache.clock())

    def _forget(self, name: str) -> None:
        self.choices.forget(name)
        self._rooms.pop(name, None)
        self._measured.pop(name, None)
