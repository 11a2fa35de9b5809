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

Which pods: on each node the filter would refuse as full (not one that could never fit), the preemptor's
nominated node first (`status.nominatedNodeName` as sent) and then the nodes our /preempt offered for it in the
last `MEMORY` seconds (the scheduler evicts on one of them, and its nomination may reach the pod after the
retry), the pods the cache has seen bound there with a lower priority than the preemptor's: at most `LIMIT`.
The reads run concurrently and are cut at `TIMEOUT` seconds; whatever did not answer keeps the cache's answer.
Nothing else ever waits on the API: a pod that is not a preemptor, or a node that fits, costs nothing more.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

from extender.cluster import Cluster, PodRecord, pod_priority
from extender.resources import Raw, pod_uid

LIMIT = 16
"""Pods read per filter call, at most."""
TIMEOUT = 1.0
"""Seconds the reads may take in all (kube-scheduler gives a filter call 5 s by default)."""
MEMORY = 300.0
"""Seconds the nodes /preempt offered for a preemptor are remembered (kube-scheduler's own flush of pods left
unschedulable is 5 minutes)."""


@dataclass(frozen=True, slots=True)
class Answer:
    """What the API said about the pods read: how many are gone (and left the cache), how many did not answer."""

    gone: int = 0
    unanswered: int = 0


Recheck = Callable[[list[PodRecord]], Awaitable[Answer]]
"""Reads each pod from the API; forgets in the cache those the API no longer has. Never raises."""


class Preemptions:
    """The nodes /preempt offered victims on, per preemptor UID. Bounded, oldest forgotten first."""

    def __init__(self, memory: float = MEMORY, limit: int = 10_000, clock: Callable[[], float] = time.monotonic):
        self.memory = memory
        self.limit = limit
        self.clock = clock
        self._offered: OrderedDict[str, tuple[float, tuple[str, ...]]] = OrderedDict()

    def remember(self, uid: str, nodes: Iterable[str]) -> None:
        offered = tuple(nodes)
        if not uid or not offered:
            return
        self._offered.pop(uid, None)
        self._offered[uid] = (self.clock(), offered)
        if len(self._offered) > self.limit:
            self._offered.popitem(last=False)

    def nodes_of(self, uid: str) -> tuple[str, ...]:
        entry = self._offered.get(uid)
        if entry is None:
            return ()
        when, nodes = entry
        if self.clock() - when > self.memory:
            del self._offered[uid]
            return ()
        return nodes

    def forget(self, uid: str) -> None:
        """The preemptor is bound: nothing to recheck for it any more."""
        self._offered.pop(uid, None)

    def __len__(self) -> int:
        return len(self._offered)


def suspects(pod: Raw, refused: Iterable[str], cluster: Cluster, preemptions: Preemptions) -> list[PodRecord]:
    """The pods to read from the API before refusing this pod the nodes in `refused` (see the module docstring):
    empty when the pod is no preemptor, or refused nowhere it may have freed."""
    status = pod.get("status")
    nominated = status.get("nominatedNodeName") if isinstance(status, dict) else None
    nodes = [nominated] if isinstance(nominated, str) and nominated else []
    nodes += preemptions.nodes_of(pod_uid(pod))
    if not nodes:
        return []
    refused = set(refused)
    priority = pod_priority(pod)
    found: list[PodRecord] = []
    for node in dict.fromkeys(nodes):
        state = cluster.nodes.get(node) if node in refused else None
        if state is None:
            continue
        for uid, hold in state.holds.items():
            record = cluster.pods.get(uid)
            if hold.observed and record is not None and record.priority < priority:
                found.append(record)
                if len(found) == LIMIT:
                    return found
    return found
