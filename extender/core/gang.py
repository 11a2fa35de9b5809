"""All or nothing: every pending member of a group planned at once (which node, which GPUs), or why not.

Pure: the plan is made on a scratch copy of the nodes it touches, never on the cache. Each member is judged and
given GPUs by the same functions a single pod's filter and bind use (`judge.judge`, and the policy's choice,
`fill.fill_choice` by default), against the node as the members planned before it left it: each planned member
is added to the scratch node as a hold and its summary recomputed by `NodeState.refresh`, so two members never
take the same GPU memory, compute, slot or MIG slices. A member's own holds (an assumption from an earlier
filter) are given back first, as the ledger's re-check gives a pod's own hold back.

The order is greedy, largest first, which keeps it simple and every answer reproducible:
- members largest first (GPUs asked, then GPU memory, percentage and compute per GPU, then cpu and memory), ties
  by pod name;
- each on the best node for it by the placement policy (`rank`: its values over the nodes as they are, those the
  plan changed judged again, ties in the order given; `jobs.py` gives `Placer.values`), or on the first in the
  order given without one (by name when none is), that takes its GPUs now (`judge`), has its cpu and memory free
  (as kube-scheduler's NodeResourcesFit counts a node's requests against its allocatable, 0 allocatable meaning
  "not reported": no limit), is among the nodes the member may use, and where the choice gives it GPUs.
This is greedy, not the best packing: a group it refuses might fit another way. It never plans what does not fit.

kube-scheduler's own filters (taints, affinity, pod count) are not known here: a member's `nodes` narrows where it
may go (the nodes kube-scheduler passed for it, or for a pod of the same template).
"""

from __future__ import annotations

from collections import ChainMap
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from extender.core.devices import Demand, Strategy
from extender.core.holds import Allocation, Hold, HoldState
from extender.core.nodes import NodeState
from extender.core.placement.batch import Floats
from extender.core.placement.fill import fill_choice
from extender.core.placement.fit import Placement, Verdict, describe
from extender.core.placement.judge import judge

Choose = Callable[[Demand, NodeState], Placement | None]
"""The GPUs a pod gets on a node, or None (`Placer.choose` with the pod's ask, or `binpack`)."""


Rank = Callable[["Member", Sequence[str], Mapping[str, NodeState]], Floats]
"""The placement policy's values of the named nodes for a member (the best lowest, `inf` where it does not fit):
`Placer.values` with the member's ask."""


def binpack(demand: Demand, state: NodeState) -> Placement | None:
    """The fill policy's binpack choice (`fill.fill_choice`), or the pod's own strategy where it asks one."""
    return fill_choice(demand, state, demand.device_strategy or Strategy.BINPACK)


@dataclass(frozen=True, slots=True)
class Member:
    """A pending member of a group: what it asks of a node."""

    uid: str
    pod: str
    """`namespace/name`."""
    demand: Demand
    cpu: int = 0
    """Millicores requested."""
    memory: int = 0
    """Bytes requested."""
    nodes: frozenset[str] | None = None
    """The nodes it may go to (None: any)."""


@dataclass(frozen=True, slots=True)
class Plan:
    """Where every member goes: one allocation each, in the members' order."""

    allocations: tuple[Allocation, ...]
    left: Mapping[str, NodeState]
    """The nodes as the plan leaves them (the scratch copies over the nodes given): the next plan's input."""

    def node_of(self, uid: str) -> str | None:
        return next((allocation.node for allocation in self.allocations if allocation.pod_uid == uid), None)


@dataclass(frozen=True, slots=True)
class NoPlan:
    """The group does not fit now."""

    reason: str
    """"job team/train-7 needs 8 pods of 1 GPU with 100 % of its memory; 5 fit now"."""
    fit: int
    """How many of its members first fit placed (the others found no node)."""


def plan_group(
    job: str,
    members: Sequence[Member],
    states: Mapping[str, NodeState],
    unit: str,
    choose: Choose = binpack,
    names: Sequence[str] | None = None,
    refusal: Callable[[Demand], str | None] | None = None,
    rank: Rank | None = None,
) -> Plan | NoPlan:
    """Every member's node and GPUs, all on the nodes as they are now, or why the group does not fit (`job` names
    it in the reason). `names`: the nodes to try (default: every node of `states`), in this order, or, with `rank`,
    ties among the policy's values broken in this order. `refusal`: why the nodes' device plugin could run a demand
    nowhere (`DeviceProtocol.refusal`): a member it refuses refuses the group, for that reason, before any node is
    tried."""
    if refusal is not None:
        for member in members:
            refused = refusal(member.demand)
            if refused:
                return NoPlan(f"job {job}: pod {member.pod} {refused}", 0)
    scratch = _without_own(members, states)
    order = sorted(states) if names is None else list(names)
    ranking = _Ranking(rank, order, states, scratch) if rank is not None else None
    planned: dict[str, Allocation] = {}
    tried_for: dict[tuple[object, ...], set[str]] = {}
    for member in sorted(members, key=largest_first):
        ask = (member.demand, member.cpu, member.memory, member.nodes)
        tried = tried_for.setdefault(ask, set())
        candidates = order if ranking is None else ranking.best_first(member, ask)
        allocation = _first_fit(member, candidates, tried, states, scratch, unit, choose)
        if allocation is not None:
            planned[member.uid] = allocation
    if len(planned) < len(members):
        return NoPlan(f"job {job} needs {_shapes(members, unit)}; {len(planned)} fit now", len(planned))
    return Plan(tuple(planned[member.uid] for member in members), ChainMap(scratch, dict(states)))


class _Ranking:
    """Each member's nodes best first by the placement policy, the plan so far counted: the policy's values over
    the nodes as they are (once per ask: over the cache's nodes, as cheap as a filter's narrowing), those of the
    nodes the plan changed judged again on their scratch copies (a few), ties by the order given. Members are so
    placed where the policy would place them one by one; first fit by node name cost the gang replay's fill-up
    3 to 7 points of the GPUs allocated."""

    def __init__(
        self, rank: Rank, order: list[str], states: Mapping[str, NodeState], scratch: dict[str, NodeState]
    ) -> None:
        self.rank = rank
        self.order = order
        self.states = states
        self.scratch = scratch
        self.position = {name: index for index, name in enumerate(order)}
        self.base: dict[tuple[object, ...], Floats] = {}
        self.fresh: dict[tuple[tuple[object, ...], str, int], float] = {}
        """A changed node's value per ask, by the number of holds on its scratch copy (a plan only adds holds): each
        member judges afresh only the node the member before it changed, not every node the plan changed."""

    def best_first(self, member: Member, ask: tuple[object, ...]) -> Iterator[str]:
        base = self.base.get(ask)
        if base is None:
            base = self.base[ask] = np.asarray(self.rank(member, self.order, self.states), dtype=np.float64)
        values = base
        changed = [name for name in self.scratch if name in self.position]
        if changed:
            values = base.copy()
            stale = [name for name in changed if (ask, name, len(self.scratch[name].holds)) not in self.fresh]
            if stale:
                for name, value in zip(stale, self.rank(member, stale, self.scratch).tolist(), strict=True):
                    self.fresh[ask, name, len(self.scratch[name].holds)] = value
            values[[self.position[name] for name in changed]] = [
                self.fresh[ask, name, len(self.scratch[name].holds)] for name in changed
            ]
        for index in np.argsort(values, kind="stable").tolist():
            if values[index] == np.inf:
                return
            yield self.order[index]


def largest_first(member: Member) -> tuple[object, ...]:
    """The order members are planned in: the largest first (GPUs asked, GPU memory, percentage and compute per
    GPU, cpu, memory), then by pod name."""
    demand = member.demand
    requests = demand.requests
    return (
        -sum(request.devices for request in requests),
        -demand.memory,
        -sum(request.percent * request.devices for request in requests),
        -sum(request.cores * request.devices for request in requests),
        -member.cpu,
        -member.memory,
        member.pod,
        member.uid,
    )


def _copy(state: NodeState) -> NodeState:
    """A scratch node: the same devices and holds (the dict copied), its summary recomputed by `refresh`."""
    copy = NodeState(
        state.name,
        state.devices,
        state.known,
        state.ready,
        state.unreadable,
        state.lock,
        dict(state.holds),
        cpu_allocatable=state.cpu_allocatable,
        memory_allocatable=state.memory_allocatable,
        cpu_requested=state.cpu_requested,
        memory_requested=state.memory_requested,
    )
    copy.refresh()
    return copy


def _without_own(members: Sequence[Member], states: Mapping[str, NodeState]) -> dict[str, NodeState]:
    """Scratch copies of the nodes where a member holds something already, without those holds."""
    uids = {member.uid for member in members}
    scratch: dict[str, NodeState] = {}
    for name, state in states.items():
        own = uids.intersection(state.holds)
        if own:
            copy = scratch[name] = _copy(state)
            for uid in own:
                del copy.holds[uid]
            copy.refresh()
    return scratch


def _first_fit(
    member: Member,
    candidates: Iterable[str],
    refused: set[str],
    states: Mapping[str, NodeState],
    scratch: dict[str, NodeState],
    unit: str,
    choose: Choose,
) -> Allocation | None:
    """The member placed on the first of `candidates` that takes it, recorded on that node's scratch copy (or
    None). `refused`: the nodes that refused an earlier member asking the same, skipped, and added to: planning only
    takes room, so a node that refused this ask refuses it for every later member too. A job of many alike members
    that does not fit then costs one pass over the nodes, not one per member (64 members on 5,000 full nodes:
    736 ms before)."""
    demand = member.demand
    for name in candidates:
        if name in refused:
            continue
        if member.nodes is not None and name not in member.nodes:
            continue
        state = scratch.get(name) or states.get(name)
        placement: Placement | None = None
        if (
            state is not None
            and _room(state, member)
            and judge(demand, state, unit, member.pod).verdict is Verdict.FITS
        ):
            placement = Placement((), 0) if demand.is_zero else choose(demand, state)
        if state is None or placement is None:
            refused.add(name)
            continue
        allocation = Allocation(member.uid, member.pod, name, placement.containers, placement.init_containers)
        copy = scratch.get(name) or scratch.setdefault(name, _copy(state))
        copy.holds[member.uid] = Hold(allocation, HoldState.RESERVED, since=0.0)
        copy.cpu_requested += member.cpu
        copy.memory_requested += member.memory
        copy.refresh()
        return allocation
    return None


FITS = Verdict.FITS


def _room(state: NodeState, member: Member) -> bool:
    return short_of(state, member.cpu, member.memory) is None


def short_of(state: NodeState, cpu: int, memory: int) -> str | None:
    """What of a pod's cpu (millicores) and memory (bytes) the node's requests leave no room for ("cpu",
    "memory", or None when both fit), as kube-scheduler's NodeResourcesFit counts: the requests of the pods on it
    against its allocatable, 0 allocatable meaning "not reported" (no limit)."""
    if state.cpu_allocatable and state.cpu_requested + cpu > state.cpu_allocatable:
        return "cpu"
    if state.memory_allocatable and state.memory_requested + memory > state.memory_allocatable:
        return "memory"
    return None


def shape(demand: Demand, unit: str) -> str:
    """What one pod asks, for people: "1 GPU with 4 GiB", "2 GPUs with 50 % of its memory each"."""
    if demand.is_zero:
        return "no GPU"
    parts = []
    for request in demand.requests:
        gpus = "1 GPU" if request.devices == 1 else f"{request.devices} GPUs"
        each = " each" if request.devices > 1 else ""
        init = " (init)" if request.init else ""
        parts.append(f"{gpus} with {describe(request, unit)}{each}{init}")
    return " + ".join(parts)


def _shapes(members: Sequence[Member], unit: str) -> str:
    """ "8 pods of 1 GPU with 4 GiB", or "8 pods (6 of 1 GPU with 4 GiB, 2 of 2 GPUs with 8 GiB each)"."""
    counted: dict[str, int] = {}
    for member in sorted(members, key=largest_first):
        said = shape(member.demand, unit)
        counted[said] = counted.get(said, 0) + 1
    pods = f"{len(members)} pod" + ("s" if len(members) != 1 else "")
    if len(counted) == 1:
        return f"{pods} of {next(iter(counted))}"
    return f"{pods} (" + ", ".join(f"{count} of {said}" for said, count in counted.items()) + ")"
