"""The general fit: containers placed on GPUs in memory, compute and slots, each refusal in plain words for the
dimension that failed. The rules are HAMi's Fit (pkg/device/nvidia/device.go:715-876 at v2.10.0; NOTES.md §3)."""

from __future__ import annotations

import pytest

from extender.core.devices import Demand, Device, Request, Selectors, Strategy
from extender.core.holds import Grant
from extender.core.placement.fit import Cause, Judgement, Placement, Usage, Verdict, place


def gpus(count: int = 2, memory: int = 40960, cores: int = 100, slots: int = 10, **extra: object) -> list[Device]:
    return [
        Device(index, memory, cores=cores, slots=slots, uuid=f"GPU-{index}", model="NVIDIA A100", **extra)  # type: ignore[arg-type]
        for index in range(count)
    ]


def usage(memory: list[int], cores: list[int] | None = None, slots: list[int] | None = None) -> Usage:
    count = len(memory)
    return Usage(list(memory), list(cores or [0] * count), list(slots or [0] * count))


def one(memory: int = 0, cores: int = 0, devices: int = 1, percent: int = 0, **fields: object) -> Demand:
    return Demand(memory * devices, devices, cores, percent, **fields)  # type: ignore[arg-type]


def test_memory_and_compute_are_placed_on_the_fullest_gpu_that_serves_under_binpack() -> None:
    placed = place(one(4000, 30), gpus(), usage([10000, 0], [20, 0], [1, 0]), Strategy.BINPACK, "MiB")
    assert placed == Placement(((Grant(0, 4000, 30, "GPU-0"),),), 0)
    spread = place(one(4000, 30), gpus(), usage([10000, 0], [20, 0], [1, 0]), Strategy.SPREAD, "MiB")
    assert spread == Placement(((Grant(1, 4000, 30, "GPU-1"),),), 0)


def test_a_percentage_of_memory_is_taken_of_each_chosen_gpu() -> None:
    """nv/device.go:777-783: memreq = Totalmem * pct / 100 (int32 division)."""
    placed = place(one(percent=25, devices=2), gpus(memory=40961), usage([0, 0]), Strategy.BINPACK, "MiB")
    assert isinstance(placed, Placement)
    assert [grant.memory for grant in placed.containers[0]] == [10240, 10240]


@pytest.mark.parametrize(
    ("demand", "base", "verdict", "cause", "reason"),
    [
        (one(30000), usage([20000, 15000]), Verdict.FAILED, Cause.MEMORY,
         "needs 30000 MiB on one GPU; largest free is 25960 MiB (GPU 1 of 2)"),
        (one(1000, 30), usage([0, 0], [80, 90], [1, 1]), Verdict.FAILED, Cause.COMPUTE,
         "needs 30 % of a GPU's compute; the most free is 20 % (GPU 0 of 2)"),
        (one(1000), usage([0, 0], [0, 0], [10, 10]), Verdict.FAILED, Cause.SLOTS,
         "needs 1000 MiB on one GPU; every GPU here that could hold it runs its most pods (10 each)"),
        (one(1000, 100), usage([10, 10], [0, 0], [1, 1]), Verdict.FAILED, Cause.EXCLUSIVE,
         "needs a GPU to itself (1000 MiB and 100 % compute); every GPU here that could hold it runs a pod"),
        (one(1000), usage([0, 0], [100, 100], [1, 1]), Verdict.FAILED, Cause.COMPUTE,
         "needs a GPU with compute left; the most free is 0 % (GPU 0 of 2)"),
        (one(50000), usage([0, 0]), Verdict.UNRESOLVABLE, Cause.TOO_SMALL,
         "needs 50000 MiB on one GPU; the largest GPU here has 40960 MiB and 100 % compute"),
        (one(1000, devices=3), usage([0, 0]), Verdict.UNRESOLVABLE, Cause.TOO_FEW,
         "needs 3 GPUs with 1000 MiB each; 2 of 2 GPUs here are that large"),
        (one(1000, devices=2), usage([40000, 0]), Verdict.FAILED, Cause.MEMORY,
         "needs 2 GPUs with 1000 MiB free each; 1 of 2 have that"),
        (one(1000, selectors=Selectors(use_models=("H100",))), usage([0, 0]), Verdict.UNRESOLVABLE, Cause.NO_MATCH,
         "no GPU here is matching the pod's GPU selectors"),
    ],
)  # fmt: skip
def test_each_refusal_names_the_dimension_that_failed(
    demand: Demand, base: Usage, verdict: Verdict, cause: Cause, reason: str
) -> None:
    assert place(demand, gpus(), base, Strategy.BINPACK, "MiB") == Judgement(verdict, reason, cause)


def test_cordoned_and_unhealthy_gpus_serve_no_new_pod() -> None:
    devices = [*gpus(1), Device(1, 40960, healthy=False, cores=100, slots=10, uuid="GPU-1")]
    devices[0] = Device(0, 40960, cores=100, slots=10, uuid="GPU-0", cordoned=True)
    judged = place(one(1000), devices, usage([0, 0]), Strategy.BINPACK, "MiB")
    assert judged == Judgement(Verdict.UNRESOLVABLE, "no GPU here is usable", Cause.NO_MATCH)


def test_exclusive_pods_need_idle_gpus_and_mutex_pods_too() -> None:
    """Rows 6 and 10 of NOTES.md §3: `mutex` needs Used == 0; 100 % compute on a 100-core GPU needs Used == 0."""
    base = usage([1000, 0], [10, 0], [1, 0])
    mutex = one(1000, selectors=Selectors(exclusive=True))
    assert place(mutex, gpus(), base, Strategy.BINPACK, "MiB") == Placement(((Grant(1, 1000, 0, "GPU-1"),),), 0)


def test_init_containers_see_only_the_node_app_containers_add_up() -> None:
    """sch/score.go:226-286: each init container on a fresh copy, app containers on one accumulating copy, so an
    init container and an app container may share even a one-slot GPU."""
    demand = Demand(3000, 2, containers=(Request(1, 1000, 0, 10, init=True), Request(1, 2000, 0, 20)))
    placed = place(demand, gpus(1, slots=1), usage([0]), Strategy.BINPACK, "MiB")
    assert placed == Placement(((Grant(0, 1000, 10, "GPU-0"),), (Grant(0, 2000, 20, "GPU-0"),)), 1)
    two_apps = Demand(3000, 2, containers=(Request(1, 1000), Request(1, 2000)))
    refused = place(two_apps, gpus(1, slots=1), usage([0]), Strategy.BINPACK, "MiB")
    assert isinstance(refused, Judgement) and refused.cause is Cause.SLOTS
    assert refused.reason.startswith("container 2 of 2: ")


def test_numa_bind_keeps_a_containers_gpus_on_one_numa_node() -> None:
    devices = [Device(i, 40960, cores=100, slots=10, uuid=f"GPU-{i}", numa=i // 2) for i in range(4)]
    demand = one(1000, devices=2, selectors=Selectors(numa_bind=True))
    placed = place(demand, devices, usage([0, 40000, 0, 0]), Strategy.BINPACK, "MiB")
    assert isinstance(placed, Placement) and {grant.index for grant in placed.containers[0]} == {2, 3}
    full = place(demand, devices, usage([0, 40000, 40000, 0]), Strategy.BINPACK, "MiB")
    assert isinstance(full, Judgement) and full.cause is Cause.NUMA


def test_ties_break_by_the_lower_index_so_one_state_gives_one_answer() -> None:
    """HAMi breaks ties by the registration's order, which its plugin shuffles every 30 s (NOTES.md §1)."""
    for strategy in Strategy:
        placed = place(one(1000), gpus(4), usage([0, 0, 0, 0]), strategy, "MiB")
        assert isinstance(placed, Placement) and placed.containers[0][0].index == 0


def test_the_largest_free_named_is_that_of_a_gpu_short_of_memory_not_one_full_on_compute() -> None:
    """GPU 0 has the most memory free but no compute left: the reason names GPU 1, whose memory is what is short."""
    base = usage([0, 35000, 39000], [100, 0, 0], [1, 1, 1])
    judged = place(one(8192), gpus(3), base, Strategy.BINPACK, "MiB")
    assert judged == Judgement(
        Verdict.FAILED, "needs 8192 MiB on one GPU; largest free is 5960 MiB (GPU 1 of 3)", Cause.MEMORY
    )
