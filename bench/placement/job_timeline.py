"""Jobs that come and go (`python -m bench.placement.jobs --churn`): the plan of their arrivals, and what each job
does over the run, counted as it happens: when its pods bind, when it starts (all of them bound), when it is
withdrawn or finishes, and the GPU-time its pods hold while it has not started.

**The plan** (`job_plan`) is `churn.plan`'s, with each job in place of a pod: a job arrives every `gap` trace
seconds, all its pods at once, and its demand is its pods' (`as_pods`), so the cluster is offered `offered` times
its capacity over the run's second half. A job runs, once all its pods are bound, for its shape's lifetime from the
trace, then all its pods are deleted; a job not started a patience after its arrival is withdrawn whole, its pods
bound or not (as Kueue's `waitForPodsReady` evicts a job whose pods do not all start in time). So a job partly
placed holds its pods' GPUs, doing nothing, until its last pods bind or it is withdrawn.

**The tally** (`JobTimeline`, in trace seconds): the GPU-time held by the pods of jobs not started (the cost of
partial placement), integrated exactly over the run; the GPU held by jobs started, for the samples; jobs started,
withdrawn (and whether they held GPUs then), still waiting at the end; each job's wait from its arrival to its
start. Mutable: the driver (`jobs_churn.py`) tells it what the watch shows.

Pure: never talks to a process.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from bench.placement import churn
from bench.placement.churn import Plan, percentile
from bench.placement.job_mix import JobWorkload, TraceJob
from bench.placement.trace import MILLI, TracePod, Workload


def as_pods(jobs: Sequence[TraceJob]) -> tuple[TracePod, ...]:
    """Each job as one pod of its demand and its shape's lifetime: what `churn.plan` reads of an arrival."""
    pods = []
    for job in jobs:
        shape = job.members[0]
        pods.append(replace(shape, name=job.name, gpus=shape.gpus * job.size))
    return tuple(pods)


def job_plan(
    jobs: JobWorkload, offered: float, hours: float, minutes: float, patience: float
) -> tuple[Plan, JobWorkload, Workload]:
    """The plan for the jobs (`churn.plan` over `as_pods`), the jobs cut to those that arrive, and the jobs as pods
    on the cluster (a `trace.Workload`: what `churn.figures` reads the full part from)."""
    as_workload = replace(jobs.workload, pods=as_pods(jobs.jobs))
    plan, cut = churn.plan(as_workload, offered, hours, minutes, patience)
    kept = jobs.jobs[: plan.pods]
    members = tuple(member for job in kept for member in job.members)
    return plan, JobWorkload(replace(jobs.workload, pods=members), kept), cut


@dataclass(slots=True)
class JobTimeline:
    """What every job did so far. Mutable; times in trace seconds from the first arrival."""

    jobs: tuple[TraceJob, ...]
    capacity: int
    """Milli-GPU of the cluster."""
    arrived: dict[int, float] = field(default_factory=dict)
    bound: dict[int, set[int]] = field(default_factory=dict)
    """Job -> its pods bound (by number), while it has not started."""
    started: dict[int, float] = field(default_factory=dict)
    finished: set[int] = field(default_factory=set)
    withdrawn: dict[int, int] = field(default_factory=dict)
    """Job -> the milli-GPU its pods held when it was withdrawn."""
    partial: int = 0
    """Milli-GPU held now by the pods of jobs not started."""
    running: int = 0
    """Milli-GPU held now by jobs started."""
    partial_area: float = 0.0
    """Milli-GPU x trace seconds held by the pods of jobs not started, so far."""
    first_bound: dict[int, float] = field(default_factory=dict)
    """Job -> when its first pod bound, while it has not started (nor been withdrawn)."""
    spans: list[float] = field(default_factory=list)
    """Trace seconds each job spent partly placed: from its first pod's bind to its last's (or its withdrawal)."""
    last: float = 0.0

    def advance(self, now: float) -> None:
        if now > self.last:
            self.partial_area += self.partial * (now - self.last)
            self.last = now

    def arrive(self, job: int, now: float) -> None:
        self.arrived[job] = now

    def bind(self, job: int, member: int, now: float) -> bool:
        """A pod of the job bound; True when it was the last: the job starts now."""
        if job in self.started or job in self.withdrawn:
            return False
        self.advance(now)
        members = self.jobs[job].members
        bound = self.bound.setdefault(job, set())
        if member in bound:
            return False
        bound.add(member)
        self.partial += members[member].gpu_demand
        self.first_bound.setdefault(job, now)
        if len(bound) < len(members):
            return False
        self.spans.append(now - self.first_bound.pop(job))
        self.partial -= sum(member.gpu_demand for member in members)
        self.running += self.jobs[job].gpu_demand
        self.started[job] = now
        del self.bound[job]
        return True

    def withdraw(self, job: int, now: float) -> bool:
        """The job withdrawn (not started a patience after its arrival); False when it had started or gone."""
        if job in self.started or job in self.withdrawn:
            return False
        self.advance(now)
        members = self.jobs[job].members
        held = sum(members[number].gpu_demand for number in self.bound.pop(job, set()))
        if job in self.first_bound:
            self.spans.append(now - self.first_bound.pop(job))
        self.partial -= held
        self.withdrawn[job] = held
        return True

    def finish(self, job: int, now: float) -> None:
        """A started job's pods deleted at the end of its lifetime."""
        if job in self.started and job not in self.finished:
            self.advance(now)
            self.finished.add(job)
            self.running -= self.jobs[job].gpu_demand

    def partly_placed(self) -> int:
        """Jobs not started holding GPUs now."""
        return sum(1 for bound in self.bound.values() if bound)

    def wait(self, job: int, end: float, patience: float) -> float:
        """Trace seconds from the job's arrival to its start; a withdrawn job's, the patience; one still waiting,
        its wait so far."""
        if job in self.started:
            return self.started[job] - self.arrived[job]
        return patience if job in self.withdrawn else end - self.arrived[job]

    def figures(self, end: float, patience: float) -> dict[str, Any]:
        """The jobs' figures at `end`: GPU-hours held by jobs not started (and their share of the cluster's
        GPU-hours over the run), jobs started / withdrawn (holding GPUs then) / waiting at the end (holding GPUs),
        the wait of the jobs of several pods (p50, p90; a withdrawn one at the patience, one still waiting at
        its wait so far), and the longest any job was partly placed (from its first pod's bind to its last's, its
        withdrawal, or the end: a job bound whole in one go is partly placed only while kube-scheduler binds its
        pods one after another)."""
        self.advance(end)
        waiting = [job for job in self.arrived if job not in self.started and job not in self.withdrawn]
        gangs = [job for job in self.arrived if self.jobs[job].size > 1]
        waits = [self.wait(job, end, patience) for job in gangs]
        hours = self.partial_area / MILLI / 3600
        return {
            "jobs": len(self.arrived),
            "started": len(self.started),
            "withdrawn": len(self.withdrawn),
            "withdrawn_partial": sum(1 for held in self.withdrawn.values() if held),
            "waiting": len(waiting),
            "waiting_partial": sum(1 for job in waiting if self.bound.get(job)),
            "partial_gpu_hours": hours,
            "partial_share": 100 * self.partial_area / (self.capacity * end) if end > 0 and self.capacity else 0.0,
            "gang_wait_p50": percentile(waits, 0.5),
            "gang_wait_p90": percentile(waits, 0.9),
            "partly_placed_longest": max(
                [*self.spans, *(end - first for first in self.first_bound.values())], default=0.0
            ),
        }


@dataclass(frozen=True, slots=True)
class JobSample:
    time: float
    """Trace seconds from the first arrival (the plan's, as `churn.Sample`'s)."""
    running: float
    """% of the GPU capacity held by jobs started."""
    partial: float
    """% of the GPU capacity held by the pods of jobs not started."""
    partly_placed: int


def mean_over(samples: Sequence[JobSample], start: float, attribute: str) -> float:
    """The mean of one figure over the samples from `start` (NaN: none, or no start)."""
    chosen = [getattr(sample, attribute) for sample in samples if not math.isnan(start) and sample.time >= start]
    return sum(chosen) / len(chosen) if chosen else math.nan


def render(figures: dict[str, Any]) -> str:
    """The jobs' lines of a churn run's report."""
    return "\n".join(
        [
            f"jobs: {figures['jobs']:,} arrived; started {figures['started']:,}, withdrawn {figures['withdrawn']:,} "
            f"({figures['withdrawn_partial']:,} of them partly placed then), waiting at the end "
            f"{figures['waiting']:,} ({figures['waiting_partial']:,} partly placed)",
            f"GPU allocated over the full part {figures['allocated']:.1f} %: to jobs started "
            f"{figures['useful']:.1f} %; held by jobs partly placed {figures['partial_gpu_hours']:,.1f} GPU-hours of "
            f"trace time ({figures['partial_share']:.2f} % of the cluster's over the run)",
            f"wait of jobs of several pods, trace time: p50 {churn.duration(figures['gang_wait_p50'])}, "
            f"p90 {churn.duration(figures['gang_wait_p90'])}; the longest a job was partly placed "
            f"{churn.duration(figures['partly_placed_longest'])}",
        ]
    )
