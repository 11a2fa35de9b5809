"""End to end: jobs declared by scheduler-plugins' coscheduling PodGroups (`extender/core/groups.py`), with the
real kube-apiserver and kube-scheduler v1.34.1, a real `extender serve` process, and the PodGroup CRD installed.

No coscheduling plugin or controller runs here: the cluster has the CRD (`scheduling.x-k8s.io/v1alpha1`,
`podgroups`, namespaced; the schema keeps every field, as the extender reads only `metadata` and
`spec.minMember`), PodGroups created by the test, and pods naming theirs by the label
`scheduling.x-k8s.io/pod-group`, as scheduler-plugins v0.31.8 reads it. What is judged, from the API:

- a PodGroup's minimum is the job's size: with 2 of its minimum of 3 pods created, neither binds, and
  kube-scheduler's message says why ("job NS/train needs 3 pods to start; 2 exist, 0 bound"); the PodGroup
  lowered to 2 (news kube-scheduler does not watch), the extender asks kube-scheduler to retry and both bind;
- a second job of 3 that does not fit beside the first waits whole, none of its pods bound at any poll, with the
  reason; once the first job's pods are gone, it is placed whole.

The CRD is created before the module's extender starts (so its first list finds it) and deleted at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.controlplane import EXTENDER_NAMESPACE, GPU_MEM, ApiError, ControlPlane, eventually
from tests.e2e.extender_process import ExtenderProcess, TLSFiles, serving_with_own_pod
from tests.e2e.scheduler import Scheduler, running_scheduler

pytestmark = pytest.mark.e2e

SCHEDULER_NAME = "gpu-e2e-podgroups"
NAMESPACE = "e2e-podgroups"
NODES = ("e2e-pg-0", "e2e-pg-1")
SELF = "e2e-podgroups-extender"
FLAGS = ("--no-leader-elect", "--lease-namespace", EXTENDER_NAMESPACE, "--pod-name", SELF, "--expiry-interval", "1")
PODS = f"/api/v1/namespaces/{NAMESPACE}/pods"
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
CRD_NAME = "podgroups.scheduling.x-k8s.io"
PODGROUPS = f"/apis/scheduling.x-k8s.io/v1alpha1/namespaces/{NAMESPACE}/podgroups"
LABEL = "scheduling.x-k8s.io/pod-group"

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
    process = ExtenderProcess("e2e-podgroups", control_plane.workdir, control_plane.kubeconfig("extender"), tls, FLAGS)
    with serving_with_own_pod(control_plane, process, SELF, cluster[0]) as serving:
        yield serving


@pytest.fixture(scope="module")
def scheduler(control_plane: ControlPlane, extender: ExtenderProcess) -> Iterator[Scheduler]:
    with running_scheduler(control_plane, extender, SCHEDULER_NAME) as running:
        yield running


def podgroup(name: str, minimum: int) -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"minMember": minimum},
    }


def member(group: str, number: int) -> dict[str, Any]:
    """Pod `number` of PodGroup `group`, asking one whole 16 GiB GPU."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"{group}-{number}", "namespace": NAMESPACE, "labels": {LABEL: group}},
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


async def bound_of(control_plane: ControlPlane, group: str) -> list[str]:
    """The names of the group's pods bound, from the API."""
    pods = (await control_plane.api("GET", f"{PODS}?labelSelector={LABEL}%3D{group}"))["items"]
    return sorted(
        pod["metadata"]["name"]
        for pod in pods
        if pod["spec"].get("nodeName") and not pod["metadata"].get("deletionTimestamp")
    )


async def refusals(control_plane: ControlPlane, names: list[str]) -> list[str]:
    """kube-scheduler's message for each named pod it could not place (none for a pod not refused yet)."""
    found = []
    for name in names:
        pod = await control_plane.api("GET", f"{PODS}/{name}")
        for condition in (pod.get("status") or {}).get("conditions") or ():
            if condition.get("type") == "PodScheduled" and condition.get("reason") == "Unschedulable":
                found.append(str(condition.get("message")))
    return found


async def test_a_podgroups_minimum_is_its_jobs_size_and_a_job_that_does_not_fit_waits_whole(
    control_plane: ControlPlane, scheduler: Scheduler, extender: ExtenderProcess
) -> None:
    created: list[str] = []
    try:
        await control_plane.api("POST", PODGROUPS, podgroup("train", 3))
        for number in range(2):
            await control_plane.api("POST", PODS, member("train", number))
            created.append(f"train-{number}")

        async def short() -> list[str]:
            found = await refusals(control_plane, created)
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
            await control_plane.api("POST", PODS, member("big", int(name[-1])))
            created.append(name)

        async def big_refused() -> list[str]:
            assert await bound_of(control_plane, "big") == [], "a pod of the job that does not fit was bound"
            found = await refusals(control_plane, waiting)
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
        report = await extender.inspect()
        assert report["reservations"] == 0, "every hold taken by its bind and shown bound by the API"
    finally:
        for name in created:
            with contextlib.suppress(ApiError):
                await control_plane.delete(f"{PODS}/{name}")
        for name in ("train", "big"):
            with contextlib.suppress(ApiError):
                await control_plane.delete(f"{PODGROUPS}/{name}")
