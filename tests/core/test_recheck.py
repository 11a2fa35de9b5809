"""A preemptor's filter reads its possible victims from the API before refusing a node it may have freed.

The scenario (kube-scheduler v1.34, seen in the e2e tier): the scheduler evicts a victim, sees the deletion, and
retries the preemptor within milliseconds; our watch shows the deletion a little later. Here the cache is that
late watch, and `FakeApi` stands for the API server's answer to a GET of each pod (which pods it still has);
`test_kube_source.py` runs the same through the real source against the API double, and the e2e tier against
kube-apiserver and kube-scheduler.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import orjson

from extender.core.cache import Cache
from extender.core.holds import HoldState
from extender.core.pods import PodRecord
from extender.core.recheck import LIMIT, MAX_REMEMBERED, Answer, Preemptions, suspects
from tests.builders import FakeClock, bound_pod, filter_body, make_cluster, make_node, make_pod
from tests.conftest import ClientFor, make_service


def with_priority(pod: dict[str, Any], priority: int, nominated: str = "") -> dict[str, Any]:
    pod["spec"]["priority"] = priority
    if nominated:
        pod.setdefault("status", {})["nominatedNodeName"] = nominated
    return pod


def victim(name: str, node: str, index: int, mem: int = 16, priority: int = 0) -> dict[str, Any]:
    return with_priority(bound_pod(name, node, (index,), mem), priority)


def full_cluster() -> Cache:
    """Two nodes of two 16 GiB GPUs, every GPU held by one 16 GiB pod of priority 0."""
    return make_cluster(
        make_node("n1", gpus=2, mem=16),
        make_node("n2", gpus=2, mem=16),
        pods=tuple(victim(f"low-{node}-{index}", node, index) for node in ("n1", "n2") for index in (0, 1)),
    )


def keys(records: list[PodRecord]) -> list[str]:
    return [record.key for record in records]


class FakeApi:
    """Stands for kube-apiserver answering GETs of pods: `deleted` are 404, `silent` never answer in time."""

    def __init__(self, cluster: Cache, deleted: Iterable[str] = (), silent: bool = False) -> None:
        self.cluster = cluster
        self.deleted = set(deleted)
        self.silent = silent
        self.asked: list[list[str]] = []

    async def recheck(self, pods: list[PodRecord]) -> Answer:
        self.asked.append(keys(pods))
        if self.silent:
            return Answer(0, len(pods))
        gone = [record for record in pods if record.name in self.deleted]
        for record in gone:
            self.cluster.forget_pod(record.uid)
        return Answer(len(gone), 0)


# --- which pods are read --------------------------------------------------------------------------------------


def test_a_pod_that_is_no_preemptor_has_nothing_to_recheck() -> None:
    cluster = full_cluster()
    pod = with_priority(make_pod("newcomer", gpu_mem=16), 1000)
    assert suspects(pod, ["n1", "n2"], cluster, Preemptions()) == []


def test_the_nominated_node_s_lower_priority_pods_are_read_when_it_is_refused() -> None:
    cluster = full_cluster()
    preemptor = with_priority(make_pod("high", gpu_mem=16), 1000, nominated="n1")
    assert sorted(keys(suspects(preemptor, ["n1", "n2"], cluster, Preemptions()))) == [
        "default/low-n1-0",
        "default/low-n1-1",
    ]
    assert suspects(preemptor, ["n2"], cluster, Preemptions()) == [], "n1 was not refused: nothing to check"


def test_pods_of_the_preemptor_s_priority_or_higher_are_never_victims_so_never_read() -> None:
    cluster = make_cluster(
        make_node("n1", gpus=2, mem=16),
        pods=(victim("peer", "n1", 0, priority=1000), victim("low", "n1", 1, priority=999)),
    )
    preemptor = with_priority(make_pod("high", gpu_mem=16), 1000, nominated="n1")
    assert keys(suspects(preemptor, ["n1"], cluster, Preemptions())) == ["default/low"]


def test_the_victims_preempt_named_are_read_the_nominated_node_s_first() -> None:
    """Three nodes of one GPU, each shared by eight 2 GiB pods: /preempt named one pod's worth of victims on each
    (the scheduler evicts exactly those on the node it picks); only they are read."""
    nodes = [make_node(f"n{number}", gpus=1, mem=16) for number in range(3)]
    pods = tuple(victim(f"low-{number}-{index}", f"n{number}", 0, mem=2) for number in range(3) for index in range(8))
    cluster = make_cluster(*nodes, pods=pods)
    uid_of = {record.name: uid for uid, record in cluster.pods.items()}
    preemptor = with_priority(make_pod("high", gpu_mem=4), 1000)
    offered = Preemptions()
    named = {f"n{number}": [uid_of[f"low-{number}-0"], uid_of[f"low-{number}-1"]] for number in range(3)}
    offered.remember(preemptor["metadata"]["uid"], named)
    assert keys(suspects(preemptor, ["n0", "n1", "n2"], cluster, offered)) == [
        f"default/low-{number}-{index}" for number in range(3) for index in range(2)
    ]
    assert keys(suspects(preemptor, ["n0"], cluster, offered)) == ["default/low-0-0", "default/low-0-1"]
    preemptor["status"] = {"nominatedNodeName": "n2"}
    assert keys(suspects(preemptor, ["n0", "n1", "n2"], cluster, offered))[:2] == ["default/low-2-0", "default/low-2-1"]


def test_without_named_victims_the_nominated_node_s_lowest_priorities_come_first_within_the_limit() -> None:
    """Five GPUs shared by eight pods each, the lowest priorities on the last GPU: those are the ones the scheduler
    evicted, and they are read even though more pods than `LIMIT` could be."""
    pods = tuple(
        victim(f"p{index}-{number}", "n1", index, mem=2, priority=0 if index == 4 else 500)
        for index in range(5)
        for number in range(8)
    )
    cluster = make_cluster(make_node("n1", gpus=5, mem=16), pods=pods)
    preemptor = with_priority(make_pod("high", gpu_mem=16), 1000, nominated="n1")
    found = suspects(preemptor, ["n1"], cluster, Preemptions())
    assert len(found) == LIMIT == 32 < len(pods)
    assert {record.name for record in found} >= {f"p4-{number}" for number in range(8)}
    assert [record.priority for record in found[:8]] == [0] * 8


def test_reservations_not_yet_seen_bound_are_not_read() -> None:
    cluster = make_cluster(make_node("n1", gpus=1, mem=16))
    reserved = with_priority(make_pod("reserved", gpu_mem=16, node="n1", indexes=(0,), bound=False), 0)
    cluster.apply_pod(reserved)
    assert len(cluster.reserved) == 1
    preemptor = with_priority(make_pod("high", gpu_mem=16), 1000, nominated="n1")
    assert suspects(preemptor, ["n1"], cluster, Preemptions()) == []


def test_what_preempt_named_is_forgotten_after_its_memory_or_the_bind() -> None:
    clock = FakeClock()
    offered = Preemptions(memory=300.0, limit=2, clock=clock)
    offered.remember("a", {"n1": ["v"]})
    offered.remember("b", {})
    assert (offered.offer("a"), offered.offer("b"), len(offered)) == ({"n1": ("v",)}, {}, 1)
    clock.advance(301)
    assert offered.offer("a") == {}
    offered.remember("a", {"n1": ["v"]})
    offered.forget("a")
    assert offered.offer("a") == {}
    for uid in ("x", "y", "z"):
        offered.remember(uid, {"n1": ["v"]})
    assert (len(offered), offered.offer("x")) == (2, {}), "bounded: the oldest goes first"


def test_what_preempt_names_is_bounded_in_size_not_only_in_count() -> None:
    """An mTLS client sending /preempt with 100,000 victim UIDs per call grew the process by ~9 MB a call:
    only `LIMIT` victims per node are ever read, so only those are kept, and all offers share a budget."""
    offered = Preemptions()
    for call in range(60):
        offered.remember(f"preemptor-{call}", {"n1": (f"victim-{n}" for n in range(100_000))})
    assert offered.size == 60 * LIMIT
    assert len(offered.offer("preemptor-0")["n1"]) == LIMIT
    many_nodes = {f"n{node}": [f"v-{node}-{n}" for n in range(LIMIT)] for node in range(MAX_REMEMBERED // LIMIT)}
    offered.remember("wide", many_nodes)
    assert offered.size <= MAX_REMEMBERED and offered.offer("wide") == {
        node: tuple(uids) for node, uids in many_nodes.items()
    }
    assert offered.offer("preemptor-59") == {}, "the oldest offers made room"


def test_expired_offers_are_dropped_when_others_come_not_only_when_read() -> None:
    clock = FakeClock()
    offered = Preemptions(memory=300.0, clock=clock)
    offered.remember("old", {"n1": ["v"] * 10})
    clock.advance(301)
    offered.remember("new", {"n1": ["w"]})
    assert (len(offered), offered.size) == (1, 1)


# --- through the service --------------------------------------------------------------------------------------


async def test_a_victim_the_api_no_longer_has_is_dropped_and_the_node_passes(client_for: ClientFor) -> None:
    cluster = full_cluster()
    api = FakeApi(cluster, deleted={"low-n1-0"})
    service = make_service(cluster, recheck=api.recheck)
    client = await client_for(service)
    preemptor = with_priority(make_pod("high", gpu_mem=16), 1000, nominated="n1")
    reply = await (await client.post("/filter", data=filter_body(preemptor, ["n1", "n2"]))).json()
    assert reply["NodeNames"] == ["n1"] and reply["FailedNodes"] == {}, "n2, full, counted and left out"
    assert [sorted(asked) for asked in api.asked] == [["default/low-n1-0", "default/low-n1-1"]]
    # The victim's GPU is free, and held for the preemptor its filter passed there alone (`core/assume.py`).
    assumed = cluster.hold_of(preemptor["metadata"]["uid"])
    assert assumed is not None and assumed.state is HoldState.ASSUMED and assumed.allocation.indexes == (0,)
    assert cluster.nodes["n1"].used == [16, 16]
    metrics = await (await client.get("/metrics")).text()
    assert 'extender_filter_rechecks_total{result="freed"} 1.0' in metrics


async def test_victims_still_there_keep_the_node_refused(client_for: ClientFor) -> None:
    """A victim still terminating holds its memory: the answer is the cache's, as the scheduler's own is."""
    cluster = full_cluster()
    api = FakeApi(cluster)
    client = await client_for(make_service(cluster, recheck=api.recheck))
    preemptor = with_priority(make_pod("high", gpu_mem=16), 1000, nominated="n1")
    reply = await (await client.post("/filter", data=filter_body(preemptor, ["n1"]))).json()
    assert reply["NodeNames"] == [] and "all 2 GPUs here are full" in reply["FailedNodes"]["n1"]
    assert len(api.asked) == 1
    metrics = await (await client.get("/metrics")).text()
    assert 'extender_filter_rechecks_total{result="unchanged"} 1.0' in metrics


async def test_an_api_that_does_not_answer_leaves_the_cache_s_answer(client_for: ClientFor) -> None:
    cluster = full_cluster()
    api = FakeApi(cluster, deleted={"low-n1-0"}, silent=True)
    client = await client_for(make_service(cluster, recheck=api.recheck))
    preemptor = with_priority(make_pod("high", gpu_mem=16), 1000, nominated="n1")
    reply = await (await client.post("/filter", data=filter_body(preemptor, ["n1"]))).json()
    assert (reply["NodeNames"], reply["Error"]) == ([], "")
    metrics = await (await client.get("/metrics")).text()
    assert 'extender_filter_rechecks_total{result="unanswered"} 1.0' in metrics


async def test_victims_named_by_preempt_are_rechecked_until_the_preemptor_is_bound(client_for: ClientFor) -> None:
    """The scheduler's retry may carry no nomination yet (its status patch races the victim's deletion): the
    victims our /preempt named are read instead, until the pod is bound."""
    cluster = full_cluster()
    api = FakeApi(cluster, deleted={"low-n2-1"})
    service = make_service(cluster, recheck=api.recheck)
    client = await client_for(service)
    preemptor = with_priority(make_pod("high", gpu_mem=16), 1000)
    (chosen,) = [uid for uid, record in cluster.pods.items() if record.name == "low-n2-1"]
    body = {"Pod": preemptor, "NodeNameToMetaVictims": {"n2": {"Pods": [{"UID": chosen}]}}}
    offered = await (await client.post("/preempt", data=orjson.dumps(body))).json()
    assert list(offered["NodeNameToMetaVictims"]) == ["n2"]

    reply = await (await client.post("/filter", data=filter_body(preemptor, ["n1", "n2"]))).json()
    assert reply["NodeNames"] == ["n2"] and api.asked == [["default/low-n2-1"]]
    meta = preemptor["metadata"]
    binding = {"PodName": meta["name"], "PodNamespace": "default", "PodUID": meta["uid"], "Node": "n2"}
    assert (await (await client.post("/bind", data=orjson.dumps(binding))).json()) == {"Error": ""}
    assert service.preemptions.offer(meta["uid"]) == {}


async def test_a_pod_that_is_no_preemptor_never_waits_on_the_api(client_for: ClientFor) -> None:
    cluster = full_cluster()
    api = FakeApi(cluster, deleted={"low-n1-0"})
    client = await client_for(make_service(cluster, recheck=api.recheck))
    pod = with_priority(make_pod("plain", gpu_mem=16), 1000)
    reply = await (await client.post("/filter", data=filter_body(pod, ["n1", "n2"]))).json()
    assert reply["NodeNames"] == [] and api.asked == []


async def test_a_replica_that_stops_leading_during_the_reads_answers_that_it_is_not_ready(
    client_for: ClientFor,
) -> None:
    cluster = full_cluster()
    leading = [True]
    api = FakeApi(cluster, deleted={"low-n1-0"})

    async def recheck(pods: list[PodRecord]) -> Answer:
        leading[0] = False  # the lease is lost while the API is read
        return await api.recheck(pods)

    service = make_service(
        cluster, recheck=recheck, ready=lambda: leading[0], why_not_ready=lambda: "extender is not the leader"
    )
    client = await client_for(service)
    preemptor = with_priority(make_pod("high", gpu_mem=16), 1000, nominated="n1")
    reply = await (await client.post("/filter", data=filter_body(preemptor, ["n1"]))).json()
    assert (reply["NodeNames"], reply["Error"]) == ([], "extender is not the leader")
