"""The gpushare machine's sequence that put a GPU over capacity, replayed step by step with the values it drew.

Hypothesis found it only in full-suite runs (its derandomized examples depend on the modules a process imported),
so it is kept here as it was printed, run against the machine itself (`machine.py`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tests.property.test_gpushare_machine import GpushareMachine

Drawn = Any | Callable[[GpushareMachine], Any]


class Replay:
    """Stands for Hypothesis' `data`: each draw is the next value printed (a GPU is looked up on its node)."""

    def __init__(self, machine: GpushareMachine, values: list[Drawn]) -> None:
        self.machine = machine
        self.values = values

    def draw(self, strategy: object, label: object = None) -> Any:
        value = self.values.pop(0)
        return value(self.machine) if callable(value) else value


def gpu(node: str, index: int) -> Callable[[GpushareMachine], Any]:
    return lambda machine: next(device for device in machine.cache.nodes[node].devices if device.index == index)


CLUSTER_NODES = [(2, 16, ""), True, "4", "8Gi", (1, 8, "T4"), True, "4", "8Gi"]
CLUSTER_PODS = [7, "2", "8Gi", (), 5, "1", "8Gi", ("T4",), 7, "4", None, ()]


def test_a_binding_the_watch_shows_after_the_ttl_freed_its_hold_is_no_schedule_of_ours() -> None:
    """A pod bound on n5's GPU 0 with 5 units is not yet shown when the TTL passes with the watch working, so its
    hold is freed (a working watch shows a landed binding well within the TTL); GPU 0 is filled with 16 more,
    and the relist shows the pod: 21 of 16. A working watch has shown the binding before it expires, as the
    machine now has it, and every GPU stays within its capacity after each step."""
    machine = GpushareMachine()
    data = Replay(machine, [])
    steps: list[tuple[str, dict[str, Any], list[Drawn]]] = [
        # n0 and n1, then 3 pods: p1 (7 units, 2 cpu, 8Gi), p2 (5, 1 cpu, 8Gi, T4), p3 (7, 4 cpu)
        ("a_cluster", {"count": 2}, [*CLUSTER_NODES, 3, *CLUSTER_PODS]),
        ("remove_node", {}, ["n0"]),
        ("measure_every_node", {}, []),
        ("register_node", {"name": "n5"}, [(2, 16, ""), True, "4", "8Gi"]),
        ("remove_node", {}, ["n1"]),
        ("time_passes", {"seconds": 1.0, "watching": False}, []),
        ("fill_a_gpu", {}, ["n5", gpu("n5", 1)]),
        ("reserve_at_random", {}, ["uid-p2", "n5", 4, 9]),
        ("filter_and_bind", {"outcome": "accepted"}, ["uid-p2", "n5"]),
        ("fill_a_gpu", {}, ["n5", gpu("n5", 0)]),
        ("time_passes", {"seconds": 31.0, "watching": True}, []),
        ("fill_a_gpu", {}, ["n5", gpu("n5", 0)]),
        ("filter_and_bind", {"outcome": "accepted"}, ["uid-p3", "n5"]),
        ("reserve_again", {}, ["uid-filler-44"]),
        ("relist", {}, []),
    ]
    data.values = [value for _, _, drawn in steps for value in drawn]
    for position, (rule, arguments, _) in enumerate(steps):
        taking = {"data": data} if rule not in ("measure_every_node", "time_passes", "relist") else {}
        getattr(machine, rule)(**arguments, **taking)
        assert not machine.cache.overcommitted(), f"after step {position} ({rule})"
        machine.equals_a_cache_built_afresh()
    assert not data.values
    assert machine.cache.nodes["n5"].used == [16, 7]
