"""The gang replay through the real kube-scheduler: `real.py`'s run (control plane, the extender or a peer,
kube-scheduler, the pod watch, the end check from the API), one job at a time instead of one pod at a time.

For each job, in arrival order (`job_mix.py`): all its pods are created at once, as a job's controller creates
them (with their Kueue declaration, or without it for the run without groups); the next job comes once each of
them is decided: bound, or refused for good, in which case it is deleted (the fill-up drops what it cannot place,
as `make bench-placement` does). A job's pods bound stay bound, whether the job has them all or not: a job partly
placed holds its GPUs, as it would in a cluster, waiting for workers that do not come.

A refusal is not final when it says the pod waits for its job (`JOB_WAITS`): its job's other pods not yet seen by
the extender ("needs 4 pods to start": the watch brings them within moments, and the extender asks kube-scheduler
to try the pod again), or its planned node not among those kube-scheduler sent. Such a refusal is given
`real.RETRY_GRACE`, as a node's lock is; one that stands after it counts as the pod's refusal.

What each job ended with is read from the API's pods at the end (`job_report.tally`), beside the run's
`ReplayResult`.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.e2e_run import admin_session
from bench.placement.job_mix import JobWorkload, declare
from bench.placement.job_report import JobTally, tally
from bench.placement.outcome import Outcome, ReplayResult
from bench.placement.peers import Built
from bench.placement.real import RealReplay, Seen, refusal, unschedulable_reasons
from bench.placement.trace import GPUSHARE, NAMESPACE, Wire
from tests.e2e.deviceplugin import DevicePluginDouble

JOB_WAITS = re.compile(r"needs \d+ pods to start|for its job, not among the nodes sent|waits for the first \d+ pods")
"""The extender's refusals of a member that only waits for its job (extender/core/groups.py `Group.gang`,
extender/service/verbs.py, extender/core/jobs.py `_past_minimum`)."""
PROGRESS_EVERY = 100
"""Jobs between two progress lines."""
PODS = f"/api/v1/namespaces/{NAMESPACE}/pods"


def job_refusal(pod: dict[str, Any]) -> tuple[str, bool] | None:
    """`real.refusal`, with a member's wait for its job (`JOB_WAITS`) not final."""
    found = refusal(pod)
    if found is not None and found[1] and JOB_WAITS.search(found[0]):
        return found[0], False
    return found


class JobReplay(RealReplay):
    """One gang replay. Mutable: owns processes until `stop`; `run_jobs` once."""

    def __init__(
        self,
        binaries: Path,
        workdir: Path,
        jobs: JobWorkload,
        extender_flags: Sequence[str] = (),
        config_flags: Sequence[str] = (),
        scheduler_name: str = "gpu-scheduler",
        groups: bool = True,
        progress: Callable[[str], None] | None = None,
        peer: Built | None = None,
        wire: Wire = GPUSHARE,
    ) -> None:
        super().__init__(
            binaries, workdir, jobs.workload, extender_flags, config_flags, scheduler_name,
            progress=progress, peer=peer, wire=wire,
        )  # fmt: skip
        self.jobs = jobs
        self.groups = groups
        """Whether the pods carry their job's declaration."""

    def run_jobs(self) -> tuple[ReplayResult, JobTally]:
        return self._run(self._replay_jobs)

    async def _replay_jobs(self) -> tuple[ReplayResult, JobTally]:
        result = await self._replay()
        pods = (await self.plane.list_pods(NAMESPACE))["items"]
        return result, tally(self.jobs.jobs, pods, self.wire, self.workload.gpu_capacity)

    def _refusal(self, pod: dict[str, Any]) -> tuple[str, bool] | None:
        return job_refusal(pod)

    async def _one_at_a_time(
        self, seen: Seen, watcher: asyncio.Task[None], plugin: DevicePluginDouble | None
    ) -> list[Outcome]:
        """Each job's pods created together once the job before is decided (see the module's docstring)."""
        outcomes: list[Outcome] = []
        async with admin_session(self.plane) as session:
            for number, job in enumerate(self.jobs.jobs):
                names = []
                for member in job.members:
                    body = self.wire.pod_object(member, self.scheduler_name)
                    if self.groups:
                        body = declare(body, job)
                    names.append(body["metadata"]["name"])
                    await self._post(session, PODS, body)
                for name in names:
                    decided = lambda n=name: n in seen.bound or n in seen.refused  # noqa: E731
                    await self._until(seen, watcher, decided, f"pod {name} of job {job.name}: a decision")
                    if name not in seen.bound and name in seen.retried:
                        await self._retry(seen, watcher, name)
                refused = []
                for member, name in zip(job.members, names, strict=True):
                    if name in seen.bound:
                        outcomes.append(Outcome(member, seen.bound[name]))
                        if plugin is not None and member.gpus:
                            await self._admitted(plugin, seen, watcher, name)
                    else:
                        outcomes.append(Outcome(member, "", unschedulable_reasons(seen.refused[name])))
                        await self._delete(session, name)
                        refused.append(name)
                gone = lambda r=tuple(refused): all(n in seen.deleted for n in r)  # noqa: E731
                await self._until(seen, watcher, gone, f"job {job.name}: its refused pods' deletion")
                if number % PROGRESS_EVERY == 0:
                    bound = sum(1 for outcome in outcomes if outcome.node)
                    self.progress(
                        f"{number:,} of {len(self.jobs.jobs):,} jobs decided, {bound:,} of {len(outcomes):,} pods bound"
                    )
        return outcomes
