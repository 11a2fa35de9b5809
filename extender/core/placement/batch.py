"""The fragmentation measure for many nodes at once, in arrays: what a filter over thousands of nodes needs.

`fragmentation.added_fragmentation` judges one node in Python: for each GPU the pod could take, the node's
measure after (`measure.py`), about a tenth of a millisecond a node whose memo is cold. A filter over 5,000
nodes the pod has not been judged on (a new kind of pod, a rebuilt workload, nodes that all changed) took half a
second that way. Here the same arithmetic runs over numpy arrays: the nodes of one kind (GPU count, memory per
GPU, model) in one array, every GPU the pod could take as one more axis, each typical shape's term added for all
of them at once.

Exactly the same numbers. Every float is computed by the same IEEE operations in the same order as the scalar
path (`measure._uniform`, written for this: the free GPU summed in ascending order of free memory, the groups'
weights read from prefix sums by how many GPUs each finds too small), the ties between GPUs broken by (measure,
free memory, position) as `_plain_choice` breaks them, and the result rounded as Python's `round` rounds
(`rounded`). `tests/core/placement/test_batch.py` holds the two paths equal on random clusters, bit for bit,
and the fast mode of `make bench-placement` places every pod of the trace alike either way.

Which nodes: those the scalar path judges with `measure._uniform` (every GPU of one memory size and model, and
no compute tracked: gpushare's nodes, nearly always), for a plain demand (memory alone) or none. Any other node
or demand goes the scalar way. Pure: reads node states and the typical shapes, writes nothing.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from extender.core.devices import Demand
from extender.core.nodes import NodeState
from extender.core.placement.measure import STARVED_WEIGHT
from extender.core.placement.workload import Classes, GpuKind

Ints = npt.NDArray[np.int64]
Floats = npt.NDArray[np.float64]
Bools = npt.NDArray[np.bool_]

Kind = tuple[int, int, str]
"""(GPU count, memory per GPU, model): nodes of one kind are judged in one array."""


def kind_of(state: NodeState) -> Kind | None:
    """The node's kind when its GPUs can be judged in arrays (all of one memory size and model, no compute
    tracked); None otherwise."""
    devices = state.devices
    if not devices:
        return None
    first = devices[0]
    capacity, model = first.capacity, first.model
    if capacity <= 0:
        return None
    for device in devices:
        if device.capacity != capacity or device.model != model or device.cores or device.profiles or device.links:
            return None
    return len(devices), capacity, model


def measures(free: Ints, cpu: Ints, memory: Ints, capacity: int, model: str, classes: Classes) -> Floats:
    """What the policy minimises (`measure.FragmentMemo.measure`) for nodes of one kind whose GPUs have `free`
    memory (any shape ending in the GPU axis; `cpu` and `memory` broadcast against the rest of it): the steps of
    `measure._uniform`, in its order, for every node at once."""
    ordered = np.sort(free, axis=-1)
    count = ordered.shape[-1]
    shape = ordered.shape[:-1]
    below = np.empty((*shape, count + 1), dtype=np.float64)
    below[..., 0] = 0.0
    total = np.zeros(shape, dtype=np.float64)
    for position in range(count):
        total = total + ordered[..., position] / capacity
        below[..., position + 1] = total
    cpu, memory = np.broadcast_to(cpu, shape), np.broadcast_to(memory, shape)
    kind = classes.kind(capacity, model)
    groups, last = len(kind.thresholds), kind.most_devices
    tables, pair = _prefixes(kind, cpu, memory, classes)
    flat = tables.ravel()
    base = pair * ((last + 1) * (groups + 1))  # where each node's pair's table starts in `flat`
    highs = np.searchsorted(np.array(kind.thresholds, dtype=np.int64), ordered, side="right")
    low = base
    taken = np.zeros(shape, dtype=np.float64)
    value = np.zeros(shape, dtype=np.float64)
    for k in range(count + 1):
        row = min(count - k, last) * (groups + 1)
        high = base + (highs[..., k] if k < count else groups)
        part = flat.take(high + row) - flat.take(low + row)
        taken = taken + part
        value = value + below[..., k] * part
        low = high
    value = value + total * (kind.weight - taken)
    cpu_rate, memory_rate = classes.rates(capacity)
    fed = total
    if cpu_rate > 0:
        fed = np.minimum(fed, cpu / cpu_rate)
    if memory_rate > 0:
        fed = np.minimum(fed, memory / memory_rate)
    measured: Floats = np.where(total != 0.0, value + STARVED_WEIGHT * (total - fed), 0.0)
    return measured


def _prefixes(kind: GpuKind, cpu: Ints, memory: Ints, classes: Classes) -> tuple[Floats, Ints]:
    """The kind's prefix tables (`GpuKind.prefixes`) of every pair of ranks the nodes have, stacked, and each
    node's pair in the stack."""
    cpu_ranks = np.searchsorted(np.array(classes.cpu_steps, dtype=np.int64), cpu, side="right")
    memory_ranks = np.searchsorted(np.array(classes.memory_steps, dtype=np.int64), memory, side="right")
    width = len(classes.memory_steps) + 1
    unique, inverse = np.unique(cpu_ranks * width + memory_ranks, return_inverse=True)
    tables = np.array(
        [kind.prefixes(classes, int(pair) // width, int(pair) % width) for pair in unique.tolist()], dtype=np.float64
    ).reshape(len(unique), kind.most_devices + 1, len(kind.thresholds) + 1)
    return tables, inverse.reshape(cpu.shape)


def after(
    free: Ints,
    slotted: Bools,
    cpu: Ints,
    memory: Ints,
    demand: Demand,
    kind: Kind,
    classes: Classes,
) -> tuple[Floats, Ints]:
    """For nodes of one kind (`free`, `slotted`: (nodes, GPUs); `cpu`, `memory`: what each has free once the pod's
    cpu and memory are taken), the measure once the pod (`demand`, plain or none) is placed on the GPUs where it
    adds least (`inf` where it does not fit), and those GPUs' positions, (nodes, GPUs asked): `_plain_choice`'s
    choice, to the bit, ties broken by (measure, free memory, position)."""
    _, capacity, model = kind
    if demand.is_zero:
        return measures(free, cpu, memory, capacity, model, classes), np.zeros((len(free), 0), dtype=np.int64)
    nodes, count = free.shape
    need = demand.per_device
    current = free.copy()
    taken = np.zeros((nodes, count), dtype=np.bool_)
    taking = np.where(slotted, 0, np.maximum(free - need, 0))
    eligible = free >= need
    fits = np.ones(nodes, dtype=np.bool_)
    chosen = np.zeros((nodes, demand.devices), dtype=np.int64)
    value = np.zeros(nodes, dtype=np.float64)
    every = np.arange(nodes)
    for step in range(demand.devices):
        candidates = eligible & ~taken
        # Only the GPUs the pod could take are tried (trial j takes GPU j), all of them in one array.
        node, gpu = np.nonzero(candidates)
        trials = current[node]
        trials[np.arange(len(node)), gpu] = taking[node, gpu]
        measured = np.full((nodes, count), np.inf)
        measured[node, gpu] = measures(trials, cpu[node], memory[node], capacity, model, classes)
        least = measured.min(axis=1)
        tied = candidates & (measured == least[:, None])
        freest = np.where(tied, free, np.iinfo(np.int64).max)
        tied &= freest == freest.min(axis=1)[:, None]
        position = np.argmax(tied, axis=1)  # the first: the lowest position of the equals
        fits &= candidates.any(axis=1)
        value = measured[every, position]
        chosen[:, step] = position
        current[every, position] = taking[every, position]
        taken[every, position] = True
    chosen.sort(axis=1)
    return np.where(fits, value, np.inf), chosen


def rounded(values: Floats, digits: int) -> Floats:
    """`round(value, digits)` of each, as Python rounds a float (to the nearest of its exact decimal value, ties
    to even), which numpy's `round` (scale, round, unscale) misses now and then by a last bit: numpy's answer
    wherever the scaled value is clearly away from a tie (further than its own rounding error could carry it),
    Python's own for the few that are not."""
    finite = np.isfinite(values)
    scale = 10.0**digits
    scaled = np.where(finite, values, 0.0) * scale
    result = np.where(finite, np.round(scaled) / scale, values)
    tie = np.abs(scaled - np.floor(scaled) - 0.5) < np.maximum(1e-6, 4 * np.spacing(np.abs(scaled)))
    for index in np.flatnonzero(finite & tie).tolist():
        result[index] = round(float(values[index]), digits)
    rounded_values: Floats = result
    return rounded_values
