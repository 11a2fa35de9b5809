"""Wake kube-scheduler for pods our filter refused while the cache was about to free room for them.

Why. kube-scheduler retries a pod an extender rejected only on a cluster event (any change of a Node, an
assigned Pod, ...) or at its periodic flush of unschedulable pods, after 5 minutes. Two things free GPU memory
in our cache with no such event to come after them:
- **Our watch was late.** A pod is deleted or finishes; kube-scheduler sees it first, retries the waiting pod at
  once, and our filter, still counting the old pod, refuses it. The event has passed: in a quiet cluster the
  pod waits out the flush.
- **A reservation expires** (its binding never showed up in the API): nothing in the API changed at all.

A third frees room under a quota with no event kube-scheduler acts on: **a ResourceQuota raised or deleted**
(`quota/`; kube-scheduler does not watch quotas).

So when the cache frees room on a node (a pod deleted or finished, seen by the watch, a relist or a read of
the API; a node added or changed; an expired reservation), and a pod refused everywhere since then would fit
there now, within its namespace's quotas, we ask kube-scheduler to retry; and when a namespace's quotas
change, if a pod of it refused in the last `MEMORY` seconds would fit on some node now:
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
from typing import NamedTuple

from extender.core.cache import Cache
from extender.core.contract import UNSCHEDULABLE_FLUSH
from extender.core.devices import Demand, Strategy
from extender.core.groups import GroupKey, keys
from extender.core.memo import Lru
from extender.core.nodes import NodeState
from extender.core.placement.fill import fill_choice
from extender.core.placement.fit import Verdict
from extender.core.placement.judge import judge
from extender.core.pods import PodRecord
from extender.core.quota.admission import charge_on
from extender.core.quota.book import Quotas

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
JOBS_REMEMBERED = 1024
"""Jobs found short of pods remembered at most (oldest forgotten first)."""


class Refused(NamedTuple):
    """What a refused pod asked, and the namespace whose quotas it is counted under."""

    demand: Demand
    namespace: str = ""


class Refusals:
    """Pods our filter refused on every node it was asked about (and not as never fitting, unless for a quota),
    by UID, with when and what they asked. Bounded, oldest forgotten first."""

    def __init__(self, memory: float = MEMORY, limit: int = 4096, clock: Callable[[], float] = time.time) -> None:
        self.memory = memory
        self.clock = clock
        self._refused: Lru[str, tuple[float, Refused]] = Lru(limit)

    def refused(self, uid: str, demand: Demand, namespace: str = "") -> None:
        if uid:
            self._refused.put(uid, (self.clock(), Refused(demand, namespace)))

    def forget(self, uid: str) -> None:
        """The pod is bound."""
        self._refused.pop(uid, None)

    def demands_since(self, since: float) -> set[Refused]:
        """What the pods refused at `since` or later (Unix seconds) asked, each demand once per namespace."""
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


def fits_any(refused: Iterable[Refused], state: NodeState, quotas: Quotas | None = None) -> bool:
    """Whether one of the refused pods would fit on the node now, within its namespace's `quotas` (what it
    would be given there as the fill policy places it)."""
    for demand, namespace in refused:
        if judge(demand, state, "")[0] is not Verdict.FITS:
            continue
        if quotas is None or not quotas.limited(namespace):
            return True
        charge = charge_on(state, fill_choice(demand, state, demand.device_strategy or Strategy.BINPACK))
        if charge is not None and quotas.refusal(namespace, charge) is None:
            return True
    return False


class Requeue:
    """The decision to ask kube-scheduler to retry: told of refusals, binds and room freed, it calls `ask` with
    a reason when a pod refused since the room came free would fit now. Without `ask` (the file source, or no
    `--pod-name`) it remembers nothing. Mutable."""

    def __init__(
        self,
        cache: Cache,
        ask: Callable[[str], None] | None,
        refusals: Refusals | None = None,
        quotas: Quotas | None = None,
    ) -> None:
        self.cache = cache
        self.ask = ask
        self.quotas = quotas
        """The book a refused pod's room is judged under (None: no quota)."""
        self.refusals = refusals if refusals is not None else Refusals()
        self._jobs_short: Lru[GroupKey, bool] = Lru(JOBS_REMEMBERED)
        """Jobs a member's filter found short of pods, until a pod of theirs arrives (`pod_arrived`)."""
        if ask is not None:
            cache.listen(self)

    def refused(self, uid: str, demand: Demand, namespace: str = "") -> None:
        """The filter refused this pod on every node it was asked about, for want of room now (on the GPUs, or
        under its `namespace`'s quotas)."""
        if self.ask is not None:
            self.refusals.refused(uid, demand, namespace)

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
                if state is not None and fits_any(demands, state, self.quotas):
                    self.ask(f"room came free on {node} for a pod refused since")
                    return
        except Exception:  # a bug here must not stop the informer or the expiry sweep that called it
            log.exception("deciding whether to ask kube-scheduler to retry")

    def job_short(self, job: GroupKey) -> None:
        """A member's filter found its job short of pods (fewer exist than it needs to start): the members refused
        so wait for an event, and the pod that completes the job is one (it is filtered itself, and plans the
        job), unless its filter came before our watch showed the others: then the watch's news of them is the
        event (`pod_arrived`)."""
        if self.ask is not None:
            self._jobs_short.put(job, True)

    # the cache's listener (only where `ask` is)

    def node_changed(self, state: NodeState) -> None:
        """Room freed on a node is told by the sources (`freed`), with since when."""

    def node_forgotten(self, name: str) -> None:
        """A node gone frees nothing."""

    def pod_arrived(self, record: PodRecord) -> None:
        """A pod of a job found short of pods arrived in the cache: its members refused may start now."""
        if self.ask is None:
            return
        for job in keys(record.group):  # a pod naming a PodGroup may be of more than one, by the PodGroups then
            if self._jobs_short.pop(job, False):
                self.ask(f"pod {record.key} of job {job} arrived; its members refused for want of it may start")
                return

    def job_held(self, job: str) -> None:
        """A job placed whole is held now (`core/jobs.py`): its members refused before, while it could not start,
        are each passed its planned node at their next filter, which nothing in the API may bring soon (the
        binds of its first members do, on kube-scheduler 1.32 and later). Ask for it."""
        if self.ask is not None:
            self.ask(f"job {job} is held whole: its members may bind")

    def quota_changed(self, namespace: str) -> None:
        """A ResourceQuota of the namespace changed (kube-scheduler is told of no such event): if a pod of it
        refused in the last `MEMORY` seconds fits on some node now, within its quotas, ask kube-scheduler to
        retry. Quotas change seldom (a change of their status alone is not one): one pass over the nodes."""
        if self.ask is None:
            return
        try:
            refused = {found for found in self.refusals.demands_since(0.0) if found.namespace == namespace}
            if not refused:
                return
            for name, state in self.cache.nodes.items():
                if fits_any(refused, state, self.quotas):
                    self.ask(f"the quotas of namespace {namespace} changed, and a pod refused there fits {name} now")
                    return
        except Exception:  # a bug here must not stop the informer that called it
            log.exception("deciding whether to ask kube-scheduler to retry")
