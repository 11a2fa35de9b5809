"""kube-scheduler is asked to retry the pods our filter refused when the cache frees room for them with no cluster
event to follow: a late watch event, an expired reservation.

`requeue` here is a list the service appends its reasons to: it stands for the API source's annotation of its
own pod (`test_kube_source.py` checks that write against the API double, and the e2e tier that kube-scheduler
then retries the pod).
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson

from extender.core.devices import Demand
from extender.core.ledger import Ledger
from extender.core.requeue import Refusals, Refused, fits_any
from tests.builders import FakeClock, bound_pod, filter_body, make_cluster, make_node, make_pod
from tests.conftest import ClientFor, eventually, make_service


def test_a_refusal_counts_only_from_since_and_only_if_the_pod_fits_now() -> None:
    clock = FakeClock()
    cluster = make_cluster(make_node("n1", gpus=1, mem=16), pods=(bound_pod("a", "n1", (0,), 12),))
    refusals = Refusals(clock=clock)
    refusals.refused("big", Demand(memory=8))
    refusals.refused("also-big", Demand(memory=8))
    state = cluster.nodes["n1"]
    assert refusals.demands_since(clock.now - 1) == {Refused(Demand(memory=8))}, "each demand once"
    assert not fits_any(refusals.demands_since(clock.now - 1), state), "4 GiB free: an 8 GiB pod does not fit"
    cluster.forget_pod(next(iter(cluster.pods)))
    assert fits_any(refusals.demands_since(clock.now - 1), state)
    assert refusals.demands_since(clock.now + 1) == set(), "refused before `since`: it had its retry"
    refusals.forget("big")
    refusals.forget("also-big")
    assert refusals.demands_since(0) == set()


def test_refusals_are_bounded_and_forgotten_after_their_memory() -> None:
    clock = FakeClock()
    refusals = Refusals(memory=300.0, limit=2, clock=clock)
    for uid in ("a", "b", "c"):
        refusals.refused(uid, Demand(memory=4))
    assert len(refusals) == 2
    clock.advance(301)
    assert refusals.demands_since(0) == set() and len(refusals) == 0


def full_cluster() -> Any:
    return make_cluster(
        make_node("n1", gpus=1, mem=16), make_node("n2", gpus=1, mem=16),
        pods=(bound_pod("a", "n1", (0,), 16), bound_pod("b", "n2", (0,), 16)),
    )  # fmt: skip


async def test_a_pod_refused_just_before_a_late_deletion_is_retried(client_for: ClientFor) -> None:
    cluster = full_cluster()
    asked: list[str] = []
    service = make_service(cluster, requeue=asked.append)
    client = await client_for(service)
    waiting = make_pod("waiting", gpu_mem=16)
    reply = await (await client.post("/filter", data=filter_body(waiting, ["n1", "n2"]))).json()
    assert reply["NodeNames"] == []

    service.requeue.freed(["n1"], since=service.requeue.refusals.clock() - 1)  # nothing freed yet: nothing fits
    assert asked == []
    (uid_a,) = [uid for uid, record in cluster.pods.items() if record.name == "a"]
    cluster.forget_pod(uid_a)  # the watch, late, shows "a" deleted
    service.requeue.freed(["n1"], since=service.requeue.refusals.clock() - 1)
    assert asked == ["room came free on n1 for a pod refused since"]

    meta = waiting["metadata"]
    await client.post("/filter", data=filter_body(waiting, ["n1"]))
    bind = {"PodName": meta["name"], "PodNamespace": "default", "PodUID": meta["uid"], "Node": "n1"}
    assert (await (await client.post("/bind", data=orjson.dumps(bind))).json()) == {"Error": ""}
    assert len(service.requeue.refusals) == 0


async def test_a_pod_that_fits_somewhere_or_never_fits_is_not_remembered(client_for: ClientFor) -> None:
    cluster = make_cluster(make_node("n1", gpus=1, mem=16), make_node("n2", gpus=1, mem=16))
    service = make_service(cluster, requeue=lambda reason: None)
    client = await client_for(service)
    await client.post("/filter", data=filter_body(make_pod("fits", gpu_mem=16), ["n1", "n2"]))
    await client.post("/filter", data=filter_body(make_pod("never", gpu_mem=40), ["n1", "n2"]))
    assert len(service.requeue.refusals) == 0


async def test_an_expired_reservation_retries_the_pods_it_kept_out(client_for: ClientFor) -> None:
    """Nothing in the API changes when a reservation expires: without this the refused pod waits for the next
    cluster event, or kube-scheduler's flush after 5 minutes."""
    clock = FakeClock()
    cluster = make_cluster(make_node("n1", gpus=1, mem=16))
    orphan = make_pod("orphan", gpu_mem=16, node="n1", indexes=(0,), bound=False, assume_time=clock.now)
    cluster.apply_pod(orphan)
    assert [hold.observed for hold in cluster.nodes["n1"].holds.values()] == [False]
    asked: list[str] = []
    service = make_service(cluster, ledger=Ledger(cluster, 60.0, clock), requeue=asked.append, expiry_interval=0.01)
    service.requeue.refusals.clock = clock
    client = await client_for(service)
    clock.advance(1)
    reply = await (await client.post("/filter", data=filter_body(make_pod("waiting", gpu_mem=16), ["n1"]))).json()
    assert reply["NodeNames"] == [] and asked == []
    clock.advance(60)  # the orphan's TTL is over: the sweep frees it
    await eventually(lambda: asked, what="a request to retry")
    assert asked == ["room came free on n1 for a pod refused since"]
    await asyncio.sleep(0.05)
    assert len(asked) == 1, "once: the refusal was before the orphan's end, and nothing else came free"


async def test_without_a_way_to_ask_nothing_is_remembered(client_for: ClientFor) -> None:
    service = make_service(full_cluster())
    client = await client_for(service)
    reply = await (await client.post("/filter", data=filter_body(make_pod("waiting", gpu_mem=16), ["n1"]))).json()
    assert reply["NodeNames"] == []
    service.requeue.freed(["n1"], since=0)
    assert service.requeue.ask is None and len(service.requeue.refusals) == 0


def test_room_on_many_nodes_for_many_waiting_pods_asks_once() -> None:
    nodes = [make_node(f"n{number}", gpus=1, mem=16) for number in range(50)]
    cluster = make_cluster(*nodes)
    asked: list[str] = []
    service = make_service(cluster, requeue=asked.append)
    for number in range(1000):  # a thousand waiting pods of two sizes
        service.requeue.refusals.refused(f"waiting-{number}", Demand(memory=8 if number % 2 else 16))
    service.requeue.freed([f"n{number}" for number in range(50)], since=0)
    assert asked == ["room came free on n0 for a pod refused since"]
