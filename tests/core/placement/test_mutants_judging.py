"""What a filter says of each node it refuses, where `make mutation` found it unguarded (`judge.py`,
`filtering.py`, `placer.Placer.filter`): the cause beside each reason (the label of
`extender_filter_rejections_total`), GPUs exactly as large or as free as a pod of several GPUs needs, a node whose
GPUs are all unhealthy, the device plugin's node lock (held for another pod, for none, or for the pod asking), and
the cache's memo of answers and fit index, which a filter over views of nodes (preemption's, without their victims)
must leave as they are."""

from __future__ import annotations

from typing import Any

import pytest

from extender.core.cache import Cache
from extender.core.contract import InvalidArgs
from extender.core.devices import Demand
from extender.core.holds import Grant
from extender.core.mig import MigInstance
from extender.core.nodes import NodeState
from extender.core.placement.filtering import FilterOutcome, all_fit, filter_cached, judged
from extender.core.placement.fit import FITS, Cause, Judgement, Verdict
from extender.core.placement.judge import NOT_IN_CACHE, judge
from extender.core.placement.learned import Learned
from extender.core.placement.placer import Placer
from extender.core.placement.workload import Workload
from extender.core.protocols.hami import LOCK
from tests.builders import (
    HAMI,
    FakeClock,
    bound_pod,
    make_cluster,
    make_hami_cluster,
    make_hami_node,
    make_hami_pod,
    make_node,
    placer_for,
    running_hami_pod,
    two_gpus_with_12_and_4_used,
)
from tests.core.placement.test_fragmentation import BEST, ask, node, teach
from tests.core.protocols.test_hami_mig import bound_mig_pod


def gpushare() -> Cache:
    """n1: two GPUs of 16 GiB with 4 and 12 free; `down` not Ready; `cpu` without GPUs; `mixed` GPUs of 16 and 8;
    `sick` one GPU its plugin reports unhealthy."""
    return make_cluster(
        make_node("n1", gpus=2, mem=16),
        make_node("down", gpus=2, mem=16, ready=False),
        make_node("cpu", gpus=0),
        make_node("mixed", devices=[{"index": 0, "memory": 16}, {"index": 1, "memory": 8}]),
        make_node("sick", devices=[{"index": 0, "memory": 16, "healthy": False}]),
        pods=two_gpus_with_12_and_4_used(),
    )


FAILED, UNRESOLVABLE = Verdict.FAILED, Verdict.UNRESOLVABLE


@pytest.mark.parametrize(
    ("name", "demand", "expected"),
    [
        ("ghost", Demand(4), Judgement(FAILED, NOT_IN_CACHE, Cause.NOT_IN_CACHE)),
        ("down", Demand(4), Judgement(FAILED, "node is not Ready", Cause.NOT_READY)),
        ("cpu", Demand(4), Judgement(UNRESOLVABLE, "no GPUs: no aliyun.com/gpu-mem in capacity", Cause.NO_GPUS)),
        (
            "n1",
            Demand(17),
            Judgement(UNRESOLVABLE, "needs 17 GiB on one GPU; the largest GPU here has 16 GiB", Cause.TOO_SMALL),
        ),
        (
            "n1",
            Demand(48, devices=3),
            Judgement(UNRESOLVABLE, "needs 3 GPUs with 16 GiB each; 2 of 2 GPUs here are that large", Cause.TOO_FEW),
        ),
        (
            "n1",
            Demand(13),
            Judgement(FAILED, "needs 13 GiB on one GPU; largest free is 12 GiB (GPU 1 of 2)", Cause.MEMORY),
        ),
        (
            "n1",
            Demand(10, devices=2),
            Judgement(FAILED, "needs 2 GPUs with 5 GiB free each; 1 of 2 have that much", Cause.MEMORY),
        ),
    ],
)
def test_each_refusal_names_its_cause_beside_its_reason(name: str, demand: Demand, expected: Judgement) -> None:
    """The cause is what the rejection metric counts a refusal under, and whether an eviction could help."""
    cluster = gpushare()
    assert judge(demand, cluster.nodes.get(name), "GiB") == expected


TOO_FEW = Cause.TOO_FEW


@pytest.mark.parametrize(
    ("name", "demand", "reason", "cause"),
    [
        # 12 GiB each: GPU 1 has exactly 12 free, GPU 0 has 4
        ("n1", Demand(24, devices=2), "needs 2 GPUs with 12 GiB free each; 1 of 2 have that much", Cause.MEMORY),
        # 16 GiB each on GPUs of 16: large enough, so not too few; only full now
        ("n1", Demand(32, devices=2), "needs 2 GPUs with 16 GiB free each; 0 of 2 have that much", Cause.MEMORY),
        # 10 GiB each: only the GPU of 16 is that large, the one of 8 never will be
        ("mixed", Demand(20, devices=2), "needs 2 GPUs with 10 GiB each; 1 of 2 GPUs here are that large", TOO_FEW),
        # every GPU unhealthy: none is usable, so none is large enough, and no eviction can help
        ("sick", Demand(4), "needs 4 GiB on one GPU; the largest GPU here has 0 GiB", Cause.TOO_SMALL),
    ],
)  # fmt: skip
def test_gpus_exactly_as_large_or_as_free_as_each_share_count(
    name: str, demand: Demand, reason: str, cause: Cause
) -> None:
    cluster = gpushare()
    assert judge(demand, cluster.nodes[name], "GiB")[1:] == (reason, cause)


def test_a_node_without_gpus_is_unresolvable_for_a_pod_asking_compute_too() -> None:
    """A demand beyond memory alone is judged by the general fit (`fit.py`), which refuses a node without GPUs for
    the same reason the plain path gives."""
    cluster = gpushare()
    assert judge(Demand(4, cores=30), cluster.nodes["cpu"], "GiB") == Judgement(
        UNRESOLVABLE, "no GPUs: no aliyun.com/gpu-mem in capacity", Cause.NO_GPUS
    )


# ---- the device plugin's node lock (HAMi) -----------------------------------------------------------------


def locked_cluster() -> Cache:
    """`held`: locked by HAMi's plugin for default/p, ten seconds ago; `anon`: locked in HAMi's legacy form, naming
    no pod; `free`: no lock. Two GPUs of 40960 MiB each."""
    clock = FakeClock()
    clock.now = 1_787_306_400.0 + 10  # 2026-08-21T10:00:10Z
    cache = Cache(HAMI, lock_timeout=300.0, clock=clock)
    nodes = [
        make_hami_node("held", **{LOCK: "2026-08-21T10:00:00Z,default,p"}),
        make_hami_node("anon", **{LOCK: "2026-08-21T10:00:00Z"}),
        make_hami_node("free"),
    ]
    cache.replace(nodes, [make_hami_pod("p", mem=1000), make_hami_pod("q", mem=1000)])
    return cache


LOCKED_FOR_P = (
    "node is locked for pod default/p until its device plugin has allocated it (HAMi's node lock); try again soon"
)


def test_a_node_locked_for_another_pod_is_refused_naming_the_pod_it_is_held_for() -> None:
    cache = locked_cluster()
    plain, general = Demand(1000), Demand(1000, cores=30)
    for demand in (plain, general):
        assert judge(demand, cache.nodes["held"], "MiB", "default/q") == Judgement(
            Verdict.FAILED, LOCKED_FOR_P, Cause.LOCKED
        )
        assert judge(demand, cache.nodes["anon"], "MiB", "default/q") == Judgement(
            Verdict.FAILED,
            "node is locked until its device plugin has allocated it (HAMi's node lock); try again soon",
            Cause.LOCKED,
        )


def test_the_lock_held_for_the_pod_asking_does_not_keep_it_off_the_node() -> None:
    """HAMi's plugin locks the node for the pod being bound; a filter of that same pod again (a retried bind)
    passes there, and a refusal for room says so, not the lock."""
    cache = locked_cluster()
    node = cache.nodes["held"]
    assert judge(Demand(1000), node, "MiB", "default/p") == FITS
    assert judge(Demand(1000, cores=30), node, "MiB", "default/p") == FITS
    assert judge(Demand(50000), node, "MiB", "default/p")[1:] == (
        "needs 50000 MiB on one GPU; the largest GPU here has 40960 MiB",
        Cause.TOO_SMALL,
    )


def test_a_filter_passes_the_node_locked_for_its_own_pod_whichever_pod_asked_first() -> None:
    """The memo of answers is shared by every pod of one size: a lock's refusal remembered for another pod must
    not refuse the pod it is held for, nor the pod's own pass let another pod through."""
    for first, second in (("default/q", "default/p"), ("default/p", "default/q")):
        cache = locked_cluster()
        placer = placer_for(cache)
        demand = HAMI.pod_demand(make_hami_pod("x", mem=1000))
        outcomes = {pod: placer.filter(demand, ["held", "free"], cache.nodes, pod) for pod in (first, second)}
        assert sorted(outcomes["default/p"].passed) == ["free", "held"]
        assert outcomes["default/q"].passed == ["free"]
        assert outcomes["default/q"].failed == {"held": LOCKED_FOR_P}
        assert outcomes["default/q"].causes == {Cause.LOCKED: 1}


def test_begin_filter_passes_the_node_locked_for_its_own_pod() -> None:
    cache = locked_cluster()
    demand = HAMI.pod_demand(make_hami_pod("x", mem=1000))
    outcome = placer_for(cache).begin_filter(demand, ["held", "free"], cache.nodes, "default/p")
    assert isinstance(outcome, FilterOutcome) and sorted(outcome.passed) == ["free", "held"]


# ---- the memo of answers and the fit index: the cache's own, never a view's -------------------------------


def test_a_filter_remembers_each_refused_nodes_answer_for_the_next_pod_of_that_size() -> None:
    """A burst of same-sized pods gets each node's reason formatted once (`filtering.filter_cached`): the answers
    are in the cache's memo, under this demand and unit, after the first filter."""
    cluster = gpushare()
    outcome = placer_for(cluster).filter(Demand(13), ["n1", "mixed", "sick"], cluster.nodes, "default/a")
    assert outcome.passed == ["mixed"]
    memo = cluster.memo.table(judged(Demand(13), "GiB"))
    assert memo == {
        "n1": Judgement(FAILED, "needs 13 GiB on one GPU; largest free is 12 GiB (GPU 1 of 2)", Cause.MEMORY),
        "sick": Judgement(UNRESOLVABLE, "needs 13 GiB on one GPU; the largest GPU here has 0 GiB", Cause.TOO_SMALL),
    }
    assert outcome.full == {"n1": Cause.MEMORY}
    assert outcome.causes == {Cause.MEMORY: 1, Cause.TOO_SMALL: 1}


def test_the_answers_remembered_for_one_size_of_pod_are_never_read_for_another() -> None:
    """n1 has 12 GiB free at most: a pod asking 13 GiB (and some compute, so judged node by node) is refused there,
    one asking 4 fits; each size of pod has its own table of answers."""
    cluster = gpushare()
    placer = placer_for(cluster)
    assert placer.filter(Demand(13, cores=10), ["n1"], cluster.nodes, "default/a").passed == []
    assert placer.filter(Demand(4, cores=10), ["n1"], cluster.nodes, "default/b").passed == ["n1"]
    assert placer.filter(Demand(13, cores=10), ["n1"], cluster.nodes, "default/a").passed == []


def test_a_filter_over_views_of_nodes_leaves_the_caches_answers_as_they_are() -> None:
    """Preemption filters over views of the nodes without their victims (`states` not the cache's): n1 takes 13 GiB
    there, not in the cache; what the view answered must not be remembered as the cache's, for any kind of pod."""
    for demand in (Demand(13), Demand(13, cores=10)):
        cluster = gpushare()
        emptier = make_cluster(make_node("n1", gpus=2, mem=16))  # the same node, its pods evicted
        placer = placer_for(cluster)
        assert placer.filter(demand, ["n1"], emptier.nodes, "default/a").passed == ["n1"]
        refused = placer.filter(demand, ["n1"], cluster.nodes, "default/a")
        assert refused.passed == [] and list(refused.failed) == ["n1"], demand
        assert placer.filter(demand, ["n1"], emptier.nodes, "default/a").passed == ["n1"]


def test_only_a_plain_one_gpu_demand_is_answered_from_the_fit_index() -> None:
    """The index's sets hold the nodes whose largest free GPU takes a one-GPU demand of that size: they say
    nothing of a pod of two GPUs, or of one asking compute too."""
    fitting = {"n1"}
    assert all_fit(Demand(12), ["n1"], fitting)
    assert not all_fit(Demand(12), ["n1", "n2"], fitting)
    assert not all_fit(Demand(24, devices=2), ["n1"], fitting)
    assert not all_fit(Demand(12, cores=30), ["n1"], fitting)


@pytest.mark.parametrize("bad", [{"name": "n1"}, ["n1"]])
def test_a_node_name_that_is_no_string_is_an_invalid_request_even_when_every_other_fits(bad: Any) -> None:
    cluster = gpushare()
    with pytest.raises(InvalidArgs, match="NodeNames"):
        filter_cached(Demand(4), ["n1", bad], cluster.nodes, cluster, "GiB")


# ---- the placer over a learned workload ---------------------------------------------------------------------


def test_a_placer_built_without_a_learned_workload_learns_from_its_cache() -> None:
    """n1 and n2 hold 400 of a GPU each, n3 nothing; halves and wholes typical: the best node for a 500 share is
    a started GPU (n1 first by name), as with the learned workload the service builds."""
    started = (bound_pod("r1", "n1", (0,), 400), bound_pod("r2", "n2", (0,), 400))
    cache = make_cluster(node("n1"), node("n2"), node("n3"), pods=started)
    teach(cache, (500, "4", 5), (1000, "8", 5))
    placer = Placer(cache, BEST)
    outcome = placer.filter(Demand(memory=500), ["n3", "n2", "n1"], cache.nodes, "default/a", ask(500))
    assert outcome.passed == ["n1"]


def test_a_placer_places_by_the_learned_workload_it_is_given() -> None:
    """The service builds one `Learned` per cache, with the workload's settings, and shows it in /metrics: the
    placer must read that one (here: at most one typical shape), not learn a second of its own."""
    cache = make_cluster(node("n1"))
    teach(cache, (500, "4", 5), (1000, "8", 3))
    given = Learned(cache, Workload(max_classes=1))
    placer = Placer(cache, BEST, given)
    assert placer.learned is given
    assert len(placer.learned.classes().shapes) == 1


# ---- the general fit as the filter judges it ----------------------------------------------------------------


def two_containers(*annotations: tuple[str, str]) -> Demand:
    """A HAMi pod of two containers on a GPU each: 10000 MiB and 35000 MiB, 10 % compute each."""
    pod = make_hami_pod("new", mem=10000, cores=10)
    pod["metadata"]["annotations"].update(annotations)
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "35000", "nvidia.com/gpucores": "10"}
    pod["spec"]["containers"].append({"name": "second", "resources": {"limits": limits}})
    return HAMI.pod_demand(pod)


def test_a_pod_of_several_containers_is_judged_by_the_gpu_strategy_its_bind_will_use() -> None:
    """GPU 1 has 12000 MiB free, GPU 0 all 40960. By binpack (the default) the first container takes the fuller GPU
    1 and the second fits on GPU 0; by spread, which the pod may ask, the first takes GPU 0, which keeps 30960,
    too little for the second: the filter says so rather than pass a node its bind would refuse."""
    cluster = make_hami_cluster(make_hami_node("h"), pods=(running_hami_pod("a", "h", 1, 28960, 10),))
    state = cluster.nodes["h"]
    assert judge(two_containers(), state, "MiB") == FITS
    assert judge(two_containers(("hami.io/gpu-scheduler-policy", "spread")), state, "MiB") == Judgement(
        FAILED,
        "container 2 of 2: needs 35000 MiB on one GPU; largest free is 30960 MiB (GPU 0 of 2)",
        Cause.MEMORY,
    )


def test_a_gpu_blocked_on_a_node_not_in_mig_mode_takes_no_pod_asking_compute() -> None:
    """A pod reserves a MIG instance on GPU 0, which is not in MIG mode (HAMi marks such a GPU unhealthy): nothing
    is free there, though only 5120 MiB are used; GPU 1 has 5960 left. A pod of 10000 MiB and 20 % fits nowhere."""
    odd = bound_mig_pod("odd", "core-1", (Grant(0, 5120, 14, "GPU-core-1-0", MigInstance("1g.5gb", 6, 1)),))
    busy = running_hami_pod("b", "core-1", 1, 35000, 10)
    state = make_hami_cluster(make_hami_node("core-1"), pods=(odd, busy)).nodes["core-1"]
    assert not state.mig and list(state.blocked) == [0]
    assert judge(Demand(10000, cores=20), state, "MiB") == Judgement(
        FAILED, "needs 10000 MiB on one GPU; largest free is 5960 MiB (GPU 1 of 2)", Cause.MEMORY
    )


def test_a_node_locked_for_the_pod_asking_refuses_it_for_room_not_for_the_lock() -> None:
    """The node is locked for default/p, and both GPUs run 40000 of 40960 MiB: its own lock keeps nothing from the
    pod, so what it is told is what an eviction could fix, the memory."""
    clock = FakeClock()
    clock.now = 1_787_306_400.0 + 10  # 2026-08-21T10:00:10Z
    cache = Cache(HAMI, lock_timeout=300.0, clock=clock)
    running = [running_hami_pod(name, "held", gpu, 40000, 10) for gpu, name in enumerate("ab")]
    node = make_hami_node("held")
    node["metadata"]["annotations"][LOCK] = "2026-08-21T10:00:00Z,default,p"
    cache.replace([node], [make_hami_pod("p", mem=1000), *running])
    full = Judgement(FAILED, "needs 1000 MiB on one GPU; largest free is 960 MiB (GPU 0 of 2)", Cause.MEMORY)
    assert judge(Demand(1000), cache.nodes["held"], "MiB", "default/p") == full
    assert judge(Demand(1000, cores=10), cache.nodes["held"], "MiB", "default/p") == full


def test_a_node_state_without_gpus_or_a_reason_is_unresolvable_for_having_no_gpus() -> None:
    """Every protocol says why it found no GPUs; a state without devices and without that reason still answers
    plainly."""
    assert judge(Demand(4), NodeState("bare"), "GiB") == Judgement(UNRESOLVABLE, "no GPUs", Cause.NO_GPUS)


def test_the_placer_judges_a_node_locked_for_the_pod_asking_as_free_for_it() -> None:
    """`Placer.judge` as `judge`: the lock held for default/p keeps default/q off the node, not default/p."""
    cache = locked_cluster()
    placer = placer_for(cache)
    assert placer.judge(Demand(1000), cache.nodes["held"], "default/p") == FITS
    assert placer.judge(Demand(1000), cache.nodes["held"], "default/q") == Judgement(FAILED, LOCKED_FOR_P, Cause.LOCKED)
