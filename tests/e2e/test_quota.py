"""End to end: quotas on what pods are given (`extender/core/quota/`), with the real kube-apiserver and
kube-scheduler v1.34.1 and a real `extender serve` process.

The API server must accept the keys (it validates every ResourceQuota); a burst into a quota must place exactly
what fits and leave the rest Pending with the reason in their events; deleting a pod must let a waiting one in
without waiting for kube-scheduler's five-minute flush; and killing the extender mid-burst must never let what a
namespace is given pass its limit. Every check of what is given is computed from the API's objects alone (each
bound pod's own limit, its node's model label), polled all along, never from the extender.

The module has its own extender and kube-scheduler (its own schedulerName), and four nodes, labelled with their
GPU model by GPU feature discovery's label, as the gpushare protocol reads models: two with 2 A100 GPUs of 16 GiB,
two with 1 T4 GPU of 16 GiB. No
controller runs here: a ResourceQuota's status stays empty, so kube-apiserver's own quota admission, which acts
on `status.hard` and counts only `requests.` keys, never refuses these pods: only the extender limits them.
"""

from __future__ import annotations

import asyncio
import hashlib
import signal
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.e2e.conftest import Remember
from tests.e2e.controlplane import EXTENDER_NAMESPACE, GPU_MEM, ApiError, ControlPlane, eventually
from tests.e2e.extender_process import ExtenderProcess, TLSFiles, serving_with_own_pod
from tests.e2e.scheduler import Scheduler, running_scheduler

pytestmark = pytest.mark.e2e

SCHEDULER_NAME = "gpu-e2e-quota"
NAMESPACE = "e2e-quota"
MODEL_LABEL = "nvidia.com/gpu.product"
MODELS = {"e2e-q-a100-0": "NVIDIA-A100-SXM4-40GB", "e2e-q-a100-1": "NVIDIA-A100-SXM4-40GB"} | {
    "e2e-q-t4-0": "Tesla-T4",
    "e2e-q-t4-1": "Tesla-T4",
}
NODES = tuple(MODELS)
SELF = "e2e-quota-extender"
"""The extender's own pod (no kubelet runs it), which it annotates to make kube-scheduler retry pods."""
FLAGS = ("--no-leader-elect", "--lease-namespace", EXTENDER_NAMESPACE, "--pod-name", SELF, "--expiry-interval", "1")
QUOTA = "gpus"
LIMIT, A100_LIMIT, SIZE = 56, 16, 8
"""The namespace's quota: 56 GiB of GPU memory, 16 of it on A100s; pods of 8 GiB. The T4s hold 4 of them, the
A100s 8, but their quota 2: exactly 6 fit, and the A100 limit is what stops the seventh (48 + 8 <= 56)."""
PLACED = 6
QUOTAS = f"/api/v1/namespaces/{NAMESPACE}/resourcequotas"
PODS = f"/api/v1/namespaces/{NAMESPACE}/pods"


@pytest.fixture(scope="module")
def cluster(control_plane: ControlPlane) -> Iterator[tuple[str, ...]]:
    """The namespace (never deleted: no controller would finish it) and the four labelled nodes."""
    control_plane.namespace_now(NAMESPACE)
    for name, model in MODELS.items():
        gpus = 2 if "A100" in model else 1
        control_plane.create_node_now(name, gpus=gpus, gpu_mem=16, labels={MODEL_LABEL: model})
    yield NODES
    for name in NODES:
        control_plane.request("DELETE", f"/api/v1/nodes/{name}")


@pytest.fixture(scope="module")
def extender(control_plane: ControlPlane, tls: TLSFiles, cluster: tuple[str, ...]) -> Iterator[ExtenderProcess]:
    process = ExtenderProcess("e2e-quota", control_plane.workdir, control_plane.kubeconfig("extender"), tls, FLAGS)
    with serving_with_own_pod(control_plane, process, SELF, cluster[0]) as serving:
        yield serving


@pytest.fixture(scope="module")
def scheduler(control_plane: ControlPlane, extender: ExtenderProcess) -> Iterator[Scheduler]:
    with running_scheduler(control_plane, extender, SCHEDULER_NAME) as running:
        yield running


@pytest.fixture
async def quota(control_plane: ControlPlane, extender: ExtenderProcess) -> AsyncIterator[None]:
    """ml's quota, seen by the extender before the test begins; deleted after the test's pods."""
    hard = {"limits.aliyun.com/gpu-mem": str(LIMIT), "limits.aliyun.com/gpu-mem.A100": str(A100_LIMIT)}
    await control_plane.api("POST", QUOTAS, {"metadata": {"name": QUOTA}, "spec": {"hard": hard}})

    async def seen() -> bool:
        return any(entry["name"] == QUOTA for entry in (await extender.inspect())["quotas"])

    try:
        await eventually(seen, what="the quota in the extender's /inspect")
        yield
    finally:
        await control_plane.delete(f"{QUOTAS}/{QUOTA}")


@pytest.fixture
async def pods(control_plane: ControlPlane, extender: ExtenderProcess, quota: None) -> AsyncIterator[list[str]]:
    """The names of the pods a test makes in the namespace: deleted after it, then the extender seen empty, and
    only then the quota."""
    names: list[str] = []
    yield names
    for name in names:
        try:
            await control_plane.delete(f"{PODS}/{name}")
        except ApiError as error:
            if error.status != 404:
                raise
    await eventually(lambda: extender_empty(extender), what="the extender seeing the quota test's pods gone")


# ---- what the API says -------------------------------------------------------------------------------------


@dataclass(slots=True)
class Given:
    """What the namespace's bound pods are given, from the API alone, and the most seen at any poll."""

    pods: list[dict[str, Any]] = field(default_factory=list)
    total: int = 0
    a100: int = 0

    @property
    def bound(self) -> list[dict[str, Any]]:
        return [pod for pod in self.pods if pod["spec"].get("nodeName")]

    @property
    def pending(self) -> list[dict[str, Any]]:
        return [pod for pod in self.pods if not pod["spec"].get("nodeName")]


async def given(control_plane: ControlPlane) -> Given:
    pods = list((await control_plane.api("GET", PODS))["items"])
    state = Given(pods)
    for pod in state.bound:
        if pod["metadata"].get("deletionTimestamp"):
            continue
        memory = sum(int(c["resources"]["limits"].get(GPU_MEM, 0)) for c in pod["spec"]["containers"])
        state.total += memory
        if MODELS.get(pod["spec"]["nodeName"], "").startswith("NVIDIA-A100"):
            state.a100 += memory
    return state


class Watcher:
    """Polls the API all along a test and keeps the most the namespace was ever given, in all and on A100s: a
    quota passed for one poll's time (a tenth of a second) would show."""

    def __init__(self, control_plane: ControlPlane) -> None:
        self.control_plane = control_plane
        self.most_total = self.most_a100 = 0
        self.worst: list[str] = []
        self.polls = 0
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            state = await given(self.control_plane)
            self.polls += 1
            if state.total > self.most_total or state.a100 > self.most_a100:
                self.worst = [f"{pod['metadata']['name']}@{pod['spec']['nodeName']}" for pod in state.bound]
            self.most_total = max(self.most_total, state.total)
            self.most_a100 = max(self.most_a100, state.a100)
            self.check()
            await asyncio.sleep(0.1)

    def check(self) -> None:
        assert self.most_total <= LIMIT and self.most_a100 <= A100_LIMIT, (
            f"{NAMESPACE} was given {self.most_total} GiB, {self.most_a100} on A100s: {', '.join(self.worst)}"
        )

    async def __aenter__(self) -> Watcher:
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        if self._task.done():
            self._task.result()  # its assertion, if it failed
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        self.check()


async def create_pods(control_plane: ControlPlane, prefix: str, count: int, names: list[str]) -> None:
    """`count` pods of SIZE GiB in the namespace, created at once (as a Job's controller would)."""

    async def create(number: int) -> None:
        name = f"{prefix}-{number:02d}"
        names.append(name)
        await control_plane.create_pod(name, gpu_mem=SIZE, namespace=NAMESPACE, scheduler_name=SCHEDULER_NAME)

    await asyncio.gather(*(create(number) for number in range(count)))


async def refused(control_plane: ControlPlane, pod: dict[str, Any]) -> list[str]:
    """The messages of the pod's FailedScheduling events."""
    listed = await control_plane.api("GET", f"/api/v1/namespaces/{NAMESPACE}/events")
    uid = pod["metadata"]["uid"]
    return [
        str(event.get("message"))
        for event in listed["items"]
        if event.get("reason") == "FailedScheduling" and (event.get("involvedObject") or {}).get("uid") == uid
    ]


async def settled(control_plane: ControlPlane, expected: int) -> Given | None:
    """The namespace's pods once `expected` are bound and every other one has been refused (None before)."""
    state = await given(control_plane)
    if len(state.bound) != expected or state.total != expected * SIZE:
        return None
    for pod in state.pending:
        conditions = (pod.get("status") or {}).get("conditions") or ()
        if not any(c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable" for c in conditions):
            return None
    return state


async def extender_empty(extender: ExtenderProcess) -> bool:
    report = await extender.inspect()
    return report["reservations"] == 0 and all(
        device["used"] == 0 for node in report["nodes"] if node["name"] in NODES for device in node["devices"]
    )


# ---- tests -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "accepted"),
    [
        ("limits.aliyun.com/gpu-mem", True),
        ("limits.aliyun.com/gpu-mem.A100", True),
        ("limits.aliyun.com/gpu-count.NVIDIA-A100-SXM4-40GB", True),
        ("limits.nvidia.com/gpumem", True),
        ("limits.nvidia.com/gpucores.H100", True),
        ("limits.nvidia.com/gpu.Tesla_T4", True),
        ("limits.nvidia.com/gpumem.NVIDIA A100", False),  # a space: not a qualified name
        ("limits.nvidia.com/gpumem." + "X" * 60, False),  # the name after "/" is at most 63 characters
    ],
    ids=["memory", "memory-A100", "gpus-full-label", "hami-memory", "hami-compute-H100", "hami-gpus-underscore",
         "space-refused", "too-long-refused"],
)  # fmt: skip
async def test_the_api_server_accepts_the_keys_a_quota_per_model_is_written_with(
    control_plane: ControlPlane, cluster: tuple[str, ...], cleanup: Remember, key: str, accepted: bool
) -> None:
    name = "keys-" + hashlib.sha256(key.encode()).hexdigest()[:12]
    body = {"metadata": {"name": name}, "spec": {"hard": {key: "4"}}}
    try:
        created = await control_plane.api("POST", QUOTAS, body)
    except ApiError as error:
        assert not accepted, error
        assert error.status == 422 and "spec.hard[" in error.message, error
        return
    cleanup(f"{QUOTAS}/{name}")
    assert accepted and created["spec"]["hard"] == {key: "4"}


async def test_a_burst_into_a_quota_places_exactly_what_fits_and_the_rest_wait_with_the_reason(
    control_plane: ControlPlane,
    extender: ExtenderProcess,
    scheduler: Scheduler,
    pods: list[str],
) -> None:
    """Ten pods of 8 GiB: four fill the T4s, two the A100 limit of 16 GiB, never more (polled all along); the
    other four wait, their events saying why. Then one of the six is deleted: a waiting pod takes its room,
    without waiting for kube-scheduler's five-minute flush of unschedulable pods (its own backoff, at most 10 s,
    is what it waits)."""
    started = time.monotonic()
    async with Watcher(control_plane) as watcher:
        await create_pods(control_plane, "burst", 10, pods)
        state = await eventually(lambda: settled(control_plane, PLACED), timeout=60, what="6 bound, 4 refused")
        placed_in = time.monotonic() - started
        reason = (
            f"namespace {NAMESPACE} uses 16 of its 16 GiB of A100 memory (ResourceQuota {QUOTA}); this pod needs 8 GiB"
        )
        for pod in state.pending:
            messages = await eventually(lambda pod=pod: refused(control_plane, pod), what="a FailedScheduling event")
            assert any(reason in message for message in messages), messages
        report = await extender.inspect()
        (shown,) = [entry for entry in report["quotas"] if entry["name"] == QUOTA]
        assert [(limit["key"], limit["used"]) for limit in shown["limits"]] == [
            ("limits.aliyun.com/gpu-mem", 48),
            ("limits.aliyun.com/gpu-mem.A100", 16),
        ]

        deleted = state.bound[0]["metadata"]["name"]
        deleting = time.monotonic()
        await control_plane.delete(f"{PODS}/{deleted}")
        pods.remove(deleted)
        after = await eventually(
            lambda: settled(control_plane, PLACED), timeout=30, what="a waiting pod placed in the deleted one's room"
        )
        replaced_in = time.monotonic() - deleting
        assert deleted not in {pod["metadata"]["name"] for pod in after.pods}
    metrics = await extender.metrics()
    assert (
        f'extender_quota_used{{model="A100",namespace="{NAMESPACE}",quota="{QUOTA}",resource="memory"}} 16.0' in metrics
    )
    print(
        f"\nquota burst: {PLACED} of 10 placed in {placed_in:.1f} s; a deleted pod's room taken {replaced_in:.1f} s "
        f"after; {watcher.polls} polls, never over {A100_LIMIT} GiB on A100s (most {watcher.most_a100})"
    )


async def test_a_burst_with_the_extender_killed_mid_way_never_passes_the_quota(
    control_plane: ControlPlane,
    extender: ExtenderProcess,
    scheduler: Scheduler,
    pods: list[str],
) -> None:
    """SIGKILL while binds are under way, more pods while it is down, a restart: the quota holds throughout,
    since every reservation is checked against it and the annotations in the Binding are the record it is
    rebuilt from."""
    async with Watcher(control_plane) as watcher:
        await create_pods(control_plane, "before", 8, pods)

        async def some_bound() -> bool:
            return len((await given(control_plane)).bound) >= 2

        await eventually(some_bound, interval=0.02, what="the first binds")
        try:
            assert extender.signal(signal.SIGKILL) == -signal.SIGKILL
            at_kill = len((await given(control_plane)).bound)
            await create_pods(control_plane, "after", 4, pods)
            await asyncio.sleep(1.0)  # kube-scheduler calls a dead extender meanwhile
        finally:
            extender.start()
            await asyncio.to_thread(extender.wait_until, 200)  # the watcher polls on meanwhile
        state = await eventually(lambda: settled(control_plane, PLACED), timeout=60, what="6 bound after the restart")
    print(
        f"\nkilled with {at_kill} of 8 bound; after the restart {len(state.bound)} bound, {len(state.pending)} "
        f"waiting; {watcher.polls} polls, never over {A100_LIMIT} GiB on A100s (most {watcher.most_a100})"
    )
