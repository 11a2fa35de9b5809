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
import math
import operator
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from itertools import compress
from typing import Any, cast

from extender.core.cache import Cache, NodeState
from extender.core.contract import MAX_EXTENDER_PRIORITY, HostPriorityEntry, checked_names, host_priority
from extender.core.devices import Demand, Request, Strategy
from extender.core.fit import FITS, Cause, Judgement, Placement, Usage, Verdict, describe, place
from extender.core.fragmentation import FragmentMemo, GpuRoom
from extender.core.holds import Grant
from extender.core.memo import Question
from extender.core.objects import Raw
from extender.core.resources import pod_request
from extender.core.workload import Classes

__all__ = ["FITS", "Cause", "Judgement", "Strategy", "Verdict"]


class Policy(enum.StrEnum):
    """How nodes and GPUs are chosen."""

    FRAGMENTATION = "fragmentation"
    """Where the GPU capacity left unusable for the pods the cluster runs grows least (`fragmentation.py`)."""
    FILL = "fill"
    """By fill, as `node_strategy` and `device_strategy` say (binpack or spread)."""


class Narrowing(enum.StrEnum):
    """What the filter passes of the nodes that fit, under the fragmentation policy."""

    BEST = "best"
    """The one best node (ties broken by fill, then name): kube-scheduler then binds there without scoring."""
    TIES = "ties"
    """Every node as good as the best: kube-scheduler's own scores choose among them."""
    OFF = "off"
    """Every node that fits: the choice is left to the scores (ours 0-10 via prioritize, and kube-scheduler's)."""


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    """How to choose among nodes and devices that fit."""

    node_strategy: Strategy = Strategy.BINPACK
    device_strategy: Strategy = Strategy.BINPACK
    node_weight: int = 1
    """Weight of the node-level fill in a node's score."""
    device_weight: int = 1
    """Weight of the chosen devices' fill in a node's score."""
    policy: Policy = Policy.FRAGMENTATION
    narrowing: Narrowing = Narrowing.BEST
    tolerance: float = 0.0
    """GPUs of added fragmentation within which nodes count as good as the best (`narrowing` and scores)."""
    memo_key: str = field(init=False, compare=False, repr=False)
    """Names this configuration in the nodes' memos of scores (a str: its hash is computed once)."""

    def __post_init__(self) -> None:
        key = f"{self.node_strategy}:{self.device_strategy}:{self.node_weight}:{self.device_weight}:{self.policy}"
        object.__setattr__(self, "memo_key", key)

    def by_fragmentation(self, demand: Demand) -> bool:
        """Whether this demand is placed by fragmentation (a pod that asks its own strategy keeps it: HAMi's
        `hami.io/gpu-scheduler-policy` and `node-scheduler-policy`)."""
        return self.policy is Policy.FRAGMENTATION and demand.node_strategy is None and demand.device_strategy is None


@dataclass(frozen=True, slots=True)
class Ask:
    """What a pod asks of a node: its GPU demand, and the cpu and memory kube-scheduler counts for it."""

    demand: Demand
    cpu: int = 0
    """Millicores."""
    memory: int = 0
    """Bytes."""

    @property
    def key(self) -> str:
        return f"{self.demand.key}:{self.cpu}:{self.memory}"


def ask_of(pod: Raw, demand: Demand) -> Ask:
    """The pod's ask, from its object (the request's, or the one remembered from its filter)."""
    return Ask(demand, pod_request(pod, "cpu", scale=3), pod_request(pod, "memory"))


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


NOT_IN_CACHE = "node is not in the extender's cache (yet)"
ROOM = frozenset({Cause.MEMORY, Cause.COMPUTE, Cause.SLOTS, Cause.EXCLUSIVE, Cause.NUMA})
"""Refusals for room on the GPUs: those an eviction could help, unlike a lock or a node not Ready."""


def judge(demand: Demand, state: NodeState | None, unit: str, pod: str = "") -> Judgement:
    """Whether the demand fits on the node now, and if not, a reason a person can act on and its cause. `pod`
    (`namespace/name`) is the pod asking: a device plugin's lock held for it does not keep it off the node."""
    if state is None or not state.known:
        return Judgement(Verdict.FAILED, NOT_IN_CACHE, Cause.NOT_IN_CACHE)
    if not demand.plain:
        return _judge_general(demand, state, unit, pod)
    need, count = demand.per_device, demand.devices
    if state.ready and (state.lock is None or state.lock.pod == pod):
        if count == 1:
            if state.largest_free >= need:
                return FITS
        elif len(state.free_desc) >= count and state.free_desc[count - 1] >= need:
            return FITS
    total = len(state.devices)
    if not total:
        return Judgement(Verdict.UNRESOLVABLE, _no_gpus(state), Cause.NO_GPUS)
    capacity = state.capacity_desc
    if count == 1 and (not capacity or capacity[0] < need):
        largest = capacity[0] if capacity else 0
        reason = f"needs {need} {unit} on one GPU; the largest GPU here has {largest} {unit}"
        return Judgement(Verdict.UNRESOLVABLE, reason, Cause.TOO_SMALL)
    if count > 1 and (len(capacity) < count or capacity[count - 1] < need):
        large = sum(1 for amount in capacity if amount >= need)
        reason = f"needs {count} GPUs with {need} {unit} each; {large} of {total} GPUs here are that large"
        return Judgement(Verdict.UNRESOLVABLE, reason, Cause.TOO_FEW)
    unavailable = _unavailable(state, pod)
    if unavailable is not None:
        return unavailable
    if count == 1:
        if state.largest_free == 0:
            return Judgement(
                Verdict.FAILED, f"needs {need} {unit} on one GPU; all {total} GPUs here are full", Cause.MEMORY
            )
        reason = (
            f"needs {need} {unit} on one GPU; largest free is {state.largest_free} {unit} "
            f"(GPU {state.largest_free_index} of {total})"
        )
        return Judgement(Verdict.FAILED, reason, Cause.MEMORY)
    enough = sum(1 for amount in state.free_desc if amount >= need)
    reason = f"needs {count} GPUs with {need} {unit} free each; {enough} of {total} have that much"
    return Judgement(Verdict.FAILED, reason, Cause.MEMORY)


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
    if cause is Cause.NUMA:
        return f"needs {gpus} with {need} free each on one NUMA node; no NUMA node here has that"
    if request.devices == 1:
        return f"needs {need} on one GPU; no GPU here has that much free"
    return f"needs {gpus} with {need} free each; fewer GPUs here have that much free"


def _no_gpus(state: NodeState) -> str:
    return f"no GPUs: {state.unreadable}" if state.unreadable else "no GPUs"


def _unavailable(state: NodeState, pod: str) -> Judgement | None:
    """Why a node that could hold the pod takes none now, whatever it asks (not Ready, locked)."""
    if not state.ready:
        return Judgement(Verdict.FAILED, "node is not Ready", Cause.NOT_READY)
    lock = state.lock
    if lock is not None and lock.pod != pod:
        holder = f" for pod {lock.pod}" if lock.pod else ""
        reason = f"node is locked{holder} until its device plugin has allocated it (HAMi's node lock); try again soon"
        return Judgement(Verdict.FAILED, reason, Cause.LOCKED)
    return None


def usage_of(state: NodeState) -> Usage:
    """What the node's GPUs hold now, per position (a copy: placing on it changes nothing in the cache)."""
    return Usage(list(state.used), list(state.used_cores), list(state.used_slots))


def _judge_general(demand: Demand, state: NodeState, unit: str, pod: str) -> Judgement:
    if not state.devices:
        return Judgement(Verdict.UNRESOLVABLE, _no_gpus(state), Cause.NO_GPUS)
    placed = place(demand, state.devices, usage_of(state), demand.device_strategy or Strategy.BINPACK, unit)
    if isinstance(placed, Judgement):
        return placed
    return _unavailable(state, pod) or FITS


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


def filter_pod(
    demand: Demand,
    names: list[Any],
    states: Mapping[str, NodeState],
    cache: Cache,
    unit: str,
    pod: str = "",
    ask: Ask | None = None,
    config: PolicyConfig | None = None,
    admit: Callable[[FilterOutcome], None] | None = None,
) -> FilterOutcome:
    """The filter verb's decision: which of `names` take the demand, and why each other one does not.

    `names` come unchecked from the request (`contract.requested_names(args, checked=False)`): in the
    common case, every name in the cache's `FitIndex` set for this demand, membership proves each a string that
    fits, at C speed. Otherwise they are checked (`contract.InvalidArgs` names the first that is no string) and
    judged with the cache's memo of verdicts. `states` is `cache.nodes`, or views of whole nodes the scheduler
    sent (which have no indexes).

    Under the fragmentation policy (`config`, with the pod's `ask`), the nodes that fit are then narrowed to the
    best (`narrow`): the others are left out of the reply, neither passed nor failed, so they cost the scheduler
    nothing, and a pod that fits somewhere is never refused for it.

    `admit`, when given, refuses some of the nodes that fit for reasons of the pod's namespace before any
    narrowing (its ResourceQuotas: `quota_fit.quota_filter`).
    """
    own_cache = states is cache.nodes and not demand.is_zero
    plain_one = own_cache and demand.plain and demand.devices == 1
    fitting = cache.fit_index.fitting(demand.per_device, states) if plain_one else None
    if fitting is not None and all_fit(demand, names, fitting):
        outcome = FilterOutcome(passed=names)
    else:
        memo = cache.memo.table(judged(demand, unit)) if own_cache else None
        outcome = filter_nodes(demand, checked_names(names), states, unit, fitting, memo, pod)
    if admit is not None:
        admit(outcome)
    if ask is not None and config is not None and config.by_fragmentation(demand) and len(outcome.passed) > 1:
        outcome.passed = narrow(ask, outcome.passed, cache, states, config)
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
        outcome.passed = [name for name in names if name in fitting]
        rejected = [name for name in names if name not in fitting]
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


def choose(
    demand: Demand, state: NodeState, config: PolicyConfig, ask: Ask | None = None, cache: Cache | None = None
) -> Placement | None:
    """The GPUs to give the pod on this node (per GPU container), or None when it does not fit now: where they add
    least fragmentation under that policy (given the pod's `ask` and the `cache` that knows the workload), else
    by the device strategy."""
    if ask is not None and cache is not None and config.by_fragmentation(demand) and not demand.is_zero:
        added = added_fragmentation(ask, state, cache.classes(), cache.fragments)
        return placement_of(demand, state, added[1]) if added is not None else None
    strategy = demand.device_strategy or config.device_strategy
    if demand.plain:
        indexes = choose_devices(demand, state, strategy)
        if indexes is None:
            return None
        uuids = {device.index: device.uuid for device in state.devices}
        return Placement((tuple(Grant(index, demand.per_device, 0, uuids[index]) for index in indexes),), 0)
    placed = place(demand, state.devices, usage_of(state), strategy, "")
    return None if isinstance(placed, Judgement) else placed


def score_node(demand: Demand, state: NodeState | None, config: PolicyConfig) -> int:
    """0..10: the weighted fill after placement of the chosen devices and of the node; 0 when it does not fit."""
    if demand.is_zero or state is None or not state.known or not state.ready:
        return 0
    placed = choose(demand, state, config)
    if placed is None:
        return 0
    taken: dict[int, int] = {}
    for grants in placed.containers:
        for grant in grants:
            taken[grant.index] = taken.get(grant.index, 0) + grant.memory
    added = sum(taken.values())
    chosen = [state.position(index) for index in taken]
    device_capacity = sum(state.devices[position].capacity for position in chosen)
    device_used = sum(state.used[position] for position in chosen) + added
    device_strategy = demand.device_strategy or config.device_strategy
    node_strategy = demand.node_strategy or config.node_strategy
    device_score = _SCORERS[device_strategy](device_used, device_capacity)
    node_score = _SCORERS[node_strategy](state.used_total + added, state.capacity_total)
    weights = config.device_weight + config.node_weight
    return (config.device_weight * device_score + config.node_weight * node_score) // weights if weights else 0


def scored(demand: Demand, config: PolicyConfig) -> Question[HostPriorityEntry]:
    """The question `prioritize` answers per node, for the cache's `NodeMemo` table of its reply entries."""
    return Question(f"score:{demand.key}:{config.memo_key}")


_SCORE = operator.itemgetter("Score")


def prioritize(
    demand: Demand,
    names: list[str],
    states: Mapping[str, NodeState],
    cache: Cache,
    config: PolicyConfig,
    ask: Ask | None = None,
) -> list[HostPriorityEntry]:
    """The prioritize verb's reply: the nodes that score above the lowest score among `names`, each with its
    score minus that lowest (a node where the pod does not fit scores 0). The others are left out.

    Why it is the same answer, shorter: kube-scheduler adds each listed host's score x weight x 10 to that node's
    total and adds nothing for a host the reply leaves out (`prioritizeNodes`, pkg/scheduler/schedule_one.go
    lines 845-876 at v1.34.1: only hosts in the reply enter `allNodeExtendersScores`). So a host left out scores
    0, and taking the same amount off every node's total changes no ranking. Under binpack most nodes sent are
    empty and score alike: the reply shrinks from every node sent to the few partly filled ones, which
    kube-scheduler then decodes instead of a thousand entries.

    The reply entries themselves are remembered per node until it changes: building a thousand small dicts per
    request cost more than scoring (measured), and kube-scheduler asks the same sizes over and over. Shifted
    entries are new dicts, so the reply is shifted only when that leaves out at least half of the nodes; else
    the remembered entries go out as they are (the same ranking, nothing taken off). Measured in process at
    1,000 names and 30 % fill, where nearly every node scores above the lowest: 141 us per request with the
    full reply, 333 shifting every entry, 187 now; the ~30 us left is the pass for the lowest score, which
    shorter replies repay on kube-scheduler's side (its decoding, ~0.6 ms per pod in `make bench-e2e`).
    """
    if ask is not None and config.by_fragmentation(demand):
        if config.narrowing is not Narrowing.OFF:
            # The nodes the filter would pass score 10, the rest 0: kube-scheduler calls prioritize only when the
            # filter passed several (ties), so this is the same answer, at the cost of the filter's own.
            best = narrow(ask, names, cache, states, config)
            if len(best) == len(names):
                return []  # all alike: nothing to add to any
            if len(best) == 1:
                return [host_priority(best[0], MAX_EXTENDER_PRIORITY)]
            chosen = set(best)
            return [host_priority(name, MAX_EXTENDER_PRIORITY) for name in names if name in chosen]
        scores = fragmentation_scores(ask, names, cache, states, config)
        return _shifted([host_priority(name, score) for name, score in zip(names, scores, strict=True)])
    if demand.is_zero:
        return []
    entries = cache.memo.table(scored(demand, config)) if states is cache.nodes else {}
    found = list(map(entries.get, names))  # in C: the handler 146 -> 137 us at 1,000 names (measured)
    if not all(found):  # nodes changed since they were scored, or never scored (an entry is never {})
        for index, entry in enumerate(found):
            if entry is None:
                name = names[index]
                state = states.get(name)
                found[index] = entry = host_priority(name, score_node(demand, state, config))
                if state is not None:
                    entries[name] = entry
    return _shifted(cast(list[HostPriorityEntry], found))  # every miss filled in above


def _shifted(scored_entries: list[HostPriorityEntry]) -> list[HostPriorityEntry]:
    """The entries above the lowest score, shifted down by it (see `prioritize`)."""
    scores = list(map(_SCORE, scored_entries))  # the lowest and its count in C: cheaper than in the loop
    lowest = min(scores, default=0)
    at_lowest = scores.count(lowest)
    if not lowest:
        return [entry for entry in scored_entries if entry["Score"]]
    if 2 * at_lowest < len(scored_entries):
        return scored_entries
    return [
        host_priority(entry["Host"], entry["Score"] - lowest) for entry in scored_entries if entry["Score"] > lowest
    ]


# --- fragmentation ----------------------------------------------------------------------------------------

Choice = tuple[int, ...] | Placement | None
"""The GPUs a placement gives: positions in the node's devices for a plain demand (a Placement is made only for
the one node a bind chooses), a Placement for any other, None for a pod that asks no GPU."""
DIGITS = 9
"""Added fragmentation is rounded to a billionth of a GPU: sums of the same terms in another order differ in their
last bits, and equal nodes must tie (then the fullest, then the first by name, wins) rather than win by noise."""
FULLER = 1e-12
"""Weight of a node's free GPU in the values `narrow` compares: at most 256 GPUs x 1e-12 < 1e-9 (`DIGITS`), so it
orders only the nodes that add the same fragmentation."""
TIED = 5e-10
"""Values this close to the least add the same fragmentation (they differ by `FULLER` terms alone)."""
TABLE_ENTRIES = 400_000
"""Added fragmentation remembered per (pod ask, node), across asks: about 25 MB. At 1,000 nodes, the last 400
asks; at 5,000, the last 80 (a cluster's pods come in a few dozen shapes)."""


def added_fragmentation(
    ask: Ask, state: NodeState, classes: Classes, memo: FragmentMemo
) -> tuple[float, Choice] | None:
    """What placing the ask on this node adds to what the policy minimises (`fragmentation.py`), with the GPUs
    where it adds least; None when the ask does not fit on the node's GPUs now. Equal values go to the GPU with
    the least free memory (binpack), then the lower index. Pure: the node is not changed."""
    room = state.room()
    before = state.measure(classes, memo)
    cpu, memory = room.cpu - ask.cpu, room.memory - ask.memory
    demand = ask.demand
    if demand.is_zero:
        return round(memo.measure(cpu, memory, room.gpus, classes) - before, DIGITS), None
    chosen = (
        _plain_choice(demand, state, room.gpus, cpu, memory, classes, memo)
        if demand.plain
        else _general_choice(demand, state, cpu, memory, classes, memo)
    )
    if chosen is None:
        return None
    value, choice = chosen
    return round(value - before, DIGITS), choice


def _plain_choice(
    demand: Demand,
    state: NodeState,
    room: tuple[GpuRoom, ...],
    cpu: int,
    memory: int,
    classes: Classes,
    memo: FragmentMemo,
) -> tuple[float, tuple[int, ...]] | None:
    """Memory alone on `devices` GPUs: each GPU chosen in turn where it adds least (one GPU: the best one)."""
    need, gpus, free_list = demand.per_device, list(room), state.free
    taken: list[int] = []
    value = 0.0
    for _ in range(demand.devices):
        best: tuple[float, int, int] | None = None
        tried: set[GpuRoom] = set()
        for position, free in enumerate(free_list):
            if free < need or position in taken or gpus[position] in tried:
                continue  # a GPU in the same state as one tried gives the same value: the lower index stands
            tried.add(gpus[position])
            trial = gpus.copy()
            trial[position] = state.gpu_room(position, need)
            rank = (memo.measure(cpu, memory, tuple(trial), classes), free, position)
            if best is None or rank < best:
                best = rank
        if best is None:
            return None
        value, _, position = best
        taken.append(position)
        gpus[position] = state.gpu_room(position, need)
    return value, tuple(sorted(taken))


def _general_choice(
    demand: Demand, state: NodeState, cpu: int, memory: int, classes: Classes, memo: FragmentMemo
) -> tuple[float, Placement] | None:
    """Any other demand (compute, percentages, several containers, selectors): the general fit places it, each
    container on the GPUs where it alone adds least; the value is that of the whole placement."""
    room = state.room().gpus

    def rank(position: int, request: Request) -> float:
        trial = list(room)
        trial[position] = state.gpu_room(position, request.memory_on(state.devices[position]), request.cores)
        return memo.measure(cpu, memory, tuple(trial), classes)

    placed = place(demand, state.devices, usage_of(state), Strategy.BINPACK, "", rank)
    if isinstance(placed, Judgement):
        return None
    memory_taken = [0] * len(state.devices)
    cores_taken = [0] * len(state.devices)
    for grants in placed.containers:
        for grant in grants:
            position = state.position(grant.index)
            memory_taken[position] += grant.memory
            cores_taken[position] += grant.cores
    after = tuple(
        state.gpu_room(position, memory_taken[position], cores_taken[position])
        if memory_taken[position] or cores_taken[position]
        else gpu
        for position, gpu in enumerate(room)
    )
    return memo.measure(cpu, memory, after, classes), placed


def placement_of(demand: Demand, state: NodeState, choice: Choice) -> Placement | None:
    """The Placement a choice stands for on this node."""
    if choice is None or isinstance(choice, Placement):
        return choice
    grants = tuple(Grant(state.devices[p].index, demand.per_device, 0, state.devices[p].uuid) for p in choice)
    return Placement((grants,), 0)


def _values_table(ask: Ask, cache: Cache, states: Mapping[str, NodeState]) -> dict[str, float]:
    """The table of what this ask adds to each node (see `fragmentation_values`): remembered in the cache's
    `fragment_tables` until the node changes or the typical shapes are rebuilt (a fresh one for nodes the
    scheduler sent whole)."""
    if states is not cache.nodes:
        return {}
    tables = cache.fragment_tables
    tables.limit = max(8, TABLE_ENTRIES // max(len(states), 1))
    return tables.table(Question(f"{ask.key}:{cache.classes().version}"))


def fragmentation_values(ask: Ask, names: list[str], cache: Cache, states: Mapping[str, NodeState]) -> list[float]:
    """What placing `ask` adds to each named node's fragmentation (`inf` for an unknown node, or one the ask does
    not fit), plus `FULLER` x the node's free GPU: below the rounding of the added fragmentation, so it only
    orders nodes that add the same, the fuller first. Read in C when every node is remembered: a request over a
    thousand names costs a dictionary lookup a name when little changed since the same ask was last seen (a
    scan for the ones missing, "None in values", alone cost 0.1 us a name: a miss raises instead)."""
    table = _values_table(ask, cache, states)
    try:
        return list(map(table.__getitem__, names))
    except KeyError:
        pass
    classes, memo = cache.classes(), cache.fragments
    for name in names:
        if name not in table:
            state = states.get(name)
            added = None
            if state is not None and state.known and state.ready:
                added = added_fragmentation(ask, state, classes, memo)
            table[name] = math.inf if added is None or state is None else added[0] + FULLER * state.free_gpus
    return list(map(table.__getitem__, names))


def narrow(
    ask: Ask, names: list[str], cache: Cache, states: Mapping[str, NodeState], config: PolicyConfig
) -> list[str]:
    """Of the nodes that fit, those the filter passes under `config.narrowing` (see `Narrowing`): the nodes whose
    added fragmentation is within `config.tolerance` of the least, and with `BEST` the one of them whose GPUs are
    fullest, then the first by name. A pod that asks no GPU gets every node as good as the best and as full (the
    same added fragmentation and the same free GPU): nodes without GPUs, or whose GPUs are full, first, where its
    cpu strands nothing; kube-scheduler's own scores then spread such pods among them as users expect, instead of
    piling them on the first node by name. Measured on the trace's `cpu250` workload (fast mode, seed 45): 92.1 %
    of the GPUs allocated when the fullness was not part of the tie, 93.5 % now, as with one best node (the
    paper's FGD: 93.4 %); `default` and `gpushare100` unchanged (96.0 and 87.3 %).

    `BEST`, the default, runs in C but for ties: the fullness is in the values, so the best is `min`, and the
    nodes equal to it, found by `index` from the one before, are few (identical nodes) and compared by name.
    Measured in process at 1,000 names: `(value, name)` pairs in one `min` cost half as much again as this (a
    tuple compares its floats twice).
    """
    if config.narrowing is Narrowing.OFF or len(names) < 2:
        return names
    values = fragmentation_values(ask, names, cache, states)
    least = min(values)
    if least == math.inf:
        return names
    if ask.demand.is_zero:
        return list(compress(names, map(least.__eq__, values)))
    if config.narrowing is Narrowing.BEST and not config.tolerance:
        at = values.index(least)
        tied = [names[at]]
        try:
            while True:
                at = values.index(least, at + 1)
                tied.append(names[at])
        except ValueError:
            return [min(tied)]
    bound = least + config.tolerance + TIED
    near = list(compress(names, map(bound.__ge__, values)))
    if config.narrowing is Narrowing.TIES or len(near) == 1:
        return near
    return [min(near, key=lambda name: (states[name].free_gpus, name))]


def fragmentation_scores(
    ask: Ask, names: list[str], cache: Cache, states: Mapping[str, NodeState], config: PolicyConfig
) -> list[int]:
    """0..10 per node: 10 within `tolerance` of the least added fragmentation, then down to 0 for the most (in
    nine equal steps); 0 where the ask does not fit."""
    values = fragmentation_values(ask, names, cache, states)
    fitting = [value for value in values if value != math.inf]
    if not fitting:
        return [0] * len(names)
    best, most = min(fitting) + config.tolerance, max(fitting)
    span = most - best
    return [
        0
        if value == math.inf
        else MAX_EXTENDER_PRIORITY
        if value <= best
        else int((MAX_EXTENDER_PRIORITY - 1) * (most - value) / span)
        for value in values
    ]
