"""End to end: a real kube-scheduler v1.34.1 calls our extender (a real `extender serve` process, HTTPS with
mutual TLS) for every GPU pod, and the extender binds through a real kube-apiserver.

Every check of where memory went is computed from the API's Pod objects alone (each pod's own limit, summed
per node and GPU index from the annotations), never from the extender; the extender's `/inspect` is then
compared with that. The invariants (no GPU over capacity, no GPU pod bound without our annotations) are
checked on every poll while a burst is being placed, not only at the end.

The module shares one extender, one kube-scheduler (its own schedulerName, so no other test's scheduler can
place these pods) and four nodes of 2 GPUs x 16 GiB. Each test deletes its pods and waits until the extender
has seen them go, so the next one starts from empty GPUs.
"""

from __future__ import annotations

import asyncio
import re
import signal
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import aiohttp
import pytest

from tests.e2e.controlplane import EXTENDER_NAMESPACE, GPU_MEM, ApiError, ControlPlane, eventually
from tests.e2e.extender_process import ExtenderProcess, TLSFiles, assert_agrees, serving_with_own_pod
from tests.e2e.scheduler import Scheduler, running_scheduler

pytestmark = pytest.mark.e2e

SCHEDULER_NAME = "gpu-e2e-scheduler"
NOBODY = "e2e-nobody"
"""A schedulerName no running scheduler owns: pods the tests bind through the extender by hand."""
NODES = tuple(f"e2e-gpu-{number}" for number in range(4))
GPUS, GPU_MEMORY = 2, 16

IDX = "ALIYUN_COM_GPU_MEM_IDX"
POD_MEM = "ALIYUN_COM_GPU_MEM_POD"
DEV_MEM = "ALIYUN_COM_GPU_MEM_DEV"
ASSUME_TIME = "ALIYUN_COM_GPU_MEM_ASSUME_TIME"
NODE_ANNOTATION = "gpu-extender.io/node"
INDEXES = "gpu-extender.io/device-indexes"
TEST_LABEL = "e2e-test"

LEASE = ("--lease-duration", "3", "--renew-deadline", "2", "--retry-period", "0.5")
"""Short lease timings, for the failover test alone: it times a takeover after the leader is killed."""
SELF = "e2e-extender-self"
"""The main extender's own pod, as a Deployment's pod would be (no kubelet runs it): it labels it while it
leads, and annotates it to make kube-scheduler retry the pods it refused."""
EXTENDER_FLAGS = (
    "--lease-namespace", EXTENDER_NAMESPACE, "--reservation-ttl", "10", "--expiry-interval", "1",
    "--pod-name", SELF,
)  # fmt: skip
"""With the production lease timings (15 s, 10 s, 2 s): a restart takes its lease back at once (the same
--identity), and a busy machine's slowdowns stay far inside them."""

BURST_SIZES = [2, 4, 6, 8, 10, 12] * 4
"""24 pods of 2..12 GiB asking 168 GiB of the 128 there are."""
NEVER_FITS = 20
"""More than any GPU has: unresolvable on every node, whatever is free."""
SETTLE_TIMEOUT = 60.0

Key = tuple[str, int]
"""(node, GPU index)."""


# ---- fixtures --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gpu_nodes(control_plane: ControlPlane) -> Iterator[tuple[str, ...]]:
    for name in NODES:
        control_plane.create_node_now(name, gpus=GPUS, gpu_mem=GPU_MEMORY)
    yield NODES
    for name in NODES:
        control_plane.request("DELETE", f"/api/v1/nodes/{name}")


def start_extender(control_plane: ControlPlane, tls: TLSFiles, name: str, *flags: str) -> ExtenderProcess:
    process = ExtenderProcess(name, control_plane.workdir, control_plane.kubeconfig("extender"), tls, flags)
    process.start()
    return process


@pytest.fixture(scope="module")
def extender(control_plane: ControlPlane, tls: TLSFiles, gpu_nodes: tuple[str, ...]) -> Iterator[ExtenderProcess]:
    process = ExtenderProcess(
        "e2e-main", control_plane.workdir, control_plane.kubeconfig("extender"), tls, EXTENDER_FLAGS
    )
    with serving_with_own_pod(control_plane, process, SELF, gpu_nodes[0]) as serving:
        yield serving


@pytest.fixture(scope="module")
def scheduler(control_plane: ControlPlane, extender: ExtenderProcess) -> Iterator[Scheduler]:
    with running_scheduler(control_plane, extender, SCHEDULER_NAME) as running:
        yield running


@dataclass(slots=True)
class Workload:
    """The pods one test makes (labelled with its name), all deleted after it."""

    control_plane: ControlPlane
    test: str
    names: list[str] = field(default_factory=list)

    async def create(
        self, name: str, gpu_mem: int, scheduler_name: str = SCHEDULER_NAME, priority_class: str | None = None
    ) -> dict[str, Any]:
        self.names.append(name)
        return await self.control_plane.create_pod(
            name,
            gpu_mem=gpu_mem,
            scheduler_name=scheduler_name,
            labels={TEST_LABEL: self.test},
            priority_class=priority_class,
        )

    async def burst(self, prefix: str, sizes: tuple[int, ...] | list[int]) -> None:
        """Create these pods at once (concurrent requests, as a Job's controller would)."""
        await asyncio.gather(*(self.create(f"{prefix}-{number:02d}", size) for number, size in enumerate(sizes)))

    async def pods(self) -> list[dict[str, Any]]:
        listed = await self.control_plane.api(
            "GET", f"/api/v1/namespaces/default/pods?labelSelector={TEST_LABEL}%3D{self.test}"
        )
        return list(listed["items"])

    async def delete(self, name: str) -> None:
        """Delete one of the pods (at once, grace period 0); it is no longer one of the workload's."""
        try:
            await self.control_plane.delete(f"/api/v1/namespaces/default/pods/{name}")
        except ApiError as error:
            if error.status != 404:
                raise
        if name in self.names:
            self.names.remove(name)


@pytest.fixture
async def workload(control_plane: ControlPlane, request: pytest.FixtureRequest) -> AsyncIterator[Workload]:
    test = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[-60:].strip("-")
    made = Workload(control_plane, test)
    yield made
    await asyncio.gather(*(made.delete(name) for name in list(made.names)))
    await eventually(lambda: _none_left(made), what="the test's pods deleted")
    if "extender" in request.fixturenames:
        process: ExtenderProcess = request.getfixturevalue("extender")
        if process.running():
            await eventually(lambda: _extender_empty(process), what=f"extender {process.name} seeing the GPUs empty")


async def _none_left(workload: Workload) -> bool:
    return not await workload.pods()


async def _extender_empty(process: ExtenderProcess) -> bool:
    report = await process.inspect()
    return report["reservations"] == 0 and all(
        device["used"] == 0 for node in report["nodes"] if node["name"] in NODES for device in node["devices"]
    )


# ---- waiting ---------------------------------------------------------------------------------------------


# ---- what the API says -------------------------------------------------------------------------------------


def demand(pod: dict[str, Any]) -> int:
    """The pod's GPU memory, from its own spec (never from our annotations)."""
    return sum(
        int((container.get("resources") or {}).get("limits", {}).get(GPU_MEM, 0))
        for container in pod["spec"]["containers"]
    )


def key_of(pod: dict[str, Any]) -> str:
    return f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"


@dataclass(frozen=True, slots=True)
class Placement:
    """Where GPU memory is, from the API's pods alone: per (node, GPU) the memory and pods of the bound ones."""

    pods: list[dict[str, Any]]
    used: dict[Key, int]
    holders: dict[Key, set[str]]
    problems: list[str]

    @property
    def bound(self) -> list[dict[str, Any]]:
        return [pod for pod in self.pods if pod["spec"].get("nodeName")]

    @property
    def pending(self) -> list[dict[str, Any]]:
        return [pod for pod in self.pods if not pod["spec"].get("nodeName")]

    def free(self, key: Key) -> int:
        return GPU_MEMORY - self.used.get(key, 0)

    def largest_free(self) -> int:
        return max(self.free((node, index)) for node in NODES for index in range(GPUS))


def placement(pods: list[dict[str, Any]]) -> Placement:
    """Sum the memory of bound GPU pods per (node, GPU), checking each one's annotations on the way."""
    used: dict[Key, int] = {}
    holders: dict[Key, set[str]] = {}
    problems: list[str] = []
    for pod in pods:
        node, memory = pod["spec"].get("nodeName"), demand(pod)
        if not node or not memory or pod["metadata"].get("deletionTimestamp"):
            continue
        annotations = pod["metadata"].get("annotations") or {}
        missing = [name for name in (IDX, POD_MEM, DEV_MEM, ASSUME_TIME, NODE_ANNOTATION) if name not in annotations]
        if missing:
            problems.append(f"{key_of(pod)} bound to {node} without {', '.join(missing)}: {annotations}")
            continue
        if annotations[NODE_ANNOTATION] != node:
            problems.append(f"{key_of(pod)} bound to {node} but annotated for {annotations[NODE_ANNOTATION]}")
        if annotations[POD_MEM] != str(memory) or annotations[DEV_MEM] != str(GPU_MEMORY):
            problems.append(f"{key_of(pod)} asks {memory} GiB but is annotated {annotations}")
        if annotations.get(INDEXES, annotations[IDX]) != annotations[IDX]:
            problems.append(f"{key_of(pod)}: {IDX} and {INDEXES} disagree: {annotations}")
        if not annotations[ASSUME_TIME].isdigit() or int(annotations[ASSUME_TIME]) < 1_600_000_000 * 10**9:
            problems.append(f"{key_of(pod)}: {ASSUME_TIME} is not Unix nanoseconds: {annotations[ASSUME_TIME]}")
        index = int(annotations[IDX])
        if not 0 <= index < GPUS:
            problems.append(f"{key_of(pod)} on GPU {index}, which {node} does not have")
        key = (node, index)
        used[key] = used.get(key, 0) + memory
        holders.setdefault(key, set()).add(key_of(pod))
    for (node, index), memory in sorted(used.items()):
        if memory > GPU_MEMORY:
            problems.append(f"{node} GPU {index} holds {memory} GiB of {GPU_MEMORY}: {sorted(holders[node, index])}")
    return Placement(pods, used, holders, problems)


async def api_placement(control_plane: ControlPlane) -> Placement:
    """Every pod in the cluster (other tests' pods count against GPUs too), placed from the API."""
    return placement(list((await control_plane.list_pods())["items"]))


def describe(state: Placement, workload: Workload) -> str:
    """Pod states and per-GPU fill, for failure messages."""
    lines = ["pods:"]
    for pod in sorted(state.pods, key=key_of):
        if pod["metadata"].get("labels", {}).get(TEST_LABEL) != workload.test:
            continue
        annotations = pod["metadata"].get("annotations") or {}
        where = f"{pod['spec']['nodeName']} GPU {annotations.get(IDX, '?')}" if pod["spec"].get("nodeName") else "-"
        conditions = [
            f"{c['type']}={c['status']} {c.get('reason', '')}: {c.get('message', '')}"
            for c in (pod.get("status") or {}).get("conditions") or ()
        ]
        lines.append(f"  {key_of(pod):30} {demand(pod):3} GiB  {where:22} {'; '.join(conditions)[:300]}")
    lines.append(
        "GPUs: "
        + ", ".join(f"{node}/{index}={state.used.get((node, index), 0)}" for node in NODES for index in range(GPUS))
    )
    return "\n".join(lines)


async def diagnostics(
    control_plane: ControlPlane, workload: Workload, extender: ExtenderProcess | None, scheduler: Scheduler | None
) -> str:
    parts = [describe(await api_placement(control_plane), workload)]
    if extender is not None:
        parts.append(f"extender {extender.name} log tail:\n{extender.tail()}")
    if scheduler is not None:
        parts.append(f"kube-scheduler log tail:\n{scheduler.tail()}")
    return "\n\n".join(parts)


async def settle(
    control_plane: ControlPlane,
    workload: Workload,
    extender: ExtenderProcess | None,
    scheduler: Scheduler | None,
    timeout: float = SETTLE_TIMEOUT,
) -> Placement:
    """Wait until every pod of the workload that can fit is bound: each one still pending asks more than the
    largest free GPU memory anywhere (from the API). The invariants are checked on every poll."""
    deadline = time.monotonic() + timeout
    while True:
        state = await api_placement(control_plane)
        if state.problems:
            pytest.fail(
                "invariant broken while placing:\n"
                + "\n".join(state.problems)
                + "\n\n"
                + await diagnostics(control_plane, workload, extender, scheduler)
            )
        mine = [pod for pod in state.pods if pod["metadata"].get("labels", {}).get(TEST_LABEL) == workload.test]
        largest = state.largest_free()
        if len(mine) == len(workload.names) and all(
            pod["spec"].get("nodeName") or demand(pod) > largest for pod in mine
        ):
            return Placement(mine, state.used, state.holders, [])
        if time.monotonic() > deadline:
            pytest.fail(
                f"pods that fit still pending after {timeout:.0f} s (largest free GPU: {largest} GiB)\n\n"
                + await diagnostics(control_plane, workload, extender, scheduler)
            )
        await asyncio.sleep(0.25)


async def inspect_differences(extender: ExtenderProcess, state: Placement) -> list[str]:
    """How the extender's /inspect differs from the API's placement on our nodes (empty when equal)."""
    report = await extender.inspect()
    problems = [] if report["reservations"] == 0 else [f"{report['reservations']} reservations left"]
    shown = {node["name"]: node for node in report["nodes"]}
    for name in NODES:
        node = shown.get(name)
        if node is None or not node["known"]:
            problems.append(f"{name} not in the extender's cache")
            continue
        for device in node["devices"]:
            key = (name, device["index"])
            pods = {holder["pod"] for holder in device["pods"]}
            expected = state.holders.get(key, set())
            if device["used"] != state.used.get(key, 0) or pods != expected:
                problems.append(
                    f"{name} GPU {device['index']}: extender {device['used']} GiB {sorted(pods)}, "
                    f"API {state.used.get(key, 0)} GiB {sorted(expected)}"
                )
            if device["capacity"] != GPU_MEMORY or device["used"] > device["capacity"]:
                problems.append(f"{name} GPU {device['index']}: {device}")
            if any(holder["state"] != "observed" for holder in device["pods"]):
                problems.append(f"{name} GPU {device['index']} holds unobserved pods: {device['pods']}")
    return problems


async def assert_extender_agrees(control_plane: ControlPlane, extender: ExtenderProcess) -> None:
    """The extender's view equals the API's (allowing its watch a moment to catch up)."""

    async def differences() -> list[str]:
        return await inspect_differences(extender, await api_placement(control_plane))

    await assert_agrees(extender, differences)


async def events_of(control_plane: ControlPlane, pod: dict[str, Any], reason: str) -> list[str]:
    """Messages of the pod's events with this reason (the scheduler writes events.k8s.io ones; the core API
    shows them too, `note` as `message`)."""
    listed = await control_plane.api("GET", "/api/v1/namespaces/default/events")
    uid = pod["metadata"]["uid"]
    return [
        str(event.get("message"))
        for event in listed["items"]
        if event.get("reason") == reason and (event.get("involvedObject") or {}).get("uid") == uid
    ]


async def verb_counts(extender: ExtenderProcess) -> dict[str, int]:
    """extender_requests_total by verb and outcome, the non-zero ones ("bind/error": 2)."""
    counts = {}
    for match in re.finditer(
        r'^extender_requests_total\{outcome="(\w+)",verb="(\w+)"\} (\S+)$', await extender.metrics(), re.M
    ):
        if float(match.group(3)):
            counts[f"{match.group(2)}/{match.group(1)}"] = int(float(match.group(3)))
    return counts


def binding_args(pod: dict[str, Any], node: str) -> dict[str, str]:
    meta = pod["metadata"]
    return {"PodName": meta["name"], "PodNamespace": meta["namespace"], "PodUID": meta["uid"], "Node": node}


async def filter_passes(extender: ExtenderProcess, pod: dict[str, Any], node: str) -> bool:
    """Whether the extender's filter passes `node` for the pod (so it knows the pod and the node)."""
    reply = await extender.post("filter", {"Pod": pod, "NodeNames": [node]})
    return bool(reply.get("NodeNames") == [node])


async def readiness(extender: ExtenderProcess) -> tuple[int, str]:
    """/readyz: its status and the reason it gives when not ready (0 while nothing listens)."""
    try:
        status, body = await extender.call("GET", "/readyz")
    except aiohttp.ClientError as error:
        return 0, str(error)
    return status, str(body.get("Error", "")) if isinstance(body, dict) else str(body)


async def start_clean(extender: ExtenderProcess) -> None:
    """Wait until the extender holds nothing on our GPUs (an earlier test's pods are gone from its cache)."""
    await eventually(lambda: _extender_empty(extender), what=f"extender {extender.name} seeing the GPUs empty")


# ---- tests -----------------------------------------------------------------------------------------------


async def test_a_burst_is_placed_without_overcommitting_any_gpu(
    control_plane: ControlPlane, extender: ExtenderProcess, scheduler: Scheduler, workload: Workload
) -> None:
    await start_clean(extender)
    never = await workload.create("never", NEVER_FITS)  # first, alone: judged while every GPU is empty
    refused = await eventually(lambda: events_of(control_plane, never, "FailedScheduling"), what="FailedScheduling")
    started = time.monotonic()
    await workload.burst("burst", BURST_SIZES)
    state = await settle(control_plane, workload, extender, scheduler)
    elapsed = time.monotonic() - started

    assert len(state.bound) >= 10, describe(state, workload)
    assert len(state.pending) >= 2, "168 GiB asked of 128, and one pod that never fits: some must wait"
    assert sum(state.used.values()) == sum(demand(pod) for pod in state.bound)
    await assert_extender_agrees(control_plane, extender)
    # The scheduler tries it again on nearly any cluster event (an extender's rejection names no plugin whose
    # events alone could help), so the same message may come more than once.
    assert set(refused) == {
        "0/4 nodes are available: 4 needs 20 GiB on one GPU; the largest GPU here has 16 GiB. no new claims to "
        "deallocate, preemption: 0/4 nodes are available: 4 Preemption is not helpful for scheduling."
    }
    waiting = {key_of(pod): await events_of(control_plane, pod, "FailedScheduling") for pod in state.pending}
    assert all(waiting.values()), waiting
    print(f"\nburst: {len(state.bound)} bound, {len(state.pending)} pending after {elapsed:.1f} s; {waiting}")
    print(f"extender calls: {await verb_counts(extender)}")


async def test_a_burst_survives_the_extender_killed_and_restarted(
    control_plane: ControlPlane, extender: ExtenderProcess, scheduler: Scheduler, workload: Workload
) -> None:
    await start_clean(extender)
    await workload.burst("before", [4, 6, 8, 10, 12, 2] * 2)  # 84 GiB: "after" pods surely fit too

    async def some_bound() -> bool:
        return sum(1 for pod in await workload.pods() if pod["spec"].get("nodeName")) >= 3

    await eventually(some_bound, interval=0.02, what="the first binds")
    try:
        await _kill_and_restart(control_plane, extender, scheduler, workload)
    finally:
        if not extender.running():  # the module's other tests need it
            extender.start()
            extender.wait_until(200)


async def _kill_and_restart(
    control_plane: ControlPlane, extender: ExtenderProcess, scheduler: Scheduler, workload: Workload
) -> None:
    assert extender.signal(signal.SIGKILL) == -signal.SIGKILL
    at_kill = await api_placement(control_plane)
    assert not at_kill.problems, at_kill.problems
    await workload.burst("after", [2, 4, 6, 8] * 2)
    await asyncio.sleep(1.5)  # the scheduler calls a dead extender meanwhile
    while_dead = await api_placement(control_plane)
    assert not while_dead.problems, while_dead.problems
    bound_while_dead = [key_of(pod) for pod in while_dead.bound if pod["metadata"]["name"].startswith("after-")]
    assert bound_while_dead == [], "nothing can be bound while the extender is down"

    restarted = time.monotonic()
    extender.start()
    ready_after = extender.wait_until(200)
    state = await settle(control_plane, workload, extender, scheduler)
    settled_after = time.monotonic() - restarted

    assert len(state.bound) > len([pod for pod in at_kill.bound if pod["metadata"]["name"].startswith("before-")])
    assert any(pod["metadata"]["name"].startswith("after-") for pod in state.bound), describe(state, workload)
    await assert_extender_agrees(control_plane, extender)
    refused = scheduler.log().count("connection refused")
    assert refused, "the scheduler should have found the extender down"
    print(
        f"\nkilled with {len(at_kill.bound)} pods bound; ready {ready_after:.1f} s after the restart, all placed "
        f"{settled_after:.1f} s after it: {len(state.bound)} bound, {len(state.pending)} pending; "
        f"'connection refused' in the scheduler's log {refused} times; "
        f"extender calls since: {await verb_counts(extender)}"
    )


async def test_memory_freed_by_deleted_pods_goes_to_new_pods(
    control_plane: ControlPlane, extender: ExtenderProcess, scheduler: Scheduler, workload: Workload
) -> None:
    await start_clean(extender)
    await workload.burst("fill", [8] * 16)
    full = await settle(control_plane, workload, extender, scheduler)
    assert not full.pending and all(full.used[node, index] == 16 for node in NODES for index in range(GPUS))

    first, second = NODES[0], NODES[1]
    victims = [min(full.holders[first, 0]), min(full.holders[first, 1]), min(full.holders[second, 0])]
    await asyncio.gather(*(workload.delete(key.split("/")[1]) for key in victims))
    freed = {(first, 0), (first, 1), (second, 0)}

    async def seen_freed() -> bool:
        report = {node["name"]: node for node in (await extender.inspect())["nodes"]}
        return all(report[node]["devices"][index]["used"] == 8 for node, index in freed)

    # The scheduler may see a deletion before the extender does; a pod we then refuse waits for the next
    # cluster event. Not what this test is about: let the extender catch up first.
    await eventually(seen_freed, timeout=10, what="the extender seeing the deletions")
    # first has 16 GiB free in all, 8 on each GPU: the scheduler's own count lets a 16 GiB pod through, we do not.
    wide = await workload.create("wide", 16)
    await workload.burst("refill", [8] * 3)
    state = await settle(control_plane, workload, extender, scheduler)

    refilled = {
        (pod["spec"]["nodeName"], int(pod["metadata"]["annotations"][IDX]))
        for pod in state.bound
        if pod["metadata"]["name"].startswith("refill-")
    }
    assert refilled == freed, describe(state, workload)
    assert [key_of(pod) for pod in state.pending] == ["default/wide"]
    await assert_extender_agrees(control_plane, extender)
    messages = await eventually(lambda: events_of(control_plane, wide, "FailedScheduling"), what="FailedScheduling")
    # No pod there has a lower priority than wide's, so the node is unresolvable: preemption skips it.
    assert any(
        "1 needs 16 GiB on one GPU; largest free is 8 GiB (GPU 0 of 2); no pod on its GPUs has a lower priority, "
        f"so preemption cannot help, 3 Insufficient {GPU_MEM}" in message
        for message in messages
    ), messages


async def test_pods_waiting_on_a_full_cluster_get_the_memory_of_deleted_pods(
    control_plane: ControlPlane, extender: ExtenderProcess, scheduler: Scheduler, workload: Workload
) -> None:
    """The everyday case: pods wait, refused, while every GPU is full; pods end, and the waiting ones get their
    memory. kube-scheduler retries them on the deletions, which it may see before our watch does: the extender
    then asks it to retry once its cache has caught up (`extender/core/requeue.py`), so none waits for the 5-minute
    flush. Measured with our watch held back 300 ms by a local patch: without that request the first waiting pod
    was still Pending after 15 s; with it both were placed within 2 s."""
    await start_clean(extender)
    await workload.burst("fill", [GPU_MEMORY] * (len(NODES) * GPUS))
    full = await settle(control_plane, workload, extender, scheduler)
    assert not full.pending
    waiting = [await workload.create(f"wait-{number}", GPU_MEMORY) for number in range(2)]
    for pod in waiting:
        await eventually(lambda pod=pod: _refused(control_plane, pod), what=f"{key_of(pod)} refused")
    ended = [min(full.holders[NODES[0], 0]), min(full.holders[NODES[1], 1])]
    await asyncio.gather(*(workload.delete(key.split("/")[1]) for key in ended))
    for pod in waiting:
        await wait_bound(control_plane, pod, 15, workload, extender, scheduler)
    state = await api_placement(control_plane)
    assert not state.problems, state.problems
    await assert_extender_agrees(control_plane, extender)


async def test_of_two_replicas_only_the_leader_is_ready_and_binds(
    control_plane: ControlPlane, tls: TLSFiles, gpu_nodes: tuple[str, ...], workload: Workload
) -> None:
    flags = ("--lease-namespace", EXTENDER_NAMESPACE, "--lease-name", "e2e-election", *LEASE)
    lease_path = f"/apis/coordination.k8s.io/v1/namespaces/{EXTENDER_NAMESPACE}/leases/e2e-election"
    replicas: list[ExtenderProcess] = []
    try:
        first = start_extender(control_plane, tls, "e2e-replica-a", *flags)
        replicas.append(first)
        first.wait_until(200)
        second = start_extender(control_plane, tls, "e2e-replica-b", *flags)
        replicas.append(second)

        async def standing_by(process: ExtenderProcess) -> bool:
            status, reason = await readiness(process)
            return status == 503 and "not the leader" in reason

        await eventually(lambda: standing_by(second), what="replica b synced and standing by")
        assert (await readiness(first))[0] == 200
        assert "held by e2e-replica-a" in (await readiness(second))[1]

        node = gpu_nodes[0]
        pod = await workload.create("elected", 4, scheduler_name=NOBODY)
        await eventually(lambda: filter_passes(first, pod, node), what="the leader knowing the pod")
        refused = await second.post("bind", binding_args(pod, node))
        assert "not the leader" in refused["Error"]
        stored = await control_plane.api("GET", f"/api/v1/namespaces/default/pods/{pod['metadata']['name']}")
        assert not stored["spec"].get("nodeName")
        assert (await first.post("bind", binding_args(pod, node)))["Error"] == ""
        stored = await control_plane.api("GET", f"/api/v1/namespaces/default/pods/{pod['metadata']['name']}")
        assert stored["spec"]["nodeName"] == node and placement([stored]).problems == []

        before = await control_plane.api("GET", lease_path)
        assert first.signal(signal.SIGTERM) == 0, first.tail()
        released_in = second.wait_until(200, timeout=60)
        records = await lease_records(control_plane, before, until="e2e-replica-b")
        assert [record.get("holderIdentity") for record in records[-2:]] == [None, "e2e-replica-b"], (
            "a released lease is taken from its release, not after its 3 s"
        )
        assert "released lease gpu-extender/e2e-election" in first.log_text()

        first.start()
        await eventually(lambda: standing_by(first), what="replica a back, standing by")
        before = await control_plane.api("GET", lease_path)
        assert second.signal(signal.SIGKILL) == -signal.SIGKILL
        taken_in = first.wait_until(200, timeout=60)
        *held, taken = await lease_records(control_plane, before, until="e2e-replica-a")
        last_renewal = [before["spec"], *held][-1]
        assert last_renewal["holderIdentity"] == "e2e-replica-b"
        waited = lease_time(taken["acquireTime"]) - lease_time(last_renewal["renewTime"])
        assert waited >= 3, f"a dead leader's lease is taken after its duration (3 s), not {waited:.1f} s after"

        late = await workload.create("elected-late", 4, scheduler_name=NOBODY)
        await eventually(lambda: filter_passes(first, late, node), what="the new leader knowing the pod")
        assert (await first.post("bind", binding_args(late, node)))["Error"] == ""
        print(f"\ntakeover after SIGTERM: {released_in:.2f} s; after SIGKILL: {taken_in:.2f} s (lease 3 s)")
    finally:
        for process in replicas:
            process.stop()
        try:
            await control_plane.delete(lease_path)
        except ApiError as error:
            if error.status != 404:
                raise


async def lease_records(control_plane: ControlPlane, lease: dict[str, Any], until: str) -> list[dict[str, Any]]:
    """Every spec the Lease was written with after `lease`, up to the first that `until` holds: the lease's own
    record of who held it and when, read from a watch (no write is missed, whatever the test's pace)."""
    name, version = lease["metadata"]["name"], lease["metadata"]["resourceVersion"]
    namespace = lease["metadata"]["namespace"]
    path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases?watch=1"
    path += f"&fieldSelector=metadata.name%3D{name}&resourceVersion={version}"
    records: list[dict[str, Any]] = []
    async with control_plane.watch(path, timeout=120) as events:
        async for event in events:
            records.append(event["object"]["spec"])
            if records[-1].get("holderIdentity") == until:
                return records
    raise AssertionError(f"the watch of lease {name} ended before {until} held it: {records}")


def lease_time(stamp: str) -> float:
    """A Lease's MicroTime (`2026-01-02T03:04:05.123456Z`), in Unix seconds."""
    return datetime.fromisoformat(stamp).timestamp()


async def test_a_second_bind_of_a_bound_pod_succeeds_without_binding_again(
    control_plane: ControlPlane, extender: ExtenderProcess, workload: Workload
) -> None:
    await start_clean(extender)
    node = NODES[0]
    pod = await workload.create("twice", 4, scheduler_name=NOBODY)
    path = f"/api/v1/namespaces/default/pods/{pod['metadata']['name']}"
    await eventually(lambda: filter_passes(extender, pod, node), what="the extender knowing the pod")

    replies = await asyncio.gather(*(extender.post("bind", binding_args(pod, node)) for _ in range(2)))
    assert [reply["Error"] for reply in replies] == ["", ""]
    bound = await control_plane.api("GET", path)
    assert bound["spec"]["nodeName"] == node
    assert placement([bound]).problems == []
    await assert_extender_agrees(control_plane, extender)  # its watch has shown the pod bound

    assert (await extender.post("bind", binding_args(pod, node)))["Error"] == ""
    elsewhere = await extender.post("bind", binding_args(pod, NODES[1]))
    assert elsewhere["Error"] == f"pod default/twice is already bound to {node}, not {NODES[1]}"
    warned = await eventually(lambda: events_of(control_plane, pod, "FailedBinding"), what="a FailedBinding Event")
    assert warned == [f"binding to {NODES[1]} failed: {elsewhere['Error']}"]
    after = await control_plane.api("GET", path)
    assert after["metadata"]["resourceVersion"] == bound["metadata"]["resourceVersion"], "nothing written again"
    assert after["metadata"]["annotations"] == bound["metadata"]["annotations"]
    await assert_extender_agrees(control_plane, extender)
    assert [shown["used"] for shown in (await extender.inspect())["nodes"] if shown["name"] == node] == [4]


PRIORITIES = {"e2e-high": 1000, "e2e-p30": 30, "e2e-p20": 20, "e2e-p10": 10, "e2e-p5": 5}
PRIORITY_CLASSES = "/apis/scheduling.k8s.io/v1/priorityclasses"


@pytest.fixture
async def priority_classes(control_plane: ControlPlane) -> AsyncIterator[dict[str, int]]:
    for name, value in PRIORITIES.items():
        await control_plane.api("POST", PRIORITY_CLASSES, {"metadata": {"name": name}, "value": value})
    yield PRIORITIES
    for name in PRIORITIES:
        await control_plane.delete(f"{PRIORITY_CLASSES}/{name}")


async def bind_by_hand(extender: ExtenderProcess, control_plane: ControlPlane, pod: dict[str, Any], node: str) -> Key:
    """Filter then bind the pod to `node` through the extender, as the scheduler would; returns its GPU."""
    await eventually(lambda: filter_passes(extender, pod, node), what=f"{key_of(pod)} fitting {node}")
    assert (await extender.post("bind", binding_args(pod, node)))["Error"] == ""
    bound = await control_plane.api("GET", f"/api/v1/namespaces/default/pods/{pod['metadata']['name']}")
    return bound["spec"]["nodeName"], int(bound["metadata"]["annotations"][IDX])


async def wait_bound(
    control_plane: ControlPlane,
    pod: dict[str, Any],
    timeout: float,
    workload: Workload,
    extender: ExtenderProcess,
    scheduler: Scheduler,
) -> dict[str, Any]:
    path = f"/api/v1/namespaces/default/pods/{pod['metadata']['name']}"

    async def bound() -> dict[str, Any] | None:
        stored = await control_plane.api("GET", path)
        return stored if stored["spec"].get("nodeName") else None

    try:
        return dict(await eventually(bound, timeout=timeout, what=f"{key_of(pod)} bound"))
    except AssertionError:
        pytest.fail(
            f"{key_of(pod)} was not placed within {timeout:.0f} s\n\n"
            + await diagnostics(control_plane, workload, extender, scheduler)
        )


async def test_a_higher_priority_pod_preempts_the_pod_holding_a_whole_gpu(
    control_plane: ControlPlane,
    extender: ExtenderProcess,
    scheduler: Scheduler,
    workload: Workload,
    priority_classes: dict[str, int],
) -> None:
    """Every GPU holds one 16 GiB pod; a 16 GiB pod of higher priority makes the scheduler pick a victim by its
    own count (one pod, a whole GPU), ask our /preempt, evict it and bind the newcomer on that GPU."""
    await start_clean(extender)
    await workload.burst("low", [16] * (len(NODES) * GPUS))
    full = await settle(control_plane, workload, extender, scheduler)
    assert not full.pending
    before = await verb_counts(extender)
    high = await workload.create("high", 16, priority_class="e2e-high")
    bound = await wait_bound(control_plane, high, 30, workload, extender, scheduler)

    state = await api_placement(control_plane)
    assert not state.problems, state.problems
    left = {key_of(pod) for pod in await workload.pods() if pod["metadata"]["name"].startswith("low-")}
    victims = {key_of(pod) for pod in full.bound} - left
    assert len(victims) == 1, victims
    (victim,) = victims
    place = (bound["spec"]["nodeName"], int(bound["metadata"]["annotations"][IDX]))
    assert victim in full.holders[place], f"{victim} was not the pod on {place}"
    assert state.holders[place] == {"default/high"}
    after = await verb_counts(extender)
    assert after.get("preempt/ok", 0) > before.get("preempt/ok", 0), after
    await assert_extender_agrees(control_plane, extender)
    print(f"\npreempted {victim} for default/high on {place}; extender calls: {after}")


async def test_a_higher_priority_pod_preempts_two_pods_sharing_one_gpu(
    control_plane: ControlPlane,
    extender: ExtenderProcess,
    scheduler: Scheduler,
    workload: Workload,
    priority_classes: dict[str, int],
) -> None:
    """The target node holds 8 GiB pods of priority 30 and 10 on GPU 0, 20 and 5 on GPU 1; every other GPU holds a
    pod of the newcomer's own priority (never a victim). The scheduler counts only the node's total: it keeps the
    two most important pods (30 on GPU 0, 20 on GPU 1) and names 10 and 5 as victims, 8 GiB on each GPU, which
    frees no GPU for a 16 GiB pod. Evicting both pods of one GPU would."""
    await start_clean(extender)
    target, others = NODES[0], NODES[1:]
    for number, node in enumerate(others):
        for index in range(GPUS):
            pod = await workload.create(f"peer-{number}-{index}", 16, NOBODY, "e2e-high")
            assert await bind_by_hand(extender, control_plane, pod, node) == (node, index)
    layout = {}
    for name, priority_class in (("p30", "e2e-p30"), ("p10", "e2e-p10"), ("p20", "e2e-p20"), ("p5", "e2e-p5")):
        pod = await workload.create(name, 8, NOBODY, priority_class)
        layout[name] = await bind_by_hand(extender, control_plane, pod, target)
    assert layout == {"p30": (target, 0), "p10": (target, 0), "p20": (target, 1), "p5": (target, 1)}

    high = await workload.create("high", 16, priority_class="e2e-high")
    bound = await wait_bound(control_plane, high, 10, workload, extender, scheduler)
    place = (bound["spec"]["nodeName"], int(bound["metadata"]["annotations"][IDX]))
    left = {pod["metadata"]["name"] for pod in await workload.pods()}
    evicted = {name for name in layout if name not in left}
    assert place[0] == target and evicted == {name for name, gpu in layout.items() if gpu == place}
    state = await api_placement(control_plane)
    assert not state.problems, state.problems


async def test_a_pod_kept_out_by_a_reservation_that_expires_is_placed_at_once(
    control_plane: ControlPlane, extender: ExtenderProcess, scheduler: Scheduler, workload: Workload
) -> None:
    """A pod annotated for a GPU but never bound (what a crash in a two-step tool leaves) holds that GPU until the
    reservation TTL (10 s here). A pod refused meanwhile would wait for the next cluster event, or kube-scheduler's
    flush after 5 minutes, since nothing in the API changes when a reservation expires. The extender annotates
    its own pod then, and kube-scheduler retries the pods it rejected."""
    await start_clean(extender)
    target = (NODES[0], 0)
    orphan = await workload.create("orphan", GPU_MEMORY, NOBODY)
    annotations = {
        IDX: "0", INDEXES: "0", POD_MEM: str(GPU_MEMORY), DEV_MEM: str(GPU_MEMORY), NODE_ANNOTATION: target[0],
        ASSUME_TIME: str(time.time_ns()),
    }  # fmt: skip
    path = f"/api/v1/namespaces/default/pods/{orphan['metadata']['name']}"
    await control_plane.api("PATCH", path, {"metadata": {"annotations": annotations}})
    await eventually(lambda: _reserved(extender), what="the orphan held as a reservation")
    reserved_at = time.monotonic()
    for number, node in enumerate(NODES):  # every other GPU full
        for index in range(GPUS):
            if (node, index) != target:
                pod = await workload.create(f"full-{number}-{index}", GPU_MEMORY, NOBODY)
                assert await bind_by_hand(extender, control_plane, pod, node) == (node, index)

    waiting = await workload.create("waiting", GPU_MEMORY)
    await eventually(lambda: _refused(control_plane, waiting), what="the waiting pod refused")
    # Retried on the extender's own event (its pod annotated, below), not on kube-scheduler's flush of the pods
    # unschedulable for 300 s: the wait allows half that, far from both, and asserts no duration.
    bound = await wait_bound(control_plane, waiting, 150, workload, extender, scheduler)
    placed_in = time.monotonic() - reserved_at
    assert (bound["spec"]["nodeName"], int(bound["metadata"]["annotations"][IDX])) == target
    own = await control_plane.api("GET", f"/api/v1/namespaces/{EXTENDER_NAMESPACE}/pods/{SELF}")
    assert "gpu-extender.io/requeue-requested" in (own["metadata"].get("annotations") or {})
    state = await api_placement(control_plane)
    assert not state.problems, state.problems
    print(f"\nplaced {placed_in:.1f} s after an orphan reservation of 10 s began")


async def _reserved(extender: ExtenderProcess) -> bool:
    return bool((await extender.inspect())["reservations"])


async def _refused(control_plane: ControlPlane, pod: dict[str, Any]) -> bool:
    stored = await control_plane.api("GET", f"/api/v1/namespaces/default/pods/{pod['metadata']['name']}")
    conditions = (stored.get("status") or {}).get("conditions") or ()
    return any(c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable" for c in conditions)
