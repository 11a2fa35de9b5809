"""Whether a pod fits on one node now, and if not, why, in words a person can act on.

`judge` answers for one node: FITS, FAILED (not now; evicting pods could make room) or UNRESOLVABLE (no GPU here
could ever hold it: preemption cannot help), with the reason and its cause in one word (`fit.Cause`, the label
of the rejection metric). A plain demand (memory alone, any GPU) is answered from the node's summary
(`nodes.NodeState`) in a few attribute reads; any other goes to the general fit (`fit.py`). Pure: nothing here
changes the cache.
"""

from __future__ import annotations

from extender.core.devices import Demand, Strategy
from extender.core.nodes import NodeState
from extender.core.placement.fit import FITS, Cause, Judgement, Usage, Verdict, place

NOT_IN_CACHE = "node is not in the extender's cache (yet)"
ROOM = frozenset({Cause.MEMORY, Cause.COMPUTE, Cause.SLOTS, Cause.EXCLUSIVE, Cause.NUMA, Cause.SLICES})
"""Refusals for room on the GPUs: those an eviction could help, unlike a lock or a node not Ready."""


def judge(demand: Demand, state: NodeState | None, unit: str, pod: str = "") -> Judgement:
    """Whether the demand fits on the node now, and if not, a reason a person can act on and its cause. `pod`
    (`namespace/name`) is the pod asking: a device plugin's lock held for it does not keep it off the node."""
    if state is None or not state.known:
        return Judgement(Verdict.FAILED, NOT_IN_CACHE, Cause.NOT_IN_CACHE)
    if not demand.plain or state.mig:  # MIG: instances, not memory alone (`fit.py`)
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
    if not state.mig and not state.blocked:
        return Usage(list(state.used), list(state.used_cores), list(state.used_slots))
    occupied = [list(placements) for placements in state.occupied]
    return Usage(list(state.used), list(state.used_cores), list(state.used_slots), occupied, dict(state.blocked))


def _judge_general(demand: Demand, state: NodeState, unit: str, pod: str) -> Judgement:
    if not state.devices:
        return Judgement(Verdict.UNRESOLVABLE, _no_gpus(state), Cause.NO_GPUS)
    placed = place(demand, state.devices, usage_of(state), demand.device_strategy or Strategy.BINPACK, unit)
    if isinstance(placed, Judgement):
        return placed
    return _unavailable(state, pod) or FITS
