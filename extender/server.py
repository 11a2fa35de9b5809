"""The HTTP service: the four extender verbs, health, readiness, metrics and inspection.

`POST /filter /prioritize /bind /preempt` follow the wire contract (`contract.py`); `GET /healthz /readyz
/metrics /inspect /inspect/{node}` are for people and probes. Every failure of a request is a JSON body
`{"Error": "..."}` naming what was wrong: 400 for a malformed body, 413 for one over the size limit, 404 for
an unknown route or node; an unexpected exception is logged with its traceback and answered 500 with a
one-line message, never the traceback. Application state lives in typed `web.AppKey`s; background work (the
reservation expiry sweep) starts and stops with the app through `cleanup_ctx`.

The handlers decode with orjson and validate with the contract's models; the work per request is a dict
lookup and a comparison per node name (the cache keeps per-node summaries current).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import orjson
from aiohttp import web
from pydantic import BaseModel, ValidationError

from extender import contract
from extender.binding import Binder, BindRequest, RecentPods, bind
from extender.cluster import Cluster, NodeState
from extender.ledger import Ledger
from extender.metrics import Metrics
from extender.policy import PolicyConfig, filter_nodes, preempt_candidates, score_nodes
from extender.resources import Demand, InvalidPod, Raw, pod_demand, pod_key

log = logging.getLogger(__name__)

Model = TypeVar("Model", bound=BaseModel)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(slots=True)
class Service:
    """Everything the handlers share; built once by the caller (cli, tests, demo) and passed in."""

    cluster: Cluster
    ledger: Ledger
    binder: Binder
    policy: PolicyConfig
    metrics: Metrics = field(default_factory=Metrics)
    recent: RecentPods = field(default_factory=RecentPods)
    ready: Callable[[], bool] = lambda: True
    """True once the cache holds a full listing (and, with leader election, on the leader)."""
    expiry_interval: float = 5.0
    max_body_bytes: int = 32 * 1024 * 1024


SERVICE = web.AppKey("service", Service)


class BadRequest(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _json(body: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(body), status=status, content_type="application/json")


def _error(status: int, message: str) -> web.Response:
    return _json({"Error": message}, status)


async def _parse(request: web.Request, model: type[Model]) -> Model:
    try:
        body = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise BadRequest(
            413, f"request body is over the limit of {request.app[SERVICE].max_body_bytes} bytes"
        ) from None
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
        return pod_demand(pod, service.cluster.profile)
    except InvalidPod as error:
        raise BadRequest(400, str(error)) from None


def _states(args: contract.ExtenderArgs, cluster: Cluster) -> dict[str, NodeState]:
    """Node states for the request: the cache itself for names, or views of the nodes sent whole."""
    if args.NodeNames is None and args.Nodes is not None:
        return {contract.node_name(node): cluster.describe(node) for node in args.Nodes.items or ()}
    return cluster.nodes


# --- verbs ------------------------------------------------------------------------------------------------


def _verb(name: str, handler: Callable[[web.Request, Service], Awaitable[tuple[Any, str]]]) -> Handler:
    """Wrap a verb: time it, count it by outcome, and turn errors into the contract's `Error` bodies."""

    async def handle(request: web.Request) -> web.StreamResponse:
        service = request.app[SERVICE]
        started = time.perf_counter()
        try:
            body, error = await handler(request, service)
            response, outcome = _json(body), ("error" if error else "ok")
        except BadRequest as problem:
            log.info("%s: %d %s", name, problem.status, problem.message)
            response, outcome = _error(problem.status, problem.message), "bad_request"
        except Exception as unexpected:
            log.exception("%s: unexpected failure", name)
            response, outcome = (
                _error(500, f"internal error in {name}: {type(unexpected).__name__}: {unexpected}"),
                "error",
            )
        service.metrics.requests.labels(name, outcome).inc()
        service.metrics.latency.labels(name, outcome).observe(time.perf_counter() - started)
        return response

    return handle


NOT_READY = "extender is not ready: its cache has not been filled yet"


async def _filter(request: web.Request, service: Service) -> tuple[Any, str]:
    args = await _parse(request, contract.ExtenderArgs)
    demand = _demand(args.Pod, service)
    names = contract.requested_names(args)
    if not service.ready():
        return contract.filter_reply(args, [], {}, {}, NOT_READY), NOT_READY
    service.recent.remember(args.Pod)
    outcome = filter_nodes(demand, names, _states(args, service.cluster), service.policy.unit)
    nodes = service.metrics.nodes
    nodes.labels("accepted").inc(len(outcome.passed))
    if outcome.failed:
        nodes.labels("failed").inc(len(outcome.failed))
    if outcome.unresolvable:
        nodes.labels("unresolvable").inc(len(outcome.unresolvable))
    if demand.memory and len(outcome.passed) < len(names):
        log.debug("filter %s: %d of %d nodes fit", pod_key(args.Pod), len(outcome.passed), len(names))
    return contract.filter_reply(args, outcome.passed, outcome.failed, outcome.unresolvable), ""


async def _prioritize(request: web.Request, service: Service) -> tuple[Any, str]:
    args = await _parse(request, contract.ExtenderArgs)
    demand = _demand(args.Pod, service)
    names = contract.requested_names(args)
    scores = score_nodes(demand, names, _states(args, service.cluster), service.policy)
    return contract.priority_reply(scores), ""


async def _bind(request: web.Request, service: Service) -> tuple[Any, str]:
    args = await _parse(request, contract.ExtenderBindingArgs)
    if not service.ready():
        return contract.binding_reply(NOT_READY), NOT_READY
    target = BindRequest(args.PodName, args.PodNamespace, args.PodUID, args.Node)
    error = await bind(target, service.cluster, service.ledger, service.policy, service.binder, service.recent)
    if error:
        log.warning("bind %s to %s: %s", target.key, target.node, error)
    else:
        log.info("bound %s to %s", target.key, target.node)
    return contract.binding_reply(error), error


async def _preempt(request: web.Request, service: Service) -> tuple[Any, str]:
    args = await _parse(request, contract.ExtenderPreemptionArgs)
    demand = _demand(args.Pod, service)
    candidates, violations = contract.preemption_candidates(args)
    kept = preempt_candidates(demand, candidates, service.cluster)
    return contract.preemption_reply(kept, violations), ""


# --- people and probes ------------------------------------------------------------------------------------


async def _healthz(request: web.Request) -> web.Response:
    return _json({"status": "ok"})


async def _readyz(request: web.Request) -> web.Response:
    if request.app[SERVICE].ready():
        return _json({"status": "ready"})
    return _json({"status": "not ready", "Error": NOT_READY}, 503)


async def _metrics(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    return web.Response(body=service.metrics.render(service.cluster), content_type="text/plain", charset="utf-8")


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
                        "state": "observed" if hold.observed else ("bound" if hold.bound else "reserved"),
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


async def _inspect(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    cluster, now = service.cluster, time.time()
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


async def _inspect_node(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    name = request.match_info["node"]
    state = service.cluster.nodes.get(name)
    if state is None:
        return _error(404, f"node {name} is not in the extender's cache")
    return _json({"unit": service.policy.unit, **describe_node(state, time.time())})


# --- the app ----------------------------------------------------------------------------------------------


@web.middleware
async def _json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Unknown routes and wrong methods answer JSON too."""
    try:
        return await handler(request)
    except web.HTTPException as error:
        if error.status < 400:
            raise
        return _error(error.status, f"{request.method} {request.path}: {error.reason}")


async def _expiry_sweep(app: web.Application) -> AsyncIterator[None]:
    service = app[SERVICE]

    async def sweep() -> None:
        while True:
            await asyncio.sleep(service.expiry_interval)
            for hold in service.ledger.expire():
                service.metrics.expiries.inc()
                allocation = hold.allocation
                log.warning(
                    "reservation of %s on %s GPU %s expired: the API never showed the pod bound",
                    allocation.pod,
                    allocation.node,
                    ",".join(map(str, allocation.indexes)),
                )

    task = asyncio.create_task(sweep(), name="reservation-expiry")
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def build_app(service: Service) -> web.Application:
    app = web.Application(client_max_size=service.max_body_bytes, middlewares=[_json_errors])
    app[SERVICE] = service
    app.cleanup_ctx.append(_expiry_sweep)
    app.router.add_post("/filter", _verb("filter", _filter))
    app.router.add_post("/prioritize", _verb("prioritize", _prioritize))
    app.router.add_post("/bind", _verb("bind", _bind))
    app.router.add_post("/preempt", _verb("preempt", _preempt))
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/readyz", _readyz)
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/inspect", _inspect)
    app.router.add_get("/inspect/{node}", _inspect_node)
    return app
