"""Placement decisions: filter, score, device choice and the preemption check, as pure functions.

Each function reads the cache's per-node summaries (never the pods) and returns values: a reason per rejected
node, a score per node, a tuple of device indexes. The filter and prioritize verbs' fast paths are here too
(`filter_pod`, `prioritize`): they read the answers the cache keeps current (`memo.py`) instead of judging
every node again. Nothing here mutates the cache; the ledger records what the
bind path decides. Scores follow kube-scheduler's `noderesources` arithmetic on a 0..10 scale (the extender
API's MaxExtenderPriority); ties in device choice break by device index, so one state gives one answer.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from extender.core.cache import Cache, NodeState
from extender.core.contract import MAX_EXTENDER_PRIORITY, HostPriorityEntry, checked_names, host_priority
from extender.core.holds import Allocation
from extender.core.memo import Question
from extender.core.resources import Demand


class Strategy(enum.StrEnum):
    BINPACK = "binpack"
    """Fill the fullest device (or node) that still fits: keeps whole GPUs free for big pods."""
    SPREAD = "spread"
    """Use the emptiest: spreads load and memory pressure."""


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    """How to choose among nodes and devices that fit."""

    node_strategy: Strategy = Strategy.BINPACK
    device_strategy: Strategy = Strategy.BINPACK
    node_weight: int = 1
    """Weight of the node-level fill in a node's score."""
    device_weight: int = 1
    """Weight of the chosen devices' fill in a node's score."""
    unit: str = "GiB"
    """How reasons name a unit of GPU memory."""
    memo_key: str = field(init=False, compare=False, repr=False)
    """Names this configuration in the nodes' memos of scores (a str: its hash is computed once)."""

    def __post_init__(self) -> None:
        key = f"{self.node_strategy}:{self.device_strategy}:{self.node_weight}:{self.device_weight}"
        object.__setattr__(self, "memo_key", key)


class Verdict(enum.IntEnum):
    FITS = 0
    FAILED = 1
    """Does not fit now; evicting pods could make room."""
    UNRESOLVABLE = 2
    """No device here could ever hold the demand: preemption cannot help."""


@dataclass(slots=True)
class FilterOutcome:
    passed: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    unresolvable: dict[str, str] = field(default_factory=dict)


NOT_IN_CACHE = "node is not in the extender's cache (yet)"


def judge(demand: Demand, state: NodeState | None, unit: str) -> tuple[Verdict, str]:
    """Whether the demand fits on the node now, and if not, a reason a person can act on."""
    if state is None or not state.known:
        return Verdict.FAILED, NOT_IN_CACHE
    need, count = demand.per_device, demand.devices
    if count == 1:
        if state.largest_free >= need and state.ready:
            return Verdict.FITS, ""
    elif len(state.free_desc) >= count and state.free_desc[count - 1] >= need and state.ready:
        return Verdict.FITS, ""
    total = len(state.devices)
    if not total:
        return Verdict.UNRESOLVABLE, f"no GPUs: {state.unreadable}" if state.unreadable else "no GPUs"
    capacity = state.capacity_desc
    if count == 1 and capacity[0] < need:
        return Verdict.UNRESOLVABLE, f"needs {need} {unit} on one GPU; the largest GPU here has {capacity[0]} {unit}"
    if count > 1 and (total < count or capacity[count - 1] < need):
        large = sum(1 for amount in capacity if amount >= need)
        return (
            Verdict.UNRESOLVABLE,
            f"needs {count} GPUs with {need} {unit} each; {large} of {total} GPUs here are that large",
        )
    if not state.ready:
        return Verdict.FAILED, "node is not Ready"
    if count == 1:
        if state.largest_free == 0:
            return Verdict.FAILED, f"needs {need} {unit} on one GPU; all {total} GPUs here are full"
        return (
            Verdict.FAILED,
            f"needs {need} {unit} on one GPU; largest free is {state.largest_free} {unit} "
            f"(GPU {state.largest_free_index} of {total})",
        )
    enough = sum(1 for amount in state.free_desc if amount >= need)
    return Verdict.FAILED, f"needs {count} GPUs with {need} {unit} free each; {enough} of {total} have that much"


def all_fit(demand: Demand, names: list[Any], fitting: set[str] | frozenset[str]) -> bool:
    """Whether every name is in `fitting` (so each is a string, and each node takes the one-GPU demand).

    The common case of a filter, at C speed: one hash and one probe per name. Never raises: an item that
    cannot be hashed is simply not a name that fits.
    """
    if demand.devices != 1:
        return False
    try:
        return fitting.issuperset(names)
    except TypeError:
        return False


def judged(demand: Demand, unit: str) -> Question[tuple[Verdict, str]]:
    """The question `judge` answers for this demand, for the cache's `NodeMemo` table of its answers."""
    return Question(f"judge:{demand.per_device}:{demand.devices}:{unit}")


def filter_pod(
    demand: Demand, names: list[Any], states: Mapping[str, NodeState], cache: Cache, unit: str
) -> FilterOutcome:
    """The filter verb's decision: which of `names` take the demand, and why each other one does not.

    `names` come unchecked from the request (`contract.requested_names(args, checked=False)`): in the
    common case, every name in the cache's `FitIndex` set for this demand, membership proves each a string that
    fits, at C speed. Otherwise they are checked (`contract.InvalidArgs` names the first that is no string) and
    judged with the cache's memo of verdicts. `states` is `cache.nodes`, or views of whole nodes the scheduler
    sent (which have no indexes).
    """
    own_cache = states is cache.nodes and not demand.is_zero
    fitting = cache.fit_index.fitting(demand.per_device, states) if own_cache and demand.devices == 1 else None
    if fitting is not None and all_fit(demand, names, fitting):
        return FilterOutcome(passed=names)
    memo = cache.memo.table(judged(demand, unit)) if own_cache else None
    return filter_nodes(demand, checked_names(names), states, unit, fitting, memo)


def filter_nodes(
    demand: Demand,
    names: list[str],
    states: Mapping[str, NodeState],
    unit: str,
    fitting: set[str] | frozenset[str] | None = None,
    memo: dict[str, tuple[Verdict, str]] | None = None,
) -> FilterOutcome:
    """Split node names into those that fit and those that do not, with a reason for each of the latter.

    `fitting`, when given, is the set of node names that take this one-GPU demand now (the cache's
    `FitIndex`): membership then decides at C speed, and only the other names are judged (when all are in
    it, the caller need not come here at all: see `all_fit`).
    `memo`, when given, is the cache's table of `judge` answers for this demand (`judge_key`): a burst of
    same-sized pods then gets its reasons formatted once per node, not once per request.
    """
    outcome = FilterOutcome()
    if demand.is_zero:
        outcome.passed = names
        return outcome
    if fitting is not None and demand.devices == 1:
        outcome.passed = [name for name in names if name in fitting]
        rejected = [name for name in names if name not in fitting]
    else:
        rejected = names
    passed, failed, unresolvable = outcome.passed, outcome.failed, outcome.unresolvable
    memo = {} if memo is None else memo
    for name in rejected:
        answer = memo.get(name)
        if answer is None:
            state = states.get(name)
            answer = judge(demand, state, unit)
            if state is not None:
                memo[name] = answer
        verdict, reason = answer
        if verdict is Verdict.FITS:
            passed.append(name)
        elif verdict is Verdict.FAILED:
            failed[name] = reason
        else:
            unresolvable[name] = reason
    return outcome


# --- scoring ----------------------------------------------------------------------------------------------


def most_allocated(used: int, capacity: int) -> int:
    """Binpack: the fuller after placement, the higher (kube-scheduler's MostAllocated).

    `used` is capped at `capacity`: memory the API shows over a device's capacity (a GPU turned unhealthy
    under running pods) must not push a score out of 0..10.
    """
    return min(used, capacity) * MAX_EXTENDER_PRIORITY // capacity if capacity > 0 else 0


def least_allocated(used: int, capacity: int) -> int:
    """Spread: the emptier after placement, the higher (kube-scheduler's LeastAllocated); `used` capped."""
    return (capacity - min(used, capacity)) * MAX_EXTENDER_PRIORITY // capacity if capacity > 0 else 0


_SCORERS = {Strategy.BINPACK: most_allocated, Strategy.SPREAD: least_allocated}


def choose_devices(demand: Demand, state: NodeState, strategy: Strategy) -> tuple[int, ...] | None:
    """The device indexes to give the pod on this node, or None when fewer than needed have room.

    Binpack takes the devices with the least free memory that still fit; spread the most. Equal free memory
    breaks by lower index.
    """
    need = demand.per_device
    if demand.devices == 1:
        return _choose_one(need, state, strategy)
    fitting = [(free, device.index) for free, device in zip(state.free, state.devices, strict=True) if free >= need]
    if len(fitting) < demand.devices:
        return None
    if strategy is Strategy.BINPACK:
        fitting.sort()
    else:
        fitting.sort(key=lambda pair: (-pair[0], pair[1]))
    return tuple(sorted(index for _, index in fitting[: demand.devices]))


def _choose_one(need: int, state: NodeState, strategy: Strategy) -> tuple[int, ...] | None:
    """`choose_devices` for one device, in one pass: the same order (free memory, then index), no sorting."""
    chosen, chosen_free = -1, 0
    binpack = strategy is Strategy.BINPACK
    for position, free in enumerate(state.free):
        if free >= need and (chosen < 0 or (free < chosen_free if binpack else free > chosen_free)):
            chosen, chosen_free = position, free
    return (state.devices[chosen].index,) if chosen >= 0 else None


def score_node(demand: Demand, state: NodeState | None, config: PolicyConfig) -> int:
    """0..10: the weighted fill after placement of the chosen devices and of the node; 0 when it does not fit."""
    if demand.is_zero or state is None or not state.known or not state.ready:
        return 0
    indexes = choose_devices(demand, state, config.device_strategy)
    if indexes is None:
        return 0
    added = demand.per_device * len(indexes)
    chosen = [state.position(index) for index in indexes]
    device_capacity = sum(state.devices[position].capacity for position in chosen)
    device_used = sum(state.used[position] for position in chosen) + added
    device_score = _SCORERS[config.device_strategy](device_used, device_capacity)
    node_score = _SCORERS[config.node_strategy](state.used_total + added, state.capacity_total)
    weights = config.device_weight + config.node_weight
    return (config.device_weight * device_score + config.node_weight * node_score) // weights if weights else 0


def scored(demand: Demand, config: PolicyConfig) -> Question[HostPriorityEntry]:
    """The question `prioritize` answers per node, for the cache's `NodeMemo` table of its reply entries."""
    return Question(f"score:{demand.per_device}:{demand.devices}:{config.memo_key}")


def prioritize(
    demand: Demand, names: list[str], states: Mapping[str, NodeState], cache: Cache, config: PolicyConfig
) -> list[HostPriorityEntry]:
    """The prioritize verb's reply: a score per node name, 0 where the pod does not fit.

    The reply entries themselves are remembered per node until it changes: building a thousand small dicts per
    request cost more than scoring (measured), and kube-scheduler asks the same sizes over and over.
    """
    if demand.is_zero:
        return [host_priority(name, 0) for name in names]
    entries = cache.memo.table(scored(demand, config)) if states is cache.nodes else {}
    reply = []
    for name in names:
        entry = entries.get(name)
        if entry is None:
            state = states.get(name)
            entry = host_priority(name, score_node(demand, state, config))
            if state is not None:
                entries[name] = entry
        reply.append(entry)
    return reply


# --- preemption -------------------------------------------------------------------------------------------


def fits_after_eviction(demand: Demand, state: NodeState, victims: Iterable[Allocation]) -> bool:
    """Whether the demand fits on the node once the victims' memory on it is free."""
    freed = [0] * len(state.devices)
    for allocation in victims:
        if allocation.node != state.name:
            continue
        for index in allocation.indexes:
            position = state.position(index)
            if position >= 0:
                freed[position] += allocation.per_device
    need = demand.per_device
    room = sum(
        1
        for device, used, more in zip(state.devices, state.used, freed, strict=True)
        if device.capacity - (used - more) >= need
    )
    return room >= demand.devices and state.ready


def preempt_candidates(
    demand: Demand, candidates: Mapping[str, list[str]], cluster: Cache, priority: int = 0
) -> dict[str, list[str]]:
    """The candidate nodes where evicting victims frees enough memory on the GPUs, with those victims.

    The scheduler picks victims by a node's totals: the lowest-priority pods until the node's sum fits,
    which may leave every GPU short (two 8 GiB pods on two different GPUs do not make 16 GiB on one). Its
    victims are kept when they free enough; otherwise we name our own from the pods on that node with a
    lower priority than the preemptor's (`priority`), the fewest that free a device set (the extender API
    lets us return other victims per node). What a victim frees is what the cache counts for its UID on that
    node (observed or reserved): a pod the cache does not count holds no GPU memory there. A demand of zero
    keeps every candidate: we have no say over such pods.
    """
    if demand.is_zero:
        return {node: list(uids) for node, uids in candidates.items()}
    kept: dict[str, list[str]] = {}
    for node, uids in candidates.items():
        state = cluster.nodes.get(node)
        if state is None or not state.known:
            continue
        victims = [state.holds[uid].allocation for uid in uids if uid in state.holds]
        if fits_after_eviction(demand, state, victims):
            kept[node] = list(uids)
            continue
        ours = _fewest_victims(demand, state, cluster, priority)
        if ours is not None:
            kept[node] = ours
    return kept


def _fewest_victims(demand: Demand, state: NodeState, cluster: Cache, priority: int) -> list[str] | None:
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
    for entry in evictable:
        chosen.append(entry)
        if fits_after_eviction(demand, state, [victim[3] for victim in chosen]):
            break
    else:
        return None
    for entry in sorted(chosen, reverse=True):
        rest = [victim for victim in chosen if victim is not entry]
        if fits_after_eviction(demand, state, [victim[3] for victim in rest]):
            chosen = rest
    return [victim[2] for victim in chosen]
