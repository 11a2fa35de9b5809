"""Preemption: which candidate nodes evicting victims frees, victims of our own, and full nodes beyond it."""

from __future__ import annotations

from typing import Any

from extender.core.devices import Demand
from extender.core.preemption import MAY_NOT_PREEMPT, NO_LOWER_PRIORITY, beyond_preemption, preempt_candidates
from tests.builders import bound_pod, make_cluster, make_node, make_pod


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
