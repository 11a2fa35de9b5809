"""The fragmentation policy's memos and slices (`fragmentation.py`) where `make mutation` found them unguarded: what
each pod size adds to each node, and the GPUs it would take there, are kept per size and for the cache's own nodes
alone, so a filter or a bind for one size never reads what another size, or a view of the nodes, left; warming in
slices leaves nothing to judge after; and a topology-aware pod of several GPUs pays in full for a node that reports
no links."""

from __future__ import annotations

import random

import numpy as np
import pytest

from extender.core.cache import Cache
from extender.core.devices import Demand, Selectors, Strategy
from extender.core.placement import fragmentation
from extender.core.placement.config import Ask
from extender.core.placement.fragmentation import added_fragmentation, warming
from extender.core.placement.learned import Learned
from extender.core.placement.topology import ASKED_WEIGHT
from tests.builders import bound_pod, learned_of, make_cluster, placer_for
from tests.core.placement.test_batch import random_cluster
from tests.core.placement.test_fragmentation import BEST, ask, node, teach


def two_nodes() -> Cache:
    """n1 holds 200 of its GPU 0, n2 400; pods of 200, 500 and 1000 typical. Alone, a filter for a 200 share passes
    n1 and one for a 500 share n2 (each asked of a placer that judged nothing before)."""
    started = (bound_pod("r1", "n1", (0,), 200), bound_pod("r2", "n2", (0,), 400))
    cache = make_cluster(node("n1"), node("n2"), pods=started)
    teach(cache, (500, "4", 5), (200, "2", 5), (1000, "8", 3))
    return cache


def alone(memory: int) -> list[str]:
    cache = two_nodes()
    return placer_for(cache, BEST).filter(Demand(memory=memory), ["n1", "n2"], cache.nodes, "d/a", ask(memory)).passed


def test_a_filter_for_one_pod_size_is_not_swayed_by_a_filter_for_another() -> None:
    assert alone(200) != alone(500)
    cache = two_nodes()
    placer = placer_for(cache, BEST)
    for memory in (200, 500, 200):
        passed = placer.filter(Demand(memory=memory), ["n1", "n2"], cache.nodes, "d/a", ask(memory)).passed
        assert passed == alone(memory), memory


def test_the_bind_gives_the_gpus_judged_for_its_own_pod_size() -> None:
    """n1's GPU 1 has 600 of 1000 free, GPU 0 all: a filter for a 500 share judges GPU 1 best there (the rest of
    the empty GPU stays whole, `test_fragmentation`); a pod of a whole GPU then bound on n1 can only have GPU 0."""
    cache = make_cluster(node("n1"), node("n2"), pods=(bound_pod("r", "n1", (1,), 400),))
    teach(cache, (500, "4", 5), (1000, "8", 5))
    placer = placer_for(cache, BEST)
    placer.filter(Demand(memory=500), ["n1", "n2"], cache.nodes, "d/a", ask(500))
    half = placer.choose(Demand(memory=500), cache.nodes["n1"], ask(500))
    whole = placer.choose(Demand(memory=1000), cache.nodes["n1"], ask(1000))
    assert half is not None and [grant.index for grant in half.containers[0]] == [1]
    assert whole is not None and [grant.index for grant in whole.containers[0]] == [0]


def test_the_bind_after_a_filter_over_views_gives_the_gpus_judged_on_the_node_as_the_cache_holds_it() -> None:
    """In preemption's views n1's pod is a victim (n1 empty there, so GPU 0 would do); in the cache it runs on GPU 1,
    which then has 600 free: the bind gives GPU 1, as for the cache's node alone."""
    started = (bound_pod("r", "n1", (1,), 400),)
    cache = make_cluster(node("n1"), node("n2"), pods=started)
    teach(cache, (500, "4", 5), (1000, "8", 5))
    views = make_cluster(node("n1"), node("n2"))
    placer = placer_for(cache, BEST)
    placer.filter(Demand(memory=500), ["n1", "n2"], views.nodes, "d/a", ask(500))
    placed = placer.choose(Demand(memory=500), cache.nodes["n1"], ask(500))
    assert placed is not None and [grant.index for grant in placed.containers[0]] == [1]


PLAIN = Ask(Demand(8), 2000, 4 << 30)
OWN_STRATEGY = Ask(Demand(8, node_strategy=Strategy.SPREAD), 2000, 4 << 30)


def unjudged(asked: Ask, names: list[str], learned: Learned) -> int:
    """How many of the nodes have no value for this ask yet (what `warming` slices)."""
    table = fragmentation._values(asked, learned, learned.classes())
    return int(np.count_nonzero(np.isnan(table[learned.arrays.slots_of(names)])))


@pytest.mark.parametrize(("asked", "per_slice"), [(PLAIN, 30), (OWN_STRATEGY, 40)], ids=["in arrays", "one by one"])
def test_warming_judges_a_slice_at_a_time_and_leaves_nothing_to_judge_after(
    asked: Ask, per_slice: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """200 nodes never judged for the pod, 30 a slice in arrays, 40 one by one: each step judges a slice at most (so
    no turn of the event loop is held longer), and after the last none is left."""
    monkeypatch.setattr(fragmentation, "ARRAY_SLICE", 30)
    monkeypatch.setattr(fragmentation, "SCALAR_SLICE", 40)
    cache, learned = random_cluster(random.Random(9), 200, (4, 8), (40,))
    names = list(cache.nodes)
    steps = warming(asked, names, learned, cache.nodes)
    assert steps is not None
    left = unjudged(asked, names, learned)
    assert left == 200
    for _ in steps:
        now = unjudged(asked, names, learned)
        assert left - per_slice <= now < left
        left = now
    assert left == 0 and warming(asked, names, learned, cache.nodes) is None


def test_a_topology_aware_pod_of_several_gpus_pays_in_full_on_a_node_that_reports_no_links() -> None:
    """No NVLink is known between a gpushare node's GPUs: a pod that asked for linked GPUs pays ASKED_WEIGHT there
    (`topology.link_term`), on top of what any pod of its size adds."""
    cache = make_cluster(node("n1", gpus=4))
    teach(cache, (1000, "8", 5))
    learned = learned_of(cache)
    plain = Ask(Demand(2000, devices=2), 8000, 2 << 30)
    linked = Ask(Demand(2000, devices=2, selectors=Selectors(topology=True)), 8000, 2 << 30)
    without = added_fragmentation(plain, cache.nodes["n1"], learned)
    with_links = added_fragmentation(linked, cache.nodes["n1"], learned)
    assert without is not None and with_links is not None
    assert with_links[0] - without[0] == pytest.approx(ASKED_WEIGHT)
