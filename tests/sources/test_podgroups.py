"""PodGroups from the API (`sources/kube/podgroups.py`, the API double): both CRDs listed and watched into the cache,
each PodGroup reduced to its name, namespace and minMember; a CRD not installed answers 404, which is "not
installed", holds no readiness back and is listed again until it comes; one installed is waited for; a member
of a PodGroup's job is placed whole through the verbs, and waits while its PodGroup does not exist."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from extender.app import file_service
from extender.core.cache import Cache
from extender.core.groups import COSCHEDULING_GROUP, VOLCANO_GROUPS, GroupKey, Scheme, slim_podgroup
from extender.core.holds import HoldState
from extender.core.ledger import Ledger
from extender.core.placement.config import PolicyConfig
from extender.core.requeue import Requeue
from extender.service.context import Service
from extender.settings import Settings
from extender.sources.file import load_cluster_file
from extender.sources.kube.client import KubeClient, NotFound
from extender.sources.kube.informer import Informer, WatchOptions
from extender.sources.kube.podgroups import PodGroupFeed, podgroups_kind
from extender.sources.kube.source import KubeOptions, KubeSource
from tests.apidouble import NOT_FOUND_PATH, ApiDouble
from tests.builders import PROFILE, FakeClock, filter_body, make_node, make_pod, placer_for, quotas_of
from tests.conftest import ClientFor, eventually

COSCHEDULING = "scheduling.x-k8s.io/v1alpha1"
VOLCANO = "scheduling.volcano.sh/v1beta1"
FAST_RELIST = WatchOptions(page_size=50, inactivity=5.0, unserved_relist=0.2)
"""A CRD not installed is listed again within 0.2 s (30 s as shipped): the tests see it come without waiting."""


def podgroup(name: str, min_member: int, api_version: str = COSCHEDULING) -> dict[str, Any]:
    return {
        "apiVersion": api_version,
        "kind": "PodGroup",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"minMember": min_member},
    }


def coscheduled(name: str, group: str = "train") -> dict[str, Any]:
    pod = make_pod(name, gpu_mem=16, uid=f"uid-{name}")
    pod["metadata"]["labels"] = {COSCHEDULING_GROUP: group}
    return pod


class Live:
    """A cache, a ledger and the live source over the API double, without leader election."""

    def __init__(self, kube: KubeClient) -> None:
        self.cluster = Cache(PROFILE)
        quotas = quotas_of(self.cluster)
        options = KubeOptions(identity="r1", watch=FAST_RELIST, leader_elect=False, lease_namespace="gpu-extender")
        self.source = KubeSource(kube, self.cluster, quotas, options)
        self.asked: list[str] = []
        self.source.requeue = self.asked.append  # type: ignore[method-assign,assignment]  # what KubeSource would write
        self.ledger = Ledger(self.cluster, 60.0, FakeClock(), quotas)
        self.service = Service(
            cache=self.cluster,
            ledger=self.ledger,
            placer=placer_for(self.cluster, PolicyConfig()),
            quotas=quotas,
            source=self.source,
            requeue=Requeue(self.cluster, None, quotas=quotas),
        )

    def informer(self, scheme: Scheme) -> Informer[Any]:
        return self.source.podgroups[scheme]


@pytest.fixture
async def live(kube: KubeClient) -> AsyncIterator[Live]:
    running = Live(kube)
    await running.source.start()
    yield running
    await running.source.stop()


def seed(api: ApiDouble) -> None:
    api.add_node(make_node("n1", gpus=2, mem=16))
    api.add_node(make_node("n2", gpus=2, mem=16))


# ---- the API double's custom resources --------------------------------------------------------------------------


async def test_the_double_answers_a_crd_not_installed_with_the_404_of_an_unknown_path(
    api: ApiDouble, kube: KubeClient
) -> None:
    with pytest.raises(NotFound) as raised:
        await kube.get(f"/apis/{COSCHEDULING}/podgroups")
    assert (raised.value.reason, raised.value.message) == ("NotFound", NOT_FOUND_PATH)
    api.install_crd(COSCHEDULING)
    api.add_podgroup(podgroup("train", 2))
    listed = await kube.get(f"/apis/{COSCHEDULING}/podgroups")
    assert (listed["kind"], listed["apiVersion"]) == ("PodGroupList", COSCHEDULING)
    (item,) = listed["items"]
    assert (item["kind"], item["apiVersion"], item["spec"]) == ("PodGroup", COSCHEDULING, {"minMember": 2})
    with pytest.raises(NotFound):
        await kube.get(f"/apis/{VOLCANO}/namespaces/default/podgroups")


# ---- the informer of a CRD that may not be installed ------------------------------------------------------------


async def test_a_404_is_not_installed_not_a_failure_and_the_crd_is_read_once_installed(
    api: ApiDouble, kube: KubeClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "extender.sources.kube.informer")
    absent: list[bool] = []
    replaced: list[list[Any]] = []
    informer = Informer(
        kube,
        podgroups_kind(Scheme.COSCHEDULING),
        lambda podgroup, deleted: None,
        replaced.append,
        FAST_RELIST,
        absent=lambda: absent.append(True),
    )
    task = asyncio.create_task(informer.run())
    try:
        await eventually(lambda: len(absent) >= 2, what="listed again after the 404")
        assert informer.synced.is_set() and informer.served is False and informer.current
        assert informer.failures == 0 and informer.lists == 0 and replaced == []
        assert caplog.text.count("not served by the API") == 1, "said once, not at each list"
        api.install_crd(COSCHEDULING)
        api.add_podgroup(podgroup("train", 3))
        await eventually(lambda: replaced, what="the CRD read once installed")
        assert replaced == [[{"metadata": {"name": "train", "namespace": "default"}, "spec": {"minMember": 3}}]]
        assert informer.served is True and informer.failures == 0
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_404_for_a_kind_that_must_be_served_is_a_failure(api: ApiDouble, kube: KubeClient) -> None:
    informer = Informer(kube, podgroups_kind(Scheme.VOLCANO), lambda podgroup, deleted: None, lambda listed: None)
    task = asyncio.create_task(informer.run())
    try:
        await eventually(lambda: informer.failures, what="the 404 counted as a failure")
        assert not informer.synced.is_set()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


# ---- the source: the cache's PodGroups and readiness -----------------------------------------------------------


async def test_without_either_crd_the_source_is_ready_and_the_cache_says_neither_is_installed(
    api: ApiDouble, live: Live
) -> None:
    seed(api)
    await asyncio.wait_for(live.source.synced(), 5.0)
    assert live.source.why_not_ready() is None
    assert live.cluster.podgroups.coscheduling is None and live.cluster.podgroups.volcano is None
    assert all(informer.failures == 0 for informer in live.source.podgroups.values())


async def test_the_cache_follows_the_podgroups_of_each_crd_installed(api: ApiDouble, live: Live) -> None:
    seed(api)
    api.install_crd(COSCHEDULING)
    api.add_podgroup(podgroup("train", 2))
    await asyncio.wait_for(live.source.synced(), 5.0)
    assert live.cluster.podgroups.coscheduling == {
        "default/train": {"metadata": {"name": "train", "namespace": "default"}, "spec": {"minMember": 2}}
    }
    assert live.cluster.podgroups.volcano is None
    api.update_podgroup({**podgroup("train", 4), "status": {"phase": "Pending"}})
    await eventually(lambda: live.cluster.podgroups.coscheduling["default/train"]["spec"] == {"minMember": 4})  # type: ignore[index]
    api.install_crd(VOLCANO)
    api.add_podgroup(podgroup("infer", 3, VOLCANO))
    await eventually(lambda: live.cluster.podgroups.volcano, what="Volcano's CRD installed later")
    assert set(live.cluster.podgroups.volcano or ()) == {"default/infer"}
    api.delete_podgroup(COSCHEDULING, "default", "train")
    await eventually(lambda: live.cluster.podgroups.coscheduling == {})


async def test_a_crd_removed_is_not_installed_again_in_the_cache(api: ApiDouble, live: Live) -> None:
    seed(api)
    api.install_crd(VOLCANO)
    api.add_podgroup(podgroup("infer", 3, VOLCANO))
    await asyncio.wait_for(live.source.synced(), 5.0)
    assert live.cluster.podgroups.volcano is not None
    api.remove_crd(VOLCANO)
    await eventually(lambda: live.cluster.podgroups.volcano is None, what="the CRD removed")
    assert live.informer(Scheme.VOLCANO).served is False and live.source.why_not_ready() is None


async def test_readiness_waits_for_the_podgroups_of_a_crd_installed(api: ApiDouble, live: Live) -> None:
    seed(api)
    api.install_crd(COSCHEDULING)
    api.fail("GET", f"/apis/{COSCHEDULING}/podgroups", status=403, times=3)
    await eventually(lambda: live.informer(Scheme.COSCHEDULING).failures, what="a refused list")
    assert live.source.why_not_ready() == (
        f"extender is not ready: it cannot list coscheduling's PodGroups (GET /apis/{COSCHEDULING}/podgroups: 403 "
        "Forbidden: forbidden); grant it podgroups list and watch in API group scheduling.x-k8s.io "
        "(manifests/base/rbac.yaml), or set pod_groups to false"
    )
    await asyncio.wait_for(live.source.synced(), 10.0)
    assert live.source.why_not_ready() is None


async def test_with_pod_groups_off_no_podgroup_is_listed_and_a_refused_list_holds_nothing_back(
    api: ApiDouble, kube: KubeClient
) -> None:
    """`--no-pod-groups`: a cluster whose ClusterRole predates the PodGroup grants stays ready; pods naming a
    PodGroup are placed as any pod (the cache has no CRD installed)."""
    seed(api)
    api.install_crd(COSCHEDULING)
    api.fail("GET", f"/apis/{COSCHEDULING}/podgroups", status=403, times=100)
    cluster = Cache(PROFILE)
    options = KubeOptions(identity="r1", watch=FAST_RELIST, leader_elect=False, pod_groups=False)
    source = KubeSource(kube, cluster, quotas_of(cluster), options)
    await source.start()
    try:
        await asyncio.wait_for(source.synced(), 5.0)
        assert source.podgroups == {} and source.why_not_ready() is None
        assert cluster.podgroups.coscheduling is None and cluster.podgroups.volcano is None
    finally:
        await source.stop()


async def test_metrics_count_each_crds_informer(api: ApiDouble, live: Live) -> None:
    seed(api)
    api.install_crd(COSCHEDULING)
    await asyncio.wait_for(live.source.synced(), 5.0)
    counts = {(name, labels.get("kind")): value for name, labels, value in live.source.counts()}
    assert counts[("lists", "podgroups.scheduling.x-k8s.io")] == 1
    assert counts[("lists", "podgroups.scheduling.volcano.sh")] == 0
    assert counts[("cache_synced", "podgroups.scheduling.volcano.sh")] == 1.0


# ---- a job of a PodGroup, through the verbs ---------------------------------------------------------------------


async def test_a_podgroup_created_after_its_pods_lets_them_be_placed_whole(
    api: ApiDouble, live: Live, client_for: ClientFor
) -> None:
    seed(api)
    api.install_crd(COSCHEDULING)
    pods = [api.add_pod(coscheduled(f"w-{n}")) for n in range(3)]
    await asyncio.wait_for(live.source.synced(), 5.0)
    client = await client_for(live.service)
    reply = await (await client.post("/filter", data=filter_body(pods[0], ["n1", "n2"]))).json()
    waiting = "pod default/w-0: coscheduling's PodGroup default/train does not exist (yet)"
    assert reply["NodeNames"] == [] and reply["FailedAndUnresolvableNodes"] == {"n1": waiting, "n2": waiting}
    assert live.asked == []
    api.add_podgroup(podgroup("train", 3))
    await eventually(lambda: live.asked, what="kube-scheduler asked to retry the members")
    assert live.asked == ["coscheduling's PodGroup default/train changed while members of it wait"]
    reply = await (await client.post("/filter", data=filter_body(pods[1], ["n1", "n2"]))).json()
    assert reply["NodeNames"] == ["n1"]
    held = {uid: hold.allocation.node for uid, hold in live.cluster.reserved.items() if hold.state is HoldState.GROUPED}
    assert held == {"uid-w-0": "n1", "uid-w-1": "n1", "uid-w-2": "n2"}


async def test_a_volcano_job_is_placed_whole_and_a_status_update_is_no_news(
    api: ApiDouble, live: Live, client_for: ClientFor
) -> None:
    seed(api)
    api.install_crd(VOLCANO)
    api.add_podgroup(podgroup("infer", 2, VOLCANO))
    pods = []
    for n in range(2):
        pod = make_pod(f"i-{n}", gpu_mem=16, uid=f"uid-i-{n}")
        pod["metadata"]["annotations"][VOLCANO_GROUPS[n]] = "infer"
        pods.append(api.add_pod(pod))
    await asyncio.wait_for(live.source.synced(), 5.0)
    api.update_podgroup({**podgroup("infer", 2, VOLCANO), "status": {"phase": "Inqueue"}})
    client = await client_for(live.service)
    reply = await (await client.post("/filter", data=filter_body(pods[1], ["n1", "n2"]))).json()
    assert reply["NodeNames"] == ["n1"]
    assert live.ledger.group_hold(GroupKey(Scheme.VOLCANO, "default", "infer")) is not None
    assert live.asked == [], "the PodGroup's status changed, nothing kept of it"


async def test_a_podgroup_label_without_its_crd_is_placed_as_any_pod(
    api: ApiDouble, live: Live, client_for: ClientFor
) -> None:
    seed(api)
    pods = [api.add_pod(coscheduled(f"w-{n}")) for n in range(3)]
    await asyncio.wait_for(live.source.synced(), 5.0)
    client = await client_for(live.service)
    reply = await (await client.post("/filter", data=filter_body(pods[0], ["n1", "n2"]))).json()
    assert reply["NodeNames"], reply
    assert not [hold for hold in live.cluster.reserved.values() if hold.state is HoldState.GROUPED]
    assert live.ledger.group_hold(GroupKey(Scheme.COSCHEDULING, "default", "train")) is None


def test_the_feed_tells_podgroups_new_or_changed_not_those_deleted_nor_its_first_list() -> None:
    cluster = Cache(PROFILE)
    told: list[list[GroupKey]] = []
    feed = PodGroupFeed(cluster, Scheme.COSCHEDULING, told.append)
    slim = [slim_podgroup(podgroup(name, 2)) for name in ("a", "b")]
    feed.replace(slim)
    assert told == [] and cluster.podgroups.coscheduling == {"default/a": slim[0], "default/b": slim[1]}
    feed.apply(slim[0], False)
    assert told == [], "the same minimum: its status changed, or nothing"
    changed = slim_podgroup(podgroup("a", 3))
    feed.replace([changed, slim_podgroup(podgroup("c", 1))])  # a relist after a gap: b deleted meanwhile
    assert told == [[GroupKey(Scheme.COSCHEDULING, "default", name) for name in ("a", "c")]]
    feed.apply(changed, True)
    assert len(told) == 1 and set(cluster.podgroups.coscheduling or ()) == {"default/c"}
    feed.absent()
    assert cluster.podgroups.coscheduling is None
    assert told[-1] == [GroupKey(Scheme.COSCHEDULING, "default", "c")], "its members go as any pod now"
    feed.replace([])
    assert cluster.podgroups.coscheduling == {} and len(told) == 2


# ---- the file source ----------------------------------------------------------------------------------------------


def test_a_cluster_file_carries_the_podgroups_of_either_crd(tmp_path: Path) -> None:
    typed_list = {"apiVersion": VOLCANO, "kind": "PodGroupList", "items": [{"metadata": {"name": "infer"}}]}
    other = podgroup("elsewhere", 2, "scheduling.run.ai/v2alpha2")
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump_all([make_node("n1"), podgroup("train", 2), typed_list, other]))
    objects = load_cluster_file(path)
    assert [(pg["apiVersion"], pg["metadata"]["name"]) for pg in objects.podgroups] == [
        (COSCHEDULING, "train"),
        (VOLCANO, "infer"),
    ]
    assert objects.skipped == {"PodGroup": 1}


async def test_a_file_service_places_a_coscheduling_job_whole(tmp_path: Path, client_for: ClientFor) -> None:
    pods = [coscheduled(f"w-{n}") for n in range(3)]
    path = tmp_path / "cluster.yaml"
    nodes = [make_node("n1", gpus=2, mem=16), make_node("n2", gpus=2, mem=16)]
    path.write_text(yaml.safe_dump_all([*nodes, *pods, podgroup("train", 3)]))
    service = file_service(Settings(), str(path))
    assert service.cache.podgroups.volcano is None, "no Volcano PodGroup in the file: not installed"
    client = await client_for(service)
    reply = await (await client.post("/filter", data=filter_body(pods[0], ["n1", "n2"]))).json()
    assert reply["NodeNames"] == ["n1"]
    held = {uid: hold.allocation.node for uid, hold in service.cache.reserved.items()}
    assert held == {"uid-w-0": "n1", "uid-w-1": "n1", "uid-w-2": "n2"}
