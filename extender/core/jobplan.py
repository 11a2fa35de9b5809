"""A job's hold written on its members' pods, so that a restart or a new leader holds it again (`core/jobs.py`).

A job's hold (`Ledger.reserve_group`) lives in the extender's memory. Lost before the job's first member binds, it
costs nothing: no member is placed, and the job is planned again whole at its next member's filter. Lost after, the
job has members bound and the others waiting for room that other pods may take before they come. So each member's
bind writes on its pod, beside its allocation, the job's hold as it stands then (`ANNOTATION`): when it was taken,
and each member still waiting with its node and GPUs. A replica that finds such a hold written on a pod (the
cache keeps the newest per job: `groups.Jobs.written`) for a job it holds nothing for, within
`Settings.group_hold_ttl` of its taking, holds the members still waiting as written, all or none
(`Ledger.restore_groups`): before a filter it answers, and at each expiry sweep while it is ready (the leader: a
standby holding a job would take the leader's binds of its members for members lost). A job's hold that this replica
let go (expired, a member gone, a bind failed) is never taken again from what it wrote.

The text is JSON, at most `LIMIT` bytes: a job too large for it (some hundreds of members) is not written, and after a
restart is planned again, as before. Read back, anything unreadable is taken as nothing written (the job is planned
again): it is ours, but a person may have edited it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from extender.core.groups import GroupKey, Scheme, WrittenHold
from extender.core.holds import Allocation, Grant
from extender.core.mig import MigInstance

ANNOTATION = "gpu-extender.io/job-hold"
"""On a member of a job placed whole, written by its bind: the job's hold then (JSON, `encode`)."""
LIMIT = 64 * 1024
"""Bytes of the annotation at most, written or read."""


def encode(job: GroupKey, since: float, waiting: Sequence[Allocation]) -> str | None:
    """The annotation's text, or None when it would pass `LIMIT`."""
    text = orjson.dumps(
        {
            "scheme": job.scheme.name,
            "namespace": job.namespace,
            "name": job.name,
            "since": since,
            "waiting": [_allocation(allocation) for allocation in waiting],
        }
    ).decode()
    return text if len(text) <= LIMIT else None


def written(annotations: Mapping[str, Any]) -> WrittenHold | None:
    """The hold written in a pod's annotations, or None (none written, or unreadable)."""
    text = annotations.get(ANNOTATION)
    if not isinstance(text, str) or len(text) > LIMIT:
        return None
    try:
        return decode(text)
    except (ValueError, TypeError, KeyError, IndexError):
        return None


def decode(text: str) -> WrittenHold:
    """The hold `encode` wrote. ValueError, TypeError, KeyError or IndexError when it is not one."""
    found = orjson.loads(text)
    job = GroupKey(Scheme[found["scheme"]], _text(found["namespace"]), _text(found["name"]))
    since = found["since"]
    if not isinstance(since, int | float) or isinstance(since, bool):
        raise TypeError("since")
    return WrittenHold(job, float(since), tuple(_read_allocation(item) for item in found["waiting"]))


def _allocation(allocation: Allocation) -> list[Any]:
    return [
        allocation.pod_uid,
        allocation.pod,
        allocation.node,
        allocation.init_containers,
        [[_grant(grant) for grant in grants] for grants in allocation.containers],
    ]


def _grant(grant: Grant) -> list[Any]:
    instance = grant.instance
    mig = [instance.profile, instance.start, instance.size] if instance is not None else None
    return [grant.index, grant.memory, grant.cores, grant.uuid, mig]


def _read_allocation(item: Any) -> Allocation:
    uid, pod, node, init, containers = item
    grants = tuple(tuple(_read_grant(grant) for grant in container) for container in containers)
    return Allocation(_text(uid), _text(pod), _text(node), grants, _int(init))


def _read_grant(item: Any) -> Grant:
    index, memory, cores, uuid, mig = item
    instance = None if mig is None else MigInstance(_text(mig[0]), _int(mig[1]), _int(mig[2]))
    return Grant(_int(index, low=-1), _int(memory), _int(cores), _text(uuid), instance)


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError("not a string")
    return value


def _int(value: Any, low: int = 0) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value < 2**53:
        raise TypeError("not a whole number in range")
    return value
