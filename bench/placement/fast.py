"""The fast mode of `make bench-placement`: the extender's own decisions, in process, behind a model of
kube-scheduler's cycle (`kube_model.py`) configured by the text `extender scheduler-config` renders.

The extender is the real service (`app.build_service` over a cache with a `FileSource`, its verbs' handlers
called with the JSON bodies kube-scheduler sends): the same filter, prioritize and bind code that serves a
cluster. What the API server and the watch would do is done here in order, as they would show it: a pod is
created pending (the watch shows it to the cache) before it is scheduled, bound by the extender (its binder
updates the cache) or by kube-scheduler's default binder (for pods the extender is not interested in: the
watch shows them bound), and deleted when no node takes it (the paper's method drops a refused pod).

Why it exists: the real mode takes minutes per run; this takes a fraction of that and agrees with it where
kube-scheduler has no choice of its own to make (`tests/e2e/test_placement.py` holds it to the real one on a
small workload). The real mode stays the figure of record.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from typing import Any

import orjson

from bench.placement.kube_model import Decision, ExtenderAnswer, ModelNode, ModelPod, SchedulerModel
from bench.placement.outcome import Outcome, ReplayResult
from bench.placement.trace import MODEL_LABEL, TraceNode, TracePod, Workload, node_object, pod_object
from extender.app import build_cache, build_service
from extender.core.cache import Cache
from extender.service.context import Service
from extender.service.routing import Request, Response
from extender.service.verbs import build_server
from extender.settings import Settings
from extender.sources.file import FileSource
from extender.tools.schedconfig import Wiring, render

MIB = 1024 * 1024
UID_SPACE = uuid.UUID("6f0d5e8e-55c4-4e45-9d1e-8c64b5c1f1a2")


def pod_uid(name: str) -> str:
    """A stable UID per pod name, as the API server would give one (random there; fixed here for repeatability)."""
    return str(uuid.uuid5(UID_SPACE, name))


def model_node(node: TraceNode) -> ModelNode:
    allocatable = {"cpu": node.cpu_milli, "memory": node.memory_mib * MIB, "pods": 1001}
    allocatable |= {"aliyun.com/gpu-count": node.gpus, "aliyun.com/gpu-mem": node.gpus * 1000}
    labels = {MODEL_LABEL: node.model} if node.model else {}
    return ModelNode(node.name, allocatable, labels)


def model_pod(pod: TracePod, body: dict[str, Any]) -> ModelPod:
    requests = {"cpu": pod.cpu_milli, "memory": pod.memory_mib * MIB}
    if pod.gpus:
        requests["aliyun.com/gpu-mem"] = pod.gpu_demand
        if pod.gpus > 1:
            requests["aliyun.com/gpu-count"] = pod.gpus
    affinity = ((MODEL_LABEL, pod.models),) if pod.models else ()
    return ModelPod(body["metadata"]["name"], requests, affinity, body)


class InProcessExtender:
    """`extender serve` over an in-memory cache, its verbs called as functions with kube-scheduler's bodies."""

    def __init__(self, settings: Settings, nodes: list[dict[str, Any]]) -> None:
        # A clock that stands still: the learned workload's weights then depend on the pods alone, so the same
        # workload and seed give the same placements (the real mode's clock moves, over minutes of a 6 h
        # half-life: a few percent of weight).
        cache, quotas = build_cache(settings, clock=lambda: 0.0)
        cache.replace(nodes, [])
        self.source = FileSource(cache, [])
        self.service: Service = build_service(settings, cache, quotas, self.source, None)
        self.router = build_server(self.service).router
        self.loop = asyncio.new_event_loop()
        self.seconds: dict[str, float] = {"filter": 0.0, "filter-cpu": 0.0, "prioritize": 0.0, "bind": 0.0}

    @property
    def cache(self) -> Cache:
        return self.service.cache

    def call(self, verb: str, body: bytes) -> Any:
        route, _, _ = self.router.resolve("POST", f"/{verb}")
        assert route is not None
        started = time.perf_counter()
        response = route.handler(Request("POST", f"/{verb}", body))
        if not isinstance(response, Response):
            response = self.loop.run_until_complete(response)
        self.seconds[verb] += time.perf_counter() - started
        if response.status != 200:
            raise RuntimeError(f"/{verb} answered {response.status}: {response.body[:300]!r}")
        return orjson.loads(response.body)

    def __call__(self, verb: str, pod: ModelPod, names: list[str]) -> Any:
        reply = self.call(verb, orjson.dumps({"Pod": pod.body, "NodeNames": names, "Nodes": None}))
        if verb.startswith("filter"):
            if reply.get("Error"):
                raise RuntimeError(f"/{verb} answered an error: {reply['Error']}")
            failed = dict(reply.get("FailedNodes") or {}) | dict(reply.get("FailedAndUnresolvableNodes") or {})
            return ExtenderAnswer(list(reply.get("NodeNames") or []), failed)
        return reply

    def bind(self, pod: ModelPod, node: str) -> str:
        """The bind verb; its error ("" when bound)."""
        metadata = pod.body["metadata"]
        body = {
            "PodName": metadata["name"],
            "PodNamespace": metadata["namespace"],
            "PodUID": metadata["uid"],
            "Node": node,
        }
        return str(self.call("bind", orjson.dumps(body)).get("Error") or "")

    def shown(self, pod: dict[str, Any], deleted: bool = False) -> None:
        """What the pod watch would show the cache."""
        self.cache.apply_pod(pod, deleted=deleted)

    def close(self) -> None:
        self.loop.close()


def rendered_config(settings: Settings, wiring: Wiring = Wiring.FULL) -> str:
    return render(settings, "1.34", wiring)


def replay(
    workload: Workload,
    settings: Settings,
    config_yaml: str,
    seed: int = 0,
    progress: Callable[[int], None] | None = None,
) -> ReplayResult:
    """Every pod of the workload, one at a time, as the paper's method plays them (module docstring)."""
    started = time.perf_counter()
    nodes = [model_node(node) for node in sorted(workload.nodes, key=lambda node: node.name)]
    by_name = {node.name: node for node in nodes}
    extender = InProcessExtender(settings, [node_object(node) for node in workload.nodes])
    scheduler = SchedulerModel.parse(config_yaml, settings.scheduler_name, seed)
    outcomes: list[Outcome] = []
    try:
        for index, trace_pod in enumerate(workload.pods):
            body = pod_object(trace_pod, settings.scheduler_name)
            body["metadata"]["uid"] = pod_uid(trace_pod.name)
            pod = model_pod(trace_pod, body)
            extender.shown(body)
            decision = scheduler.schedule(pod, nodes, extender)
            outcomes.append(_settle(decision, pod, trace_pod, body, scheduler, extender, by_name))
            if progress is not None and index % 500 == 0:
                progress(index)
        seconds = time.perf_counter() - started
        return ReplayResult.from_cache("fast", workload, outcomes, extender.cache, seconds, dict(extender.seconds))
    finally:
        extender.close()


def _settle(
    decision: Decision,
    pod: ModelPod,
    trace_pod: TracePod,
    body: dict[str, Any],
    scheduler: SchedulerModel,
    extender: InProcessExtender,
    nodes: dict[str, ModelNode],
) -> Outcome:
    """Bind where the scheduler decided (the extender's bind, or the default binder's), or drop the pod."""
    if not decision.node:
        extender.shown(body, deleted=True)
        return Outcome(trace_pod, "", decision.reasons)
    node = nodes[decision.node]
    scheduler.assume(pod, node)
    if scheduler.interested(pod):
        error = extender.bind(pod, decision.node)
        if error:
            # kube-scheduler forgets the assumed pod; in the paper's method the pod is dropped.
            scheduler.forget(pod, node)
            extender.shown(body, deleted=True)
            return Outcome(trace_pod, "", {f"bind: {error}": 1})
    else:
        bound = dict(body, spec=dict(body["spec"], nodeName=decision.node))
        extender.shown(bound)
    return Outcome(trace_pod, decision.node, {})
