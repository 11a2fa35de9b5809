"""The fragmentation policy (`fragmentation.py`) where `make mutation` found it unguarded: what each pod size adds
to each node, and the GPUs it would take there, are kept per size and for the cache's own nodes alone, so a filter
or a bind for one size never reads what another size, or a view of the nodes, left; warming judges a slice at a
time and leaves nothing to judge after; a topology-aware pod of several GPUs pays in full for a node that reports
no links; and, judged the general way (compute, several containers, shares, MIG), what a pod adds is what the node
measures once it holds the pod, on the GPU where that is least."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest

from extender.core.cache import Cache
from extender.core.devices import Demand, Selectors, Strategy
from extender.core.holds import Allocation, Grant
from extender.core.mig import MigInstance
from extender.core.placement import fragmentation
from extender.core.placement.config import Ask, ask_of
from extender.core.placement.fit import Placement
from extender.core.placement.fragmentation import DIGITS, added_fragmentation, warming
from extender.core.placement.learned import Learned
from extender.core.placement.measure import room_of
from extender.core.placement.topology import ASKED_WEIGHT
from tests.builders import (
    HAMI,
    PROFILE,
    FakeClock,
    bound_pod,
    learned_of,
    make_cluster,
    make_hami_cluster,
    make_hami_node,
    make_hami_pod,
    make_ledger,
    make_mig_node,
    make_node,
    placer_for,
    running_hami_pod,
)
from tests.core.placement.test_batch import random_cluster
from tests.core.placement.test_fragmentation import BEST, ask, node, teach
from tests.core.test_hami_rules_v2100 import mig_held as held_instances
from tests.core.test_hami_rules_v2100 import one_g

MIG = {"nvidia.com/vgpu-mode": "mig"}


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


# ---- what a pod adds is what the node's measure becomes once it holds the pod ------------------------------


def hami_seen(number: int, mem: int, cores: int) -> dict[str, Any]:
    return make_hami_pod(f"seen-{number}", mem=mem, cores=cores)


def adds_what_it_holds(cluster: Cache, node_name: str, pod: dict[str, Any]) -> Placement:
    """What the policy says placing the pod adds to the node (`added_fragmentation`, the general way for a pod
    asking compute, several containers or a MIG instance) is the node's measure once it holds the pod on the GPUs
    chosen, less its measure before: the same build of the typical shapes, the pod asking no cpu or memory."""
    learned = learned_of(cluster)
    classes = learned.classes()
    state = cluster.nodes[node_name]
    demand = HAMI.pod_demand(pod)
    added = added_fragmentation(Ask(demand, 0, 0), state, learned, classes)
    assert added is not None and isinstance(added[1], Placement)
    placement = added[1]
    before = learned.fragments.of(room_of(state), classes)
    allocation = Allocation("uid-new", "default/new", node_name, placement.containers, placement.init_containers)
    assert make_ledger(cluster).reserve(allocation) is None
    after = learned.fragments.of(room_of(cluster.nodes[node_name]), classes)
    assert added[0] == round(after - before, DIGITS) != 0.0
    return placement


def test_a_hami_pod_asking_compute_adds_what_the_node_holding_it_measures() -> None:
    """One GPU running 10000 MiB and 30 %; pods of 10000 and 30 % and of 20000 and 60 % typical: the pod's 15000
    and 40 % leave room for the smaller only."""
    seen = [hami_seen(number, 10000 if number % 2 else 20000, 30 if number % 2 else 60) for number in range(6)]
    cluster = make_hami_cluster(make_hami_node("h", gpus=1), pods=(running_hami_pod("a", "h", 0, 10000, 30), *seen))
    adds_what_it_holds(cluster, "h", make_hami_pod("new", mem=15000, cores=40))


def test_a_pod_of_two_containers_on_one_gpu_adds_what_the_node_holding_both_measures() -> None:
    """GPU 1 is all but full, so both containers (5000 MiB and 10 % each) go to GPU 0, beside pod a: 20000 MiB and
    50 % used there, too little compute left for the typical 20000 and 60 %."""
    seen = [hami_seen(number, 10000 if number % 2 else 20000, 30 if number % 2 else 60) for number in range(6)]
    running = (running_hami_pod("a", "h", 0, 10000, 30), running_hami_pod("b", "h", 1, 40000, 10))
    cluster = make_hami_cluster(make_hami_node("h"), pods=(*running, *seen))
    pod = make_hami_pod("new", mem=5000, cores=10)
    pod["spec"]["containers"].append({**pod["spec"]["containers"][0], "name": "second"})
    placement = adds_what_it_holds(cluster, "h", pod)
    assert [grant.index for grants in placement.containers for grant in grants] == [0, 0]


def test_pods_asking_memory_alone_or_a_share_add_what_the_node_holding_them_measures() -> None:
    """Judged the general way too (two containers; a share of a GPU's memory): 6000 MiB twice, no compute, beside
    pod a on GPU 0; 30 % of 40960 (12288) beside pod a on a node of one GPU: either leaves less than 20000."""
    seen = [hami_seen(number, 10000 if number % 2 else 20000, 30 if number % 2 else 60) for number in range(6)]
    running = (running_hami_pod("a", "h", 0, 10000, 30), running_hami_pod("b", "h", 1, 40000, 10))
    cluster = make_hami_cluster(make_hami_node("h"), pods=(*running, *seen))
    pod = make_hami_pod("new", mem=6000)
    pod["spec"]["containers"].append({**pod["spec"]["containers"][0], "name": "second"})
    adds_what_it_holds(cluster, "h", pod)
    share = make_hami_pod("new")
    share["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpumem-percentage"] = "30"
    cluster = make_hami_cluster(make_hami_node("h", gpus=1), pods=(running_hami_pod("a", "h", 0, 10000, 30), *seen))
    placement = adds_what_it_holds(cluster, "h", share)
    assert placement.containers[0][0].memory == 12288


def test_a_mig_pod_adds_what_the_node_holding_its_instance_measures() -> None:
    """1g instances at slices 0-3; 1g and 3g pods typical: a 1g more (at slice 6) leaves no room for a 3g, which
    had room at slices 4-7."""
    seen = [make_hami_pod(f"seen-{number}", mem=4000 if number % 2 else 20000, **MIG) for number in range(6)]
    cluster = make_hami_cluster(
        make_mig_node(), pods=(*held_instances(*(one_g(start) for start in (0, 1, 2, 3))), *seen)
    )
    placement = adds_what_it_holds(cluster, "mig-1", make_hami_pod("new", mem=4000, **MIG))
    assert placement.containers[0][0].instance == MigInstance("1g.5gb", 6, 1)


def hami_cluster(used: tuple[tuple[int, int], tuple[int, int]]) -> Cache:
    """Two GPUs running (memory, compute) each; pods of 10000 MiB and 30 % and of 20000 and 60 % typical."""
    seen = [hami_seen(number, 10000 if number % 2 else 20000, 30 if number % 2 else 60) for number in range(6)]
    running = tuple(running_hami_pod(f"r{gpu}", "h", gpu, memory, cores) for gpu, (memory, cores) in enumerate(used))
    return make_hami_cluster(make_hami_node("h"), pods=(*running, *seen))


@pytest.mark.parametrize(
    ("used", "asked"),
    [
        (((10000, 60), (10000, 0)), (5000, 40)),  # GPU 0's last compute: nothing left there to strand
        (((10000, 0), (25000, 0)), (8000, 50)),
        (((25000, 60), (10000, 60)), (10000, 30)),
        (((10000, 0), (10000, 60)), (10000, 30)),
    ],
)
def test_a_hami_pod_goes_to_the_gpu_whose_hold_adds_least(
    used: tuple[tuple[int, int], tuple[int, int]], asked: tuple[int, int]
) -> None:
    """Each GPU is tried by holding the pod there (the ledger's reservation, in a cluster of its own) and measuring
    the node: the policy chooses the GPU where that adds least, by memory and compute both, and says so."""
    memory, cores = asked
    cluster = hami_cluster(used)
    learned = learned_of(cluster)
    classes = learned.classes()
    before = learned.fragments.of(room_of(cluster.nodes["h"]), classes)
    held = {}
    for gpu in (0, 1):
        trial = hami_cluster(used)
        allocation = Allocation("uid-new", "default/new", "h", ((Grant(gpu, memory, cores, f"GPU-h-{gpu}"),),), 0)
        assert make_ledger(trial).reserve(allocation) is None
        held[gpu] = round(learned.fragments.of(room_of(trial.nodes["h"]), classes) - before, DIGITS)
    assert held[0] != held[1]
    demand = HAMI.pod_demand(make_hami_pod("new", mem=memory, cores=cores))
    added = added_fragmentation(Ask(demand, 0, 0), cluster.nodes["h"], learned, classes)
    assert added is not None and isinstance(added[1], Placement)
    best = min(held, key=held.__getitem__)
    assert (added[1].containers[0][0].index, added[0]) == (best, held[best])


# ---- the policy's rank of nodes for a job's plan (`Fragmentation.values`) ---------------------------------


def three_kinds() -> Cache:
    """`n1` runs 500 of its GPU 0's 1000, `empty` two GPUs free, `four` four; cpu aplenty; halves and two-GPU pods
    typical (test_fragmentation's scores), all seen at one instant of a clock that stands still (so their weights
    do not decay between them, whatever the speed of the run)."""
    cache = Cache(PROFILE, clock=FakeClock())
    cache.replace([node("n1", cpu="256"), node("empty", cpu="256"), node("four", gpus=4, cpu="256")], [])
    cache.apply_pod(bound_pod("running", "n1", (0,), 500))
    teach(cache, (500, "1", 5), (2000, "1", 5))
    return cache


def test_the_policy_ranks_nodes_by_the_fragmentation_a_pod_adds_there() -> None:
    """A half on n1 takes the 500 left: F falls from 5/11 x 1.5 to 5/11 x 1 (-5/22); on the empty node it breaks a
    GPU the two-GPU pods needed (+15/22); on `four` the 500 left is theirs to waste (+5/22): each rounded to 1e-9,
    plus 1e-12 x the node's free GPU (1.5, 2, 4) to rank the fuller first among equals; the unknown name inf."""
    cache = three_kinds()
    values = placer_for(cache, BEST).values(ask(500, cpu="1"), ["n1", "empty", "four", "unknown"], cache.nodes)
    expected = [round(-5 / 22, DIGITS) + 1.5e-12, round(15 / 22, DIGITS) + 2e-12, round(5 / 22, DIGITS) + 4e-12]
    assert values.tolist()[:3] == pytest.approx(expected, abs=1e-13)
    assert values[3] == np.inf


def test_a_pod_asking_no_gpu_ranks_every_node_alike() -> None:
    """What its cpu strands differs by node (the measure says so), but the plan of a job's member that asks no GPU
    has no GPUs to choose: every node ranks 0, the unknown name too."""
    cache = three_kinds()
    names = ["n1", "empty", "four", "unknown"]
    cpu_heavy = Ask(Demand(0), 255_500, 0)
    stranded = fragmentation.fragmentation_values(cpu_heavy, names, learned_of(cache), cache.nodes)
    assert len(set(stranded.tolist())) == 4
    assert placer_for(cache, BEST).values(cpu_heavy, names, cache.nodes).tolist() == [0.0, 0.0, 0.0, 0.0]


def test_a_node_not_ready_is_ranked_where_no_pod_goes() -> None:
    """A job's plan asks the policy about any node, not only those a filter passed: `down` is empty and would take
    the half, but it is not Ready, so it ranks inf beside the unknown name."""
    cache = three_kinds()
    cache.apply_node(make_node("down", gpus=2, mem=1000, cpu="256", memory="256Gi", ready=False))
    assert not cache.nodes["down"].ready
    values = placer_for(cache, BEST).values(ask(500, cpu="1"), ["down", "n1", "unknown"], cache.nodes)
    assert values[0] == np.inf and values[1] < 0 and values[2] == np.inf


def test_a_plan_on_a_scratch_copy_of_a_node_is_given_the_gpus_free_there_not_those_the_filter_remembered() -> None:
    """A filter for a 500 share remembers GPU 1 on n1 (600 free: the rest of the empty GPU 0 stays whole). A job's
    plan then places on scratch copies of the nodes (core/gang.py), where n1's GPU 1 is already planned full: the
    share must go to GPU 0 there, while the cache's own n1 still gets GPU 1."""
    cache = make_cluster(node("n1"), node("n2"), pods=(bound_pod("r", "n1", (1,), 400),))
    teach(cache, (500, "4", 5), (1000, "8", 5))
    placer = placer_for(cache, BEST)
    placer.filter(Demand(memory=500), ["n1", "n2"], cache.nodes, "d/a", ask(500))
    planned = (bound_pod("r", "n1", (1,), 400), bound_pod("planned", "n1", (1,), 600))
    scratch = make_cluster(node("n1"), node("n2"), pods=planned)
    on_scratch = placer.choose(Demand(memory=500), scratch.nodes["n1"], ask(500))
    on_cache = placer.choose(Demand(memory=500), cache.nodes["n1"], ask(500))
    assert on_scratch is not None and [grant.index for grant in on_scratch.containers[0]] == [0]
    assert on_cache is not None and [grant.index for grant in on_cache.containers[0]] == [1]


def test_a_hami_pod_asking_memory_alone_is_given_its_gpu_by_uuid() -> None:
    """HAMi's plugin finds the GPU by the UUID in the pod's annotation: a plain pod placed the fragmentation way (the
    GPUs as positions, turned into grants at the bind) must carry it too. GPU 0 already runs a pod: the fuller."""
    cluster = make_hami_cluster(make_hami_node("h"), pods=(running_hami_pod("a", "h", 0, 10000, 10),))
    pod = make_hami_pod("p", mem=1000)
    demand = HAMI.pod_demand(pod)
    assert demand.plain
    placed = placer_for(cluster, BEST).choose(demand, cluster.nodes["h"], ask_of(pod, demand))
    assert placed == Placement(((Grant(0, 1000, 0, "GPU-h-0"),),), 0)


def test_the_narrowing_over_many_views_of_nodes_reads_the_views_not_the_caches_arrays() -> None:
    """Twenty nodes of one kind, enough to be judged in arrays (BATCH_NODES): all empty in the cache, but in the
    views preemption sends n05 runs a 500 share. Over the views the best node for a 500 share is n05 (it fills
    the started GPU); the cache's rows, where all are alike, would say n00, the first by name."""
    names = [f"n{number:02d}" for number in range(20)]
    cache = make_cluster(*(node(name) for name in names))
    teach(cache, (500, "4", 5), (1000, "8", 5))
    views = make_cluster(*(node(name) for name in names), pods=(bound_pod("r", "n05", (0,), 500),))
    placer = placer_for(cache, BEST)
    assert placer.filter(Demand(memory=500), names, views.nodes, "d/a", ask(500)).passed == ["n05"]
    assert placer.filter(Demand(memory=500), names, cache.nodes, "d/a", ask(500)).passed == ["n00"]


def mig_pod(name: str, memory: int) -> dict[str, Any]:
    """A pending HAMi pod asking `memory` MiB of a GPU in MIG mode."""
    pod = make_hami_pod(name, mem=memory)
    pod["metadata"]["annotations"].update(MIG)
    return pod


def test_a_mig_pod_of_two_containers_is_measured_on_both_its_instances() -> None:
    """A 1g instance at slice 0; 1g, 2g and 3g pods typical, and each fits the free slices: F is 0. A pod of a 1g
    and a 2g container takes slice 1 and slices 2-3, which leaves 4-7 for a 3g: F stays 0, the pod adds nothing.
    Measured as one instance for the two containers' memory together (a 3g, at 4-7), the 3g's room would be gone."""
    sizes = (4000, 9000, 20000)
    seen = [mig_pod(f"seen-{number}", sizes[number % 3]) for number in range(6)]
    cluster = make_hami_cluster(make_mig_node(), pods=(*held_instances(one_g(0)), *seen))
    pod = mig_pod("new", 4000)
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "9000"}
    pod["spec"]["containers"].append({"name": "second", "resources": {"limits": limits}})
    learned = learned_of(cluster)
    assert learned.measure(cluster.nodes["mig-1"]) == 0.0
    added = added_fragmentation(Ask(HAMI.pod_demand(pod), 0, 0), cluster.nodes["mig-1"], learned)
    assert added is not None and isinstance(added[1], Placement)
    instances = [grant.instance for grants in added[1].containers for grant in grants]
    assert instances == [MigInstance("1g.5gb", 1, 1), MigInstance("2g.10gb", 2, 2)]
    assert added[0] == 0.0


def test_warming_leaves_to_the_filter_what_one_slice_of_each_way_judges(monkeypatch: pytest.MonkeyPatch) -> None:
    """40 nodes a slice one by one (SCALAR_SLICE), 2,500 in arrays. 45 nodes Ready (in arrays) and 5 not Ready (one
    by one), none judged yet: 50 to judge, more than one slice one by one, but 45/2500 + 5/40 of a turn: judged at
    once by the filter, no slices. With 45 not Ready, 45/40 of a turn: slices."""
    monkeypatch.setattr(fragmentation, "SCALAR_SLICE", 40)
    for not_ready, sliced in ((5, False), (45, True)):
        nodes = [make_node(f"r{n:02d}", gpus=2, mem=1000, cpu="64", memory="256Gi") for n in range(50 - not_ready)]
        down = [make_node(f"d{n:02d}", gpus=2, mem=1000, ready=False) for n in range(not_ready)]
        cache = make_cluster(*nodes, *down)
        teach(cache, (500, "4", 5), (1000, "8", 5))
        names = list(cache.nodes)
        assert (warming(ask(500), names, learned_of(cache), cache.nodes) is not None) is sliced, not_ready


def test_a_hami_pod_is_valued_by_the_compute_each_gpu_has_left() -> None:
    """Sixteen HAMi nodes (enough for arrays, if their GPUs could be judged so), each running 10000 MiB and 70 % on
    GPU 0; pods of 10000 MiB and 50 % typical. GPU 0's 30960 MiB free are unusable for them (30 % left): F =
    30960 / 40960. A pod of 10000 MiB alone goes there, leaving 20960 unusable: it adds (20960 - 30960) / 40960 =
    -0.244140625, plus 1e-12 x the node's free GPU (71920 / 40960). Judged without the compute, it would add 0."""
    names = [f"h{number:02d}" for number in range(16)]
    running = [running_hami_pod(f"r{number}", name, 0, 10000, 70) for number, name in enumerate(names)]
    seen = [make_hami_pod(f"seen-{number}", mem=10000, cores=50) for number in range(6)]
    cluster = make_hami_cluster(*(make_hami_node(name) for name in names), pods=(*running, *seen))
    pod = make_hami_pod("p", mem=10000)
    demand = HAMI.pod_demand(pod)
    values = fragmentation.fragmentation_values(ask_of(pod, demand), names, learned_of(cluster), cluster.nodes)
    assert values.tolist() == [round(-10000 / 40960, DIGITS) + 1e-12 * (71920 / 40960)] * 16
