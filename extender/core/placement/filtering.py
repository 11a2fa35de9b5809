"""The filter over many node names: which take the pod, and a reason for each other, said so that
kube-scheduler's message stays short (`summarized`).

The common case costs one C-speed set probe per name (the cache's `FitIndex` for one-GPU demands); the rest are
judged (`judge.py`) with the cache's memo of verdicts, so a burst of same-sized pods formats each node's reason
once. A pod the nodes' device plugin could run nowhere (`DeviceProtocol.refusal`) is refused on every node, for
that one reason, before any is judged. The quota's refusals and the policy's narrowing come after, in
`placer.Placer.filter`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import filterfalse
from typing import Any

from extender.core.cache import Cache
from extender.core.contract import checked_names
from extender.core.devices import Demand
from extender.core.memo import Question
from extender.core.nodes import NodeState
from extender.core.placement.fit import Cause, Judgement, Verdict, describe
from extender.core.placement.judge import ROOM, judge


@dataclass(slots=True)
class FilterOutcome:
    passed: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    unresolvable: dict[str, str] = field(default_factory=dict)
    causes: Counter[Cause] = field(default_factory=Counter)
    """How many nodes were refused for each cause (`extender_filter_rejections_total`)."""
    full: dict[str, Cause] = field(default_factory=dict)
    """Of `failed`, the nodes refused for room (memory, compute, slots), and for which: those an eviction could
    help."""


DETAILED = 8
"""Nodes refused for room beyond this many share one reason per cause (`summarized`)."""


def summarized(outcome: FilterOutcome, demand: Demand, unit: str) -> dict[str, str]:
    """The reasons of the nodes refused, with those refused for room said the same way on every node when there
    are more than `DETAILED`: kube-scheduler's message counts nodes per distinct reason ("0/1213 nodes are
    available: 1213 needs 470 MiB on one GPU; no GPU here has that much free."), so a thousand reasons that
    differ by their numbers made a message of a thousand parts, which it writes whole into the pod's
    PodScheduled condition, and sends to every watcher of pods, for each pod it cannot place (events are cut at
    1 KiB; the condition is not). A few nodes keep their own numbers; every node's are in `extender inspect`."""
    if len(outcome.full) <= DETAILED:
        return outcome.failed
    said = {cause: same_reason(demand, cause, unit) for cause in set(outcome.full.values())}
    return {node: said[outcome.full[node]] if node in outcome.full else why for node, why in outcome.failed.items()}


def same_reason(demand: Demand, cause: Cause, unit: str) -> str:
    """What every node refused for `cause` has in common, for this demand."""
    request = max(demand.requests, key=lambda request: (request.devices, request.memory, request.cores))
    need = describe(request, unit)
    gpus = "one GPU" if request.devices == 1 else f"{request.devices} GPUs"
    if cause is Cause.COMPUTE:
        return f"needs {need} on {gpus}; no GPU here has the compute left"
    if cause is Cause.SLOTS:
        return f"needs {need} on {gpus}; every GPU here that could hold it runs its most pods"
    if cause is Cause.EXCLUSIVE:
        return f"needs {gpus} to itself ({need}); every GPU here that could hold it runs a pod"
    if cause is Cause.SLICES:
        return f"needs {need} on {gpus}; no MIG GPU here that could hold it has the slices free"
    if cause is Cause.NUMA:
        return f"needs {gpus} with {need} free each on one NUMA node; no NUMA node here has that"
    if request.devices == 1:
        return f"needs {need} on one GPU; no GPU here has that much free"
    return f"needs {gpus} with {need} free each; fewer GPUs here have that much free"


def all_fit(demand: Demand, names: list[Any], fitting: set[str] | frozenset[str]) -> bool:
    """Whether every name is in `fitting` (so each is a string, and each node takes the one-GPU demand).

    The common case of a filter, at C speed: one hash and one probe per name. Never raises: an item that
    cannot be hashed is simply not a name that fits.
    """
    if demand.devices != 1 or not demand.plain:
        return False
    try:
        return fitting.issuperset(names)
    except TypeError:
        return False


def judged(demand: Demand, unit: str) -> Question[Judgement]:
    """The question `judge` answers for this demand, for the cache's `NodeMemo` table of its answers."""
    return Question(f"judge:{demand.key}:{unit}")


def filter_cached(
    demand: Demand, names: list[Any], states: Mapping[str, NodeState], cache: Cache, unit: str, pod: str = ""
) -> FilterOutcome:
    """Which of `names` take the demand now, and why each other one does not (before any quota or narrowing).

    `names` come unchecked from the request (`contract.requested_names(args, checked=False)`): in the
    common case, every name in the cache's `FitIndex` set for this demand, membership proves each a string that
    fits, at C speed. Otherwise they are checked (`contract.InvalidArgs` names the first that is no string) and
    judged with the cache's memo of verdicts. `states` is `cache.nodes`, or views of whole nodes the scheduler
    sent (which have no indexes).
    """
    refusal = cache.protocol.refusal(demand)
    if refusal is not None:
        return refused_everywhere(checked_names(names), refusal)
    own_cache = states is cache.nodes and not demand.is_zero
    plain_one = own_cache and demand.plain and demand.devices == 1
    fitting = cache.fit_index.fitting(demand.per_device, states) if plain_one else None
    if fitting is not None and all_fit(demand, names, fitting):
        return FilterOutcome(passed=names)
    memo = cache.memo.table(judged(demand, unit)) if own_cache else None
    return filter_nodes(demand, checked_names(names), states, unit, fitting, memo, pod)


def refused_everywhere(names: list[str], reason: str) -> FilterOutcome:
    """Every node unresolvable for the same reason: the device plugin could run the pod on none of them, so no
    eviction can help. Counted as `too_few`: fewer GPUs than it asks could ever serve it."""
    outcome = FilterOutcome(unresolvable=dict.fromkeys(names, reason))
    outcome.causes[Cause.TOO_FEW] += len(names)
    return outcome


def filter_nodes(
    demand: Demand,
    names: list[str],
    states: Mapping[str, NodeState],
    unit: str,
    fitting: set[str] | frozenset[str] | None = None,
    memo: dict[str, Judgement] | None = None,
    pod: str = "",
) -> FilterOutcome:
    """Split node names into those that fit and those that do not, with a reason for each of the latter.

    `fitting`, when given, is the set of node names that take this one-GPU demand now (the cache's
    `FitIndex`): membership then decides at C speed, and only the other names are judged (when all are in
    it, the caller need not come here at all: see `all_fit`).
    `memo`, when given, is the cache's table of `judge` answers for this demand (`judged`): a burst of
    same-sized pods then gets its reasons formatted once per node, not once per request. The answer on a node
    locked for `pod` itself is its own, never remembered.
    """
    outcome = FilterOutcome()
    if demand.is_zero:
        outcome.passed = names
        return outcome
    if fitting is not None and demand.devices == 1 and demand.plain:
        outcome.passed = list(filter(fitting.__contains__, names))  # in C: half the time of a comprehension
        rejected = list(filterfalse(fitting.__contains__, names))
    else:
        rejected = names
    passed, failed, unresolvable, full = outcome.passed, outcome.failed, outcome.unresolvable, outcome.full
    memo = {} if memo is None else memo
    refused = []
    # Locals, not module and enum attributes: this loop runs once per node refused, a thousand per request.
    fits, failing, own_lock = Verdict.FITS, Verdict.FAILED, Cause.LOCKED if pod else None
    for name in rejected:
        answer = memo.get(name)
        if answer is None or answer[2] is own_lock:
            state = states.get(name)
            answer = judge(demand, state, unit, pod)
            if state is not None and (state.lock is None or state.lock.pod != pod):
                memo[name] = answer
        verdict, reason, cause = answer
        if verdict is fits:
            passed.append(name)
            continue
        if verdict is failing:
            failed[name] = reason
            if cause in ROOM:
                full[name] = cause
        else:
            unresolvable[name] = reason
        refused.append(cause)
    outcome.causes.update(refused)  # counted in C
    return outcome
