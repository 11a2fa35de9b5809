"""The learned workload (`workload.py`) where `make mutation` found it unguarded: the memory a share of a GPU
needs (HAMi's integer arithmetic), the GPUs a shape takes of a GPU too small for it or by its compute, the share of
the weight the typical shapes stop at, the rebuild after an eighth of the half-life, a half-life of 0 (no decay),
and the rescale of weights grown too large when the first pod was not seen at time 0."""

from __future__ import annotations

import math

import pytest

from extender.core.devices import Device, Request
from extender.core.placement.workload import Shape, Workload

GIB = 1 << 30


def shape(per_device: int, cpu: int = 4000, devices: int = 1, percent: int = 0, cores: int = 0) -> Shape:
    return Shape(cpu, 8 * GIB, devices, per_device, percent, cores)


def test_a_share_of_a_gpus_memory_needs_the_whole_mib_the_pod_is_given() -> None:
    """33 % of 40960 MiB is 13516.8: HAMi computes it in integers (13516), as the fit gives it
    (`Request.memory_on`); a GPU with 13516 MiB free serves the shape."""
    assert shape(0, percent=33).need(40960) == 13516 == Request(1, 0, percent=33).memory_on(Device(0, 40960))


@pytest.mark.parametrize(
    ("asked", "gpus"),
    [
        (shape(20), 1.0),  # 20 on a GPU of 16: all of one GPU, not more
        (shape(8, devices=2), 1.0),  # half of each of two
        (shape(4, cores=75), 0.75),  # a quarter of the memory, three quarters of the compute: the larger
        (shape(0, percent=50), 0.5),
    ],
)
def test_the_gpus_a_shape_takes_on_a_kind_count_its_larger_part_of_each_and_never_more_than_one(
    asked: Shape, gpus: float
) -> None:
    """What the typical shapes' cpu and memory per GPU are averaged over (`Classes.rates`)."""
    assert asked.gpus_on(16) == pytest.approx(gpus)


def test_the_typical_shapes_stop_once_they_cover_the_share_asked() -> None:
    """Coverage 0.75: three pods of A and one of B, all seen at once (weights 1 each, 4 in all): A alone covers 3
    of 4, exactly the share, so B is left out; a second B (A 3 of 5) brings it in."""
    a, b = shape(4), shape(8)
    workload = Workload(coverage=0.75)
    for _ in range(3):
        workload.observe(a, 0.0)
    workload.observe(b, 0.0)
    assert workload.classes(0.0).shapes == (a,)
    fresh = Workload(coverage=0.75)
    for one in (a, a, a, b, b):
        fresh.observe(one, 0.0)
    assert fresh.classes(0.0).shapes == (a, b)


def test_the_typical_shapes_are_rebuilt_after_an_eighth_of_the_half_life_even_when_few_pods_came() -> None:
    """Half-life 800 s: built at t=1000 from ten pods of A; one pod of B at t=1050 is fewer than a fifth more
    pods, so no rebuild for it; 100 s (an eighth) after the build, not yet (more than an eighth is asked), 101 s
    after, a rebuild, which keeps B (a tenth of the weight moved, more than 5 %)."""
    a, b = shape(4), shape(8)
    workload = Workload(half_life=800.0)
    for _ in range(10):
        workload.observe(a, 1000.0)
    built = workload.classes(1000.0)
    workload.observe(b, 1050.0)
    assert workload.classes(1050.0) is built
    assert workload.classes(1100.0) is built
    rebuilt = workload.classes(1101.0)
    assert rebuilt.version == built.version + 1 and rebuilt.shapes == (a, b)


def test_a_half_life_of_zero_weighs_every_pod_alike_forever() -> None:
    a, b = shape(4), shape(8)
    workload = Workload(half_life=0.0)
    workload.observe(a, 0.0)
    workload.observe(b, 10.0**9)
    assert workload.weights == {a: 1.0, b: 1.0}
    assert workload.classes(10.0**9).weights == (0.5, 0.5)


def test_weights_grown_too_large_are_scaled_to_the_present_from_whenever_the_first_pod_came() -> None:
    """As `test_mutants_placement`'s rescale, the first pod seen at t=5000 rather than 0: the scale is by the time
    since that first pod (e^-3 for the pod three e-foldings older than the one that triggered the rescale)."""
    workload = Workload(half_life=60.0)
    step = 60.0 / math.log(2)
    start = 5000.0
    faded, kept, new = shape(1), shape(2), shape(3)
    workload.observe(faded, start)
    workload.observe(kept, start + 499 * step)
    workload.observe(new, start + 502 * step)
    assert set(workload.weights) == {kept, new}
    assert workload.weights[kept] == pytest.approx(math.exp(-3)) and workload.weights[new] == 1.0
