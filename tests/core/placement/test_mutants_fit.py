"""The general fit (`fit.py`) where `make mutation` found it unguarded: app containers of one pod adding up on a GPU
(memory, compute, slots), HAMi's per-GPU score summing memory and compute, a node of MIG and plain GPUs, the
instance a MIG grant names (its GPU's UUID, its profile, for a share of memory too), a request no MIG profile
holds, the last NUMA node of a topology-aware container, and the instances of a pod's init containers: shared
by those after them, never overlapped."""

from __future__ import annotations

from extender.core.devices import Demand, Device, Request, Selectors, Strategy
from extender.core.holds import Grant
from extender.core.mig import MigInstance
from extender.core.placement.fit import Cause, Judgement, Placement, Usage, Verdict, place
from tests.core.test_mutants_placement import gpus, migs, usage

BINPACK = Strategy.BINPACK


def placed(demand: Demand, devices: list[Device], base: Usage, strategy: Strategy = Strategy.BINPACK) -> Placement:
    result = place(demand, devices, base, strategy, "MiB")
    assert isinstance(result, Placement), result
    return result


def indexes(placement: Placement) -> list[list[int]]:
    return [[grant.index for grant in grants] for grants in placement.containers]


def pod(*requests: Request) -> Demand:
    return Demand(sum(request.memory for request in requests), containers=requests)


# ---- app containers add up ---------------------------------------------------------------------------------


def test_an_app_container_is_placed_beside_the_memory_of_those_before_it() -> None:
    """GPU 0 holds 5000 of 40960: the first container's 30000 go there (binpack: the fuller), leaving 5960, too
    little for the second's 10000, which goes to GPU 1."""
    demand = pod(Request(1, 30000), Request(1, 10000))
    assert indexes(placed(demand, gpus(), usage([5000, 0]))) == [[0], [1]]


def test_an_app_container_is_placed_beside_the_compute_of_those_before_it() -> None:
    """GPU 0 runs 20 % of its compute: the first container's 50 % go there, leaving 30 %, too little for 40 %."""
    demand = pod(Request(1, 1000, cores=50), Request(1, 1000, cores=40))
    assert indexes(placed(demand, gpus(), usage([0, 0], [20, 0]))) == [[0], [1]]


def test_an_app_container_is_refused_for_the_compute_those_before_it_took() -> None:
    """One GPU running 20 %: the first container takes 50 %, 30 % are left, the second asks 40 %."""
    judged = place(
        pod(Request(1, 1000, cores=50), Request(1, 1000, cores=40)), gpus(1), usage([0], [20]), BINPACK, "MiB"
    )
    assert judged == Judgement(
        Verdict.FAILED,
        "container 2 of 2: needs 40 % of a GPU's compute; the most free is 30 % (GPU 0 of 1)",
        Cause.COMPUTE,
    )


def test_each_app_container_takes_a_slot_of_its_gpu() -> None:
    """Two pods a GPU: the first two containers fill GPU 0's slots (the second goes to the fuller GPU), the third
    goes to GPU 1."""
    devices = [Device(i, 40960, cores=100, slots=2, uuid=f"GPU-{i}") for i in range(2)]
    demand = pod(Request(1, 1000), Request(1, 1000), Request(1, 1000))
    assert indexes(placed(demand, devices, usage([0, 0]))) == [[0], [0], [1]]


def test_binpack_weighs_compute_as_memory_in_a_gpus_fill() -> None:
    """HAMi's per-GPU score (`ComputeScore`, gpu_policy.go:194-221) adds the shares of memory and compute used:
    GPU 0 with 10000 of 40960 MiB (0.24) is emptier than GPU 1 with half its compute (0.5); GPU 0 with 30000 MiB
    (0.73) is fuller than it."""
    assert indexes(placed(Demand(1000), gpus(), usage([10000, 0], [0, 50]))) == [[1]]
    assert indexes(placed(Demand(1000), gpus(), usage([30000, 0], [0, 50]))) == [[0]]


# ---- MIG ---------------------------------------------------------------------------------------------------


def test_a_plain_gpu_beside_a_mig_gpu_is_given_as_any_plain_gpu() -> None:
    """GPU 0 in MIG mode is full; GPU 1 is not in MIG mode: the pod gets 10000 MiB of it, no instance."""
    devices = [migs(1)[0], Device(1, 40960, cores=100, slots=10, uuid="GPU-1")]
    result = placed(Demand(10000), devices, usage([40960, 0], occupied=[[(0, 4), (4, 4)], []]))
    assert result.containers == ((Grant(1, 10000, 0, "GPU-1"),),)


def test_a_mig_grant_names_its_gpu_its_profile_and_its_instance() -> None:
    """10000 MiB: the smallest profile that holds it is 2g.10gb (10240 MiB, 28 % compute), placed at the lowest
    start of an empty GPU (HAMi's order for 2g profiles); asked as 25 % of the GPU's 40960 MiB, the same."""
    expected = ((Grant(0, 10240, 28, "GPU-0", MigInstance("2g.10gb", 0, 2)),),)
    assert placed(Demand(10000), migs(1), usage([0], occupied=[[]])).containers == expected
    assert placed(Demand(0, percent=25), migs(1), usage([0], occupied=[[]])).containers == expected


def test_a_request_no_mig_profile_holds_is_unresolvable() -> None:
    """30000 MiB fits a 40960 MiB GPU, but no A100 profile of the table holds more than 20480: no eviction helps
    (nor for a share of 75 % of the GPU's memory)."""
    for demand in (Demand(30000), Demand(0, percent=75)):  # 75 % of 40960: 30720
        judged = place(demand, migs(), usage([0, 0], occupied=[[], []]), BINPACK, "MiB")
        assert isinstance(judged, Judgement)
        assert (judged.verdict, judged.cause) == (Verdict.UNRESOLVABLE, Cause.TOO_SMALL), demand


def init(memory: int) -> Request:
    return Request(1, memory, init=True)


def test_an_app_container_is_placed_beside_the_instance_of_its_pods_init_container() -> None:
    """Slices 4 and 5 free: the init container's 2g takes both; the instance lives as long as the pod, so the app
    container's 1g has no slice left beside it (HAMi's plugin would fail to make one that overlaps)."""
    base = usage([30720], occupied=[[(0, 4), (6, 1)]])
    judged = place(pod(init(10000), Request(1, 4000)), migs(1), base, Strategy.BINPACK, "MiB")
    assert isinstance(judged, Judgement) and (judged.verdict, judged.cause) == (Verdict.FAILED, Cause.SLICES)


def test_containers_asking_the_profile_of_an_init_containers_instance_share_it() -> None:
    """Slices 4 and 5 free: two init containers and an app container, each asking a 2g, all get the 2g at slice 4
    (HAMi's plugin makes it once and gives it to each, `EnsureAllocation`, plug/migmgr.go:332-343)."""
    base = usage([30720], occupied=[[(0, 4), (6, 1)]])
    result = placed(pod(init(10000), init(10000), Request(1, 10000)), migs(1), base)
    assert [grant.instance for (grant,) in result.containers] == [MigInstance("2g.10gb", 4, 2)] * 3
    assert result.init_containers == 2


def test_two_app_containers_after_an_init_container_share_its_instance_once() -> None:
    """Slices 4 and 5 free (10240 MiB): the init container's 2g at 4; the first app container takes it again; the
    second, running beside the first, cannot: nothing is left for it."""
    base = usage([30720], occupied=[[(0, 4), (6, 1)]])
    judged = place(pod(init(10000), Request(1, 10000), Request(1, 10000)), migs(1), base, Strategy.BINPACK, "MiB")
    assert isinstance(judged, Judgement) and judged.reason == (
        "container 3 of 3: needs 10000 MiB on one GPU; largest free is 0 MiB (GPU 0 of 1)"
    )


def test_app_containers_asking_a_new_instance_each_get_their_own() -> None:
    """Slices 5 and 6 free (a 3g at 0 and a 1g at 4 held): two app containers asking a 1g each run together, so
    they get 1g at 6 and 1g at 5 (HAMi's order for 1g profiles: highest start first), never both the one at 6."""
    base = usage([25600], occupied=[[(0, 4), (4, 1)]])
    result = placed(pod(Request(1, 4000), Request(1, 4000)), migs(1), base)
    assert [grant.instance for (grant,) in result.containers] == [
        MigInstance("1g.5gb", 6, 1),
        MigInstance("1g.5gb", 5, 1),
    ]


def test_a_refusal_counts_the_gpu_whose_instance_a_container_could_share() -> None:
    """GPU 0 has slices 4 and 5 free, GPU 1 none: the init container's 2g takes 4-5 on GPU 0; the app container
    asks two GPUs of a 2g: it could take the init container's on GPU 0, but GPU 1 has no memory left, so it is
    refused, counting GPU 0 as one that would do."""
    base = usage([30720, 40960], occupied=[[(0, 4), (6, 1)], [(0, 4), (4, 4)]])
    judged = place(pod(init(10000), Request(2, 10000)), migs(), base, BINPACK, "MiB")
    assert judged == Judgement(
        Verdict.FAILED, "container 2 of 2: needs 2 GPUs with 10000 MiB free each; 1 of 2 have that", Cause.MEMORY
    )


# ---- NUMA --------------------------------------------------------------


def test_a_topology_aware_container_bound_to_one_numa_node_takes_the_last_walked_that_has_enough() -> None:
    """Three NUMA nodes of two GPUs each; binpack walks the lowest first, so the last walked is NUMA node 2: HAMi's
    Fit judges only the last NUMA node it walked (nv/device.go:746-754, 850-869): GPUs 4 and 5."""
    devices = [Device(i, 40960, cores=100, slots=10, uuid=f"GPU-{i}", numa=i // 2) for i in range(6)]
    demand = Demand(2000, 2, selectors=Selectors(numa_bind=True, topology=True))
    assert indexes(placed(demand, devices, usage([0] * 6))) == [[4, 5]]
