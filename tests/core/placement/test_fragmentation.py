"""The fragmentation policy's decisions: which node the filter passes, which GPUs a bind gives, what prioritize
scores, and what the cache counts for it (cpu, memory, the shapes it learns)."""

from __future__ import annotations

from typing import Any

import pytest

from extender.core.cache import Cache
from extender.core.devices import Demand, Strategy
from extender.core.placement.config import Ask, Narrowing, Policy, PolicyConfig, ask_of
from extender.core.placement.fragmentation import added_fragmentation, fragmentation_values
from extender.core.placement.measure import room_of
from extender.core.placement.narrowing import scores
from extender.core.protocols.gpushare import Profile
from tests.builders import bound_pod, learned_of, make_cluster, make_node, make_pod, placer_for

GPU = 1000
BEST = PolicyConfig()
TIES = PolicyConfig(narrowing=Narrowing.TIES)
OFF = PolicyConfig(narrowing=Narrowing.OFF)
GIB = 1 << 30


def node(name: str, gpus: int = 2, cpu: str = "64", memory: str = "256Gi", model: str = "") -> dict[str, Any]:
    return make_node(name, gpus=gpus, mem=GPU, cpu=cpu, memory=memory, model=model)


def teach(cache: Cache, *shapes: tuple[int, str, int]) -> None:
    """Let the cache see pending pods of these (GPU memory, cpu, count) shapes: what it learns the workload from.
    Beyond one GPU's memory, whole GPUs (2000: two GPUs)."""
    for memory, cpu, count in shapes:
        gpus = memory // GPU if memory > GPU else None
        for number in range(count):
            name = f"seen-{memory}-{cpu}-{number}"
            cache.apply_pod(make_pod(name, gpu_mem=memory, gpus=gpus, cpu=cpu, memory="1Gi"))


def ask(memory: int, cpu: str = "4", devices: int = 1) -> Ask:
    return ask_of(make_pod("asking", gpu_mem=memory, gpus=devices if devices > 1 else None, cpu=cpu, memory="1Gi"),
                  Demand(memory=memory, devices=devices))  # fmt: skip


def passed(cache: Cache, ask: Ask, names: list[str], config: PolicyConfig = BEST) -> list[str]:
    return placer_for(cache, config).filter(ask.demand, names, cache.nodes, "default/asking", ask).passed


def test_a_share_goes_to_the_gpu_that_keeps_the_rest_usable() -> None:
    """Halves and wholes are typical. A half on the empty GPU would leave 500 that no whole can use (0.5 x 1.1
    fragment after); on the GPU with 600 free it leaves 100 that neither can use (0.5 x 0.1 + 0.5 x 0.1)."""
    cache = make_cluster(node("n1"), pods=(bound_pod("running", "n1", (1,), 400),))
    teach(cache, (500, "4", 5), (1000, "8", 5))
    state = cache.nodes["n1"]
    added = added_fragmentation(ask(500), state, learned_of(cache))
    assert added is not None and added[1] == (1,)
    placed = placer_for(cache, BEST).choose(Demand(memory=500), state, ask(500))
    assert placed is not None and [grant.index for grant in placed.containers[0]] == [1]


def test_the_filter_passes_the_one_node_where_the_pod_adds_least_fragmentation() -> None:
    """A whole GPU pod: on n1 (one GPU free of two) it fills the node, and F there falls to 0; on the empty n2 it
    leaves one whole GPU, no fragment either way. n1 is better: the half-used node is the one to finish."""
    cache = make_cluster(node("n1"), node("n2"), pods=(bound_pod("running", "n1", (0,), 1000),))
    teach(cache, (500, "4", 5), (1000, "8", 5))
    assert passed(cache, ask(1000), ["n2", "n1"]) == ["n1"]


def test_equally_good_nodes_go_to_the_fullest_then_the_first_by_name() -> None:
    cache = make_cluster(node("b"), node("a"), node("c", gpus=4))
    teach(cache, (1000, "8", 5))
    # on any empty node a whole GPU pod adds nothing: the 2-GPU nodes have less free GPU than c, a before b
    assert passed(cache, ask(1000), ["b", "c", "a"]) == ["a"]
    assert sorted(passed(cache, ask(1000), ["b", "c", "a"], TIES)) == ["a", "b", "c"]


def test_without_narrowing_every_fitting_node_passes() -> None:
    cache = make_cluster(node("n1"), node("n2"))
    assert sorted(passed(cache, ask(1000), ["n1", "n2"], OFF)) == ["n1", "n2"]


def test_cpu_that_starves_a_gpu_counts_against_a_node() -> None:
    """Whole GPU pods bring 8 cores each. n1 has 2 GPUs and 20 cores, n2 2 GPUs and 64. One asking 14 cores
    leaves n1 6 cores for its last GPU, which then cannot run a typical pod (and starves): n2 is better."""
    cache = make_cluster(node("n1", cpu="20"), node("n2", cpu="64"))
    teach(cache, (1000, "8", 10))
    assert passed(cache, ask(1000, cpu="14"), ["n1", "n2"]) == ["n2"]


def test_a_pod_asking_no_gpu_gets_every_node_where_its_cpu_strands_least() -> None:
    """Its cpu strands no GPU on the full n1, nor on n3 which has no GPUs; on n2 it would leave too little cpu for
    the whole-GPU pods the cluster runs. kube-scheduler's own scores then spread such pods among n1 and n3."""
    cache = make_cluster(
        node("n1", cpu="40"), node("n2", cpu="40"), node("n3", gpus=0, cpu="40"),
        pods=(bound_pod("full", "n1", (0, 1), 2000, gpus=2),),
    )  # fmt: skip
    teach(cache, (1000, "16", 10))
    assert sorted(passed(cache, ask(0, cpu="30"), ["n1", "n2", "n3"])) == ["n1", "n3"]


def test_a_pod_that_asks_its_own_strategy_is_placed_by_fill() -> None:
    """HAMi's hami.io/node-scheduler-policy: the pod's word stands."""
    cache = make_cluster(node("n1"), node("n2"))
    demand = Demand(memory=500, node_strategy=Strategy.SPREAD)
    spread = Ask(demand, 4000, GIB)
    assert sorted(passed(cache, spread, ["n1", "n2"])) == ["n1", "n2"]


def test_the_fill_policy_never_narrows() -> None:
    cache = make_cluster(node("n1"), node("n2"))
    assert sorted(passed(cache, ask(500), ["n1", "n2"], PolicyConfig(policy=Policy.FILL))) == ["n1", "n2"]


def test_a_pod_that_fits_nowhere_is_refused_on_every_node_with_its_reasons() -> None:
    cache = make_cluster(node("n1"), pods=(bound_pod("running", "n1", (0, 1), 2000, gpus=2),))
    outcome = placer_for(cache, BEST).filter(Demand(memory=500), ["n1"], cache.nodes, "", ask(500))
    assert outcome.passed == [] and set(outcome.failed) == {"n1"}


def test_scores_give_ten_to_the_best_and_fall_in_nine_steps_to_the_worst() -> None:
    """Two-GPU pods weigh 5/11 of what the cache saw (the rest are halves, which fit anywhere here; cpu aplenty).
    A half on n1 (500 and 1000 free) takes the 500: F falls from 5/11 x 1.5 (n1 cannot run a two-GPU pod) to
    5/11 x 1, so -0.227; on the empty node it breaks a GPU the two-GPU pods needed: 0 -> 5/11 x 1.5 = +0.682;
    on the 4-GPU node the 500 left is theirs to waste: 0 -> 5/11 x 0.5 = +0.227. Scores: 10 for the least, and
    9 x (0.682 - 0.227) / (0.682 + 0.227) = 4.5, so 4, for the 4-GPU node; 0 for the worst and the unknown."""
    cache = make_cluster(node("n1", cpu="256"), node("empty", cpu="256"), node("four", gpus=4, cpu="256"))
    cache.apply_pod(bound_pod("running", "n1", (0,), 500))
    teach(cache, (500, "1", 5), (2000, "1", 5))
    names = ["n1", "empty", "four", "unknown"]
    values = fragmentation_values(ask(500, cpu="1"), names, learned_of(cache), cache.nodes)
    assert dict(zip(names, scores(values, OFF.tolerance), strict=True)) == {
        "n1": 10,
        "four": 4,
        "empty": 0,
        "unknown": 0,
    }


def test_prioritize_under_the_fragmentation_policy_lists_only_nodes_above_the_lowest() -> None:
    cache = make_cluster(node("n1", cpu="256"), node("n2", cpu="256"), pods=(bound_pod("running", "n1", (0,), 500),))
    teach(cache, (500, "1", 5), (2000, "1", 5))
    entries = placer_for(cache, OFF).prioritize(Demand(memory=500), ["n1", "n2"], cache.nodes, ask(500, cpu="1"))
    assert entries == [{"Host": "n1", "Score": 10}]


def test_what_the_filter_remembers_is_forgotten_when_the_node_changes() -> None:
    cache = make_cluster(node("n1"), node("n2"))
    teach(cache, (1000, "8", 5))
    assert passed(cache, ask(1000), ["n1", "n2"]) == ["n1"]
    cache.apply_pod(bound_pod("elsewhere", "n2", (0,), 1000))  # n2 is now half full: finishing it is better
    assert passed(cache, ask(1000), ["n1", "n2"]) == ["n2"]


# --- what the cache counts for the policy ------------------------------------------------------------------


def test_a_node_counts_the_cpu_and_memory_of_the_pods_bound_to_it() -> None:
    cache = make_cluster(node("n1", cpu="8", memory="32Gi"))
    cache.apply_pod(make_pod("web", gpu_mem=None, cpu="1500m", memory="2Gi", node="n1", phase="Running"))
    cache.apply_pod(bound_pod("gpu", "n1", (0,), 500) | {})
    state = cache.nodes["n1"]
    assert (state.cpu_allocatable, state.memory_allocatable) == (8000, 32 * GIB)
    assert (state.cpu_requested, state.memory_requested) == (1500, 2 * GIB)
    assert room_of(state).cpu == 6500


def test_a_pod_reserved_on_a_node_counts_there_before_the_watch_shows_it_bound_and_not_after_it_is_gone() -> None:
    from extender.core.holds import Allocation, Hold, HoldState

    cache = make_cluster(node("n1", cpu="8"))
    pod = make_pod("p", gpu_mem=500, cpu="2")
    cache.apply_pod(pod)
    uid = pod["metadata"]["uid"]
    assert cache.nodes["n1"].cpu_requested == 0
    cache.hold(Hold(Allocation.uniform(uid, "default/p", "n1", (0,), 500), HoldState.RESERVED, since=0.0))
    assert cache.nodes["n1"].cpu_requested == 2000
    cache.release(uid)
    assert cache.nodes["n1"].cpu_requested == 0
    cache.apply_pod(pod, deleted=True)
    assert cache.nodes["n1"].cpu_requested == 0


def test_a_finished_pod_frees_its_cpu() -> None:
    cache = make_cluster(node("n1", cpu="8"))
    cache.apply_pod(make_pod("job", gpu_mem=None, cpu="3", node="n1", phase="Running", uid="job-uid"))
    cache.apply_pod(make_pod("job", gpu_mem=None, cpu="3", node="n1", phase="Succeeded", uid="job-uid"))
    assert cache.nodes["n1"].cpu_requested == 0


def test_each_pod_is_learned_once_when_it_first_appears_and_a_restart_learns_them_all_again() -> None:
    pods = [make_pod(f"p{number}", gpu_mem=500, cpu="4") for number in range(3)]
    cache = make_cluster(node("n1"), pods=tuple(pods))
    assert learned_of(cache).workload.observed == 3
    for pod in pods:
        cache.apply_pod(pod)  # updates of pods already seen teach nothing new
    assert learned_of(cache).workload.observed == 3
    restarted = make_cluster(node("n1"), pods=tuple(pods))
    assert learned_of(restarted).workload.observed == 3 and learned_of(restarted).workload.classes().shapes


def test_a_pods_required_gpu_models_are_part_of_its_shape() -> None:
    cache = make_cluster(node("n1", model="T4"))
    cache.apply_pod(make_pod("picky", gpu_mem=500, cpu="4", models=("T4", "V100")))
    (shape,) = learned_of(cache).workload.classes().shapes
    assert shape.models == ("T4", "V100")
    assert cache.nodes["n1"].devices[0].model == "T4"


def test_without_a_model_label_the_gpus_have_no_model() -> None:
    cache = make_cluster(make_node("n1", model="T4"), profile=Profile(model_label=""))
    assert cache.nodes["n1"].devices[0].model == ""


@pytest.mark.parametrize("narrowing", list(Narrowing))
def test_every_narrowing_keeps_a_node_that_fits(narrowing: Narrowing) -> None:
    cache = make_cluster(node("n1"), node("n2"), node("n3"))
    teach(cache, (500, "4", 3), (1000, "8", 3))
    assert passed(cache, ask(500), ["n1", "n2", "n3"], PolicyConfig(narrowing=narrowing))


# --- HAMi: memory, compute and slots --------------------------------------------------------------------------


def test_a_hami_pod_asking_compute_goes_to_the_gpu_whose_rest_stays_usable() -> None:
    """Typical HAMi pods ask 20 GiB and 50 % compute of a 40 GiB card. GPU 0 runs one already (20 GiB, 50 %
    left), GPU 1 is empty. A new one on GPU 0 fills it (nothing left over); on GPU 1 it would leave two half
    cards instead of one whole one, and no typical pod ever fits a whole card less than half: both are used
    either way, so the measure is equal, and the fuller GPU wins (binpack), keeping GPU 1 whole."""
    from tests.builders import make_hami_cluster, make_hami_node, make_hami_pod, running_hami_pod

    cache = make_hami_cluster(make_hami_node("h1", gpus=2), pods=(running_hami_pod("running", "h1", 0, 20480, 50),))
    for number in range(4):
        cache.apply_pod(make_hami_pod(f"seen-{number}", mem=20480, cores=50))
    pod = make_hami_pod("asking", mem=20480, cores=50)
    demand = cache.protocol.pod_demand(pod)
    placed = placer_for(cache, BEST).choose(demand, cache.nodes["h1"], ask_of(pod, demand))
    assert placed is not None and [grant.index for grant in placed.containers[0]] == [0]


def test_a_hami_pod_that_asks_its_own_gpu_policy_keeps_it() -> None:
    """hami.io/gpu-scheduler-policy: spread puts it on the emptier GPU, whatever the measure says."""
    from tests.builders import make_hami_cluster, make_hami_node, make_hami_pod, running_hami_pod

    cache = make_hami_cluster(make_hami_node("h1", gpus=2), pods=(running_hami_pod("running", "h1", 0, 20480, 50),))
    pod = make_hami_pod("asking", mem=10240, cores=20, **{"hami.io/gpu-scheduler-policy": "spread"})
    demand = cache.protocol.pod_demand(pod)
    placed = placer_for(cache, BEST).choose(demand, cache.nodes["h1"], ask_of(pod, demand))
    assert placed is not None and [grant.index for grant in placed.containers[0]] == [1]
