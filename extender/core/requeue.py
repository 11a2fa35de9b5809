"""Wake kube-scheduler for pods our filter refused while the cache was about to free room for them.

Why. kube-scheduler retries a pod an extender rejected only on a cluster event (any change of a Node, an
assigned Pod, ...) or at its periodic flush of unschedulable pods, after 5 minutes. Two things free GPU memory
in our cache with no such event to come after them:
- **Our watch was late.** A pod is deleted or finishes; kube-scheduler sees it first, retries the waiting pod at
  once, and our filter, still counting the old pod, refuses it. The event has passed: in a quiet cluster the
  pod waits out the flush.
- **A reservation expires** (its binding never showed up in the API): nothing in the API changed at all.

So when the cache frees room on a node (a pod deleted or finished, seen by the watch, a relist or a read of
the API; a node added or changed; an expired reservation), and a pod refused everywhere since then would fit
there now, we ask kube-scheduler to retry:
the API source writes an annotation on the extender's own pod (`REQUEUE_ANNOTATION`), an update of an
assigned pod, which kube-scheduler (1.32 and later, with its queueing hints) answers by retrying every pod an
extender rejected. "Since then" is `WATCH_LAG` seconds before a watch event (a refusal longer ago had its
retry from that event already), or before the start of a gap in the watch the cache is still catching up on
(`RECOVERY`), and the reservation's start for an expiry. At most one such write per
`PERIOD` seconds (the source's `Requeuer`): each one retries every waiting pod the extender rejected, so it
is kept for when it is due.

Refusals are remembered by pod UID (the latest), `MEMORY` seconds at most, and forgotten when the pod binds.

This module decides (`Requeue`); the write is the API source's (`sources/kube/writes.py`, `Requeuer`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable

from extender.core.cache import Cache, NodeState
from extender.core.contract import UNSCHEDULABLE_FLUSH
from extender.core.devices import Demand
from extender.core.fit import Verdict
from extender.core.memo import Lru
from extender.core.policy import judge

log = logging.getLogger(__name__)

REQUEUE_ANNOTATION = "gpu-extender.io/requeue-requested"
"""On the extender's own pod: when it last asked kube-scheduler to retry the pods it rejected."""
WATCH_LAG = 1.0
"""Seconds before a watch event in which a refusal may have come from the watch being late."""
RECOVERY = 10.0
"""Seconds after a gap in a watch (a failure, then a resumed watch or a relist) during which what the cache
applies may be what it missed: refusals since the gap began count."""
MEMORY = UNSCHEDULABLE_FLUSH
"""Seconds a refusal is remembered."""
PERIOD = 1.0
"""Seconds between two requests to kube-scheduler, at least."""


class Refusals:
    """Pods our filter refused on every node it was asked about (and not as never fitting), by UID, with when
    and what they asked. Bounded, oldest forgotten first."""

    def __init__(self, memory: float = MEMORY, limit: int = 4096, clock: Callable[[], float] = time.time) -> None:
        self.memory = memory
        self.clock = clock
        self._refused: Lru[str, tuple[float, Demand]] = Lru(limit)

    def refused(self, uid: str, demand: Demand) -> None:
        if uid:
            self._refused.put(uid, (self.clock(), demand))

    def forget(self, uid: str) -> None:
        """The pod is bound."""
        self._refused.pop(uid, None)

    def demands_since(self, since: float) -> set[Demand]:
        """What the pods refused at `since` or later (Unix seconds) asked, each demand once."""
        oldest = self.clock() - self.memory
        while self._refused:
            uid, (when, _) = next(iter(self._refused.items()))
            if when >= oldest:
                break
            del self._refused[uid]
        demands = set()
        for when, demand in reversed(self._refused.values()):
            if when < since:
                break  # in order of refusal: the rest are older still
            demands.add(demand)
        return demands

    def __len__(self) -> int:
        return len(self._refused)


def fits_any(demands: Iterable[Demand], state: NodeState) -> bool:
    """Whether one of the demands would fit on the node now."""
    return any(judge(demand, state, "")[0] is Verdict.FITS for demand in demands)


class Requeue:
    """The decision to ask kube-scheduler to retry: told of refusals, binds and room freed, it calls `ask` with
    a reason when a pod refused since the room came free would fit now. Without `ask` (the file source, or no
    `--pod-name`) it remembers nothing. Mutable."""

    def __init__(self, cache: Cache, ask: Callable[[str], None] | None, refusals: Refusals | None = None) -> None:
        self.cache = cache
        self.ask = ask
        self.refusals = refusals if refusals is not None else Refusals()

    def refused(self, uid: str, demand: Demand) -> None:
        """The filter refused this pod on every node it was asked about, for want of room now."""
        if self.ask is not None:
            self.refusals.refused(uid, demand)

    def bound(self, uid: str) -> None:
        self.refusals.forget(uid)

    def freed(self, nodes: Iterable[str], since: float) -> None:
        """Room came free on these nodes in the cache, maybe with no cluster event for kube-scheduler after it
        (a late watch event, a relist, an expired reservation): if a pod refused since `since` (Unix seconds)
        fits on one of them now, ask kube-scheduler to retry. One request retries every waiting pod, so the
        first node that takes one is enough; a relist of thousands of nodes costs one pass over the few
        distinct demands refused."""
        if self.ask is None:
            return
        try:
            demands = self.refusals.demands_since(since)
            if not demands:
                return
            for node in nodes:
                state = self.cache.nodes.get(node)
                if state is not None and fits_any(demands, state):
                    self.ask(f"room came free on {node} for a pod refused since")
                    return
        except Exception:  # a bug here must not stop the informer or the expiry sweep that called it
            log.exception("deciding whether to ask kube-scheduler to retry")
