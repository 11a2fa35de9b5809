"""The kube-scheduler of `extender demo`: sends a burst through the service's HTTP verbs as the scheduler does.

Per pod, one at a time: `POST /filter` with every node name, `POST /prioritize` when more than one node
passed, the best score wins (a tie goes to the name that sorts first), and `POST /bind` in the background, so
binds overlap the next pods' filters. A bind that lost a race for the last room on a GPU puts its pod back at
the head of the queue, as the scheduler requeues it. It exists to keep the scheduler's protocol apart from
starting the service and from the report; it talks to the service only over HTTP and must never read or
change the cache, nor print.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from extender.tools.demo_burst import NAMESPACE, BurstPod, pod_object

MAX_ATTEMPTS = 3
"""Scheduling attempts per pod; a bind that lost its race is retried from the filter, as the scheduler does."""


class DemoError(Exception):
    """A request the service should have answered with 200 did not; the message names the verb and the reply."""


@dataclass(frozen=True, slots=True)
class Decision:
    """The outcome of scheduling one pod: the node it was bound to, or why none."""

    pod: BurstPod
    node: str = ""
    failed: Mapping[str, str] = field(default_factory=dict)
    """Nodes without room now (FailedNodes): preemption could help."""
    unresolvable: Mapping[str, str] = field(default_factory=dict)
    """Nodes that could never hold the pod (FailedAndUnresolvableNodes)."""
    error: str = ""
    """The last bind's (or filter's) Error, when the pod ended without a node."""
    attempts: int = 1


class Scheduler:
    """Plays kube-scheduler against the service: pods one at a time, binds in the background. Mutable."""

    def __init__(self, session: aiohttp.ClientSession, url: str) -> None:
        self.session = session
        self.url = url
        self.node_names: list[str] = []
        """The nodes each filter names (NodeNames); set once /inspect has listed them."""
        self.latency: dict[str, list[float]] = {}
        self.overlapped = 0
        """Filters sent while at least one earlier bind was still in flight."""
        self.lost_races = 0
        self.filter_errors: list[str] = []
        """Filter replies with a non-empty Error: the service refused to judge (not ready, bad pod)."""
        self._binds: set[asyncio.Task[None]] = set()
        self._queue: deque[tuple[BurstPod, int]] = deque()
        self.decisions: dict[str, Decision] = {}

    async def call(self, method: str, path: str, body: Any = None) -> Any:
        started = time.perf_counter()
        data = None if body is None else orjson.dumps(body)
        headers = {"Content-Type": "application/json"} if data is not None else None
        async with self.session.request(method, self.url + path, data=data, headers=headers) as response:
            payload = await response.read()
        self.latency.setdefault(path.strip("/"), []).append(time.perf_counter() - started)
        if response.status != 200:
            raise DemoError(f"{method} {path}: HTTP {response.status}: {payload[:300].decode(errors='replace')}")
        return orjson.loads(payload)

    async def run(self, burst: list[BurstPod]) -> dict[str, Decision]:
        self._queue.extend((pod, 1) for pod in burst)
        try:
            while self._queue or self._binds:
                while self._queue:
                    pod, attempt = self._queue.popleft()
                    await self._schedule(pod, attempt)
                if self._binds:
                    await asyncio.gather(*self._binds)  # a failed bind puts its pod back in the queue
        finally:
            for task in self._binds:
                task.cancel()
            await asyncio.gather(*self._binds, return_exceptions=True)
        return self.decisions

    async def _schedule(self, pod: BurstPod, attempt: int) -> None:
        if any(not task.done() for task in self._binds):
            self.overlapped += 1
        args = {"Pod": pod_object(pod), "Nodes": None, "NodeNames": self.node_names}
        reply = await self.call("POST", "/filter", args)
        passed: list[str] = reply.get("NodeNames") or []
        decision = Decision(
            pod,
            failed=reply.get("FailedNodes") or {},
            unresolvable=reply.get("FailedAndUnresolvableNodes") or {},
            error=reply.get("Error") or "",
            attempts=attempt,
        )
        self.decisions[pod.uid] = decision
        if decision.error:
            self.filter_errors.append(f"filter of {pod.key} answered Error: {decision.error}")
            return
        if not passed:
            return
        node = passed[0]
        if len(passed) > 1:
            # A node the reply leaves out scores 0, as kube-scheduler counts it.
            scores = {entry["Host"]: entry["Score"] for entry in await self.call("POST", "/prioritize", args)}
            best = max(scores.get(name, 0) for name in passed)
            node = min(name for name in passed if scores.get(name, 0) == best)
        task = asyncio.create_task(self._bind(decision, node), name=f"bind {pod.key}")
        self._binds.add(task)
        task.add_done_callback(self._binds.discard)

    async def _bind(self, decision: Decision, node: str) -> None:
        pod = decision.pod
        body = {"PodName": pod.name, "PodNamespace": NAMESPACE, "PodUID": pod.uid, "Node": node}
        error = (await self.call("POST", "/bind", body)).get("Error") or ""
        if not error:
            self.decisions[pod.uid] = Decision(pod, node, attempts=decision.attempts)
            return
        self.decisions[pod.uid] = Decision(pod, error=f"bind to {node}: {error}", attempts=decision.attempts)
        if decision.attempts < MAX_ATTEMPTS:
            # The scheduler requeues the pod; its queue orders by priority, then age, so it comes before later pods.
            self.lost_races += 1
            self._queue.appendleft((pod, decision.attempts + 1))
