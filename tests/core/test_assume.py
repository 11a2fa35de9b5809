"""Assumptions (`core/assume.py`): the node a filter passed alone is held for its pod until its bind comes, so the
next pods of a burst are judged as if it were taken; the bind takes it as its decision when nothing changed, else
decides again; a filter of the same pod does not compete with it, and one whose bind never comes is dropped."""

from __future__ import annotations

from typing import Any

import pytest

from extender.core.devices import Demand
from extender.core.holds import Allocation, HoldState
from extender.core.ledger import ASSUMED_TTL, Ledger
from extender.core.nodes import NodeState
from extender.core.placement.config import Ask, PolicyConfig
from extender.core.placement.fit import Placement
from extender.core.quota.limits import read_quota
from extender.service.context import Service
from tests.builders import (
    PROFILE,
    FakeClock,
    bind_body,
    bound_pod,
    filter_body,
    make_cluster,
    make_node,
    make_pod,
    make_quota,
    quotas_of,
)
from tests.conftest import ClientFor, make_service

BEST = PolicyConfig()
"""The default policy: the filter passes the one best node."""


def nodes_chosen_on(service: Service, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The nodes `Placer.choose` is asked about from now on (a bind that takes its assumption asks none)."""
    chosen: list[str] = []
    choose = service.placer.choose

    def counted(demand: Demand, state: NodeState, ask: Ask | None = None) -> Placement | None:
        chosen.append(state.name)
        return choose(demand, state, ask)

    monkeypatch.setattr(service.placer, "choose", counted)
    return chosen


def two_one_gpu_nodes() -> Any:
    """Two nodes of one 16 GiB GPU: a pod of 10 GiB fits either, two of them only one each."""
    return make_cluster(make_node("n1", gpus=1, mem=16), make_node("n2", gpus=1, mem=16))


async def test_the_next_pod_of_a_burst_is_judged_as_if_the_first_had_its_node(client_for: ClientFor) -> None:
    cluster = two_one_gpu_nodes()
    client = await client_for(make_service(cluster, policy=BEST))
    first, second = make_pod("first", gpu_mem=10), make_pod("second", gpu_mem=10)
    one = await (await client.post("/filter", data=filter_body(first, ["n1", "n2"]))).json()
    two = await (await client.post("/filter", data=filter_body(second, ["n1", "n2"]))).json()
    (taken,) = one["NodeNames"]
    assert two["NodeNames"] == [{"n1": "n2", "n2": "n1"}[taken]], "not the node its predecessor will be bound to"
    hold = cluster.hold_of(first["metadata"]["uid"])
    assert hold is not None and hold.state is HoldState.ASSUMED and hold.allocation.node == taken
    assert cluster.nodes[taken].used == [10], "counted, though nothing is written"


async def test_the_bind_decides_again_and_reserves_where_the_filter_assumed(client_for: ClientFor) -> None:
    cluster = two_one_gpu_nodes()
    client = await client_for(make_service(cluster, policy=BEST))
    pod = make_pod("p", gpu_mem=10)
    (node,) = (await (await client.post("/filter", data=filter_body(pod, ["n1", "n2"]))).json())["NodeNames"]
    reply = await (await client.post("/bind", data=bind_body(pod, node))).json()
    assert reply["Error"] == ""
    hold = cluster.hold_of(pod["metadata"]["uid"])
    assert hold is not None and hold.state is not HoldState.ASSUMED and cluster.nodes[node].used == [10]


async def test_a_pod_filtered_again_does_not_compete_with_its_own_assumption(client_for: ClientFor) -> None:
    """One node with room for one such pod: a second filter of the same pod still finds it free."""
    cluster = make_cluster(make_node("n1", gpus=1, mem=16))
    client = await client_for(make_service(cluster, policy=BEST))
    pod = make_pod("p", gpu_mem=10)
    for _ in range(2):
        reply = await (await client.post("/filter", data=filter_body(pod, ["n1"]))).json()
        assert reply["NodeNames"] == ["n1"], reply
    assert cluster.nodes["n1"].used == [10], "held once"


async def test_nothing_is_assumed_where_the_filter_passes_several_nodes(client_for: ClientFor) -> None:
    """Under the fill policy every node that fits passes: which one kube-scheduler takes is not known here."""
    cluster = two_one_gpu_nodes()
    client = await client_for(make_service(cluster))
    pod = make_pod("p", gpu_mem=10)
    reply = await (await client.post("/filter", data=filter_body(pod, ["n1", "n2"]))).json()
    assert sorted(reply["NodeNames"]) == ["n1", "n2"]
    assert cluster.hold_of(pod["metadata"]["uid"]) is None


def test_an_assumption_whose_bind_never_comes_is_dropped_and_not_counted_as_an_expiry() -> None:
    cluster = make_cluster(make_node("n1", gpus=1, mem=16))
    clock = FakeClock()
    ledger = Ledger(cluster, 60.0, clock, quotas_of(cluster))
    assert ledger.assume(Allocation.uniform("uid-p", "default/p", "n1", (0,), 10), 0)
    assert not ledger.assume(Allocation.uniform("uid-q", "default/q", "n1", (0,), 10), 0), "no room left for another"
    clock.advance(ASSUMED_TTL / 2)
    assert ledger.expire() == [] and cluster.nodes["n1"].used == [10]
    clock.advance(ASSUMED_TTL)
    assert ledger.expire() == [], "an assumption is no reservation: nothing to report"
    assert cluster.hold_of("uid-p") is None and cluster.nodes["n1"].used == [0]
    assert "uid-p" not in cluster.abandoned, "nothing was written for it"


async def test_a_bind_to_a_node_as_its_filter_left_it_takes_the_assumption_without_choosing_again(
    client_for: ClientFor, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster = two_one_gpu_nodes()
    service = make_service(cluster, policy=BEST)
    client = await client_for(service)
    pod = make_pod("p", gpu_mem=10)
    (node,) = (await (await client.post("/filter", data=filter_body(pod, ["n1", "n2"]))).json())["NodeNames"]
    assumed = cluster.hold_of(pod["metadata"]["uid"])
    chosen = nodes_chosen_on(service, monkeypatch)
    reply = await (await client.post("/bind", data=bind_body(pod, node))).json()
    hold = cluster.hold_of(pod["metadata"]["uid"])
    assert reply["Error"] == "" and chosen == []
    assert assumed is not None and hold is not None and hold.allocation == assumed.allocation
    assert hold.state is not HoldState.ASSUMED and cluster.nodes[node].used == [10]


async def test_a_bind_to_a_node_that_changed_since_its_filter_chooses_again(
    client_for: ClientFor, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster = make_cluster(make_node("n1", gpus=2, mem=16))
    service = make_service(cluster, policy=BEST)
    client = await client_for(service)
    pod = make_pod("p", gpu_mem=10)
    await client.post("/filter", data=filter_body(pod, ["n1"]))
    assumed = cluster.hold_of(pod["metadata"]["uid"])
    assert assumed is not None and assumed.state is HoldState.ASSUMED
    (gpu,) = assumed.allocation.indexes
    cluster.apply_pod(bound_pod("other", "n1", (gpu,), 14))  # another scheduler's pod, on the GPU it assumed
    chosen = nodes_chosen_on(service, monkeypatch)
    reply = await (await client.post("/bind", data=bind_body(pod, "n1"))).json()
    hold = cluster.hold_of(pod["metadata"]["uid"])
    assert reply["Error"] == "" and chosen == ["n1"]
    assert hold is not None and hold.allocation.indexes == (1 - gpu,), "the GPU left, not the one taken meanwhile"


def test_an_assumption_is_taken_as_decided_only_by_the_same_shapes_on_its_node_where_it_still_fits() -> None:
    cluster = make_cluster(make_node("n1", gpus=2, mem=16), make_node("n2", gpus=2, mem=16))
    clock = FakeClock()
    ledger = Ledger(cluster, 60.0, clock, quotas_of(cluster))
    assert ledger.assume(Allocation.uniform("uid-p", "default/p", "n1", (0,), 10), build=7)
    assert ledger.take_assumed("uid-p", "n2", 7) is None, "a bind to another node"
    assert ledger.take_assumed("uid-p", "n1", 8) is None, "the typical shapes rebuilt since"
    cluster.apply_pod(bound_pod("other", "n1", (1,), 4))  # the node changed, but not where the pod fits
    clock.advance(1.0)
    taken = ledger.take_assumed("uid-p", "n1", 7)
    assert taken is not None and taken.state is HoldState.RESERVED and taken.since == clock()
    assert cluster.hold_of("uid-p") == taken and cluster.reserved["uid-p"] == taken
    assert ledger.take_assumed("uid-p", "n1", 7) is None, "a reservation is no assumption"


def test_an_assumption_on_a_gpu_marked_unhealthy_since_is_not_taken() -> None:
    """The operators' list of unhealthy GPUs (gpushare's `kube-system/unhealthy-gpu-<node>` ConfigMap) names GPU
    0 after the filter assumed the pod there: the bind must choose again (GPU 1)."""
    cluster = make_cluster(make_node("n1", gpus=2, mem=16))
    ledger = Ledger(cluster, 60.0, FakeClock(), quotas_of(cluster))
    assert ledger.assume(Allocation.uniform("uid-p", "default/p", "n1", (0,), 10), build=7)
    cluster.apply_unhealthy("n1", frozenset({0}))
    assert not cluster.nodes["n1"].devices[0].usable
    assert ledger.take_assumed("uid-p", "n1", 7) is None


@pytest.mark.parametrize(("limit", "taken"), [(10, True), (9, False)], ids=["quota-just-enough", "quota-lowered"])
def test_an_assumption_is_taken_as_decided_only_within_its_namespaces_quota_as_it_is_now(
    limit: int, taken: bool
) -> None:
    """The assumption counts in its namespace's quota already (the pod's own share is not counted twice); a quota
    lowered since it was made refuses it, and the bind decides again (and is refused as any would be)."""
    cluster = make_cluster(make_node("n1", gpus=2, mem=16))
    ledger = Ledger(cluster, 60.0, FakeClock(), quotas_of(cluster))
    assert ledger.assume(Allocation.uniform("uid-p", "default/p", "n1", (0,), 10), build=7)
    quota = make_quota("team", "default", **{"limits.aliyun.com/gpu-mem": str(limit)})
    quotas_of(cluster).replace([read_quota(quota, PROFILE.quota_resources)])
    assert (ledger.take_assumed("uid-p", "n1", 7) is not None) is taken
