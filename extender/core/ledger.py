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
- After every operation `used <= capacity` holds for every device a reservation touched.

Decisions about *which* devices are the policy's; this module only refuses what does not fit.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager

from extender.core import mig
from extender.core.cache import Cache
from extender.core.holds import Allocation, Hold, HoldState, Use
from extender.core.nodes import NodeState
from extender.core.quota.book import Quotas

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


class Ledger:
    """Mutable: the reservations' bookkeeping over the cache's holds."""

    def __init__(
        self, cluster: Cache, ttl: float, clock: Callable[[], float] = time.time, quotas: Quotas | None = None
    ) -> None:
        self.cluster = cluster
        self.quotas = quotas
        """The book every reservation is checked against (None: no quota is enforced)."""
        self.ttl = ttl
        """Seconds a reservation may wait for the API to show its pod bound."""
        self.clock = clock
        self._locks: dict[str, tuple[asyncio.Lock, list[int]]] = {}
        self._in_flight: dict[str, str] = {}

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
        return self.cluster.release(uid, abandon=hold.state is not HoldState.ASSUMED)

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
            and hold.state is not HoldState.ASSUMED
            and (include_bound or hold.state not in MAY_HAVE_LANDED)
        ]
        for hold in expired:
            self.release(hold.allocation.pod_uid)
        return expired
