"""The live source as the service uses it (API double): readiness and health, leader election across two
replicas, and recovery after a restart from the API alone."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from devtools.harness import free_port
from extender.app import kube_service
from extender.core.cache import Cache
from extender.core.holds import HoldState
from extender.core.ledger import Ledger
from extender.core.placement.config import PolicyConfig
from extender.core.recheck import Answer
from extender.core.requeue import WATCH_LAG, Requeue
from extender.service.context import Service
from extender.settings import LeaseTimings, Settings
from extender.sources.kube.client import KubeClient
from extender.sources.kube.informer import Informer, WatchOptions
from extender.sources.kube.source import KubeOptions, KubeSource
from extender.sources.kube.writes import LEADER_LABEL, LeaderLabel, Requeuer
from tests.apidouble import ApiDouble
from tests.builders import (
    PROFILE,
    FakeClock,
    bind_body,
    bound_pod,
    cache_differences,
    filter_body,
    make_node,
    make_pod,
    make_quota,
    placer_for,
    quotas_of,
)
from tests.conftest import ClientFor, eventually, make_service

FAST = LeaseTimings(lease_duration=1.0, renew_deadline=0.6, retry_period=0.1)


class Replica:
    """One extender process's worth: a cache, a ledger, the live source and the service over them."""

    def __init__(self, kube: KubeClient, name: str, leader_elect: bool, clock: Callable[[], float]) -> None:
        self.cluster = Cache(PROFILE)
        options = KubeOptions(
            identity=name,
            watch=WatchOptions(page_size=50, inactivity=5.0),
            leader_elect=leader_elect,
            lease_namespace="gpu-extender",
            timings=FAST,
        )
        quotas = quotas_of(self.cluster)
        self.source = KubeSource(kube, self.cluster, quotas, options)
        self.ledger = Ledger(self.cluster, 60.0, clock, quotas)
        self.service = Service(
            cache=self.cluster,
            ledger=self.ledger,
            placer=placer_for(self.cluster, PolicyConfig()),
            quotas=quotas,
            source=self.source,
            requeue=Requeue(self.cluster, None, quotas=quotas),
        )


class Replicas:
    def __init__(self, kube: KubeClient) -> None:
        self.kube = kube
        self.clock = FakeClock()
        self.running: list[Replica] = []

    async def start(self, name: str = "r1", leader_elect: bool = False) -> Replica:
        replica = Replica(self.kube, name, leader_elect, self.clock)
        await replica.source.start()
        self.running.append(replica)
        return replica

    async def stop(self, replica: Replica) -> None:
        self.running.remove(replica)
        await replica.source.stop()


@pytest.fixture
async def replicas(kube: KubeClient) -> AsyncIterator[Replicas]:
    group = Replicas(kube)
    yield group
    for replica in list(group.running):
        await group.stop(replica)


def seed(api: ApiDouble) -> None:
    api.add_node(make_node("n1", gpus=2, mem=16))
    api.add_node(make_node("n2", gpus=1, mem=16))


async def test_ready_only_after_the_first_lists_and_healthy_throughout(
    api: ApiDouble, replicas: Replicas, client_for: ClientFor
) -> None:
    seed(api)
    api.fail("GET", "/api/v1/pods", status=503, times=3)
    replica = await replicas.start()
    client = await client_for(replica.service)
    response = await client.get("/readyz")
    assert response.status == 503
    assert "cache has not been filled" in (await response.json())["Error"]
    assert (await client.get("/healthz")).status == 200
    pod = api.add_pod(make_pod("p", gpu_mem=4))
    refused = await (await client.post("/filter", filter_body(pod, ["n1"]))).json()
    assert "not ready" in refused["Error"]
    await asyncio.wait_for(replica.source.synced(), 5.0)
    assert (await client.get("/readyz")).status == 200


async def test_healthz_fails_when_a_loop_stops(api: ApiDouble, replicas: Replicas, client_for: ClientFor) -> None:
    seed(api)
    replica = await replicas.start()

    def broken(pods: list[Any]) -> None:
        raise RuntimeError("a bug in the cache")

    replica.source.pods.replace = broken
    client = await client_for(replica.service)
    await eventually(lambda: replica.source.stopped_loop())
    response = await client.get("/healthz")
    assert response.status == 500
    assert "pods informer loop stopped: RuntimeError: a bug in the cache" in (await response.json())["Error"]


async def test_of_two_replicas_one_is_ready_and_binds_and_the_other_takes_over(
    api: ApiDouble, replicas: Replicas, client_for: ClientFor
) -> None:
    seed(api)
    first = await replicas.start("r1", leader_elect=True)
    await eventually(first.source.ready)
    second = await replicas.start("r2", leader_elect=True)
    await asyncio.wait_for(second.source.synced(), 5.0)
    elector = second.source.elector
    await eventually(lambda: elector is not None and elector.holder == "r1", what="the standby reading the lease")
    one, two = await client_for(first.service), await client_for(second.service)
    assert (await one.get("/readyz")).status == 200
    standby = await two.get("/readyz")
    assert standby.status == 503 and "held by r1" in (await standby.json())["Error"]

    pod = api.add_pod(make_pod("p", gpu_mem=4))
    await eventually(lambda: pod["metadata"]["uid"] in second.cluster.pods)
    refused = await (await two.post("/bind", bind_body(pod, "n1"))).json()
    assert "not the leader" in refused["Error"]
    stored = api.pod("default", "p")
    assert stored is not None and "nodeName" not in stored["spec"]

    await replicas.stop(first)  # gives the lease up
    await eventually(second.source.ready, what="the standby taking over")
    assert (await (await two.post("/bind", bind_body(pod, "n1"))).json())["Error"] == ""
    await eventually(lambda: not cache_differences(second.cluster, api.nodes(), api.pods()))


async def test_a_new_leader_relists_before_it_is_ready(api: ApiDouble, replicas: Replicas) -> None:
    seed(api)
    api.fail("GET", "/api/v1/pods", mode="slow", delay=0.5)  # the lease is taken while the first list runs
    replica = await replicas.start("r1", leader_elect=True)
    await eventually(lambda: replica.source.elector and replica.source.elector.leading, what="leading")
    await asyncio.wait_for(replica.source.synced(), 5.0)
    assert not replica.source.ready()  # that list may have read the API before the lease was ours
    await eventually(replica.source.ready)
    assert replica.source.pods.lists == 2


async def test_after_a_restart_bound_pods_are_counted_once_from_the_api_alone(
    api: ApiDouble, replicas: Replicas, client_for: ClientFor
) -> None:
    seed(api)
    before = await replicas.start("r1")
    await asyncio.wait_for(before.source.synced(), 5.0)
    client = await client_for(before.service)
    pods = [api.add_pod(make_pod(f"p{i}", gpu_mem=8)) for i in range(4)]
    await eventually(lambda: len(before.cluster.pods) == 4)
    for pod in pods:
        assert (await (await client.post("/bind", bind_body(pod, "n1"))).json())["Error"] == ""
    used = list(before.cluster.nodes["n1"].used)
    await replicas.stop(before)

    after = await replicas.start("r2")
    await asyncio.wait_for(after.source.synced(), 5.0)
    assert after.cluster.nodes["n1"].used == used == [16, 16]
    assert after.cluster.reserved == {}
    assert cache_differences(after.cluster, api.nodes(), api.pods()) == []
    late = api.add_pod(make_pod("late", gpu_mem=8))
    await eventually(lambda: late["metadata"]["uid"] in after.cluster.pods)
    client = await client_for(after.service)
    reply = await (await client.post("/filter", filter_body(late, ["n1", "n2"]))).json()
    assert reply["NodeNames"] == ["n2"]


async def test_a_pod_annotated_but_never_bound_holds_its_memory_until_the_ttl(
    api: ApiDouble, replicas: Replicas, client_for: ClientFor
) -> None:
    """What a crash between "write the annotations" and "bind" leaves behind (gpushare's two-step protocol; ours
    is one Binding, so it only comes from such a tool, or a binding that never landed)."""
    seed(api)
    clock = replicas.clock
    orphan = make_pod("orphan", gpu_mem=16, node="n2", indexes=(0,), bound=False, assume_time=clock.now)
    api.add_pod(orphan)
    replica = await replicas.start()
    await asyncio.wait_for(replica.source.synced(), 5.0)
    assert replica.cluster.nodes["n2"].used == [16] and len(replica.cluster.reserved) == 1
    client = await client_for(replica.service)
    newcomer = api.add_pod(make_pod("newcomer", gpu_mem=16))
    await eventually(lambda: newcomer["metadata"]["uid"] in replica.cluster.pods)
    assert (await (await client.post("/filter", filter_body(newcomer, ["n2"]))).json())["NodeNames"] == []

    clock.advance(61)  # past the 60 s TTL
    assert [hold.allocation.pod for hold in replica.ledger.expire()] == ["default/orphan"]
    assert replica.cluster.nodes["n2"].used == [0]
    replica.source.pods.request_relist()  # its annotations alone never reserve again, even on a relist
    await eventually(lambda: replica.source.pods.lists >= 2)
    assert replica.cluster.nodes["n2"].used == [0]
    assert (await (await client.post("/filter", filter_body(newcomer, ["n2"]))).json())["NodeNames"] == ["n2"]


async def test_a_pod_annotated_then_bound_late_is_counted_once(api: ApiDouble, replicas: Replicas) -> None:
    seed(api)
    orphan = api.add_pod(make_pod("orphan", gpu_mem=16, node="n2", indexes=(0,), bound=False))
    replica = await replicas.start()
    await asyncio.wait_for(replica.source.synced(), 5.0)
    assert len(replica.cluster.reserved) == 1
    api.update_pod(bound_pod("orphan", "n2", (0,), 16, uid=orphan["metadata"]["uid"]))
    await eventually(lambda: not replica.cluster.reserved)
    assert replica.cluster.nodes["n2"].used == [16]
    assert cache_differences(replica.cluster, api.nodes(), api.pods()) == []


async def test_extender_serve_follows_the_api_and_gives_its_lease_up_on_sigterm(api: ApiDouble, tmp_path: Path) -> None:
    """The real command against the double, through a kubeconfig with a token."""
    seed(api)
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "double", "cluster": {"server": api.url}}],
                "users": [{"name": "extender", "user": {"token": "test-token"}}],
                "contexts": [{"name": "ctx", "context": {"cluster": "double", "user": "extender"}}],
                "current-context": "ctx",
            }
        )
    )
    port = free_port()
    env = {name: value for name, value in os.environ.items() if not name.startswith("EXTENDER_")}
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "extender",
        "serve",
        "--insecure-http",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--kubeconfig",
        str(kubeconfig),
        "--lease-namespace",
        "gpu-extender",
        "--identity",
        "cli-replica",
        env=env,
        stderr=asyncio.subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as session:

            async def ready() -> bool:
                try:
                    async with session.get(f"{url}/readyz") as response:
                        return response.status == 200
                except aiohttp.ClientError:
                    return False

            for _ in range(300):
                if await ready():
                    break
                assert process.returncode is None
                await asyncio.sleep(0.05)
            else:
                raise AssertionError("extender serve never became ready")
            pod = api.add_pod(make_pod("p", gpu_mem=4))
            for _ in range(100):  # the watch brings the pod; the filter then passes n1 and n2
                async with session.post(f"{url}/filter", data=filter_body(pod, ["n1"])) as response:
                    if (await response.json())["NodeNames"] == ["n1"]:
                        break
                await asyncio.sleep(0.02)
            async with session.post(f"{url}/bind", data=bind_body(pod, "n1")) as response:
                assert (await response.json())["Error"] == ""
        process.send_signal(signal.SIGTERM)
        _, stderr = await asyncio.wait_for(process.communicate(), 20)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    log = stderr.decode()
    assert process.returncode == 0, log
    assert "acquired leadership" in log and "released lease gpu-extender/gpu-extender" in log
    assert "Traceback" not in log
    stored = api.pod("default", "p")
    assert stored is not None and stored["spec"]["nodeName"] == "n1"
    lease = api.lease("gpu-extender", "gpu-extender")
    assert lease is not None and not lease["spec"].get("holderIdentity")


async def test_the_composed_service_reports_the_source_in_its_metrics(
    api: ApiDouble, kube: KubeClient, client_for: ClientFor
) -> None:
    seed(api)
    api.add_pod(bound_pod("a", "n1", (0,), 8))
    settings = Settings(insecure_http=True, identity="m1", lease_namespace="gpu-extender").check()
    service, source = kube_service(settings, kube)
    await source.start()
    try:
        await eventually(source.ready, what="synced and leading")
        text = await (await (await client_for(service)).get("/metrics")).text()
    finally:
        await source.stop()
    assert 'extender_lists_total{kind="pods"}' in text
    assert 'extender_cache_synced{kind="nodes"} 1.0' in text
    assert "extender_leader 1.0" in text
    assert 'extender_allocations{state="observed"} 1.0' in text


class SlowBinder:
    """Binds after a while, as an API server under load answers; records what it was asked."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.calls: list[str] = []

    async def bind(self, pod: dict[str, Any], node: str, annotations: dict[str, str]) -> None:
        self.calls.append(pod["metadata"]["name"])
        await asyncio.sleep(self.delay)


async def test_a_bind_queued_behind_a_slow_one_is_refused_once_leadership_is_lost(client_for: ClientFor) -> None:
    """Binds of two pods to one node write at once; what queues is a second bind of the same pod to the same
    node (the scheduler retrying), which asks again whether this replica may bind when its turn comes."""
    cluster = Cache(PROFILE)
    cluster.replace([make_node("n1", gpus=2, mem=16)], [])
    leading = {"now": True}
    binder = SlowBinder(0.3)
    service = make_service(
        cluster, binder, ready=lambda: leading["now"], why_not_ready=lambda: "extender is not the leader"
    )
    client = await client_for(service)
    pod = make_pod("p1", gpu_mem=4)
    await client.post("/filter", filter_body(pod, ["n1"]))
    replies = [asyncio.create_task(client.post("/bind", bind_body(pod, "n1"))) for _ in range(2)]
    await eventually(lambda: binder.calls == ["p1"])
    leading["now"] = False  # the lease is lost while the first binding is under way and the second waits for it
    results = [await (await reply).json() for reply in replies]
    assert sorted(result["Error"] for result in results)[0] == ""
    assert any("not the leader" in result["Error"] for result in results)
    assert binder.calls == ["p1"]


async def test_a_binding_still_under_way_when_leadership_runs_out_keeps_its_reservation(
    client_for: ClientFor,
) -> None:
    cluster = Cache(PROFILE)
    cluster.replace([make_node("n1", gpus=1, mem=16)], [])
    loop = asyncio.get_running_loop()
    runs_out = loop.time() + 0.2  # and is never renewed
    service = make_service(cluster, SlowBinder(5.0), binding_time_left=lambda: max(0.0, runs_out - loop.time()))
    client = await client_for(service)
    pod = make_pod("p", gpu_mem=4)
    await client.post("/filter", filter_body(pod, ["n1"]))
    reply = await (await client.post("/bind", bind_body(pod, "n1"))).json()
    assert "leadership ran out" in reply["Error"]
    hold = cluster.hold_of(pod["metadata"]["uid"])
    assert hold is not None and hold.state is HoldState.UNCERTAIN and cluster.nodes["n1"].used == [4]


async def test_the_leader_labels_its_pod_and_the_standby_takes_the_label_over(
    api: ApiDouble, kube: KubeClient, client_for: ClientFor
) -> None:
    """The Service selects gpu-extender.io/leader=true; every replica with a full cache is Ready (/synced)."""
    seed(api)
    for name in ("pod-a", "pod-b"):
        add_extender_pod(api, name)
    sources = []
    for name in ("pod-a", "pod-b"):
        settings = Settings(
            insecure_http=True,
            identity=name,
            lease_namespace="gpu-extender",
            pod_name=name,
            lease_duration=1.0,
            renew_deadline=0.6,
            retry_period=0.1,
        ).check()
        service, source = kube_service(settings, kube)
        await source.start()
        sources.append((service, source))

    def labelled() -> list[str]:
        return [
            name
            for name in ("pod-a", "pod-b")
            if ((api.pod("gpu-extender", name) or {}).get("metadata", {}).get("labels") or {}).get(LEADER_LABEL)
            == "true"
        ]

    try:
        await eventually(lambda: len(labelled()) == 1, what="one labelled leader")
        leader = labelled()[0]
        first, second = sources if leader == "pod-a" else sources[::-1]
        for service, _ in sources:
            synced = await (await (await client_for(service)).get("/synced")).json()
            assert synced["status"] == "synced" and synced["leader"] == (service is first[0])
        await first[1].stop()  # SIGTERM: label removed, lease released
        sources.remove(first)
        await eventually(lambda: labelled() == [second[1].options.pod_name], what="the label moving over")
    finally:
        for _, source in sources:
            await source.stop()
    assert labelled() == []


async def test_a_label_patch_cut_off_by_stop_is_taken_as_applied_and_removed() -> None:
    """A stop cancels the label loop while its patch is out; the API server may have applied it anyway (the
    answer is what never came back). The removal that follows must be written, not skipped as a no-change
    (seen in CI: the standby, just promoted, stopped with its label still on)."""
    applied: list[Any] = []
    answered = asyncio.Event()

    class ApiThatAppliesThenHangs:
        """The server side of a patch done, its response still on the way."""

        async def merge_patch(self, path: str, body: Any) -> Any:
            applied.append(body["metadata"]["labels"][LEADER_LABEL])
            if len(applied) == 1:
                await answered.wait()
            return {}

    label = LeaderLabel(ApiThatAppliesThenHangs(), "gpu-extender", "pod-a", lambda: True, period=0.1)  # type: ignore[arg-type]
    label.labelled = False
    running = asyncio.create_task(label.run())
    await eventually(lambda: applied == ["true"], what="the patch sent")
    running.cancel()
    await asyncio.gather(running, return_exceptions=True)
    await label.reconcile(False)
    assert applied == ["true", None] and label.labelled is False


async def test_a_preemptor_s_filter_reads_from_the_api_the_victims_the_watch_has_not_shown_gone(
    api: ApiDouble, replicas: Replicas, client_for: ClientFor
) -> None:
    """kube-scheduler retries a preemptor as soon as its informer shows the victim deleted; ours may show it
    later. The watch is held back here (dropped, every new one hangs) while the API changes under it."""
    api.add_node(make_node("n1", gpus=4, mem=16))
    for index in range(4):
        api.add_pod(bound_pod(f"low-{index}", "n1", (index,), 16))
    replica = await replicas.start()
    await asyncio.wait_for(replica.source.synced(), 5.0)
    source, cluster = replica.source, replica.cluster
    api.fail("GET", "/api/v1/pods", mode="hang", times=1000)
    api.drop_watches()
    await eventually(lambda: not source.pods.current or api.open_watches == 0, what="the watch held back")

    api.delete_pod("default", "low-0")
    await asyncio.sleep(0.1)
    assert cluster.nodes["n1"].used == [16, 16, 16, 16], "the watch has not shown the deletion"
    client = await client_for(replica.service)
    preemptor = make_pod("high", gpu_mem=16)
    preemptor["status"] = {"nominatedNodeName": "n1"}
    preemptor["spec"]["priority"] = 1000
    reply = await (await client.post("/filter", filter_body(preemptor, ["n1"]))).json()
    assert reply["NodeNames"] == ["n1"], reply
    assert cluster.nodes["n1"].used == [16, 16, 16, 16], "low-0's GPU freed, and held for high (core/assume.py)"
    assumed = cluster.hold_of(preemptor["metadata"]["uid"])
    assert assumed is not None and assumed.state is HoldState.ASSUMED and assumed.allocation.indexes == (0,)
    assert replica.ledger.unassume(preemptor["metadata"]["uid"]), "its bind never comes here"

    records = {record.name: record for record in cluster.pods.values()}
    api.delete_pod("default", "low-1")
    api.add_pod(make_pod("low-1", gpu_mem=16))  # the same name again: another pod
    finished = api.pod("default", "low-2")
    assert finished is not None
    finished["status"]["phase"] = "Succeeded"
    api.update_pod(finished)
    stale = [records["low-1"], records["low-2"], records["low-3"]]
    assert await source.recheck(stale) == Answer(gone=2, unanswered=0)
    assert cluster.nodes["n1"].used == [0, 0, 0, 16], "a new pod of the same name, and a finished one, hold nothing"

    api.fail("GET", "/api/v1/namespaces/default/pods/low-3", status=500)
    assert await source.recheck([records["low-3"]]) == Answer(gone=0, unanswered=1)
    api.fail("GET", "/api/v1/namespaces/default/pods/low-3", mode="hang")
    source.recheck_timeout = 0.2
    assert await source.recheck([records["low-3"]]) == Answer(gone=0, unanswered=1)

    async def broken(path: str, params: Any = None) -> Any:
        raise RuntimeError("a bug in the client")

    source.client.get = broken  # type: ignore[method-assign]
    assert await source.recheck([records["low-3"]]) == Answer(gone=0, unanswered=1), "a bug is no 500 for the filter"
    assert cluster.nodes["n1"].used == [0, 0, 0, 16]


def add_extender_pod(api: ApiDouble, name: str) -> None:
    """A running pod of the extender's own, in its namespace (where it labels and annotates itself)."""
    api.add_pod({**make_pod(name, gpu_mem=None, namespace="gpu-extender"), "status": {"phase": "Running"}})


async def hold_watch_back(api: ApiDouble, informer: Informer[Any], path: str) -> None:
    """Cut the watches, and every new one on `path` at once (then backed off), until `api.clear_faults()`."""
    api.fail("GET", path, mode="drop", times=1000)
    api.drop_watches()
    await eventually(lambda: not informer.current, what=f"the {informer.kind.name} watch held back")


async def requeue_source(api: ApiDouble, kube: KubeClient) -> tuple[Service, KubeSource]:
    add_extender_pod(api, "self")
    settings = Settings(
        insecure_http=True, identity="self", lease_namespace="gpu-extender", pod_name="self", leader_elect=False
    ).check()
    service, source = kube_service(settings, kube)
    await source.start()
    await eventually(source.ready, what="synced")
    return service, source


def requeue_requested(api: ApiDouble) -> bool:
    annotations = (api.pod("gpu-extender", "self") or {}).get("metadata", {}).get("annotations") or {}
    return "gpu-extender.io/requeue-requested" in annotations


async def test_a_pod_refused_while_the_watch_was_late_is_retried_by_annotating_the_extenders_pod(
    api: ApiDouble, kube: KubeClient, client_for: ClientFor
) -> None:
    """The watch is held back while a GPU pod is deleted; kube-scheduler, which saw the deletion, asks about the
    waiting pod and is refused. When the deletion reaches the cache, the extender annotates its own pod: the
    update of an assigned pod on which kube-scheduler retries the pods an extender rejected (e2e tier)."""
    api.add_node(make_node("n1", gpus=1, mem=16))
    api.add_pod(bound_pod("running", "n1", (0,), 16))
    service, source = await requeue_source(api, kube)
    try:
        client = await client_for(service)
        await hold_watch_back(api, source.pods, "/api/v1/pods")
        api.delete_pod("default", "running")
        waiting = api.add_pod(make_pod("waiting", gpu_mem=16))
        reply = await (await client.post("/filter", filter_body(waiting, ["n1"]))).json()
        assert reply["NodeNames"] == [], "the cache still counts the deleted pod"
        assert source.requeuer is not None and source.requeuer.written == 0

        api.clear_faults()
        await eventually(lambda: (api.pod("gpu-extender", "self") or {})["metadata"].get("annotations"), what="asked")
        annotations = (api.pod("gpu-extender", "self") or {})["metadata"]["annotations"]
        assert set(annotations) == {"gpu-extender.io/requeue-requested"}
        assert service.cache.nodes["n1"].used == [0]
        metrics = await (await client.get("/metrics")).text()
        assert "extender_requeue_requests_total 1.0" in metrics
    finally:
        await source.stop()


async def test_requests_to_retry_are_written_at_most_once_a_period_and_none_is_lost(
    api: ApiDouble, kube: KubeClient
) -> None:
    add_extender_pod(api, "self")
    requeuer = Requeuer(kube, "gpu-extender", "self", period=0.3)
    task = asyncio.create_task(requeuer.run())
    try:
        requeuer.request("first")
        await eventually(lambda: requeuer.written == 1, what="the first write")
        first = api.pod("gpu-extender", "self")
        for reason in ("second", "third", "fourth"):  # during the pause: one more write, at its end
            requeuer.request(reason)
        await asyncio.sleep(0.1)
        assert requeuer.written == 1
        await eventually(lambda: requeuer.written == 2, what="the write after the pause")
        await asyncio.sleep(0.4)
        assert requeuer.written == 2
        last = api.pod("gpu-extender", "self")
        assert first is not None and last is not None
        stamps = [pod["metadata"]["annotations"]["gpu-extender.io/requeue-requested"] for pod in (first, last)]
        assert stamps[0] < stamps[1]
        api.delete_pod("gpu-extender", "self")
        requeuer.request("gone")  # a failed write is logged, and the loop goes on
        await asyncio.sleep(0.1)
        assert requeuer.written == 2 and not task.done()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_deletion_that_arrives_by_a_relist_after_a_long_gap_still_asks_for_a_retry(
    api: ApiDouble, kube: KubeClient, client_for: ClientFor
) -> None:
    """The watch is down for longer than a late event's allowance (`WATCH_LAG`): the pod refused during the gap
    counts, and the deletion comes by the relist that ends it (the history was compacted meanwhile)."""
    api.add_node(make_node("n1", gpus=1, mem=16))
    api.add_pod(bound_pod("running", "n1", (0,), 16))
    service, source = await requeue_source(api, kube)
    try:
        client = await client_for(service)
        await hold_watch_back(api, source.pods, "/api/v1/pods")
        api.delete_pod("default", "running")
        waiting = api.add_pod(make_pod("waiting", gpu_mem=16))
        assert (await (await client.post("/filter", filter_body(waiting, ["n1"]))).json())["NodeNames"] == []
        await asyncio.sleep(WATCH_LAG + 0.2)
        api.compact()
        lists = source.pods.lists
        api.clear_faults()
        await eventually(lambda: source.pods.lists > lists, what="the relist")
        await eventually(lambda: requeue_requested(api), what="a retry asked")
        assert service.cache.nodes["n1"].used == [0]
    finally:
        await source.stop()


async def test_a_node_the_cache_learns_of_late_asks_for_a_retry(
    api: ApiDouble, kube: KubeClient, client_for: ClientFor
) -> None:
    """A node added (the cluster autoscaler's new GPU node) that kube-scheduler sees before our nodes watch."""
    api.add_node(make_node("n1", gpus=1, mem=16))
    api.add_pod(bound_pod("running", "n1", (0,), 16))
    service, source = await requeue_source(api, kube)
    try:
        client = await client_for(service)
        await hold_watch_back(api, source.nodes, "/api/v1/nodes")
        api.add_node(make_node("n2", gpus=1, mem=16))
        waiting = api.add_pod(make_pod("waiting", gpu_mem=16))
        reply = await (await client.post("/filter", filter_body(waiting, ["n1", "n2"]))).json()
        assert reply["NodeNames"] == [] and "not in the extender's cache" in reply["FailedNodes"]["n2"]
        assert not requeue_requested(api)
        api.clear_faults()
        await eventually(lambda: requeue_requested(api), what="a retry asked")
    finally:
        await source.stop()


async def test_a_retry_request_that_fails_in_passing_is_written_again(api: ApiDouble, kube: KubeClient) -> None:
    add_extender_pod(api, "self")
    requeuer = Requeuer(kube, "gpu-extender", "self", period=0.1)
    api.fail("PATCH", "/api/v1/namespaces/gpu-extender/pods/self", status=503)
    task = asyncio.create_task(requeuer.run())
    try:
        requeuer.request("once")
        await eventually(lambda: requeuer.written == 1, what="the write after the 503")
        assert requeue_requested(api)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_gpus_listed_in_kube_systems_unhealthy_configmap_take_no_new_pods(
    api: ApiDouble, replicas: Replicas
) -> None:
    """The gpushare extender's drop-in (pkg/cache/nodeinfo.go getUnhealthyGPUs): kube-system/unhealthy-gpu-<node>,
    key `gpus`, comma-separated indexes. The GPUs keep their memory and their pods, and take no new pod; an
    unreadable item is skipped (the Go extender marks GPU 0 instead)."""
    api.add_node(make_node("n1", gpus=2, mem=16))
    api.add_pod(make_pod("on-1", gpu_mem=4, node="n1", indexes=(1,), phase="Running"))
    api.add_configmap({"metadata": {"name": "unhealthy-gpu-n1", "namespace": "kube-system"}, "data": {"gpus": " 1, x"}})
    api.add_configmap({"metadata": {"name": "other", "namespace": "kube-system"}, "data": {"gpus": "0"}})
    replica = await replicas.start()
    await eventually(lambda: replica.source.is_synced() and not replica.cluster.nodes["n1"].devices[1].healthy)
    state = replica.cluster.nodes["n1"]
    assert [device.healthy for device in state.devices] == [True, False]
    assert state.used == [0, 4] and state.free == [16, 0], "GPU 1 keeps its pod and memory, takes none"
    assert not replica.cluster.overcommitted()
    api.delete_configmap("kube-system", "unhealthy-gpu-n1")
    await eventually(lambda: replica.cluster.nodes["n1"].devices[1].healthy, what="GPU 1 healthy again")
    assert replica.cluster.nodes["n1"].free == [16, 12]


# ---- ResourceQuotas ----------------------------------------------------------------------------------------


async def test_quotas_are_listed_and_watched_and_a_quota_raised_asks_for_a_retry(
    api: ApiDouble, kube: KubeClient, client_for: ClientFor
) -> None:
    """A pod refused for its namespace's quota waits for no cluster event kube-scheduler knows: when the quota is
    raised, the extender asks for the retry itself."""
    api.add_node(make_node("n1", gpus=2, mem=16))
    api.add_pod(bound_pod("held", "n1", (0,), 16, namespace="ml-a"))
    api.add_quota(make_quota("team", "ml-a", **{"limits.aliyun.com/gpu-mem": "16", "limits.cpu": "4"}))
    service, source = await requeue_source(api, kube)
    try:
        client = await client_for(service)
        waiting = api.add_pod(make_pod("waiting", gpu_mem=8, namespace="ml-a"))
        reply = await (await client.post("/filter", filter_body(waiting, ["n1"]))).json()
        assert reply["FailedNodes"] == {}, "16+8>16, and no pod of ml-a of lower priority to evict: unresolvable"
        assert reply["FailedAndUnresolvableNodes"] == {
            "n1": "namespace ml-a uses 16 of its 16 GiB of GPU memory (ResourceQuota team); this pod needs 8 GiB"
        }
        quota = api.update_quota(make_quota("team", "ml-a", **{"limits.aliyun.com/gpu-mem": "24"}))
        await eventually(lambda: requeue_requested(api), what="a retry asked")
        reply = await (await client.post("/filter", filter_body(waiting, ["n1"]))).json()
        assert reply["NodeNames"] == ["n1"]
        api.delete_quota("ml-a", quota["metadata"]["name"])
        await eventually(lambda: not service.quotas.active, what="the quota's deletion seen")
        metrics = await (await client.get("/metrics")).text()
        assert 'extender_cache_synced{kind="resourcequotas"} 1.0' in metrics
    finally:
        await source.stop()


async def test_a_replica_that_may_not_list_quotas_is_not_ready_and_says_why(
    api: ApiDouble, kube: KubeClient, client_for: ClientFor
) -> None:
    """Serving without the quotas would let a burst pass them: the replica waits, naming the right it lacks."""
    seed(api)
    api.fail("GET", "/api/v1/resourcequotas", status=403, times=1000)
    settings = Settings(insecure_http=True, identity="q1", lease_namespace="gpu-extender", leader_elect=False).check()
    service, source = kube_service(settings, kube)
    await source.start()
    try:
        client = await client_for(service)
        await eventually(lambda: source.quotas is not None and source.quotas.failures > 0, what="a refused list")
        response = await client.get("/readyz")
        reason = (await response.json())["Error"]
        assert response.status == 503 and reason.startswith("extender is not ready: it cannot list ResourceQuotas (")
        assert "grant it resourcequotas list and watch (manifests/base/rbac.yaml)" in reason
        api.clear_faults()
        await eventually(source.ready, what="ready once the quotas are listed")
    finally:
        await source.stop()


async def test_with_quotas_off_no_quota_is_read(api: ApiDouble, kube: KubeClient) -> None:
    seed(api)
    api.add_quota(make_quota("team", "default", **{"limits.aliyun.com/gpu-mem": "0"}))
    settings = Settings(insecure_http=True, identity="q2", leader_elect=False, resource_quotas=False).check()
    service, source = kube_service(settings, kube)
    await source.start()
    try:
        await eventually(source.ready, what="ready")
        assert source.quotas is None and not service.quotas.active
        assert not any(path.startswith("/api/v1/resourcequotas") for _, path in api.requests)
    finally:
        await source.stop()


async def test_a_nodes_gpu_model_label_reaches_the_cache_and_its_quota(api: ApiDouble, replicas: Replicas) -> None:
    """gpushare's GPU model is a node label (`model_label`): the watch keeps labels, so a quota for a model counts
    the pods on that node's GPUs."""
    node = make_node("n1", gpus=2, mem=16)
    node["metadata"]["labels"]["nvidia.com/gpu.product"] = "Tesla-T4"
    api.add_node(node)
    api.add_pod(bound_pod("held", "n1", (0,), 8, namespace="ml-a"))
    api.add_quota(make_quota("team", "ml-a", **{"limits.aliyun.com/gpu-mem.T4": "8"}))
    replica = await replicas.start()
    await asyncio.wait_for(replica.source.synced(), 5.0)
    assert [device.model for device in replica.cluster.nodes["n1"].devices] == ["Tesla-T4", "Tesla-T4"]
    assert replica.service.quotas.report()[0]["limits"][0]["used"] == 8
