"""The placement package's surface: what the filter, prioritize and bind verbs ask, and which policy answers.

A policy is a class with three answers (`PolicyRules`): which of the nodes that fit the filter passes
(`narrow`), the prioritize reply (`prioritize`), and the GPUs a bind gives on the chosen node (`choose`).
`POLICIES` maps each `config.Policy` to its class; a third policy is one module, one enum value and its line
there. A pod that asks its own strategy (HAMi's annotations) is placed by fill whatever the policy.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import compress
from typing import Any, Protocol

import numpy as np

from extender.core.cache import Cache
from extender.core.contract import HostPriorityEntry
from extender.core.devices import Demand
from extender.core.nodes import NodeState
from extender.core.placement.batch import Bools, Floats, Ints
from extender.core.placement.config import Ask, Policy, PolicyConfig
from extender.core.placement.fill import Fill
from extender.core.placement.filtering import FilterOutcome, filter_cached
from extender.core.placement.fit import Judgement, Placement
from extender.core.placement.fragmentation import Fragmentation
from extender.core.placement.judge import judge
from extender.core.placement.learned import Learned


class PolicyRules(Protocol):
    """One placement policy's answers. `ask` is None where the pod's cpu and memory are unknown."""

    def narrow(
        self, ask: Ask, names: list[str], states: Mapping[str, NodeState], slots: Ints | None = None
    ) -> list[str]:
        """Of the nodes that fit (at least two), those the filter passes: every one, or the best. `slots`: the
        names' slots (`arrays.NodeArrays.slots_of`) when the caller has them."""

    def warming(
        self, ask: Ask, names: list[str], states: Mapping[str, NodeState], slots: Ints | None = None
    ) -> Iterator[None] | None:
        """The work `narrow` would do on these nodes, in slices, when it is too much for one turn of the event
        loop (None when it is not)."""

    def prioritize(
        self, demand: Demand, names: list[str], states: Mapping[str, NodeState], ask: Ask | None
    ) -> list[HostPriorityEntry]:
        """The prioritize reply: 0..10 per node, where a node left out scores 0."""

    def choose(self, demand: Demand, state: NodeState, ask: Ask | None) -> Placement | None:
        """The GPUs to give the pod on this node, or None when it does not fit there now."""

    def values(self, ask: Ask, names: Sequence[str], states: Mapping[str, NodeState]) -> Floats:
        """How this policy ranks the named nodes for the ask now, the best lowest, `inf` where it does not fit (a
        job's plan tries each member's nodes in this order: `core/gang.py`). Over the cache's nodes, as cheap as
        the filter's narrowing; over other states (a plan's scratch copies), judged afresh."""

    def values_warming(self, ask: Ask, names: Sequence[str], states: Mapping[str, NodeState]) -> Iterator[None] | None:
        """The work `values` would do on these nodes, in slices, when it is too much for one turn of the event
        loop (None when it is not): a job's plan warms each member's ask so before it plans."""


POLICIES: dict[Policy, Callable[[PolicyConfig, Learned, Fill], PolicyRules]] = {
    Policy.FRAGMENTATION: Fragmentation,
    Policy.FILL: lambda config, learned, fill: fill,
}


@dataclass(frozen=True, slots=True)
class Warming:
    """A filter that must first judge many nodes afresh: `steps` does it a slice at a time, and the caller gives
    the event loop a turn after each, then asks `Placer.filter`."""

    steps: Iterator[None]


class Placer:
    """Places pods over one cache by one configuration, with what `learned` knows of the workload."""

    def __init__(self, cache: Cache, config: PolicyConfig, learned: Learned | None = None) -> None:
        self.cache = cache
        self.config = config
        self.learned = learned if learned is not None else Learned(cache)
        self.fill = Fill(cache, config)
        self.policy = POLICIES[config.policy](config, self.learned, self.fill)

    def rules(self, demand: Demand) -> PolicyRules:
        """The policy that places this demand: the configured one, or fill for a pod asking its own strategy."""
        return self.fill if self.config.own_strategy(demand) else self.policy

    def filter(
        self,
        demand: Demand,
        names: list[Any],
        states: Mapping[str, NodeState],
        pod: str = "",
        ask: Ask | None = None,
        admit: Callable[[FilterOutcome], None] | None = None,
    ) -> FilterOutcome:
        """The filter verb's decision: which of `names` take the demand, and why each other one does not
        (`filtering.filter_cached`; `pod`, `namespace/name`, is the pod asking).

        `admit`, when given, then refuses some of the nodes that fit for reasons of the pod's namespace (its
        ResourceQuotas: `quota.admission.quota_filter`). With the pod's `ask`, the policy then narrows the nodes
        that fit (`PolicyRules.narrow`): those it leaves out are neither passed nor failed, so they cost the
        scheduler nothing, and a pod that fits somewhere is never refused for it.
        """
        decided = self._filter(demand, names, states, pod, ask, admit, defer=False)
        assert isinstance(decided, FilterOutcome)
        return decided

    def begin_filter(
        self,
        demand: Demand,
        names: list[Any],
        states: Mapping[str, NodeState],
        pod: str = "",
        ask: Ask | None = None,
        admit: Callable[[FilterOutcome], None] | None = None,
    ) -> FilterOutcome | Warming:
        """`filter`, unless its narrowing would first judge many nodes afresh (`PolicyRules.warming`): then a
        `Warming`, whose steps the caller runs with turns of the event loop between them before it asks `filter`."""
        return self._filter(demand, names, states, pod, ask, admit, defer=True)

    def _filter(
        self,
        demand: Demand,
        names: list[Any],
        states: Mapping[str, NodeState],
        pod: str,
        ask: Ask | None,
        admit: Callable[[FilterOutcome], None] | None,
        defer: bool,
    ) -> FilterOutcome | Warming:
        slots = self._slots(names, states, ask)
        fits = self._fits(demand, slots) if slots is not None and demand.plain and demand.devices == 1 else None
        if fits is not None and fits.all():
            outcome = FilterOutcome(passed=names)  # every name a node of the cache that takes it: one array step
        else:
            outcome = filter_cached(demand, names, states, self.cache, self.cache.protocol.unit, pod)
        if admit is not None:
            admit(outcome)
        if ask is not None and len(outcome.passed) > 1:
            rules = self.rules(demand)
            given = self._passed_slots(names, slots, fits, outcome.passed)
            steps = rules.warming(ask, outcome.passed, states, given) if defer else None
            if steps is not None:
                return Warming(steps)
            outcome.passed = rules.narrow(ask, outcome.passed, states, given)
        return outcome

    def _slots(self, names: list[Any], states: Mapping[str, NodeState], ask: Ask | None) -> Ints | None:
        """The names' slots, where what follows reads arrays by slot: names of the cache's nodes, for a pod whose
        ask is known (None for a name that cannot be a node's: the slow path checks and reports it)."""
        if ask is None or states is not self.cache.nodes:
            return None
        try:
            return self.learned.arrays.slots_of(names)
        except TypeError:
            return None

    def _fits(self, demand: Demand, slots: Ints) -> Bools:
        """Which slots are nodes that take this plain one-GPU demand now (their largest free GPU): the nodes
        `filter_cached` passes, as an array."""
        return (self.learned.arrays.fit_free[slots] >= demand.per_device) & (slots >= 0)

    @staticmethod
    def _passed_slots(names: list[Any], slots: Ints | None, fits: Bools | None, passed: list[Any]) -> Ints | None:
        """The slots of the nodes passed, from those of every name asked (None where they are not known so):
        all of them when all passed; those that fit when exactly those passed (checked name by name, a pass in
        C, much cheaper than looking the slots up again). Not when a quota refused some."""
        if slots is None or passed is names:
            return slots
        if fits is None or len(passed) != int(np.count_nonzero(fits)):
            return None
        mask = fits.tolist()
        return slots[fits] if list(compress(names, mask)) == passed else None

    def prioritize(
        self, demand: Demand, names: list[str], states: Mapping[str, NodeState], ask: Ask | None = None
    ) -> list[HostPriorityEntry]:
        """The prioritize verb's reply (`PolicyRules.prioritize`)."""
        return self.rules(demand).prioritize(demand, names, states, ask)

    def choose(self, demand: Demand, state: NodeState, ask: Ask | None = None) -> Placement | None:
        """The GPUs to give the pod on this node (per GPU container), or None when it does not fit now."""
        return self.rules(demand).choose(demand, state, ask)

    def values(self, ask: Ask, names: Sequence[str], states: Mapping[str, NodeState]) -> Floats:
        """The policy's rank of each named node for the ask (`PolicyRules.values`)."""
        return self.rules(ask.demand).values(ask, names, states)

    def values_warming(self, ask: Ask, names: Sequence[str], states: Mapping[str, NodeState]) -> Iterator[None] | None:
        """`values`' work in slices, when it is much (`PolicyRules.values_warming`)."""
        return self.rules(ask.demand).values_warming(ask, names, states)

    def build(self) -> int:
        """The build of the typical shapes `choose` judges by now: with it and the node unchanged, `choose` gives
        what it gave before (the rest of what it reads is the pod's, and the policy's settings)."""
        return self.learned.classes().version

    def judge(self, demand: Demand, state: NodeState | None, pod: str = "") -> Judgement:
        """Whether the demand fits on the node now, and why not (`judge.judge`, in the protocol's unit)."""
        return judge(demand, state, self.cache.protocol.unit, pod)
