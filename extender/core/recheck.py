"""Before refusing a preemptor the node it freed, ask the API whether the cache is behind.

Why. kube-scheduler evicts victims for a preemptor, then retries the preemptor as soon as its own informer
shows a victim gone: no backoff, about 10 ms later (seen against v1.34.1 in the e2e tier). Our watch of the same
API server may show that deletion a few milliseconds later still. A filter answered from a cache that still
counts the victim refuses the node the scheduler has just freed; the scheduler then finds no node, preempts
again elsewhere, and evicts a pod for nothing. A lag that lasts makes it evict a pod on every node (seen in the
e2e tier with our watch held back 200 ms: eight evictions for one pod), and the preemptor may then wait out
kube-scheduler's five-minute flush, since the events that would have retried it have passed.

So before refusing a preemptor a node it may have freed, the filter reads, straight from the API, the pods
the cache counts there as possible victims; those the API no longer has (or shows finished) leave the cache,
and the filter judges again. A GET of one pod is a quorum read, never older than what the scheduler saw. Real
victims that are still terminating stay counted, as the scheduler counts them: their memory is still in use.

Which pods (`suspects`): on the nodes the filter would refuse as full (not one that could never fit), the
victims our /preempt named for this preemptor in the last `MEMORY` seconds, its nominated node's first
(`status.nominatedNodeName` as sent; it may reach the pod only after the retry, so the other offered nodes
count too); and, when /preempt named nothing on the nominated node, the pods there of lower priority than the
preemptor's. At most `LIMIT`. The reads run concurrently and are cut at `TIMEOUT` seconds; whatever did not
answer keeps the cache's answer. Nothing else ever waits on the API: a pod that is no preemptor, or a node
that fits, costs nothing more. (A `nominatedNodeName` set for another reason, such as kube-scheduler's alpha
NominatedNodeNameForExpectation, costs a few reads at worst, never a wrong answer.)
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass

from extender.core.cache import Cache
from extender.core.contract import UNSCHEDULABLE_FLUSH
from extender.core.memo import Lru
from extender.core.objects import Raw, pod_priority
from extender.core.objects import uid as pod_uid
from extender.core.pods import PodRecord

LIMIT = 32
"""Pods read per filter call, at most (concurrently: about as long as one read)."""
TIMEOUT = 1.0
"""Seconds the reads may take in all (kube-scheduler gives a filter call 5 s by default)."""
MEMORY = UNSCHEDULABLE_FLUSH
"""Seconds the victims /preempt named for a preemptor are remembered."""


@dataclass(frozen=True, slots=True)
class Answer:
    """What the API said about the pods read: how many are gone (and left the cache), how many did not answer."""

    gone: int = 0
    unanswered: int = 0


Recheck = Callable[[list[PodRecord]], Awaitable[Answer]]
"""Reads each pod from the API; forgets in the cache those the API no longer has. Never raises."""


Offer = dict[str, tuple[str, ...]]
"""Victim UIDs per node, as /preempt answered them."""


MAX_REMEMBERED = 100_000
"""Victim UIDs remembered in all, across preemptors (about 10 MB): what /preempt keeps is bounded by size, not
only by count, so a few calls naming 100,000 victims each cannot grow the process."""


class Preemptions:
    """The victims /preempt named per node, per preemptor UID. Bounded: at most `LIMIT` victims per node (no
    filter reads more), `limit` preemptors and `MAX_REMEMBERED` victims in all, the oldest forgotten first;
    entries older than `memory` are dropped at every `remember`, not only when read."""

    def __init__(self, memory: float = MEMORY, limit: int = 10_000, clock: Callable[[], float] = time.monotonic):
        self.memory = memory
        self.clock = clock
        self._offers: Lru[str, tuple[float, Offer]] = Lru(limit)
        self._size = 0
        """Victim UIDs held in `_offers`."""

    def remember(self, uid: str, victims: Mapping[str, Iterable[str]]) -> None:
        offer = {node: tuple(itertools.islice(uids, LIMIT)) for node, uids in victims.items()}
        if not uid or not offer:
            return
        self.forget(uid)
        now = self.clock()
        size = sum(map(len, offer.values()))
        while self._offers and (
            self._size + size > MAX_REMEMBERED or len(self._offers) >= self._offers.limit or self._expired(now)
        ):
            self._drop(next(iter(self._offers)))
        if size <= MAX_REMEMBERED:
            self._offers.put(uid, (now, offer))
            self._size += size

    def _expired(self, now: float) -> bool:
        """Whether the oldest offer is older than `memory`."""
        when, _ = next(iter(self._offers.values()))
        return now - when > self.memory

    def _drop(self, uid: str) -> None:
        _, offer = self._offers.pop(uid)
        self._size -= sum(map(len, offer.values()))

    @property
    def size(self) -> int:
        """Victim UIDs remembered in all."""
        return self._size

    def offer(self, uid: str) -> Offer:
        """What /preempt last named for this preemptor ({} when nothing, or longer ago than `memory`)."""
        entry = self._offers.get(uid)
        if entry is None:
            return {}
        when, offer = entry
        if self.clock() - when > self.memory:
            self._drop(uid)
            return {}
        return offer

    def forget(self, uid: str) -> None:
        """The preemptor is bound: nothing to recheck for it any more."""
        if uid in self._offers:
            self._drop(uid)

    def __len__(self) -> int:
        return len(self._offers)


def suspects(pod: Raw, refused: Iterable[str], cluster: Cache, preemptions: Preemptions) -> list[PodRecord]:
    """The pods to read from the API before refusing this pod the nodes in `refused`; empty when the pod is no
    preemptor, or refused nowhere it may have freed.

    First the victims /preempt named on refused nodes, the nominated node's first: the scheduler evicts on one
    node exactly the victims we answered for it. Then, when the nominated node is refused and /preempt named
    nothing there (another replica answered it, or the scheduler preempted without asking us), the pods it
    could have evicted there: lower priority than the preemptor's, the lowest first, as the scheduler picks.
    Only pods the cache has seen bound count (a reservation is our own, current by definition). At most `LIMIT`.
    """
    status = pod.get("status")
    nominated = status.get("nominatedNodeName") if isinstance(status, dict) else None
    nominated = nominated if isinstance(nominated, str) else ""
    offer = preemptions.offer(pod_uid(pod))
    if not nominated and not offer:
        return []
    refused = set(refused)
    priority = pod_priority(pod)
    found: dict[str, PodRecord] = {}

    def evictable(uid: str, node: str) -> PodRecord | None:
        record, hold = cluster.pods.get(uid), cluster.hold_of(uid)
        if record is None or hold is None or not hold.observed or hold.allocation.node != node:
            return None
        return record if record.priority < priority else None

    for node in dict.fromkeys([nominated, *offer] if nominated else offer):
        for uid in offer.get(node, ()) if node in refused else ():
            record = evictable(uid, node)
            if record is not None:
                found.setdefault(uid, record)
    state = cluster.nodes.get(nominated) if nominated in refused and nominated not in offer else None
    if state is not None:
        others = (evictable(uid, nominated) for uid in state.holds)
        for record in sorted((record for record in others if record is not None), key=lambda r: r.priority):
            found.setdefault(record.uid, record)
    return list(found.values())[:LIMIT]
