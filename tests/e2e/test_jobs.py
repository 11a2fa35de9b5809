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

The same for jobs declared by scheduler-plugins' coscheduling PodGroups, with their CRD installed
(`scheduling.x-k8s.io/v1alpha1`, `podgroups`, namespaced; its schema keeps every field, as the extender reads only
`metadata` and `spec.minMember`) and pods naming theirs by the label `scheduling.x-k8s.io/pod-group`, as
scheduler-plugins v0.31.8 reads it; no coscheduling plugin or controller runs. A PodGroup's minimum is the job's
size: with 2 of its minimum of 3 pods created, neither binds, and kube-scheduler's message says why; the PodGroup
lowered to 2 (news kube-scheduler does not watch), the extender asks kube-scheduler to retry and both bind; a
second job of 3 that does not fit beside them waits whole, never bound in part, and is placed whole once room
comes.

The module has its own extender (with its own pod, which it annotates to ask kube-scheduler for retries) and
kube-scheduler (its own schedulerName), and its own namespace and nodes. The CRD is created before the extender
starts (so its first list finds it) and deleted at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
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
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
CRD_NAME = "podgroups.scheduling.x-k8s.io"
PODGROUPS = f"/apis/scheduling.x-k8s.io/v1alpha1/namespaces/{NAMESPACE}/podgroups"
POD_GROUP_LABEL = "scheduling.x-k8s.io/pod-group"


CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": CRD_NAME},
    "spec": {
        "group": "scheduling.x-k8s.io",
        "scope": "Namespaced",
        "names": {"plural": "podgroups", "singular": "podgroup", "kind": "PodGroup", "shortNames": ["pg", "pgs"]},
        "versions": [
            {
                "name": "v1alpha1",
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
            }
        ],
    },
}
"""scheduler-plugins' PodGroup CRD as far as the extender reads it: its group, version, kind and scope are the
project's (config/crd/bases/scheduling.x-k8s.io_podgroups.yaml at v0.31.8); its schema keeps every field."""


@pytest.fixture(scope="module")
def podgroup_crd(control_plane: ControlPlane) -> Iterator[None]:
    control_plane.request("POST", CRDS, CRD)
    deadline = time.monotonic() + 30
    while True:
        conditions = (control_plane.request("GET", f"{CRDS}/{CRD_NAME}").get("status") or {}).get("conditions") or ()
        if any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions):
            break
        assert time.monotonic() < deadline, "the PodGroup CRD not established after 30 s"
        time.sleep(0.2)
    yield
    control_plane.request("DELETE", f"{CRDS}/{CRD_NAME}")


@pytest.fixture(scope="module")
def cluster(control_plane: ControlPlane, podgroup_crd: None) -> Iterator[tuple[str, ...]]:
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
    """Pod `number` of Kueue plain-pod group `job` of `SIZE` pods."""
    labels = {"kueue.x-k8s.io/pod-group-name": job}
    return gpu_pod(f"{job}-{number}", labels, {"kueue.x-k8s.io/pod-group-total-count": str(SIZE)})


def podgroup_member(group: str, number: int) -> dict[str, Any]:
    """Pod `number` of coscheduling PodGroup `group`."""
    return gpu_pod(f"{group}-{number}", {POD_GROUP_LABEL: group}, {})


def gpu_pod(name: str, labels: dict[str, str], annotations: dict[str, str]) -> dict[str, Any]:
    """A pod of this module's scheduler asking one whole 16 GiB GPU."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": labels, "annotations": annotations},
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
        job = pod["metadata"].get("labels", {}).get("kueue.x-k8s.io/pod-group-name")
        if job in found and pod["spec"].get("nodeName") and not pod["metadata"].get("deletionTimestamp"):
            found[job].append(pod["metadata"]["name"])
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


async def nothing_held(extender: ExtenderProcess) -> None:
    report = await extender.inspect()
    assert report["reservations"] == 0, "every hold taken by its bind and shown bound by the API"


async def deleted(control_plane: ControlPlane, paths: list[str]) -> None:
    """Each object deleted, those already gone passed over."""
    for path in paths:
        with contextlib.suppress(ApiError):
            await control_plane.delete(path)


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
        await nothing_held(extender)
    finally:
        await deleted(control_plane, [f"{PODS}/{name}" for name in created])


def podgroup(name: str, minimum: int) -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"minMember": minimum},
    }


async def bound_of(control_plane: ControlPlane, group: str, label: str = POD_GROUP_LABEL) -> list[str]:
    """The names of the group's pods bound (those labelled `label`=`group`), from the API."""
    pods = (await control_plane.api("GET", f"{PODS}?labelSelector={label}%3D{group}"))["items"]
    return sorted(
        pod["metadata"]["name"]
        for pod in pods
        if pod["spec"].get("nodeName") and not pod["metadata"].get("deletionTimestamp")
    )


async def test_a_podgroups_minimum_is_its_jobs_size_and_a_job_that_does_not_fit_waits_whole(
    control_plane: ControlPlane, scheduler: Scheduler, extender: ExtenderProcess
) -> None:
    created: list[str] = []
    try:
        await control_plane.api("POST", PODGROUPS, podgroup("train", 3))
        for number in range(2):
            await control_plane.api("POST", PODS, podgroup_member("train", number))
            created.append(f"train-{number}")

        async def short() -> list[str]:
            found = await unschedulable(control_plane, created)
            return found if len(found) == 2 else []

        said = await eventually(short, timeout=60, what="train's two pods refused for want of a third")
        # "1 exist" for a pod refused before the second was created: nothing retries it until the job can start
        assert all(f"job {NAMESPACE}/train needs 3 pods to start; " in message for message in said), said
        assert await bound_of(control_plane, "train") == []

        # The minimum lowered: kube-scheduler watches no PodGroup, the extender asks it to retry.
        await control_plane.api("PATCH", f"{PODGROUPS}/train", {"spec": {"minMember": 2}})

        async def train_bound() -> bool:
            return await bound_of(control_plane, "train") == ["train-0", "train-1"]

        await eventually(train_bound, timeout=60, what="train placed once its PodGroup asks 2")

        # Two GPUs left of four; a job of 3 waits whole, and is never placed in part meanwhile.
        await control_plane.api("POST", PODGROUPS, podgroup("big", 3))
        waiting = [f"big-{number}" for number in range(3)]
        for name in waiting:
            await control_plane.api("POST", PODS, podgroup_member("big", int(name[-1])))
            created.append(name)

        async def big_refused() -> list[str]:
            assert await bound_of(control_plane, "big") == [], "a pod of the job that does not fit was bound"
            found = await unschedulable(control_plane, waiting)
            return found if len(found) == 3 else []

        said = await eventually(big_refused, timeout=60, what="big's pods refused whole")
        assert any(f"job {NAMESPACE}/big needs 3 pods of 1 GPU with 16 GiB; 2 fit now" in message for message in said)
        for _ in range(30):  # retries come and go: still nothing of big bound
            assert await bound_of(control_plane, "big") == []
            await asyncio.sleep(0.1)

        for number in range(2):
            await control_plane.delete(f"{PODS}/train-{number}")

        async def big_bound() -> bool:
            return await bound_of(control_plane, "big") == waiting

        await eventually(big_bound, timeout=60, what="big placed whole once train is gone")
        await nothing_held(extender)
    finally:
        paths = [f"{PODS}/{name}" for name in created] + [f"{PODGROUPS}/{name}" for name in ("train", "big")]
        await deleted(control_plane, paths)


async def test_a_job_half_bound_when_the_extender_restarts_is_held_again_from_what_its_binds_wrote(
    control_plane: ControlPlane, scheduler: Scheduler, extender: ExtenderProcess
) -> None:
    """Job r's third pod asks a node label no node has yet, so kube-scheduler's own filters keep it pending: the job
    is planned whole at r-0's or r-1's filter (r-2's GPU held on the node planned for it), those two bind, and r-2
    waits. The extender restarts (a new process: what it held in memory is gone). Two pods asking a whole GPU each
    come, for the two GPUs left, one of them r-2's: held again from what r-0's and r-1's binds wrote on their pods,
    it goes to neither, and only one of them binds. The nodes labelled, r-2 binds, its job whole."""
    label = "e2e-jobs/later"
    kueue = "kueue.x-k8s.io/pod-group-name"
    created: list[str] = []
    try:
        for number in range(SIZE):
            pod = member("r", number)
            if number == SIZE - 1:
                pod["spec"]["nodeSelector"] = {label: "yes"}
            await control_plane.api("POST", PODS, pod)
            created.append(pod["metadata"]["name"])

        async def two_bound() -> bool:
            return await bound_of(control_plane, "r", kueue) == ["r-0", "r-1"]

        await eventually(two_bound, timeout=60, what="r-0 and r-1 bound, r-2 kept pending by its node selector")
        assert (await extender.inspect())["reservations"] == 1, "r-2's GPU held for it"

        extender.stop()
        extender.start()
        await asyncio.to_thread(extender.wait_until, 200)
        for name in ("x-0", "x-1"):
            await control_plane.api("POST", PODS, gpu_pod(name, {"e2e-jobs/other": "x"}, {}))
            created.append(name)

        async def one_refused() -> list[str]:
            return await unschedulable(control_plane, ["x-0", "x-1"])

        await eventually(one_refused, timeout=60, what="one of x-0 and x-1 refused")
        await asyncio.sleep(2)  # retries come and go: r-2's GPU stays r-2's
        assert len(await bound_of(control_plane, "x", "e2e-jobs/other")) == 1

        for node in NODES:
            await control_plane.api("PATCH", f"/api/v1/nodes/{node}", {"metadata": {"labels": {label: "yes"}}})

        async def whole() -> bool:
            return await bound_of(control_plane, "r", kueue) == ["r-0", "r-1", "r-2"]

        await eventually(whole, timeout=60, what="r-2 bound once a node has its label")
        await nothing_held(extender)
    finally:
        for node in NODES:
            with contextlib.suppress(ApiError):
                await control_plane.api("PATCH", f"/api/v1/nodes/{node}", {"metadata": {"labels": {label: None}}})
        await deleted(control_plane, [f"{PODS}/{name}" for name in created])
