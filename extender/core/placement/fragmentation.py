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
from bisect import bisect_left, insort
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from itertools import compress
from typing import Any

import numpy as np

from extender.core.contract import MAX_EXTENDER_PRIORITY, HostPriorityEntry, host_priority
from extender.core.devices import Demand, Request, Strategy
from extender.core.holds import Grant
from extender.core.memo import Question
from extender.core.mig import MigInstance
from extender.core.nodes import NodeState
from extender.core.placement import topology
from extender.core.placement.arrays import ROW_BITS, KindRows
from extender.core.placement.batch import Floats, Ints, Kind, after, kind_of, measures, rounded
from extender.core.placement.config import Ask, Narrowing, PolicyConfig
from extender.core.placement.fill import Fill, shifted
from extender.core.placement.fit import Judgement, Placement, place
from extender.core.placement.judge import usage_of
from extender.core.placement.learned import Learned
from extender.core.placement.measure import (
    UNLIMITED,
    FragmentMemo,
    GpuRoom,
    gpu_room,
    uniform_measure,
    uniform_measurer,
)
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
ARRAY_SLICE = 2_500
"""Nodes judged in arrays between two turns of the event loop (`warming`), for a pod asking one GPU (a pod asking
n GPUs takes n steps a node: n times fewer nodes a slice): 11-13 ms at 8 GPUs a node on the developers'
2-core machine (measured), where the 50 ms that no request may hold the loop leaves room for a slower one and
for the requests waiting between two slices."""
SCALAR_SLICE = 150
"""Nodes judged one by one between two turns: about 12 ms for HAMi's nodes of 8 GPUs (measured)."""
BATCH_NODES = 16
"""Nodes of one kind from which they are judged in arrays (`batch.py`): below, numpy's fixed cost per call
(about 40 calls per typical shape) outweighs the Python it saves."""
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
    if ask.demand.is_zero or ask.demand.plain:
        kind = kind_of(state)
        if kind is not None:
            return _uniform_added(ask, state, kind, learned, classes)
    memo = learned.fragments
    room = learned.room(state)
    before = learned.measure(state, classes)
    cpu, memory = room.cpu - ask.cpu, room.memory - ask.memory
    demand = ask.demand
    if demand.is_zero:
        return round(memo.measure(cpu, memory, room.gpus, classes) - before, DIGITS), None
    chosen = (
        _plain_choice(demand, state, room.gpus, cpu, memory, classes, memo)
        if demand.plain and not state.mig
        else _general_choice(demand, state, room.gpus, cpu, memory, classes, memo)
    )
    if chosen is None:
        return None
    value, choice = chosen
    return round(value - before + _links(demand, state, choice), DIGITS), choice


def _links(demand: Demand, state: NodeState, choice: Choice) -> float:
    """`topology.link_term` of the GPUs chosen: 0 on a node without pair scores (every gpushare node), but for a
    topology-aware pod asking several GPUs, whose GPUs count as unlinked there."""
    if not demand.selectors.topology and not any(device.links for device in state.devices):
        return 0.0
    if isinstance(choice, Placement):
        positions = sorted({state.position(grant.index) for grants in choice.containers for grant in grants})
    else:
        positions = list(choice or ())
    return topology.link_term(demand, state, positions)


def _uniform_added(
    ask: Ask, state: NodeState, kind: Kind, learned: Learned, classes: Classes
) -> tuple[float, Choice] | None:
    """`added_fragmentation` of a plain demand (or none) on a node whose GPUs are all of one kind: the steps of
    `_plain_choice` on plain lists of free memory (`measure.uniform_measure`), the same numbers and GPUs."""
    _, capacity, model = kind
    free = state.free
    cpu0 = state.cpu_allocatable - state.cpu_requested if state.cpu_allocatable else UNLIMITED
    memory0 = state.memory_allocatable - state.memory_requested if state.memory_allocatable else UNLIMITED
    current = list(free)  # a GPU out of slots has none free already (`NodeState.free`)
    before = learned.remembered(state, classes)
    if before is None:
        before = uniform_measure(sorted(free), cpu0, memory0, capacity, model, classes)
        learned.remember(state, classes, before)
    measure = uniform_measurer(len(free), cpu0 - ask.cpu, memory0 - ask.memory, capacity, model, classes)
    demand = ask.demand
    if demand.is_zero:
        return round(measure(sorted(current)) - before, DIGITS), None
    need = demand.per_device
    base = [sorted(current)]  # the GPUs' free memory in order, as the pod's GPUs taken so far left it

    def value_with(position: int) -> float:
        trial = base[0].copy()
        del trial[bisect_left(trial, current[position])]
        insort(trial, _free_after(state, position, need))
        return measure(trial)

    def take(position: int) -> None:
        current[position] = _free_after(state, position, need)
        base[0] = sorted(current)

    chosen = _one_by_one(demand, free, current, value_with, take)
    return None if chosen is None else (round(chosen[0] - before, DIGITS), chosen[1])


def _free_after(state: NodeState, position: int, memory: int) -> int:
    """What a GPU of a uniform node has free once a pod takes `memory` more on it, none when that pod takes its
    last slot (`measure.gpu_room`'s free: the same rule, without the tuple)."""
    device = state.devices[position]
    if device.slots and state.used_slots[position] + 1 >= device.slots:
        return 0
    return max(state.free[position] - memory, 0)


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
    need, gpus = demand.per_device, list(room)

    def value_with(position: int) -> float:
        trial = gpus.copy()
        trial[position] = gpu_room(state, position, need)
        return memo.measure(cpu, memory, tuple(trial), classes)

    def take(position: int) -> None:
        gpus[position] = gpu_room(state, position, need)

    return _one_by_one(demand, state.free, gpus, value_with, take)


def _one_by_one(
    demand: Demand,
    free: Sequence[int],
    gpus: Sequence[Hashable],
    value_with: Callable[[int], float],
    take: Callable[[int], None],
) -> tuple[float, tuple[int, ...]] | None:
    """The GPUs of a plain demand chosen one at a time, each where the node's measure is least once the pod takes
    it (`value_with`; then `take` records it), ties to the GPU with less free memory, then the lower index; None
    when a GPU is missing. `gpus` are the GPUs' states as `take` leaves them (a state tried once is not tried
    again). Returns the measure with every GPU taken, and the GPUs' positions in order."""
    need = demand.per_device
    taken: list[int] = []
    value = 0.0
    for _ in range(demand.devices):
        best: tuple[float, int, int] | None = None
        tried: set[Hashable] = set()
        for position, available in enumerate(free):
            if available < need or position in taken or gpus[position] in tried:
                continue  # a GPU in the same state as one tried gives the same value: the lower index stands
            tried.add(gpus[position])
            rank = (value_with(position), available, position)
            if best is None or rank < best:
                best = rank
        if best is None:
            return None
        value, _, position = best
        taken.append(position)
        take(position)
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
    instances: list[list[MigInstance]] = [[] for _ in state.devices]
    for grants in placed.containers:
        for grant in grants:
            position = state.position(grant.index)
            memory_taken[position] += grant.memory
            cores_taken[position] += grant.cores
            if grant.instance is not None:
                instances[position].append(grant.instance)
    after = tuple(
        gpu_room(state, position, memory_taken[position], cores_taken[position], instances[position] or None)
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


def _values(ask: Ask, learned: Learned, classes: Classes) -> Floats:
    """What this ask adds to each of the cache's nodes, by slot (NaN: not judged since the node changed):
    remembered in `learned.values` until the node changes or the typical shapes are rebuilt."""
    values = learned.values
    values.limit = max(8, TABLE_ENTRIES // max(len(learned.cache.nodes), 1))
    return values.table(Question(f"{ask.key}:{classes.version}"), learned.arrays.capacity)


def _choices_table(ask: Ask, learned: Learned, states: Mapping[str, NodeState], classes: Classes) -> dict[str, Any]:
    """Beside each value of `_values`, the GPUs the ask would take there (a `Choice`, or a row of GPU positions
    from the arrays)."""
    if states is not learned.cache.nodes:
        return {}
    choices = learned.choices
    choices.limit = learned.values.limit
    return choices.table(Question(f"{ask.key}:{classes.version}"))


def choice_on(ask: Ask, state: NodeState, learned: Learned) -> Placement | None:
    """The GPUs the ask takes on this node, as the filter judged it there (remembered beside its value), or judged
    now: what an assumption of the filter's one node holds (`assume.py`)."""
    classes = learned.classes()
    own = learned.cache.nodes.get(state.name) is state
    found = _choices_table(ask, learned, learned.cache.nodes, classes).get(state.name) if own else None
    if found is None:
        added = added_fragmentation(ask, state, learned, classes)
        if added is None:
            return None
        found = added[1]
    if found is not None and not isinstance(found, tuple | Placement):
        found = tuple(found.tolist())
    return placement_of(ask.demand, state, found)


def fragmentation_values(
    ask: Ask, names: Sequence[str], learned: Learned, states: Mapping[str, NodeState], slots: Ints | None = None
) -> Floats:
    """What placing `ask` adds to each named node's fragmentation (`inf` for an unknown node, or one the ask does
    not fit), plus `FULLER` x the node's free GPU: below the rounding of the added fragmentation, so it only
    orders nodes that add the same, the fuller first.

    For the cache's nodes, read from the ask's table by slot (`slots`, the names' slots when the caller has
    them): one pass over the names in C to find their slots, the rest in arrays; only the nodes changed since
    the ask was last judged (nearly always the node the last bind changed) are judged again."""
    classes = learned.classes()
    if states is not learned.cache.nodes:
        return judged(ask, names, learned, states, classes)
    if slots is None:
        slots = learned.arrays.slots_of(names)
    table = _values(ask, learned, classes)
    found = table[slots]
    known = slots >= 0
    missing = np.flatnonzero(np.isnan(found) & known)
    if len(missing):
        values = judged(ask, [names[index] for index in missing.tolist()], learned, states, classes)
        table[slots[missing]] = values
        found[missing] = values
    found[~known] = np.inf
    return found


def warming(
    ask: Ask, names: Sequence[str], learned: Learned, states: Mapping[str, NodeState], slots: Ints | None = None
) -> Iterator[None] | None:
    """When what `ask` adds is missing on more of the named nodes than one slice judges (a new kind of pod, the
    typical shapes rebuilt, the first request after a start, nodes the scheduler never sent): an iterator that
    judges them a slice at a time, for its caller to give the event loop a turn after each; None when they are
    few enough to judge at once. So no request holds the loop while thousands of nodes are judged afresh, the
    scalar way above all (HAMi's nodes: a tenth of a millisecond each). What a slice judged stays in the table
    until its node changes; the filter that follows judges again what changed meanwhile."""
    if states is not learned.cache.nodes:
        return None
    if slots is None:
        slots = learned.arrays.slots_of(names)
    missing = np.isnan(_values(ask, learned, learned.classes())[slots]) & (slots >= 0)
    if np.count_nonzero(missing) <= SCALAR_SLICE:  # one slice, whichever way they are judged: the common case
        return None
    unjudged = list(compress(names, missing.tolist()))
    in_arrays = ask.demand.is_zero or ask.demand.plain
    codes = learned.arrays.rows_of(unjudged) if in_arrays else np.full(len(unjudged), -1, dtype=np.int64)
    by_arrays = (codes >= 0).tolist()
    arrays = list(compress(unjudged, by_arrays))
    one_by_one = [name for name, batched in zip(unjudged, by_arrays, strict=True) if not batched]
    per_slice = max(1, ARRAY_SLICE // max(ask.demand.devices, 1))
    if len(arrays) / per_slice + len(one_by_one) / SCALAR_SLICE <= 1:
        return None
    return _slices(ask, arrays, one_by_one, learned, states, per_slice)


def _slices(
    ask: Ask,
    arrays: list[str],
    one_by_one: list[str],
    learned: Learned,
    states: Mapping[str, NodeState],
    per_slice: int,
) -> Iterator[None]:
    chunks = [arrays[start : start + per_slice] for start in range(0, len(arrays), per_slice)]
    chunks += [one_by_one[start : start + SCALAR_SLICE] for start in range(0, len(one_by_one), SCALAR_SLICE)]
    for chunk in chunks:
        fragmentation_values(ask, chunk, learned, states)  # judges what of it is still missing
        yield


def judged(
    ask: Ask, names: Sequence[str], learned: Learned, states: Mapping[str, NodeState], classes: Classes
) -> Floats:
    """What placing `ask` adds to each named node (`inf` where it does not fit, or the node is unknown or not
    Ready), judged now: in arrays for the cache's nodes of a kind numerous enough to pay for them (`batch.py`,
    over the rows `arrays.py` keeps), one by one for the rest; the same numbers either way. The GPUs each would
    take are remembered beside (`choice_on`)."""
    choices = _choices_table(ask, learned, states, classes)
    if len(names) < BATCH_NODES:  # the common case, a node or two that changed: no arrays to set up
        return np.array([_judge_one(ask, name, learned, states, classes, choices) for name in names], dtype=np.float64)
    arrays = learned.arrays
    in_arrays = states is learned.cache.nodes and (ask.demand.is_zero or ask.demand.plain)
    codes = arrays.rows_of(names) if in_arrays else np.full(len(names), -1, dtype=np.int64)
    added = np.full(len(names), np.inf)
    by_kind = codes >> ROW_BITS
    done = np.zeros(len(names), dtype=np.bool_)
    for number in np.unique(by_kind[codes >= 0]).tolist():
        rows = arrays.numbered[number]
        mine = by_kind == number
        if np.count_nonzero(mine) < BATCH_NODES:
            continue
        index = codes[mine] & ((1 << ROW_BITS) - 1)
        was = _befores(rows, index, classes)
        then, chosen = after(
            rows.free[index],
            rows.slotted[index],
            rows.cpu[index] - ask.cpu,
            rows.memory[index] - ask.memory,
            ask.demand,
            rows.kind,
            classes,
        )
        added[mine] = rounded(then - was, DIGITS) + FULLER * rows.free_gpus[index]
        done |= mine
        if not ask.demand.is_zero:
            choices.update(zip(compress(names, mine.tolist()), chosen, strict=True))
    for index in np.flatnonzero(~done).tolist():
        added[index] = _judge_one(ask, names[index], learned, states, classes, choices)
    return added


def _judge_one(
    ask: Ask,
    name: str,
    learned: Learned,
    states: Mapping[str, NodeState],
    classes: Classes,
    choices: dict[str, Any],
) -> float:
    """`judged` the scalar way, for one node (`added_fragmentation`)."""
    state = states.get(name)
    if state is None or not state.known or not state.ready:
        return math.inf
    scalar = added_fragmentation(ask, state, learned, classes)
    if scalar is None:
        return math.inf
    choices[name] = scalar[1]
    return scalar[0] + FULLER * state.free_gpus


def _befores(rows: KindRows, index: Ints, classes: Classes) -> Floats:
    """The measure of each node (`index`: rows) as it is: remembered in its row, or computed for the rows that do
    not have it for this build of the typical shapes (and remembered there)."""
    stale = index[rows.build[index] != classes.version]
    if len(stale):
        _, capacity, model = rows.kind
        rows.measured[stale] = measures(rows.free[stale], rows.cpu[stale], rows.memory[stale], capacity, model, classes)
        rows.build[stale] = classes.version
    was: Floats = rows.measured[index]
    return was


class Fragmentation:
    """The fragmentation policy's answers to the verbs (see the module docstring)."""

    def __init__(self, config: PolicyConfig, learned: Learned, fill: Fill) -> None:
        self.config = config
        self.learned = learned
        self.fill = fill

    def narrow(
        self, ask: Ask, names: list[str], states: Mapping[str, NodeState], slots: Ints | None = None
    ) -> list[str]:
        """Of the nodes that fit, those the filter passes (`narrowing.narrowed`)."""
        if self.config.narrowing is Narrowing.OFF or len(names) < 2:
            return names
        values = fragmentation_values(ask, names, self.learned, states, slots)
        return narrowed(names, values, states, self.config, ask.demand.is_zero)

    def warming(
        self, ask: Ask, names: list[str], states: Mapping[str, NodeState], slots: Ints | None = None
    ) -> Iterator[None] | None:
        """What `narrow` would judge afresh, in slices, when that is much (`warming`)."""
        if self.config.narrowing is Narrowing.OFF or len(names) < 2:
            return None
        return warming(ask, names, self.learned, states, slots)

    def values(self, ask: Ask, names: Sequence[str], states: Mapping[str, NodeState]) -> Floats:
        """What placing the ask adds to each node's fragmentation, the fuller first among equals
        (`fragmentation_values`); `inf` where it does not fit. A pod asking no GPU: 0 wherever it goes."""
        if ask.demand.is_zero:
            return np.zeros(len(names))
        return fragmentation_values(ask, names, self.learned, states)

    def values_warming(self, ask: Ask, names: Sequence[str], states: Mapping[str, NodeState]) -> Iterator[None] | None:
        """What `values` would judge afresh, in slices, when that is much (`warming`)."""
        return None if ask.demand.is_zero else warming(ask, names, self.learned, states)

    def choose(self, demand: Demand, state: NodeState, ask: Ask | None) -> Placement | None:
        """The GPUs where the pod adds least (by fill for a pod that asks none, or whose ask is unknown): as the
        filter judged them on this node, when it did and the node has not changed since (`choice_on`)."""
        if ask is None or demand.is_zero:
            return self.fill.choose(demand, state, ask)
        return choice_on(ask, state, self.learned)

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
        values = fragmentation_values(ask, names, self.learned, states).tolist()
        ranked = scores(values, self.config.tolerance)
        return shifted([host_priority(name, score) for name, score in zip(names, ranked, strict=True)])
