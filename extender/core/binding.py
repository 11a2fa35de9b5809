"""The bind verb's procedure: choose devices, reserve, write the allocation, bind; undo on any failure.

This is where the ledger's rules meet I/O (DESIGN §3). Under the node's lock, in this order:
1. **Known?** The pod must be one the cache or a recent filter has seen, under the UID, namespace and name the
   bind names, and the node one the cache knows (for every pod, whatever it asks).
2. **Already settled?** A pod the API shows bound, or whose binding the API accepted, is success when it is
   bound to this node (bind is idempotent) and an error otherwise. **Runnable?** A pod the nodes' device plugin
   could run nowhere (`DeviceProtocol.refusal`: gpushare and several GPUs) is refused, as its filter was.
3. **An earlier decision?** A reservation from before a restart, or from a binding that failed uncertainly:
   to the same node, the same allocation is written again, so whichever binding lands carries the devices the
   cache counts; to another node, it is released and the pod decided afresh, unless that binding may still
   land.
   A member of a job held whole takes its hold (`jobs.py`) when the bind is to the node planned for it, and is
   refused elsewhere; one whose job lacks members bound and holds nothing is refused (its next filter plans
   the job whole), so a job is never placed in part.
4. **A new allocation:** the policy chooses devices and the ledger reserves them (check and record in one
   step); or, when the pod's filter assumed it on this node and it still fits there, what it assumed is reserved
   as it is (`assume.py`).
Then, with the node's lock released, the `Binder` (the file source's, or the API's) writes the annotations
and the binding. The decision needs no await, so the lock orders decisions, not writes: binds to one node
(binpack sends consecutive pods to the same node) write concurrently, each with the memory its reservation
took, which the next decision counts as used. What stays ordered is one pod on one node: a second bind of the
same pod to the same node waits for the first to finish, then finds it settled.
Any failure releases the reservation before the reply, except one after which the binding may have landed.
The outcome is a value (`BindOutcome`) that the verb answers and counts.

The Binder does I/O; this module only awaits it.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import enum
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Protocol

from extender.core import jobplan, jobs, objects
from extender.core.cache import Cache
from extender.core.devices import Demand
from extender.core.holds import Allocation, Hold, HoldState
from extender.core.ledger import Ledger
from extender.core.memo import Lru
from extender.core.nodes import NodeState
from extender.core.objects import Raw
from extender.core.objects import uid as pod_uid
from extender.core.placement.config import ask_of
from extender.core.placement.placer import Placer
from extender.core.pods import PodRecord, pod_record
from extender.core.protocols import DeviceProtocol

log = logging.getLogger(__name__)


class BindError(Exception):
    """Writing the allocation or the binding failed; the message says which step and why.

    `uncertain` means the binding may have landed all the same (the request timed out or the connection
    dropped after it was sent, and checking failed too). The reservation is then kept, not released: the
    watch turns it into the observed allocation if the binding landed, and the ledger's TTL frees it if not.
    Releasing it at once could give the same memory to another pod while the first one starts on it.
    """

    def __init__(self, message: str, uncertain: bool = False, refused: bool = False) -> None:
        super().__init__(message)
        self.uncertain = uncertain
        self.refused = refused
        """Nothing was written: the node cannot take the pod now (its device plugin's lock is held for another)."""


class Binder(Protocol):
    async def bind(self, pod: Raw, node: str, annotations: dict[str, str]) -> None:
        """Write `annotations` on the pod (when any), then bind it to `node`. Raises BindError."""


REPLY_MARGIN = 1.0
"""Seconds before kube-scheduler stops waiting for a bind (its httpTimeout) from which the bind starts no write:
what a write may take to land. kube-scheduler that has given up on a bind forgets the pod's room on the node and
may place other pods in it; a Binding landing after that puts more on the node than it has (seen under load in
the churn replay: a bind queued behind HAMi's node lock bound a pod seconds after kube-scheduler gave up)."""

TOO_LATE = "kube-scheduler stops waiting for this bind (its httpTimeout) before it could land"
_reply_by: contextvars.ContextVar[float | None] = contextvars.ContextVar("reply_by", default=None)
"""The loop time at which kube-scheduler stops waiting for the bind under way in this task (`Guard.reply_by`)."""


def _write_time(reply_by: float | None) -> float | None:
    """Seconds left to start a write before `reply_by` (kube-scheduler's wait, less `REPLY_MARGIN`); None: no limit."""
    return None if reply_by is None else reply_by - REPLY_MARGIN - asyncio.get_running_loop().time()


def reply_left() -> float | None:
    """`_write_time` of the bind under way in this task; None outside a bind (or the file source's, tests')."""
    return _write_time(_reply_by.get())


def may_still_write(what: str) -> None:
    """Raise BindError (nothing written, so nothing left to undo but what the caller took) when the bind under way
    may no longer start `what`: kube-scheduler would have stopped waiting before it lands, and tries the pod
    again."""
    left = reply_left()
    if left is not None and left <= 0:
        raise BindError(f"not {what}: {TOO_LATE}; it tries the pod again", refused=True)


@dataclass(frozen=True, slots=True)
class Guard:
    """What a replica asks before and while it binds: may it bind at all (synced, leading), and for how long
    is it sure to stay allowed (its lease's renew deadline). Checked again once the node's lock is held: a
    bind that queued (behind another bind of the same pod) may find the lease lost meanwhile."""

    refusal: Callable[[], str | None] = lambda: None
    """Why this replica may not bind now (not synced, not the leader); None when it may."""
    time_left: Callable[[], float | None] = lambda: None
    """Seconds it surely may still bind, as of now (None: no limit); each renewal of the lease moves it on. A
    binding is not started once it is 0, and one under way when it reaches 0 is cut off, its reservation kept
    as uncertain: another replica may take over, and the binding may still land (`_while_allowed`)."""
    reply_by: float | None = None
    """The loop time at which kube-scheduler stops waiting for this bind: the request's arrival plus its
    httpTimeout (None: no limit). No write starts within `REPLY_MARGIN` of it (`may_still_write`)."""

    def refuses(self) -> str | None:
        """Why this replica may not start a bind now: `refusal`, a lease whose time has run out (the elector
        may not have said so yet: it is told at the same deadline, and on its own thread), or kube-scheduler's
        wait nearly over (the bind queued behind another bind of the same pod)."""
        refusal = self.refusal()
        if refusal is None:
            left = self.time_left()
            if left is not None and left <= 0:
                return "this replica's lease has run out (not renewed in time); another replica may lead now"
            reply = _write_time(self.reply_by)
            if reply is not None and reply <= 0:
                return TOO_LATE
        return refusal


UNGUARDED = Guard()


@dataclass(frozen=True, slots=True)
class BindRequest:
    name: str
    namespace: str
    uid: str
    node: str

    @property
    def key(self) -> str:
        return objects.key(self.namespace, self.name)


def slim_pod(pod: Raw) -> Raw:
    """The parts of a pod a bind needs (identity, labels and annotations, container resources and overhead,
    scheduling gates, node and phase), to keep many pods cheaply: a whole pod is kilobytes of volumes, probes and
    managed fields. Labels and gates: the job it starts with (`groups.declared`) and whether it may start yet."""
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
    if isinstance(spec.get("overhead"), dict):
        slim_spec["overhead"] = spec["overhead"]  # counted with the containers' cpu and memory
    if spec.get("schedulingGates"):
        slim_spec["schedulingGates"] = spec["schedulingGates"]
    return {
        "metadata": {
            "name": meta.get("name"),
            "namespace": meta.get("namespace") or "default",
            "uid": meta.get("uid"),
            "labels": dict(meta.get("labels") or {}),
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
        self._pods: Lru[str, Raw] = Lru(limit)

    def remember(self, pod: Raw) -> None:
        uid = pod_uid(pod)
        if uid and self._pods.touch(uid) is None:
            self._pods.put(uid, slim_pod(pod))

    def get(self, uid: str) -> Raw | None:
        return self._pods.get(uid)

    def __len__(self) -> int:
        return len(self._pods)


class Outcome(enum.Enum):
    BOUND = "bound"
    """Devices chosen (or an earlier decision written again) and the binding accepted."""
    ALREADY_BOUND = "already_bound"
    """The pod was bound to this node already: success, nothing written."""
    REFUSED = "refused"
    """Nothing was written: this replica may not bind now, the pod or node is unknown, or it does not fit."""
    FAILED = "failed"
    """Writing the allocation or the binding failed; the reservation is released."""
    UNCERTAIN = "uncertain"
    """Writing failed in a way that may have landed; the reservation is kept until the watch or the TTL."""


@dataclass(frozen=True, slots=True)
class BindOutcome:
    outcome: Outcome
    error: str = ""
    """What the reply's `Error` says: "" on success, else what failed, naming the pod and the node."""

    @property
    def ok(self) -> bool:
        return self.outcome in (Outcome.BOUND, Outcome.ALREADY_BOUND)


BOUND = BindOutcome(Outcome.BOUND)
ALREADY_BOUND = BindOutcome(Outcome.ALREADY_BOUND)


def _refused(error: str) -> BindOutcome:
    return BindOutcome(Outcome.REFUSED, error)


@dataclass(frozen=True, slots=True)
class BindContext:
    """What a bind works with: the cache and the ledger, how to choose, how to write, and what it may."""

    cache: Cache
    ledger: Ledger
    placer: Placer
    """Chooses the GPUs on the node (`placement/`)."""
    binder: Binder
    recent: RecentPods
    guard: Guard = UNGUARDED


@dataclass(frozen=True, slots=True)
class Write:
    """A decision to write: the pod as known, what it holds on the node (None: nothing, it asks no device),
    and the node's state the annotations are read from."""

    pod: Raw
    hold: Hold | None
    state: NodeState
    written: str | None = None
    """For a member of a job held whole: its job's hold as it stands, written beside its allocation (`jobplan.py`)."""


def _one_pod_on_node(request: BindRequest) -> str:
    """The name of the lock that orders binds of one pod to one node. Never a node's name: node names have no
    "/"."""
    return f"{request.node}/{request.uid}"


async def bind(request: BindRequest, context: BindContext) -> BindOutcome:
    """Bind the pod (the steps in the module's docstring).

    The decision is taken under the node's lock and the write after it is released. A bind of a pod while
    another bind of the same pod runs to another node (the scheduler gave up on the first after its timeout)
    is refused, so the second can never undo the first's reservation while the first may still succeed; to
    the same node it waits for the first (the pod's lock on that node), then answers as that one settled.
    """
    reply_by = _reply_by.set(context.guard.reply_by)  # for the writes' last checks (`may_still_write`)
    try:
        return await _bind(request, context)
    finally:
        _reply_by.reset(reply_by)


async def _bind(request: BindRequest, context: BindContext) -> BindOutcome:
    ledger = context.ledger
    async with ledger.locked(_one_pod_on_node(request)):
        with contextlib.ExitStack() as running:
            async with ledger.locked(request.node):
                refusal = context.guard.refuses()
                if refusal is not None:
                    return _refused(refusal)
                other = ledger.running_bind(request.uid)
                if other is not None:
                    return _refused(f"pod {request.key}: a bind to {other} is still running")
                running.enter_context(ledger.in_flight(request.uid, request.node))
                decided = _decide(request, context)
            if isinstance(decided, BindOutcome):
                return decided
            return await _write(request, context, decided)


def _decide(request: BindRequest, context: BindContext) -> BindOutcome | Write:
    """Steps 1 to 4, without an await: the outcome when nothing is to be written, else what to write (the
    reservation, if any, already recorded)."""
    known = _known(request, context)
    if isinstance(known, BindOutcome):
        return known
    pod, record, state = known
    settled = _settled(request, record, context.cache)
    if settled is not None:
        return settled
    if record.demand is None:
        return _refused(f"pod {request.key}: {record.unreadable}")
    if record.demand.is_zero:
        return Write(pod, None, state)
    refusal = context.cache.protocol.refusal(record.demand)
    if refusal is not None:  # as its filter refused it on every node
        return _refused(f"pod {request.key}: {refusal}")
    hold = context.cache.hold_of(request.uid)
    if hold is not None and hold.state is HoldState.GROUPED:  # a member of a job held whole (`jobs.py`)
        job = context.ledger.group_of(request.uid)
        taken = context.ledger.take_grouped(request.uid, request.node)
        if taken is not None:
            return Write(pod, taken, state, context.ledger.written(job))
        if context.ledger.group_of(request.uid) is None:
            return _refused(f"pod {request.key}: job {job} lost a member it was held for; it is planned again whole")
        return _refused(f"pod {request.key} is held on {hold.allocation.node} for job {job}, not on {request.node}")
    if hold is None:
        unheld = jobs.unheld(record, context.cache, context.ledger)
        if unheld is not None:
            return _refused(unheld)
    if hold is not None and hold.state is HoldState.ASSUMED:  # its filter's assumption: now decided for real
        taken = context.ledger.take_assumed(request.uid, request.node, context.placer.build())
        if taken is not None:
            return Write(pod, taken, state)
        context.ledger.unassume(request.uid)
        hold = None
    if hold is not None and not hold.observed:
        earlier = _earlier_decision(request, context, pod, hold, state)
        if earlier is not None:
            return earlier
    job = context.ledger.waiting_on().get(request.node)
    if job is not None:  # its filter may have come before the job's plan took this node's cpu and memory
        here = hold is not None and hold.allocation.node == request.node  # its requests are counted there
        crowded = jobs.crowds(record.cpu, record.memory, state, job, counted=here)
        if crowded is not None:
            return _refused(f"pod {request.key}: {crowded}")
    return _new_allocation(request, context, pod, record.demand, state)


def _known(request: BindRequest, context: BindContext) -> tuple[Raw, PodRecord, NodeState] | BindOutcome:
    """The pod as the cache or a recent filter knows it, its record, and the node's state; or the refusal when
    the pod is unknown, known under another name, or the node is not in the cache."""
    uid, key = request.uid, request.key
    record = context.cache.pods.get(uid)
    pod = context.recent.get(uid)
    if record is None and pod is None:
        return _refused(f"pod {key} (uid {uid}) is unknown: not in the extender's cache and never filtered")
    if pod is None:
        pod = {"metadata": {"name": request.name, "namespace": request.namespace, "uid": uid}}
    if record is None:
        record = pod_record(pod, context.cache.protocol)
    if (record.namespace, record.name) != (request.namespace, request.name):
        return _refused(f"pod uid {uid} is {record.key}, not {key}")
    state = context.cache.nodes.get(request.node)
    if state is None or not state.known:
        return _refused(f"node {request.node} is not in the extender's cache")
    return pod, record, state


def _settled(request: BindRequest, record: PodRecord, cache: Cache) -> BindOutcome | None:
    """Success when the API shows the pod bound to this node, or accepted its binding there; an error when
    to another node; None when the pod is not bound yet."""
    bound_to = record.node_name
    if not bound_to:
        hold = cache.hold_of(request.uid)
        bound_to = hold.allocation.node if hold is not None and hold.state is HoldState.BOUND else ""
    if not bound_to:
        return None
    if bound_to == request.node:
        return ALREADY_BOUND
    return _refused(f"pod {request.key} is already bound to {bound_to}, not {request.node}")


def _earlier_decision(
    request: BindRequest, context: BindContext, pod: Raw, hold: Hold, state: NodeState
) -> BindOutcome | Write | None:
    """A reservation made before this bind (before a restart, or by a binding that failed uncertainly): to the
    same node, write it again; to another node, release it (None: decide afresh), unless it may still land."""
    if hold.allocation.node == request.node:
        return Write(pod, hold, state)
    if context.ledger.still_uncertain(request.uid):
        return _refused(
            f"pod {request.key}: an earlier binding to {hold.allocation.node} may have landed; waiting for the API "
            "to show it (or for the reservation to expire)"
        )
    context.ledger.release(request.uid)
    return None


def _new_allocation(
    request: BindRequest, context: BindContext, pod: Raw, demand: Demand, state: NodeState
) -> BindOutcome | Write:
    """Choose devices by policy and reserve them (check and record in one step)."""
    key, node = request.key, request.node
    placed = context.placer.choose(demand, state, ask_of(pod, demand))
    if placed is None:
        return _refused(f"pod {key} no longer fits on {node}: {context.placer.judge(demand, state, key).reason}")
    allocation = Allocation(request.uid, key, node, placed.containers, placed.init_containers)
    refusal = context.ledger.reserve(allocation)
    if refusal is not None:
        return _refused(f"pod {key}: {refusal}")
    if log.isEnabledFor(logging.DEBUG):
        log.debug("reserved %s on %s GPU %s (%s in all)", key, node, _indexes(allocation), allocation.memory)
    return Write(pod, context.cache.hold_of(request.uid), state)


@contextlib.asynccontextmanager
async def _while_allowed(time_left: Callable[[], float | None]) -> AsyncIterator[None]:
    """Run the block while this replica may bind; cut it off (TimeoutError) once `time_left` reaches 0.

    The deadline follows the lease: when it comes due it is read again, and a renewal meanwhile has moved it
    on, so a write runs as long as the lease it runs under is renewed. (It used to be fixed when the write
    began: with the lease renewed every retry period, a bind slower than the renew deadline minus one retry
    period, 1.5 s in the e2e tier, failed on a replica that never stopped leading, issue 19.)
    """
    loop = asyncio.get_running_loop()
    async with asyncio.timeout(None) as scope:
        due: asyncio.TimerHandle | None = None

        def check() -> None:
            nonlocal due
            left = time_left()
            if left is None:
                due = None
            elif left <= 0:
                scope.reschedule(loop.time())
            else:
                due = loop.call_later(left, check)

        check()
        try:
            yield
        finally:
            if due is not None:
                due.cancel()


def _indexes(allocation: Allocation) -> str:
    return ",".join(map(str, allocation.indexes))


def _annotations(write: Write, protocol: DeviceProtocol) -> dict[str, str]:
    """What records the hold on the pod ({} for a pod that holds nothing): the same hold always writes the same
    allocation; a member of a job held whole, its job's hold as well, while members of it wait."""
    hold = write.hold
    if hold is None:
        return {}
    written = {jobplan.ANNOTATION: write.written} if write.written is not None else {}
    return protocol.allocation_annotations(hold.allocation, write.state.devices, hold.since) | written


async def _write(request: BindRequest, context: BindContext, write: Write) -> BindOutcome:
    """Write the annotations and the binding (within the guard's time); settle the reservation by the result."""
    key, node, ledger = request.key, request.node, context.ledger
    annotations = _annotations(write, context.cache.protocol)
    try:
        try:
            async with _while_allowed(context.guard.time_left):
                await context.binder.bind(write.pod, node, annotations)
        except TimeoutError:
            raise BindError(
                "this replica's leadership ran out while the binding was under way", uncertain=True
            ) from None
    except BindError as error:
        if error.uncertain:
            ledger.mark_uncertain(request.uid)
            log.warning("bind of %s to %s failed: %s; reservation kept until the API shows the pod", key, node, error)
            return BindOutcome(Outcome.UNCERTAIN, f"binding {key} to {node} failed: {error}")
        released = ledger.release(request.uid)
        let_go = ledger.release_group(ledger.group_of(request.uid))  # the job is planned again, whole
        if let_go:
            log.warning("bind of %s failed: the %d other holds of its job let go", key, len(let_go))
        if error.refused:
            return _refused(f"pod {key}: {error}")
        log.warning("bind of %s to %s failed: %s%s", key, node, error, "; reservation released" if released else "")
        return BindOutcome(Outcome.FAILED, f"binding {key} to {node} failed: {error}")
    except BaseException:
        ledger.release(request.uid)
        raise
    ledger.mark_bound(request.uid)
    if write.hold is None:
        log.info("bound %s to %s (no GPU)", key, node)
    else:
        allocation = write.hold.allocation
        log.info("bound %s to %s GPU %s (%s in all)", key, node, _indexes(allocation), allocation.memory)
    return BOUND
