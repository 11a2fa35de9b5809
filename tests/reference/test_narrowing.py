"""The filter's narrowing with a tolerance above 0 (`--fragmentation-tolerance`), against its rule written out here.

The rule, as the settings document it: of the nodes that fit, those whose added fragmentation is within the
tolerance of the least pass (`ties`); with `best`, only the one of them whose GPUs are fullest (the least free GPU),
the first by name among equals. Values are drawn on a grid of 1/16 GPU, where sums are exact, so a node exactly at
the tolerance is within it.
"""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from extender.core.nodes import NodeState
from extender.core.placement.config import Narrowing, PolicyConfig
from extender.core.placement.narrowing import narrowed
from tests.property.fresh import property_settings

EXAMPLES = 300
GRID = 16


def reference(names: list[str], values: list[float], free: dict[str, float], tolerance: float, best: bool) -> list[str]:
    fitting = [value for value in values if value != math.inf]
    if not fitting:
        return names
    near = [name for name, value in zip(names, values, strict=True) if value <= min(fitting) + tolerance]
    if not best:
        return near
    fullest = min(free[name] for name in near)
    return [min(name for name in near if free[name] == fullest)]


@st.composite
def nodes(draw: st.DrawFn) -> tuple[list[str], list[float], dict[str, float]]:
    names = draw(st.lists(st.sampled_from([f"node-{n:02d}" for n in range(20)]), min_size=2, max_size=10, unique=True))
    values = [math.inf if draw(st.integers(0, 5)) == 0 else draw(st.integers(0, 4 * GRID)) / GRID for _ in names]
    free = {name: draw(st.integers(0, 8 * GRID)) / GRID for name in names}
    return names, values, free


@property_settings(EXAMPLES)
@given(nodes(), st.integers(1, 2 * GRID).map(lambda steps: steps / GRID), st.sampled_from(list(Narrowing)[:2]))
def test_the_nodes_within_the_tolerance_pass_and_best_keeps_the_fullest(
    drawn: tuple[list[str], list[float], dict[str, float]], tolerance: float, narrowing: Narrowing
) -> None:
    names, values, free = drawn
    states = {}
    for name in names:
        states[name] = NodeState(name)
        states[name].free_gpus = free[name]
    config = PolicyConfig(narrowing=narrowing, tolerance=tolerance)
    found = narrowed(list(names), np.array(values, dtype=np.float64), states, config, no_gpu=False)
    assert found == reference(names, values, free, tolerance, narrowing is Narrowing.BEST)


def test_of_two_nodes_within_the_tolerance_best_passes_the_fuller_not_the_emptier() -> None:
    """a adds 0.5 GPU of fragmentation, b 0.75: within 0.5 of each other. a has 3 GPUs free, b 1: b passes."""
    states = {"a": NodeState("a"), "b": NodeState("b")}
    states["a"].free_gpus, states["b"].free_gpus = 3.0, 1.0
    values = np.array([0.5, 0.75])
    assert narrowed(["a", "b"], values, states, PolicyConfig(tolerance=0.5), no_gpu=False) == ["b"]
    assert narrowed(["a", "b"], values, states, PolicyConfig(tolerance=0.125), no_gpu=False) == ["a"]
