"""The placer's surface to the verbs (`placer.py`), where `make mutation` found it unguarded: the bind's GPUs by
the pod's ask, a filter over states that are not the cache's (judged as they are, not by the cache's arrays, and
narrowed by what they hold), the quota's admission in a filter that may first warm its narrowing, and that
warming itself: slices to run between turns of the event loop, then the answer the filter gives in one go; and
what a topology-aware pod of one GPU pays on a node that reports no links."""

from __future__ import annotations

import math
import random
from types import SimpleNamespace
from typing import Any

import pytest

from extender.core.binding import BindRequest, RecentPods
from extender.core.cache import Cache
from extender.core.devices import Demand, Device, Selectors, Strategy
from extender.core.ledger import Ledger
from extender.core.placement import fragmentation
from extender.core.placement.config import Ask, PolicyConfig, ask_of
from extender.core.placement.filtering import FilterOutcome
from extender.core.placement.placer import Warming
from extender.core.placement.topology import link_term
from extender.core.protocols.gpushare import Profile, SeveralGpus
from extender.core.protocols.hami import LOCK
from tests.builders import (
    HAMI,
    FakeClock,
    bind_error,
    bound_pod,
    make_cluster,
    make_hami_node,
    make_hami_pod,
    placer_for,
    running_hami_pod,
)
from tests.core.placement.test_batch import random_cluster
from tests.core.placement.test_fragmentation import BEST, OFF, ask, node, teach

BIND = Profile(several_gpus=SeveralGpus.BIND)
"""gpushare with pods of several GPUs bound as they ask (its default refuses them everywhere)."""


def test_the_bind_gives_the_gpu_where_the_pod_adds_least_not_the_fullest() -> None:
    """Shares of half a GPU typical; GPU 0 has 700 of 1000 free, GPU 1 is empty. A 300 share on GPU 0 (the fullest,
    binpack's choice) leaves 400 that no typical share can use; on GPU 1 it leaves 700 and 700, both usable. The
    bind gives GPU 1 by the pod's ask; without an ask (cpu and memory unknown) fill decides: GPU 0."""
    cache = make_cluster(node("n1"), pods=(bound_pod("running", "n1", (0,), 300),))
    teach(cache, (500, "4", 5))
    placer, state = placer_for(cache, BEST), cache.nodes["n1"]
    by_ask = placer.choose(Demand(memory=300), state, ask(300))
    by_fill = placer.choose(Demand(memory=300), state, None)
    assert by_ask is not None and [grant.index for grant in by_ask.containers[0]] == [1]
    assert by_fill is not None and [grant.index for grant in by_fill.containers[0]] == [0]


def test_a_filter_over_states_that_are_not_the_caches_judges_those_states() -> None:
    """Nodes sent whole by the scheduler, or preemption's views, are judged as they are: n1 is empty in the cache
    but full in the states asked about, so it is refused, though the cache's arrays say it would fit."""
    cache = make_cluster(node("n1"), node("n2"))
    fuller = make_cluster(node("n1"), node("n2"), pods=tuple(bound_pod(f"r{i}", "n1", (i,), 1000) for i in (0, 1)))
    outcome = placer_for(cache, OFF).filter(Demand(memory=500), ["n1", "n2"], fuller.nodes, "default/a", ask(500))
    assert outcome.passed == ["n2"] and list(outcome.failed) == ["n1"]


def refuse_n2(outcome: FilterOutcome) -> None:
    """A namespace quota with no room for the pod on n2 (`quota.admission.quota_filter` moves such nodes out)."""
    if "n2" in outcome.passed:
        outcome.passed = [name for name in outcome.passed if name != "n2"]
        outcome.failed["n2"] = "exceeds the namespace's quota"


def test_the_quota_refuses_nodes_in_a_filter_that_may_warm_as_in_one_that_may_not() -> None:
    cache = make_cluster(node("n1"), node("n2"))
    placer = placer_for(cache, OFF)
    for outcome in (
        placer.begin_filter(Demand(memory=500), ["n1", "n2"], cache.nodes, "default/a", ask(500), refuse_n2),
        placer.filter(Demand(memory=500), ["n1", "n2"], cache.nodes, "default/a", ask(500), refuse_n2),
    ):
        assert isinstance(outcome, FilterOutcome)
        assert outcome.passed == ["n1"] and outcome.failed == {"n2": "exceeds the namespace's quota"}


PLAIN = Ask(Demand(8), 2000, 4 << 30)


def test_a_filter_that_must_judge_many_nodes_afresh_first_gives_slices_then_the_same_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """200 nodes never judged for this pod, 30 judged a slice: `begin_filter` hands back the work as slices (the
    service runs one per turn of the event loop); `filter` does it all at once; both then pass the same node."""
    monkeypatch.setattr(fragmentation, "ARRAY_SLICE", 30)
    cache, learned = random_cluster(random.Random(9), 200, (4, 8), (40,))
    names = list(cache.nodes)
    placer = placer_for(cache, BEST)
    assert placer.learned is learned
    begun = placer.begin_filter(PLAIN.demand, names, cache.nodes, "default/a", PLAIN)
    assert isinstance(begun, Warming)
    assert sum(1 for _ in begun.steps) > 1
    after_warming = placer.begin_filter(PLAIN.demand, names, cache.nodes, "default/a", PLAIN)
    assert isinstance(after_warming, FilterOutcome) and len(after_warming.passed) == 1

    cold, _ = random_cluster(random.Random(9), 200, (4, 8), (40,))
    at_once = placer_for(cold, BEST).filter(PLAIN.demand, names, cold.nodes, "default/a", PLAIN)
    assert at_once.passed == after_warming.passed


def test_a_pod_of_two_gpus_is_never_passed_for_one_gpu_with_room() -> None:
    """The one-step filter reads each node's largest free GPU, which says nothing of a second: n1 has one GPU free
    of two, so a pod of two GPUs of 500 each is refused there, by the node's own reason."""
    cache = make_cluster(node("n1"), node("n2"), pods=(bound_pod("r", "n1", (0,), 1000),), profile=BIND)
    demand = Demand(memory=1000, devices=2)
    outcome = placer_for(cache, OFF).filter(demand, ["n1", "n2"], cache.nodes, "default/a", ask(1000, devices=2))
    assert outcome.passed == ["n2"]
    assert outcome.failed == {"n1": "needs 2 GPUs with 500 GiB free each; 1 of 2 have that much"}


def test_the_narrowing_over_views_of_nodes_reads_those_views() -> None:
    """Halves and wholes typical; in the cache n1 and n2 each hold 400 of a GPU, n3 nothing: a 500 share goes to a
    started GPU, n1 first by name (`test_mutants_placement`). In the views preemption judges, n1's pod is a victim:
    n1 is as empty as n3, so the one started node left, n2, is the best."""
    started = (bound_pod("r1", "n1", (0,), 400), bound_pod("r2", "n2", (0,), 400))
    cache = make_cluster(node("n1"), node("n2"), node("n3"), pods=started)
    teach(cache, (500, "4", 5), (1000, "8", 5))
    views = make_cluster(node("n1"), node("n2"), node("n3"), pods=started[1:])
    placer = placer_for(cache, BEST)
    names = ["n3", "n1", "n2"]
    assert placer.filter(Demand(memory=500), names, cache.nodes, "default/a", ask(500)).passed == ["n1"]
    assert placer.filter(Demand(memory=500), names, views.nodes, "default/a", ask(500)).passed == ["n2"]


def test_a_topology_aware_pod_of_one_gpu_pays_nothing_for_links_a_node_does_not_report() -> None:
    """A node without pair scores (gpushare's, or HAMi's without hami.io/node-nvidia-score): no link is known to
    break, so one GPU costs nothing there, as on a node whose GPUs are all linked alike."""
    devices = [Device(index, 16, uuid=f"GPU-{index}") for index in range(2)]
    state = SimpleNamespace(devices=devices, free=[16, 16])
    assert link_term(Demand(4, selectors=Selectors(topology=True)), state, [0]) == 0.0  # type: ignore[arg-type]


def test_a_pod_asking_its_own_strategy_is_ranked_by_fill_under_the_fragmentation_policy() -> None:
    """For a job's plan as for a bind: a half asking spread over GPUs goes by fill. On n1 (500 of GPU 0 taken) GPU 1,
    (1000 - 500) x 10 // 1000 = 5, the node by binpack 1000 x 10 // 2000 = 5: 5; on the empty node 5 and 2: 3; on
    `four` 5 and 1: 3. Minus the scores, the best lowest."""
    cache = make_cluster(node("n1", cpu="256"), node("empty", cpu="256"), node("four", gpus=4, cpu="256"))
    cache.apply_pod(bound_pod("running", "n1", (0,), 500))
    spread = Ask(Demand(500, device_strategy=Strategy.SPREAD), 1000, 1 << 30)
    values = placer_for(cache, BEST).values(spread, ["n1", "empty", "four", "unknown"], cache.nodes)
    assert values.tolist() == [-5.0, -3.0, -3.0, math.inf]


def test_the_narrowing_reads_each_passed_nodes_own_value_when_a_quota_and_a_lock_reshuffle_the_passed() -> None:
    """HAMi nodes of two 40960 MiB GPUs; halves and wholes typical. `c` runs a half (the best for another: it fills
    the started GPU, -0.25), `a` and `b` are empty (+0.25: a whole GPU broken), `b` locked for the pod asking, `d`
    full. The arrays find `a` and `c` taking the half; the filter passes `a`, `c` and, judged, `b`; the quota
    then refuses `a`: two passed as two fit, but not the same two. The narrowing must read `c`'s and `b`'s own
    values (remembered by the filter before) and pass `c`."""
    clock = FakeClock()
    clock.now = 1_787_306_400.0 + 10  # 2026-08-21T10:00:10Z
    cache = Cache(HAMI, lock_timeout=300.0, clock=clock)
    locked = make_hami_node("b")
    locked["metadata"]["annotations"][LOCK] = "2026-08-21T10:00:00Z,default,p"
    full = [running_hami_pod(f"f{gpu}", "d", gpu, 40960, 0) for gpu in (0, 1)]
    seen = [make_hami_pod(f"seen-{number}", mem=20480 if number % 2 else 40960) for number in range(6)]
    nodes = [make_hami_node("a"), locked, make_hami_node("c"), make_hami_node("d")]
    cache.replace(nodes, [make_hami_pod("p", mem=20480), running_hami_pod("r", "c", 0, 20480, 0), *full, *seen])
    pod = make_hami_pod("p", mem=20480)
    demand = HAMI.pod_demand(pod)
    placer = placer_for(cache)
    names = ["a", "b", "c", "d"]
    assert placer.filter(demand, names, cache.nodes, "default/p", ask_of(pod, demand)).passed == ["c"]

    def refuse_a(outcome: FilterOutcome) -> None:
        outcome.passed = [name for name in outcome.passed if name != "a"]
        outcome.failed["a"] = "exceeds the namespace's quota"

    refused = placer.filter(demand, names, cache.nodes, "default/p", ask_of(pod, demand), refuse_a)
    assert refused.passed == ["c"]


async def test_a_bind_refused_for_room_on_a_node_locked_for_its_own_pod_says_why_not_the_lock() -> None:
    """HAMi's plugin locks the node for the pod being bound (default/p); both GPUs run 40000 of 40960 MiB. A bind
    of default/p that finds no room must say so (as its filter would, `judge` with the pod), not that the node is
    locked for default/p, which is its own lock and keeps nothing from it."""
    clock = FakeClock()
    clock.now = 1_787_306_400.0 + 10  # 2026-08-21T10:00:10Z
    cache = Cache(HAMI, lock_timeout=300.0, clock=clock)
    node = make_hami_node("held")
    node["metadata"]["annotations"][LOCK] = "2026-08-21T10:00:00Z,default,p"
    running = [running_hami_pod(name, "held", gpu, 40000, 10) for gpu, name in enumerate("ab")]
    cache.replace([node], [make_hami_pod("p", mem=1000), *running])
    ledger = Ledger(cache, 60, clock)
    request = BindRequest("p", "default", "uid-p", "held")
    error = await bind_error(request, cache, ledger, PolicyConfig(), NoWrites(), RecentPods())
    assert error == (
        "pod default/p no longer fits on held: needs 1000 MiB on one GPU; largest free is 960 MiB (GPU 0 of 2)"
    )


class NoWrites:
    """A binder the test never reaches: the bind is refused before any write."""

    async def bind(self, pod: dict[str, Any], node: str, annotations: dict[str, str]) -> None:
        raise AssertionError("no write expected")
