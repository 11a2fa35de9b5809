"""Where quotas meet placement: what a pod would be given on a node, and the filter's refusal of the nodes where
that would take its namespace over a quota (HAMi's `fitQuota`, `pkg/device/nvidia/device.go:666-692`).

What a pod is given depends on the node: a percentage of each GPU's memory is more on a larger GPU, and a limit
for one GPU model counts only the GPUs of that model. So the filter asks the policy what it would give the pod
on each node that fits (`placement.Placer.choose`, the bind's own choice), and the quota book (`book.py`) whether the
namespace may be given that. A namespace that no quota limits costs one dict lookup per filter; one whose
limits leave room for the most the pod could take anywhere costs a few comparisons; only a namespace near a
limit costs a choice per node, remembered per node until it changes (`memo.NodeMemo`).

A node refused for a quota is FAILED when evicting the namespace's own pods of lower priority on it would make
room, else UNRESOLVABLE: evicting another namespace's pods frees none of this one's quota, and kube-scheduler
does not preempt for nothing. The filter then passes the nodes that remain; it never refuses a node the quota
allows. Nothing here changes the cache.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from extender.core import objects
from extender.core.devices import Demand
from extender.core.holds import Allocation
from extender.core.memo import Question
from extender.core.nodes import NodeState
from extender.core.objects import Raw, pod_priority
from extender.core.placement.config import Ask
from extender.core.placement.filtering import FilterOutcome
from extender.core.placement.fit import Cause, Placement, Verdict
from extender.core.placement.placer import Placer
from extender.core.quota.book import QuotaRefusal, Quotas
from extender.core.quota.charges import Charge, charge_of, part


def charge_on(state: NodeState, placed: Placement | None) -> Charge | None:
    """What a pod placed so on this node is given, as a quota counts it (None: it does not fit there now)."""
    if placed is None:
        return None
    allocation = Allocation("", "", state.name, placed.containers, placed.init_containers)
    return charge_of(allocation, state.devices)


def most_asked(demand: Demand) -> tuple[int, int, int] | None:
    """The most memory, compute and GPUs the pod could be given on any node, or None when that depends on the
    node's GPUs (a percentage of their memory)."""
    memory = cores = gpus = 0
    for request in demand.requests:
        if request.percent and not request.memory:
            return None
        memory += request.devices * request.memory
        cores += request.devices * request.cores
        gpus += request.devices
    return memory, cores, gpus


@dataclass(frozen=True, slots=True)
class QuotaFilter:
    """The quota's part of one filter request: the pod, where it is asked, and how the bind would place it."""

    namespace: str
    uid: str
    priority: int
    demand: Demand
    placer: Placer
    quotas: Quotas
    states: Mapping[str, NodeState]
    ask: Ask | None

    def __call__(self, outcome: FilterOutcome) -> None:
        """Move the nodes where the pod would take its namespace over a quota from passed to refused."""
        quotas = self.quotas
        if not outcome.passed or self._always_room(quotas):
            return
        own = (quotas.held(self.uid),)
        charges = self._charges()
        freeable: dict[str, Charge] | None = None
        passed = []
        for name in outcome.passed:
            charge = self._charge(name, charges)
            refusal = quotas.refusal(self.namespace, charge, own) if charge is not None else None
            if refusal is None:
                passed.append(name)
                continue
            if freeable is None:
                freeable = self._freeable()
            verdict = refusal.verdict(_counted(freeable.get(name), refusal, quotas))
            (outcome.failed if verdict is Verdict.FAILED else outcome.unresolvable)[name] = refusal.reason
            outcome.causes[Cause.QUOTA] += 1
        outcome.passed = passed

    def _always_room(self, quotas: Quotas) -> bool:
        """Whether every limit on the namespace has room for the most the pod could be given on any node."""
        if quotas.blocked(self.namespace) is not None:
            return False
        most = most_asked(self.demand)
        if most is None:
            return False
        held = quotas.held(self.uid)
        return all(
            quotas.used(self.namespace, limit) - held.amount(limit) + part(most, limit.resource) <= limit.amount
            for _, limit in quotas.limits(self.namespace)
        )

    def _charges(self) -> dict[str, Charge]:
        """The table of what the pod would be given per node, remembered until the node changes ({} for nodes
        the scheduler sent whole)."""
        placer = self.placer
        if self.states is not placer.cache.nodes:
            return {}
        version = placer.learned.classes().version if placer.config.by_fragmentation(self.demand) else 0
        key = self.ask.key if self.ask is not None else self.demand.key
        table: dict[str, Charge] = placer.cache.memo.table(Question(f"quota:{key}:{placer.config.memo_key}:{version}"))
        return table

    def _charge(self, name: str, charges: dict[str, Charge]) -> Charge | None:
        charge = charges.get(name)
        if charge is None:
            state = self.states.get(name)
            if state is None:
                return None
            charge = charge_on(state, self.placer.choose(self.demand, state, self.ask))
            if charge is not None and self.states is self.placer.cache.nodes:
                charges[name] = charge
        return charge

    def _freeable(self) -> dict[str, Charge]:
        """Per node, what evicting the namespace's own running pods of lower priority there would free."""
        found: dict[str, list[Charge]] = {}
        cache = self.placer.cache
        for uid, node, charge in self.quotas.held_in(self.namespace):
            record, hold = cache.pods.get(uid), cache.hold_of(uid)
            if uid == self.uid or record is None or hold is None or not hold.observed:
                continue
            if record.priority < self.priority:
                found.setdefault(node, []).append(charge)
        return {node: Charge.merged(charges) for node, charges in found.items()}


def _counted(charge: Charge | None, refusal: QuotaRefusal, quotas: Quotas) -> int:
    """What of the refusing limit `charge` counts."""
    if charge is None:
        return 0
    for quota, limit in quotas.limits(refusal.namespace):
        if (quota, limit.key) == (refusal.quota, refusal.key):
            return charge.amount(limit)
    return 0


def quota_filter(
    pod: Raw, demand: Demand, placer: Placer, quotas: Quotas, states: Mapping[str, NodeState], ask: Ask | None
) -> Callable[[FilterOutcome], None] | None:
    """The quota's check of a filter's outcome for this pod (`Placer.filter`'s `admit`), or None when no quota
    limits the pod's namespace."""
    namespace = objects.namespace(pod)
    if demand.is_zero or not quotas.limited(namespace):
        return None
    return QuotaFilter(namespace, objects.uid(pod), pod_priority(pod), demand, placer, quotas, states, ask)
