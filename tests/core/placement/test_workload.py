"""The learned workload: which pod shapes the cluster runs and receives, and how they weigh as time passes."""

from __future__ import annotations

import math

import pytest

from extender.core.devices import Demand, Request, Selectors
from extender.core.placement.workload import MAX_SHAPES, Classes, Shape, Workload, moved, shape_of

HOUR = 3600.0
WHOLE = Shape(cpu=11_300, memory=32 << 30, devices=1, per_device=1000)
SHARE = Shape(cpu=3_152, memory=12 << 30, devices=1, per_device=470)
EIGHT = Shape(cpu=88_000, memory=320 << 30, devices=8, per_device=1000)


def weights(classes: Classes) -> dict[Shape, float]:
    return dict(zip(classes.shapes, classes.weights, strict=True))


def test_a_pod_without_gpus_is_no_shape() -> None:
    """It adds the same share of every node's free GPU to the fragment (the paper's rule), so it never changes
    which node is best; counted, it would push GPU shapes out of the covered share."""
    assert shape_of(Demand(memory=0), cpu=4000, memory=1 << 30) is None
    assert shape_of(None, cpu=4000, memory=1 << 30) is None


def test_a_gpushare_pod_is_its_memory_per_gpu_with_its_cpu_memory_and_models() -> None:
    shape = shape_of(Demand(memory=2000, devices=2), cpu=22_000, memory=80 << 30, models=("A100",))
    assert shape == Shape(cpu=22_000, memory=80 << 30, devices=2, per_device=1000, models=("A100",))


def test_a_hami_pod_of_several_containers_is_its_largest_container_with_its_gpu_selectors() -> None:
    demand = Demand(
        memory=6144,
        containers=(Request(devices=1, memory=2048, cores=10), Request(devices=2, memory=4096, cores=30)),
        selectors=Selectors(use_models=("A100",), avoid_models=("MIG",)),
    )
    shape = shape_of(demand, cpu=1000, memory=1 << 30)
    assert shape == Shape(1000, 1 << 30, 2, 4096, 0, 30, (), ("A100",), ("MIG",))


@pytest.mark.parametrize(
    ("shape", "model", "admitted"),
    [
        (Shape(0, 0, 1, 1, models=("T4", "V100M16")), "T4", True),
        (Shape(0, 0, 1, 1, models=("T4", "V100M16")), "T4-X", False),  # label values match exactly
        (Shape(0, 0, 1, 1, use_models=("A100",)), "NVIDIA A100-SXM4-40GB", True),  # HAMi: a substring
        (Shape(0, 0, 1, 1, use_models=("A100",)), "NVIDIA H100", False),
        (Shape(0, 0, 1, 1, avoid_models=("MIG",)), "NVIDIA A100 MIG 1g.5gb", False),
        (Shape(0, 0, 1, 1), "anything", True),
    ],
)
def test_a_shape_admits_the_models_it_may_run_on(shape: Shape, model: str, admitted: bool) -> None:
    assert shape.admits(model) is admitted


@pytest.mark.parametrize(
    ("shape", "capacity", "gpus"),
    [
        (Shape(0, 0, 1, 470), 1000, 0.47),  # a share: its part of one GPU
        (Shape(0, 0, 1, 16), 80, 0.2),  # 16 GiB of an 80 GiB GPU
        (Shape(0, 0, 1, 16), 16, 1.0),
        (Shape(0, 0, 1, 0, percent=50), 40_960, 0.5),
        (Shape(0, 0, 1, 1024, cores=60), 40_960, 0.6),  # compute is the larger part
        (Shape(0, 0, 4, 1000), 1000, 4.0),
    ],
)
def test_a_shape_takes_its_part_of_each_gpu(shape: Shape, capacity: int, gpus: float) -> None:
    assert shape.gpus_on(capacity) == pytest.approx(gpus)


def test_the_typical_shapes_weigh_as_often_as_they_were_seen() -> None:
    workload = Workload()
    for _ in range(3):
        workload.observe(WHOLE, 0.0)
    workload.observe(SHARE, 0.0)
    assert weights(workload.classes()) == pytest.approx({WHOLE: 0.75, SHARE: 0.25})


def test_an_observation_weighs_half_after_a_half_life() -> None:
    workload = Workload(half_life=HOUR)
    workload.observe(SHARE, 0.0)
    workload.observe(WHOLE, HOUR)  # worth two of the older one: 2 / (1 + 2)
    assert weights(workload.classes())[WHOLE] == pytest.approx(2 / 3)


def test_weights_are_rescaled_before_they_overflow_and_keep_their_proportions() -> None:
    workload = Workload(half_life=1.0)
    workload.observe(SHARE, 0.0)
    workload.observe(WHOLE, 10.0)
    workload.observe(WHOLE, 1000.0)  # 2^1000 would overflow a double: everything is scaled down first
    assert math.isfinite(workload.total)
    assert weights(workload.classes()) == pytest.approx({WHOLE: 1.0})  # the share weighs 2^-1000 of it: gone


def test_the_typical_shapes_cover_the_share_asked_and_leave_the_rare_tail_out() -> None:
    workload = Workload(coverage=0.9)
    for shape, count in ((WHOLE, 60), (SHARE, 35), (EIGHT, 5)):
        for _ in range(count):
            workload.observe(shape, 0.0)
    # 60 + 35 = 95 % covers 90 %: the 8-GPU shape is left out and the rest renormalised
    assert weights(workload.classes()) == pytest.approx({WHOLE: 60 / 95, SHARE: 35 / 95})


def test_at_most_max_classes_typical_shapes() -> None:
    workload = Workload(coverage=1.0, max_classes=2)
    for shape, count in ((WHOLE, 3), (SHARE, 2), (EIGHT, 1)):
        for _ in range(count):
            workload.observe(shape, 0.0)
    assert set(workload.classes().shapes) == {WHOLE, SHARE}


def test_shapes_asking_the_same_of_the_gpus_are_judged_as_one_group() -> None:
    workload = Workload()
    small_cpu = Shape(1000, 1 << 30, 1, 470)
    workload.observe_all([small_cpu, SHARE, WHOLE, WHOLE], 0.0)
    groups = {group.shape.per_device: group for group in workload.classes().groups}
    assert set(groups) == {470, 1000}
    assert sorted(groups[470].members) == [(1000, 1 << 30, 0.25), (3152, 12 << 30, 0.25)]
    assert groups[1000].weight == pytest.approx(0.5)


def test_a_rebuild_is_kept_only_when_it_moves_the_weights() -> None:
    """Every memo of the policy is keyed by the build: a rebuild that changes nothing would only cost."""
    workload = Workload(rebuild_share=0.0)
    workload.observe_all([WHOLE, SHARE], 0.0)
    first = workload.classes()
    workload.observe_all([WHOLE, SHARE], 0.0)  # the same proportions: nothing moved
    assert workload.classes() is first
    for _ in range(8):
        workload.observe(EIGHT, 0.0)  # a new shape with most of the weight
    assert workload.classes().version == first.version + 1


def test_the_weight_that_moved_between_two_builds_is_their_total_variation_distance() -> None:
    before = Classes(1, (WHOLE, SHARE), (0.5, 0.5))
    after = Classes(2, (WHOLE, EIGHT), (0.75, 0.25))
    # |0.5 - 0.75| + |0.5 - 0| + |0 - 0.25|, halved
    assert moved(before, after) == pytest.approx(0.5)


def test_rebuilding_waits_for_enough_new_weight() -> None:
    workload = Workload(rebuild_share=0.5)
    workload.observe_all([WHOLE, WHOLE], 0.0)
    first = workload.classes()
    workload.observe(SHARE, 0.0)  # 1 new against 2 seen: not yet half as much again... 0.5 x 2 = 1: not more
    assert workload.classes() is first
    workload.observe(SHARE, 0.0)
    assert SHARE in workload.classes().shapes


def test_the_shapes_remembered_are_bounded() -> None:
    workload = Workload()
    for number in range(MAX_SHAPES + 10):
        workload.observe(Shape(number, 0, 1, 1), float(number))
    assert len(workload.weights) == MAX_SHAPES
    assert workload.total == pytest.approx(sum(workload.weights.values()))


def test_rates_are_the_cpu_and_memory_the_typical_shapes_bring_per_gpu_they_take() -> None:
    workload = Workload()
    workload.observe_all([WHOLE, SHARE], 0.0)
    cpu, memory = workload.classes().rates(1000)
    # (11,300 + 3,152) / 2 millicores over (1 + 0.47) / 2 GPUs
    assert cpu == pytest.approx((11_300 + 3_152) / 1.47)
    assert memory == pytest.approx((32 + 12) * (1 << 30) / 1.47)


def test_no_shapes_no_rates() -> None:
    assert Classes(0).rates(1000) == (0.0, 0.0)
