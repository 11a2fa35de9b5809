"""The fill policy: binpack and spread, kube-scheduler's scoring arithmetic, device choice."""

from __future__ import annotations

import random

import pytest

from extender.core.devices import Demand, Strategy
from extender.core.placement.config import PolicyConfig
from extender.core.placement.fill import choose_devices, least_allocated, most_allocated, score_node
from tests.builders import bound_pod, make_cluster, make_node, random_cluster, two_gpus_with_12_and_4_used

BINPACK = PolicyConfig()


SPREAD = PolicyConfig(node_strategy=Strategy.SPREAD, device_strategy=Strategy.SPREAD)


@pytest.mark.parametrize(
    ("used", "capacity", "most", "least"),
    [(12, 16, 7, 2), (16, 16, 10, 0), (0, 16, 0, 10), (5, 32, 1, 8), (0, 0, 0, 0)],
    ids=["12*10//16=7,4*10//16=2", "full", "empty", "5*10//32=1,27*10//32=8", "no-capacity"],
)
def test_score_arithmetic_follows_kube_scheduler(used: int, capacity: int, most: int, least: int) -> None:
    assert (most_allocated(used, capacity), least_allocated(used, capacity)) == (most, least)


def test_binpack_chooses_the_fullest_device_that_fits() -> None:
    cluster = make_cluster(make_node("n1", gpus=2, mem=16), pods=two_gpus_with_12_and_4_used())
    assert choose_devices(Demand(4), cluster.nodes["n1"], Strategy.BINPACK) == (0,)  # 4 free beats 12 free
    assert choose_devices(Demand(5), cluster.nodes["n1"], Strategy.BINPACK) == (1,)  # only GPU 1 fits


def test_spread_chooses_the_emptiest_device() -> None:
    cluster = make_cluster(make_node("n1", gpus=2, mem=16), pods=two_gpus_with_12_and_4_used())
    assert choose_devices(Demand(4), cluster.nodes["n1"], Strategy.SPREAD) == (1,)


def test_equal_devices_break_ties_by_lowest_index() -> None:
    cluster = make_cluster(make_node("n1", gpus=4, mem=16))
    assert choose_devices(Demand(4), cluster.nodes["n1"], Strategy.BINPACK) == (0,)
    assert choose_devices(Demand(8, devices=2), cluster.nodes["n1"], Strategy.SPREAD) == (0, 1)


def test_multi_device_demands_take_that_many_devices_or_none() -> None:
    cluster = make_cluster(make_node("n1", gpus=2, mem=16), pods=two_gpus_with_12_and_4_used())
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


@pytest.mark.parametrize("seed", range(5))
def test_choosing_one_device_in_one_pass_matches_the_sorted_order(seed: int) -> None:
    rng = random.Random(seed)
    cluster = random_cluster(rng)
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


def test_scores_stay_within_0_and_10_when_a_gpu_holds_more_than_it_has() -> None:
    # GPU 0 turned unhealthy (capacity 0) under a running 16 GiB pod; GPU 1 is empty.
    node = make_node("n1", devices=[{"index": 0, "memory": 16, "healthy": False}, {"index": 1, "memory": 16}])
    cluster = make_cluster(node, pods=(bound_pod("a", "n1", (0,), 16),))
    assert 0 <= score_node(Demand(16), cluster.nodes["n1"], BINPACK) <= 10
    assert 0 <= score_node(Demand(16), cluster.nodes["n1"], SPREAD) <= 10
