"""End to end: jobs placed whole (`extender/core/jobs.py`), with the real kube-apiserver and kube-scheduler v1.34.1
and a real `extender serve` process.

Two jobs of three pods, Kueue's plain-pod groups (the label `kueue.x-k8s.io/pod-group-name` and the annotation
`kueue.x-k8s.io/pod-group-total-count`, as Kueue v0.17.0's pod webhook requires them; no Kueue runs here: the
pods are created ungated, as Kueue leaves them once it admits the job), each pod asking a whole GPU of 16 GiB,
created interleaved (a-0, b-0, a-1, ...) on two nodes of two such GPUs: four GPUs, six asked. Placed pod by pod,
they would split the GPUs between the jobs and neither could start. Judged from the API alone, polled all along:
at no poll does the job that waits have a pod bound, at the end one job has all three pods bound and the other
none; once the first job's pods are deleted, the second is placed whole (judged at the end: it may fit, and bind,
before the first's last pod is gone).

The module has its own extender (with its own pod, which it annotates to ask kube-scheduler for retries) and
kube-scheduler (its own schedulerName), and its own namespace and nodes.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from tests.e2e.controlplane import EXTENDER_NAMESPACE, GPU_MEM, ApiError, ControlPlane, eventually
from tests.e2e.extender_process import ExtenderProcess, TLSFiles, serving_with_own_pod
from tests.e2e.scheduler import Scheduler, running_scheduler

pytestmark = pytest.mark.e2e

SCHEDULER_NAME = "gpu-e2e-jobs"
NAMESPACE = "e2e-jobs"
NODES = ("e2e-j-0", "e2e-j-1")
SELF = "e2e-jobs-extender"
FLAGS = ("--no-leader-elect", "--lease-namespace", EXTENDER_NAMESPACE, "--pod-name", SELF, "--expiry-interval", "1")
PODS = f"/api/v1/namespaces/{NAMESPACE}/pods"
SIZE = 3
JOBS = ("a", "b")


@pytest.fixture(scope="module")
def cluster(control_plane: ControlPlane) -> Iterator[tuple[str, ...]]:
    control_plane.namespace_now(NAMESPACE)
    for name in NODES:
        control_plane.create_node_now(name, gpus=2, gpu_mem=16)
    yield NODES
    for name in NODES:
        control_plane.request("DELETE", f"/api/v1/nodes/{name}")


@pytest.fixture(scope="module")
def extender(control_plane: ControlPlane, tls: TLSFiles, cluster: tuple[str, ...]) -> Iterator[ExtenderProcess]:
    process = ExtenderProcess("e2e-jobs", control_plane.workdir, control_plane.kubeconfig("extender"), tls, FLAGS)
    with serving_with_own_pod(control_plane, process, SELF, cluster[0]) as serving:
        yield serving


@pytest.fixture(scope="module")
def scheduler(control_plane: ControlPlane, extender: ExtenderProcess) -> Iterator[Scheduler]:
    with running_scheduler(control_plane, extender, SCHEDULER_NAME) as running:
        yield running


def member(job: str, number: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{job}-{number}",
            "namespace": NAMESPACE,
            "labels": {"kueue.x-k8s.io/pod-group-name": job},
            "annotations": {"kueue.x-k8s.io/pod-group-total-count": str(SIZE)},
        },
        "spec": {
            "schedulerName": SCHEDULER_NAME,
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "main",
                    "image": "registry.example/none:latest",
                    "resources": {"limits": {GPU_MEM: "16"}, "requests": {"cpu": "10m"}},
                }
            ],
        },
    }


async def bound_by_job(control_plane: ControlPlane) -> dict[str, list[str]]:
    """Job -> the names of its pods bound, from the API."""
    pods = (await control_plane.api("GET", PODS))["items"]
    found: dict[str, list[str]] = {job: [] for job in JOBS}
    for pod in pods:
        if pod["spec"].get("nodeName") and not pod["metadata"].get("deletionTimestamp"):
            found[pod["metadata"]["labels"]["kueue.x-k8s.io/pod-group-name"]].append(pod["metadata"]["name"])
    return found


class Partial:
    """Polls the API all along and remembers every time two jobs both had pods bound (with 4 GPUs for 6 pods, a
    job in part beside the other's)."""

    def __init__(self, control_plane: ControlPlane) -> None:
        self.control_plane = control_plane
        self.seen: list[dict[str, list[str]]] = []
        self.polls = 0

    async def run(self) -> None:
        while True:
            bound = await bound_by_job(self.control_plane)
            self.polls += 1
            if all(bound.values()):
                self.seen.append(bound)
            await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def watching(control_plane: ControlPlane) -> AsyncIterator[Partial]:
    partial = Partial(control_plane)
    task = asyncio.create_task(partial.run())
    try:
        yield partial
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def unschedulable(control_plane: ControlPlane, names: list[str]) -> list[str]:
    """The reasons kube-scheduler gave for each named pod it could not place (empty for a pod not refused yet)."""
    reasons = []
    for name in names:
        pod = await control_plane.api("GET", f"{PODS}/{name}")
        conditions = (pod.get("status") or {}).get("conditions") or ()
        reasons += [
            str(c.get("message"))
            for c in conditions
            if c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable"
        ]
    return reasons


async def test_two_jobs_that_do_not_both_fit_arriving_interleaved_one_runs_whole_the_other_waits_whole(
    control_plane: ControlPlane, scheduler: Scheduler, extender: ExtenderProcess
) -> None:
    created: list[str] = []
    try:
        async with watching(control_plane) as partial:
            for number in range(SIZE):
                for job in JOBS:
                    await control_plane.api("POST", PODS, member(job, number))
                    created.append(f"{job}-{number}")

            async def one_whole() -> dict[str, list[str]] | None:
                bound = await bound_by_job(control_plane)
                counts = sorted(len(names) for names in bound.values())
                return bound if counts == [0, SIZE] else None

            bound = await eventually(one_whole, timeout=60, what="one job bound whole, the other not at all")
            first = next(job for job in JOBS if bound[job])
            second = next(job for job in JOBS if job != first)
            waiting = [f"{second}-{number}" for number in range(SIZE)]

            async def refused() -> list[str]:
                reasons = await unschedulable(control_plane, waiting)
                return reasons if len(reasons) == SIZE else []

            reasons = await eventually(refused, timeout=60, what=f"job {second}'s pods refused")
            assert any(f"job {NAMESPACE}/{second} needs 3 pods of 1 GPU with 16 GiB; 1 fit now" in r for r in reasons)
            await asyncio.sleep(3)  # retries come and go meanwhile: still one job whole, the other waiting whole
            assert sorted(len(names) for names in (await bound_by_job(control_plane)).values()) == [0, SIZE]
        assert not partial.seen, f"both jobs had pods bound at once: {partial.seen[:3]}"
        assert partial.polls > 10

        # The first job's pods deleted one by one: once two are gone the second fits, and is placed (whole) while
        # the first's last pod may still be there; so from here only the end is judged.
        for number in range(SIZE):
            await control_plane.delete(f"{PODS}/{first}-{number}")

        async def second_whole() -> bool:
            bound = await bound_by_job(control_plane)
            return len(bound[second]) == SIZE and not bound[first]

        await eventually(second_whole, timeout=60, what=f"job {second} placed whole once {first} is gone")
        report = await extender.inspect()
        assert report["reservations"] == 0, "every hold taken by its bind and shown bound by the API"
    finally:
        for name in created:
            with contextlib.suppress(ApiError):
                await control_plane.delete(f"{PODS}/{name}")
