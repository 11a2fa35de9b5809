"""Preemption: which candidate nodes evicting victims would really free, and which victims to name.

kube-scheduler picks victims by a node's totals, which may leave every GPU short; `preempt_candidates` keeps a
node only when its victims free room on the GPUs themselves, or names victims of our own that do (the extender
API lets it). Where a ResourceQuota limits the preemptor's namespace (`quota/`), the victims must also free
room under it: only the namespace's own pods do. Pure: it reads the cache's holds and summaries, never changes
them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

from extender.core.cache import Cache
from extender.core.devices import Demand, Strategy
from extender.core.holds import Allocation
from extender.core.nodes import NodeState, instances_of
from extender.core.objects import Raw, as_object, pod_priority
from extender.core.placement.fit import Judgement, Usage, place
from extender.core.placement.judge import usage_of
from extender.core.quota.book import Quotas
from extender.core.quota.charges import Charge, charge_of, namespace_of


def _freed(state: NodeState, victims: Iterable[Allocation]) -> Usage:
    """What the node's GPUs hold once what the victims hold on it is free (their MIG instances too, and what a
    GPU was blocked for by one of them)."""
    usage = usage_of(state)
    gone = set()
    for allocation in victims:
        if allocation.node != state.name:
            continue
        gone.add(allocation.pod_uid)
        for use in allocation.uses:
            position = state.position(use.index)
            if position >= 0:
                usage.memory[position] -= use.memory
                usage.cores[position] -= use.cores
                usage.slots[position] -= use.slots
    if usage.occupied is not None and gone:
        kept = (hold.allocation for uid, hold in state.holds.items() if uid not in gone)
        occupied, blocked = instances_of(state.devices, {d.index: p for p, d in enumerate(state.devices)}, kept)
        return replace(usage, occupied=occupied, blocked=blocked)
    return usage


def fits_after_eviction(demand: Demand, state: NodeState, victims: Iterable[Allocation]) -> bool:
    """Whether the demand fits on the node once what the victims hold on it is free."""
    usage = _freed(state, victims)
    if not demand.plain or any(device.slots or device.cores for device in state.devices):
        placed = place(demand, state.devices, usage, demand.device_strategy or Strategy.BINPACK, "")
        return state.ready and not isinstance(placed, Judgement)
    need = demand.per_device
    room = sum(
        1
        for device, used in zip(state.devices, usage.memory, strict=True)
        if device.usable and device.capacity - used >= need
    )
    return room >= demand.devices and state.ready


def quota_after_eviction(
    demand: Demand, state: NodeState, victims: list[Allocation], quotas: Quotas | None, namespace: str
) -> bool:
    """Whether the namespace's quotas have room for what the pod would be given on the node once the victims
    are evicted (those of its own namespace give back what they hold under them)."""
    if quotas is None or not quotas.limited(namespace):
        return True
    placed = place(demand, state.devices, _freed(state, victims), demand.device_strategy or Strategy.BINPACK, "")
    if isinstance(placed, Judgement):
        return False
    charge = charge_of(Allocation("", "", state.name, placed.containers, placed.init_containers), state.devices)
    freed = Charge.merged(quotas.held(victim.pod_uid) for victim in victims if namespace_of(victim) == namespace)
    return quotas.refusal(namespace, charge, (freed,)) is None


def preempt_candidates(
    demand: Demand,
    candidates: Mapping[str, list[str]],
    cluster: Cache,
    priority: int = 0,
    namespace: str = "",
    quotas: Quotas | None = None,
) -> dict[str, list[str]]:
    """The candidate nodes where evicting victims frees enough memory on the GPUs, with those victims.

    The scheduler picks victims by a node's totals: the lowest-priority pods until the node's sum fits,
    which may leave every GPU short (two 8 GiB pods on two different GPUs do not make 16 GiB on one). Its
    victims are kept when they free enough; otherwise we name our own from the pods on that node with a
    lower priority than the preemptor's (`priority`), the fewest that free a device set (the extender API
    lets us return other victims per node). What a victim frees is what the cache counts for its UID on that
    node (observed or reserved): a pod the cache does not count holds no GPU memory there. A demand of zero
    keeps every candidate: we have no say over such pods. Where a quota limits the preemptor's `namespace`,
    victims must also leave room under it (`quota_after_eviction`, with the book `quotas`).
    """
    if demand.is_zero:
        return {node: list(uids) for node, uids in candidates.items()}
    kept: dict[str, list[str]] = {}
    for node, uids in candidates.items():
        state = cluster.nodes.get(node)
        if state is None or not state.known:
            continue
        victims = [state.holds[uid].allocation for uid in uids if uid in state.holds]
        if fits_after_eviction(demand, state, victims) and quota_after_eviction(
            demand, state, victims, quotas, namespace
        ):
            kept[node] = list(uids)
            continue
        ours = _fewest_victims(demand, state, cluster, priority, namespace, quotas)
        if ours is not None:
            kept[node] = ours
    return kept


def _fewest_victims(
    demand: Demand, state: NodeState, cluster: Cache, priority: int, namespace: str, quotas: Quotas | None
) -> list[str] | None:
    """The fewest evictable pods on the node (lower priority than `priority`) whose eviction lets the demand
    fit, preferring lower priorities; None when even all of them do not make room.

    Greedy, then pruned: add pods from the lowest priority (and, among equals, the largest) until the demand
    fits, then drop every pod, highest priority first, whose eviction turns out not to be needed.
    """
    evictable = []
    for uid, hold in state.holds.items():
        record = cluster.pods.get(uid)
        if hold.observed and record is not None and record.priority < priority:
            evictable.append((record.priority, -hold.allocation.memory, uid, hold.allocation))
    evictable.sort()
    chosen: list[tuple[int, int, str, Allocation]] = []

    def enough(victims: list[tuple[int, int, str, Allocation]]) -> bool:
        evicted = [victim[3] for victim in victims]
        return fits_after_eviction(demand, state, evicted) and quota_after_eviction(
            demand, state, evicted, quotas, namespace
        )

    for entry in evictable:
        chosen.append(entry)
        if enough(chosen):
            break
    else:
        return None
    for entry in sorted(chosen, reverse=True):
        rest = [victim for victim in chosen if victim is not entry]
        if enough(rest):
            chosen = rest
    return [victim[2] for victim in chosen]


NEVER = "Never"
"""`spec.preemptionPolicy` of a pod that may not preempt anyone."""
NO_LOWER_PRIORITY = "; no pod on its GPUs has a lower priority, so preemption cannot help"
MAY_NOT_PREEMPT = "; this pod may not preempt (preemptionPolicy: Never)"
BEYOND_PREEMPTION = (NO_LOWER_PRIORITY, MAY_NOT_PREEMPT)
"""What `beyond_preemption` adds to a full node's reason: it has no room now, and no eviction will make some."""


def beyond_preemption(refused: Mapping[str, str], cluster: Cache, preemptor: Raw) -> dict[str, str]:
    """Of the nodes refused as full now, those where no eviction could make room for this pod, with their reason
    and why: no pod holding GPUs there has a lower priority than its own (kube-scheduler evicts only lower
    priorities), or it may not preempt at all (`preemptionPolicy: Never`). Answered as unresolvable,
    kube-scheduler's preemption skips them instead of simulating evictions on each (in a saturated cluster, for
    every pod it cannot place: `make bench-placement --mode burst`)."""
    if as_object(preemptor.get("spec")).get("preemptionPolicy") == NEVER:
        return {node: reason + MAY_NOT_PREEMPT for node, reason in refused.items()}
    priority = pod_priority(preemptor)
    hopeless = {}
    for node, reason in refused.items():
        lowest = cluster.lowest_priority(node)
        if lowest is None or lowest >= priority:
            hopeless[node] = reason + NO_LOWER_PRIORITY
    return hopeless
