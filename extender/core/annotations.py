"""The annotation protocol (DESIGN §4): how an allocation is written on a pod, and read back after a restart.

The annotations travel in the Binding, so the API server writes them and `spec.nodeName` in one update; they
are the durable record of every decision (nothing in memory is the only copy). The keys come from the
device plugin's `Profile` (the gpushare plugin's by default). Reading never raises: annotations a person or
another tool wrote wrong are read as no allocation.
"""

from __future__ import annotations

from typing import Any

from extender.core.holds import Allocation
from extender.core.resources import Demand, Profile, ceil_div


def allocation_annotations(
    allocation: Allocation, device_capacity: int, now: float, profile: Profile
) -> dict[str, str]:
    """The pod annotations that record an allocation durably (DESIGN §4)."""
    annotations = {
        profile.pod_memory_annotation: str(allocation.memory),
        profile.device_memory_annotation: str(device_capacity),
        profile.assigned_annotation: "false",
        profile.assume_time_annotation: str(int(now * 1e9)),
        profile.indexes_annotation: ",".join(str(index) for index in allocation.indexes),
        profile.node_annotation: allocation.node,
    }
    if len(allocation.indexes) == 1:
        annotations[profile.index_annotation] = str(allocation.indexes[0])
    return annotations


def read_allocation(
    uid: str, key: str, node: str, annotations: dict[str, Any], demand: Demand | None, profile: Profile
) -> Allocation | None:
    """The allocation the annotations record for this pod on `node`, or None when they record none (or
    nothing readable). Without the pod-memory annotation, the pod's demand is what it was given."""
    listed = annotations.get(profile.indexes_annotation) or annotations.get(profile.index_annotation)
    if not listed or not node:
        return None
    try:
        indexes = tuple(int(part) for part in str(listed).split(","))
        memory = (
            int(annotations[profile.pod_memory_annotation]) if profile.pod_memory_annotation in annotations else None
        )
    except ValueError:
        return None
    if memory is None:
        memory = demand.memory if demand else 0
    if any(index < 0 for index in indexes) or memory < 0:
        return None
    return Allocation(uid, key, node, indexes, ceil_div(memory, len(indexes)))


def assume_time(annotations: dict[str, Any], profile: Profile) -> float:
    """When the decision was made (Unix seconds), 0 when unknown: a reservation's TTL counts from here."""
    try:
        return int(annotations.get(profile.assume_time_annotation, 0)) / 1e9
    except (TypeError, ValueError):
        return 0.0
