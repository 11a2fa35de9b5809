"""What the ledger must decide, written out from its rules (DESIGN §3, `ledger.py`'s docstring), apart from its code.

A reservation fits when the node is known and, on every GPU it uses (the pod's own hold given back first): the GPU
exists and takes new pods (healthy, not cordoned); its memory, its compute (where the plugin tracks it, MIG aside:
instances limit there) and its slots (where it has a split count) hold what the other holds take plus this; and,
on a MIG GPU (or one a hold has blocked, or for a use that names instances), the GPU is in MIG mode, unblocked, and
each container's instance is at a placement its profile has, overlapping no instance of another pod nor an earlier
one of this allocation.

And what expires: reservations older than the TTL whose bind is not running (those the API accepted only while
the watch works), and assumptions older than `ASSUMED_TTL`.
"""

from __future__ import annotations

from extender.core.cache import Cache
from extender.core.holds import Allocation, HoldState
from extender.core.ledger import ASSUMED_TTL


def fits(cache: Cache, allocation: Allocation) -> bool:
    state = cache.nodes.get(allocation.node)
    if state is None or not state.known:
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
        if hold.state is not HoldState.ASSUMED
        and hold.since < now - ttl
        and (include_bound or hold.state not in (HoldState.BOUND, HoldState.UNCERTAIN))
    }
    dropped = {
        uid
        for uid, hold in cache.reserved.items()
        if hold.state is HoldState.ASSUMED and hold.since < now - ASSUMED_TTL
    }
    return expired, dropped
