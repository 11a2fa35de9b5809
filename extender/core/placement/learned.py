"""What the placement policy learns from the cache, and what it remembers of the nodes between requests.

`Learned` listens to the cache (`cache.Listener`): each pod that appears there for the first time is one
observation of its shape for the learned workload (`workload.py`), and so is a pod a filter asks about before
the watch shows it (`asked`), once. On every change of a node it forgets what it remembered of that node: the
node as the measure sees it (`room`), its measure (`measure`) and what each pod ask would add to it (`tables`,
read by `fragmentation.py`). Built over a cache that already holds pods (a cluster file, a restart's first
list), it learns them first, as the cache had shown them one by one.

The cache tells; it never calls in here by name. Mutable; single-threaded like the cache.
"""

from __future__ import annotations

from extender.core.cache import Cache
from extender.core.memo import Lru, NodeMemo
from extender.core.nodes import NodeState
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
        self.tables = NodeMemo()
        """What placing each pod ask adds to each node's fragmentation (`fragmentation.fragmentation_values`)."""
        self._asked: Lru[str, bool] = Lru(ASKED_LIMIT)
        """Pods learned from a filter request before the cache had them (`asked`), so they count once."""
        self._rooms: dict[str, Room] = {}
        self._measured: dict[str, tuple[int, float]] = {}
        """Node -> (build of the typical shapes, its measure then), until the node changes."""
        for record in list(cache.pods.values()):
            self.pod_arrived(record)
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
        own = self.cache.nodes.get(state.name) is state
        found = self._measured.get(state.name) if own else None
        if found is not None and found[0] == classes.version:
            return found[1]
        room = self.room(state)
        value = self.fragments.measure(room.cpu, room.memory, room.gpus, classes)
        if own:
            self._measured[state.name] = (classes.version, value)
        return value

    # -- cache.Listener

    def node_changed(self, state: NodeState) -> None:
        self._forget(state.name)

    def node_forgotten(self, name: str) -> None:
        self._forget(name)

    def pod_arrived(self, record: PodRecord) -> None:
        if self._asked.pop(record.uid, None) is None:
            shape = shape_of(record.demand, record.cpu, record.memory, record.models)
            self.workload.observe(shape, self.cache.clock())

    def _forget(self, name: str) -> None:
        self.tables.forget(name)
        self._rooms.pop(name, None)
        self._measured.pop(name, None)
