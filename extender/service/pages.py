"""The GET pages, for people and probes: `/healthz /readyz /synced /metrics /inspect /inspect/{node}`.

`PROBES` are what the plain-HTTP health listener serves (`build_health_server`): state, never a pod's name
and never a verb, so it can go without TLS. `/inspect` names pods and is served only on the verbs' listener
(behind mTLS when it is on).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Awaitable, Callable

import orjson

from extender.core.nodes import NodeState
from extender.core.objects import Raw
from extender.service.context import Service
from extender.service.routing import Request, Response, Router, json_error
from extender.service.transport import HttpServer

NOT_SYNCED = "extender is not ready: its cache has not been filled yet"

Page = Callable[[Service, Request], Response | Awaitable[Response]]


def _json(body: Raw, status: int = 200) -> Response:
    return Response(status, orjson.dumps(body))


def _healthz(service: Service, request: Request) -> Response:
    stopped = service.source.stopped_loop()
    if stopped:
        return _json({"status": "unhealthy", "Error": stopped}, 500)
    return _json({"status": "ok"})


def _readyz(service: Service, request: Request) -> Response:
    reason = service.source.why_not_ready()
    if not reason:
        return _json({"status": "ready"})
    return _json({"status": "not ready", "Error": reason}, 503)


def _synced(service: Service, request: Request) -> Response:
    if service.source.is_synced():
        return _json({"status": "synced", "leader": service.ready()})
    return _json({"status": "not synced", "Error": NOT_SYNCED}, 503)


async def _metrics(service: Service, request: Request) -> Response:
    text = await service.metrics.render_yielding(service.cache, service.quotas, service.placer.learned)
    return Response(200, text, "text/plain; version=0.0.4; charset=utf-8")


def inspect_node(state: NodeState, now: float) -> Raw:
    """A node as /inspect shows it: per device, capacity, used, and every pod and reservation with its state
    (`core/holds.py`) and age."""
    devices = []
    for position, device in enumerate(state.devices):
        holders = []
        for hold in state.holds.values():
            use = hold.allocation.use_of(device.index)
            if use is not None:
                holder: Raw = {
                    "pod": hold.allocation.pod,
                    "uid": hold.allocation.pod_uid,
                    "memory": use.memory,
                    "state": hold.state.value,
                    "age_seconds": round(max(0.0, now - hold.since), 3) if hold.since else None,
                }
                if device.cores:
                    holder["cores"] = use.cores
                if use.instances:
                    holder["mig"] = [
                        {"profile": one.profile, "start": one.start, "size": one.size} for one in use.instances
                    ]
                holders.append(holder)
        holders.sort(key=lambda holder: (str(holder["pod"]), str(holder["uid"])))
        shown: Raw = {
            "index": device.index,
            "healthy": device.healthy,
            "capacity": device.capacity,
            "used": state.used[position],
            "free": state.free[position],
        }
        if device.cores:  # what only some device plugins track (HAMi): shown where they do
            shown.update(cores=device.cores, used_cores=state.used_cores[position])
        if device.slots:
            shown.update(slots=device.slots, used_slots=state.used_slots[position])
        if device.model or device.uuid:
            shown.update(model=device.model, uuid=device.uuid, cordoned=device.cordoned)
        if device.mode:
            shown["mode"] = device.mode
        if position in state.blocked:  # as HAMi marks the GPU unhealthy: why it takes no new pod
            shown["problem"] = state.blocked[position]
        devices.append({**shown, "pods": holders})
    node: Raw = {
        "name": state.name,
        "known": state.known,
        "ready": state.ready,
        "problem": state.unreadable,
        "capacity": state.capacity_total,
        "used": state.used_total,
        "stray": state.stray,
        "devices": devices,
    }
    if state.lock is not None:
        node["lock"] = {"pod": state.lock.pod, "age_seconds": round(max(0.0, now - state.lock.since), 3)}
    return node


TYPICAL_SHOWN = 16
"""Typical shapes listed by /inspect, the weightiest first."""


def inspect_workload(service: Service) -> Raw:
    """The placement policy and what it has learned: the pods seen, and the typical shapes it places for."""
    learned, config = service.placer.learned, service.placer.config
    classes = learned.classes()
    shapes = sorted(zip(classes.shapes, classes.weights, strict=True), key=lambda pair: -pair[1])
    return {
        "policy": str(config.policy),
        "narrowing": str(config.narrowing),
        "pods_seen": learned.workload.observed,
        "typical_shapes": len(classes.shapes),
        "build": classes.version,
        "shapes": [
            {
                "weight": round(weight, 4),
                "cpu_millicores": shape.cpu,
                "memory_bytes": shape.memory,
                "gpus": shape.devices,
                "memory_per_gpu": shape.per_device,
                "percent_per_gpu": shape.percent,
                "cores_per_gpu": shape.cores,
                "models": list(shape.models or shape.use_models),
            }
            for shape, weight in shapes[:TYPICAL_SHOWN]
        ],
    }


def _inspect(service: Service, request: Request) -> Response:
    cache, now = service.cache, time.time()
    nodes = [inspect_node(cache.nodes[name], now) for name in sorted(cache.nodes)]
    return _json(
        {
            "unit": service.cache.protocol.unit,
            "nodes": nodes,
            "pods": len(cache.pods),
            "reservations": len(cache.reserved),
            "ready": service.ready(),
            "why_not_ready": service.source.why_not_ready(),
            "workload": inspect_workload(service),
            "quotas": service.quotas.report(),
        }
    )


def _inspect_one(service: Service, request: Request) -> Response:
    name = request.params["node"]
    state = service.cache.nodes.get(name)
    if state is None:
        return json_error(404, f"node {name} is not in the extender's cache")
    return _json({"unit": service.cache.protocol.unit, **inspect_node(state, time.time())})


PROBES: tuple[tuple[str, Page], ...] = (
    ("/healthz", _healthz),
    ("/readyz", _readyz),
    ("/synced", _synced),
    ("/metrics", _metrics),
)
"""What the health listener serves (`build_health_server`): state, never pods' names or any verb."""

ALL: tuple[tuple[str, Page], ...] = (*PROBES, ("/inspect", _inspect), ("/inspect/{node}", _inspect_one))
"""What the verbs' listener serves besides the verbs."""


def build_health_server(service: Service) -> HttpServer:
    """The plain-HTTP listener for kubelet probes and Prometheus (`--health-port`): the `PROBES` pages only.
    Requests to it carry no body worth reading."""
    router = Router()
    for path, page in PROBES:
        router.add("GET", path, functools.partial(page, service))
    server = HttpServer(router, 64 * 1024, service.health_limits)
    service.metrics.add_listener("health", server)
    return server
