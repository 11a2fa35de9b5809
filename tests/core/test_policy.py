"""Filter verdicts and reasons, scores with their arithmetic, device choice, and the preemption check."""

from __future__ import annotations

import random
from typing import Any

import pytest

from extender.core.cache import Cache
from extender.core.devices import Demand, Strategy
from extender.core.fit import Verdict
from extender.core.memo import Question
from extender.core.policy import (
    NOT_IN_CACHE,
    PolicyConfig,
    choose_devices,
    filter_nodes,
    judge,
    judged,
    least_allocated,
    most_allocated,
    score_node,
)
from extender.core.preemption import MAY_NOT_PREEMPT, NO_LOWER_PRIORITY, beyond_preemption, preempt_candidates
from tests.builders import bound_pod, make_cluster, make_node, make_pod

BINPACK = PolicyConfig()
SPREAD = PolicyConfig(node_strategy=Strategy.SPREAD, device_strategy=Strategy.SPREAD)


def two_gpus_with_12_and_4_used() -> tuple[object, ...]:
    """n1: GPU 0 has 16 - 12 = 4 free, GPU 1 has 16 - 4 = 12 free."""
    return (bound_pod("a", "n1", (0,), 12), bound_pod("b", "n1", (1,), 4))


@pytest.mark.parametrize(
    ("demand", "verdict", "reason"),
    [
        (Demand(12), Verdict.FITS, ""),
        (Demand(13), Verdict.FAILED, "needs 13 GiB on one GPU; largest free is 12 GiB (GPU 1 of 2)"),
        (Demand(17), Verdict.UNRESOLVABLE, "needs 17 GiB on one GPU; the largest GPU here has 16 GiB"),
        (Demand(8, devices=2), Verdict.FITS, ""),  # 4 free on GPU 0 and 12 on GPU 1: both hold 4
        (Demand(10, devices=2), Verdict.FAILED, "needs 2 GPUs with 5 GiB free each; 1 of 2 have that much"),
        (Demand(48, devices=3), Verdict.UNRESOLVABLE, "needs 3 GPUs with 16 GiB each; 2 of 2 GPUs here are that large"),
    ],
)
def test_judge_gives_a_verdict_and_a_reason(demand: Demand, verdict: Verdict, reason: str) -> None:
    cluster = make_cluster(make_node("n1", gpus=2, mem=16), pods=two_gpus_with_12_and_4_used())  # type: ignore[arg-type]
    assert judge(demand, cluster.nodes["n1"], "GiB")[:2] == (verdict, reason)


def test_nodes_without_gpus_are_unresolvable() -> None:
    cluster = make_cluster(make_node("cpu", gpus=0))
    assert judge(Demand(4), cluster.nodes["cpu"], "GiB")[:2] == (
        Verdict.UNRESOLVABLE,
        "no GPUs: no aliyun.com/gpu-mem in capacity",
    )


def test_a_node_that_is_not_ready_fails_but_could_recover() -> None:
    cluster = make_cluster(make_node("n1", ready=False))
    assert judge(Demand(4), cluster.nodes["n1"], "GiB")[:2] == (Verdict.FAILED, "node is not Ready")


def test_unknown_nodes_fail_with_a_reason_and_no_error() -> None:
    assert judge(Demand(4), None, "GiB")[:2] == (Verdict.FAILED, NOT_IN_CACHE)


def test_filter_splits_names_into_passed_failed_and_unresolvable() -> None:
    cluster = make_cluster(
        make_node("big", gpus=1, mem=40),
        make_node("full", gpus=1, mem=16),
        make_node("small", gpus=1, mem=8),
        pods=(bound_pod("a", "full", (0,), 10),),
    )
    outcome = filter_nodes(Demand(12), ["big", "full", "small", "ghost"], cluster.nodes, "GiB")
    assert outcome.passed == ["big"]
    assert set(outcome.failed) == {"full", "ghost"}
    assert set(outcome.unresolvable) == {"small"}


def test_a_pod_without_gpu_demand_passes_every_node() -> None:
    outcome = filter_nodes(Demand(0), ["x", "y"], {}, "GiB")
    assert (outcome.passed, outcome.failed, outcome.unresolvable) == (["x", "y"], {}, {})


@pytest.mark.parametrize(
    ("used", "capacity", "most", "least"),
    [(12, 16, 7, 2), (16, 16, 10, 0), (0, 16, 0, 10), (5, 32, 1, 8), (0, 0, 0, 0)],
    ids=["12*10//16=7,4*10//16=2", "full", "empty", "5*10//32=1,27*10//32=8", "no-capacity"],
)
def test_score_arithmetic_follows_kube_scheduler(used: int, capacity: int, most: int, least: int) -> None:
    assert (most_allocated(used, capacity), least_allocated(used, capacity)) == (most, least)


def test_binpack_chooses_the_fullest_device_that_fits() -> None:
    cluster = make_cluster(make_node("n1", gpus=2, mem=16), pods=two_gpus_with_12_and_4_used())  # type: ignore[arg-type]
    assert choose_devices(Demand(4), cluster.nodes["n1"], Strategy.BINPACK) == (0,)  # 4 free beats 12 free
    assert choose_devices(Demand(5), cluster.nodes["n1"], Strategy.BINPACK) == (1,)  # only GPU 1 fits


def test_spread_chooses_the_emptiest_device() -> None:
    cluster = make_cluster(make_node("n1", gpus=2, mem=16), pods=two_gpus_with_12_and_4_used())  # type: ignore[arg-type]
    assert choose_devices(Demand(4), cluster.nodes["n1"], Strategy.SPREAD) == (1,)


def test_equal_devices_break_ties_by_lowest_index() -> None:
    cluster = make_cluster(make_node("n1", gpus=4, mem=16))
    assert choose_devices(Demand(4), cluster.nodes["n1"], Strategy.BINPACK) == (0,)
    assert choose_devices(Demand(8, devices=2), cluster.nodes["n1"], Strategy.SPREAD) == (0, 1)


def test_multi_device_demands_take_that_many_devices_or_none() -> None:
    cluster = make_cluster(make_node("n1", gpus=2, mem=16), pods=two_gpus_with_12_and_4_used())  # type: ignore[arg-type]
    assert choose_devices(Demand(8, devices=2), cluster.nodes["n1"], Strategy.BINPACK) == (0, 1)
    assert choose_devices(Demand(10, devices=2), cluster.nodes["n1"], Strategy.BINPACK) is None


def test_binpack_score_weighs_device_fill_and_node_fill() -> None:
    # n1: 2 x 16, GPU 0 holds 8. A 4 GiB pod goes to GPU 0 (fuller): device (8+4)*10//16 = 7,
    # node (8+4)*10//32 = 3; weights 1 and 1: (7 + 3) // 2 = 5.
    cluster = make_cluster(make_node("n1", gpus=2, mem=16), pods=(bound_pod("a", "n1", (0,), 8),))
    assert score_node(Demand(4), cluster.nodes["n1"], BINPACK) == 5


def test_spread_score_prefers_the_emptier_node() -> None:
    # Same node, spread: GPU 1 (empty) is chosen: device (16-4)*10//16 = 7, node (32-12)*10//32 = 6; (7+6)//2 = 6.
    cluster = make_cluster(make_node("n1", gpus=2, mem=16), pods=(bound_pod("a", "n1", (0,), 8),))
    empty = make_cluster(make_node("n2", gpus=2, mem=16))
    assert score_node(Demand(4), cluster.nodes["n1"], SPREAD) == 6
    # n2 empty: device (16-4)*10//16 = 7, node (32-4)*10//32 = 8; (7+8)//2 = 7.
    assert score_node(Demand(4), empty.nodes["n2"], SPREAD) == 7


def test_weights_come_from_configuration() -> None:
    cluster = make_cluster(make_node("n1", gpus=2, mem=16), pods=(bound_pod("a", "n1", (0,), 8),))
    device_only = PolicyConfig(node_weight=0, device_weight=1)
    assert score_node(Demand(4), cluster.nodes["n1"], device_only) == 7  # (8+4)*10//16


def test_nodes_where_the_pod_does_not_fit_score_zero() -> None:
    cluster = make_cluster(make_node("n1", gpus=1, mem=8))
    assert score_node(Demand(12), cluster.nodes["n1"], BINPACK) == 0
    assert score_node(Demand(4), None, BINPACK) == 0


def test_preempt_keeps_only_nodes_where_the_victims_free_enough() -> None:
    pods = (bound_pod("v1", "a", (0,), 12), bound_pod("v2", "b", (0,), 4), bound_pod("stay", "b", (0,), 10))
    cluster = make_cluster(make_node("a", gpus=1), make_node("b", gpus=1), pods=pods)
    uid = {pod["metadata"]["name"]: pod["metadata"]["uid"] for pod in pods}
    kept = preempt_candidates(Demand(12), {"a": [uid["v1"]], "b": [uid["v2"]], "ghost": []}, cluster)
    # a: 16 - 12 + 12 = 16 free >= 12; b: 16 - 14 + 4 = 6 < 12; ghost: unknown.
    assert kept == {"a": [uid["v1"]]}


def test_preempt_ignores_victims_that_hold_no_gpu_memory() -> None:
    cluster = make_cluster(make_node("a", gpus=1), pods=(bound_pod("v", "a", (0,), 12, uid="victim"),))
    # Evicting a pod the cache does not count frees nothing: 16 - 12 = 4 < 8 stays 4.
    assert preempt_candidates(Demand(8), {"a": ["cpu-only"]}, cluster) == {}
    assert preempt_candidates(Demand(8), {"a": ["victim", "cpu-only"]}, cluster) == {"a": ["victim", "cpu-only"]}


def _with_priority(pod: dict[str, Any], priority: int) -> dict[str, Any]:
    pod["spec"]["priority"] = priority
    return pod


def test_preempt_names_its_own_victims_when_the_schedulers_free_no_single_gpu() -> None:
    """kube-scheduler picks the lowest-priority pods until the node's total fits: here the 10 and the 5, on
    two different GPUs, which leaves each GPU 8 short. Evicting the 5 and the 20 frees GPU 1 whole."""
    pods = (
        _with_priority(bound_pod("p30", "a", (0,), 8), 30),
        _with_priority(bound_pod("p10", "a", (0,), 8), 10),
        _with_priority(bound_pod("p20", "a", (1,), 8), 20),
        _with_priority(bound_pod("p5", "a", (1,), 8), 5),
    )
    cluster = make_cluster(make_node("a", gpus=2, mem=16), pods=pods)
    uid = {pod["metadata"]["name"]: pod["metadata"]["uid"] for pod in pods}
    kept = preempt_candidates(Demand(16), {"a": [uid["p10"], uid["p5"]]}, cluster, priority=1000)
    assert sorted(kept["a"]) == sorted([uid["p5"], uid["p20"]])


def test_preempt_never_names_a_victim_of_equal_or_higher_priority() -> None:
    pods = (
        _with_priority(bound_pod("p10", "a", (0,), 8), 10),
        _with_priority(bound_pod("p5", "a", (1,), 8), 5),
        _with_priority(bound_pod("p100", "a", (0,), 8), 100),
        _with_priority(bound_pod("p200", "a", (1,), 8), 200),
    )
    cluster = make_cluster(make_node("a", gpus=2, mem=16), pods=pods)
    uid = {pod["metadata"]["name"]: pod["metadata"]["uid"] for pod in pods}
    # Freeing a GPU would need the 100 or the 200: not for a preemptor of priority 100.
    assert preempt_candidates(Demand(16), {"a": [uid["p10"], uid["p5"]]}, cluster, priority=100) == {}


def test_preempt_keeps_every_candidate_for_a_pod_without_gpu_demand() -> None:
    assert preempt_candidates(Demand(0), {"x": ["1"], "y": []}, make_cluster()) == {"x": ["1"], "y": []}


# --- the fast paths agree with the plain definitions -------------------------------------------------------


def _random_cluster(rng: random.Random) -> Cache:
    nodes = [
        make_node(f"n{i}", gpus=rng.choice((1, 2, 4)), mem=rng.choice((8, 16)), ready=rng.random() > 0.1)
        for i in range(12)
    ]
    cluster = make_cluster(*nodes)
    for i in range(30):
        node = f"n{rng.randrange(12)}"
        state = cluster.nodes[node]
        index = rng.randrange(len(state.devices))
        amount = rng.randint(1, 8)
        if state.free[index] >= amount:
            cluster.apply_pod(bound_pod(f"p{i}", node, (index,), amount))
    return cluster


@pytest.mark.parametrize("seed", range(5))
def test_filtering_through_the_fit_index_gives_the_same_answer_as_judging_each_node(seed: int) -> None:
    rng = random.Random(seed)
    cluster = _random_cluster(rng)
    names = [*cluster.nodes, "ghost"]
    rng.shuffle(names)
    for need in range(1, 18):
        demand = Demand(need)
        fitting = cluster.fit_index.fitting(need, cluster.nodes)
        fast = filter_nodes(demand, names, cluster.nodes, "GiB", fitting)
        plain = [name for name in names if judge(demand, cluster.nodes.get(name), "GiB")[0] is Verdict.FITS]
        assert fast.passed == plain
        assert fast == filter_nodes(demand, names, cluster.nodes, "GiB")


@pytest.mark.parametrize("seed", range(5))
def test_choosing_one_device_in_one_pass_matches_the_sorted_order(seed: int) -> None:
    rng = random.Random(seed)
    cluster = _random_cluster(rng)
    for state in cluster.nodes.values():
        for need in range(1, 17):
            for strategy in Strategy:
                pairs = zip(state.free, state.devices, strict=True)
                order = sorted(
                    ((free, device.index) for free, device in pairs if free >= need),
                    key=(lambda pair: pair) if strategy is Strategy.BINPACK else (lambda pair: (-pair[0], pair[1])),
                )
                expected = (order[0][1],) if order else None
                assert choose_devices(Demand(need), state, strategy) == expected


def test_the_fit_index_follows_every_change_of_a_node() -> None:
    node = make_node("n1", gpus=1, mem=16)
    cluster = make_cluster(node)
    fits_12 = cluster.fit_index.fitting(12, cluster.nodes)
    assert fits_12 == {"n1"}
    pod = bound_pod("a", "n1", (0,), 8)
    cluster.apply_pod(pod)
    assert fits_12 == set()  # 8 free now
    cluster.apply_pod(pod, deleted=True)
    assert fits_12 == {"n1"}
    cluster.apply_node(make_node("n1", gpus=1, mem=16, ready=False))
    assert fits_12 == set()
    cluster.apply_node(node)
    cluster.apply_node(node, deleted=True)
    assert fits_12 == set()


def test_remembered_answers_are_forgotten_when_their_node_changes() -> None:
    cluster = make_cluster(make_node("n1", gpus=1, mem=16), make_node("n2", gpus=1, mem=16))
    names = ["n1", "n2"]
    memo = cluster.memo.table(judged(Demand(12), "GiB"))
    occupied = bound_pod("a", "n1", (0,), 8)
    cluster.apply_pod(occupied)
    fitting = cluster.fit_index.fitting(12, cluster.nodes)
    first = filter_nodes(Demand(12), names, cluster.nodes, "GiB", fitting, memo)
    assert (first.passed, list(memo)) == (["n2"], ["n1"])  # only n1 was judged, and remembered
    cluster.apply_pod(occupied, deleted=True)
    assert "n1" not in memo
    assert filter_nodes(Demand(12), names, cluster.nodes, "GiB", fitting, memo).passed == names


def test_the_memo_keeps_only_the_most_recent_questions() -> None:
    cluster = make_cluster()
    cluster.memo.limit = 2
    first = cluster.memo.table(Question("a"))
    cluster.memo.table(Question("b"))
    cluster.memo.table(Question("c"))
    assert cluster.memo.table(Question("a")) is not first


def test_the_fit_index_keeps_only_the_most_recent_demand_sizes() -> None:
    cluster = make_cluster(make_node("n1"))
    cluster.fit_index.limit = 2
    first = cluster.fit_index.fitting(1, cluster.nodes)
    cluster.fit_index.fitting(2, cluster.nodes)
    cluster.fit_index.fitting(3, cluster.nodes)
    assert cluster.fit_index.fitting(1, cluster.nodes) is not first  # evicted, rebuilt


def test_scores_stay_within_0_and_10_when_a_gpu_holds_more_than_it_has() -> None:
    # GPU 0 turned unhealthy (capacity 0) under a running 16 GiB pod; GPU 1 is empty.
    node = make_node("n1", devices=[{"index": 0, "memory": 16, "healthy": False}, {"index": 1, "memory": 16}])
    cluster = make_cluster(node, pods=(bound_pod("a", "n1", (0,), 16),))
    assert 0 <= score_node(Demand(16), cluster.nodes["n1"], BINPACK) <= 10
    assert 0 <= score_node(Demand(16), cluster.nodes["n1"], SPREAD) <= 10


def _preemptor(priority: int, policy: str | None = None) -> dict[str, Any]:
    pod = _with_priority(make_pod("preemptor", gpu_mem=16), priority)
    if policy is not None:
        pod["spec"]["preemptionPolicy"] = policy
    return pod


def test_a_full_node_is_beyond_preemption_when_no_pod_on_its_gpus_has_a_lower_priority() -> None:
    """kube-scheduler evicts only lower priorities: where there are none, simulating evictions is wasted work."""
    pods = (
        _with_priority(bound_pod("p10", "low", (0,), 16), 10),
        _with_priority(bound_pod("p50", "high", (0,), 16), 50),
    )
    cluster = make_cluster(make_node("low", gpus=1), make_node("high", gpus=1), make_node("empty", gpus=1), pods=pods)
    refused = {"low": "full", "high": "full", "empty": "full"}
    why = "full" + NO_LOWER_PRIORITY
    assert beyond_preemption(refused, cluster, _preemptor(50)) == {"high": why, "empty": why}
    assert beyond_preemption(refused, cluster, _preemptor(100)) == {"empty": why}
    assert beyond_preemption(refused, cluster, _preemptor(10)) == {"low": why, "high": why, "empty": why}


def test_a_pod_that_may_not_preempt_finds_every_full_node_beyond_preemption() -> None:
    cluster = make_cluster(make_node("a", gpus=1), pods=(bound_pod("p", "a", (0,), 16),))
    assert beyond_preemption({"a": "full"}, cluster, _preemptor(1000, "Never")) == {"a": "full" + MAY_NOT_PREEMPT}


def test_the_lowest_priority_on_a_node_follows_its_pods() -> None:
    cluster = make_cluster(make_node("a", gpus=2), pods=(_with_priority(bound_pod("p", "a", (0,), 8, uid="p"), 7),))
    assert cluster.lowest_priority("a") == 7
    cluster.apply_pod(_with_priority(bound_pod("q", "a", (1,), 8), 3))
    assert cluster.lowest_priority("a") == 3
    cluster.apply_pod(_with_priority(bound_pod("p", "a", (0,), 8, uid="p"), 7), deleted=True)
    assert cluster.lowest_priority("a") == 3
    assert cluster.lowest_priority("nowhere") is None
