"""The churn mode in process: the extender's own verbs (`fast.InProcessExtender`) behind the model of
kube-scheduler's cycle (`kube_model.py`) and of its scheduling queue, on a simulated clock (`churn.py` has the
method and the figures).

The queue, as kube-scheduler v1.34.1 keeps it (`pkg/scheduler/backend/queue/scheduling_queue.go`,
`backoff_queue.go`) for the pods here (one priority, no plugin-level queueing hint: a pod the extender refused
carries the fake plugin "Extender" and is requeued by any cluster event, `schedule_one.go` and
`isPodWorthRequeuing`):

- a new pod joins the active queue, ordered by its timestamp (its creation, then its last failure: the
  timestamp is refreshed each time it is put back);
- a pod that fits nowhere goes to the unschedulable pods, its count of failures one up;
- a bound pod's deletion (`AssignedPodDelete`) moves every unschedulable pod to the backoff queue, ordered by the
  end of its backoff (1 s doubled per failure, at most 10 s, truncated to the second), then by timestamp; so does
  a pod's bind (`eventhandlers.go` `addPodToCache`: with queueing hints, GA in 1.34, every assigned pod added
  moves all, and the fake plugin "Extender" queues on every event), after which the scheduler, idle, tries each
  again and it fails again (a bind only takes room): its failures one up and its timestamp the bind's, which the
  model counts without the cycles (`Queued.effective`); a pending pod's deletion moves none;
- the scheduler takes the active queue first, and when it is empty the backoff queue's first pod even before its
  backoff ends (`SchedulerPopFromBackoffQ`, on by default since 1.33);
- every 30 s, pods unschedulable for more than 5 minutes go back to be tried (`flushUnschedulablePodsLeftover`).

What the model leaves out: a scheduling cycle takes no time here (tens of milliseconds in the real mode, where a
pod arriving during another's cycle waits for it), and the scheduler's own backoff timers, which only matter
when it is idle, and then it pops the backoff queue anyway.

Work it skips: a pod tried again when nothing was freed since its last attempt (no bound pod deleted), or when
no node freed since then passes kube-scheduler's own filters for it (cpu, memory, GPU totals, model), fails as it
did; a pod of the same shape as one that just failed, with nothing freed in between, fails too. Such a pod is
counted as tried and failed (its timestamp and count move as kube-scheduler's would), without the cycle. That
changes no decision when the failed cycle visited every node (the filters only lose room between two departures;
the extender's verdict on a node depends on that node's pods alone): with `percentageOfNodesToScore: 100`, or
below 100 nodes. With kube-scheduler's adaptive share (the shipped default: 188 of 400 nodes) a cycle stops at the
nodes it needs, and a node it never looked at might have taken the pod; the model then still skips, or a churn
run would retry every waiting pod in full at every departure (a million cycles, an hour). Measured against the
real mode on `default` seed 42 at 400 nodes, adaptive: 96.5 % fast, 96.6 % real over the full part, 5 pods
asking several GPUs withdrawn in both; `--flag=--nodes-to-score=100` makes the skipping exact.
"""

from __future__ import annotations

import heapq
import math
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from bench.placement.churn import SAMPLES, ChurnResult, Plan, Sample, Tally
from bench.placement.fast import MIB, InProcessExtender, model_node, model_pod, pod_uid
from bench.placement.kube_model import ModelNode, ModelPod, SchedulerModel
from bench.placement.outcome import NodeUse, Outcome, ReplayResult, gpu_uses
from bench.placement.report import fragmentation_of, typical_shapes
from bench.placement.trace import FOREVER, TracePod, Workload, node_object, pod_object
from extender.settings import Settings

BACKOFF_INITIAL = 1.0
BACKOFF_MAX = 10.0
UNSCHEDULABLE_MAX = 300.0
"""podMaxInUnschedulablePodsDuration's default."""
FLUSH_EVERY = 30.0
FRAGMENTATION_EVERY = 4
"""The fragmentation is measured at one sample in this many (it walks every node and typical shape)."""

DEPART, WITHDRAW, ARRIVE, FLUSH, SAMPLE = range(5)
"""Events at the same instant happen in this order."""


@dataclass(slots=True)
class Queued:
    """A pod of the run, from its arrival on. Mutable."""

    index: int
    trace: TracePod
    pod: ModelPod
    body: dict[str, Any]
    arrived: float
    """Scheduler-time second it was created."""
    timestamp: float
    failures: int = 0
    seen: int = 0
    """Departures that had happened at its last attempt."""
    where: str = "active"
    """active, backoff, unschedulable, running, withdrawn or done."""
    token: int = 0
    """Which queue entry is current (entries are left in the heaps and skipped when stale)."""
    node: str = ""
    binds_seen: int = 0
    """Binds that had happened when it was last refused (the binds since each moved it and refused it again)."""

    @property
    def shape(self) -> tuple[object, ...]:
        pod = self.trace
        return (pod.cpu_milli, pod.memory_mib, pod.gpus, pod.gpu_milli, pod.models)


def backoff(failures: int) -> float:
    if not failures:
        return 0.0
    return min(BACKOFF_INITIAL * 2.0 ** min(failures - 1, 30), BACKOFF_MAX)


class ChurnFast:
    """One churn run in process. Mutable; `run` once."""

    def __init__(self, workload: Workload, plan: Plan, settings: Settings, config_yaml: str, seed: int = 0) -> None:
        self.workload = workload
        self.plan = plan
        self.nodes = [model_node(node) for node in sorted(workload.nodes, key=lambda node: node.name)]
        self.by_name: dict[str, ModelNode] = {node.name: node for node in self.nodes}
        self.extender = InProcessExtender(settings, [node_object(node) for node in workload.nodes])
        self.scheduler = SchedulerModel.parse(config_yaml, settings.scheduler_name, seed)
        self.scheduler_name = settings.scheduler_name
        self.now = 0.0
        self.events: list[tuple[float, int, int, int]] = []
        self.sequence = 0
        self.active: list[tuple[float, int, int]] = []
        self.backoffs: list[tuple[float, float, int, int]] = []
        self.unschedulable: dict[int, Queued] = {}
        self.pods: list[Queued] = []
        self.departures = 0
        self.freed: list[str] = []
        """The node of each departure, in order."""
        self.failed_shapes: dict[tuple[object, ...], int] = {}
        self.allocated = 0
        self.waiting_demand = 0
        self.tally = Tally()
        self.shapes = typical_shapes(workload.trace_pods)
        self.cycles = self.skipped = self.sampled = 0
        self.bind_count = 0
        self.last_bind = 0.0

    # -- the clock

    def at(self, when: float, kind: int, index: int = 0) -> None:
        self.sequence += 1
        heapq.heappush(self.events, (when, kind, self.sequence, index))

    def run(self) -> ChurnResult:
        started = time.perf_counter()
        plan, speed = self.plan, self.plan.speed
        end = plan.span / speed
        for index in range(len(self.workload.pods)):
            self.at(plan.arrival(index) / speed, ARRIVE, index)
        for number in range(1, int(end / FLUSH_EVERY) + 1):
            self.at(number * FLUSH_EVERY, FLUSH)
        for number in range(SAMPLES + 1):
            self.at(end * number / SAMPLES, SAMPLE, number)
        try:
            while self.events:
                when, kind, _, index = heapq.heappop(self.events)
                if when > end:
                    break
                self.now = when
                self.handle(kind, index)
                if not self.events or self.events[0][0] > when:
                    self.schedule_all()
            return self.result(time.perf_counter() - started)
        finally:
            self.extender.close()

    def handle(self, kind: int, index: int) -> None:
        if kind == ARRIVE:
            self.arrive(index)
        elif kind == DEPART:
            self.depart(self.pods[index])
        elif kind == WITHDRAW:
            self.withdraw(self.pods[index])
        elif kind == FLUSH:
            for queued in list(self.unschedulable.values()):
                self.caught_up(queued)
                if self.now - queued.timestamp > UNSCHEDULABLE_MAX:
                    self.to_backoff(queued)
        else:
            self.sample(index)

    # -- pods arriving, leaving, withdrawn

    def arrive(self, index: int) -> None:
        trace_pod = self.workload.pods[index]
        body = pod_object(trace_pod, self.scheduler_name)
        body["metadata"]["uid"] = pod_uid(trace_pod.name)
        queued = Queued(index, trace_pod, model_pod(trace_pod, body), body, self.now, self.now)
        self.pods.append(queued)
        self.extender.shown(body)
        self.waiting_demand += trace_pod.gpu_demand
        self.to_active(queued)
        self.at(self.now + self.plan.patience / self.plan.speed, WITHDRAW, index)

    def depart(self, queued: Queued) -> None:
        if queued.where != "running":
            return
        queued.where = "done"
        self.extender.shown(queued.body, deleted=True)
        self.scheduler.forget(queued.pod, self.by_name[queued.node])
        self.allocated -= queued.trace.gpu_demand
        self.departures += 1
        self.freed.append(queued.node)
        for waiting in list(self.unschedulable.values()):
            self.to_backoff(waiting)  # tried (or skipped: `certain_to_fail`) when popped, after the active queue

    def withdraw(self, queued: Queued) -> None:
        if queued.where not in ("active", "backoff", "unschedulable"):
            return
        self.unschedulable.pop(queued.index, None)
        queued.where, queued.token = "withdrawn", queued.token + 1
        self.waiting_demand -= queued.trace.gpu_demand
        self.tally.withdrawn[queued.trace.kind] += 1
        self.extender.shown(queued.body, deleted=True)

    # -- the queue

    def to_active(self, queued: Queued) -> None:
        queued.where, queued.token = "active", queued.token + 1
        heapq.heappush(self.active, (queued.timestamp, queued.index, queued.token))

    def to_backoff(self, queued: Queued) -> None:
        self.caught_up(queued)
        self.unschedulable.pop(queued.index, None)
        queued.where, queued.token = "backoff", queued.token + 1
        ends = math.floor(queued.timestamp + backoff(queued.failures))
        heapq.heappush(self.backoffs, (ends, queued.timestamp, queued.index, queued.token))

    def pop(self) -> Queued | None:
        heaps: tuple[list[tuple[Any, ...]], ...] = (self.active, self.backoffs)
        for heap in heaps:
            while heap:
                entry = heapq.heappop(heap)
                queued = self.pods[int(entry[-2])]
                if queued.token == entry[-1] and queued.where in ("active", "backoff"):
                    return queued
        return None

    def schedule_all(self) -> None:
        while (queued := self.pop()) is not None:
            self.attempt(queued)

    def attempt(self, queued: Queued) -> None:
        if self.certain_to_fail(queued):
            self.skipped += 1
            self.failed(queued)
            return
        self.cycles += 1
        decision = self.scheduler.schedule(queued.pod, self.nodes, self.extender)
        if not decision.node:
            self.failed_shapes[queued.shape] = self.departures
            self.sampled += not decision.complete
            self.failed(queued)
            return
        node = self.by_name[decision.node]
        self.scheduler.assume(queued.pod, node)
        if self.scheduler.interested(queued.pod):
            if self.extender.bind(queued.pod, decision.node):
                self.scheduler.forget(queued.pod, node)
                self.failed(queued)
                return
        else:
            self.extender.shown(dict(queued.body, spec=dict(queued.body["spec"], nodeName=decision.node)))
        queued.where, queued.node = "running", decision.node
        self.bind_count += 1
        self.last_bind = self.now
        self.waiting_demand -= queued.trace.gpu_demand
        self.allocated += queued.trace.gpu_demand
        self.tally.bound(queued.index, queued.trace, decision.node, (self.now - queued.arrived) * self.plan.speed)
        if queued.trace.lifetime != FOREVER:
            self.at(self.now + queued.trace.lifetime / self.plan.speed, DEPART, queued.index)

    def certain_to_fail(self, queued: Queued) -> bool:
        """Whether the cycle would surely refuse the pod (the module docstring's skipped work)."""
        if self.failed_shapes.get(queued.shape) == self.departures:
            return True
        if not queued.failures:
            return False
        if queued.seen == self.departures:
            return True
        names = set(self.freed[queued.seen :])
        return all(self.scheduler.refuse(queued.pod, self.by_name[name]) for name in names)

    def caught_up(self, queued: Queued) -> None:
        """An unschedulable pod as kube-scheduler would have it after the binds since it was refused: each moved it
        to the backoff queue, and it was tried and refused again at once."""
        if queued.where == "unschedulable" and self.bind_count > queued.binds_seen:
            queued.failures += self.bind_count - queued.binds_seen
            queued.timestamp = self.last_bind
            queued.binds_seen = self.bind_count

    def failed(self, queued: Queued) -> None:
        self.caught_up(queued)
        queued.failures += 1
        queued.timestamp = self.now
        queued.binds_seen = self.bind_count
        queued.seen = self.departures
        queued.where, queued.token = "unschedulable", queued.token + 1
        self.unschedulable[queued.index] = queued

    # -- the figures

    def uses(self) -> dict[str, NodeUse]:
        uses = gpu_uses(self.workload, self.extender.cache)
        for node in self.nodes:
            use = uses[node.name]
            use.cpu_used = node.requested.get("cpu", 0)
            use.memory_used = node.requested.get("memory", 0) // MIB
        return uses

    def sample(self, number: int) -> None:
        capacity = self.workload.gpu_capacity
        waiting = sum(1 for queued in self.pods if queued.where in ("active", "backoff", "unschedulable"))
        fragmented = stranded = math.nan
        if number % FRAGMENTATION_EVERY == 0 or number == SAMPLES:
            _, fragmented, stranded = fragmentation_of(self.uses().values(), capacity, self.shapes)
        self.tally.samples.append(
            Sample(
                self.now * self.plan.speed,
                100 * self.allocated / capacity,
                100 * (self.allocated + self.waiting_demand) / capacity,
                waiting,
                fragmented,
                stranded,
            )
        )
        over = self.extender.cache.overcommitted()
        if over:
            self.tally.problems.append(f"at trace second {self.now * self.plan.speed:.0f}: {'; '.join(over[:3])}")

    def result(self, seconds: float) -> ChurnResult:
        running = [queued for queued in self.pods if queued.where == "running"]
        outcomes = [Outcome(queued.trace, queued.node) for queued in running]
        end = ReplayResult.from_cache(
            "fast", self.workload, outcomes, self.extender.cache, seconds, dict(self.extender.seconds)
        )
        waited: dict[str, list[float]] = {}
        finish = self.plan.span / self.plan.speed
        for queued in self.pods:
            if queued.where in ("active", "backoff", "unschedulable"):
                waited.setdefault(queued.trace.kind, []).append((finish - queued.arrived) * self.plan.speed)
        arrived = Counter(queued.trace.kind for queued in self.pods)
        extra: dict[str, object] = {"cycles": self.cycles, "skipped": self.skipped, "sampled": self.sampled}
        return self.tally.result("fast", self.workload, self.plan, end, waited, arrived, seconds, extra)


def replay(workload: Workload, plan: Plan, settings: Settings, config_yaml: str, seed: int = 0) -> ChurnResult:
    return ChurnFast(workload, plan, settings, config_yaml, seed).run()
