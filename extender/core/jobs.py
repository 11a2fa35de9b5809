"""Jobs placed whole: the filter and the bind of a pod that starts with others (`groups.py` reads who does).

A member's filter, when its job lacks members bound (its minimum, `Group.gang`):
- **Its job holds GPUs already** (`Ledger.group_hold`): the member is passed the node planned for it, and only
  that node. A member past the job's minimum waits until the minimum has started.
- **Its job holds nothing**: every member still to place is planned at once (`gang.plan_group`, greedy,
  largest first, on the nodes kube-scheduler sent for this pod, each member's tried in the order the placement
  policy prefers for it with the members before it planned (`Placer.values`), with the policy's choice of GPUs), and
  the ledger holds all their GPUs together or none (`Ledger.reserve_group`: room, MIG instances and the
  namespace's quota, summed). The member asking is passed its planned node; each other member, filtered next, is
  passed its own. If the job does not fit, every member is refused, with the reason ("job team/train-7 needs 8
  pods of 1 GPU with 4 GiB; 5 fit now"), and nothing is held.
- **Its job cannot start yet** (fewer members than its minimum exist, some gated) or its members disagree on its
  size: refused, with why.
A member that asks no GPU (a launcher, a parameter server on cpu) is placed as any pod and counts toward the
minimum as placed: what is held whole is the job's GPUs.
Refusals of members are unresolvable for kube-scheduler: preempting pods for one member frees nothing the job
can use, so kube-scheduler is told not to try (preemption for a whole job is not done).

Two jobs never hold parts of what each needs: a job's holds are recorded all or none in one synchronous step,
against what the other jobs' holds left. The holds of a job whose members do not all come to bind within
`Settings.group_hold_ttl` are let go together (`Ledger.expire_groups`), and so are those of a job one of whose
waiting members is deleted; a member's bind that fails for sure lets go of its job's others (`binding.py`). The
job is then planned again at its next member's filter, its members bound counted.

The members' cpu and memory are held with their GPUs: their holds count their requests on the nodes planned for
them, and while one waits to bind, a pod that is not one of them is refused a node whose cpu or memory left it
would take (`HeldRoom` at its filter, `crowds` again at its bind, for a filter that came before the plan).
kube-scheduler counts only pods bound or assumed: without this it sends such a node to any pod, and the member,
filtered next, finds it full and waits until its job's hold expires.

A member's bind takes its hold (`Ledger.take_grouped`) to the node planned for it; a bind elsewhere, or of a
member of a job that holds nothing while it lacks members, is refused (`unheld`): kube-scheduler filters the
pod again, and the job is planned whole. So a job never runs in part because of us.

Restart and leader change: the holds live in memory, and each member's bind writes its job's hold on its pod
(`jobplan.py`). A restart, or a standby become leader, before the first bind forgets the hold: no member is
placed, and the job is planned again whole at its next member's filter. After it, the replica holds the members
still waiting again as the binds wrote them, before it answers any filter (`Ledger.restore_groups`), until the
hold's own expiry; if they no longer fit (another scheduler took the room meanwhile), the job is planned again.

kube-scheduler's sample: with `percentageOfNodesToScore` under 100, the names a filter is sent may not include
a member's planned node; the member then waits ("planned on node X") and kube-scheduler's rotating start
sends the node later. Jobs are best served with `percentageOfNodesToScore: 100`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import overload

from extender.core.cache import Cache
from extender.core.devices import Demand
from extender.core.gang import Member, NoPlan, plan_group, short_of
from extender.core.groups import Declared, Group, GroupKey, MemberPod, PodGroups, group_of, resolve
from extender.core.holds import HoldState
from extender.core.ledger import Ledger
from extender.core.nodes import NodeState
from extender.core.placement.batch import Floats
from extender.core.placement.config import Ask
from extender.core.placement.filtering import FilterOutcome
from extender.core.placement.fit import Cause, Placement
from extender.core.placement.placer import Placer, Warming
from extender.core.pods import PodRecord

DECIDED = frozenset({HoldState.RESERVED, HoldState.BOUND, HoldState.UNCERTAIN, HoldState.OBSERVED})
"""A member holding this is placed: its bind took its GPUs (the API may show it bound later)."""


@dataclass(frozen=True, slots=True)
class MemberFilter:
    """A member's filter: the node it is passed, or why it waits."""

    node: str = ""
    """The node planned for it ("" when it waits)."""
    reason: str = ""
    """Why it waits ("" when it is passed `node`)."""
    planned: bool = False
    """This filter planned the job and the ledger holds it now (its other members may be waiting to retry)."""
    short: bool = False
    """It waits because its job has fewer pods than it needs to start (the next to arrive may complete it)."""


def declared_group(record: PodRecord, podgroups: PodGroups) -> Declared | None:
    """The job the pod declares, when it is one the filter places whole (or refuses for its declaration), with the
    minimum its PodGroup says now, if it names one (`groups.resolve`)."""
    said = resolve(record.group, podgroups)
    return said if said is not None and (said.group is not None or said.problem) else None


def group_now(key: GroupKey, cache: Cache, ledger: Ledger, asking: PodRecord | None = None) -> Group:
    """The job as the cache knows it now (with the pod asking, which the watch may not have shown yet), its minimum
    its PodGroup's now if it has one. A member counts as bound from the moment its bind took its GPUs."""
    records = {uid: cache.pods[uid] for uid in cache.groups.members(key) if uid in cache.pods}
    if asking is not None:
        records[asking.uid] = asking
    said_by = []
    for uid, record in records.items():
        said = resolve(record.group, cache.podgroups)
        if said is None or said.group != key or said.problem:
            continue
        hold = cache.hold_of(uid)
        bound = bool(record.node_name) or (hold is not None and hold.state in DECIDED) or _gpuless(record)
        said_by.append((MemberPod(uid, record.name, bound, record.gated), said.minimum))
    return group_of(key, said_by)


def _gpuless(record: PodRecord) -> bool:
    """A member that asks no GPU is placed as any pod (kube-scheduler may not even send it to the extender) and
    counts toward its job's minimum as if placed: the job's GPUs are what is held whole."""
    return record.demand is not None and record.demand.is_zero


@overload
def filter_member(
    record: PodRecord, said: Declared, names: Sequence[str], cache: Cache, ledger: Ledger, placer: Placer
) -> MemberFilter | None: ...
@overload
def filter_member(
    record: PodRecord, said: Declared, names: Sequence[str], cache: Cache, ledger: Ledger, placer: Placer, defer: bool
) -> MemberFilter | Warming | None: ...
def filter_member(
    record: PodRecord,
    said: Declared,
    names: Sequence[str],
    cache: Cache,
    ledger: Ledger,
    placer: Placer,
    defer: bool = False,
) -> MemberFilter | Warming | None:
    """The filter of a pod that declares a job: its planned node, or why it waits; None when it is placed as any
    pod (its job has its minimum bound). With `defer`, a plan that would first judge many nodes afresh for its
    members' asks (the first job of a shape on a large cluster: tens of milliseconds at 5,000 nodes) is a
    `Warming` instead, whose steps the caller runs with turns of the event loop between them before it asks
    again, as the filter of any pod does (`Placer.begin_filter`)."""
    if said.problem or said.group is None:
        return MemberFilter(reason=f"pod {record.key}: {said.problem}")
    if _gpuless(record):
        return None
    key = said.group
    group = group_now(key, cache, ledger, record)
    gang = group.gang()
    if gang.waiting:
        return MemberFilter(reason=gang.waiting, short=not group.problem)
    if not gang.members:  # its minimum is placed (or was lowered to what is): a hold left is needed no more
        ledger.release_group(key)
        return None
    planned = {member.uid for member in gang.members}
    held = ledger.group_hold(key)
    if held is not None and not ledger.whole(key):  # a member it was held for is gone: plan the job again
        ledger.release_group(key)
        held = None
    if held is not None:
        node = ledger.held_for(record.uid)
        if node is not None and record.uid in held.planned:
            return MemberFilter(node)
        if planned <= set(held.waiting):
            return _past_minimum(record, group)
        ledger.release_group(key)  # planned for members that are no longer the ones to place: plan again
    if record.uid not in planned:
        return _past_minimum(record, group)
    return _plan(key, group, record, names, cache, ledger, placer, defer)


def _past_minimum(record: PodRecord, group: Group) -> MemberFilter:
    return MemberFilter(reason=f"pod {record.key} waits for the first {group.minimum} pods of job {group.key} to start")


def _plan(
    key: GroupKey,
    group: Group,
    asking: PodRecord,
    names: Sequence[str],
    cache: Cache,
    ledger: Ledger,
    placer: Placer,
    defer: bool = False,
) -> MemberFilter | Warming:
    """Plan the job's pending members at once and hold them whole; the asking member's node, or why not (with
    `defer`, the members' asks warmed first when that is much: `filter_member`)."""
    members = []
    allowed = frozenset(names)  # one set for every member: kube-scheduler's filters passed these for the pod asking
    for pending in group.gang().members:
        record = asking if pending.uid == asking.uid else cache.pods.get(pending.uid)
        if record is None:  # forgotten between the two reads: not possible without an await; be safe
            return MemberFilter(reason=f"job {key}: pod {pending.name} is gone")
        if record.demand is None:
            return MemberFilter(reason=f"job {key}: pod {record.key}: {record.unreadable}")
        members.append(Member(record.uid, record.key, record.demand, record.cpu, record.memory, allowed))

    def choose(demand: Demand, state: NodeState) -> Placement | None:
        return placer.choose(demand, state)

    def rank(member: Member, names: Sequence[str], states: Mapping[str, NodeState]) -> Floats:
        return placer.values(Ask(member.demand, member.cpu, member.memory), names, states)

    protocol = cache.protocol
    order = sorted(name for name in names if isinstance(name, str))
    if defer:
        asks = {(member.demand, member.cpu, member.memory) for member in members}
        steps = [placer.values_warming(Ask(*ask), order, cache.nodes) for ask in asks]
        if any(step is not None for step in steps):
            return Warming(chain.from_iterable(step for step in steps if step is not None))
    plan = plan_group(str(key), members, cache.nodes, protocol.unit, choose, order, protocol.refusal, rank)
    if isinstance(plan, NoPlan):
        return MemberFilter(reason=plan.reason)
    refusal = ledger.reserve_group(key, plan.allocations)
    if refusal is not None:
        return MemberFilter(reason=f"job {key}: {refusal}")
    return MemberFilter(plan.node_of(asking.uid) or "", planned=True)


def crowds(cpu: int, memory: int, state: NodeState, job: GroupKey, counted: bool = False) -> str | None:
    """Why a pod that is not one of them may not take this node: members of `job` planned here and still to bind
    need the cpu or memory it would take (their holds count their requests on the node, as kube-scheduler counts
    a pod it assumed; kube-scheduler itself knows nothing of them). `counted`: the pod's own requests are counted
    on this node already (a hold of its own here). None when it fits beside them."""
    if counted:
        cpu = memory = 0
    short = short_of(state, cpu, memory)
    if short is None:
        return None
    return f"node {state.name}'s {short} left is held for pods of job {job} still to bind"


@dataclass(frozen=True, slots=True)
class HeldRoom:
    """The filter's check that a pod takes no cpu or memory planned for a job's members still to bind
    (`Placer.filter`'s `admit`). Without it, kube-scheduler, which counts only the pods bound and assumed, passes
    such a node to any pod, our filter passed it for its GPUs, and the member filtered next found the node full:
    seen in the gang replay, a job of 16 with 15 members bound waited for the last until its hold expired, then
    was planned again. Refused as unresolvable: evicting a pod frees nothing a hold does not already count."""

    uid: str
    ask: Ask
    states: Mapping[str, NodeState]
    waiting: Mapping[str, GroupKey]
    """`Ledger.waiting_on`."""
    own: str
    """The node where the pod's own requests are counted already ("" for none)."""

    def __call__(self, outcome: FilterOutcome) -> None:
        passed = []
        for name in outcome.passed:
            job = self.waiting.get(name)
            state = self.states.get(name) if job is not None else None
            why = None
            if job is not None and state is not None:
                why = crowds(self.ask.cpu, self.ask.memory, state, job, counted=name == self.own)
            if why is None:
                passed.append(name)
                continue
            outcome.unresolvable[name] = why
            outcome.causes[Cause.JOB_HOLD] += 1
        outcome.passed = passed


def held_room(
    uid: str, ask: Ask | None, states: Mapping[str, NodeState], cache: Cache, ledger: Ledger
) -> HeldRoom | None:
    """The check for this pod's filter (`HeldRoom`), or None when no job's members wait on any node or the pod
    asks no cpu or memory."""
    if ask is None or not (ask.cpu or ask.memory):
        return None
    waiting = ledger.waiting_on()
    if not waiting:
        return None
    hold = cache.hold_of(uid)
    return HeldRoom(uid, ask, states, waiting, hold.allocation.node if hold is not None else "")


def unheld(record: PodRecord, cache: Cache, ledger: Ledger) -> str | None:
    """Why a member's bind, which found no hold of its own, may not place it alone (None when it may): its job
    lacks members bound, so it must be planned whole at its next filter."""
    said = declared_group(record, cache.podgroups)
    if said is None:
        return None
    if said.problem or said.group is None:
        return f"pod {record.key}: {said.problem}"
    gang = group_now(said.group, cache, ledger, record).gang()
    if gang.waiting:
        return gang.waiting
    if gang.members:
        job = said.group
        return f"pod {record.key} is a member of job {job}, which holds nothing now: planned whole at its next filter"
    return None
