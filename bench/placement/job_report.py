"""What a gang replay (`python -m bench.placement.jobs`) did to its jobs, read from the API's pods at the end, and
its printing.

Each job, by how many of its pods are bound (`spec.nodeName`) at the end:
- **started whole**: all of them;
- **partly placed**: some, fewer than its size. Its pods bound hold GPUs that do nothing: a distributed job
  starts when all its workers do. Their GPUs (milli-GPU, from the bound pods' allocation annotations, as the
  device plugin of the run's protocol reads them) are counted apart;
- **never started**: none.
A single-pod job is started or never started; only jobs of several pods can be partly placed.

The share of GPUs allocated is `make bench-placement`'s (every bound pod's GPUs over the capacity); beside it, the
share allocated to jobs started whole: the GPUs that can do work.

Pure: computes and formats from the pods it is given, never talks to the API itself.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from bench.placement.job_mix import TraceJob
from bench.placement.trace import MILLI, Wire


@dataclass(frozen=True, slots=True)
class JobState:
    """One job at the end: its pods bound, and the milli-GPU they hold."""

    job: TraceJob
    bound: int
    held: int

    @property
    def kind(self) -> str:
        """whole, partial or never."""
        if self.bound >= self.job.size:
            return "whole"
        return "partial" if self.bound else "never"


@dataclass(frozen=True, slots=True)
class JobTally:
    """Every job's state at the end, and what a bound pod's annotations did not say."""

    states: tuple[JobState, ...]
    capacity: int
    """Milli-GPU of the cluster."""
    problems: tuple[str, ...] = field(default=())

    def count(self, kind: str, smallest: int = 1) -> int:
        """Jobs of `kind` with at least `smallest` pods."""
        return sum(1 for state in self.states if state.kind == kind and state.job.size >= smallest)

    def held(self, kind: str) -> int:
        """Milli-GPU held by the bound pods of jobs of `kind`."""
        return sum(state.held for state in self.states if state.kind == kind)

    def share(self, kind: str) -> float:
        """% of the capacity held by jobs of `kind`."""
        return 100 * self.held(kind) / self.capacity if self.capacity else 0.0

    def summary(self) -> dict[str, Any]:
        """The figures a record keeps (bench/figures.py builds the page's table from them)."""
        sizes = sorted({state.job.size for state in self.states})
        return {
            "jobs": len(self.states),
            "gangs": sum(1 for state in self.states if state.job.size > 1),
            "pods": sum(state.job.size for state in self.states),
            "whole": self.count("whole"),
            "whole_gangs": self.count("whole", 2),
            "partial": self.count("partial"),
            "never": self.count("never"),
            "never_gangs": self.count("never", 2),
            "allocated": self.share("whole") + self.share("partial"),
            "useful": self.share("whole"),
            "partial_gpus": self.held("partial") / MILLI,
            "partial_share": self.share("partial"),
            "by_size": {
                str(size): {
                    kind: sum(1 for state in self.states if state.job.size == size and state.kind == kind)
                    for kind in ("whole", "partial", "never")
                }
                for size in sizes
            },
            "problems": list(self.problems),
        }


def tally(jobs: Iterable[TraceJob], pods: Iterable[Mapping[str, Any]], wire: Wire, capacity: int) -> JobTally:
    """Each job's state from the API's pods (`pods`: the namespace's list at the end), the allocations read as
    `wire`'s device plugin reads them. A bound pod asking GPUs without an allocation is a problem, counted as
    holding nothing."""
    by_name = {(pod.get("metadata") or {}).get("name", ""): pod for pod in pods}
    states, problems = [], []
    for job in jobs:
        bound = held = 0
        for member in job.members:
            pod = by_name.get(member.name.lower())
            node = ((pod or {}).get("spec") or {}).get("nodeName")
            if pod is None or not node:
                continue
            bound += 1
            if not member.gpu_demand:
                continue
            allocation = wire.held(pod)
            if allocation is None:
                problems.append(f"pod {member.name} is bound to {node} without its GPU allocation")
                continue
            held += sum(allocation.values())
        states.append(JobState(job, bound, held))
    return JobTally(tuple(states), capacity, tuple(problems))


def render(figures: Mapping[str, Any]) -> str:
    """The jobs' lines of a run's report, from `JobTally.summary`."""
    by_size = figures["by_size"]
    sizes = ", ".join(
        f"{size}: {counts['whole']}/{counts['partial']}/{counts['never']}" for size, counts in by_size.items()
    )
    return "\n".join(
        [
            f"jobs: {figures['jobs']:,} ({figures['gangs']:,} of several pods; {figures['pods']:,} pods): "
            f"started whole {figures['whole']:,} ({figures['whole_gangs']:,} of several pods), "
            f"partly placed {figures['partial']:,}, never started {figures['never']:,}",
            f"GPU allocated {figures['allocated']:.1f} %: to jobs started whole {figures['useful']:.1f} %, to jobs "
            f"partly placed {figures['partial_share']:.1f} % ({figures['partial_gpus']:,.1f} GPUs doing nothing)",
            f"by pods a job (whole/partial/never): {sizes}",
        ]
    )
