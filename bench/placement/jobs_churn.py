"""Jobs that come and go through the real kube-scheduler: `churn_real.py`'s driver (its timetable, clock, pod
watch, samples and end check), with a job in place of a pod (`job_timeline.py` says the plan and what is counted).

At a job's arrival all its pods are created (with its Kueue declaration in a run with groups); when the watch has
shown every one of them bound, the job starts, and all its pods are deleted its lifetime later; a job not started a
patience after its arrival is withdrawn, all its pods deleted, those bound too. Pods bound of a job not started
hold their GPUs meanwhile: the tally counts that GPU-time. kube-scheduler's queue does the rest, as in the pod
churn: a pod that fits nowhere waits there and is tried again when pods leave.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench.placement.churn import SAMPLES, ChurnResult, Plan, figures
from bench.placement.churn_real import CREATE, DELETE, WITHDRAW, ChurnReal
from bench.placement.job_mix import JobWorkload, declare
from bench.placement.job_timeline import JobSample, JobTimeline, mean_over
from bench.placement.peers import Built
from bench.placement.trace import FOREVER, GPUSHARE, NAMESPACE, Wire, Workload

PODS = f"/api/v1/namespaces/{NAMESPACE}/pods"


class JobChurn(ChurnReal):
    """One churn run of jobs. Mutable; `run_jobs` once."""

    def __init__(
        self,
        binaries: Path,
        workdir: Path,
        jobs: JobWorkload,
        as_pods: Workload,
        extender_flags: Sequence[str] = (),
        config_flags: Sequence[str] = (),
        scheduler_name: str = "gpu-scheduler",
        *,
        plan: Plan,
        groups: bool = True,
        progress: Callable[[str], None] | None = None,
        peer: Built | None = None,
        wire: Wire = GPUSHARE,
    ) -> None:
        super().__init__(
            binaries, workdir, jobs.workload, extender_flags, config_flags, scheduler_name,
            plan=plan, progress=progress, peer=peer, wire=wire,
        )  # fmt: skip
        self.jobs = jobs
        self.as_pods = as_pods
        """The jobs as pods (`job_timeline.job_plan`): where the run's full part begins."""
        self.groups = groups
        self.members: list[range] = []
        """Each job's pods, by their index in `workload.pods`."""
        self.member_of: list[tuple[int, int]] = []
        """Each pod's job and its number in it."""
        for number, job in enumerate(jobs.jobs):
            first = len(self.member_of)
            self.members.append(range(first, first + job.size))
            self.member_of += [(number, member) for member in range(job.size)]
        self.timeline = JobTimeline(jobs.jobs, jobs.workload.gpu_capacity)
        self.job_samples: list[JobSample] = []

    def run_jobs(self) -> tuple[ChurnResult, dict[str, Any]]:
        """The run's churn result (its allocation over the jobs' full part) and the jobs' figures."""
        result = self.run()
        result = replace(result, workload=self.as_pods)
        shown = figures(result)
        end = self.plan.span
        jobs = self.timeline.figures(end, self.plan.patience)
        jobs["allocated"] = shown.allocated
        jobs["useful"] = mean_over(self.job_samples, shown.full_from, "running")
        jobs["partly_placed_mean"] = mean_over(self.job_samples, shown.full_from, "partly_placed")
        return result, jobs

    def _now(self) -> float:
        """Trace seconds since the start."""
        return (time.monotonic() - self.started) * self.plan.speed

    def _arrivals(self) -> None:
        plan = self.plan
        for number in range(len(self.jobs.jobs)):
            self.at(plan.arrival(number) / plan.speed, CREATE, number)
            self.at((plan.arrival(number) + plan.patience) / plan.speed, WITHDRAW, number)

    async def _act(self, session: Any, kind: int, index: int) -> None:
        """`index` is a job's for CREATE, DELETE and WITHDRAW, a sample's number otherwise."""
        if kind == CREATE:
            self.timeline.arrive(index, self._now())
            job = self.jobs.jobs[index]
            for pod in self.members[index]:
                body = self.wire.pod_object(self.workload.pods[pod], self.scheduler_name)
                self.created[pod] = time.monotonic()
                self._call(self._post(session, PODS, declare(body, job) if self.groups else body))
        elif kind == DELETE:
            self.timeline.finish(index, self._now())
            self._delete_pods(session, index)
        elif kind == WITHDRAW:
            if self.timeline.withdraw(index, self._now()):
                for pod in self.members[index]:
                    if pod not in self.gone:
                        self.tally.withdrawn[self.workload.pods[pod].kind] += 1
                self._delete_pods(session, index)
        else:
            self._sample(index)

    def _delete_pods(self, session: Any, job: int) -> None:
        for pod in self.members[job]:
            if pod in self.created and pod not in self.gone:
                self.gone.add(pod)
                self.running.pop(pod, None)
                self._call(self._delete(session, self.names[pod]))

    def _bound(self, index: int, pod: dict[str, Any]) -> None:
        if index in self.gone:  # its job was withdrawn as the bind came: it is deleted, as a cluster would
            return
        now = time.monotonic()
        self.bound.add(index)
        self.running[index] = pod
        trace_pod = self.workload.pods[index]
        wait = (now - self.created.get(index, now)) * self.plan.speed
        self.tally.bound(index, trace_pod, pod["spec"]["nodeName"], wait)
        job, member = self.member_of[index]
        if self.timeline.bind(job, member, self._now()) and trace_pod.lifetime != FOREVER:
            self.at(now - self.started + trace_pod.lifetime / self.plan.speed, DELETE, job)

    def _sample(self, number: int) -> None:
        super()._sample(number)
        self.timeline.advance(self._now())
        capacity = self.workload.gpu_capacity
        self.job_samples.append(
            JobSample(
                number * self.plan.span / SAMPLES,
                100 * self.timeline.running / capacity,
                100 * self.timeline.partial / capacity,
                self.timeline.partly_placed(),
            )
        )
