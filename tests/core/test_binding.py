"""The bind procedure: idempotent, never twice, undone on failure, and able to place pods the cache has not
seen yet (only filtered)."""

from __future__ import annotations

import asyncio
from typing import Any

from extender.core.binding import (
    BindContext,
    BindError,
    BindOutcome,
    BindRequest,
    Guard,
    Outcome,
    RecentPods,
    bind,
    slim_pod,
)
from extender.core.holds import HoldState
from extender.core.ledger import Ledger
from extender.core.placement.config import PolicyConfig
from extender.core.protocols.gpushare import Profile, SeveralGpus
from extender.sources.file import FileBinder
from tests.builders import FakeClock, bind_error, make_cluster, make_node, make_pod, placer_for


class RecordingBinder:
    """Stands for the API: records each write; `fail` makes the next one fail as a 409/500 would."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, dict[str, str]]] = []
        self.fail: str = ""

    async def bind(self, pod: dict[str, Any], node: str, annotations: dict[str, str]) -> None:
        await asyncio.sleep(0)
        if self.fail:
            raise BindError(self.fail)
        self.calls.append((pod["metadata"]["uid"], node, annotations))


def request_for(pod: dict[str, Any], node: str = "n1") -> BindRequest:
    meta = pod["metadata"]
    return BindRequest(meta["name"], meta["namespace"], meta["uid"], node)


async def run_bind(cluster: Any, binder: Any, request: BindRequest, recent: RecentPods | None = None) -> str:
    ledger = Ledger(cluster, 60, FakeClock())
    return await bind_error(request, cluster, ledger, PolicyConfig(), binder, recent or RecentPods())


async def test_bind_writes_the_allocation_annotations_then_counts_the_pod_bound() -> None:
    cluster = make_cluster(make_node("n1"))
    pod = make_pod("p", gpu_mem=6)
    cluster.apply_pod(pod)
    binder = RecordingBinder()
    assert await run_bind(cluster, binder, request_for(pod)) == ""
    [(uid, node, annotations)] = binder.calls
    assert (uid, node) == (pod["metadata"]["uid"], "n1")
    assert annotations["ALIYUN_COM_GPU_MEM_IDX"] == "0"
    assert annotations["ALIYUN_COM_GPU_MEM_POD"] == "6"
    assert annotations["ALIYUN_COM_GPU_MEM_DEV"] == "16"
    assert annotations["ALIYUN_COM_GPU_MEM_ASSIGNED"] == "false"
    assert annotations["ALIYUN_COM_GPU_MEM_ASSUME_TIME"] == str(int(FakeClock().now * 1e9))
    hold = cluster.hold_of(pod["metadata"]["uid"])
    assert hold is not None and hold.state is HoldState.BOUND


async def test_binding_the_same_pod_twice_to_the_same_node_succeeds_once() -> None:
    cluster = make_cluster(make_node("n1"))
    pod = make_pod("p", gpu_mem=6)
    cluster.apply_pod(pod)
    binder = RecordingBinder()
    ledger = Ledger(cluster, 60, FakeClock())
    recent, policy = RecentPods(), PolicyConfig()
    first, second = await asyncio.gather(
        bind_error(request_for(pod), cluster, ledger, policy, binder, recent),
        bind_error(request_for(pod), cluster, ledger, policy, binder, recent),
    )
    assert (first, second) == ("", "")
    assert len(binder.calls) == 1
    assert cluster.nodes["n1"].used == [6, 0]


async def test_binding_a_bound_pod_to_another_node_is_an_error() -> None:
    cluster = make_cluster(make_node("n1"), make_node("n2"))
    pod = make_pod("p", gpu_mem=6, node="n1")
    cluster.apply_pod(pod)
    error = await run_bind(cluster, RecordingBinder(), request_for(pod, "n2"))
    assert error == "pod default/p is already bound to n1, not n2"


async def test_a_failed_write_releases_the_reservation() -> None:
    cluster = make_cluster(make_node("n1"))
    pod = make_pod("p", gpu_mem=6)
    cluster.apply_pod(pod)
    binder = RecordingBinder()
    binder.fail = "patching annotations: 500 etcd timeout"
    error = await run_bind(cluster, binder, request_for(pod))
    assert error == "binding default/p to n1 failed: patching annotations: 500 etcd timeout"
    assert cluster.nodes["n1"].used == [0, 0]
    assert not cluster.reserved


async def test_a_cancelled_bind_releases_the_reservation() -> None:
    cluster = make_cluster(make_node("n1"))
    pod = make_pod("p", gpu_mem=6)
    cluster.apply_pod(pod)
    started = asyncio.Event()

    class Hanging:
        async def bind(self, pod: dict[str, Any], node: str, annotations: dict[str, str]) -> None:
            started.set()
            await asyncio.sleep(3600)

    task = asyncio.create_task(run_bind(cluster, Hanging(), request_for(pod)))
    await started.wait()
    assert cluster.nodes["n1"].used == [6, 0]
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert cluster.nodes["n1"].used == [0, 0]


async def test_a_pod_that_no_longer_fits_is_refused_with_the_reason() -> None:
    cluster = make_cluster(make_node("n1", gpus=1, mem=16))
    first, second = make_pod("a", gpu_mem=10), make_pod("b", gpu_mem=10)
    cluster.apply_pod(first)
    cluster.apply_pod(second)
    binder = FileBinder(cluster, [first, second])
    assert await run_bind(cluster, binder, request_for(first)) == ""
    error = await run_bind(cluster, binder, request_for(second))
    assert error == "pod default/b no longer fits on n1: needs 10 GiB on one GPU; largest free is 6 GiB (GPU 0 of 1)"
    assert cluster.nodes["n1"].used == [10]


async def test_a_pod_known_only_from_its_filter_request_can_be_bound() -> None:
    cluster = make_cluster(make_node("n1"))
    pod = make_pod("fresh", gpu_mem=5)
    recent = RecentPods()
    recent.remember(pod)
    assert await run_bind(cluster, FileBinder(cluster, []), request_for(pod), recent) == ""
    record = cluster.pods[pod["metadata"]["uid"]]
    assert (record.node_name, record.allocation.indexes) == ("n1", (0,))  # type: ignore[union-attr]
    assert cluster.hold_of(record.uid).observed  # type: ignore[union-attr]


async def test_a_pod_never_seen_is_refused() -> None:
    error = await run_bind(make_cluster(make_node("n1")), RecordingBinder(), BindRequest("p", "ns", "u-1", "n1"))
    assert error == "pod ns/p (uid u-1) is unknown: not in the extender's cache and never filtered"


async def test_a_node_the_cache_does_not_know_is_refused_even_for_a_pod_without_gpu_demand() -> None:
    cluster = make_cluster(make_node("n1"))
    pod = make_pod("plain", gpu_mem=None)
    cluster.apply_pod(pod)
    binder = RecordingBinder()
    assert await run_bind(cluster, binder, request_for(pod, "ghost")) == "node ghost is not in the extender's cache"
    assert binder.calls == []


async def test_a_known_uid_under_another_name_is_refused_not_answered_as_bound() -> None:
    cluster = make_cluster(make_node("n1"))
    pod = make_pod("p", gpu_mem=6)
    cluster.apply_pod(pod)
    binder = RecordingBinder()
    assert await run_bind(cluster, binder, request_for(pod)) == ""
    uid = pod["metadata"]["uid"]
    impostor = BindRequest("other", "default", uid, "n1")
    assert await run_bind(cluster, binder, impostor) == f"pod uid {uid} is default/p, not default/other"
    elsewhere = BindRequest("p", "team-b", uid, "n1")
    assert await run_bind(cluster, binder, elsewhere) == f"pod uid {uid} is default/p, not team-b/p"
    assert len(binder.calls) == 1


async def test_the_outcome_tells_success_refusal_and_failure_apart() -> None:
    cluster = make_cluster(make_node("n1", gpus=1, mem=8))
    pod, big = make_pod("p", gpu_mem=6), make_pod("big", gpu_mem=6)
    cluster.apply_pod(pod)
    cluster.apply_pod(big)
    binder = RecordingBinder()
    context = BindContext(cluster, Ledger(cluster, 60, FakeClock()), placer_for(cluster), binder, RecentPods())
    assert (await bind(request_for(pod), context)).outcome is Outcome.BOUND
    cluster.apply_pod({**pod, "spec": {**pod["spec"], "nodeName": "n1"}})
    assert (await bind(request_for(pod), context)).outcome is Outcome.ALREADY_BOUND
    assert (await bind(request_for(big), context)).outcome is Outcome.REFUSED
    binder.fail = "the API said no"
    cluster.apply_pod(big, deleted=True)
    cluster.apply_pod(make_pod("small", gpu_mem=1))
    small = next(record for record in cluster.pods.values() if record.name == "small")
    failed = await bind(BindRequest("small", "default", small.uid, "n1"), context)
    assert (failed.outcome, failed.ok) == (Outcome.FAILED, False)
    assert cluster.nodes["n1"].used == [6], "the failed write released its reservation"


async def test_a_pod_without_gpu_demand_is_bound_without_annotations() -> None:
    cluster = make_cluster(make_node("n1"))
    pod = make_pod("plain", gpu_mem=None)
    cluster.apply_pod(pod)
    binder = RecordingBinder()
    assert await run_bind(cluster, binder, request_for(pod)) == ""
    assert binder.calls == [(pod["metadata"]["uid"], "n1", {})]
    assert cluster.nodes["n1"].used == [0, 0]


async def test_a_gpushare_pod_asking_several_gpus_is_refused_and_nothing_is_written_or_reserved() -> None:
    """Its filter refused every node; a bind that comes all the same is refused for the same reason."""
    cluster = make_cluster(make_node("n1", gpus=2, mem=16))
    pod = make_pod("wide", gpu_mem=20, gpus=2)
    cluster.apply_pod(pod)
    binder = RecordingBinder()
    error = await run_bind(cluster, binder, request_for(pod))
    assert error == (
        "pod default/wide: asks 2 GPUs (aliyun.com/gpu-count: 2); gpushare's device plugin gives a pod one GPU at "
        "most: its container would start without a GPU"
    )
    assert binder.calls == [] and not cluster.reserved
    assert cluster.nodes["n1"].used == [0, 0]


async def test_with_bind_a_gpushare_pod_asking_several_gpus_is_bound_on_them_recorded_in_the_indexes_alone() -> None:
    """20 GiB over 2 GPUs: ceil(20 / 2) = 10 on each; no ALIYUN_COM_GPU_MEM_IDX, which names one GPU."""
    profile = Profile(several_gpus=SeveralGpus.BIND)
    cluster = make_cluster(make_node("n1", gpus=2, mem=16), profile=profile)
    pod = make_pod("wide", gpu_mem=20, gpus=2)
    cluster.apply_pod(pod)
    binder = RecordingBinder()
    assert await run_bind(cluster, binder, request_for(pod)) == ""
    [(_, _, annotations)] = binder.calls
    assert annotations["gpu-extender.io/device-indexes"] == "0,1"
    assert "ALIYUN_COM_GPU_MEM_IDX" not in annotations
    assert cluster.nodes["n1"].used == [10, 10]


def test_recent_pods_forget_the_oldest_beyond_their_limit() -> None:
    recent = RecentPods(limit=2)
    pods = [make_pod(f"p{i}") for i in range(3)]
    for pod in pods:
        recent.remember(pod)
    assert recent.get(pods[0]["metadata"]["uid"]) is None
    assert len(recent) == 2


def test_slim_pod_keeps_identity_and_resources_only() -> None:
    pod = make_pod("p", gpu_mem=4)
    pod["spec"]["volumes"] = [{"name": "big"}]
    slim = slim_pod(pod)
    assert slim["spec"] == {"containers": [{"name": "main", "resources": pod["spec"]["containers"][0]["resources"]}]}
    assert slim["metadata"]["uid"] == pod["metadata"]["uid"]


async def test_a_second_bind_of_a_pod_to_another_node_while_the_first_runs_is_refused() -> None:
    """kube-scheduler gives up on a bind after its timeout and may bind the pod elsewhere while the first
    bind is still running: the second must not undo the first's reservation, which may yet succeed."""
    cluster = make_cluster(make_node("a", gpus=1, mem=16), make_node("b", gpus=1, mem=16))
    pod = make_pod("p", gpu_mem=10)
    cluster.apply_pod(pod)
    first_started, release = asyncio.Event(), asyncio.Event()

    class SlowApi(FileBinder):
        async def bind(self, pod: dict[str, Any], node: str, annotations: dict[str, str]) -> None:
            if node == "a":
                first_started.set()
                await release.wait()
            await super().bind(pod, node, annotations)

    ledger, recent, policy = Ledger(cluster, 60, FakeClock()), RecentPods(), PolicyConfig()
    binder = SlowApi(cluster, [pod])
    first = asyncio.create_task(bind_error(request_for(pod, "a"), cluster, ledger, policy, binder, recent))
    await first_started.wait()
    second = await bind_error(request_for(pod, "b"), cluster, ledger, policy, binder, recent)
    assert second == "pod default/p: a bind to a is still running"
    assert cluster.nodes["a"].used == [10]  # the first's reservation stands
    release.set()
    assert await first == ""
    assert (cluster.nodes["a"].used, cluster.nodes["b"].used) == ([10], [0])
    other = make_pod("q", gpu_mem=10)
    cluster.apply_pod(other)
    assert "no longer fits" in await bind_error(request_for(other, "a"), cluster, ledger, policy, binder, recent)
    assert not cluster.overcommitted()


async def test_binds_to_one_node_write_at_once_and_never_overcommit() -> None:
    """Binpack sends consecutive pods to one node: their decisions and reservations are taken in turn, but
    their writes overlap, each holding the memory its reservation took; a third finds what is left."""
    cluster = make_cluster(make_node("n1", gpus=1, mem=16))
    pods = [make_pod(f"p{i}", gpu_mem=6) for i in range(3)]  # 16 GiB: room for two of them
    for pod in pods:
        cluster.apply_pod(pod)
    writing: list[str] = []
    release = asyncio.Event()

    class HeldApi(FileBinder):
        async def bind(self, pod: dict[str, Any], node: str, annotations: dict[str, str]) -> None:
            writing.append(pod["metadata"]["name"])
            await release.wait()
            await super().bind(pod, node, annotations)

    ledger, recent, policy = Ledger(cluster, 60, FakeClock()), RecentPods(), PolicyConfig()
    binder = HeldApi(cluster, pods)
    binds = [asyncio.create_task(bind_error(request_for(pod), cluster, ledger, policy, binder, recent)) for pod in pods]
    for _ in range(10):
        await asyncio.sleep(0)
    assert binds[2].done(), "the third is answered while the first two are still writing"
    assert binds[2].result().startswith("pod default/p2 no longer fits on n1")
    assert writing == ["p0", "p1"]
    assert cluster.nodes["n1"].used == [12] and not cluster.overcommitted()
    release.set()
    assert await asyncio.gather(*binds[:2]) == ["", ""]
    assert cluster.nodes["n1"].used == [12] and not cluster.overcommitted()


async def test_a_second_bind_of_a_pod_to_the_same_node_waits_for_the_first_then_finds_it_bound() -> None:
    """The scheduler may bind a pod again to the same node while the first bind is still writing: the second
    waits for the first and succeeds without writing again."""
    cluster = make_cluster(make_node("n1", gpus=1, mem=16))
    pod = make_pod("p", gpu_mem=10)
    cluster.apply_pod(pod)
    started, release = asyncio.Event(), asyncio.Event()
    writes: list[str] = []

    class HeldApi(FileBinder):
        async def bind(self, pod: dict[str, Any], node: str, annotations: dict[str, str]) -> None:
            writes.append(node)
            started.set()
            await release.wait()
            await super().bind(pod, node, annotations)

    ledger, recent, policy = Ledger(cluster, 60, FakeClock()), RecentPods(), PolicyConfig()
    binder = HeldApi(cluster, [pod])
    first = asyncio.create_task(bind_error(request_for(pod), cluster, ledger, policy, binder, recent))
    await started.wait()
    second = asyncio.create_task(bind_error(request_for(pod), cluster, ledger, policy, binder, recent))
    await asyncio.sleep(0)
    assert not second.done()
    release.set()
    assert (await first, await second) == ("", "")
    assert writes == ["n1"]
    assert cluster.nodes["n1"].used == [10]


async def test_annotations_left_by_a_failed_bind_do_not_reserve_again() -> None:
    """The patch succeeded, the binding did not: the reservation is released, and the watch event that
    shows the annotated (still unbound) pod must not bring it back until the TTL."""
    cluster = make_cluster(make_node("n1", gpus=1, mem=16))
    pod = make_pod("p", gpu_mem=10)
    cluster.apply_pod(pod)
    written: dict[str, str] = {}

    class PatchThenFail:
        async def bind(self, pod: dict[str, Any], node: str, annotations: dict[str, str]) -> None:
            written.update(annotations)
            raise BindError("creating the binding: 500")

    assert "failed" in await run_bind(cluster, PatchThenFail(), request_for(pod))
    annotated = {**pod, "metadata": {**pod["metadata"], "annotations": written}}
    cluster.apply_pod(annotated)  # the patch, seen by the watch
    assert cluster.nodes["n1"].used == [0]
    assert not cluster.reserved


class Lease:
    """What a bind's guard reads: the seconds left, one answer per read. `renewals` answers say the lease was
    renewed (the same seconds again), then it runs out (0). `read_enough` is set at the read that gives the
    last renewal, so a binder can finish only after its deadline has come due and been read again."""

    def __init__(self, renewals: int, seconds: float = 0.01) -> None:
        self.answers = [seconds] * renewals
        self.reads = 0
        self.read_enough = asyncio.Event()

    def time_left(self) -> float:
        self.reads += 1
        if not self.answers:
            return 0.0
        if len(self.answers) == 1:
            self.read_enough.set()
        return self.answers.pop(0)


class WaitingBinder(RecordingBinder):
    """Writes, then answers once `done` is set (never, when it is not)."""

    def __init__(self, done: asyncio.Event) -> None:
        super().__init__()
        self.done = done

    async def bind(self, pod: dict[str, Any], node: str, annotations: dict[str, str]) -> None:
        self.calls.append((pod["metadata"]["uid"], node, annotations))
        await self.done.wait()


async def guarded_bind(cluster: Any, binder: Any, request: BindRequest, lease: Lease) -> BindOutcome:
    context = BindContext(
        cluster,
        Ledger(cluster, 60, FakeClock()),
        placer_for(cluster),
        binder,
        RecentPods(),
        guard=Guard(time_left=lease.time_left),
    )
    return await bind(request, context)


async def test_a_binding_outlasting_the_time_left_at_its_start_is_not_cut_while_the_lease_is_renewed() -> None:
    """Issue 19: the deadline was fixed when the write began, so a slow binding failed on a replica whose lease
    was renewed all along. Its deadline comes due three times here; each time the lease has been renewed."""
    cluster = make_cluster(make_node("n1"))
    pod = make_pod("p", gpu_mem=6)
    cluster.apply_pod(pod)
    lease = Lease(renewals=5)
    binder = WaitingBinder(lease.read_enough)
    outcome = await guarded_bind(cluster, binder, request_for(pod), lease)
    assert outcome.outcome is Outcome.BOUND and outcome.error == ""
    assert lease.reads == 5  # the refusal check, the write's start, and three deadlines that came due


async def test_a_binding_under_way_when_the_lease_runs_out_is_cut_off_and_keeps_its_reservation() -> None:
    cluster = make_cluster(make_node("n1"))
    pod = make_pod("p", gpu_mem=6)
    cluster.apply_pod(pod)
    binder = WaitingBinder(asyncio.Event())  # the API never answers
    outcome = await guarded_bind(cluster, binder, request_for(pod), Lease(renewals=3))
    assert outcome.outcome is Outcome.UNCERTAIN and "leadership ran out while the binding" in outcome.error
    hold = cluster.hold_of(pod["metadata"]["uid"])
    assert hold is not None and hold.state is HoldState.UNCERTAIN and cluster.nodes["n1"].used == [6, 0]


async def test_no_binding_starts_once_the_lease_has_run_out() -> None:
    cluster = make_cluster(make_node("n1"))
    pod = make_pod("p", gpu_mem=6)
    cluster.apply_pod(pod)
    binder = RecordingBinder()
    outcome = await guarded_bind(cluster, binder, request_for(pod), Lease(renewals=0))
    assert outcome.outcome is Outcome.REFUSED and "lease has run out" in outcome.error
    assert binder.calls == [] and not cluster.reserved
