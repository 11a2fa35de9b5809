"""Placement decisions that `make mutation` found unguarded (`core/placement/`): what prioritize answers under
the fragmentation policy when it narrows (one node, several, all alike) and for a pod the policy leaves to fill;
the one reason said for many nodes refused alike (what kube-scheduler's message counts); the general fit's
refusals at their edges (several GPUs, equal GPUs, nothing free, MIG slices, NUMA)."""

from __future__ import annotations

import math
import random
from types import SimpleNamespace
from typing import Any

import pytest

from extender.core.cache import Cache
from extender.core.contract import HostPriorityEntry
from extender.core.devices import Demand, Device, Request, Selectors, Strategy
from extender.core.placement import fragmentation
from extender.core.placement.config import Ask, Policy, PolicyConfig
from extender.core.placement.fill import least_allocated, most_allocated, score_node, shifted
from extender.core.placement.filtering import DETAILED, FilterOutcome, same_reason, summarized
from extender.core.placement.fit import Cause, Judgement, Usage, Verdict, place
from extender.core.placement.learned import Learned
from extender.core.placement.placer import Placer
from extender.core.placement.topology import LINK_WEIGHT, link_term
from extender.core.placement.workload import Classes, Shape, Workload, moved
from tests.builders import (
    HAMI,
    bound_pod,
    learned_of,
    make_cluster,
    make_hami_cluster,
    make_hami_node,
    make_hami_pod,
    make_node,
    placer_for,
)
from tests.core.placement.test_batch import random_cluster
from tests.core.placement.test_fragmentation import BEST, GPU, OFF, TIES, ask, node, teach
from tests.core.test_mig import A100

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


# ---- the general fit's refusals (`fit.place`) -------------------------------------------------------------


def gpus(count: int = 2, cores: int = 100, **extra: object) -> list[Device]:
    return [Device(i, 40960, cores=cores, slots=10, uuid=f"GPU-{i}", **extra) for i in range(count)]  # type: ignore[arg-type]


def migs(count: int = 2) -> list[Device]:
    return [Device(i, 40960, cores=100, slots=7, uuid=f"GPU-{i}", mode="mig", profiles=A100) for i in range(count)]


def usage(memory: list[int], cores: list[int] | None = None, slots: list[int] | None = None, **mig: Any) -> Usage:
    count = len(memory)
    return Usage(list(memory), list(cores or [0] * count), list(slots or [0] * count), **mig)


def refused(demand: Demand, devices: list[Device], base: Usage) -> tuple[str, Cause]:
    judged = place(demand, devices, base, Strategy.BINPACK, "MiB")
    assert isinstance(judged, Judgement), judged
    return judged.reason, judged.cause


def test_a_pod_of_several_gpus_is_told_what_each_gpu_lacks() -> None:
    two = Demand(2000, 2)
    assert refused(two, gpus(), usage([0, 0], [0, 0], [10, 10])) == (
        "needs 2 GPUs with a pod slot left each; 0 of 2 have that",
        Cause.SLOTS,
    )
    assert refused(Demand(2000, 2, 100), gpus(), usage([10, 0], [0, 0], [1, 0])) == (
        "needs 2 GPUs with no pod on them each; 1 of 2 have that",
        Cause.EXCLUSIVE,
    )
    full = [[(0, 4), (4, 4)], []]
    assert refused(Demand(10000, 2), migs(), usage([20480, 0], occupied=full)) == (
        "needs 2 GPUs with a MIG instance that holds it free each; 1 of 2 have that",
        Cause.SLICES,
    )


def test_the_largest_gpu_is_named_without_compute_when_compute_is_not_tracked() -> None:
    assert refused(Demand(50000), gpus(cores=0), usage([0, 0])) == (
        "needs 50000 MiB on one GPU; the largest GPU here has 40960 MiB",
        Cause.TOO_SMALL,
    )


def test_a_gpu_exactly_as_large_as_the_request_could_serve_it() -> None:
    """Full now, so refused for memory (an eviction could help), not as too small."""
    assert refused(Demand(40960), gpus(), usage([1, 1])) == (
        "needs 40960 MiB on one GPU; largest free is 40959 MiB (GPU 0 of 2)",
        Cause.MEMORY,
    )
    assert refused(Demand(20480), migs(1), usage([0], occupied=[[(0, 4), (4, 4)]]))[1] is Cause.SLICES


def test_the_numa_refusal_says_what_no_numa_node_has() -> None:
    devices = [Device(i, 40960, cores=100, slots=10, uuid=f"GPU-{i}", numa=i // 2) for i in range(4)]
    demand = Demand(2000, 2, selectors=Selectors(numa_bind=True))
    assert refused(demand, devices, usage([0, 40000, 40000, 0])) == (
        "needs 2 GPUs with 1000 MiB free each on one NUMA node; no NUMA node here has that",
        Cause.NUMA,
    )


def test_the_largest_free_names_the_lower_index_of_equals_and_never_less_than_nothing() -> None:
    assert refused(Demand(8192), gpus(), usage([39000, 39000]))[0] == (
        "needs 8192 MiB on one GPU; largest free is 1960 MiB (GPU 0 of 2)"
    )
    assert refused(Demand(8192), gpus(), usage([41000, 40960]))[0] == (
        "needs 8192 MiB on one GPU; largest free is 0 MiB (GPU 1 of 2)"
    )
    assert refused(Demand(0, percent=50), gpus(), usage([30000, 39000]))[0] == (
        "needs 20480 MiB on one GPU; largest free is 10960 MiB (GPU 0 of 2)"
    )


def test_the_free_slices_named_are_those_of_the_gpu_that_allows_most() -> None:
    one_slice_on_1 = [[(0, 4), (4, 4)], [(0, 4), (4, 2)]]
    assert refused(Demand(10000), migs(), usage([20480, 30000], occupied=one_slice_on_1))[0] == (
        "needs 10000 MiB on a MIG GPU; the free slices of GPU 1 allow 1g.5gb at most"
    )
    blocked_first = usage([0, 30000], occupied=[[], [(0, 4), (4, 2)]], blocked={0: "a stray pod"})
    assert refused(Demand(10000), migs(), blocked_first)[0] == (
        "needs 10000 MiB on a MIG GPU; the free slices of GPU 1 allow 1g.5gb at most"
    )
    blocked_and_full = usage([0, 20480], occupied=[[], [(0, 4), (4, 4)]], blocked={0: "a stray pod"})
    assert refused(Demand(10000), migs(), blocked_and_full)[0] == (
        "needs 10000 MiB on a MIG GPU; no MIG GPU here that could hold it has a slice free"
    )
    assert refused(Demand(10000), migs(1), usage([0], occupied=[[]], blocked={0: "a stray pod"}))[0] == (
        "needs 10000 MiB on a MIG GPU; GPU 0 takes no new pod: a stray pod"
    )


# ---- fill's scores, and a node without GPUs ----------------------------------------------------------------


def entries(*scores: int) -> list[HostPriorityEntry]:
    return [{"Host": f"n{number}", "Score": score} for number, score in enumerate(scores)]


@pytest.mark.parametrize(
    ("scores", "expected"),
    [
        ((), []),
        ((0, 3, 0), [("n1", 3)]),
        ((5, 7), [("n1", 2)]),  # one at the lowest of two: shifted
        ((5, 5, 7, 9), [("n2", 2), ("n3", 4)]),  # half at the lowest: shifted
        ((5, 7, 9), [("n0", 5), ("n1", 7), ("n2", 9)]),  # fewer than half at the lowest: kept as they are
    ],
)  # fmt: skip
def test_shifted_takes_the_lowest_off_when_at_least_half_the_nodes_are_at_it(
    scores: tuple[int, ...], expected: list[tuple[str, int]]
) -> None:
    assert [(entry["Host"], entry["Score"]) for entry in shifted(entries(*scores))] == expected


def test_a_gpu_of_one_unit_is_scored_like_any_other() -> None:
    assert (least_allocated(0, 1), least_allocated(1, 1), most_allocated(1, 1), most_allocated(0, 1)) == (10, 0, 10, 0)
    assert (least_allocated(5, 0), most_allocated(5, 0)) == (0, 0)


def test_a_node_not_ready_or_weights_of_zero_score_nothing() -> None:
    cache = two_started_and_one_empty()
    assert score_node(Demand(memory=500), cache.nodes["n1"], FILL) > 0
    assert score_node(Demand(memory=500), cache.nodes["n1"], PolicyConfig(node_weight=0, device_weight=0)) == 0
    cache.apply_node(make_node("n1", gpus=2, mem=GPU, cpu="64", memory="256Gi", ready=False))
    assert cache.nodes["n1"].known and score_node(Demand(memory=500), cache.nodes["n1"], FILL) == 0


def test_fill_remembers_its_scores_for_the_caches_nodes_only() -> None:
    """Prioritize over other states (preemption's, without its victims) must not read or fill the memo of the
    cache's own nodes."""
    cache = two_started_and_one_empty()
    names = ["n3", "n1", "n2"]
    placer = placer_for(cache, FILL)
    first = placer.prioritize(Demand(memory=500), names, cache.nodes, None)
    assert placer.prioritize(Demand(memory=500), names, cache.nodes, None) == first
    emptier = make_cluster(node("n1"), node("n2"), node("n3"), pods=(bound_pod("r2", "n2", (0,), 400),))
    # there n1 and n3 are alike (3) and n2 fuller (6): two of three at the lowest, shifted by it
    assert placer.prioritize(Demand(memory=500), names, emptier.nodes, None) == [{"Host": "n2", "Score": 3}]
    assert placer.prioritize(Demand(memory=500), names, cache.nodes, None) == first


def test_a_node_without_gpus_is_unresolvable_for_a_general_demand_saying_why() -> None:
    bare = make_hami_node("bare")
    del bare["metadata"]["annotations"]["hami.io/node-nvidia-register"]
    empty = make_hami_node("empty")
    empty["metadata"]["annotations"]["hami.io/node-nvidia-register"] = "[]"
    cache = make_hami_cluster(bare, empty)
    demand = HAMI.pod_demand(make_hami_pod("asking", mem=1000))
    judged = placer_for(cache).judge(demand, cache.nodes["bare"])
    assert judged == Judgement(
        Verdict.UNRESOLVABLE,
        "no GPUs: no hami.io/node-nvidia-register: HAMi's device plugin has not registered this node",
        Cause.NO_GPUS,
    )
    assert placer_for(cache).judge(demand, cache.nodes["empty"]).reason.startswith("no GPUs")


# ---- warming: when the filter judges afresh in slices ------------------------------------------------------


def warm_cluster(count: int) -> tuple[Cache, Learned]:
    return random_cluster(random.Random(9), count, (4, 8), (40,))


def slices(ask_: Ask, cache: Cache, learned: Learned) -> int | None:
    """How many slices `warming` cuts the nodes' fresh judging into (None: judged at once)."""
    steps = fragmentation.warming(ask_, list(cache.nodes), learned, cache.nodes)
    return None if steps is None else sum(1 for _ in steps)


PLAIN = Ask(Demand(8), 2000, 4 << 30)


@pytest.mark.parametrize(
    ("nodes", "array_slice", "expected"),
    [
        (150, 30, None),  # no more than one scalar slice missing: judged at once, however small the array slice
        (200, 199, 2),  # every node counts, the first slot's too
        (200, 200, None),  # exactly one array slice
        (200, 100, 2),
    ],
)  # fmt: skip
def test_warming_slices_only_what_one_slice_cannot_judge(
    nodes: int, array_slice: int, expected: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache, learned = warm_cluster(nodes)
    monkeypatch.setattr(fragmentation, "ARRAY_SLICE", array_slice)
    assert slices(PLAIN, cache, learned) == expected


def test_a_demand_the_arrays_do_not_judge_is_sliced_as_the_scalar_way_is(monkeypatch: pytest.MonkeyPatch) -> None:
    cache, learned = warm_cluster(200)
    monkeypatch.setattr(fragmentation, "SCALAR_SLICE", 40)
    own_strategy = Ask(Demand(8, node_strategy=Strategy.SPREAD), 2000, 4 << 30)
    assert slices(own_strategy, cache, learned) == 5  # 200 one by one, 40 a slice; in arrays it would be one


def test_the_policy_warms_only_when_it_narrows_more_than_one_node(monkeypatch: pytest.MonkeyPatch) -> None:
    cache, learned = warm_cluster(200)
    monkeypatch.setattr(fragmentation, "ARRAY_SLICE", 100)
    names = list(cache.nodes)
    assert Placer(cache, OFF, learned).policy.warming(PLAIN, names, cache.nodes) is None
    assert Placer(cache, BEST, learned).policy.warming(PLAIN, names[:1], cache.nodes) is None
    steps = Placer(cache, BEST, learned).policy.warming(PLAIN, names, cache.nodes)
    assert steps is not None and sum(1 for _ in steps) == 2


def test_a_filter_request_teaches_its_pods_shape_once_and_never_one_the_cache_already_counts() -> None:
    cache = make_cluster(node("n1"), pods=(bound_pod("seen", "n1", (0,), 400),))
    learned = learned_of(cache)
    asked, other = Shape(1000, 1 << 30, 1, 300), Shape(2000, 1 << 30, 1, 700)
    learned.asked("new", asked)
    once = dict(learned.workload.weights)
    assert once.get(asked, 0) > 0
    learned.asked("new", asked)
    learned.asked("", other)
    [seen] = cache.pods
    learned.asked(seen, other)
    assert learned.workload.weights == once


# ---- topology: what taking GPUs costs a node's links -------------------------------------------------------


def linked(free: list[int], scores: dict[tuple[int, int], int]) -> Any:
    """A node's GPUs with pair scores (both ways) and free memory: all `link_term` reads of a node."""
    devices = [
        Device(
            p,
            16,
            uuid=f"GPU-{p}",
            links=tuple((f"GPU-{q}", scores.get((min(p, q), max(p, q)), 0)) for q in range(len(free)) if q != p),
        )
        for p in range(len(free))
    ]
    return SimpleNamespace(devices=devices, free=free)


TOPOLOGY = Demand(4, devices=2, selectors=Selectors(topology=True))


@pytest.mark.parametrize(
    ("scores", "positions", "cost"),
    [
        ({(0, 1): 100}, [0, 1], 0.0),  # an NVLink between them: nothing lost
        ({(0, 1): 50}, [0, 1], 0.5),
        ({(0, 1): 200}, [0, 1], 0.0),  # more than one NVLink counts as one
        ({}, [0, 1], 1.0),  # no scores: the full cost
        ({(0, 1): 100, (1, 2): 20}, [0, 1, 2], 1.0 - 40 / 100),  # the pairs' average: (100 + 0 + 20) / 3
    ],
)  # fmt: skip
def test_a_topology_aware_pod_pays_for_its_gpus_not_linked_by_nvlink(
    scores: dict[tuple[int, int], int], positions: list[int], cost: float
) -> None:
    assert link_term(TOPOLOGY, linked([16, 16, 16, 16], scores), positions) == pytest.approx(cost)


@pytest.mark.parametrize(
    ("free", "scores", "positions", "cost"),
    [
        ([16, 1, 0, 16], {(0, 1): 100}, [0], LINK_WEIGHT * 0.5),  # linked to GPU 1 of the two left free (GPU 2 full)
        ([16, 1, 0, 16], {(0, 1): 100}, [0, 3], LINK_WEIGHT * 0.5),  # another pod's two GPUs, GPU 1 alone left
        ([16, 16, 0, 0], {(0, 1): 300}, [0], LINK_WEIGHT),  # more than an NVLink counts as one
        ([16, 16, 16, 16], {(1, 2): 100}, [0], 0.0),  # linked to nothing left
        ([16, 0, 0, 0], {(0, 1): 100}, [0], 0.0),  # nothing left free
        ([16, 16, 16, 16], {}, [0], 0.0),  # no scores at all
        ([16, 16], {(0, 1): 100}, [], 0.0),  # nothing taken
    ],
)  # fmt: skip
def test_a_pod_that_did_not_ask_pays_a_little_for_the_links_it_breaks(
    free: list[int], scores: dict[tuple[int, int], int], positions: list[int], cost: float
) -> None:
    assert link_term(Demand(4, devices=len(positions) or 1), linked(free, scores), positions) == pytest.approx(cost)
    if len(positions) == 1:  # one GPU of a topology-aware pod: no pair to link, the same small cost
        assert link_term(TOPOLOGY, linked(free, scores), positions) == pytest.approx(cost)


def test_weights_grown_too_large_are_scaled_down_together_and_the_faded_dropped() -> None:
    """Weights are e^(age / half-life) from the first observation; past e^500 they are all scaled back to the
    present: proportions kept, what fell under 1e-12 of a pod dropped, the next pod weighed from the new origin."""
    workload = Workload(half_life=60.0)
    step = 60.0 / math.log(2)  # the time that multiplies a new pod's weight by e
    faded, kept, new, later = (Shape(1000 * n, 1 << 30, 1, 100 * n) for n in range(1, 5))
    workload.observe(faded, 0.0)
    workload.observe(kept, 499 * step)
    workload.observe(new, 502 * step)  # e^502: rescaled, the origin moved to now
    assert set(workload.weights) == {kept, new}
    assert workload.weights[kept] == pytest.approx(math.exp(-3)) and workload.weights[new] == 1.0
    assert workload.total == pytest.approx(1.0 + math.exp(-3))
    workload.observe(later, 502 * step + 60.0)  # one half-life on: twice a pod's weight at the new origin
    assert workload.weights[later] == pytest.approx(2.0)


def test_two_builds_with_no_shape_in_common_moved_all_their_weight() -> None:
    a, b, c = (Shape(1000 * n, 1 << 30, 1, 100 * n) for n in range(1, 4))
    assert moved(Classes(1, (a,), (1.0,)), Classes(2, (b,), (1.0,))) == 1.0
    assert moved(Classes(1, (a, b), (0.5, 0.5)), Classes(2, (b, c), (0.5, 0.5))) == 0.5
