"""The churn mode of `make bench-placement`: pods come and go, as they do in a cluster that never only fills.

The fill-up replay (the paper's method) sends pods until 130 % of the capacity has arrived and keeps every pod
placed. Here each pod of the arrival sequence (the same shuffle and draws, `trace.arrivals`, only longer: as many
pods as the run's `hours` of trace time take) arrives at a steady rate and, once started, runs for its own lifetime
from the trace (deletion minus creation; a pod the trace was cut on runs to the end of the run). A pod that fits
nowhere waits in kube-scheduler's queue, as it would in a cluster, and is tried again when pods leave; one that
has waited longer than the patience is withdrawn (deleted) and counted.

**The clock.** Trace time (seconds, the lifetimes' unit) is compressed into the scheduler's time by `speed`
(trace seconds per second): the run takes `minutes` of the scheduler's time whatever the trace's span.
kube-scheduler's own waits (its backoff of 1 to 10 s, the 5-minute flush of unschedulable pods) are in the
scheduler's time, so they weigh `speed` times more in trace time than in a real cluster; the figures name trace
time, and the plan prints both.

**The rate** (`plan`): arrivals are `gap` trace seconds apart for `hours` of trace time, the gap chosen so that
the GPU demand *offered* (the pods that have arrived and would still run had each started on arrival) averages
`offered` times the capacity over the run's second half (1.2 by default): the cluster runs full and pods queue.
The trace's lifetimes are short for most pods (median 9 minutes) and long for a few (a tenth of the GPU demand
beyond a day), so a run must last hours of trace time for the cluster to turn over: 2 hours at 120 % take about
5 capacities' worth of pods on `default`. The offered demand is a property of the workload and the plan, the
same for every policy; what a policy changes is how much of it is allocated. (The samples' "offered" counts the
pods waiting too, whose lifetimes have not begun: above the plan's figure once pods queue.)

Figures (`figures`): GPU allocated, averaged over the *full part* of the run (from the first time the offered
demand reaches the capacity to the end), and its curve; fragmentation (the paper's expected fragment and
stranded GPU, as `report.fragmentation` measures them) over time; wait times p50/p90/p99 in trace time per kind
of pod (shares of one GPU, one whole GPU, several GPUs, no GPU), over the pods bound or withdrawn (a withdrawn
pod counted as having waited its patience, so that starving the 8-GPU pods shows); pods withdrawn and still
waiting at the end; and the end check (nothing over capacity: `ReplayResult.check` on the pods running at the
end).

Pure: the plan and the figures; the replays are `churn_fast.py` (in process) and `real.py` (kube-scheduler).
"""

from __future__ import annotations

import hashlib
import math
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from bench.placement.outcome import ReplayResult, peer_restarts
from bench.placement.trace import FOREVER, TracePod, Workload

OFFERED = 1.2
"""GPU demand offered over the capacity, averaged over the run's second half."""
MINUTES = 20.0
"""The run's length in the scheduler's time."""
PATIENCE = 3600.0
"""Trace seconds a pod waits before it is withdrawn."""
NODES = 400
"""Nodes of the trace's cluster a churn run samples unless told: 2 trace hours on all 1,213 take 50,000 pods,
which the real mode cannot create, bind and delete on a 2-core machine at the pace the clock asks, and the fast
mode takes 20 minutes for; on 400, 16,000 pods."""
HOURS = 2.0
"""Trace hours from the first arrival to the last."""
LONGEST = 20.0
"""Capacities' worth of pods drawn at most (the arrival sequence `plan` takes its pods from)."""
SAMPLES = 120
"""Points of the curves."""
KINDS = ("share", "whole", "multi", "cpu")
KIND_NAMES = {"share": "shares", "whole": "1 GPU", "multi": "several GPUs", "cpu": "no GPU"}


class PlanError(ValueError):
    """The churn settings cannot make a run (a message names the setting)."""


@dataclass(frozen=True, slots=True)
class Plan:
    """When pods arrive, how fast the clock runs, how long a pod waits."""

    gap: float
    """Trace seconds between two arrivals."""
    speed: float
    """Trace seconds per second of the scheduler's time."""
    patience: float
    """Trace seconds a pod may wait before it is withdrawn."""
    offered: float
    """The offered demand the gap was chosen for, in capacities."""
    pods: int

    @property
    def span(self) -> float:
        """Trace seconds from the first arrival to the end of the run (the last arrival)."""
        return self.gap * max(self.pods - 1, 1)

    def arrival(self, index: int) -> float:
        """Trace second at which the pod of that index arrives."""
        return index * self.gap

    def describe(self) -> str:
        return (
            f"churn: {self.pods:,} pods, one every {self.gap:.1f} trace s ({self.span / 3600:.1f} trace hours), "
            f"clock x{self.speed:.0f} ({self.span / self.speed / 60:.1f} min of the scheduler's time), "
            f"offered {self.offered:.0%} of the GPU capacity, patience {self.patience / 60:.0f} trace min"
        )


def offered_steps(pods: Sequence[TracePod], gap: float, end: float) -> list[tuple[float, int]]:
    """The offered GPU demand (milli-GPU) as steps (time, change), sorted: each pod from its arrival for its
    lifetime, as if it had started on arrival."""
    steps: list[tuple[float, int]] = []
    for index, pod in enumerate(pods):
        if not pod.gpu_demand:
            continue
        start = index * gap
        steps.append((start, pod.gpu_demand))
        if pod.lifetime != FOREVER and start + pod.lifetime < end:
            steps.append((start + pod.lifetime, -pod.gpu_demand))
    steps.sort()
    return steps


def mean_offered(pods: Sequence[TracePod], gap: float, start: float, end: float) -> float:
    """The offered demand's time average over [start, end], in milli-GPU."""
    level, area, last = 0.0, 0.0, start
    for time, change in offered_steps(pods, gap, end):
        if time > start:
            area += level * (min(time, end) - last)
            last = min(time, end)
        if time >= end:
            break
        level += change
    area += level * (end - last)
    return area / (end - start) if end > start else level


def plan(
    workload: Workload,
    offered: float = OFFERED,
    hours: float = HOURS,
    minutes: float = MINUTES,
    patience: float = PATIENCE,
) -> tuple[Plan, Workload]:
    """The gap that offers `offered` capacities over the second half of `hours` of trace time (bisection: more
    gap, fewer pods, less offered), the clock's speed that makes the run `minutes` long, and the workload cut to
    the pods that arrive. `workload.pods` must be long enough (`LONGEST` capacities' worth: `trace.arrivals` with
    that ratio); a plan that would need more pods is refused, naming the setting."""
    if not 0.1 <= offered <= 10:
        raise PlanError(f"--churn-offered {offered}: between 0.1 and 10 capacities")
    if not 0.01 <= hours <= 24 * 30:
        raise PlanError(f"--churn-hours {hours}: between 0.01 and 720 trace hours")
    if not 0.5 <= minutes <= 24 * 60:
        raise PlanError(f"--churn-minutes {minutes}: between 0.5 and 1440")
    if not 0 < patience <= 30 * 86400:
        raise PlanError(f"--churn-patience {patience}: between 1 trace second and 30 days")
    pods = workload.pods
    if len(pods) < 10 or not any(pod.gpu_demand for pod in pods):
        raise PlanError("the churn mode needs at least 10 pods arriving, some of them asking GPUs")
    span = hours * 3600
    target = offered * workload.gpu_capacity

    def count(gap: float) -> int:
        return int(span / gap) + 1

    low, high = span / (len(pods) - 1), span  # trace seconds between arrivals: every pod drawn .. two pods
    if mean_offered(pods[: count(low)], low, span / 2, span) < target:
        raise PlanError(
            f"--churn-offered {offered} over --churn-hours {hours}: even {len(pods):,} pods (every one drawn) "
            f"offer less; ask fewer hours or less offered"
        )
    for _ in range(40):
        gap = math.sqrt(low * high)
        if mean_offered(pods[: count(gap)], gap, span / 2, span) > target:
            low = gap
        else:
            high = gap
    gap = math.sqrt(low * high)
    arriving = min(count(gap), len(pods))
    cut = replace(workload, pods=workload.pods[:arriving])
    return Plan(gap, gap * max(arriving - 1, 1) / (minutes * 60), patience, offered, arriving), cut


# ---- what a replay records ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Sample:
    """The cluster at one moment of the run (trace seconds from the first arrival)."""

    time: float
    allocated: float
    """% of the GPU capacity bound to running pods."""
    offered: float
    """% of the GPU capacity asked by the pods running and waiting."""
    waiting: int
    """Pods waiting in the queue."""
    fragmented: float = math.nan
    """The paper's expected fragment, % of the capacity (when measured at this point)."""
    stranded: float = math.nan


@dataclass(slots=True)
class ChurnResult:
    mode: str
    workload: Workload
    plan: Plan
    samples: list[Sample]
    waits: dict[str, list[float]]
    """Trace seconds each pod bound waited, by kind."""
    withdrawn: Counter[str]
    waiting_at_end: Counter[str]
    arrived: Counter[str]
    waited_at_end: dict[str, list[float]]
    """Trace seconds each pod still waiting at the end had waited, by kind."""
    binds: list[tuple[int, str]]
    """(arrival index, node) of every bind, in order: the digest of where pods went."""
    end: ReplayResult
    """The pods running at the end and the GPUs they hold: the end check."""
    seconds: float
    verb_seconds: dict[str, float] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    """Found while running (an allocation over capacity at a sample), beside the end check's."""
    extra: dict[str, object] = field(default_factory=dict)

    @property
    def all_problems(self) -> list[str]:
        return [*self.problems, *self.end.problems]


@dataclass(slots=True)
class Tally:
    """What a churn replay records as it goes, in either mode. Mutable."""

    waits: dict[str, list[float]] = field(default_factory=dict)
    withdrawn: Counter[str] = field(default_factory=Counter)
    binds: list[tuple[int, str]] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def bound(self, index: int, pod: TracePod, node: str, wait: float) -> None:
        """The pod of that arrival index bound to `node` after waiting `wait` trace seconds."""
        self.binds.append((index, node))
        self.waits.setdefault(pod.kind, []).append(wait)

    def result(
        self,
        mode: str,
        workload: Workload,
        plan: Plan,
        end: ReplayResult,
        waited: dict[str, list[float]],
        arrived: Counter[str],
        seconds: float,
        extra: dict[str, object],
    ) -> ChurnResult:
        """`waited`: the trace seconds each pod still waiting at the end has waited, by kind."""
        waiting = Counter({kind: len(values) for kind, values in waited.items()})
        return ChurnResult(
            mode, workload, plan, self.samples, self.waits, self.withdrawn, waiting, arrived, waited, self.binds,
            end, seconds, dict(end.verb_seconds), self.problems, extra,
        )  # fmt: skip


def percentile(values: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile (NaN for no values)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(fraction * len(ordered)) - 1))]


def full_from(plan: Plan, workload: Workload) -> float:
    """Trace second from which the plan offers the capacity (the demand of the pods arrived that would still run
    had each started on arrival): where the run's *full part* begins, the same for every policy (NaN: never)."""
    level = 0
    for time, change in offered_steps(workload.pods, plan.gap, plan.span):
        level += change
        if level >= workload.gpu_capacity:
            return time
    return math.nan


def full_part(result: ChurnResult) -> list[Sample]:
    """The samples of the run's full part (`full_from`)."""
    start = full_from(result.plan, result.workload)
    return [] if math.isnan(start) else [sample for sample in result.samples if sample.time >= start]


@dataclass(frozen=True, slots=True)
class Figures:
    allocated: float
    """% of the GPU capacity allocated, mean over the full part."""
    offered: float
    full_from: float
    """Trace second the full part begins (NaN: the run never got full)."""
    fragmented: float
    stranded: float
    waits: dict[str, tuple[float, float, float, int]]
    """Per kind: p50, p90, p99 of the wait (trace seconds) over every pod that arrived (one withdrawn at its
    patience, one still waiting at the end at its wait so far), and their number."""
    withdrawn: int
    waiting_at_end: int
    binds: int
    placements: str
    """A digest of every bind, in order (`report.placements`' idea)."""
    problems: list[str]


def figures(result: ChurnResult) -> Figures:
    full = full_part(result)
    measured = [sample for sample in full if not math.isnan(sample.fragmented)]
    waits: dict[str, tuple[float, float, float, int]] = {}
    for kind in KINDS:
        values = [
            *result.waits.get(kind, []),
            *[result.plan.patience] * result.withdrawn[kind],
            *result.waited_at_end.get(kind, []),
        ]
        waits[kind] = (percentile(values, 0.5), percentile(values, 0.9), percentile(values, 0.99), len(values))
    text = "".join(f"{index} {node}\n" for index, node in result.binds)
    return Figures(
        allocated=statistics.mean(sample.allocated for sample in full) if full else math.nan,
        offered=statistics.mean(sample.offered for sample in full) if full else math.nan,
        full_from=full_from(result.plan, result.workload),
        fragmented=statistics.mean(sample.fragmented for sample in measured) if measured else math.nan,
        stranded=statistics.mean(sample.stranded for sample in measured) if measured else math.nan,
        waits=waits,
        withdrawn=sum(result.withdrawn.values()),
        waiting_at_end=sum(result.waiting_at_end.values()),
        binds=len(result.binds),
        placements=hashlib.sha256(text.encode()).hexdigest()[:12],
        problems=result.all_problems,
    )


def duration(seconds: float) -> str:
    if math.isnan(seconds):
        return "-"
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


def render(result: ChurnResult, label: str = "") -> str:
    shown = figures(result)
    workload = result.workload
    step = max(1, len(result.samples) // 12)
    full = (
        f"GPU allocated over the full part: {shown.allocated:.1f} % (from trace hour {shown.full_from / 3600:.1f}, "
        f"when the plan offers the capacity; with the pods waiting, {shown.offered:.0f} % asked); fragmented "
        f"{shown.fragmented:.1f} %, stranded {shown.stranded:.1f} % (means over the full part)"
        if not math.isnan(shown.full_from)
        else "the plan never offers the capacity: no full part (more --churn-offered or --churn-hours)"
    )
    lines = [
        f"== {label or result.mode}, churn: workload {workload.name}, {len(workload.nodes):,} nodes, "
        f"{workload.gpu_capacity // 1000:,} GPUs, {len(workload.pods):,} pods arriving",
        result.plan.describe(),
        full,
        "allocated % over trace hours: "
        + " ".join(f"{sample.time / 3600:.1f}h:{sample.allocated:.0f}" for sample in result.samples[::step]),
    ]
    parts = []
    for kind in KINDS:
        p50, p90, p99, count = shown.waits[kind]
        if count:
            parts.append(f"{KIND_NAMES[kind]} {duration(p50)}/{duration(p90)}/{duration(p99)} ({count:,})")
    lines.append(
        "wait p50/p90/p99 in trace time, by kind (pods; withdrawn at the patience, still waiting at their wait so "
        "far): " + ", ".join(parts)
    )
    withdrawn = result.withdrawn
    kinds = ", ".join(f"{KIND_NAMES[kind]} {withdrawn[kind]:,}" for kind in KINDS if withdrawn[kind])
    lines.append(
        f"bound {shown.binds:,} times (placements {shown.placements}); withdrawn {shown.withdrawn:,}"
        + (f" ({kinds})" if kinds else "")
        + f"; still waiting at the end {shown.waiting_at_end:,}"
    )
    timing = f"{result.seconds:.1f} s of wall time"
    if result.verb_seconds:
        timing += "; in the extender's handlers: " + ", ".join(
            f"{verb} {seconds:.1f} s" for verb, seconds in result.verb_seconds.items()
        )
    late = result.extra.get("late")
    if isinstance(late, float):
        timing += f"; the driver came at most {late:.2f} s after its timetable"
    timing += peer_restarts(result.extra, result.plan.speed)
    sampled = result.extra.get("sampled")
    if sampled:
        timing += (
            f"; {sampled:,} refusals came from a sample of the nodes (percentageOfNodesToScore), and retries after "
            "them were skipped as if every node had refused (churn_fast.py)"
        )
    lines.append(timing)
    problems = shown.problems
    lines.append("end check: ok" if not problems else f"end check FAILED: {'; '.join(problems[:10])}")
    return "\n".join(lines)
