"""A cache built afresh from the objects an incremental one was shown, and how the two differ.

The cache, the placement arrays, the fit index and the memos are kept current change by change; what they hold
must always be what a cache built in one go from the same Kubernetes objects (and the same reservations) holds.
`differences` names every way the two disagree, plus every device over capacity or MIG instance overlapping
another (`Cache.overcommitted`), so a state machine can assert it is empty after each step.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

from hypothesis import HealthCheck, Phase, settings

from extender.core.cache import Cache
from extender.core.holds import Allocation
from extender.core.nodes import NodeState
from extender.core.placement.config import Ask, PolicyConfig
from extender.core.placement.filtering import FilterOutcome
from extender.core.placement.learned import Learned
from extender.core.placement.measure import room_of
from extender.core.placement.placer import Placer
from extender.core.placement.workload import Workload
from extender.core.protocols import DeviceProtocol

PROFILE = "gpu-extender-property"
settings.register_profile(
    PROFILE,
    derandomize=True,
    deadline=None,
    database=None,
    print_blob=False,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
"""Deterministic (the same examples every run, none remembered between runs) and without a time bound per
example (two busy cores are not a failure)."""


SHRINK = bool(os.environ.get("PROPERTY_SHRINK"))
"""Shrink a failing example to the shortest (`PROPERTY_SHRINK=1`): minutes for a state machine, so not by default
(a mutation run meets many failures); the failure names what differs either way."""


def property_settings(max_examples: int, stateful_step_count: int = 50) -> settings:
    """The property tests' settings with this many examples (and steps per state machine run)."""
    phases = tuple(Phase) if SHRINK else tuple(phase for phase in Phase if phase is not Phase.shrink)
    return settings(
        settings.get_profile(PROFILE),
        max_examples=max_examples,
        stateful_step_count=stateful_step_count,
        phases=phases,
    )


SUMMARY = (
    "known",
    "ready",
    "devices",
    "unreadable",
    "used",
    "used_cores",
    "used_slots",
    "free",
    "free_desc",
    "capacity_desc",
    "largest_free",
    "largest_free_index",
    "capacity_total",
    "used_total",
    "stray",
    "fit_free",
    "cpu_allocatable",
    "memory_allocatable",
    "cpu_requested",
    "memory_requested",
    "free_gpus",
    "mig",
)
"""What `NodeState.refresh` derives, and what the node's objects give: equal in both caches, field by field."""


def rebuilt(
    protocol: DeviceProtocol,
    clock: Callable[[], float],
    nodes: Iterable[Any],
    pods: Iterable[Any],
    cache: Cache,
    unhealthy: dict[str, frozenset[int]] | None = None,
) -> Cache:
    """A cache built in one go from `nodes`, `pods` and the operators' lists of `unhealthy` GPUs, then given the
    reservations `cache` holds (what the ledger decided that the objects do not show yet), in the order it holds
    them."""
    fresh = Cache(protocol, clock=clock)
    fresh.replace_unhealthy(dict(unhealthy or {}))
    fresh.replace(list(nodes), list(pods))
    for uid, hold in cache.reserved.items():
        if fresh.hold_of(uid) is None:
            fresh.hold(hold)
    return fresh


LEFT_BEHIND = ("cpu_allocatable", "memory_allocatable")
"""What a deleted node's state keeps of the node, while pods still hold GPUs there (`Cache.apply_node` clears its
devices, not these): read for known nodes only, so not compared for the others."""


def as_listed(allocation: Allocation, state: NodeState) -> Allocation:
    """The allocation as a cache can know it on this node: on a node deleted while pods hold GPUs there, GPUs named
    by UUID keep the index they were resolved to in a cache that saw the node, and have none in a cache built after
    it went (both count them as held on no GPU of the node: `NodeState.stray`)."""
    if state.known:
        return allocation
    containers = tuple(
        tuple(replace(grant, index=-1) if grant.uuid else grant for grant in grants) for grants in allocation.containers
    )
    return replace(allocation, containers=containers)


def node_differences(name: str, mine: NodeState, theirs: NodeState) -> list[str]:
    fields = SUMMARY if mine.known else tuple(field for field in SUMMARY if field not in LEFT_BEHIND)
    found = [
        f"{name}.{field}: {getattr(mine, field)!r} kept, {getattr(theirs, field)!r} afresh"
        for field in fields
        if getattr(mine, field) != getattr(theirs, field)
    ]
    holds = {uid: (as_listed(hold.allocation, mine), hold.state) for uid, hold in mine.holds.items()}
    fresh_holds = {uid: (as_listed(hold.allocation, theirs), hold.state) for uid, hold in theirs.holds.items()}
    if holds != fresh_holds:
        found.append(f"{name}.holds: {holds} kept, {fresh_holds} afresh")
    occupied = [sorted(placements) for placements in mine.occupied] if mine.mig else []
    fresh_occupied = [sorted(placements) for placements in theirs.occupied] if theirs.mig else []
    if occupied != fresh_occupied:
        found.append(f"{name}.occupied: {occupied} kept, {fresh_occupied} afresh")
    if set(mine.blocked) != set(theirs.blocked):
        found.append(f"{name}.blocked: {mine.blocked} kept, {theirs.blocked} afresh")
    return found


def cache_differences(cache: Cache, fresh: Cache, needs: Iterable[int]) -> list[str]:
    """How the incremental cache differs from the fresh one: nodes and their summaries, pods, reservations, the
    fit index for each of `needs` (the one-GPU demands asked so far), plus every invariant broken in either."""
    found = [f"kept: {problem}" for problem in cache.overcommitted()]
    found += [f"afresh: {problem}" for problem in fresh.overcommitted()]
    if set(cache.nodes) != set(fresh.nodes):
        found.append(f"nodes: {sorted(cache.nodes)} kept, {sorted(fresh.nodes)} afresh")
    for name in sorted(cache.nodes.keys() & fresh.nodes.keys()):
        found += node_differences(name, cache.nodes[name], fresh.nodes[name])
    if set(cache.pods) != set(fresh.pods):
        found.append(f"pods: {sorted(cache.pods)} kept, {sorted(fresh.pods)} afresh")
    if cache.reserved.keys() != fresh.reserved.keys():
        found.append(f"reserved: {sorted(cache.reserved)} kept, {sorted(fresh.reserved)} afresh")
    for need in needs:
        fitting = cache.fit_index.fitting(need, cache.nodes)
        expected = {name for name, state in fresh.nodes.items() if state.fit_free >= need}
        if fitting != expected:
            found.append(f"fit index for {need}: {sorted(fitting)} kept, {sorted(expected)} afresh")
    return found


def arrays_differences(learned: Learned, fresh: Learned) -> list[str]:
    """How the incremental placement arrays differ from fresh ones: each node's slot and fit, whether it has a row
    and of which kind, the row's columns; and every measure remembered (in a row or beside it) under the current
    build of the typical shapes, against that measure computed afresh."""
    found = []
    arrays, fresh_arrays = learned.arrays, fresh.arrays
    cache = learned.cache
    if set(arrays.slot_of) != set(cache.nodes):
        found.append(f"slots: {sorted(arrays.slot_of)}, nodes: {sorted(cache.nodes)}")
    for name, state in cache.nodes.items():
        slot = arrays.slot_of.get(name)
        if slot is not None and arrays.fit_free[slot] != state.fit_free:
            found.append(f"{name}: fit_free {arrays.fit_free[slot]} in its slot, {state.fit_free} afresh")
        rows, fresh_rows = arrays.located.get(name), fresh_arrays.located.get(name)
        if (rows is None) != (fresh_rows is None) or (rows and fresh_rows and rows.kind != fresh_rows.kind):
            found.append(f"{name}: row of {rows and rows.kind} kept, {fresh_rows and fresh_rows.kind} afresh")
            continue
        if rows is None or fresh_rows is None:
            continue
        row, fresh_row = rows.row_of[name], fresh_rows.row_of[name]
        if rows.states[row] is not state:
            found.append(f"{name}: its row {row} holds {rows.states[row].name}'s state")
        if arrays.codes.get(name) != rows.number << 32 | row:
            found.append(f"{name}: code {arrays.codes.get(name)} for row {row} of kind {rows.number}")
        room = room_of(state)
        summary = (list(state.free), room.cpu, room.memory, state.free_gpus)
        written = (rows.free[row].tolist(), int(rows.cpu[row]), int(rows.memory[row]), float(rows.free_gpus[row]))
        if written != summary:
            found.append(f"{name}: row (free, cpu, memory, free GPU) {written}, the node's {summary}")
        for column in ("free", "slotted", "cpu", "memory", "free_gpus"):
            kept, afresh = getattr(rows, column)[row], getattr(fresh_rows, column)[fresh_row]
            if not (kept == afresh).all():
                found.append(f"{name}.{column}: {kept} kept, {afresh} afresh")
    for kind, rows in arrays.kinds.items():
        if rows.size != len(rows.row_of) or sorted(rows.row_of.values()) != list(range(rows.size)):
            found.append(f"kind {kind}: {rows.size} rows, {rows.row_of}")
    for name, state in cache.nodes.items():
        if state.known and name in fresh.cache.nodes and learned.room(state) != room_of(fresh.cache.nodes[name]):
            found.append(f"{name}: room {learned.room(state)} remembered, {room_of(fresh.cache.nodes[name])} afresh")
    classes = learned.workload.built
    for name, state in cache.nodes.items():
        remembered = learned.remembered(state, classes)
        if remembered is not None and name in fresh.cache.nodes:
            afresh = fresh.measure(fresh.cache.nodes[name], classes)
            if remembered != afresh:
                found.append(f"{name}: measure {remembered} remembered, {afresh} afresh")
    return found


def workload_differences(learned: Learned, expected: Workload) -> list[str]:
    """How the learned workload differs from one that observed the same pods, at the same times."""
    workload = learned.workload
    if (workload.weights, workload.observed) != (expected.weights, expected.observed):
        learned_now = f"{workload.observed} pods {workload.weights}"
        return [f"workload: {learned_now} learned, {expected.observed} pods {expected.weights} expected"]
    return []


def fresh_placer(fresh: Cache, learned: Learned, config: PolicyConfig) -> Placer:
    """A placer over the fresh cache that knows the workload as `learned` knows it (its observations and its
    build of the typical shapes: a cache built afresh would learn only the pods still there)."""
    fresh_learned = Learned(fresh)
    fresh_learned.workload = copy.deepcopy(learned.workload)
    return Placer(fresh, config, fresh_learned)


def outcome_of(placer: Placer, ask: Ask, names: list[str]) -> tuple[list[str], dict[str, str], dict[str, str]]:
    """What the filter passes of `names`, and why it fails or rules out the others."""
    outcome: FilterOutcome = placer.filter(ask.demand, list(names), placer.cache.nodes, "default/asked", ask)
    return list(outcome.passed), dict(outcome.failed), dict(outcome.unresolvable)


def scores_of(placer: Placer, ask: Ask, names: list[str]) -> list[tuple[str, int]]:
    """What prioritize scores each of `names`."""
    return [(entry["Host"], entry["Score"]) for entry in placer.prioritize(ask.demand, names, placer.cache.nodes, ask)]
