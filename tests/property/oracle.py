"""What the ledger must decide, written out from its rules (DESIGN §3, `ledger.py`'s docstring), apart from its code.

A reservation fits when the node is known and, on every GPU it uses (the pod's own hold given back first): the GPU
exists and takes new pods (healthy, not cordoned); its memory, its compute (where the plugin tracks it, MIG aside:
instances limit there) and its slots (where it has a split count) hold what the other holds take plus this; and,
on a MIG GPU (or one a hold has blocked, or for a use that names instances), the GPU is in MIG mode, unblocked, and
each container's instance is at a placement its profile has, overlapping no instance of another pod nor an earlier
one of this allocation.

A namespace's ResourceQuota on GPU memory is kept when what its pods hold, on any node and in any state (the pod's
own hold given back), plus this, is within it.

And what expires: reservations older than the TTL whose bind is not running (those the API accepted only while
the watch works), and assumptions older than `ASSUMED_TTL`; a job's holds leave only together, never by the TTL.

Jobs (`jobs.py`'s docstring): a member has started once the API shows it bound or its bind took its GPUs (a hold
reserved, bound, uncertain or observed); a job whose members started fall short of its size places the first
members by name (then UID) that have not, as many as it lacks, together; a job's hold is let go whole once one of
its waiting members' holds is gone or it is older than its TTL.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from extender.core.cache import Cache
from extender.core.holds import Allocation, HoldState
from extender.core.ledger import ASSUMED_TTL, GroupHold
from extender.core.pods import PodRecord

STARTED = frozenset({HoldState.RESERVED, HoldState.BOUND, HoldState.UNCERTAIN, HoldState.OBSERVED})


def namespace(allocation: Allocation) -> str:
    return allocation.pod.split("/")[0]


def memory_held(cache: Cache, namespace_name: str, besides: str = "") -> int:
    """The GPU memory the namespace's pods hold, on every node and in every state, but the pod `besides`'s."""
    return sum(
        use.memory
        for state in cache.nodes.values()
        for uid, hold in state.holds.items()
        if uid != besides and namespace(hold.allocation) == namespace_name
        for use in hold.allocation.uses
    )


def fits(cache: Cache, allocation: Allocation, memory_quotas: Mapping[str, int] | None = None) -> bool:
    state = cache.nodes.get(allocation.node)
    if state is None or not state.known:
        return False
    quota = (memory_quotas or {}).get(namespace(allocation))
    if quota is not None:
        asked = sum(use.memory for use in allocation.uses)
        if memory_held(cache, namespace(allocation), allocation.pod_uid) + asked > quota:
            return False
    others = [hold.allocation for uid, hold in state.holds.items() if uid != allocation.pod_uid]
    for use in allocation.uses:
        devices = [device for device in state.devices if device.index == use.index]
        if not devices:
            return False
        device = devices[0]
        if not device.healthy or device.cordoned:
            return False
        taken = [other for held in others for other in held.uses if other.index == use.index]
        if sum(other.memory for other in taken) + use.memory > device.capacity:
            return False
        if device.cores and not device.mig and sum(other.cores for other in taken) + use.cores > device.cores:
            return False
        if device.slots and sum(other.slots for other in taken) + use.slots > device.slots:
            return False
        position = state.devices.index(device)
        if device.mig or use.instances or position in state.blocked:
            if position in state.blocked or not device.mig or not use.instances:
                return False
            pieces = [(instance.start, instance.size) for other in taken for instance in other.instances]
            for instance in use.instances:
                profiles = [profile for profile in device.profiles if profile.name == instance.profile]
                if not profiles or (instance.start, instance.size) not in profiles[0].placements:
                    return False
                span = set(range(instance.start, instance.start + instance.size))
                if any(span & set(range(start, start + size)) for start, size in pieces):
                    return False
                pieces.append((instance.start, instance.size))
    return True


def due(cache: Cache, now: float, ttl: float, include_bound: bool) -> tuple[set[str], set[str]]:
    """The reservations `Ledger.expire` must free now, and the assumptions it must drop (no bind runs here)."""
    expired = {
        uid
        for uid, hold in cache.reserved.items()
        if hold.state not in (HoldState.ASSUMED, HoldState.GROUPED)
        and hold.since < now - ttl
        and (include_bound or hold.state not in (HoldState.BOUND, HoldState.UNCERTAIN))
    }
    dropped = {
        uid
        for uid, hold in cache.reserved.items()
        if hold.state is HoldState.ASSUMED and hold.since < now - ASSUMED_TTL
    }
    return expired, dropped


def gang(cache: Cache, members: Iterable[PodRecord], size: int) -> list[str] | None:
    """The members of a job of `size` (as the cache has them, with the one asking) to place together now: None when
    as many as its size have started (the rest go as any pod), [] when too few have not to make up its size."""
    lacking = size
    waiting = []
    for record in members:
        hold = cache.hold_of(record.uid)
        if record.node_name or (hold is not None and hold.state in STARTED):
            lacking -= 1
        else:
            waiting.append((record.name, record.uid))
    if lacking <= 0:
        return None
    if len(waiting) < lacking:
        return []
    return [uid for _, uid in sorted(waiting)[:lacking]]


def whole(cache: Cache, group: GroupHold) -> bool:
    """Every member the job's hold waits for holds its GPUs, on the node planned for it, as a job's hold."""
    return all(
        (hold := cache.hold_of(uid)) is not None
        and hold.state is HoldState.GROUPED
        and hold.allocation.node == group.planned[uid]
        for uid in group.planned
        if uid not in group.taken
    )


def job_due(cache: Cache, group: GroupHold, now: float, group_ttl: float) -> bool:
    """Whether the expiry sweep must let the job's hold go now."""
    return not whole(cache, group) or group.since < now - group_ttl
