"""Assumptions: the node a filter passed alone, held for its pod until its bind comes (`holds.HoldState.ASSUMED`).

Why. kube-scheduler tells an extender nothing of what it decided after a filter: it assumes the pod on the node in its
own cache and binds it later, asynchronously, while it filters the next pods. Under the fragmentation policy the filter
passes the one best node, and for a burst of pods of one kind that is the same node for each until the first bind lands:
the binds then find it full, fail, and kube-scheduler retries those pods (3 % of the binds of `make loadtest` before
this). So when a filter passes one node, the GPUs its pod would take there are counted as the bind will count them (the
same choice: `Placer.choose`), and the next filters judge the node as taken. The bind takes the assumption as its
decision where it still fits (below), else releases it and decides again on the node as it is (`binding.py`);
a filter of the same pod releases it first, so a pod never competes with itself; one whose bind does not come within
`ledger.ASSUMED_TTL` is dropped. Nothing is written for an assumption: a restart forgets them, which costs only the
protection.

Taken as the decision when the bind comes to that node, the typical shapes are those it was chosen by and it still
fits there (`Ledger.take_assumed`): a bind need not choose twice, nor move a pod the next pods of its burst were
placed around.

Only where the filter passed one node: when it passes several, kube-scheduler's own scores choose, and which
one is not known here.
"""

from __future__ import annotations

from extender.core.devices import Demand
from extender.core.holds import Allocation
from extender.core.ledger import Ledger
from extender.core.placement.config import Ask
from extender.core.placement.placer import Placer


def assume(uid: str, pod: str, node: str, demand: Demand, ask: Ask, placer: Placer, ledger: Ledger) -> bool:
    """Hold, as assumed, the GPUs the pod (`uid`, `pod` its `namespace/name`) would take on the node its filter
    passed alone; returns whether it is held (not for a pod asking no GPU, one already holding something, or a
    node it no longer fits)."""
    state = placer.cache.nodes.get(node)
    if not uid or demand.is_zero or state is None or not state.known:
        return False
    placed = placer.choose(demand, state, ask)
    if placed is None:
        return False
    return ledger.assume(Allocation(uid, pod, node, placed.containers, placed.init_containers), placer.build())
