"""Binding through the API (the double): one Binding that carries the annotations; what each failure does to
the reservation; Events for failed binds."""

from __future__ import annotations

import asyncio

from extender.core.binding import BindRequest, RecentPods
from extender.core.cache import Cache
from extender.core.holds import HoldState
from extender.core.ledger import UNCERTAIN_WINDOW, Ledger
from extender.core.placement.config import PolicyConfig
from extender.service.pages import inspect_node
from extender.sources.kube.binder import EventRecorder, KubeBinder
from extender.sources.kube.client import KubeClient
from tests.apidouble import ApiDouble
from tests.builders import PROFILE, FakeClock, bind_error, bound_pod, cache_differences, make_node, make_pod
from tests.conftest import Running, double_config, eventually, start


def seed(api: ApiDouble) -> dict[str, object]:
    api.add_node(make_node("n1", gpus=1, mem=16))
    api.add_node(make_node("n2", gpus=1, mem=16))
    return api.add_pod(make_pod("p", gpu_mem=10))


def request_for(pod: dict[str, object], node: str) -> BindRequest:
    meta = pod["metadata"]
    assert isinstance(meta, dict)
    return BindRequest(meta["name"], meta["namespace"], meta["uid"], node)


async def run_bind(cluster: Cache, ledger: Ledger, client: KubeClient, request: BindRequest) -> str:
    return await bind_error(request, cluster, ledger, PolicyConfig(), KubeBinder(client), RecentPods())


def snapshot(api: ApiDouble) -> Cache:
    """A cache as of now that no watch updates: what a bind sees when the API has moved on meanwhile."""
    cluster = Cache(PROFILE)
    cluster.replace(api.nodes(), api.pods())
    return cluster


async def test_one_binding_carries_the_annotations_and_the_watch_confirms_it(
    api: ApiDouble, kube: KubeClient, informers: Running
) -> None:
    pod = seed(api)
    await start(informers, api)
    ledger = Ledger(informers.cluster, 300.0)
    assert await run_bind(informers.cluster, ledger, kube, request_for(pod, "n1")) == ""
    writes = [(method, path) for method, path in api.requests if method != "GET"]
    assert writes == [("POST", "/api/v1/namespaces/default/pods/p/binding")]
    stored = api.pod("default", "p")
    assert stored is not None and stored["spec"]["nodeName"] == "n1"
    assert stored["metadata"]["annotations"][PROFILE.index_annotation] == "0"
    await informers.settled(api)
    assert informers.cluster.reserved == {} and informers.cluster.nodes["n1"].used == [10]


async def test_a_pod_deleted_between_filter_and_bind_fails_and_frees_its_reservation(
    api: ApiDouble, kube: KubeClient, informers: Running
) -> None:
    pod = seed(api)
    await start(informers, api)
    cluster = informers.cluster
    api.delete_pod("default", "p")
    error = await run_bind(cluster, Ledger(cluster, 300.0), kube, request_for(pod, "n1"))
    assert "no longer exists" in error or "unknown" in error
    assert cluster.reserved == {}
    await informers.settled(api)


async def test_a_409_because_our_earlier_binding_landed_on_the_same_node_is_success(
    api: ApiDouble, kube: KubeClient
) -> None:
    pod = seed(api)
    cluster = snapshot(api)
    api.update_pod(bound_pod("p", "n1", (0,), 10, uid=pod["metadata"]["uid"]))  # type: ignore[index]
    ledger = Ledger(cluster, 300.0)
    assert await run_bind(cluster, ledger, kube, request_for(pod, "n1")) == ""
    assert cluster.hold_of(pod["metadata"]["uid"]).state is HoldState.BOUND  # type: ignore[index,union-attr]


async def test_a_pod_bound_elsewhere_meanwhile_fails_and_frees_its_reservation(
    api: ApiDouble, kube: KubeClient
) -> None:
    pod = seed(api)
    cluster = snapshot(api)
    api.update_pod(bound_pod("p", "n2", (0,), 10, uid=pod["metadata"]["uid"]))  # type: ignore[index]
    error = await run_bind(cluster, Ledger(cluster, 300.0), kube, request_for(pod, "n1"))
    assert "already bound to n2" in error
    assert cluster.reserved == {} and cluster.nodes["n1"].used == [0]


async def test_a_pod_recreated_under_the_same_name_is_never_bound(api: ApiDouble, kube: KubeClient) -> None:
    pod = seed(api)
    cluster = snapshot(api)
    api.delete_pod("default", "p")
    api.add_pod(make_pod("p", gpu_mem=10))  # a new uid
    error = await run_bind(cluster, Ledger(cluster, 300.0), kube, request_for(pod, "n1"))
    assert "recreated" in error
    assert cluster.reserved == {}
    stored = api.pod("default", "p")
    assert stored is not None and "nodeName" not in stored["spec"]


async def test_a_500_on_the_binding_keeps_the_reservation_while_the_binding_may_still_land(
    api: ApiDouble, kube: KubeClient
) -> None:
    """kube-apiserver may finish a request after answering 5xx or after its client gave up; until its request
    timeout has passed, the memory stays held and the pod is not bound anywhere else."""
    pod = seed(api)
    cluster = snapshot(api)
    clock = FakeClock()
    ledger = Ledger(cluster, 300.0, clock)
    api.fail("POST", "/api/v1/namespaces/default/pods/p/binding", status=500)
    error = await run_bind(cluster, ledger, kube, request_for(pod, "n1"))
    assert "binding default/p to n1 failed: the API failed" in error
    hold = cluster.hold_of(pod["metadata"]["uid"])  # type: ignore[index]
    assert hold is not None and hold.state is HoldState.UNCERTAIN and cluster.nodes["n1"].used == [10]
    assert "may have landed" in await run_bind(cluster, ledger, kube, request_for(pod, "n2"))
    clock.advance(UNCERTAIN_WINDOW + 1)  # the API server has given that request up: decide afresh
    assert await run_bind(cluster, ledger, kube, request_for(pod, "n2")) == ""
    assert cluster.nodes["n1"].used == [0] and cluster.nodes["n2"].used == [10]


async def test_a_409_for_an_earlier_binding_of_ours_takes_the_gpus_it_carries(api: ApiDouble, kube: KubeClient) -> None:
    api.add_node(make_node("n1", gpus=2, mem=16))
    pod = api.add_pod(make_pod("p", gpu_mem=10))
    uid = pod["metadata"]["uid"]
    cluster = snapshot(api)
    api.update_pod(bound_pod("p", "n1", (1,), 10, uid=uid))  # it landed on GPU 1; this attempt picks GPU 0
    binder = KubeBinder(kube, observe=cluster.apply_pod)
    error = await bind_error(
        request_for(pod, "n1"), cluster, Ledger(cluster, 300.0), PolicyConfig(), binder, RecentPods()
    )
    assert error == ""
    assert cluster.nodes["n1"].used == [0, 10] and cluster.reserved == {}


async def test_a_read_back_that_crossed_the_pods_deletion_leaves_nothing_held(api: ApiDouble, kube: KubeClient) -> None:
    """A 409 (an earlier binding of ours landed) makes the binder read the pod and hand it to the cache. Here the
    pod is deleted just after the API served that read, and the watch's DELETED is handled before the read's
    reply is (two sockets, one loop: either order happens). The wrapper plays that order on the real binder and
    cache; the pod read back must not come back as a hold that no event would ever remove."""
    api.add_node(make_node("n1", gpus=1, mem=16))
    pod = api.add_pod(make_pod("p", gpu_mem=10))
    cluster = snapshot(api)
    api.update_pod(bound_pod("p", "n1", (0,), 10, uid=pod["metadata"]["uid"]))
    read = kube.get

    async def read_then_deleted(path: str) -> object:
        current = await read(path)
        api.delete_pod("default", "p")
        cluster.apply_pod(current, deleted=True)  # the watch's DELETED, handled before the read's reply
        return current

    kube.get = read_then_deleted  # type: ignore[method-assign]
    binder = KubeBinder(kube, observe=cluster.apply_pod)
    error = await bind_error(
        request_for(pod, "n1"), cluster, Ledger(cluster, 300.0), PolicyConfig(), binder, RecentPods()
    )
    assert error == ""  # the binding did land (an earlier attempt's); the pod is gone since
    assert cluster.pods == {} and cluster.reserved == {} and cluster.nodes["n1"].used == [0]
    assert cache_differences(cluster, api.nodes(), api.pods()) == []


async def test_a_binding_that_may_have_landed_keeps_its_reservation_until_the_api_says(api: ApiDouble) -> None:
    pod = seed(api)
    uid = pod["metadata"]["uid"]  # type: ignore[index]
    cluster = snapshot(api)
    ledger = Ledger(cluster, 300.0, FakeClock())
    api.fail("POST", "/api/v1/namespaces/default/pods/p/binding", mode="hang")
    api.fail("GET", "/api/v1/namespaces/default/pods/p", status=503)
    async with KubeClient(double_config(api), timeout=0.3) as client:
        error = await run_bind(cluster, ledger, client, request_for(pod, "n1"))
        assert "timed out" in error and "reading the pod back failed too" in error
        hold = cluster.hold_of(uid)  # type: ignore[arg-type]
        assert hold is not None and hold.state is HoldState.UNCERTAIN and cluster.nodes["n1"].used == [10]
        assert inspect_node(cluster.nodes["n1"], 0.0)["devices"][0]["pods"][0]["state"] == "uncertain"
        refused = await run_bind(cluster, ledger, client, request_for(pod, "n2"))
        assert "may have landed" in refused and cluster.nodes["n2"].used == [0]
        # The scheduler retries on the same node: the same allocation is written again, and lands.
        assert await run_bind(cluster, ledger, client, request_for(pod, "n1")) == ""
    stored = api.pod("default", "p")
    assert stored is not None and stored["spec"]["nodeName"] == "n1"
    cluster.apply_pod(stored)
    assert cluster.reserved == {} and cache_differences(cluster, api.nodes(), api.pods()) == []


async def test_a_failed_bind_is_recorded_as_a_warning_event_on_the_pod(api: ApiDouble, kube: KubeClient) -> None:
    pod = seed(api)
    recorder = EventRecorder(kube, "replica-1")
    recorder.failed_bind(request_for(pod, "n1"), "pod default/p no longer fits on n1")
    await recorder.close()
    assert recorder.recorded == 1
    [event] = api.events
    assert event["reason"] == "FailedBinding" and event["type"] == "Warning"
    assert event["involvedObject"]["uid"] == pod["metadata"]["uid"]  # type: ignore[index]
    assert "no longer fits" in event["message"]


async def test_an_event_that_cannot_be_recorded_is_logged_not_raised(api: ApiDouble, kube: KubeClient) -> None:
    pod = seed(api)
    api.fail("POST", "/api/v1/namespaces/default/events", status=403)
    recorder = EventRecorder(kube, "replica-1")
    recorder.failed_bind(request_for(pod, "n1"), "whatever")
    await asyncio.wait_for(recorder.close(), 5.0)
    assert recorder.recorded == 0 and api.events == []


async def test_binds_racing_for_one_gpu_through_the_api_never_overcommit(
    api: ApiDouble, kube: KubeClient, informers: Running
) -> None:
    api.add_node(make_node("n1", gpus=2, mem=16))
    pods = [api.add_pod(make_pod(f"p{i}", gpu_mem=6)) for i in range(12)]
    await start(informers, api)
    await eventually(lambda: len(informers.cluster.pods) == 12)
    cluster = informers.cluster
    ledger = Ledger(cluster, 300.0)
    errors = await asyncio.gather(*(run_bind(cluster, ledger, kube, request_for(pod, "n1")) for pod in pods))
    assert errors.count("") == 4  # two 6s per 16 GiB GPU
    await informers.settled(api)
    assert cluster.reserved == {} and cluster.overcommitted() == []
