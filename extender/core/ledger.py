"""Reservations: device memory taken at bind, before the API shows the pod bound (DESIGN §3).

The rules live here and nowhere else:
- `reserve` re-checks free memory and the namespace's quotas (`quota/book.py`) and records the hold in one step (no
  await in between), so two binds can never take the same memory, nor together more than a quota allows;
  callers hold `locked(node)` while they decide and reserve (not across the API write that follows, so binds
  to one node do not queue behind each other's API calls), and mark the bind `in_flight` so no second bind of
  the same pod starts meanwhile.
- `release` undoes a reservation after any failure and marks the pod abandoned (its annotations alone no
  longer reserve); an observed allocation is never released from here.
- `expire` frees reservations the API has not confirmed within the TTL, except those whose bind is running.
- A job that starts whole is held whole (`reserve_group`): every member's allocation recorded in one step, each
  checked as a reservation is and the namespace's quota charged with their sum, or none recorded. Its holds
  leave together (`release_group`, `expire_groups`), except each member's own, which its bind takes
  (`take_grouped`) and which then follows a reservation's rules.
- After every operation `used <= capacity` holds for every device a reservation touched.

Decisions about *which* devices are the policy's; this module only refuses what does not fit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field

from extender.core import jobplan, mig
from extender.core.cache import Cache
from extender.core.groups import GroupKey, WrittenHold
from extender.core.holds import Allocation, Hold, HoldState, Use
from extender.core.nodes import NodeState
from extender.core.quota.book import Quotas

log = logging.getLogger(__name__)

ASSUMED_TTL = 5.0
"""Seconds an assumption (`assume.py`) is held without its bind: kube-scheduler binds a pod moments after its
filter (its binding cycle starts when the scheduling cycle ends), so an assumption older than this is one whose
pod went elsewhere or nowhere (a later plugin refused it, it was deleted); it is dropped by the expiry sweep."""
UNCERTAIN_WINDOW = 60.0
"""Seconds a binding that failed uncertainly may still land: kube-apiserver's default `--request-timeout`,
after which it abandons a request it still holds."""


def _instances_refusal(state: NodeState, position: int, use: Use, mine: Use | None) -> str:
    """Why the use's MIG instances cannot be held on this GPU ("" when they can): a MIG GPU needs one instance
    per container, each at a placement its profile has, overlapping none held (the pod's own given back
    first); a GPU in another mode takes none."""
    device = state.devices[position]
    if position in state.blocked:
        return f"takes no new pod: {state.blocked[position]}"
    if not device.mig:
        return "not in MIG mode, yet the allocation reserves a MIG instance there"
    if not use.instances:
        return "in MIG mode, yet the allocation reserves no MIG instance there"
    held = list(state.occupied[position]) if position < len(state.occupied) else []
    for instance in mine.instances if mine is not None else ():
        with contextlib.suppress(ValueError):
            held.remove((instance.start, instance.size))
    for instance in use.instances:
        profile = mig.profile_named(device.profiles, instance.profile)
        if profile is None or (instance.start, instance.size) not in profile.placements:
            return f"no MIG profile {instance.profile} at ({instance.start}, {instance.size}) on it"
        if mig.overlaps(instance.start, instance.size, held):
            return f"MIG instance {instance.profile} at slice {instance.start} overlaps one held"
        held.append((instance.start, instance.size))
    return ""


MAY_HAVE_LANDED = frozenset({HoldState.BOUND, HoldState.UNCERTAIN})
"""Holds whose pod the API may have bound: kept past the TTL while the watch fails (`Ledger.expire`)."""
UNWRITTEN = frozenset({HoldState.ASSUMED, HoldState.GROUPED})
"""Holds nothing was written for: their release marks no pod abandoned."""
GROUP_HOLD_TTL = 60.0
"""Seconds a job's hold waits for its members' binds by default (`Settings.group_hold_ttl`)."""


@dataclass(slots=True)
class GroupHold:
    """A job held whole: the node planned for each member, and the members whose bind has taken its hold."""

    key: GroupKey
    planned: dict[str, str]
    """Member pod UID -> the node planned for it."""
    since: float
    """When it was held (Unix seconds, the ledger's clock)."""
    taken: set[str] = field(default_factory=set)
    """Members whose bind took their hold (`Ledger.take_grouped`): reservations of their own from then on."""

    @property
    def waiting(self) -> list[str]:
        """Members whose bind has not come yet."""
        return [uid for uid in self.planned if uid not in self.taken]


@dataclass(frozen=True, slots=True)
class GroupRelease:
    """A job's hold let go by the expiry sweep: which, why, and the members' holds freed."""

    group: GroupHold
    why: str
    holds: tuple[Hold, ...]


class Ledger:
    """Mutable: the reservations' bookkeeping over the cache's holds."""

    def __init__(
        self,
        cluster: Cache,
        ttl: float,
        clock: Callable[[], float] = time.time,
        quotas: Quotas | None = None,
        group_ttl: float = GROUP_HOLD_TTL,
    ) -> None:
        self.cluster = cluster
        self.quotas = quotas
        """The book every reservation is checked against (None: no quota is enforced)."""
        self.ttl = ttl
        """Seconds a reservation may wait for the API to show its pod bound."""
        self.group_ttl = group_ttl
        """Seconds a job's hold may wait for all its members' binds (`expire_groups`)."""
        self.clock = clock
        self._locks: dict[str, tuple[asyncio.Lock, list[int]]] = {}
        self._in_flight: dict[str, str] = {}
        self._groups: dict[GroupKey, GroupHold] = {}
        self._group_of: dict[str, GroupKey] = {}
        self._last_group = 0.0
        """When the newest job's hold was taken here: each later one is taken later still, so that a job's holds
        are told apart and ordered by their time (`jobplan.py`), even within one tick of the clock."""
        """Member pod UID -> the job holding it, while the job's hold lasts."""

    @asynccontextmanager
    async def locked(self, node: str) -> AsyncIterator[None]:
        """Hold the lock that orders binds to one node. A node's lock exists only while binds use it, so
        names that come and go (or never existed) leave nothing behind."""
        entry = self._locks.get(node)
        if entry is None:
            entry = self._locks[node] = (asyncio.Lock(), [0])
        lock, users = entry
        users[0] += 1
        try:
            async with lock:
                yield
        finally:
            users[0] -= 1
            if not users[0]:
                del self._locks[node]

    def running_bind(self, uid: str) -> str | None:
        """The node a bind of this pod is running to, if one is."""
        return self._in_flight.get(uid)

    @contextmanager
    def in_flight(self, uid: str, node: str) -> Iterator[None]:
        """Mark a pod's bind as running: its reservation is not expired meanwhile, and no second bind of the
        same pod may start (to any node) until it ends."""
        if uid in self._in_flight:
            raise RuntimeError(f"a bind of pod {uid} is already running")
        self._in_flight[uid] = node
        try:
            yield
        finally:
            del self._in_flight[uid]

    def reserve(self, allocation: Allocation) -> str | None:
        """Take the allocation's memory; returns None on success, else why it does not fit now."""
        refusal = self._refusal(allocation)
        if refusal is None:
            self.cluster.hold(Hold(allocation, HoldState.RESERVED, since=self.clock()))
        return refusal

    def _refusal(self, allocation: Allocation) -> str | None:
        """Why the allocation does not fit now (the pod's own hold given back first), or None."""
        state = self.cluster.nodes.get(allocation.node)
        if state is None or not state.known:
            return f"node {allocation.node} is not in the extender's cache"
        own = state.holds.get(allocation.pod_uid)
        for use in allocation.uses:
            position = state.position(use.index)
            if position < 0:
                return f"node {allocation.node} has no GPU {use.index}"
            device = state.devices[position]
            if not device.usable:  # marked unhealthy or cordoned since the allocation was chosen
                return f"GPU {use.index} on {allocation.node} takes no new pods (unhealthy or cordoned)"
            mine = own.allocation.use_of(use.index) if own is not None else None
            free = device.capacity - state.used[position] + (mine.memory if mine else 0)
            if free < use.memory:
                return f"GPU {use.index} on {allocation.node} has {max(free, 0)} free, needs {use.memory}"
            cores = device.cores - state.used_cores[position] + (mine.cores if mine else 0)
            if device.cores and not device.mig and cores < use.cores:  # MIG: instances limit, not compute
                return f"GPU {use.index} on {allocation.node} has {max(cores, 0)} % compute free, needs {use.cores}"
            slots = device.slots - state.used_slots[position] + (mine.slots if mine else 0)
            if device.slots and slots < use.slots:
                return f"GPU {use.index} on {allocation.node} runs its most pods ({device.slots})"
            if device.mig or use.instances or position in state.blocked:
                refused = _instances_refusal(state, position, use, mine)
                if refused:
                    return f"GPU {use.index} on {allocation.node}: {refused}"
        over_quota = self.quotas.admits(allocation, state.devices) if self.quotas is not None else None
        return over_quota.reason if over_quota is not None else None

    def assume(self, allocation: Allocation, build: int) -> bool:
        """Count the allocation as assumed (`holds.HoldState.ASSUMED`) if it fits now and the pod holds nothing
        else; returns whether it is. Never written anywhere: it only keeps the next filters from the same GPUs.
        `build` is that of the typical shapes it was chosen by (`Placer.build`)."""
        uid = allocation.pod_uid
        if uid in self._in_flight or self.cluster.hold_of(uid) is not None or self._refusal(allocation) is not None:
            return False
        self.cluster.hold(Hold(allocation, HoldState.ASSUMED, since=self.clock(), chosen_by=build))
        return True

    def take_assumed(self, uid: str, node: str, build: int) -> Hold | None:
        """Reserve what the pod's assumption holds, as the bind's own decision, when the bind is to its node, the
        typical shapes it was chosen by are still those of now (`build`), and it still fits there (its GPUs
        usable, within their room and the namespace's quota). Returns the reservation, or None (the bind then
        decides afresh).

        Why not choose again: with nothing changed, `Placer.choose` gives the same GPUs (it reads nothing else);
        and in a burst, what changed the node since is mostly the next pods' own assumptions, each chosen around
        this one: choosing this one again, around them, would only move it."""
        hold = self.cluster.reserved.get(uid)
        if (
            hold is None
            or hold.state is not HoldState.ASSUMED
            or hold.allocation.node != node
            or hold.chosen_by != build
            or self._refusal(hold.allocation) is not None
        ):
            return None
        reserved = Hold(hold.allocation, HoldState.RESERVED, since=self.clock())
        self.cluster.restate(reserved)
        return reserved

    def unassume(self, uid: str) -> bool:
        """Drop the pod's assumption, if it has one (its bind came, or it is filtered again); returns whether it
        had one. Not a release of a decision: the pod is not marked abandoned."""
        hold = self.cluster.reserved.get(uid)
        if hold is None or hold.state is not HoldState.ASSUMED:
            return False
        self.cluster.release(uid)
        return True

    def mark_bound(self, uid: str) -> None:
        """The API accepted the binding; the watch will confirm it."""
        self._enter(uid, HoldState.BOUND)

    def mark_uncertain(self, uid: str) -> None:
        """The binding failed but may have landed: keep the reservation until the watch or the TTL decides."""
        self._enter(uid, HoldState.UNCERTAIN, self.clock())

    def _enter(self, uid: str, state: HoldState, at: float | None = None) -> None:
        hold = self.cluster.reserved.get(uid)  # the watch may have shown the pod already: then nothing to do
        if hold is not None and hold.state is not state:
            self.cluster.restate(hold.entering(state, at))

    def still_uncertain(self, uid: str) -> bool:
        """Whether a binding of this pod that failed uncertainly may still land: within UNCERTAIN_WINDOW of the
        failure, while its reservation is held. After that the API server has given the request up."""
        hold = self.cluster.reserved.get(uid)
        if hold is None or hold.state is not HoldState.UNCERTAIN or hold.state_since is None:
            return False
        return self.clock() - hold.state_since < UNCERTAIN_WINDOW

    def release(self, uid: str) -> Hold | None:
        """Undo a reservation (not an observed allocation); returns it, or None if there was none.

        The pod is marked abandoned: annotations we may already have written on it no longer reserve
        anything by themselves when the watch shows them (only a binding does).
        """
        hold = self.cluster.reserved.get(uid)
        if hold is None:
            return None
        return self.cluster.release(uid, abandon=hold.state not in UNWRITTEN)

    def expire(self, include_bound: bool = True) -> list[Hold]:
        """Free every reservation older than the TTL whose bind is not running; returns them.

        With `include_bound=False` (the watch is failing), reservations whose binding the API accepted, or may
        have accepted (an uncertain outcome), are kept: the pod may be bound with only its confirmation late, and
        freeing it would give its memory away to a pod the watch, once back, would show beside it on the same
        GPU. Only the watch decides those; while it fails, the TTL frees only reservations no binding was sent
        for (or whose binding failed for sure, which are released at once).
        """
        now = self.clock()
        deadline = now - self.ttl
        assumed = [
            uid
            for uid, hold in self.cluster.reserved.items()
            if hold.state is HoldState.ASSUMED and hold.since < now - ASSUMED_TTL
        ]
        for uid in assumed:
            self.unassume(uid)
        expired = [
            hold
            for uid, hold in self.cluster.reserved.items()
            if hold.since < deadline
            and uid not in self._in_flight
            and hold.state not in UNWRITTEN  # a job's holds leave together (`expire_groups`)
            and (include_bound or hold.state not in MAY_HAVE_LANDED)
        ]
        for hold in expired:
            self.release(hold.allocation.pod_uid)
        return expired

    # -- jobs held whole

    def reserve_group(self, key: GroupKey, allocations: Sequence[Allocation], since: float | None = None) -> str | None:
        """Hold every member's allocation as GROUPED, or none; returns None when all are held, else why not.

        Each is checked as `reserve` checks one (room, MIG instances, the namespace's quota) against the node as
        the members recorded before it left it, in one step with no await: the quota book counts each hold as
        it is recorded, so the namespace's quota is charged with the members' sum, and a quota with room for
        five of eight members refuses the job. On a refusal the members recorded are let go again.
        A job already held is let go first (the caller plans it again). `since`: when the hold was taken, for one
        held again as a bind wrote it (`restore_groups`); now by default."""
        self.release_group(key)
        recorded: list[str] = []
        now = since if since is not None else max(self.clock(), self._last_group + 1e-6)
        refusal: str | None = None
        for allocation in allocations:
            uid = allocation.pod_uid
            current = self.cluster.hold_of(uid)
            if uid in self._in_flight:
                refusal = f"pod {allocation.pod}: a bind of it is running"
            elif current is not None and current.state is not HoldState.ASSUMED:
                refusal = f"pod {allocation.pod} holds GPUs already ({current.state.value})"
            else:
                refused = self._refusal(allocation)
                refusal = f"pod {allocation.pod}: {refused}" if refused is not None else None
            if refusal is not None:
                break
            self.cluster.hold(Hold(allocation, HoldState.GROUPED, since=now))
            recorded.append(uid)
        if refusal is not None:
            for uid in recorded:
                self.cluster.release(uid)
            return refusal
        self._groups[key] = GroupHold(key, {allocation.pod_uid: allocation.node for allocation in allocations}, now)
        self._last_group = max(self._last_group, now)
        for allocation in allocations:
            self._group_of[allocation.pod_uid] = key
        return None

    def group_hold(self, key: GroupKey) -> GroupHold | None:
        """The job's hold, while it lasts."""
        return self._groups.get(key)

    def group_of(self, uid: str) -> GroupKey | None:
        """The job holding this member, while its hold lasts."""
        return self._group_of.get(uid)

    def held_for(self, uid: str) -> str | None:
        """The node the member's GROUPED hold is on, if it has one."""
        hold = self.cluster.reserved.get(uid)
        return hold.allocation.node if hold is not None and hold.state is HoldState.GROUPED else None

    def take_grouped(self, uid: str, node: str) -> Hold | None:
        """Reserve what the member's GROUPED hold holds, as its bind's decision, when the bind is to the node
        planned for it, it still fits there (its GPUs usable: the hold itself is given back to the check) and its
        job's hold is still whole. A job that lost a member it was held for (deleted before the sweep noticed) is
        let go whole here, so no member binds into a job that cannot start. Returns the reservation, or None."""
        hold = self.cluster.reserved.get(uid)
        if (
            hold is None
            or hold.state is not HoldState.GROUPED
            or hold.allocation.node != node
            or self._refusal(hold.allocation) is not None
        ):
            return None
        key = self._group_of.get(uid)
        group = self._groups.get(key) if key is not None else None
        if group is not None and self._gone(group):  # a member it was held for is gone: the job cannot start
            self.release_group(group.key)  # whole; planned again at its next filter, never started in part
            return None
        reserved = Hold(hold.allocation, HoldState.RESERVED, since=self.clock())
        self.cluster.restate(reserved)
        if group is not None:
            group.taken.add(uid)
            if not group.waiting:  # every member's bind has come: the job's hold has done its work
                self._forget_group(group)
        return reserved

    def release_group(self, key: GroupKey | None) -> list[Hold]:
        """Let go of the job's hold: every member's GROUPED hold, together (the members whose bind took theirs
        keep them). Returns the holds let go."""
        group = self._groups.get(key) if key is not None else None
        if group is None:
            return []
        self._forget_group(group)
        self.cluster.groups.forget(group.key, group.since)  # never held again from what its binds wrote
        released = []
        for uid in group.waiting:
            hold = self.cluster.reserved.get(uid)
            if hold is not None and hold.state is HoldState.GROUPED:
                released.append(self.cluster.release(uid))
        return [hold for hold in released if hold is not None]

    def written(self, key: GroupKey | None) -> str | None:
        """The job's hold as a member's bind writes it on its pod (`jobplan.py`): when it was taken and every member
        still waiting; None when the job holds nothing, none waits, or it is too large to write."""
        group = self._groups.get(key) if key is not None else None
        if group is None or not group.waiting:
            return None
        holds = [self.cluster.reserved.get(uid) for uid in group.waiting]
        allocations = [hold.allocation for hold in holds if hold is not None and hold.state is HoldState.GROUPED]
        return jobplan.encode(group.key, group.since, allocations)

    def restore_groups(self) -> list[GroupKey]:
        """Hold again, as written, the jobs whose hold a member's bind wrote on its pod and that hold nothing here
        (this replica restarted, or became the leader, between two of their members' binds): the members still
        waiting, all or none, until the written hold's own expiry. A written hold is forgotten once held again, or
        when of no use: expired, let go here before, a member gone, none waiting, or no longer fitting (the job is
        then planned again at its next member's filter). Returns the jobs held again. Cheap when nothing is written
        (the common case): one look at an empty list."""
        restored = []
        for hold in self.cluster.groups.written():
            job, since = hold.job, hold.since
            if job in self._groups:
                continue
            self.cluster.groups.forget(job, since)
            waiting = self._still_waiting(hold)
            if not waiting or since < self.clock() - self.group_ttl:
                continue
            refusal = self.reserve_group(job, waiting, since=since)
            if refusal is not None:
                log.warning("job %s: its hold written by its members' binds cannot be held again (%s)", job, refusal)
                continue
            log.info("job %s: its hold for %d members held again as its members' binds wrote it", job, len(waiting))
            restored.append(job)
        return restored

    def _still_waiting(self, hold: WrittenHold) -> list[Allocation]:
        """The members the written hold lists that still wait to bind ([] when one is gone or ended: the job is
        then planned again); those bound or decided since are left out."""
        waiting = []
        for allocation in hold.waiting:
            record = self.cluster.pods.get(allocation.pod_uid)
            if record is None or record.finished:
                return []
            held = self.cluster.hold_of(allocation.pod_uid)
            if record.node_name or (held is not None and held.state is not HoldState.ASSUMED):
                continue
            waiting.append(allocation)
        return waiting

    def waiting_on(self) -> dict[str, GroupKey]:
        """Nodes where members of a job held whole still wait to bind, each with one such job: the cpu and memory
        planned for them there (counted in the node's requests as their holds are) is theirs (`jobs.crowds`).
        Costs one pass over the members waiting, which are few: jobs between their plan and their last bind."""
        return {group.planned[uid]: group.key for group in self._groups.values() for uid in group.waiting}

    def whole(self, key: GroupKey) -> bool:
        """Whether the job's hold still holds every member it waits for (False when it holds none)."""
        group = self._groups.get(key)
        return group is not None and not self._gone(group)

    def _gone(self, group: GroupHold) -> int:
        """How many members the job waits for have lost their hold (deleted, ended, bound by another scheduler)."""
        return sum(1 for uid in group.waiting if self.held_for(uid) != group.planned[uid])

    def _forget_group(self, group: GroupHold) -> None:
        del self._groups[group.key]
        for uid in group.planned:
            if self._group_of.get(uid) == group.key:
                del self._group_of[uid]

    def expire_groups(self) -> list[GroupRelease]:
        """Let go, whole, of every job's hold older than `group_ttl` (its members did not all come to bind) or
        that lost a member's hold (the pod deleted or finished, or shown bound by another scheduler): the job is
        planned again at its next member's filter. Returns what was let go."""
        deadline = self.clock() - self.group_ttl
        released = []
        for group in list(self._groups.values()):
            waiting = group.waiting
            gone = self._gone(group)
            if gone:
                why = f"{gone} of its members' holds are gone (pods deleted, ended or bound by another scheduler)"
            elif group.since < deadline:
                late, members = len(waiting), len(group.planned)
                why = f"{late} of its {members} members did not come to bind within {self.group_ttl:g} s"
            else:
                continue
            released.append(GroupRelease(group, why, tuple(self.release_group(group.key))))
        return released
