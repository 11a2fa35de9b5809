"""A node as the fragmentation measure sees it (`measure.py`), where `make mutation` found it unguarded: each GPU's
room (memory free, compute left, the slot a pod would take) on HAMi's GPUs, on MIG GPUs (the instance a pod would
make, the slices and slots left, a GPU blocked or unhealthy) and on a node of both; an unhealthy GPU adding nothing
to a node's fragmentation; and the memo of measures, started over for a new build of the typical shapes and when
full."""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
import pytest

from extender.core.placement import measure
from extender.core.placement.batch import measures
from extender.core.placement.learned import Learned
from extender.core.placement.measure import FragmentMemo, gpu_room, room_of
from extender.core.placement.workload import Classes, Shape, Workload
from tests.builders import (
    bound_pod,
    make_cluster,
    make_hami_cluster,
    make_hami_node,
    make_mig_node,
    make_node,
    make_pod,
    running_hami_pod,
)
from tests.core.test_hami_rules_v2100 import mig_held, one_g

A100 = "NVIDIA A100-SXM4-40GB"
MIG_A100 = "NVIDIA-A100-SXM4-40GB"


def hami(split: int, *pods: dict[str, Any]) -> Any:
    return make_hami_cluster(make_hami_node("h", gpus=2, split=split), pods=pods).nodes["h"]


def test_a_hami_gpus_room_is_its_memory_free_and_compute_left_and_nothing_when_either_is_gone() -> None:
    """Three pods a GPU. GPU 0 runs one pod (10000 MiB, 30 %): 30960 MiB free, 70 % left. GPU 1 runs two whose
    compute sums to 100 %: nothing left, so nothing of its memory can be used either."""
    state = hami(3, running_hami_pod("a", "h", 0, 10000, 30), running_hami_pod("b", "h", 1, 5000, 20),
                 running_hami_pod("c", "h", 1, 5000, 80))  # fmt: skip
    assert room_of(state).gpus == ((30960, 40960, 70, A100, 30960), (0, 40960, 0, A100, 0))
    # a pod of 10000 MiB and 30 % more on GPU 0: 20960 and 40 % left, its slot the second of three
    assert gpu_room(state, 0, 10000, 30) == (20960, 40960, 40, A100, 20960)
    # one of 70 % takes the rest of the compute: nothing left to use
    assert gpu_room(state, 0, 10000, 70) == (0, 40960, 0, A100, 0)


def test_a_gpu_whose_last_slot_a_pod_takes_has_nothing_left_for_another() -> None:
    """Two pods a GPU; GPU 0 runs one: as it is, its 30960 MiB are free; once another pod is placed there (of any
    size, or asking compute alone), nothing is."""
    state = hami(2, running_hami_pod("a", "h", 0, 10000, 10))
    assert room_of(state).gpus[0] == (30960, 40960, 90, A100, 30960)
    assert gpu_room(state, 0, 1000) == (0, 40960, 90, A100, 0)
    assert gpu_room(state, 0, 0, 10) == (0, 40960, 80, A100, 0)


def mig_state(*held: int) -> Any:
    return make_hami_cluster(make_mig_node(), pods=mig_held(*(one_g(start) for start in held))).nodes["mig-1"]


def test_a_mig_gpus_room_is_in_its_free_slices_and_the_largest_instance_they_can_still_make() -> None:
    """A100-40GB in eighths (the 3g.20gb spans 4 of 8 slices in NVML's table), 7 instances at most. Empty, a pod of
    10000 MiB makes a 2g.10gb at slices 0-1: 6 slices (30720 MiB) free, a 3g.20gb still possible at 4. With 1g
    instances at 0-4, 3 slices (15360) are free but only a 1g fits; a 1g more (at 6) leaves 10240, a 1g at 5."""
    assert room_of(mig_state()).gpus == ((40960, 40960, -1, MIG_A100, 20480),)
    assert gpu_room(mig_state(), 0, 10000) == (30720, 40960, -1, MIG_A100, 20480)
    five = mig_state(0, 1, 2, 3, 4)
    assert room_of(five).gpus == ((15360, 40960, -1, MIG_A100, 5120),)
    assert gpu_room(five, 0, 4000) == (10240, 40960, -1, MIG_A100, 5120)


def test_a_mig_gpu_running_its_most_instances_or_blocked_or_unhealthy_has_no_room() -> None:
    """Six 1g instances and one more: seven, the GPU's most (its `count`), so nothing is left though a slice is."""
    assert gpu_room(mig_state(0, 1, 2, 3, 4, 5), 0, 4000) == (0, 40960, -1, MIG_A100, 0)
    sick = make_mig_node()
    register = orjson.loads(sick["metadata"]["annotations"]["hami.io/node-nvidia-register"])
    register[0]["health"] = False
    sick["metadata"]["annotations"]["hami.io/node-nvidia-register"] = orjson.dumps(register).decode()
    assert room_of(make_hami_cluster(sick).nodes["mig-1"]).gpus == ((0, 40960, -1, MIG_A100, 0),)
    stray = running_hami_pod("stray", "mig-1", 0, 1000, 0)  # runs on a MIG GPU without an instance: blocked
    blocked = make_hami_cluster(make_mig_node(), pods=(stray,)).nodes["mig-1"]
    assert 0 in blocked.blocked
    assert room_of(blocked).gpus == ((0, 40960, -1, MIG_A100, 0),)


def test_a_plain_gpu_beside_a_mig_gpu_is_measured_as_any_plain_gpu() -> None:
    node = make_mig_node(gpus=2)
    register = orjson.loads(node["metadata"]["annotations"]["hami.io/node-nvidia-register"])
    register[1] = {key: value for key, value in register[1].items() if key != "migProfiles"} | {"mode": "hami-core"}
    node["metadata"]["annotations"]["hami.io/node-nvidia-register"] = orjson.dumps(register).decode()
    state = make_hami_cluster(node).nodes["mig-1"]
    assert state.mig and not state.devices[1].mig
    assert room_of(state).gpus[1] == (40960, 40960, 100, MIG_A100, 40960)


def test_an_unhealthy_gpu_adds_nothing_to_a_nodes_fragmentation() -> None:
    """gpushare reports an unhealthy GPU with no memory: the node measures as one without it (the typical pods ask
    no cpu or memory, so the node's cpu and memory do not enter). Each has 4 of its healthy GPU's 16 free, which
    neither typical share (6, 12) can use."""
    cache = make_cluster(
        make_node("sick", devices=[{"index": 0, "memory": 16}, {"index": 1, "memory": 16, "healthy": False}]),
        make_node("one", devices=[{"index": 0, "memory": 16}]),
        pods=(bound_pod("a", "sick", (0,), 12), bound_pod("b", "one", (0,), 12)),
    )
    for number in range(4):
        cache.apply_pod(make_pod(f"seen-{number}", gpu_mem=6 if number % 2 else 12))
    learned = Learned(cache)
    sick, one = learned.measure(cache.nodes["sick"]), learned.measure(cache.nodes["one"])
    assert sick == one > 0


def shapes_then_others() -> tuple[Workload, Any, Any]:
    workload = Workload(half_life=800.0)
    for _ in range(10):
        workload.observe(Shape(0, 0, 1, 4), 0.0)
    first = workload.classes(0.0)
    for _ in range(10):
        workload.observe(Shape(0, 0, 1, 12), 0.0)
    return workload, first, workload.classes(0.0)


def test_the_memo_of_measures_starts_over_for_a_new_build_of_the_typical_shapes() -> None:
    """Under quarters of 16 only, two GPUs with 6 free each are fine; under quarters and three-quarters, they strand
    what a three-quarter needs."""
    _, first, second = shapes_then_others()
    assert second.version != first.version
    gpus = ((6, 16, -1, "", 6), (6, 16, -1, "", 6))
    memo = FragmentMemo()
    before = memo.measure(measure.UNLIMITED, measure.UNLIMITED, gpus, first)
    after = memo.measure(measure.UNLIMITED, measure.UNLIMITED, gpus, second)
    assert after == FragmentMemo().measure(measure.UNLIMITED, measure.UNLIMITED, gpus, second) != before


def test_the_memo_of_measures_starts_over_when_full_and_keeps_measuring_right(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(measure, "MEMO_LIMIT", 2)
    _, _, classes = shapes_then_others()
    memo = FragmentMemo()
    rooms = [((free, 16, -1, "", free),) for free in (2, 6, 10, 14)]
    for gpus in rooms * 2:
        assert memo.measure(0, 0, gpus, classes) == FragmentMemo().measure(0, 0, gpus, classes)


def mig_registering(devmem: int) -> Any:
    """A MIG node (A100 profiles: 8 memory slices) whose GPU registers `devmem` MiB, no instance made."""
    node = make_mig_node()
    register = orjson.loads(node["metadata"]["annotations"]["hami.io/node-nvidia-register"])
    register[0]["devmem"] = devmem
    node["metadata"]["annotations"]["hami.io/node-nvidia-register"] = orjson.dumps(register).decode()
    return make_hami_cluster(node).nodes["mig-1"]


def test_a_mig_gpus_room_after_an_instance_is_no_more_than_its_memory_left() -> None:
    """A GPU registering 30000 MiB, a 1g.5gb instance made (5120 MiB, one slice of 8): 7/8 of it would be 26250,
    but only 30000 - 5120 = 24880 are left; a 3g.20gb still has its placement."""
    assert gpu_room(mig_registering(30000), 0, 5120) == (24880, 30000, -1, MIG_A100, 20480)


def test_a_mig_gpus_free_slices_count_whole_mib() -> None:
    """81559 MiB registered (what an 80 GB card reports), a 1g.5gb made: 7 of 8 slices are 71364.125 MiB, counted
    71364, below the 76439 left."""
    assert gpu_room(mig_registering(81559), 0, 5120)[0] == 71364


def few_millicores() -> Classes:
    """Typical shapes of half a 1000 GPU: nine pods asking no cpu or memory, one asking 4 millicores and 4 bytes.
    Per GPU they bring (0.1 x 4) / (0.5) = 0.8 millicores and 0.8 bytes (`Classes.rates`), less than one."""
    workload = Workload()
    for _ in range(9):
        workload.observe(Shape(0, 0, 1, 500), 0.0)
    workload.observe(Shape(4, 4, 1, 500), 0.0)
    classes = workload.classes(0.0)
    assert classes.rates(1000) == pytest.approx((0.8, 0.8))
    return classes


def test_a_node_starves_its_gpus_at_rates_of_less_than_one_millicore_or_byte_a_gpu() -> None:
    """Two empty GPUs and 1 millicore (or 1 byte) free: the pod asking 4 cannot run there (0.1 x 2 GPUs of fragment);
    at 0.8 a GPU, 1 feeds 1.25 GPUs of the 2, so 0.75 starve: F = 0.2 + 0.5 x 0.75 = 0.575, the scalar way and in
    arrays alike; with cpu and memory aplenty, 0."""
    classes = few_millicores()
    gpus = ((1000, 1000, -1, "", 1000),) * 2
    memo = FragmentMemo()
    assert memo.measure(1, measure.UNLIMITED, gpus, classes) == pytest.approx(0.575)
    assert memo.measure(measure.UNLIMITED, 1, gpus, classes) == pytest.approx(0.575)
    assert memo.measure(measure.UNLIMITED, measure.UNLIMITED, gpus, classes) == 0.0
    free = np.array([[1000, 1000], [1000, 1000]])
    cpu, memory = np.array([1, measure.UNLIMITED]), np.array([measure.UNLIMITED, 1])
    assert measures(free, cpu, memory, 1000, "", classes).tolist() == pytest.approx([0.575, 0.575])
