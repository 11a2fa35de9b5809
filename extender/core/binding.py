"""The bind verb's procedure: choose devices, reserve, write the allocation, bind; undo on any failure.

This is where the ledger's rules meet I/O (DESIGN §3). Under the node's lock: a pod already bound to this node
is success (bind is idempotent); otherwise the policy chooses devices, the ledger reserves them (check and
record in one step), and the `Binder` (the file source's, or the API's) writes the annotations and the
binding. Any failure releases the reservation before the reply, and the reply says what failed.

The Binder does I/O; this module only awaits it.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from extender.core.cache import Allocation, Cache, Hold, NodeState, allocation_annotations, pod_record
from extender.core.ledger import Ledger
from extender.core.objects import Raw
from extender.core.objects import uid as pod_uid
from extender.core.policy import PolicyConfig, choose_devices, judge
from extender.core.resources import Profile

log = logging.getLogger(__name__)


class BindError(Exception):
    """Writing the allocation or the binding failed; the message says which step and why.

    `uncertain` means the binding may have landed all the same (the request timed out or the connection
    dropped after it was sent, and checking failed too). The reservation is then kept, not released: the
    watch turns it into the observed allocation if the binding landed, and the ledger's TTL frees it if not.
    Releasing it at once could give the same memory to another pod while the first one starts on it.
    """

    def __init__(self, message: str, uncertain: bool = False) -> None:
        super().__init__(message)
        self.uncertain = uncertain


class Binder(Protocol):
    async def bind(self, pod: Raw, node: str, annotations: dict[str, str]) -> None:
        """Write `annotations` on the pod (when any), then bind it to `node`. Raises BindError."""


@dataclass(frozen=True, slots=True)
class Guard:
    """What a replica asks before and while it binds: may it bind at all (synced, leading), and for how long
    is it sure to stay allowed (its lease's renew deadline). Checked again once the node's lock is held: a
    bind that queued behind a slow one may find the lease lost meanwhile."""

    refusal: Callable[[], str] = lambda: ""
    """Why this replica may not bind now; empty when it may."""
    time_left: Callable[[], float | None] = lambda: None
    """Seconds it surely may still bind (None: no limit). A binding still under way then is cut off, and its
    reservation kept as uncertain: another replica may take over, and the binding may still land."""


UNGUARDED = Guard()


@dataclass(frozen=True, slots=True)
class BindRequest:
    name: str
    namespace: str
    uid: str
    node: str

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def slim_pod(pod: Raw) -> Raw:
    """The parts of a pod a bind needs (identity, annotations, container resources, node and phase), to keep
    many pods cheaply: a whole pod is kilobytes of volumes, probes and managed fields."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    slim_spec: Raw = {}
    for key in ("containers", "initContainers"):
        if isinstance(spec.get(key), list):
            slim_spec[key] = [
                {"name": c.get("name"), "resources": c.get("resources") or {}} for c in spec[key] if isinstance(c, dict)
            ]
    if spec.get("nodeName"):
        slim_spec["nodeName"] = spec["nodeName"]
    if spec.get("priority") is not None:
        slim_spec["priority"] = spec["priority"]
    return {
        "metadata": {
            "name": meta.get("name"),
            "namespace": meta.get("namespace") or "default",
            "uid": meta.get("uid"),
            "annotations": dict(meta.get("annotations") or {}),
        },
        "spec": slim_spec,
        "status": {"phase": (pod.get("status") or {}).get("phase") or "Pending"},
    }


class RecentPods:
    """Pods seen in filter requests, by UID, so a bind can place a pod the cache has not seen yet.

    Bounded (oldest forgotten first): kube-scheduler binds a pod shortly after filtering it.
    """

    def __init__(self, limit: int = 20_000) -> None:
        self.limit = limit
        self._pods: OrderedDict[str, Raw] = OrderedDict()

    def remember(self, pod: Raw) -> None:
        uid = pod_uid(pod)
        if not uid:
            return
        if uid in self._pods:
            self._pods.move_to_end(uid)
            return
        self._pods[uid] = slim_pod(pod)
        if len(self._pods) > self.limit:
            self._pods.popitem(last=False)

    def get(self, uid: str) -> Raw | None:
        return self._pods.get(uid)

    def __len__(self) -> int:
        return len(self._pods)


async def bind(
    request: BindRequest,
    cluster: Cache,
    ledger: Ledger,
    policy: PolicyConfig,
    binder: Binder,
    recent: RecentPods,
    guard: Guard = UNGUARDED,
) -> str:
    """Bind the pod; returns "" on success, else the error for the reply's `Error` field.

    Binds to one node queue on its lock. A bind of a pod while another bind of the same pod runs (to
    another node: the scheduler gave up on the first after its timeout) is refused, so the second can
    never undo the first's reservation while the first may still succeed.
    """
    async with ledger.locked(request.node):
        refusal = guard.refusal()
        if refusal:
            return refusal
        running = ledger.running_bind(request.uid)
        if running is not None:
            return f"pod {request.key}: a bind to {running} is still running"
        with ledger.in_flight(request.uid, request.node):
            return await _bind_locked(request, cluster, ledger, policy, binder, recent, guard)


async def _bind_locked(
    request: BindRequest,
    cluster: Cache,
    ledger: Ledger,
    policy: PolicyConfig,
    binder: Binder,
    recent: RecentPods,
    guard: Guard,
) -> str:
    uid, node, key = request.uid, request.node, request.key
    record = cluster.pods.get(uid)
    if record is not None and record.node_name:
        if record.node_name == node:
            return ""
        return f"pod {key} is already bound to {record.node_name}, not {node}"
    hold = cluster.hold_of(uid)
    if hold is not None and hold.bound:
        if hold.allocation.node == node:
            return ""
        return f"pod {key} is already bound to {hold.allocation.node}, not {node}"
    pod = recent.get(uid)
    if record is None and pod is None:
        return f"pod {key} (uid {uid}) is unknown: not in the extender's cache and never filtered"
    if pod is None:
        pod = {"metadata": {"name": request.name, "namespace": request.namespace, "uid": uid}}
    if record is None:
        record = pod_record(pod, cluster.profile)
    if record.demand is None:
        return f"pod {key}: {record.problem}"
    demand = record.demand
    if demand.is_zero:
        return await _write(binder, guard, pod, node, {}, ledger, uid, key)
    state = cluster.nodes.get(node)
    if state is None or not state.known:
        return f"node {node} is not in the extender's cache"
    if hold is not None and not hold.observed:
        # An earlier decision for this pod: from before a restart (its annotations), or a bind that failed
        # uncertainly. To the same node, write the same allocation again, so that whichever binding lands
        # carries the devices the cache counts. To another node, decide afresh, unless the earlier binding
        # may still land.
        if hold.allocation.node == node:
            return await _write(binder, guard, pod, node, _annotations(hold, state, cluster.profile), ledger, uid, key)
        if ledger.still_uncertain(uid):
            return (
                f"pod {key}: an earlier binding to {hold.allocation.node} may have landed; waiting for the API to "
                "show it (or for the reservation to expire)"
            )
        ledger.release(uid)
    indexes = choose_devices(demand, state, policy.device_strategy)
    if indexes is None:
        return f"pod {key} no longer fits on {node}: {judge(demand, state, policy.unit)[1]}"
    allocation = Allocation(uid, key, node, indexes, demand.per_device)
    refusal = ledger.reserve(allocation)
    if refusal:
        return f"pod {key}: {refusal}"
    log.info("reserved %s on %s GPU %s (%s each)", key, node, ",".join(map(str, indexes)), demand.per_device)
    reserved = cluster.hold_of(uid)
    assert reserved is not None
    return await _write(binder, guard, pod, node, _annotations(reserved, state, cluster.profile), ledger, uid, key)


def _annotations(hold: Hold, state: NodeState, profile: Profile) -> dict[str, str]:
    """What records the hold on the pod; the same hold always writes the same annotations."""
    position = state.position(hold.allocation.indexes[0])
    capacity = state.devices[position].capacity if position >= 0 else 0
    return allocation_annotations(hold.allocation, capacity, hold.since, profile)


async def _write(
    binder: Binder, guard: Guard, pod: Raw, node: str, annotations: dict[str, str], ledger: Ledger, uid: str, key: str
) -> str:
    try:
        try:
            async with asyncio.timeout(guard.time_left()):
                await binder.bind(pod, node, annotations)
        except TimeoutError:
            raise BindError(
                "this replica's leadership ran out while the binding was under way", uncertain=True
            ) from None
    except BindError as error:
        if error.uncertain:
            ledger.mark_uncertain(uid)
            log.warning("bind of %s to %s failed: %s; reservation kept until the API shows the pod", key, node, error)
            return f"binding {key} to {node} failed: {error}"
        released = ledger.release(uid)
        log.warning("bind of %s to %s failed: %s%s", key, node, error, "; reservation released" if released else "")
        return f"binding {key} to {node} failed: {error}"
    except BaseException:
        ledger.release(uid)
        raise
    ledger.mark_bound(uid)
    return ""
