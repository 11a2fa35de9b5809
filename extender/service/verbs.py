"""The four extender verbs over HTTP: parse the request, ask the core, answer, count.

`POST /filter /prioritize /bind /preempt` follow the wire contract (`core/contract.py`). Every failure of a
request is a JSON body `{"Error": "..."}` naming what was wrong: 400 for a malformed body (a bad quantity, a
node name that is no string), 413 for one over the size limit; an unexpected exception is logged with its
traceback and answered 500 with a one-line message, never the traceback. Decisions are the core's
(`placement.Placer`'s filter and prioritize, `binding.bind`, `preemption.preempt_candidates`); this module
never reads the cache's indexes itself. The pages for people and probes are `pages.py`.

Handlers that never wait (filter, prioritize, preempt) are plain functions run inline by the transport; bind
awaits the binder. A filter waits only for a preemptor refused where it may have freed room, to read the
possible victims from the API first (`core/recheck.py`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, overload

import orjson
from pydantic import BaseModel, ValidationError

from extender.core import contract, jobs, objects
from extender.core.assume import assume
from extender.core.binding import BindContext, BindRequest, Guard, Outcome, bind
from extender.core.devices import Demand
from extender.core.groups import declared
from extender.core.nodes import NodeState
from extender.core.objects import Raw, pod_key, pod_priority
from extender.core.placement.config import ask_of
from extender.core.placement.filtering import FilterOutcome, summarized
from extender.core.placement.fit import Cause
from extender.core.placement.placer import Warming
from extender.core.placement.workload import shape_of
from extender.core.pods import PodRecord, pod_record
from extender.core.preemption import beyond_preemption, preempt_candidates
from extender.core.quota.admission import quota_filter
from extender.core.recheck import Recheck, suspects
from extender.core.resources import InvalidPod, required_values
from extender.service import lag, pages
from extender.service.context import Service
from extender.service.routing import Request, Response, Router, internal_error, json_error
from extender.service.transport import HttpServer

log = logging.getLogger(__name__)

Model = TypeVar("Model", bound=BaseModel)


class BadRequest(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _parse(request: Request, model: type[Model]) -> Model:
    body = request.body
    if not body:
        raise BadRequest(400, f"empty body: expected a JSON {model.__name__}")
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as error:
        raise BadRequest(400, f"body is not JSON: {error}") from None
    if not isinstance(data, dict):
        raise BadRequest(400, f"body must be a JSON object ({model.__name__}), not {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as error:
        raise BadRequest(400, f"invalid {model.__name__}: {contract.describe_error(error)}") from None


def _demand(pod: Raw, service: Service) -> Demand:
    try:
        return service.cache.protocol.pod_demand(pod)
    except InvalidPod as error:
        raise BadRequest(400, str(error)) from None


def _states(args: contract.ExtenderArgs, service: Service) -> dict[str, NodeState]:
    """Node states for the request: the cache itself for names, or views of the nodes sent whole."""
    cache = service.cache
    if args.NodeNames is None and args.Nodes is not None:
        return {objects.name(node): cache.node_view(node) for node in args.Nodes.items or ()}
    return cache.nodes


# --- answering and counting -------------------------------------------------------------------------------


VerbResult = tuple[Any, str]
"""A verb's reply body, and the error it reports ("" when none): the outcome its metrics count."""


def _respond(service: Service, name: str, started: float, result: VerbResult | Exception) -> Response:
    """Turn a verb's result (or what it raised) into the response, and count it by outcome."""
    if isinstance(result, contract.InvalidArgs):
        result = BadRequest(400, str(result))
    if isinstance(result, BadRequest):
        log.info("%s: %d %s", name, result.status, result.message)
        response, outcome = json_error(result.status, result.message), "bad_request"
    elif isinstance(result, Exception):
        response, outcome = internal_error(name, result, log), "error"
    else:
        body, error = result
        response, outcome = Response(200, orjson.dumps(body)), ("error" if error else "ok")
    count, latency = service.metrics.verbs[name, outcome]
    count.inc()
    latency.observe(time.perf_counter() - started)
    return response


def _verb(
    service: Service, name: str, handler: Callable[[Request, Service], VerbResult | Awaitable[VerbResult]]
) -> Callable[[Request], Response | Awaitable[Response]]:
    """Wrap a verb: time it, count it by outcome, and turn errors into the contract's `Error` bodies. A verb
    that must wait after all returns an awaitable of its result, and the response is then one too."""

    def handle(request: Request) -> Response | Awaitable[Response]:
        started = time.perf_counter()
        try:
            result = handler(request, service)
        except Exception as failure:  # answered within the block: no local outlives it holding the exception,
            return _respond(service, name, started, failure)  # whose traceback holds this frame (a cycle)
        if isinstance(result, tuple):  # nearly always: a tuple is checked faster than an Awaitable
            return _respond(service, name, started, result)
        return _respond_later(service, name, started, result)

    return handle


async def _respond_later(service: Service, name: str, started: float, pending: Awaitable[VerbResult]) -> Response:
    try:
        result = await pending
    except Exception as failure:
        return _respond(service, name, started, failure)
    return _respond(service, name, started, result)


# --- the verbs --------------------------------------------------------------------------------------------


def _filter(request: Request, service: Service) -> VerbResult | Awaitable[VerbResult]:
    args = _parse(request, contract.ExtenderArgs)
    return _filter_args(args, _demand(args.Pod, service), service)


def _filter_cpu(request: Request, service: Service) -> VerbResult | Awaitable[VerbResult]:
    """The filter of the second, ignorable extender entry every pod reaches on the default scheduler
    (`tools/schedconfig.cpu_entry`): a pod that asks no GPU is filtered as any (so its cpu goes where it strands
    the least GPU); one that asks a GPU passes every node sent, untouched (the first entry filtered it)."""
    args = _parse(request, contract.ExtenderArgs)
    demand = _demand(args.Pod, service)
    if not demand.is_zero:
        return contract.filter_reply(args, contract.requested_names(args), {}, {}), ""
    return _filter_args(args, demand, service)


def _filter_args(args: contract.ExtenderArgs, demand: Demand, service: Service) -> VerbResult | Awaitable[VerbResult]:
    names = contract.requested_names(args, checked=False)
    if not service.ready():
        return _not_ready_filter(args, service)
    service.recent.remember(args.Pod)
    service.metrics.demands.record(demand.per_device)
    service.ledger.unassume(objects.uid(args.Pod))  # its own assumption, from an earlier filter, is no rival
    _restore_groups(service)  # before anything is judged: after a restart, jobs' written holds come first
    member = _member_filter(args, service, defer=True)
    if isinstance(member, Warming):
        return _member_warmed(args, demand, names, service, member)
    if member is not None:
        return member
    return _filter_any(args, demand, names, service)


def _filter_any(
    args: contract.ExtenderArgs, demand: Demand, names: list[Any], service: Service
) -> VerbResult | Awaitable[VerbResult]:
    """The filter of a pod placed as any (not a member of a job placed whole)."""
    judged = _judge(args, demand, names, service, defer=True)
    if isinstance(judged, Warming):
        return _filter_warmed(args, demand, names, service, judged)
    return _answer(args, demand, names, judged, service)


async def _member_warmed(
    args: contract.ExtenderArgs, demand: Demand, names: list[Any], service: Service, warming: Warming
) -> VerbResult:
    """A member's filter whose job's plan must first judge many nodes afresh for its members' asks: a slice at a
    time with a turn of the event loop after each (as `_filter_warmed`), then filtered as any member."""
    for _ in warming.steps:
        await asyncio.sleep(0)
    if not service.ready():
        return _not_ready_filter(args, service)
    member = _member_filter(args, service)
    if member is not None:
        return member
    answer = _filter_any(args, demand, names, service)
    return answer if isinstance(answer, tuple) else await answer


@overload
def _member_filter(args: contract.ExtenderArgs, service: Service) -> VerbResult | None: ...
@overload
def _member_filter(args: contract.ExtenderArgs, service: Service, defer: bool) -> VerbResult | Warming | None: ...
def _member_filter(args: contract.ExtenderArgs, service: Service, defer: bool = False) -> VerbResult | Warming | None:
    """The filter of a pod of a job placed whole (`core/jobs.py`): passed the node planned for it alone, or
    refused on every node as unresolvable (preempting for one member frees nothing its job can use). None for a
    pod placed as any: it declares no job, asks no GPU, or its job has its minimum bound. With `defer`, a
    `Warming` when the plan must first judge many nodes (`jobs.filter_member`)."""
    said = declared(args.Pod, service.cache.podgroups)
    if said is None:
        return None
    names = contract.requested_names(args)
    record = pod_record(args.Pod, service.cache.protocol)
    verdict = jobs.filter_member(record, said, names, service.cache, service.ledger, service.placer, defer)
    if verdict is None or isinstance(verdict, Warming):
        return verdict
    metrics = service.metrics
    if verdict.planned:
        service.requeue.job_held(str(said.group))
    elif verdict.short and said.group is not None:
        service.requeue.job_short(said.group)
    if verdict.node and verdict.node in names:
        metrics.nodes_accepted.inc()
        metrics.nodes_unresolvable.inc(len(names) - 1)
        return contract.filter_reply(args, [verdict.node], {}, {}), ""
    reason = verdict.reason or f"pod {record.key} is held on node {verdict.node} for its job, not among the nodes sent"
    log.debug("filter %s: %s", record.key, reason)
    metrics.nodes_unresolvable.inc(len(names))
    return contract.filter_reply(args, [], {}, dict.fromkeys(names, reason)), ""


def _answer(
    args: contract.ExtenderArgs, demand: Demand, names: list[Any], outcome: FilterOutcome, service: Service
) -> VerbResult | Awaitable[VerbResult]:
    """The reply to a filter judged, unless a preemptor was refused where it may have freed room (then read the
    possible victims from the API first: `core/recheck.py`)."""
    recheck = service.source.recheck
    if outcome.failed and recheck is not None:
        stale = suspects(args.Pod, outcome.failed, service.cache, service.preemptions)
        if stale:
            return _filter_rechecked(args, demand, names, service, recheck, stale)
    return _filter_reply(args, demand, names, outcome, service)


async def _filter_warmed(
    args: contract.ExtenderArgs, demand: Demand, names: list[Any], service: Service, warming: Warming
) -> VerbResult:
    """A filter whose narrowing must first judge many nodes afresh (`Placer.begin_filter`): a slice at a time with
    a turn of the event loop after each, so that other requests are not held meanwhile; then judged as any."""
    for _ in warming.steps:
        await asyncio.sleep(0)
    if not service.ready():
        return _not_ready_filter(args, service)
    outcome = _judge(args, demand, names, service)
    answer = _answer(args, demand, names, outcome, service)
    return answer if isinstance(answer, tuple) else await answer


@overload
def _judge(args: contract.ExtenderArgs, demand: Demand, names: list[Any], service: Service) -> FilterOutcome: ...
@overload
def _judge(
    args: contract.ExtenderArgs, demand: Demand, names: list[Any], service: Service, defer: bool
) -> FilterOutcome | Warming: ...
def _judge(
    args: contract.ExtenderArgs, demand: Demand, names: list[Any], service: Service, defer: bool = False
) -> FilterOutcome | Warming:
    """Which of the nodes named the pod fits, by the cache as it is now (`placement.Placer.filter`; with `defer`,
    `Placer.begin_filter`)."""
    cache, placer = service.cache, service.placer
    ask = ask_of(args.Pod, demand)
    uid = objects.uid(args.Pod)
    if uid not in cache.pods:  # the watch showed it first, nearly always: it is learned already
        label = cache.protocol.model_label
        placer.learned.asked(uid, shape_of(demand, ask.cpu, ask.memory, required_values(args.Pod, label)))
    states = _states(args, service)
    admit = _both(
        quota_filter(args.Pod, demand, placer, service.quotas, states, ask),
        jobs.held_room(uid, ask, states, cache, service.ledger),
    )
    if defer:
        return placer.begin_filter(demand, names, states, pod_key(args.Pod), ask, admit)
    return placer.filter(demand, names, states, pod_key(args.Pod), ask, admit)


def _both(
    first: Callable[[FilterOutcome], None] | None, second: Callable[[FilterOutcome], None] | None
) -> Callable[[FilterOutcome], None] | None:
    """Two checks of a filter's outcome (`Placer.filter`'s `admit`) as one, either of them None."""
    if first is None or second is None:
        return first or second

    def admit(outcome: FilterOutcome) -> None:
        first(outcome)
        second(outcome)

    return admit


def _not_ready_filter(args: contract.ExtenderArgs, service: Service) -> VerbResult:
    reason = service.source.why_not_ready() or ""
    return contract.filter_reply(args, [], {}, {}, reason), reason


async def _filter_rechecked(
    args: contract.ExtenderArgs,
    demand: Demand,
    names: list[Any],
    service: Service,
    recheck: Recheck,
    stale: list[PodRecord],
) -> VerbResult:
    """The filter of a preemptor refused nodes it may have freed: read the possible victims there from the API
    first, then judge again (`core/recheck.py`)."""
    answer = await recheck(stale)
    result = "freed" if answer.gone else "unanswered" if answer.unanswered else "unchanged"
    service.metrics.rechecks.labels(result).inc()
    if not service.ready():
        return _not_ready_filter(args, service)
    if answer.gone:
        log.info(
            "filter %s: %d of %d pods counted where it may have freed room are gone from the API (the watch is behind)",
            pod_key(args.Pod),
            answer.gone,
            len(stale),
        )
    # Judged again in any case: binds and watch events went on during the reads.
    outcome = _judge(args, demand, names, service)
    return _filter_reply(args, demand, names, outcome, service)


def _filter_reply(
    args: contract.ExtenderArgs, demand: Demand, names: list[Any], outcome: FilterOutcome, service: Service
) -> VerbResult:
    if len(outcome.passed) == 1 and _states(args, service) is service.cache.nodes:
        pod = args.Pod
        ask = ask_of(pod, demand)
        assume(objects.uid(pod), pod_key(pod), outcome.passed[0], demand, ask, service.placer, service.ledger)
    metrics = service.metrics
    metrics.nodes_accepted.inc(len(outcome.passed))
    if outcome.failed:
        metrics.nodes_failed.inc(len(outcome.failed))
    if outcome.unresolvable:
        metrics.nodes_unresolvable.inc(len(outcome.unresolvable))
    for cause, count in outcome.causes.items():
        metrics.rejected_by[cause].inc(count)
    if outcome.passed:
        # The nodes refused are counted above, and left out of the reply: kube-scheduler reads an extender's
        # refusals only into the diagnosis of a pod it cannot place (`findNodesThatPassExtenders`, then
        # PostFilter only when no node is feasible: pkg/scheduler/schedule_one.go at v1.34.1), so with a node
        # passed they cost a map of a thousand reasons to encode, send and decode for nothing.
        return contract.filter_reply(args, outcome.passed, {}, {}), ""
    failed, unresolvable = outcome.failed, outcome.unresolvable
    if failed or outcome.causes[Cause.QUOTA]:
        log.debug("filter %s: none of %d nodes fit", pod_key(args.Pod), len(names))
        if not demand.is_zero:
            service.requeue.refused(objects.uid(args.Pod), demand, objects.namespace(args.Pod))
        failed = summarized(outcome, demand, service.cache.protocol.unit)
        hopeless = beyond_preemption({node: failed[node] for node in outcome.full}, service.cache, args.Pod)
        if hopeless:
            failed = {node: reason for node, reason in failed.items() if node not in hopeless}
            unresolvable = unresolvable | hopeless
    return contract.filter_reply(args, outcome.passed, failed, unresolvable), ""


def _prioritize(request: Request, service: Service) -> VerbResult:
    args = _parse(request, contract.ExtenderArgs)
    demand = _demand(args.Pod, service)
    names = contract.requested_names(args)
    ask = ask_of(args.Pod, demand)
    return service.placer.prioritize(demand, names, _states(args, service), ask), ""


async def _bind(request: Request, service: Service) -> VerbResult:
    args = _parse(request, contract.ExtenderBindingArgs)
    source = service.source
    reason = source.why_not_ready()
    if reason:
        return contract.binding_reply(reason), reason
    target = BindRequest(args.PodName, args.PodNamespace, args.PodUID, args.Node)
    reply_by = asyncio.get_running_loop().time() + service.http_timeout  # when kube-scheduler stops waiting
    guard = Guard(lambda: source.why_not_ready() or None, source.binding_time_left, reply_by)
    context = BindContext(service.cache, service.ledger, service.placer, source.binder, service.recent, guard)
    outcome = await bind(target, context)
    service.metrics.binds.labels(outcome.outcome.value).inc()
    if outcome.ok:
        if outcome.outcome is Outcome.ALREADY_BOUND:  # a new binding is logged by `bind`, with its GPUs
            log.info("bind %s to %s: already bound there", target.key, target.node)
        service.preemptions.forget(target.uid)
        service.requeue.bound(target.uid)
    else:
        log.warning("bind %s to %s: %s", target.key, target.node, outcome.error)
        source.bind_failed(target, outcome.error)
    return contract.binding_reply(outcome.error), outcome.error


def _preempt(request: Request, service: Service) -> VerbResult:
    args = _parse(request, contract.ExtenderPreemptionArgs)
    demand = _demand(args.Pod, service)
    candidates, violations = contract.preemption_candidates(args)
    priority, namespace = pod_priority(args.Pod), objects.namespace(args.Pod)
    kept = preempt_candidates(demand, candidates, service.cache, priority, namespace, service.quotas)
    if not demand.is_zero:
        service.preemptions.remember(objects.uid(args.Pod), kept)
    return contract.preemption_reply(kept, violations), ""


# --- the server -------------------------------------------------------------------------------------------


async def _expiry_sweep(service: Service) -> None:
    """Free reservations the API never confirmed, and let nodes whose device plugin's lock is stale take pods
    again, every `expiry_interval` seconds. A round that fails is logged and the next one runs: a sweep that
    stopped would leave every reservation and lock held for good."""
    while True:
        await asyncio.sleep(service.expiry_interval)
        try:
            _expire(service)
        except Exception:
            log.exception("expiring reservations and node locks failed; trying again in %g s", service.expiry_interval)


def _restore_groups(service: Service) -> None:
    """Hold again the jobs whose hold their members' binds wrote and this replica lost (`Ledger.restore_groups`),
    and ask kube-scheduler to retry their members refused meanwhile."""
    for job in service.ledger.restore_groups():
        service.requeue.job_held(str(job))


def _expire(service: Service) -> None:
    """One round of the sweep."""
    for hold in service.ledger.expire(include_bound=service.source.cache_current()):
        service.metrics.expiries.inc()
        allocation = hold.allocation
        log.warning(
            "reservation of %s on %s GPU %s expired: the API never showed the pod bound",
            allocation.pod,
            allocation.node,
            ",".join(map(str, allocation.indexes)),
        )
        service.requeue.freed((allocation.node,), hold.since)
    for released in service.ledger.expire_groups():
        group = released.group
        service.metrics.group_expiries.inc()
        nodes = sorted({hold.allocation.node for hold in released.holds})
        log.warning("hold of job %s on %s let go: %s", group.key, ", ".join(nodes) or "no node", released.why)
        service.requeue.freed(nodes, group.since)
    if service.ready():  # a standby holds nothing: the leader's binds would then look to it like members lost
        _restore_groups(service)
    stale = service.cache.expire_locks()
    if stale:
        log.warning(
            "device plugin locks older than %g s on %s: taken over by the next bind",
            service.cache.lock_timeout,
            ", ".join(stale),
        )
        service.requeue.freed(stale, service.cache.clock() - service.cache.lock_timeout)


def build_server(service: Service) -> HttpServer:
    """The HTTP server for a service, not yet listening: `await server.start(host, port, ssl_context)`."""
    router = Router()
    router.add("POST", "/filter", _verb(service, "filter", _filter))
    router.add("POST", "/filter-cpu", _verb(service, "filter-cpu", _filter_cpu))
    router.add("POST", "/prioritize", _verb(service, "prioritize", _prioritize))
    router.add("POST", "/bind", _verb(service, "bind", _bind))
    router.add("POST", "/preempt", _verb(service, "preempt", _preempt))
    for path, page in pages.ALL:
        router.add("GET", path, functools.partial(page, service))

    async def expiry_sweep() -> None:
        await _expiry_sweep(service)

    async def loop_lag() -> None:
        await lag.probe(service.metrics)

    server = HttpServer(router, service.max_body_bytes, service.limits, (expiry_sweep, loop_lag))
    service.metrics.add_listener("verbs", server)
    return server
