"""The HTTP service: the four extender verbs, health, readiness, metrics and inspection.

`POST /filter /prioritize /bind /preempt` follow the wire contract (`contract.py`); `GET /healthz /readyz
/metrics /inspect /inspect/{node}` are for people and probes. Every failure of a request is a JSON body
`{"Error": "..."}` naming what was wrong: 400 for a malformed body, 413 for one over the size limit, 404 for
an unknown route or node, 405 for a wrong method; an unexpected exception is logged with its traceback and
answered 500 with a one-line message, never the traceback. The reservation expiry sweep runs beside the
server and stops with it.

The transport is `httpserver.py` (why not aiohttp's server: measured there). Handlers that never wait
(filter, prioritize, preempt, the GETs) are plain functions run inline; bind awaits the binder. A filter
waits only for a preemptor refused where it may have freed room, to read the possible victims from the API
first (`recheck.py`). Per request
the work is an orjson decode, a pydantic validation, and a set membership or a memo lookup per node name (the
cache keeps per-node summaries and fit sets current).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import orjson
from pydantic import BaseModel, ValidationError

from extender.core import contract, objects
from extender.core.binding import Binder, BindRequest, Guard, RecentPods, bind
from extender.core.cache import Cache, Hold, NodeState, PodRecord
from extender.core.ledger import Ledger
from extender.core.objects import Raw, pod_key, pod_priority
from extender.core.objects import uid as pod_uid
from extender.core.policy import (
    FilterOutcome,
    PolicyConfig,
    all_fit,
    filter_nodes,
    judge_key,
    preempt_candidates,
    score_key,
    score_node,
)
from extender.core.recheck import Preemptions, Recheck, suspects
from extender.core.requeue import Refusals, fits_any
from extender.core.resources import Demand, InvalidPod, pod_demand
from extender.service.metrics import Metrics
from extender.service.transport import HttpServer, Request, Response, Router, json_error

log = logging.getLogger(__name__)

Model = TypeVar("Model", bound=BaseModel)


@dataclass(slots=True)
class Service:
    """Everything the handlers share; built once by the caller (cli, tests, demo) and passed in."""

    cache: Cache
    ledger: Ledger
    binder: Binder
    policy: PolicyConfig
    metrics: Metrics = field(default_factory=Metrics)
    recent: RecentPods = field(default_factory=RecentPods)
    ready: Callable[[], bool] = lambda: True
    """True once the cache holds a full listing (and, with leader election, on the leader)."""
    synced: Callable[[], bool] = lambda: True
    """True once the cache holds a full listing, leader or not (/synced)."""
    why_not_ready: Callable[[], str] = lambda: NOT_READY
    """Why `ready()` is False, for /readyz and for refused verbs."""
    problem: Callable[[], str] = lambda: ""
    """"" while the loops feeding the cache run, else which stopped: /healthz answers 500 with it."""
    binding_time_left: Callable[[], float | None] = lambda: None
    """Seconds this replica surely may still bind (its lease's renew deadline); None: no limit."""
    cache_current: Callable[[], bool] = lambda: True
    """False while the source's watch is failing: bound reservations are then not expired (see Ledger.expire)."""
    on_bind_failure: Callable[[BindRequest, str], None] | None = None
    """Told of every bind that failed (the API source records an Event on the pod)."""
    recheck: Recheck | None = None
    """Reads pods from the API before a preemptor is refused a node it may have freed (`recheck.py`); None
    where the cache is the only truth (the file source)."""
    preemptions: Preemptions = field(default_factory=Preemptions)
    requeue: Callable[[str], None] | None = None
    """Asks kube-scheduler to retry the pods an extender rejected (the API source annotates its own pod; see
    `requeue.py`), saying why; None where there is no way to (the file source, or no --pod-name)."""
    refusals: Refusals = field(default_factory=Refusals)
    expiry_interval: float = 5.0
    max_body_bytes: int = 32 * 1024 * 1024


NOT_READY = "extender is not ready: its cache has not been filled yet"


class BadRequest(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _json(body: Any, status: int = 200) -> Response:
    return Response(status, orjson.dumps(body))


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
        return pod_demand(pod, service.cache.profile)
    except InvalidPod as error:
        raise BadRequest(400, str(error)) from None


def _states(args: contract.ExtenderArgs, cluster: Cache) -> dict[str, NodeState]:
    """Node states for the request: the cache itself for names, or views of the nodes sent whole."""
    if args.NodeNames is None and args.Nodes is not None:
        return {objects.name(node): cluster.describe(node) for node in args.Nodes.items or ()}
    return cluster.nodes


# --- verbs ------------------------------------------------------------------------------------------------


VerbResult = tuple[Any, str]
"""A verb's reply body, and the error it reports ("" when none): the outcome its metrics count."""


def _respond(service: Service, name: str, started: float, result: VerbResult | Exception) -> Response:
    """Turn a verb's result (or what it raised) into the response, and count it by outcome."""
    if isinstance(result, BadRequest):
        log.info("%s: %d %s", name, result.status, result.message)
        response, outcome = json_error(result.status, result.message), "bad_request"
    elif isinstance(result, Exception):
        log.error("%s: unexpected failure", name, exc_info=result)
        message = f"internal error in {name}: {type(result).__name__}: {result}"
        response, outcome = json_error(500, message), "error"
    else:
        body, error = result
        response, outcome = _json(body), ("error" if error else "ok")
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
            result: VerbResult | Awaitable[VerbResult] | Exception = handler(request, service)
        except Exception as failure:
            result = failure
        if isinstance(result, tuple | Exception):  # nearly always: a tuple is checked faster than an Awaitable
            return _respond(service, name, started, result)
        return _respond_later(service, name, started, result)

    return handle


async def _respond_later(service: Service, name: str, started: float, pending: Awaitable[VerbResult]) -> Response:
    try:
        result: VerbResult | Exception = await pending
    except Exception as failure:
        result = failure
    return _respond(service, name, started, result)


def _async_verb(
    service: Service, name: str, handler: Callable[[Request, Service], Awaitable[VerbResult]]
) -> Callable[[Request], Awaitable[Response]]:
    def handle(request: Request) -> Awaitable[Response]:
        return _respond_later(service, name, time.perf_counter(), handler(request, service))

    return handle


def _filter(request: Request, service: Service) -> VerbResult | Awaitable[VerbResult]:
    args = _parse(request, contract.ExtenderArgs)
    demand = _demand(args.Pod, service)
    names = contract.requested_names(args, checked=False)
    if not service.ready():
        return _not_ready_filter(args, service)
    service.recent.remember(args.Pod)
    outcome = _judge(args, demand, names, service)
    if outcome.failed and service.recheck is not None:
        stale = suspects(args.Pod, outcome.failed, service.cache, service.preemptions)
        if stale:
            return _filter_rechecked(args, demand, names, service, service.recheck, stale)
    return _filter_reply(args, demand, names, outcome, service)


def _not_ready_filter(args: contract.ExtenderArgs, service: Service) -> VerbResult:
    reason = service.why_not_ready()
    return contract.filter_reply(args, [], {}, {}, reason), reason


def _judge(args: contract.ExtenderArgs, demand: Demand, names: list[Any], service: Service) -> FilterOutcome:
    cluster, unit = service.cache, service.policy.unit
    states = _states(args, cluster)
    own_cache = states is cluster.nodes and not demand.is_zero  # views of nodes sent whole have no indexes
    fitting = cluster.fit_index.fitting(demand.per_device, states) if own_cache and demand.devices == 1 else None
    if fitting is not None and all_fit(demand, names, fitting):
        return FilterOutcome(passed=names)  # the common case: every name is a node that takes the pod
    memo = cluster.memo.table(judge_key(demand, unit)) if own_cache else None
    return filter_nodes(demand, _checked(names, args), states, unit, fitting, memo)


async def _filter_rechecked(
    args: contract.ExtenderArgs,
    demand: Demand,
    names: list[Any],
    service: Service,
    recheck: Recheck,
    stale: list[PodRecord],
) -> VerbResult:
    """The filter of a preemptor refused nodes it may have freed: read the possible victims there from the API
    first, then judge again (`recheck.py`)."""
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
    return _filter_reply(args, demand, names, _judge(args, demand, names, service), service)


def _filter_reply(
    args: contract.ExtenderArgs, demand: Demand, names: list[Any], outcome: FilterOutcome, service: Service
) -> VerbResult:
    metrics = service.metrics
    metrics.nodes_accepted.inc(len(outcome.passed))
    if outcome.failed:
        metrics.nodes_failed.inc(len(outcome.failed))
    if outcome.unresolvable:
        metrics.nodes_unresolvable.inc(len(outcome.unresolvable))
    if demand.memory and len(outcome.passed) < len(names):
        log.debug("filter %s: %d of %d nodes fit", pod_key(args.Pod), len(outcome.passed), len(names))
        if not outcome.passed and outcome.failed and service.requeue is not None:
            service.refusals.refused(pod_uid(args.Pod), demand)
    return contract.filter_reply(args, outcome.passed, outcome.failed, outcome.unresolvable), ""


def _checked(names: list[str], args: contract.ExtenderArgs) -> list[str]:
    if args.NodeNames is None:
        return names  # from whole node objects: strings already
    try:
        return contract.checked_names(names)
    except contract.InvalidArgs as error:
        raise BadRequest(400, str(error)) from None


def _prioritize(request: Request, service: Service) -> VerbResult:
    args = _parse(request, contract.ExtenderArgs)
    demand = _demand(args.Pod, service)
    names = _checked(contract.requested_names(args, checked=False), args)
    cluster, policy = service.cache, service.policy
    states = _states(args, cluster)
    if demand.is_zero:
        return contract.priority_reply([(name, 0) for name in names]), ""
    # The reply entries themselves are remembered per node until it changes: building a thousand small
    # dicts per request cost more than scoring (measured), and kube-scheduler asks the same sizes over and over.
    entries: dict[str, Raw] = (
        cluster.memo.table("entry:" + score_key(demand, policy)) if states is cluster.nodes else {}
    )
    reply = []
    for name in names:
        entry = entries.get(name)
        if entry is None:
            state = states.get(name)
            entry = contract.host_priority(name, score_node(demand, state, policy))
            if state is not None:
                entries[name] = entry
        reply.append(entry)
    return reply, ""


async def _bind(request: Request, service: Service) -> VerbResult:
    args = _parse(request, contract.ExtenderBindingArgs)
    if not service.ready():
        reason = service.why_not_ready()
        return contract.binding_reply(reason), reason
    target = BindRequest(args.PodName, args.PodNamespace, args.PodUID, args.Node)
    guard = Guard(lambda: "" if service.ready() else service.why_not_ready(), service.binding_time_left)
    error = await bind(target, service.cache, service.ledger, service.policy, service.binder, service.recent, guard)
    if error:
        log.warning("bind %s to %s: %s", target.key, target.node, error)
        if service.on_bind_failure is not None:
            service.on_bind_failure(target, error)
    else:
        log.info("bound %s to %s", target.key, target.node)
        service.preemptions.forget(target.uid)
        service.refusals.forget(target.uid)
    return contract.binding_reply(error), error


def _preempt(request: Request, service: Service) -> VerbResult:
    args = _parse(request, contract.ExtenderPreemptionArgs)
    demand = _demand(args.Pod, service)
    candidates, violations = contract.preemption_candidates(args)
    kept = preempt_candidates(demand, candidates, service.cache, pod_priority(args.Pod))
    if not demand.is_zero:
        service.preemptions.remember(pod_uid(args.Pod), kept)
    return contract.preemption_reply(kept, violations), ""


# --- people and probes ------------------------------------------------------------------------------------


def _healthz(service: Service, request: Request) -> Response:
    problem = service.problem()
    if problem:
        return _json({"status": "unhealthy", "Error": problem}, 500)
    return _json({"status": "ok"})


def _readyz(service: Service, request: Request) -> Response:
    if service.ready():
        return _json({"status": "ready"})
    return _json({"status": "not ready", "Error": service.why_not_ready()}, 503)


def _synced(service: Service, request: Request) -> Response:
    if service.synced():
        return _json({"status": "synced", "leader": service.ready()})
    return _json({"status": "not synced", "Error": NOT_READY}, 503)


def _metrics(service: Service, request: Request) -> Response:
    return Response(200, service.metrics.render(service.cache), "text/plain; version=0.0.4; charset=utf-8")


def _hold_state(hold: Hold) -> str:
    if hold.observed:
        return "observed"
    if hold.bound:
        return "bound"
    return "uncertain" if hold.uncertain else "reserved"


def describe_node(state: NodeState, now: float) -> Raw:
    """A node as /inspect shows it: per device, capacity, used, and every pod and reservation with its age."""
    devices = []
    for position, device in enumerate(state.devices):
        holders = []
        for hold in state.holds.values():
            allocation = hold.allocation
            if device.index in allocation.indexes:
                holders.append(
                    {
                        "pod": allocation.pod,
                        "uid": allocation.pod_uid,
                        "memory": allocation.per_device,
                        "state": _hold_state(hold),
                        "age_seconds": round(max(0.0, now - hold.since), 3) if hold.since else None,
                    }
                )
        holders.sort(key=lambda holder: (str(holder["pod"]), str(holder["uid"])))
        devices.append(
            {
                "index": device.index,
                "healthy": device.healthy,
                "capacity": device.capacity,
                "used": state.used[position],
                "free": state.free[position],
                "pods": holders,
            }
        )
    return {
        "name": state.name,
        "known": state.known,
        "ready": state.ready,
        "problem": state.problem,
        "capacity": state.capacity_total,
        "used": state.used_total,
        "stray": state.stray,
        "devices": devices,
    }


def _inspect(service: Service, request: Request) -> Response:
    cluster, now = service.cache, time.time()
    nodes = [describe_node(cluster.nodes[name], now) for name in sorted(cluster.nodes)]
    return _json(
        {
            "unit": service.policy.unit,
            "nodes": nodes,
            "pods": len(cluster.pods),
            "reservations": len(cluster.reserved),
            "ready": service.ready(),
        }
    )


def _inspect_node(service: Service, request: Request) -> Response:
    name = request.params["node"]
    state = service.cache.nodes.get(name)
    if state is None:
        return json_error(404, f"node {name} is not in the extender's cache")
    return _json({"unit": service.policy.unit, **describe_node(state, time.time())})


# --- the app ----------------------------------------------------------------------------------------------


async def _expiry_sweep(service: Service) -> None:
    """Free reservations the API never confirmed, every `expiry_interval` seconds."""
    while True:
        await asyncio.sleep(service.expiry_interval)
        for hold in service.ledger.expire(include_bound=service.cache_current()):
            service.metrics.expiries.inc()
            allocation = hold.allocation
            log.warning(
                "reservation of %s on %s GPU %s expired: the API never showed the pod bound",
                allocation.pod,
                allocation.node,
                ",".join(map(str, allocation.indexes)),
            )
            memory_freed(service, (allocation.node,), hold.since)


def memory_freed(service: Service, nodes: Iterable[str], since: float) -> None:
    """Room came free on these nodes in the cache, maybe with no cluster event for kube-scheduler after it (a
    late watch event, a relist, an expired reservation: `requeue.py`): if a pod refused since `since` (Unix
    seconds) fits on one of them now, ask kube-scheduler to retry. One request retries every waiting pod, so
    the first node that takes one is enough; a relist of thousands of nodes costs one pass over the few
    distinct demands refused."""
    if service.requeue is None:
        return
    try:
        demands = service.refusals.demands_since(since)
        if not demands:
            return
        for node in nodes:
            state = service.cache.nodes.get(node)
            if state is not None and fits_any(demands, state):
                service.requeue(f"room came free on {node} for a pod refused since")
                return
    except Exception:  # a bug here must not stop the informer or the expiry sweep that called it
        log.exception("deciding whether to ask kube-scheduler to retry")


PROBES = (("/healthz", _healthz), ("/readyz", _readyz), ("/synced", _synced), ("/metrics", _metrics))
"""What the health listener serves (`build_health_server`): state, never pods' names or any verb."""


def build_server(service: Service) -> HttpServer:
    """The HTTP server for a service, not yet listening: `await server.start(host, port, ssl_context)`."""
    router = Router()
    router.add("POST", "/filter", _verb(service, "filter", _filter))
    router.add("POST", "/prioritize", _verb(service, "prioritize", _prioritize))
    router.add("POST", "/bind", _async_verb(service, "bind", _bind))
    router.add("POST", "/preempt", _verb(service, "preempt", _preempt))
    for path, page in (*PROBES, ("/inspect", _inspect), ("/inspect/{node}", _inspect_node)):
        router.add("GET", path, functools.partial(page, service))

    async def expiry_sweep() -> None:
        await _expiry_sweep(service)

    return HttpServer(router, service.max_body_bytes, background=(expiry_sweep,))


def build_health_server(service: Service) -> HttpServer:
    """The plain-HTTP listener for kubelet probes and Prometheus (`--health-port`): the `PROBES` pages only, so
    it can go without TLS. Requests to it carry no body worth reading."""
    router = Router()
    for path, page in PROBES:
        router.add("GET", path, functools.partial(page, service))
    return HttpServer(router, max_body_bytes=64 * 1024)
