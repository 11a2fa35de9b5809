"""The fragmentation policy (the default): each pod goes where the GPU capacity left unusable for the pods the
cluster runs grows least, on the GPUs where it grows least.

For one pod and one node: `added_fragmentation` places the pod's ask on the node's GPUs in turn and measures the
node after (`measure.py`, against the typical shapes `learned.py` keeps), keeping the GPUs where the measure
grows least. For a filter: `fragmentation_values` does that for every node named, remembered per (ask, node)
until the node changes, and `narrowing.py` passes the best of them. For a bind: the same GPUs, as a Placement.
A pod that asks its own strategy, or no GPU at bind, is placed by fill (`fill.py`). Pure but for the memos.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from extender.core.contract import MAX_EXTENDER_PRIORITY, HostPriorityEntry, host_priority
from extender.core.devices import Demand, Request, Strategy
from extender.core.holds import Grant
from extender.core.memo import Question
from extender.core.nodes import NodeState
from extender.core.placement.config import Ask, Narrowing, PolicyConfig
from extender.core.placement.fill import Fill, shifted
from extender.core.placement.fit import Judgement, Placement, place
from extender.core.placement.judge import usage_of
from extender.core.placement.learned import Learned
from extender.core.placement.measure import FragmentMemo, GpuRoom, gpu_room
from extender.core.placement.narrowing import narrowed, scores
from extender.core.placement.workload import Classes

Choice = tuple[int, ...] | Placement | None
"""The GPUs a placement gives: positions in the node's devices for a plain demand (a Placement is made only for
the one node a bind chooses), a Placement for any other, None for a pod that asks no GPU."""
DIGITS = 9
"""Added fragmentation is rounded to a billionth of a GPU: sums of the same terms in another order differ in their
last bits, and equal nodes must tie (then the fullest, then the first by name, wins) rather than win by noise."""
FULLER = 1e-12
"""Weight of a node's free GPU in the values `narrow` compares: at most 256 GPUs x 1e-12 < 1e-9 (`DIGITS`), so it
orders only the nodes that add the same fragmentation."""
TABLE_ENTRIES = 400_000
"""Added fragmentation remembered per (pod ask, node), across asks: about 25 MB. At 1,000 nodes, the last 400
asks; at 5,000, the last 80 (a cluster's pods come in a few dozen shapes)."""


def added_fragmentation(
    ask: Ask, state: NodeState, learned: Learned, classes: Classes | None = None
) -> tuple[float, Choice] | None:
    """What placing the ask on this node adds to what the policy minimises (`measure.py`), with the GPUs where it
    adds least; None when the ask does not fit on the node's GPUs now. Equal values go to the GPU with the least
    free memory (binpack), then the lower index. Pure: the node is not changed."""
    classes = classes if classes is not None else learned.classes()
    memo = learned.fragments
    room = learned.room(state)
    before = learned.measure(state, classes)
    cpu, memory = room.cpu - ask.cpu, room.memory - ask.memory
    demand = ask.demand
    if demand.is_zero:
        return round(memo.measure(cpu, memory, room.gpus, classes) - before, DIGITS), None
    chosen = (
        _plain_choice(demand, state, room.gpus, cpu, memory, classes, memo)
        if demand.plain
        else _general_choice(demand, state, room.gpus, cpu, memory, classes, memo)
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
            trial[position] = gpu_room(state, position, need)
            rank = (memo.measure(cpu, memory, tuple(trial), classes), free, position)
            if best is None or rank < best:
                best = rank
        if best is None:
            return None
        value, _, position = best
        taken.append(position)
        gpus[position] = gpu_room(state, position, need)
    return value, tuple(sorted(taken))


def _general_choice(
    demand: Demand,
    state: NodeState,
    room: tuple[GpuRoom, ...],
    cpu: int,
    memory: int,
    classes: Classes,
    memo: FragmentMemo,
) -> tuple[float, Placement] | None:
    """Any other demand (compute, percentages, several containers, selectors): the general fit places it, each
    container on the GPUs where it alone adds least; the value is that of the whole placement."""

    def rank(position: int, request: Request) -> float:
        trial = list(room)
        trial[position] = gpu_room(state, position, request.memory_on(state.devices[position]), request.cores)
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
        gpu_room(state, position, memory_taken[position], cores_taken[position])
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


def _values_table(ask: Ask, learned: Learned, states: Mapping[str, NodeState], classes: Classes) -> dict[str, float]:
    """The table of what this ask adds to each node (see `fragmentation_values`): remembered in `learned.tables`
    until the node changes or the typical shapes are rebuilt (a fresh one for nodes the scheduler sent whole)."""
    if states is not learned.cache.nodes:
        return {}
    tables = learned.tables
    tables.limit = max(8, TABLE_ENTRIES // max(len(states), 1))
    return tables.table(Question(f"{ask.key}:{classes.version}"))


def fragmentation_values(ask: Ask, names: list[str], learned: Learned, states: Mapping[str, NodeState]) -> list[float]:
    """What placing `ask` adds to each named node's fragmentation (`inf` for an unknown node, or one the ask does
    not fit), plus `FULLER` x the node's free GPU: below the rounding of the added fragmentation, so it only
    orders nodes that add the same, the fuller first. Read in C when every node is remembered: a request over a
    thousand names costs a dictionary lookup a name when little changed since the same ask was last seen (a
    scan for the ones missing, "None in values", alone cost 0.1 us a name: a miss raises instead)."""
    classes = learned.classes()
    table = _values_table(ask, learned, states, classes)
    try:
        return list(map(table.__getitem__, names))
    except KeyError:
        pass
    for name in names:
        if name not in table:
            state = states.get(name)
            added = None
            if state is not None and state.known and state.ready:
                added = added_fragmentation(ask, state, learned, classes)
            table[name] = math.inf if added is None or state is None else added[0] + FULLER * state.free_gpus
    return list(map(table.__getitem__, names))


class Fragmentation:
    """The fragmentation policy's answers to the verbs (see the module docstring)."""

    def __init__(self, config: PolicyConfig, learned: Learned, fill: Fill) -> None:
        self.config = config
        self.learned = learned
        self.fill = fill

    def narrow(self, ask: Ask, names: list[str], states: Mapping[str, NodeState]) -> list[str]:
        """Of the nodes that fit, those the filter passes (`narrowing.narrowed`)."""
        if self.config.narrowing is Narrowing.OFF or len(names) < 2:
            return names
        values = fragmentation_values(ask, names, self.learned, states)
        return narrowed(names, values, states, self.config, ask.demand.is_zero)

    def choose(self, demand: Demand, state: NodeState, ask: Ask | None) -> Placement | None:
        """The GPUs where the pod adds least (by fill for a pod that asks none, or whose ask is unknown)."""
        if ask is None or demand.is_zero:
            return self.fill.choose(demand, state, ask)
        added = added_fragmentation(ask, state, self.learned)
        return placement_of(demand, state, added[1]) if added is not None else None

    def prioritize(
        self, demand: Demand, names: list[str], states: Mapping[str, NodeState], ask: Ask | None
    ) -> list[HostPriorityEntry]:
        """With narrowing, the nodes the filter would pass score 10, the rest 0: kube-scheduler calls prioritize
        only when the filter passed several (ties), so this is the same answer, at the cost of the filter's own.
        Without, 0..10 by what the pod adds to each (`narrowing.scores`)."""
        if ask is None:
            return self.fill.prioritize(demand, names, states, ask)
        if self.config.narrowing is not Narrowing.OFF:
            best = self.narrow(ask, names, states)
            if len(best) == len(names):
                return []  # all alike: nothing to add to any
            if len(best) == 1:
                return [host_priority(best[0], MAX_EXTENDER_PRIORITY)]
            chosen = set(best)
            return [host_priority(name, MAX_EXTENDER_PRIORITY) for name in names if name in chosen]
        values = fragmentation_values(ask, names, self.learned, states)
        ranked = scores(values, self.config.tolerance)
        return shifted([host_priority(name, score) for name, score in zip(names, ranked, strict=True)])
