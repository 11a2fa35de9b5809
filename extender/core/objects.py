"""Kubernetes objects as the extender holds them: decoded JSON dicts, and one accessor per field it reads.

Objects stay plain dicts from orjson on the hot path (a generated model decodes a 5,000-pod list about 30 times
slower). Whatever a client or the API sent may hold the wrong type anywhere, so every accessor here answers
with an empty value instead of raising: `metadata` that is a string has no name. Every module reads a pod's
UID, a node's name and so on through these functions, never by indexing the dicts itself.
"""

from __future__ import annotations

import datetime
from typing import Any

Raw = dict[str, Any]
"""A Kubernetes object or fragment as decoded JSON."""


def as_object(value: Any) -> Raw:
    """`value` if it is an object, else an empty one: what an object carries that we cannot read is absent."""
    return value if isinstance(value, dict) else {}


def meta(obj: Raw) -> Raw:
    """`metadata`, or {}."""
    return as_object(obj.get("metadata"))


def resource_version(obj: Raw) -> str:
    """`metadata.resourceVersion` ("" when none): opaque, compared only for equality."""
    return str(meta(obj).get("resourceVersion") or "")


def name(obj: Raw) -> str:
    """`metadata.name`, or "" when absent."""
    return str(meta(obj).get("name") or "")


def namespace(obj: Raw) -> str:
    """`metadata.namespace`; "default" when absent, as the API server fills it in."""
    return str(meta(obj).get("namespace") or "default")


def uid(obj: Raw) -> str:
    """`metadata.uid`, or "" when absent."""
    return str(meta(obj).get("uid") or "")


def annotations_of(obj: Raw) -> Raw:
    """`metadata.annotations`, or {}."""
    return as_object(meta(obj).get("annotations"))


def labels_of(obj: Raw) -> Raw:
    """`metadata.labels`, or {}."""
    return as_object(meta(obj).get("labels"))


def key(namespace: str, name: str) -> str:
    """`namespace/name`: how logs, messages and `/inspect` name a pod."""
    return f"{namespace}/{name}"


def pod_key(pod: Raw) -> str:
    """`namespace/name` of a pod for messages and logs ("?" for a missing name)."""
    return key(namespace(pod), name(pod) or "?")


def pod_priority(pod: Raw) -> int:
    """`spec.priority` (set by admission from the pod's PriorityClass), 0 when absent or not an integer."""
    priority = as_object(pod.get("spec")).get("priority")
    return priority if isinstance(priority, int) and not isinstance(priority, bool) else 0


def rfc3339(unix: float, micro: bool = False) -> str:
    """A time in UTC as Kubernetes writes it: RFC 3339 to the second (a `Time`), or with microseconds (a
    `MicroTime`, as Leases carry)."""
    moment = datetime.datetime.fromtimestamp(unix, datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ" if micro else "%Y-%m-%dT%H:%M:%SZ")
