"""The fill policy, the prioritize scores and the pod's ask (`fill.py`, `narrowing.scores`, `config.py`) where
`make mutation` found them unguarded: the GPUs binpack and spread give a pod of several GPUs, fill's grants (UUIDs,
no init containers) and its general fit by the configured strategy, a node's score for a pod of two containers on
one GPU, the memo of scores per size of pod and per configuration and never shared by views of nodes, the scores
of nodes within the tolerance, the memory a pod asks, and which demands the fragmentation policy places."""

from __future__ import annotations

import math

from extender.core.cache import Cache
from extender.core.devices import Demand, Request, Strategy
from extender.core.holds import Grant
from extender.core.nodes import NodeState
from extender.core.placement.config import Ask, Policy, PolicyConfig, ask_of
from extender.core.placement.fill import choose_devices, fill_choice, score_node
from extender.core.placement.fit import Placement
from extender.core.placement.narrowing import scores
from tests.builders import (
    HAMI,
    bound_pod,
    make_cluster,
    make_hami_cluster,
    make_hami_node,
    make_hami_pod,
    make_node,
    make_pod,
    placer_for,
    running_hami_pod,
)

BINPACK = PolicyConfig(policy=Policy.FILL)
SPREAD = PolicyConfig(policy=Policy.FILL, node_strategy=Strategy.SPREAD, device_strategy=Strategy.SPREAD)


def four_gpus() -> NodeState:
    """One node of four GPUs of 16 GiB with 4, 12, 8 and 16 free."""
    pods = (bound_pod("a", "n1", (0,), 12), bound_pod("b", "n1", (1,), 4), bound_pod("c", "n1", (2,), 8))
    return make_cluster(make_node("n1", gpus=4, mem=16), pods=pods).nodes["n1"]


def test_binpack_gives_a_pod_of_several_gpus_the_fullest_that_fit_and_spread_the_emptiest() -> None:
    """8 GiB on each of two GPUs: GPUs 1 (12 free), 2 (8) and 3 (16) fit; binpack takes 2 and 1, spread 3 and 1."""
    state = four_gpus()
    demand = Demand(16, devices=2)
    assert choose_devices(demand, state, Strategy.BINPACK) == (1, 2)
    assert choose_devices(demand, state, Strategy.SPREAD) == (1, 3)


def hami_node() -> NodeState:
    """HAMi node of two GPUs of 40960 MiB, GPU 0 running a pod of 10000 MiB and 10 %."""
    return make_hami_cluster(make_hami_node("h"), pods=(running_hami_pod("a", "h", 0, 10000, 10),)).nodes["h"]


def test_fill_gives_the_gpus_named_by_their_uuid_and_no_init_containers() -> None:
    placed = placer_for(make_hami_cluster(make_hami_node("h")), BINPACK).choose(Demand(1000), hami_node())
    assert placed == Placement(((Grant(0, 1000, 0, "GPU-h-0"),),), 0)


def test_fill_places_a_pod_asking_compute_by_the_configured_strategy_and_refuses_where_it_does_not_fit() -> None:
    state = hami_node()
    demand = Demand(1000, cores=20)
    by_binpack = fill_choice(demand, state, Strategy.BINPACK)
    by_spread = fill_choice(demand, state, Strategy.SPREAD)
    assert by_binpack is not None and by_binpack.containers[0][0].index == 0
    assert by_spread is not None and by_spread.containers[0][0].index == 1
    cluster = make_hami_cluster(make_hami_node("h"), pods=(running_hami_pod("a", "h", 0, 10000, 10),))
    assert placer_for(cluster, BINPACK).choose(demand, cluster.nodes["h"]) == by_binpack
    assert fill_choice(Demand(50000, cores=20), state, Strategy.BINPACK) is None


def test_a_plain_pod_is_given_the_fullest_gpu_that_fits_under_binpack() -> None:
    """n1 has 4 GiB free on GPU 0 and 12 on GPU 1: a 4 GiB pod fills GPU 0 under binpack, takes GPU 1 under spread."""
    cluster = make_cluster(
        make_node("n1", gpus=2, mem=16), pods=(bound_pod("a", "n1", (0,), 12), bound_pod("b", "n1", (1,), 4))
    )
    state = cluster.nodes["n1"]
    assert placer_for(cluster, BINPACK).choose(Demand(4), state) == Placement(((Grant(0, 4, 0, ""),),), 0)
    assert placer_for(cluster, SPREAD).choose(Demand(4), state) == Placement(((Grant(1, 4, 0, ""),),), 0)


def test_a_pod_of_two_containers_on_one_gpu_scores_what_both_take() -> None:
    """Two containers of 5000 MiB each go to GPU 0 (binpack, the fuller): it then holds 20000 of 40960 (device
    score 4 of 10), the node 20000 of 81920 (2 of 10): (4 + 2) // 2 = 3."""
    demand = Demand(10000, containers=(Request(1, 5000, cores=5), Request(1, 5000, cores=5)))
    assert score_node(demand, hami_node(), BINPACK) == 3


def test_the_scores_remembered_are_per_size_of_pod_and_per_configuration() -> None:
    """n1 holds 12 of 16 GiB on its GPU, n2 nothing. 2 GiB under binpack: n1 (12 + 2) x 10 // 16 = 8 for its GPU and
    for the node, n2 2 x 10 // 16 = 1: shifted by the lowest, n1 7. Under spread: n1 (16 - 14) x 10 // 16 = 1, n2
    14 x 10 // 16 = 8: n2 7. 4 GiB under binpack: n1 10, n2 2: n1 8."""
    cluster = make_cluster(make_node("n1", gpus=1, mem=16), make_node("n2", gpus=1, mem=16),
                           pods=(bound_pod("a", "n1", (0,), 12),))  # fmt: skip
    names = ["n1", "n2"]
    binpack, spread = placer_for(cluster, BINPACK), placer_for(cluster, SPREAD)
    assert binpack.prioritize(Demand(2), names, cluster.nodes) == [{"Host": "n1", "Score": 7}]
    assert spread.prioritize(Demand(2), names, cluster.nodes) == [{"Host": "n2", "Score": 7}]
    assert binpack.prioritize(Demand(4), names, cluster.nodes) == [{"Host": "n1", "Score": 8}]


def test_scores_over_views_of_nodes_are_never_remembered_as_any_others() -> None:
    """Two views of the same nodes (preemption's, without different victims) in turn: each is scored as it is (the
    first as the test above scores the cache's nodes: n1 7; in the second both are empty, alike)."""
    full = make_cluster(make_node("n1", gpus=1, mem=16), make_node("n2", gpus=1, mem=16),
                        pods=(bound_pod("a", "n1", (0,), 12),))  # fmt: skip
    empty = make_cluster(make_node("n1", gpus=1, mem=16), make_node("n2", gpus=1, mem=16))
    cluster = make_cluster(make_node("n1", gpus=1, mem=16), make_node("n2", gpus=1, mem=16))
    placer = placer_for(cluster, BINPACK)
    assert placer.prioritize(Demand(2), ["n1", "n2"], full.nodes) == [{"Host": "n1", "Score": 7}]
    assert placer.prioritize(Demand(2), ["n1", "n2"], empty.nodes) == []  # alike: nothing to add to either


def test_nodes_within_the_tolerance_of_the_least_score_ten_and_the_rest_fall_in_nine_steps() -> None:
    """Tolerance 0.25: 1.0 (the least) and 1.2 score 10; the most, 2.0, scores 0; a node where the pod does not fit
    scores 0, and so do all when it fits nowhere."""
    assert scores([1.0, 1.2, 2.0, math.inf], 0.25) == [10, 10, 0, 0]
    assert scores([1.0, 1.5, 2.0], 0.0) == [10, 4, 0]  # 9 x (2.0 - 1.5) / 1.0 = 4.5, down to 4
    assert scores([math.inf, math.inf], 0.25) == [0, 0]


def test_a_pods_ask_counts_the_memory_it_requests() -> None:
    pod = make_pod("p", gpu_mem=4, cpu="1500m", memory="6Gi")
    ask = ask_of(pod, Demand(4))
    assert (ask.cpu, ask.memory) == (1500, 6 << 30)


def test_the_fragmentation_policy_places_every_demand_but_those_asking_their_own_strategy() -> None:
    assert PolicyConfig().by_fragmentation(Demand(4))
    assert not PolicyConfig().by_fragmentation(Demand(4, node_strategy=Strategy.SPREAD))
    assert not PolicyConfig().by_fragmentation(Demand(4, device_strategy=Strategy.BINPACK))
    assert not BINPACK.by_fragmentation(Demand(4))


# ---- the fill policy's rank of nodes for a job's plan (`Fill.values`) -------------------------------------


NAMES = ["half", "empty", "full", "down", "ghost"]


def ranked_nodes() -> Cache:
    """Nodes of two GPUs of 16 GiB: `half` runs 8 GiB on GPU 0, `empty` nothing, `full` 16 on each, `down` is empty
    but not Ready; `ghost` is no node of the cache."""
    pods = (bound_pod("a", "half", (0,), 8), bound_pod("f", "full", (0, 1), 32, gpus=2))
    nodes = [make_node(name, gpus=2, mem=16) for name in ("half", "empty", "full")]
    return make_cluster(*nodes, make_node("down", gpus=2, mem=16, ready=False), pods=pods)


def test_fill_ranks_nodes_by_minus_their_score_and_leaves_those_it_cannot_use_at_infinity() -> None:
    """4 GiB under binpack: on `half` it joins the 8 GiB on GPU 0, 12 of 16 (device 7 of 10), and the node holds 12
    of 32 (3): (7 + 3) // 2 = 5; on `empty` 4 of 16 (2) and 4 of 32 (1): 1. Under spread: `half` gives GPU 1,
    (16 - 4) x 10 // 16 = 7, the node (32 - 12) x 10 // 32 = 6: 6; `empty` 7 and 8: 7. The best ranks lowest;
    the full node, the one not Ready (it would fit) and the unknown name cannot take the pod: inf."""
    cluster = ranked_nodes()
    binpack = placer_for(cluster, BINPACK).values(Ask(Demand(4)), NAMES, cluster.nodes)
    spread = placer_for(cluster, SPREAD).values(Ask(Demand(4)), NAMES, cluster.nodes)
    assert binpack.tolist() == [-5.0, -1.0, math.inf, math.inf, math.inf]
    assert spread.tolist() == [-6.0, -7.0, math.inf, math.inf, math.inf]


def test_fill_ranks_a_pod_by_the_gpu_strategy_it_asks_and_the_node_strategy_configured() -> None:
    """Under binpack, a pod asking spread over GPUs: on `half` GPU 1, (16 - 4) x 10 // 16 = 7, and the node by
    binpack, 12 x 10 // 32 = 3: 5; on `empty` 7 and 4 x 10 // 32 = 1: 4."""
    cluster = ranked_nodes()
    asked = Ask(Demand(4, device_strategy=Strategy.SPREAD))
    assert placer_for(cluster, BINPACK).values(asked, NAMES, cluster.nodes).tolist()[:3] == [-5.0, -4.0, math.inf]


def two_containers(strategy: str = "") -> Demand:
    """A HAMi pod of two containers on a GPU each, 10000 MiB and 35000 MiB, 10 % compute each; `strategy`: the GPU
    strategy it asks (hami.io/gpu-scheduler-policy)."""
    pod = make_hami_pod("new", mem=10000, cores=10)
    if strategy:
        pod["metadata"]["annotations"]["hami.io/gpu-scheduler-policy"] = strategy
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "35000", "nvidia.com/gpucores": "10"}
    pod["spec"]["containers"].append({"name": "second", "resources": {"limits": limits}})
    return HAMI.pod_demand(pod)


def test_fill_ranks_a_pod_of_several_containers_where_its_strategy_places_all_of_them() -> None:
    """GPU 1 runs 28960 of 40960 MiB. By binpack the first container takes the fuller GPU 1 (12000 free) and the
    second fits on GPU 0: both GPUs then hold 73960 of 81920, device and node 73960 x 10 // 81920 = 9: -9. By
    spread, which the pod may ask, the first takes the empty GPU 0 and the second no longer fits: inf."""
    cluster = make_hami_cluster(make_hami_node("h"), pods=(running_hami_pod("a", "h", 1, 28960, 10),))
    placer = placer_for(cluster, BINPACK)
    assert placer.values(Ask(two_containers()), ["h"], cluster.nodes).tolist() == [-9.0]
    assert placer.values(Ask(two_containers("spread")), ["h"], cluster.nodes).tolist() == [math.inf]


def test_each_configuration_built_keeps_its_own_scores() -> None:
    """As test_the_scores_remembered_are_per_size_of_pod_and_per_configuration, with the configurations built here
    (a configuration's memo key is made as it is built): n1 holds 12 of 16 GiB, n2 nothing; 2 GiB by binpack
    scores n1 7 above n2, by spread n2 7 above n1, on the same cache one after the other."""
    cluster = make_cluster(make_node("n1", gpus=1, mem=16), make_node("n2", gpus=1, mem=16),
                           pods=(bound_pod("a", "n1", (0,), 12),))  # fmt: skip
    binpack = PolicyConfig(policy=Policy.FILL)
    spread = PolicyConfig(policy=Policy.FILL, node_strategy=Strategy.SPREAD, device_strategy=Strategy.SPREAD)
    names = ["n1", "n2"]
    assert placer_for(cluster, binpack).prioritize(Demand(2), names, cluster.nodes) == [{"Host": "n1", "Score": 7}]
    assert placer_for(cluster, spread).prioritize(Demand(2), names, cluster.nodes) == [{"Host": "n2", "Score": 7}]
