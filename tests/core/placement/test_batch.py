"""The measure in arrays (`batch.py`, over the rows `arrays.py` keeps) gives the scalar path's numbers to the bit:
the node's measure, what a pod adds, and the GPUs it is given, on random clusters and random workloads."""

from __future__ import annotations

import math
import random
from typing import Any

import numpy as np
import pytest

from extender.core.cache import Cache
from extender.core.devices import Demand
from extender.core.placement import fragmentation
from extender.core.placement.arrays import NodeArrays
from extender.core.placement.batch import after, kind_of, measures, rounded
from extender.core.placement.config import Ask, PolicyConfig
from extender.core.placement.fragmentation import (
    BATCH_NODES,
    DIGITS,
    FULLER,
    added_fragmentation,
    fragmentation_values,
    judged,
    warming,
)
from extender.core.placement.learned import Learned
from extender.core.placement.measure import FragmentMemo, gpu_room, uniform_measure
from extender.core.placement.placer import Placer
from tests.builders import (
    HAMI,
    PROFILE,
    bound_pod,
    learned_of,
    make_hami_node,
    make_node,
    make_pod,
    running_hami_pod,
)

NODES = 120


def random_cluster(
    rng: random.Random, count: int = NODES, gpus: tuple[int, ...] = (1, 2, 4, 8), sizes: tuple[int, ...] = (16, 40)
) -> tuple[Cache, Learned]:
    """Nodes of some GPUs of some size and three models, filled at random by pods asking cpu and memory too; a
    workload of shares and multi-GPU pods, some asking one model."""
    nodes: list[dict[str, Any]] = [
        make_node(
            f"n{number}",
            gpus=rng.choice(gpus),
            mem=rng.choice(sizes),
            cpu=str(rng.choice((8, 16, 96))),
            memory=rng.choice(("32Gi", "256Gi")),
            model=rng.choice(("", "T4", "A100")),
        )
        for number in range(count)
    ]
    cache = Cache(PROFILE)
    cache.replace(nodes, [])
    learned = learned_of(cache)
    for number in range(3 * count):
        state = cache.nodes[f"n{rng.randrange(count)}"]
        index, amount = rng.randrange(len(state.devices)), rng.randint(1, 12)
        if state.free[index] >= amount:
            pod = bound_pod(f"p{number}", state.name, (index,), amount, cpu=str(rng.randint(1, 8)), memory="4Gi")
            cache.apply_pod(pod)
    for number in range(200):
        gpus = rng.choice((1, 1, 1, 2, 4))
        pod = make_pod(
            f"seen-{number}",
            gpu_mem=rng.randint(1, 16) * gpus,
            gpus=gpus if gpus > 1 else None,
            cpu=str(rng.randint(1, 12)),
            memory=f"{rng.randint(1, 64)}Gi",
            models=rng.choice(((), (), ("T4",))),
        )
        cache.apply_pod(pod)
    return cache, learned


def random_ask(rng: random.Random) -> Ask:
    gpus = rng.choice((1, 1, 2, 4))
    demand = Demand(rng.randint(1, 16) * gpus, gpus) if rng.random() > 0.15 else Demand(0)
    return Ask(demand, rng.randint(0, 8000), rng.randint(0, 64 << 30))


@pytest.mark.parametrize("seed", range(4))
def test_a_nodes_measure_in_arrays_is_the_scalar_one_to_the_bit(seed: int) -> None:
    _, learned = random_cluster(random.Random(seed))
    classes = learned.classes()
    for rows in learned.arrays.kinds.values():
        _, capacity, model = rows.kind
        size = rows.size
        batch = measures(rows.free[:size], rows.cpu[:size], rows.memory[:size], capacity, model, classes).tolist()
        scalar = [learned.fragments.of(learned.room(state), classes) for state in rows.states]
        assert batch == scalar


@pytest.mark.parametrize("seed", range(4))
def test_what_a_pod_adds_and_the_gpus_it_gets_in_arrays_are_the_scalar_ones(seed: int) -> None:
    rng = random.Random(seed)
    _, learned = random_cluster(rng)
    classes = learned.classes()
    for _ in range(25):
        ask = random_ask(rng)
        for rows in learned.arrays.kinds.values():
            for state, added, chosen, scalar in arrays_beside_scalar(rows, ask, learned, classes):
                if scalar is None:
                    assert added == math.inf, state.name
                    continue
                assert added == scalar[0], state.name
                if not ask.demand.is_zero:
                    assert chosen == scalar[1], state.name


def arrays_beside_scalar(rows: Any, ask: Ask, learned: Learned, classes: Any) -> list[tuple[Any, float, Any, Any]]:
    """Per node of one kind's rows: its state, what the arrays say the pod adds there and the GPUs they choose, and
    the scalar answer (`added_fragmentation`: None where it refuses the node)."""
    size = rows.size
    then, chosen = after(
        rows.free[:size],
        rows.slotted[:size],
        rows.cpu[:size] - ask.cpu,
        rows.memory[:size] - ask.memory,
        ask.demand,
        rows.kind,
        classes,
    )
    _, capacity, model = rows.kind
    was = measures(rows.free[:size], rows.cpu[:size], rows.memory[:size], capacity, model, classes)
    added = rounded(then - was, DIGITS).tolist()
    return [
        (state, added[position], tuple(chosen[position].tolist()), added_fragmentation(ask, state, learned, classes))
        for position, state in enumerate(rows.states)
    ]


@pytest.mark.parametrize("seed", range(3))
def test_a_filters_table_is_the_same_whichever_way_its_nodes_are_judged(seed: int) -> None:
    """Every node of a kind numerous enough goes the array way in `judged`; one by one, the same values."""
    rng = random.Random(seed)
    cache, learned = random_cluster(rng, 200, (4, 8), (40,))
    classes = learned.classes()
    names = [*cache.nodes, "ghost"]
    assert any(rows.size >= BATCH_NODES for rows in learned.arrays.kinds.values()), "the array way is taken"
    for _ in range(10):
        ask = random_ask(rng)
        table = dict(zip(names, judged(ask, names, learned, cache.nodes, classes).tolist(), strict=True))
        for name in names:
            state = cache.nodes.get(name)
            scalar = added_fragmentation(ask, state, learned, classes) if state is not None else None
            expected = math.inf if scalar is None or state is None else scalar[0] + FULLER * state.free_gpus
            assert table[name] == expected, name


def test_python_rounding_is_kept_where_numpy_would_round_a_tie_the_other_way() -> None:
    """5e-10's double lies just above the tie at 9 digits, so Python rounds it up (1e-9) where numpy's scale and
    round gives 0.0; 2.675's lies just below the tie at 2 digits, so Python gives 2.67 where numpy gives 2.68.
    The others, and -3.4999999995 and 0.1234567895 of the same kind, must come out as Python's too."""
    values = np.array([5e-10, 1.0000000015, -3.4999999995, 0.1234567895, math.inf, -math.inf], dtype=np.float64)
    assert rounded(values, 9).tolist() == [round(value, 9) for value in values.tolist()]
    assert rounded(values, 9).tolist()[0] == 1e-9
    assert rounded(np.array([2.675]), 2).tolist() == [2.67]


def test_the_rows_follow_every_change_of_a_node() -> None:
    """A node's row is rewritten when it changes, dropped when it goes or stops being Ready, and another row
    takes its place."""
    cache = Cache(PROFILE)
    cache.replace([make_node("a", gpus=2, mem=16), make_node("b", gpus=2, mem=16)], [])
    arrays = learned_of(cache).arrays
    rows = arrays.located["a"]
    assert rows is arrays.located["b"] and rows.size == 2
    cache.apply_pod(bound_pod("p", "a", (1,), 6))
    assert rows.free[rows.row_of["a"]].tolist() == [16, 10]
    cache.apply_node(make_node("a", gpus=2, mem=16, ready=False))
    assert "a" not in arrays.located and rows.size == 1 and rows.states[0].name == "b"
    cache.apply_node(make_node("b", gpus=4, mem=16))
    assert arrays.located["b"] is not rows and rows.size == 0
    assert kind_of(cache.nodes["b"]) == (4, 16, "")


def test_many_rows_grow_their_arrays() -> None:
    arrays = NodeArrays()
    cache = Cache(PROFILE)
    cache.replace([make_node(f"n{number}", gpus=1, mem=16) for number in range(300)], [])
    for state in cache.nodes.values():
        arrays.update(state)
    rows = arrays.located["n299"]
    assert rows.size == 300 and rows.free[: rows.size].tolist() == [[16]] * 300


def test_many_nodes_to_judge_afresh_are_judged_a_slice_at_a_time_with_the_same_numbers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`warming`: more nodes than a slice judges, the work comes in slices (the filter gives the event loop a turn
    after each); the table they fill is the table judged in one go. Few enough: nothing to slice."""
    rng = random.Random(9)
    cache, learned = random_cluster(rng, 200, (4, 8), (40,))
    classes = learned.classes()
    names = list(cache.nodes)
    ask = Ask(Demand(8), 2000, 4 << 30)
    assert warming(ask, names, learned, cache.nodes) is None, "200 nodes in arrays: one slice"
    monkeypatch.setattr(fragmentation, "ARRAY_SLICE", 30)
    steps = warming(ask, names, learned, cache.nodes)
    assert steps is not None
    assert sum(1 for _ in steps) == math.ceil(200 / 30)
    sliced = fragmentation_values(ask, names, learned, cache.nodes).tolist()
    whole = judged(ask, names, learned, {name: cache.nodes[name] for name in names}, classes).tolist()
    assert sliced == whole
    assert warming(ask, names, learned, cache.nodes) is None, "nothing left to judge"


@pytest.mark.parametrize("seed", range(4))
def test_the_lean_way_for_nodes_of_one_kind_gives_the_general_ways_numbers_and_gpus(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`added_fragmentation` takes plain lists of free memory for a node whose GPUs are all of one kind
    (`_uniform_added`); told no node is (`kind_of` answering None), it takes the general way over `GpuRoom`s. The
    node's measure before (remembered by whichever way came first) is compared on its own."""
    rng = random.Random(seed)
    _, learned = random_cluster(rng)
    classes = learned.classes()
    states = [state for rows in learned.arrays.kinds.values() for state in rows.states]
    asks = [random_ask(rng) for _ in range(25)]
    for state in states:
        frees = sorted(gpu_room(state, position)[0] for position in range(len(state.devices)))
        room, (_, capacity, model) = learned.room(state), kind_of(state)
        assert uniform_measure(frees, room.cpu, room.memory, capacity, model, classes) == FragmentMemo().of(
            room, classes
        ), state.name
    lean = [added_fragmentation(ask, state, learned, classes) for ask in asks for state in states]
    monkeypatch.setattr(fragmentation, "kind_of", lambda state: None)
    general = [added_fragmentation(ask, state, learned, classes) for ask in asks for state in states]
    assert sum(value is not None for value in lean) > len(lean) // 4, "enough asks fit to compare"
    assert lean == general


def test_a_gpu_out_of_slots_counts_as_full_in_the_lean_way_as_in_the_general_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """HAMi GPUs registered without compute (devcore 0) are of one kind; a pod given the last slot of a GPU leaves
    memory there that no pod can have, and both ways must count it as none."""
    cluster = Cache(HAMI, clock=lambda: 1_800_000_000.0)  # one clock: the two learnings below build alike
    cluster.replace(
        [make_hami_node("h", gpus=4, cores=0, split=2)],
        [running_hami_pod("a", "h", 0, 1000, 0), running_hami_pod("b", "h", 1, 1000, 0)],
    )
    state = cluster.nodes["h"]
    assert kind_of(state) is not None and state.used_slots[:2] == [1, 1]
    asks = [Ask(Demand(0), 1000, 1 << 30)]
    asks += [Ask(Demand(memory * gpus, gpus), 1000, 1 << 30) for memory in (1000, 20000, 39000) for gpus in (1, 2, 3)]
    lean = [added_fragmentation(ask, state, Learned(cluster)) for ask in asks]
    monkeypatch.setattr(fragmentation, "kind_of", lambda state: None)
    general = [added_fragmentation(ask, state, Learned(cluster)) for ask in asks]
    assert lean == general


@pytest.mark.parametrize("seed", range(3))
def test_a_filter_that_refuses_some_nodes_narrows_over_the_slots_of_those_it_passes(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The slots of the nodes passed are taken from those of every name asked, not looked up again; told to
    look them up again (`_passed_slots` answering None), the same nodes pass."""
    rng = random.Random(seed)
    cache, learned = random_cluster(rng, 200, (4, 8), (40,))
    placer = Placer(cache, PolicyConfig(), learned)
    names = [*cache.nodes, "ghost"]
    rng.shuffle(names)
    asks = [Ask(Demand(rng.randint(20, 40)), rng.randint(0, 8000), rng.randint(0, 64 << 30)) for _ in range(10)]
    taken = [placer.filter(ask.demand, names, cache.nodes, ask=ask) for ask in asks]
    assert all(0 < len(outcome.failed) < len(names) for outcome in taken), "some nodes refused, some not"
    monkeypatch.setattr(Placer, "_passed_slots", staticmethod(lambda *arguments: None))
    looked_up = [placer.filter(ask.demand, names, cache.nodes, ask=ask) for ask in asks]
    assert [outcome.passed for outcome in taken] == [outcome.passed for outcome in looked_up]
