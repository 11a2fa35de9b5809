"""The churn mode through the real kube-scheduler: `real.py`'s control plane, extender and scheduler, and pods
created, deleted and withdrawn on the plan's clock (`churn.py`), in the scheduler's own time.

The driver keeps one timetable: each pod is created at its arrival (`plan.arrival(i) / plan.speed` seconds after
kube-scheduler is ready), deleted `lifetime / speed` seconds after the watch shows it bound, and withdrawn
(deleted while pending) `patience / speed` seconds after its arrival. kube-scheduler's queue does the rest, with
its real backoff and requeueing. Waits are measured from the creation the driver made to the bind the watch saw,
in trace time (times `speed`). At each of `churn.SAMPLES` points the pods running (bound, not deleted) give the
GPUs' allocation from their annotations, as a device plugin reads them (`ReplayResult.from_api`), and every
fourth point the fragmentation and a check that nothing is over capacity.

The driver falling behind its timetable (the API or the machine too slow for the clock) is measured: the run
reports the latest any action came, and fails when it exceeds `LATE_LIMIT` (the figures would then be another
clock's). A shorter clock (more `--churn-minutes`) or fewer nodes cures it.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import math
import time
from collections import Counter
from collections.abc import Coroutine
from typing import Any

from bench.e2e_run import admin_session
from bench.placement.churn import SAMPLES, ChurnResult, Plan, Sample, Tally
from bench.placement.churn_fast import FRAGMENTATION_EVERY
from bench.placement.outcome import Outcome, ReplayResult
from bench.placement.real import RealError, RealReplay
from bench.placement.report import fragmentation_of, typical_shapes
from bench.placement.trace import FOREVER, NAMESPACE, TracePod

LATE_LIMIT = 5.0
"""Seconds an action may come after its time before the run is called failed."""
TICK = 0.05
"""Seconds the driver sleeps at most before looking at its timetable again."""
IN_FLIGHT = 16
"""API calls the driver has under way at once: each is sent at its time without waiting for the one before, so
an API server slowed by kube-scheduler's retries delays the calls, not the timetable."""
CREATE, DELETE, WITHDRAW, SAMPLE = range(4)


class ChurnReal(RealReplay):
    """One churn run through kube-scheduler. Mutable; `run` once."""

    def __init__(self, *args: Any, plan: Plan, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.plan = plan
        self.names = [self.wire.pod_object(pod, self.scheduler_name)["metadata"]["name"] for pod in self.workload.pods]
        self.index = {name: number for number, name in enumerate(self.names)}
        self.created: dict[int, float] = {}
        self.running: dict[int, dict[str, Any]] = {}
        """Pods bound and not deleted, with the object the watch showed last."""
        self.bound: set[int] = set()
        self.gone: set[int] = set()
        self.tally = Tally()
        self.timetable: list[tuple[float, int, int, int]] = []
        self.sequence = 0
        self.latest = 0.0
        self.started = 0.0
        self.shapes = typical_shapes(self.workload.trace_pods)
        self.calls: set[asyncio.Task[None]] = set()
        self.slots = asyncio.Semaphore(IN_FLIGHT)

    def at(self, when: float, kind: int, index: int) -> None:
        self.sequence += 1
        heapq.heappush(self.timetable, (when, kind, self.sequence, index))

    def run(self) -> ChurnResult:  # type: ignore[override]
        return self._run(self._churn)

    async def _churn(self) -> ChurnResult:
        self.config = self._render_config()
        listed = await self.plane.api("GET", f"/api/v1/namespaces/{NAMESPACE}/pods?limit=1")
        await asyncio.to_thread(self.plane.start_scheduler, self.config)
        plan = self.plan
        end = plan.span / plan.speed
        self._arrivals()
        for number in range(SAMPLES + 1):
            self.at(end * number / SAMPLES, SAMPLE, number)
        watcher: asyncio.Task[None] | None = None
        try:
            async with admin_session(self.plane) as session, self._device_plugin() as plugin:
                self.started = time.monotonic()  # the plugin double has listed the cluster: its start is not lateness
                watcher = asyncio.create_task(self._watch_churn(listed["metadata"]["resourceVersion"]))
                try:
                    await self._drive(session, watcher, end)
                    await asyncio.gather(*self.calls)
                finally:
                    for call in self.calls:
                        call.cancel()
                    await asyncio.gather(*self.calls, return_exceptions=True)  # ended before their session closes
        finally:
            if watcher is not None:
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await watcher
        seconds = time.monotonic() - self.started
        return await self._result(seconds, self._plugin_problems(plugin))

    def _arrivals(self) -> None:
        """Each pod's creation at its arrival, and its withdrawal a patience later, on the timetable."""
        plan = self.plan
        for index in range(len(self.workload.pods)):
            self.at(plan.arrival(index) / plan.speed, CREATE, index)
            self.at((plan.arrival(index) + plan.patience) / plan.speed, WITHDRAW, index)

    async def _drive(self, session: Any, watcher: asyncio.Task[None], end: float) -> None:
        """Act on the timetable until `end` (seconds after the start), each action at its time."""
        while self.timetable and self.timetable[0][0] <= end:
            wait = self.started + self.timetable[0][0] - time.monotonic()
            await asyncio.sleep(min(max(wait, 0.0), TICK))  # the watcher may add an earlier deletion
            if wait > TICK:
                continue
            when, kind, _, index = heapq.heappop(self.timetable)
            if watcher.done():
                watcher.result()
                raise RealError("the pod watch ended")
            for call in [call for call in self.calls if call.done()]:
                self.calls.discard(call)
                call.result()  # an API error ends the run
            self.latest = max(self.latest, time.monotonic() - self.started - when)
            if self.latest > LATE_LIMIT:
                raise RealError(
                    f"the driver is {self.latest:.1f} s behind its timetable at {when:.0f} s: the clock is "
                    "too fast for this machine (more --churn-minutes, or fewer --nodes)"
                )
            await self._act(session, kind, index)
            if kind == SAMPLE:
                self._check_alive()
                if index % 10 == 0:
                    self.progress(
                        f"{when:.0f} s: {len(self.created):,} created, {len(self.running):,} running, "
                        f"{len(self.created) - len(self.bound) - sum(self.tally.withdrawn.values()):,} waiting"
                    )

    async def _act(self, session: Any, kind: int, index: int) -> None:
        if kind == CREATE:
            body = self.wire.pod_object(self.workload.pods[index], self.scheduler_name)
            self.created[index] = time.monotonic()
            self._call(self._post(session, f"/api/v1/namespaces/{NAMESPACE}/pods", body))
        elif kind == DELETE:
            if index in self.running and index not in self.gone:
                self.gone.add(index)
                self.running.pop(index)
                self._call(self._delete(session, self.names[index]))
        elif kind == WITHDRAW:
            if index in self.created and index not in self.bound and index not in self.gone:
                self.gone.add(index)
                self.tally.withdrawn[self.workload.pods[index].kind] += 1
                self._call(self._delete(session, self.names[index]))
        else:
            self._sample(index)

    def _call(self, request: Coroutine[Any, Any, None]) -> None:
        """Send an API call now, at most `IN_FLIGHT` at once, without waiting for its answer; how long it waited
        for its turn counts as lateness."""
        due = time.monotonic()

        async def bounded() -> None:
            try:
                async with self.slots:
                    self.latest = max(self.latest, time.monotonic() - due)
                    await request
            finally:
                request.close()  # cancelled before its turn (a run that failed): never started, closed quietly

        call = asyncio.create_task(bounded())
        self.calls.add(call)

    def _bound(self, index: int, pod: dict[str, Any]) -> None:
        trace_pod: TracePod = self.workload.pods[index]
        now = time.monotonic()
        if index in self.gone:  # withdrawn as the bind came: it is deleted, as a cluster would
            return
        self.bound.add(index)
        self.running[index] = pod
        wait = (now - self.created.get(index, now)) * self.plan.speed
        self.tally.bound(index, trace_pod, pod["spec"]["nodeName"], wait)
        if trace_pod.lifetime != FOREVER:
            self.at(now - self.started + trace_pod.lifetime / self.plan.speed, DELETE, index)

    async def _watch_churn(self, resource_version: str) -> None:
        async for kind, pod in self._pod_events(resource_version):
            index = self.index.get(pod["metadata"]["name"])
            if index is None or kind == "DELETED":
                continue
            if (pod.get("spec") or {}).get("nodeName"):
                if index not in self.bound:
                    self._bound(index, pod)
                elif index in self.running:
                    self.running[index] = pod  # its annotations as they are now

    def _now_result(self, seconds: float) -> ReplayResult:
        outcomes = [Outcome(self.workload.pods[index], pod["spec"]["nodeName"]) for index, pod in self.running.items()]
        return ReplayResult.from_api("real", self.workload, outcomes, list(self.running.values()), seconds, self.wire)

    def _sample(self, number: int) -> None:
        capacity = self.workload.gpu_capacity
        now = time.monotonic() - self.started
        state = self._now_result(now)
        waiting = [index for index in self.created if index not in self.bound and index not in self.gone]
        allocated = sum(self.workload.pods[index].gpu_demand for index in self.running)
        demand = allocated + sum(self.workload.pods[index].gpu_demand for index in waiting)
        fragmented = stranded = math.nan
        if number % FRAGMENTATION_EVERY == 0 or number == SAMPLES:
            _, fragmented, stranded = fragmentation_of(state.nodes.values(), capacity, self.shapes)
            if state.problems:
                self.tally.problems.append(
                    f"at trace second {now * self.plan.speed:.0f}: {'; '.join(state.problems[:3])}"
                )
        self.tally.samples.append(
            Sample(
                number * self.plan.span / SAMPLES,
                100 * allocated / capacity,
                100 * demand / capacity,
                len(waiting),
                fragmented,
                stranded,
            )
        )

    async def _result(self, seconds: float, plugin_problems: list[str]) -> ChurnResult:
        """The end from the API's pods (kube-scheduler may have bound some the watch had not shown yet)."""
        listed = (await self.plane.list_pods(NAMESPACE))["items"]
        finish = time.monotonic()
        running = [pod for pod in listed if (pod.get("spec") or {}).get("nodeName")]
        outcomes = [
            Outcome(self.workload.pods[self.index[pod["metadata"]["name"]]], pod["spec"]["nodeName"])
            for pod in running
            if pod["metadata"]["name"] in self.index
        ]
        end = ReplayResult.from_api("real", self.workload, outcomes, running, seconds, self.wire)
        end.problems += plugin_problems
        end.verb_seconds = await self._verb_seconds()
        waited: dict[str, list[float]] = {}
        for pod in listed:
            index = self.index.get(pod["metadata"]["name"])
            if index is not None and not (pod.get("spec") or {}).get("nodeName") and index not in self.gone:
                wait = (finish - self.created.get(index, finish)) * self.plan.speed
                waited.setdefault(self.workload.pods[index].kind, []).append(wait)
        arrived = Counter(self.workload.pods[index].kind for index in self.created)
        extra: dict[str, object] = {"late": self.latest, "config": self.config}
        if self.peer is not None:
            extra["peer_crashes"] = list(self.peer.crashes)
            extra["peer_exited_at"] = self.peer.exited_at(time.monotonic() - self.started)
        return self.tally.result("real", self.workload, self.plan, end, waited, arrived, seconds, extra)
