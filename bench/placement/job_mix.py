"""The gang workload of `python -m bench.placement.jobs`: multi-pod jobs built from the openb trace's pod shapes,
with job sizes drawn from a mix of our own, and the Kueue declarations that make a job's pods one group.

Why our own mix: the public job table with worker counts (Alibaba's `cluster-trace-v2026-spot-gpu`,
`job_info_df.csv`, `worker_num` per job) could not be read where this bench was written (its snapshot has the
node table and the README's four sample rows, not the job table), and we know of no published distribution of
worker counts over the openb trace's pods. So the sizes are ours, stated here and on the page, never passed off as
a trace's:

- `SIZES`: a job has 1, 2, 4, 8 or 16 pods, with weights 50, 20, 15, 10 and 5 (by jobs: half the jobs are single
  pods, so the mix is not all gangs; about 3.1 pods a job on average).
- Each job's pods share one shape (cpu, memory, GPUs, share of each GPU, allowed models, lifetime), drawn with
  replacement from the trace's pods, sorted by name: any pod for a single-pod job; a pod asking GPUs for a job of
  several (a gang of pods asking no GPU is placed as any pods are: what a job holds whole is its GPUs).
- Jobs arrive, in the order drawn, until the GPU demand that arrived reaches `ratio` x the nodes' GPU capacity
  (the fill-up of `make bench-placement`, 130 %): the last job may pass it by its own demand.

The draws come from one generator seeded with the run's seed; the node sample (`sample_nodes`) is the one
`make bench-placement --nodes N` takes for the same seed, so the two benches replay the same cluster.

A job of several pods is declared as Kueue's plain-pod groups declare one (`declare`): the label
`kueue.x-k8s.io/pod-group-name` and the annotation `kueue.x-k8s.io/pod-group-total-count` on each of its pods, as
Kueue v0.17.0's pod webhook requires them; a single-pod job carries neither, as Kueue's single plain pods. The same
pods without them are what a scheduler that knows no groups sees (the peers ignore them anyway).

Pure: builds values and dicts, never talks to a process.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from bench.placement.trace import MILLI, TraceError, TraceNode, TracePod, Workload
from extender.core.groups import KUEUE_GROUP, KUEUE_TOTAL

SIZES: tuple[tuple[int, int], ...] = ((1, 50), (2, 20), (4, 15), (8, 10), (16, 5))
"""(pods in a job, weight by jobs): our mix, not a trace's (see the module's docstring)."""


@dataclass(frozen=True, slots=True)
class TraceJob:
    """One job: its pods, all of one shape drawn from the trace."""

    name: str
    """`job-00042`: the group's name, and its pods' names' stem."""
    shape: str
    """The trace pod whose shape its pods take."""
    members: tuple[TracePod, ...]

    @property
    def size(self) -> int:
        return len(self.members)

    @property
    def gpu_demand(self) -> int:
        """Milli-GPU of all its pods."""
        return sum(member.gpu_demand for member in self.members)


@dataclass(frozen=True, slots=True)
class JobWorkload:
    """The cluster and the jobs that arrive at it; `workload.pods` is every job's pods, job after job."""

    workload: Workload
    jobs: tuple[TraceJob, ...]

    def job_of(self) -> dict[str, TraceJob]:
        """Each pod's job, by the pod's name."""
        return {member.name: job for job in self.jobs for member in job.members}


def draw_jobs(
    pods: Sequence[TracePod], capacity: int, seed: int, ratio: float, sizes: Sequence[tuple[int, int]] = SIZES
) -> tuple[TraceJob, ...]:
    """Jobs drawn until their GPU demand reaches `ratio` x `capacity` (milli-GPU); see the module's docstring."""
    rng = random.Random(seed)
    shapes = sorted(pods, key=lambda pod: pod.name)
    asking = [pod for pod in shapes if pod.gpus]
    if not asking:
        raise TraceError("no pod of the trace asks a GPU: no job to build")
    counts = [count for count, _ in sizes]
    weights = [weight for _, weight in sizes]
    target = ratio * capacity
    jobs: list[TraceJob] = []
    total = 0
    while total < target:
        size = rng.choices(counts, weights=weights)[0]
        pool = shapes if size == 1 else asking
        shape = pool[rng.randrange(len(pool))]
        name = f"job-{len(jobs):05d}"
        members = tuple(replace(shape, name=f"{name}-{number}") for number in range(size))
        jobs.append(TraceJob(name, shape.name, members))
        total += size * shape.gpu_demand
    return tuple(jobs)


def sample_nodes(nodes: Sequence[TraceNode], count: int, seed: int) -> tuple[TraceNode, ...]:
    """`count` of the nodes, as `make bench-placement --nodes` samples them for this seed (all of them when
    `count` is 0 or not less than their number), by name."""
    if not count or count >= len(nodes):
        return tuple(nodes)
    return tuple(sorted(random.Random(seed).sample(list(nodes), count), key=lambda node: node.name))


def job_workload(
    name: str, nodes: Sequence[TraceNode], trace_pods: Sequence[TracePod], seed: int, ratio: float
) -> JobWorkload:
    capacity = sum(node.gpus for node in nodes) * MILLI
    jobs = draw_jobs(trace_pods, capacity, seed, ratio)
    pods = tuple(member for job in jobs for member in job.members)
    return JobWorkload(Workload(name, tuple(nodes), pods, tuple(trace_pods)), jobs)


def declare(body: dict[str, Any], job: TraceJob) -> dict[str, Any]:
    """The pod object with its job's Kueue declaration, when the job has several pods."""
    if job.size > 1:
        metadata = body["metadata"]
        metadata.setdefault("labels", {})[KUEUE_GROUP] = job.name
        metadata.setdefault("annotations", {})[KUEUE_TOTAL] = str(job.size)
    return body
