"""Placement decisions that `make mutation` found unguarded (`core/placement/`): what prioritize answers under
the fragmentation policy when it narrows (one node, several, all alike) and for a pod the policy leaves to fill;
the one reason said for many nodes refused alike (what kube-scheduler's message counts)."""

from __future__ import annotations

from extender.core.cache import Cache
from extender.core.devices import Demand, Request
from extender.core.placement.config import Policy, PolicyConfig
from extender.core.placement.filtering import DETAILED, FilterOutcome, same_reason, summarized
from extender.core.placement.fit import Cause
from tests.builders import bound_pod, make_cluster, placer_for
from tests.core.placement.test_fragmentation import BEST, OFF, TIES, ask, node, teach

FILL = PolicyConfig(policy=Policy.FILL)


def two_started_and_one_empty() -> Cache:
    """n1 and n2 hold 400 of a GPU each, n3 nothing: a 500 share on a started GPU leaves 100 that no typical
    shape wants on either, on n3 it cuts an empty GPU; halves and wholes are typical."""
    started = (bound_pod("r1", "n1", (0,), 400), bound_pod("r2", "n2", (0,), 400))
    cache = make_cluster(node("n1"), node("n2"), node("n3"), pods=started)
    teach(cache, (500, "4", 5), (1000, "8", 5))
    return cache


def test_prioritize_with_narrowing_scores_the_one_node_the_filter_would_pass() -> None:
    cache = two_started_and_one_empty()
    entries = placer_for(cache, BEST).prioritize(Demand(memory=500), ["n3", "n1", "n2"], cache.nodes, ask(500))
    assert entries == [{"Host": "n1", "Score": 10}]


def test_prioritize_with_narrowing_to_ties_scores_each_of_them_in_the_order_asked() -> None:
    cache = two_started_and_one_empty()
    entries = placer_for(cache, TIES).prioritize(Demand(memory=500), ["n3", "n2", "n1"], cache.nodes, ask(500))
    assert entries == [{"Host": "n2", "Score": 10}, {"Host": "n1", "Score": 10}]
    assert placer_for(cache, OFF).filter(Demand(memory=500), ["n3"], cache.nodes, "default/asking", ask(500)).passed


def test_prioritize_with_narrowing_says_nothing_when_every_node_is_alike() -> None:
    cache = two_started_and_one_empty()
    assert placer_for(cache, TIES).prioritize(Demand(memory=500), ["n2", "n1"], cache.nodes, ask(500)) == []


def test_a_pod_without_an_ask_is_prioritized_as_fill_does() -> None:
    cache = two_started_and_one_empty()
    names = ["n3", "n1", "n2"]
    entries = placer_for(cache, BEST).prioritize(Demand(memory=500), names, cache.nodes, None)
    assert entries == placer_for(cache, FILL).prioritize(Demand(memory=500), names, cache.nodes, None)
    assert entries == [{"Host": "n3", "Score": 3}, {"Host": "n1", "Score": 6}, {"Host": "n2", "Score": 6}]


def test_the_reason_shared_by_nodes_refused_alike_names_the_cause() -> None:
    one, two = Demand(memory=4000), Demand(memory=8000, devices=2)
    assert same_reason(one, Cause.MEMORY, "MiB") == "needs 4000 MiB on one GPU; no GPU here has that much free"
    assert same_reason(two, Cause.MEMORY, "MiB") == (
        "needs 2 GPUs with 4000 MiB free each; fewer GPUs here have that much free"
    )
    assert same_reason(Demand(memory=4000, cores=30), Cause.COMPUTE, "MiB") == (
        "needs 4000 MiB and 30 % compute on one GPU; no GPU here has the compute left"
    )
    assert same_reason(two, Cause.SLOTS, "MiB") == (
        "needs 4000 MiB on 2 GPUs; every GPU here that could hold it runs its most pods"
    )
    assert same_reason(one, Cause.EXCLUSIVE, "MiB") == (
        "needs one GPU to itself (4000 MiB); every GPU here that could hold it runs a pod"
    )
    assert same_reason(one, Cause.SLICES, "MiB") == (
        "needs 4000 MiB on one GPU; no MIG GPU here that could hold it has the slices free"
    )
    assert same_reason(two, Cause.NUMA, "MiB") == (
        "needs 2 GPUs with 4000 MiB free each on one NUMA node; no NUMA node here has that"
    )
    assert same_reason(Demand(memory=0, percent=50), Cause.MEMORY, "GiB") == (
        "needs 50 % of its memory on one GPU; no GPU here has that much free"
    )


def test_the_shared_reason_is_the_largest_request_of_a_pod_of_several_containers() -> None:
    """By GPUs, then memory, then compute: the request that a node refused for room failed at the latest."""
    small, wide, deep = Request(1, 6000), Request(2, 3000), Request(2, 3000, cores=20)
    demand = Demand(memory=18000, containers=(small, deep, wide))
    assert same_reason(demand, Cause.COMPUTE, "MiB") == (
        "needs 3000 MiB and 20 % compute on 2 GPUs; no GPU here has the compute left"
    )
    demand = Demand(memory=12000, containers=(Request(1, 5000), Request(1, 7000), Request(1, 6000)))
    assert same_reason(demand, Cause.MEMORY, "MiB") == "needs 7000 MiB on one GPU; no GPU here has that much free"


def test_more_nodes_refused_for_room_than_detailed_share_one_reason_per_cause() -> None:
    demand = Demand(memory=4000, cores=30)
    outcome = FilterOutcome()
    for number in range(DETAILED):
        outcome.failed[f"full-{number}"] = f"GPU 0 has {number} MiB free"
        outcome.full[f"full-{number}"] = Cause.MEMORY
    outcome.failed["busy"], outcome.full["busy"] = "GPU 0 has 10 % compute free", Cause.COMPUTE
    outcome.failed["down"] = "node down is not Ready"
    said = summarized(outcome, demand, "MiB")
    assert said["down"] == "node down is not Ready"
    assert said["busy"] == same_reason(demand, Cause.COMPUTE, "MiB")
    assert {said[f"full-{number}"] for number in range(DETAILED)} == {same_reason(demand, Cause.MEMORY, "MiB")}
    del outcome.full["busy"]
    assert summarized(outcome, demand, "MiB") == outcome.failed
