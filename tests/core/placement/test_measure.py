"""The measure the default policy minimises: the GPU a node leaves unusable for the typical shapes (the paper's
F), plus the free GPU its cpu and memory cannot feed. The arithmetic is written out in each case."""

from __future__ import annotations

import random

import pytest

from extender.core.placement.measure import STARVED_WEIGHT, UNLIMITED, FragmentMemo, Room, fragment, starved
from extender.core.placement.workload import Classes, Shape, Workload

GPU = 1000
"""Memory units of one GPU in these cases, so a share is in milli-GPU as in the paper."""
HALF = Shape(cpu=4000, memory=0, devices=1, per_device=500)
WHOLE = Shape(cpu=8000, memory=0, devices=1, per_device=1000)
TWO = Shape(cpu=16000, memory=0, devices=2, per_device=1000)


def classes_of(*weighted: tuple[Shape, int]) -> Classes:
    workload = Workload(coverage=1.0)
    for shape, count in weighted:
        for _ in range(count):
            workload.observe(shape, 0.0)
    return workload.classes()


def gpus(*free: int, model: str = "") -> tuple[tuple[int, int, int, str], ...]:
    return tuple((amount, GPU, -1, model, amount) for amount in free)


HALF_AND_WHOLE = classes_of((HALF, 1), (WHOLE, 1))


@pytest.mark.parametrize(
    ("free", "cpu", "expected"),
    [
        # nothing free: a full node is no waste
        ((0, 0), UNLIMITED, 0.0),
        # two empty GPUs: both shapes use every GPU
        ((GPU, GPU), UNLIMITED, 0.0),
        # 300 free on each: too little for either shape, so all 0.6 GPU free is fragment for both (weights 1/2)
        ((300, 300), UNLIMITED, 0.6),
        # 600 and 1000 free: HALF uses both; WHOLE only the empty one, the 0.6 GPU on the other is fragment
        # for it: 0.5 x 0 + 0.5 x 0.6
        ((600, GPU), UNLIMITED, 0.3),
        # the same GPUs with 6 cores free: WHOLE (8 cores) cannot run at all, all 1.6 GPU free is its fragment
        ((600, GPU), 6000, 0.5 * 1.6),
        # 3 cores: neither shape runs, 1.6 for both
        ((600, GPU), 3000, 1.6),
    ],
    ids=["full", "empty", "slivers", "half-used", "cpu-for-half-only", "no-cpu"],
)
def test_the_fragment_is_the_free_gpu_each_typical_shape_cannot_use(
    free: tuple[int, ...], cpu: int, expected: float
) -> None:
    assert fragment(cpu, UNLIMITED, gpus(*free), HALF_AND_WHOLE) == pytest.approx(expected)


def test_a_shape_needing_more_gpus_than_have_room_counts_all_the_free_gpu() -> None:
    two = classes_of((TWO, 1))
    assert fragment(UNLIMITED, UNLIMITED, gpus(GPU, 500), two) == pytest.approx(1.5)  # one GPU fits, two needed
    assert fragment(UNLIMITED, UNLIMITED, gpus(GPU, GPU, 500), two) == pytest.approx(0.5)  # only the 500 is left


def test_gpus_of_a_model_a_shape_does_not_allow_are_fragment_for_it() -> None:
    t4_only = classes_of((Shape(1000, 0, 1, 500, models=("T4",)), 1))
    mixed = (*gpus(GPU, model="T4"), *gpus(GPU, model="A100"))
    assert fragment(UNLIMITED, UNLIMITED, mixed, t4_only) == pytest.approx(1.0)  # the A100 is of no use to it


def test_memory_short_of_a_shape_makes_all_the_free_gpu_its_fragment() -> None:
    hungry = classes_of((Shape(1000, 64 << 30, 1, 500), 1))
    assert fragment(UNLIMITED, 32 << 30, gpus(GPU), hungry) == pytest.approx(1.0)
    assert fragment(UNLIMITED, 64 << 30, gpus(GPU), hungry) == 0.0


def test_a_gpu_out_of_compute_is_fragment_for_a_shape_that_asks_compute() -> None:
    computing = classes_of((Shape(1000, 0, 1, 100, cores=50), 1))
    rooms = ((900, GPU, 40, "", 900), (900, GPU, 60, "", 900))  # only the second has 50 % compute left
    assert fragment(UNLIMITED, UNLIMITED, rooms, computing) == pytest.approx(0.9)


@pytest.mark.parametrize(
    ("cpu", "total", "rates", "expected"),
    [
        (20_000, 2.0, (10_000.0, 0.0), 0.0),  # 20 cores feed 2 GPUs at 10 cores each
        (15_000, 2.0, (10_000.0, 0.0), 0.5),  # 15 cores feed 1.5 of them
        (0, 2.0, (10_000.0, 0.0), 2.0),
        (15_000, 2.0, (0.0, 0.0), 0.0),  # no rates known: nothing starves
    ],
)
def test_starved_gpu_is_the_free_gpu_beyond_what_the_free_cpu_can_feed(
    cpu: int, total: float, rates: tuple[float, float], expected: float
) -> None:
    assert starved(cpu, UNLIMITED, total, rates) == pytest.approx(expected)


def test_the_measure_adds_the_weighted_starved_gpu_to_the_fragment() -> None:
    classes = classes_of((WHOLE, 1))  # 8 cores per GPU
    memo = FragmentMemo()
    # 2 empty GPUs, 12 cores: WHOLE runs and uses both (F = 0), but 12 cores feed only 1.5 GPUs
    assert memo.measure(12_000, UNLIMITED, gpus(GPU, GPU), classes) == pytest.approx(STARVED_WEIGHT * 0.5)


def test_the_memo_finds_a_node_in_the_same_state_whatever_the_order_of_its_gpus() -> None:
    memo = FragmentMemo()
    first = memo.measure(UNLIMITED, UNLIMITED, gpus(600, GPU, 0), HALF_AND_WHOLE)
    again = memo.measure(UNLIMITED, UNLIMITED, gpus(0, 600, GPU), HALF_AND_WHOLE)
    assert first == again and memo.computed == 1


def test_the_memo_finds_nodes_whose_free_cpu_covers_the_same_shapes() -> None:
    """F depends on the free cpu only through which shapes' cpu asks it covers (4 and 8 cores here)."""
    memo = FragmentMemo()
    memo.measure(9000, UNLIMITED, gpus(600), HALF_AND_WHOLE)
    memo.measure(50_000, UNLIMITED, gpus(600), HALF_AND_WHOLE)  # covers both, as 9 cores do
    assert memo.computed == 1
    memo.measure(5000, UNLIMITED, gpus(600), HALF_AND_WHOLE)  # covers HALF only
    assert memo.computed == 2


def test_a_new_build_of_the_shapes_starts_the_memo_over() -> None:
    memo = FragmentMemo()
    memo.measure(UNLIMITED, UNLIMITED, gpus(600), HALF_AND_WHOLE)
    rebuilt = classes_of((WHOLE, 1))
    assert memo.measure(UNLIMITED, UNLIMITED, gpus(600), rebuilt) == pytest.approx(0.6)  # not HALF's 0.3
    assert memo.computed == 2


def test_a_room_is_measured_as_its_parts() -> None:
    memo = FragmentMemo()
    room = Room(UNLIMITED, UNLIMITED, gpus(600, GPU))
    assert memo.of(room, HALF_AND_WHOLE) == pytest.approx(0.3)


def test_nodes_of_one_gpu_size_and_model_are_judged_by_bisection_with_the_same_result() -> None:
    from extender.core.placement.measure import _general, _uniform, free_gpus

    rng = random.Random(5)
    shapes = [
        (Shape(rng.choice([0, 2000, 8000]), 0, rng.choice([1, 1, 2, 4]), rng.choice([0, 100, 250, 500, 1000])), 1)
        for _ in range(12)
    ] + [(Shape(1000, 0, 1, 300, models=("T4",)), 2)]
    classes = classes_of(*shapes)
    for _ in range(200):
        model = rng.choice(["T4", "A100"])
        gpus_of_one_model = tuple(
            (amount, GPU, -1, model, amount) for amount in rng.choices([0, 50, 300, 500, 700, 1000], k=8)
        )
        cpu = rng.choice([0, 1000, 4000, 16000])
        total = free_gpus(gpus_of_one_model)
        if total:
            assert _uniform(cpu, 0, gpus_of_one_model, classes, total) == pytest.approx(
                _general(cpu, 0, gpus_of_one_model, classes, total)
            )
