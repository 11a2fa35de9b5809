"""End to end: the cluster's own kube-scheduler (`default-scheduler`) wired as `extender scheduler-config` renders
it for that name under the fragmentation policy: the GPU entry (filter, prioritize, preempt, bind; not ignorable)
and a second, ignorable entry every pod reaches, `filterVerb: filter-cpu` only, so a pod asking no GPU goes
where its cpu strands no GPU, while the extender being down never keeps such a pod waiting.

The module has its own extender (a real `extender serve` process) and kube-scheduler v1.34.1, three nodes (two of
2 GPUs x 16 GiB, one without GPUs), and, for the tests of where a pod asking no GPU goes, two more made per test:
`BUSY`, whose GPUs its own pods hold, and `IDLE`, whose GPUs are free. Which one kube-scheduler's default scores
prefer, and why, is in `BUSY_CPU`'s docstring; the test with the extender down shows it happening.
"""

from __future__ import annotations

import asyncio
import re
import signal
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from extender.tools.schedconfig import CPU_FILTER_VERB, DEFAULT_SCHEDULER
from tests.builders import make_pod
from tests.e2e.controlplane import EXTENDER_NAMESPACE, GPU_MEM, ApiError, ControlPlane, eventually, node_manifest
from tests.e2e.extender_process import ExtenderProcess, TLSFiles, serving_with_own_pod
from tests.e2e.scheduler import Scheduler, running_scheduler, scheduler_config
from tests.e2e.test_scheduling import GPU_MEMORY, GPUS, IDX, TEST_LABEL, Workload, key_of, placement, wait_bound

pytestmark = pytest.mark.e2e

GPU_NODES = ("e2e-dw-gpu-0", "e2e-dw-gpu-1")
PLAIN = "e2e-dw-plain"
"""The node without GPUs."""
NODES = (*GPU_NODES, PLAIN)
SELF = "e2e-dw-extender"
"""The extender's own pod (no kubelet runs it), which it annotates to make kube-scheduler retry pods it refused."""
FLAGS = ("--no-leader-elect", "--lease-namespace", EXTENDER_NAMESPACE, "--pod-name", SELF, "--expiry-interval", "1")
"""No lease: a restart after SIGKILL is ready as soon as its cache is, whatever another module left in a Lease."""

BUSY, IDLE = "e2e-dw-busy", "e2e-dw-idle"
CHOICE = {"e2e-dw-choice": "true"}
"""The label of BUSY and IDLE alone: the node selector of the pods that choose between them."""
FILL_CPU = 8
"""Cores of each pod holding one of BUSY's GPUs (16 GiB): the typical shape the extender learns, 8 cores a GPU."""
BUSY_CPU = 28
"""BUSY's cores; IDLE has node_manifest's 16. A pod asking `STRANDER_CPU` cores fits both (BUSY: 28 - 2 x 8 = 12
free). kube-scheduler's default scores prefer IDLE: NodeResourcesFit's LeastAllocated gives cpu (16 - 10) / 16 =
37 % free there against (28 - 26) / 28 = 7 % on BUSY (memory equal), and NodeResourcesBalancedAllocation prefers
IDLE's less lopsided cpu and memory too; no other default plugin tells the two apart. The extender prefers BUSY:
its GPUs are taken, so the pod's cpu strands nothing there, while on IDLE it leaves 6 cores, less than one typical
pod needs: both free GPUs would be unusable."""
STRANDER_CPU = 10

CPU_POD_DEADLINE = 60.0
"""How long the test waits for a pod asking no GPU to be bound while the extender is down: a guard, not a
duration asserted. The extender stays down all that time, so the pod bound at all shows kube-scheduler skipping
the ignorable entry (connection refused is immediate); an entry it could not skip would keep it unbound."""
RESTART_TIMEOUT = 90.0
"""How long the test waits for the waiting GPU pod to be bound once the extender is back (kube-scheduler retries a
pod that met an error after its backoff, 1 s doubling to 10 s): a guard against a hang, far above it."""


# ---- fixtures --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def nodes(control_plane: ControlPlane) -> Iterator[tuple[str, ...]]:
    for name in GPU_NODES:
        control_plane.create_node_now(name, gpus=GPUS, gpu_mem=GPU_MEMORY)
    control_plane.create_node_now(PLAIN, gpus=0)
    yield NODES
    for name in NODES:
        control_plane.request("DELETE", f"/api/v1/nodes/{name}")


@pytest.fixture(scope="module")
def extender(control_plane: ControlPlane, tls: TLSFiles, nodes: tuple[str, ...]) -> Iterator[ExtenderProcess]:
    process = ExtenderProcess("e2e-default", control_plane.workdir, control_plane.kubeconfig("extender"), tls, FLAGS)
    with serving_with_own_pod(control_plane, process, SELF, GPU_NODES[0]) as serving:
        yield serving


@pytest.fixture(scope="module")
def scheduler(control_plane: ControlPlane, extender: ExtenderProcess) -> Iterator[Scheduler]:
    with running_scheduler(control_plane, extender, DEFAULT_SCHEDULER) as running:
        yield running


@pytest.fixture
async def workload(
    control_plane: ControlPlane, extender: ExtenderProcess, request: pytest.FixtureRequest
) -> AsyncIterator[Workload]:
    """The test's pods (labelled with its name): deleted after it, then the extender seen holding nothing."""
    test = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[-60:].strip("-")
    made = Workload(control_plane, test)
    yield made
    await delete_all(made)
    if extender.running():
        await eventually(lambda: extender_empty(extender), what="the extender seeing the test's pods gone")


@pytest.fixture
async def choice(
    control_plane: ControlPlane, extender: ExtenderProcess, scheduler: Scheduler, workload: Workload
) -> AsyncIterator[None]:
    """BUSY, its two GPUs held by pods of 16 GiB and `FILL_CPU` cores placed through the extender, and IDLE,
    empty; both labelled `CHOICE`. Ready when the extender has seen the pods bound and learned their shape.
    The test's pods are deleted before the nodes."""
    busy = node_manifest(BUSY, gpus=GPUS, gpu_mem=GPU_MEMORY, labels=CHOICE)
    for field in ("capacity", "allocatable"):
        busy["status"][field]["cpu"] = str(BUSY_CPU)
    await control_plane.api("POST", "/api/v1/nodes", busy)
    try:
        await control_plane.create_node(IDLE, gpus=GPUS, gpu_mem=GPU_MEMORY, labels=CHOICE)
        await eventually(lambda: extender_knows(extender, BUSY, IDLE), what="the extender knowing BUSY and IDLE")
        fill = [
            await create(workload, f"fill-{index}", FILL_CPU, GPU_MEMORY, {"kubernetes.io/hostname": BUSY})
            for index in range(GPUS)
        ]
        for pod in fill:
            await wait_bound(control_plane, pod, 15, workload, extender, scheduler)
        await eventually(lambda: busy_seen_full(extender), what="the extender seeing BUSY's GPUs taken")
        yield
    finally:
        await delete_all(workload)
        for name in (BUSY, IDLE):
            try:
                await control_plane.delete(f"/api/v1/nodes/{name}")
            except ApiError as error:
                if error.status != 404:
                    raise


# ---- pods and what the extender says ---------------------------------------------------------------------


async def create(
    workload: Workload, name: str, cpu: float, gpu_mem: int | None = None, selector: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """A pod of the default scheduler asking `cpu` cores (and `gpu_mem` of aliyun.com/gpu-mem), one of the
    workload's."""
    pod = make_pod(name, gpu_mem=None if gpu_mem is None else str(gpu_mem), cpu=str(cpu))
    del pod["metadata"]["uid"], pod["status"]  # the API server's to set
    pod["apiVersion"] = "v1"
    pod["metadata"]["labels"] = {TEST_LABEL: workload.test}
    pod["spec"] |= {
        "schedulerName": DEFAULT_SCHEDULER,
        "terminationGracePeriodSeconds": 0,
        "nodeSelector": dict(selector or {}),
    }
    workload.names.append(name)
    return await workload.control_plane.api("POST", "/api/v1/namespaces/default/pods", pod)


async def delete_all(workload: Workload) -> None:
    await asyncio.gather(*(workload.delete(name) for name in list(workload.names)))

    async def none_left() -> bool:
        return not await workload.pods()

    await eventually(none_left, what="the test's pods deleted")


async def extender_empty(extender: ExtenderProcess) -> bool:
    report = await extender.inspect()
    return report["reservations"] == 0 and all(
        device["used"] == 0 for node in report["nodes"] if node["name"] in NODES for device in node["devices"]
    )


async def extender_knows(extender: ExtenderProcess, *names: str) -> bool:
    known = {node["name"] for node in (await extender.inspect())["nodes"] if node["known"]}
    return known.issuperset(names)


async def busy_seen_full(extender: ExtenderProcess) -> bool:
    """BUSY's GPUs all used in the extender's cache, and the fill pods' shape among the typical ones."""
    report = await extender.inspect()
    busy = [node for node in report["nodes"] if node["name"] == BUSY]
    shapes = report["workload"]["shapes"]
    return (
        bool(busy)
        and all(device["used"] == GPU_MEMORY for device in busy[0]["devices"])
        and any(shape["cpu_millicores"] == FILL_CPU * 1000 for shape in shapes)
    )


async def counters(extender: ExtenderProcess) -> dict[str, float]:
    """The extender's request and filter counters: "filter-cpu/ok" (extender_requests_total by verb and outcome)
    and "nodes/accepted" (extender_filter_nodes_total by result)."""
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(await extender.metrics()):
        for sample in family.samples:
            if sample.name == "extender_requests_total":
                found[f"{sample.labels['verb']}/{sample.labels['outcome']}"] = sample.value
            elif sample.name == "extender_filter_nodes_total":
                found[f"nodes/{sample.labels['result']}"] = sample.value
    return found


def nonzero(found: dict[str, float]) -> dict[str, int]:
    return {key: int(value) for key, value in found.items() if value}


def grown(after: dict[str, float], before: dict[str, float], key: str) -> float:
    return after.get(key, 0.0) - before.get(key, 0.0)


async def pod_now(control_plane: ControlPlane, pod: dict[str, Any]) -> dict[str, Any]:
    return await control_plane.api("GET", f"/api/v1/namespaces/default/pods/{pod['metadata']['name']}")


def scheduled_condition(pod: dict[str, Any]) -> dict[str, Any]:
    conditions = (pod.get("status") or {}).get("conditions") or ()
    return next((c for c in conditions if c.get("type") == "PodScheduled"), {})


# ---- tests -----------------------------------------------------------------------------------------------


async def test_cpu_pods_reach_filter_cpu_and_gpu_pods_the_gpu_entry(
    control_plane: ControlPlane, extender: ExtenderProcess, scheduler: Scheduler, workload: Workload
) -> None:
    entries = yaml.safe_load(scheduler_config(extender, DEFAULT_SCHEDULER))["extenders"]
    assert [
        (entry["filterVerb"], entry.get("bindVerb"), entry["managedResources"], entry["ignorable"]) for entry in entries
    ] == [
        ("filter", "bind", [{"name": GPU_MEM, "ignoredByScheduler": False}], False),
        (CPU_FILTER_VERB, None, [], True),
    ]

    before = await counters(extender)
    cpu_pod = await create(workload, "cpu-only", 0.1)
    bound = await wait_bound(control_plane, cpu_pod, 10, workload, extender, scheduler)
    after = await counters(extender)
    assert grown(after, before, f"{CPU_FILTER_VERB}/ok") >= 1, after
    assert grown(after, before, "filter/ok") == 0, "the GPU entry is not interested in a pod asking no GPU"
    assert grown(after, before, "bind/ok") == 0, "kube-scheduler's own binder bound it"
    assert IDX not in (bound["metadata"].get("annotations") or {})
    # Its cpu strands GPU nowhere, but filter-cpu passes the nodes with the least GPU free among those that tie
    # (`narrowing.narrowed`): here the one without GPUs. kube-scheduler alone scores it and the empty e2e-dw-gpu-1
    # the same.
    assert bound["spec"]["nodeName"] == PLAIN

    before = after
    gpu_pod = await create(workload, "gpu", 0.1, 4)
    bound = await wait_bound(control_plane, gpu_pod, 10, workload, extender, scheduler)
    after = await counters(extender)
    assert placement([bound]).problems == []
    assert bound["spec"]["nodeName"] in GPU_NODES
    filters = grown(after, before, "filter/ok")
    assert filters >= 1 and grown(after, before, "bind/ok") >= 1, after
    # The GPU entry's filter passed one node each time (narrowing `best`; filter-cpu counts no node for a GPU
    # pod), and kube-scheduler calls the entries in order: the pod bound means filter-cpu passed that node on.
    assert grown(after, before, "nodes/accepted") == filters, after
    assert grown(after, before, f"{CPU_FILTER_VERB}/ok") >= 1, after

    # Anything sent for a GPU pod is passed on untouched, even a node without GPUs or one nobody knows.
    sent = [*NODES, "e2e-dw-nowhere"]
    reply = await extender.post(CPU_FILTER_VERB, {"Pod": gpu_pod, "NodeNames": sent})
    assert reply["NodeNames"] == sent and not reply.get("FailedNodes"), reply
    gpu = f"{bound['spec']['nodeName']} GPU {bound['metadata']['annotations'][IDX]}"
    print(f"\nGPU pod on {gpu}; extender calls: {nonzero(after)}")


async def test_a_cpu_pod_goes_where_its_cpu_strands_no_gpu(
    control_plane: ControlPlane, extender: ExtenderProcess, scheduler: Scheduler, workload: Workload, choice: None
) -> None:
    """BUSY_CPU says why kube-scheduler alone would choose IDLE (the next test shows it doing so)."""
    before = await counters(extender)
    pod = await create(workload, "strander", STRANDER_CPU, selector=CHOICE)
    bound = await wait_bound(control_plane, pod, 10, workload, extender, scheduler)
    after = await counters(extender)
    assert bound["spec"]["nodeName"] == BUSY, f"{key_of(pod)} on {bound['spec']['nodeName']}, stranding IDLE's GPUs"
    assert grown(after, before, f"{CPU_FILTER_VERB}/ok") >= 1, after
    assert grown(after, before, "bind/ok") == 0, after


async def test_cpu_pods_are_placed_at_once_while_the_extender_is_down_and_gpu_pods_wait_for_it(
    control_plane: ControlPlane, extender: ExtenderProcess, scheduler: Scheduler, workload: Workload, choice: None
) -> None:
    try:
        await _down_and_back(control_plane, extender, scheduler, workload)
    finally:
        if not extender.running():  # the module's other tests need it
            extender.start()
            extender.wait_until(200)


async def _down_and_back(
    control_plane: ControlPlane, extender: ExtenderProcess, scheduler: Scheduler, workload: Workload
) -> None:
    assert extender.signal(signal.SIGKILL) == -signal.SIGKILL
    log_before = scheduler.log()
    gpu_pod = await create(workload, "gpu-waiting", 0.1, 4)
    created = time.monotonic()
    cpu_pod = await create(workload, "cpu-meanwhile", STRANDER_CPU, selector=CHOICE)

    async def cpu_bound() -> dict[str, Any] | None:
        stored = await pod_now(control_plane, cpu_pod)
        return stored if stored["spec"].get("nodeName") else None

    bound = await eventually(cpu_bound, timeout=CPU_POD_DEADLINE, what="the cpu pod bound", interval=0.05)
    cpu_took = time.monotonic() - created
    # No extender to steer it: kube-scheduler's own scores put it where the previous test's check forbids.
    assert bound["spec"]["nodeName"] == IDLE

    async def gpu_refused() -> dict[str, Any] | None:
        condition = scheduled_condition(await pod_now(control_plane, gpu_pod))
        return condition if condition.get("reason") == "SchedulerError" else None

    condition = await eventually(gpu_refused, timeout=10, what="the GPU pod failing on the extender down")
    assert "connection refused" in condition.get("message", ""), condition
    await asyncio.sleep(1.0)
    assert not (await pod_now(control_plane, gpu_pod))["spec"].get("nodeName"), "bound without the extender"
    log = scheduler.log()
    for line in ("connection refused", "Skipping extender as it returned error and has ignorable flag set"):
        assert log.count(line) > log_before.count(line), line
    down_for = time.monotonic() - created

    restarted = time.monotonic()
    extender.start()
    ready_in = extender.wait_until(200)
    bound = await wait_bound(control_plane, gpu_pod, RESTART_TIMEOUT, workload, extender, scheduler)
    gpu_took = time.monotonic() - restarted
    assert placement([bound]).problems == []
    assert (await counters(extender)).get("bind/ok", 0) >= 1, "the restarted extender bound it"
    print(
        f"\nextender down: cpu pod bound to {IDLE} in {cpu_took:.2f} s; GPU pod Pending for {down_for:.1f} s "
        f"({condition['message'][:120]}); extender ready {ready_in:.1f} s after the restart, GPU pod bound "
        f"{gpu_took:.1f} s after it"
    )
