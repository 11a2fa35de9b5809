"""Whether a pod fits on one node, and why not; the filter over many names agrees with judging each."""

from __future__ import annotations

import random

import pytest

from extender.core.devices import Demand
from extender.core.placement.filtering import filter_nodes, judged
from extender.core.placement.fit import Verdict
from extender.core.placement.judge import NOT_IN_CACHE, judge
from tests.builders import bound_pod, make_cluster, make_node, random_cluster, two_gpus_with_12_and_4_used


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
    cluster = make_cluster(make_node("n1", gpus=2, mem=16), pods=two_gpus_with_12_and_4_used())
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


@pytest.mark.parametrize("seed", range(5))
def test_filtering_through_the_fit_index_gives_the_same_answer_as_judging_each_node(seed: int) -> None:
    rng = random.Random(seed)
    cluster = random_cluster(rng)
    names = [*cluster.nodes, "ghost"]
    rng.shuffle(names)
    for need in range(1, 18):
        demand = Demand(need)
        fitting = cluster.fit_index.fitting(need, cluster.nodes)
        fast = filter_nodes(demand, names, cluster.nodes, "GiB", fitting)
        plain = [name for name in names if judge(demand, cluster.nodes.get(name), "GiB")[0] is Verdict.FITS]
        assert fast.passed == plain
        assert fast == filter_nodes(demand, names, cluster.nodes, "GiB")


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
    memo = cluster.memo.table(judged(Demand(12), "GiB"))  # a table is read afresh after changes (`NodeMemo`)
    assert "n1" not in memo
    assert filter_nodes(Demand(12), names, cluster.nodes, "GiB", fitting, memo).passed == names
