"""The placement arrays and the learned memos kept change by change (`arrays.py`, `learned.py`), where `make
mutation` found them unguarded: nodes deleted from the middle of their kind's rows, made NotReady and Ready again,
new nodes taking a freed slot, nodes whose GPUs cannot be judged in arrays (HAMi's) deleted, pods bound on a node
whose row moved; after each change the arrays, the rooms and the measures remembered equal those of a cache built
afresh from the same objects (`tests/property/fresh.py`, which the stateful property tests use over random
sequences, too slow for `make mutation`). And the memos of the cache's own nodes are never read for, nor filled
by, the views of nodes preemption judges (a node without its victims)."""

from __future__ import annotations

import math
from typing import Any

from extender.core.cache import Cache
from extender.core.devices import Demand
from extender.core.placement.batch import measures
from extender.core.placement.config import Ask
from extender.core.placement.fragmentation import FULLER, added_fragmentation, judged
from extender.core.placement.learned import Learned
from extender.core.placement.measure import room_of
from extender.core.placement.placer import Placer
from extender.core.placement.workload import Shape
from extender.core.protocols.gpushare import Profile
from tests.builders import (
    PROFILE,
    bound_pod,
    learned_of,
    make_cluster,
    make_hami_cluster,
    make_hami_node,
    make_hami_pod,
    make_node,
    make_pod,
    running_hami_pod,
)
from tests.core.placement.test_batch import arrays_beside_scalar
from tests.core.placement.test_fragmentation import BEST, ask
from tests.property.fresh import arrays_differences, outcome_of, rebuilt

GPU = 16


def mixed(name: str) -> dict[str, Any]:
    """A node of GPUs of 16 and 8 GiB: not of one kind, so judged one by one, without a row in the arrays."""
    devices = [{"index": 0, "memory": 16}, {"index": 1, "memory": 8}]
    return make_node(name, gpus=2, mem=12, devices=devices, cpu="32", memory="128Gi")


class Scripted:
    """A gpushare cache, its learned arrays and memos, and the objects it was shown, so that a cache can be built
    afresh from them after each change."""

    def __init__(self, profile: Profile = PROFILE) -> None:
        self.nodes: dict[str, dict[str, Any]] = {}
        self.pods: dict[str, dict[str, Any]] = {}
        self.cache = Cache(profile)
        self.learned = Learned(self.cache)

    def add(self, name: str, gpus: int = 2, ready: bool = True, node: dict[str, Any] | None = None) -> None:
        self.nodes[name] = node or make_node(name, gpus=gpus, mem=GPU, cpu="32", memory="128Gi", ready=ready)
        self.cache.apply_node(self.nodes[name])

    def delete(self, name: str) -> None:
        self.cache.apply_node(self.nodes.pop(name), deleted=True)

    def bind(self, pod: str, node: str, index: int, memory: int) -> None:
        self.pods[pod] = bound_pod(pod, node, (index,), memory, cpu="2", memory="8Gi")
        self.cache.apply_pod(self.pods[pod])

    def remove(self, pod: str) -> None:
        self.cache.apply_pod(self.pods.pop(pod), deleted=True)

    def teach(self) -> None:
        """Shares of a quarter and of half a GPU typical, so that a node's measure depends on its free memory."""
        for number in range(6):
            self.cache.apply_pod(make_pod(f"seen-{number}", gpu_mem=4 if number % 2 else 8, cpu="2", memory="8Gi"))

    def measure_all(self) -> None:
        """Every node's measure, remembered in its row (or beside it), as a filter leaves them."""
        classes = self.learned.classes()
        for state in self.cache.nodes.values():
            if state.known:
                self.learned.measure(state, classes)

    def differences(self) -> list[str]:
        fresh = rebuilt(self.cache.protocol, self.cache.clock, self.nodes.values(), self.pods.values(), self.cache)
        fresh_learned = Learned(fresh)
        fresh_learned.workload = self.learned.workload
        found = arrays_differences(self.learned, fresh_learned)
        rows = {name for kind in self.learned.arrays.kinds.values() for name in kind.row_of}
        fresh_rows = {name for kind in fresh_learned.arrays.kinds.values() for name in kind.row_of}
        if rows != fresh_rows or set(self.learned.arrays.located) != fresh_rows:
            found.append(f"rows of {sorted(rows)} kept, {sorted(fresh_rows)} afresh")
        return found


def test_the_arrays_equal_fresh_ones_after_nodes_leave_the_middle_of_their_rows_and_others_come() -> None:
    """Five nodes of one kind in rows 0-4 and one of another; deleting n1 moves n4 (the last row) into row 1, with
    its measure; a new node then takes row 4 and n1's slot. A measure left in the wrong row, or a code still
    naming the row n4 left, would judge n4 by another node's GPUs."""
    script = Scripted()
    script.teach()
    for number in range(5):
        script.add(f"n{number}")
    script.add("wide", gpus=4)
    script.bind("a", "n4", 0, 12)
    script.bind("b", "n1", 1, 4)
    script.measure_all()
    assert script.differences() == []
    script.delete("n1")
    assert script.differences() == []
    script.add("n5")
    script.bind("c", "n5", 1, 8)
    script.measure_all()
    assert script.differences() == []
    script.bind("d", "n4", 1, 4)  # the node whose row moved changes: its new row is written
    script.delete("n0")
    script.delete("wide")  # the only node of its kind
    script.measure_all()
    assert script.differences() == []


def test_the_rows_of_a_second_kind_move_within_that_kind() -> None:
    """Three nodes of four GPUs (the second kind, after the nodes of two): deleting the first of them moves the
    last into its row, whose code must name that kind and row."""
    script = Scripted()
    script.teach()
    script.add("n0")
    for number in range(3):
        script.add(f"wide{number}", gpus=4)
    script.bind("a", "wide2", 3, 8)
    script.measure_all()
    script.delete("wide0")
    assert script.differences() == []
    script.measure_all()
    assert script.differences() == []


def test_a_node_judged_one_by_one_is_measured_afresh_after_it_changes() -> None:
    """A node of unequal GPUs keeps its measure beside the arrays: a pod bound there, it must be measured again."""
    script = Scripted()
    script.teach()
    script.add("n0")
    script.add("mixed", node=mixed("mixed"))
    script.measure_all()
    script.bind("a", "mixed", 0, 10)
    assert script.differences() == []
    script.measure_all()
    script.remove("a")
    assert script.differences() == []


def test_the_bind_after_a_node_changed_gives_gpus_judged_on_the_node_as_it_is_now() -> None:
    """The filter remembers, beside what a pod adds to each node, the GPUs it would take there; the bind reads them
    (`choice_on`). A pod bound on n1 since, filling the GPU the filter chose, must be seen: the bind gives the
    other GPU. Shares of a quarter and a half typical; n1's GPU 0 has 10 of 16 free, n2 is empty."""
    script = Scripted()
    script.teach()
    script.add("n1")
    script.add("n2")
    script.bind("a", "n1", 0, 6)
    placer = Placer(script.cache, BEST, script.learned)
    asked = ask(8)
    assert len(placer.filter(asked.demand, ["n1", "n2"], script.cache.nodes, "default/p", asked).passed) == 1
    first = placer.choose(asked.demand, script.cache.nodes["n1"], asked)
    assert first is not None
    [[grant]] = first.containers
    script.bind("b", "n1", grant.index, GPU - (6 if grant.index == 0 else 0))  # that GPU now full
    again = placer.choose(asked.demand, script.cache.nodes["n1"], asked)
    assert again is not None and [g.index for g in again.containers[0]] == [1 - grant.index]


def test_a_pod_learned_from_its_filter_is_not_learned_again_when_the_watch_shows_it() -> None:
    script = Scripted()
    pod = make_pod("p", gpu_mem=4, cpu="2", memory="8Gi")
    uid = pod["metadata"]["uid"]
    shape = Shape(2000, 8 << 30, 1, 4)
    script.learned.asked(uid, shape)
    script.cache.apply_pod(pod)
    assert script.learned.workload.observed == 1 and script.learned.workload.weights == {shape: 1.0}


def test_the_arrays_equal_fresh_ones_as_nodes_turn_not_ready_and_ready_again() -> None:
    """A node not Ready has no row (nothing can be placed there); Ready again, it gets one back, at the end."""
    script = Scripted()
    script.teach()
    for number in range(4):
        script.add(f"n{number}")
    script.bind("a", "n3", 0, 8)
    script.measure_all()
    script.add("n1", ready=False)
    script.measure_all()
    assert script.differences() == []
    script.add("n1")
    script.remove("a")
    script.measure_all()
    assert script.differences() == []


def test_a_node_without_a_row_leaves_and_a_new_node_takes_its_slot_never_one_in_use() -> None:
    """A node of unequal GPUs is judged one by one, so has no row, nor has a node that is not Ready: deleting them
    leaves the others' rows alone. n0 has slot 0, mixed 1, down 2: with n0 deleted, a new node takes slot 0
    again, not the next after the count of nodes (2, still down's)."""
    script = Scripted()
    script.teach()
    script.add("n0")
    script.add("mixed", node=mixed("mixed"))
    script.add("down", ready=False)
    script.measure_all()
    script.delete("n0")
    script.add("n1")
    assert script.learned.arrays.slot_of == {"mixed": 1, "down": 2, "n1": 0}
    assert script.differences() == []
    script.delete("mixed")
    script.delete("down")
    assert script.differences() == []


def test_a_filter_after_nodes_left_and_came_narrows_as_one_built_afresh() -> None:
    """What a user sees of the arrays: the node the filter passes for a half-GPU share, with the typical shapes
    learned, equals a cache built afresh's answer after nodes left the middle of the rows."""
    script = Scripted()
    script.teach()
    for number in range(6):
        script.add(f"n{number}")
    for number, used in enumerate((12, 4, 0, 8, 12, 2)):
        if used:
            script.bind(f"p{number}", f"n{number}", 0, used)
    names = list(script.nodes)
    placer = Placer(script.cache, BEST, script.learned)
    outcome_of(placer, ask(8), names)
    script.delete("n1")
    script.delete("n2")
    script.add("n6")
    names = list(script.nodes)
    fresh = rebuilt(
        script.cache.protocol, script.cache.clock, script.nodes.values(), script.pods.values(), script.cache
    )
    fresh_learned = Learned(fresh)
    fresh_learned.workload = script.learned.workload
    expected = outcome_of(Placer(fresh, BEST, fresh_learned), ask(8), names)
    assert outcome_of(placer, ask(8), names) == expected
    assert len(expected[0]) == 1


# ---- the memos: the cache's own nodes only ---------------------------------------------------------------


def test_a_view_of_a_node_is_measured_as_it_is_not_as_the_caches_node_was_remembered() -> None:
    """Preemption judges views of nodes without their victims (states that are not the cache's): a view's room
    and measure are its own, and reading them leaves the cache's node's remembered as they were."""
    script = Scripted()
    script.teach()
    script.add("n0")
    script.add("mixed", node=mixed("mixed"))
    script.bind("a", "n0", 0, 12)
    script.bind("b", "mixed", 0, 12)
    emptier = Cache(PROFILE)
    emptier.replace([script.nodes["n0"], script.nodes["mixed"]], [])  # the same nodes, their pods evicted
    classes = script.learned.classes()
    for name in ("n0", "mixed"):
        own, view = script.cache.nodes[name], emptier.nodes[name]
        own_measure = script.learned.measure(own, classes)
        own_room = script.learned.room(own)
        assert script.learned.room(view) == room_of(view)
        view_measure = script.learned.measure(view, classes)
        assert view_measure == Learned(emptier).measure(view, classes) != own_measure
        assert script.learned.room(own) == own_room == room_of(own)
        assert script.learned.measure(own, classes) == own_measure
        assert script.learned.remembered(own, classes) == own_measure
        assert script.learned.remembered(view, classes) is None


def test_a_nodes_measure_is_taken_again_under_new_typical_shapes() -> None:
    """A measure is remembered under one build of the typical shapes; once the workload is rebuilt (other pods
    typical), it is the node's measure under the new build, not the one remembered, in a row or beside it."""
    script = Scripted()
    script.add("n0")
    script.add("mixed", node=mixed("mixed"))
    script.bind("a", "n0", 0, 12)
    script.teach()
    before = script.learned.classes()
    measured = {name: script.learned.measure(state, before) for name, state in script.cache.nodes.items()}
    for number in range(40):  # whole GPUs now typical: a rebuild
        script.cache.apply_pod(make_pod(f"whole-{number}", gpu_mem=GPU, cpu="2", memory="8Gi"))
    after = script.learned.classes()
    assert after.version != before.version
    fresh = rebuilt(
        script.cache.protocol, script.cache.clock, script.nodes.values(), script.pods.values(), script.cache
    )
    for name, state in script.cache.nodes.items():
        assert script.learned.measure(state, after) == Learned(fresh).measure(fresh.nodes[name], after)
        assert script.learned.remembered(state, before) is None
    assert measured["n0"] != script.learned.measure(script.cache.nodes["n0"], after)


def test_a_demand_of_one_gpu_is_filtered_by_its_node_arrays_after_a_node_left() -> None:
    """The placer's one-step filter reads each node's largest free GPU by slot: a slot freed by a deleted node and
    given to a new one must hold the new node's, not the old one's."""
    script = Scripted()
    script.add("n0")
    script.add("n1")
    script.bind("a", "n1", 0, GPU)
    script.bind("b", "n1", 1, GPU)  # n1 full
    script.delete("n0")
    script.add("n2")
    script.bind("c", "n2", 0, GPU)
    script.bind("d", "n2", 1, 10)  # n2: 6 free at most
    placer = Placer(script.cache, BEST, script.learned)
    outcome = placer.filter(Demand(8), ["n1", "n2"], script.cache.nodes, "default/a", ask(8))
    assert outcome.passed == [] and set(outcome.failed) == {"n1", "n2"}


# ---- rows of GPUs that count pods: the array way against the scalar one ------------------------------------


def counting_pod(name: str, node: str, gpu: int, mem: int) -> dict[str, Any]:
    """A pod HAMi's plugin runs on GPU `gpu` of `node`, asking 2 cpus and 4 GiB of memory besides."""
    pod = running_hami_pod(name, node, gpu, mem, 0)
    pod["spec"]["containers"][0]["resources"]["requests"] = {"cpu": "2", "memory": "4Gi"}
    return pod


def test_nodes_whose_gpus_count_pods_are_judged_in_arrays_as_one_by_one() -> None:
    """HAMi's GPUs without compute tracked can be judged in arrays; each runs 2 pods at most, so a pod that takes a
    GPU's last slot leaves nothing there for the next, whatever its memory. The nodes report no cpu or memory
    (HAMi's do not, in these objects): nothing is ever short of either. The array way (`batch.after`, over the
    rows) must give what the scalar way gives, to the bit (`batch.py`), here where slots and unreported
    allocatables matter: with pods of 35000 MiB typical, what a GPU keeps free after a pod of 10000 is a fragment
    unless the pod took its last slot. A share of a GPU's memory typical too: the measure of each node as it is,
    in arrays, is the memo's."""
    nodes = [make_hami_node(f"h{number}", gpus=2, cores=0, split=2) for number in range(4)]
    running = [
        counting_pod("a", "h0", 0, 10000),  # h0: GPU 0 has one slot left
        counting_pod("b", "h1", 0, 10000),
        counting_pod("c", "h1", 1, 30000),  # h1: one slot left on each
        counting_pod("d", "h3", 1, 5000),
        counting_pod("e", "h3", 1, 5000),  # h3: GPU 1 full by its slots, 30960 MiB free on it
    ]
    pending = [make_hami_pod(f"seen-{number}", mem=10000 if number % 3 else 35000) for number in range(6)]
    share = make_hami_pod("seen-share")  # a share of the GPU's memory: 25 %
    share["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpumem-percentage"] = "25"
    pending.append(share)
    for pod in pending:
        pod["spec"]["containers"][0]["resources"]["requests"] = {"cpu": "2", "memory": "4Gi"}
    cache = make_hami_cluster(*nodes, pods=(*running, *pending))
    learned = learned_of(cache)
    classes = learned.classes()
    [rows] = learned.arrays.kinds.values()
    assert rows.size == 4
    _, capacity, model = rows.kind  # each node's measure as it is: in arrays, and the memo's way (a share typical)
    batch = measures(rows.free[:4], rows.cpu[:4], rows.memory[:4], capacity, model, classes).tolist()
    assert batch == [learned.fragments.of(room_of(state), classes) for state in rows.states]
    for ask_ in (Ask(Demand(10000), 2000, 4 << 30), Ask(Demand(20000, devices=2), 2000, 4 << 30), Ask(Demand(0))):
        for state, added, chosen, scalar in arrays_beside_scalar(rows, ask_, learned, classes):
            if scalar is None:  # a pod of two GPUs on h3, one of whose GPUs takes no pod more
                assert (added, ask_.demand.devices, state.name) == (math.inf, 2, "h3")
                continue
            assert added == scalar[0], (ask_, state.name)
            if not ask_.demand.is_zero:
                assert chosen == scalar[1], (ask_, state.name)


def test_nodes_of_a_gpu_model_are_judged_in_arrays_as_one_by_one_with_shapes_that_ask_that_model() -> None:
    """Twenty nodes of T4s (enough to be judged in arrays) and four of A100s; half the typical pods ask for a T4.
    What a pod adds to each node is the same whichever way it is judged (`batch.py`), here where whether a shape
    may use a GPU depends on the GPU's model."""
    nodes = [make_node(f"t{number:02d}", gpus=2, mem=GPU, cpu="32", memory="128Gi", model="T4") for number in range(20)]
    nodes += [make_node(f"a{number}", gpus=2, mem=GPU, cpu="32", memory="128Gi", model="A100") for number in range(4)]
    pods = [bound_pod(f"r{number}", f"t{number:02d}", (number % 2,), 2 + number % 7) for number in range(20)]
    pods += [make_pod(f"picky-{number}", gpu_mem=12, cpu="2", memory="8Gi", models=("T4",)) for number in range(6)]
    pods += [make_pod(f"any-{number}", gpu_mem=4, cpu="2", memory="8Gi") for number in range(6)]
    for asked in (Ask(Demand(8), 2000, 8 << 30), Ask(Demand(0), 2000, 8 << 30)):
        cache, one_by_one = make_cluster(*nodes, pods=tuple(pods)), make_cluster(*nodes, pods=tuple(pods))
        learned, alone = learned_of(cache), learned_of(one_by_one)  # each its own measures remembered
        classes = learned.classes()
        assert any(shape.models == ("T4",) for shape in classes.shapes)
        names = list(cache.nodes)
        table = dict(zip(names, judged(asked, names, learned, cache.nodes, classes).tolist(), strict=True))
        for name in names:
            state = one_by_one.nodes[name]
            scalar = added_fragmentation(asked, state, alone, alone.classes())
            expected = math.inf if scalar is None else scalar[0] + FULLER * state.free_gpus
            assert table[name] == expected, (asked, name)
