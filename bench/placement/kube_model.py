"""kube-scheduler's scheduling cycle, reproduced in process for the fast mode of `make bench-placement`.

What it reproduces, from k8s.io/kubernetes v1.34.1 `pkg/scheduler`, for the pods and nodes the trace makes
(Ready untainted nodes; bare pods with cpu and memory requests, extended resources and at most a required node
affinity; one priority, so preemption finds no victim):

- Filter (`schedule_one.go` `findNodesThatPassFilters`): NodeResourcesFit (cpu, memory, pods and every extended
  resource the pod asks, against the node's allocatable and what the pods there request) and NodeAffinity
  (the required terms). Nodes are visited from `nextStartNodeIndex` on, in the snapshot's order (by name: one
  zone), until `numFeasibleNodesToFind` fit, and the index moves on by the nodes visited; the real scheduler
  checks 16 nodes at once and stops a little later, so its sample may differ by a few nodes (none when every node
  is scored: `percentageOfNodesToScore: 100`).
- The extenders (`findNodesThatPassExtenders`, `extender.go` `IsInterested`), in their order: each is called
  when the pod asks one of its managedResources (every pod when there are none); the nodes it returns are kept,
  the rest dropped. The first entry is the extender's own (filter, prioritize, bind); a second may only filter
  (`aside`: the ignorable entry of pods that ask no GPU on the default scheduler, `schedconfig.cpu_entry`).
- One node left: chosen without scoring. Else the score (`prioritizeNodes`): each enabled score plugin that
  varies here (NodeResourcesFit by its scoring strategy, NodeResourcesBalancedAllocation on cpu and memory)
  times its weight, plus the extender's 0-10 x weight x 10 for the hosts it lists. The other default score
  plugins give every node here the same score (no taints, images, preferred affinity or spread constraints), so
  they change no choice and are left out.
- `selectHost`: the highest total, ties broken at random (reservoir sampling), from a seeded generator here.

The scheduler's configuration comes from the text `extender scheduler-config` renders (`SchedulerModel.parse`),
so the fast mode runs the configuration that ships. The extender is a callable (the fast mode's in-process
service): this module knows nothing of the extender's code.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

MAX_NODE_SCORE = 100
MAX_EXTENDER_PRIORITY = 10
MIN_FEASIBLE_NODES = 100
MIN_FEASIBLE_PERCENTAGE = 5
DEFAULT_RESOURCES = (("cpu", 1), ("memory", 1))
"""NodeResourcesFit's default scoring resources and weights."""


@dataclass(slots=True)
class ModelNode:
    """A node as the scheduler's cache sees it: allocatable, what its pods request, labels. Mutable."""

    name: str
    allocatable: dict[str, int]
    """cpu in millicores, memory in bytes, pods, extended resources in their units."""
    labels: dict[str, str]
    requested: dict[str, int] = field(default_factory=dict)
    pods: int = 0

    def free(self, resource: str) -> int:
        return self.allocatable.get(resource, 0) - self.requested.get(resource, 0)


@dataclass(frozen=True, slots=True)
class ModelPod:
    name: str
    requests: dict[str, int]
    """cpu in millicores, memory in bytes, extended resources in their units (the API copies limits here)."""
    affinity: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """Required node affinity as (label, allowed values) terms, all of which must hold (one selector term)."""
    body: Mapping[str, Any] = field(default_factory=dict)
    """The Pod object, for the extender."""


@dataclass(frozen=True, slots=True)
class ExtenderAnswer:
    """What the extender's filter returned: the nodes kept, and the reason given for each node refused."""

    passed: list[str]
    failed: dict[str, str]


Extender = Callable[[str, ModelPod, list[str]], Any]
"""`(verb, pod, node names) -> reply`: `filter` returns an ExtenderAnswer, `prioritize` a list of
`{"Host", "Score"}`."""


@dataclass(frozen=True, slots=True)
class Decision:
    node: str
    """Where the pod goes; "" when no node fits."""
    reasons: dict[str, int]
    """When no node fits: how many nodes were refused for each reason (the scheduler's own, or the extender's)."""
    feasible: int = 0
    """Nodes the scheduler's own filters kept (before the extender)."""
    scored: int = 0
    """Nodes that reached the score (after the extender)."""
    complete: bool = True
    """Every node was visited (False: the cycle stopped at `numFeasibleNodesToFind`, so a node it never looked at
    might have taken the pod)."""


@dataclass(slots=True)
class SchedulerModel:
    """The configured cycle (see the module docstring). Mutable: the start index and the random tie-breaks."""

    percentage: int = 0
    """percentageOfNodesToScore (0: adaptive)."""
    fit_weight: int = 1
    fit_strategy: str = "LeastAllocated"
    fit_resources: tuple[tuple[str, int], ...] = DEFAULT_RESOURCES
    balanced_weight: int = 1
    extender_weight: int = 0
    """0: the extender has no prioritize verb."""
    extender_filter: bool = False
    managed: frozenset[str] = frozenset()
    """managedResources of the extender (empty: every pod)."""
    aside: str = ""
    """The filter verb of a second entry every pod reaches ("": none)."""
    has_extender: bool = False
    seed: int = 0
    next_start: int = 0
    rng: random.Random = field(default_factory=random.Random)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    @classmethod
    def parse(cls, config_yaml: str, scheduler_name: str = "default-scheduler", seed: int = 0) -> SchedulerModel:
        """The model of a KubeSchedulerConfiguration (v1) for the profile `scheduler_name`."""
        config = yaml.safe_load(config_yaml) or {}
        profile = next(
            (p for p in config.get("profiles") or [] if p.get("schedulerName", "default-scheduler") == scheduler_name),
            {},
        )
        percentage = profile.get("percentageOfNodesToScore", config.get("percentageOfNodesToScore")) or 0
        weights = {"NodeResourcesFit": 1, "NodeResourcesBalancedAllocation": 1}
        score = (profile.get("plugins") or {}).get("score") or {}
        for plugin in score.get("disabled") or []:
            if plugin["name"] == "*":
                weights = dict.fromkeys(weights, 0)
            elif plugin["name"] in weights:
                weights[plugin["name"]] = 0
        for plugin in score.get("enabled") or []:
            if plugin["name"] in weights:
                weights[plugin["name"]] = int(plugin.get("weight") or 1)
        strategy, resources = "LeastAllocated", DEFAULT_RESOURCES
        for entry in profile.get("pluginConfig") or []:
            if entry.get("name") == "NodeResourcesFit":
                scoring = (entry.get("args") or {}).get("scoringStrategy") or {}
                strategy = scoring.get("type", strategy)
                resources = (
                    tuple((item["name"], int(item.get("weight", 1))) for item in scoring.get("resources") or [])
                    or resources
                )
        model = cls(
            percentage=int(percentage),
            fit_weight=weights["NodeResourcesFit"],
            fit_strategy=strategy,
            fit_resources=resources,
            balanced_weight=weights["NodeResourcesBalancedAllocation"],
            seed=seed,
        )
        extenders = config.get("extenders") or []
        if len(extenders) > 1:
            second = extenders[1]
            if len(extenders) > 2 or second.get("managedResources") or set(second) & {"prioritizeVerb", "bindVerb"}:
                raise ValueError("the model knows one extender entry, and beside it one that only filters every pod")
            model.aside = str(second["filterVerb"])
        if extenders:
            entry = extenders[0]
            model.has_extender = True
            model.extender_filter = bool(entry.get("filterVerb"))
            model.extender_weight = int(entry.get("weight") or 0) if entry.get("prioritizeVerb") else 0
            model.managed = frozenset(item["name"] for item in entry.get("managedResources") or [])
        return model

    # -- the cycle

    def interested(self, pod: ModelPod) -> bool:
        return self.has_extender and (not self.managed or any(name in self.managed for name in pod.requests))

    def feasible_to_find(self, nodes: int) -> int:
        if nodes < MIN_FEASIBLE_NODES:
            return nodes
        percentage = self.percentage or max(50 - nodes // 125, MIN_FEASIBLE_PERCENTAGE)
        return max(nodes * percentage // 100, MIN_FEASIBLE_NODES)

    def schedule(self, pod: ModelPod, nodes: Sequence[ModelNode], extender: Extender | None) -> Decision:
        """One scheduling cycle: where the pod goes, or why it goes nowhere."""
        wanted = self.feasible_to_find(len(nodes))
        feasible: list[ModelNode] = []
        reasons: dict[str, int] = {}
        visited = 0
        count = len(nodes)
        for offset in range(count):
            node = nodes[(self.next_start + offset) % count]
            visited += 1
            reason = self.refuse(pod, node)
            if reason:
                reasons[reason] = reasons.get(reason, 0) + 1
                continue
            feasible.append(node)
            if len(feasible) >= wanted:
                break
        self.next_start = (self.next_start + visited) % count if count else 0
        found = len(feasible)
        verbs = ["filter"] if self.extender_filter and self.interested(pod) else []
        verbs += [self.aside] if self.aside else []
        for verb in verbs:
            if not feasible or extender is None:
                break
            answer: ExtenderAnswer = extender(verb, pod, [node.name for node in feasible])
            by_name = {node.name: node for node in feasible}
            feasible = [by_name[name] for name in answer.passed]
            for reason in answer.failed.values():
                reasons[reason] = reasons.get(reason, 0) + 1
        if not feasible:
            return Decision("", reasons, found, 0, visited == count)
        if len(feasible) == 1:
            return Decision(feasible[0].name, {}, found, 1)
        totals = [self.score(pod, node) for node in feasible]
        if extender is not None and self.extender_weight and self.interested(pod):
            listed = extender("prioritize", pod, [node.name for node in feasible])
            extra = {entry["Host"]: entry["Score"] for entry in listed}
            factor = self.extender_weight * (MAX_NODE_SCORE // MAX_EXTENDER_PRIORITY)
            totals = [total + extra.get(node.name, 0) * factor for total, node in zip(totals, feasible, strict=True)]
        return Decision(feasible[self.select(totals)].name, {}, found, len(feasible))

    def select(self, totals: list[int]) -> int:
        """`selectHost`: the index of the highest total; among equals, each as likely (reservoir sampling)."""
        best, chosen, ties = -1, 0, 0
        for index, total in enumerate(totals):
            if total > best:
                best, chosen, ties = total, index, 1
            elif total == best:
                ties += 1
                if self.rng.randrange(ties) == 0:
                    chosen = index
        return chosen

    def refuse(self, pod: ModelPod, node: ModelNode) -> str:
        """Why the scheduler's own filters refuse the node ("" when they pass it), in its words."""
        for label, values in pod.affinity:
            if node.labels.get(label) not in values:
                return "node(s) didn't match Pod's node affinity/selector"
        allocatable, requested = node.allocatable, node.requested
        if node.pods + 1 > allocatable.get("pods", 0):
            return "Too many pods"
        for resource, amount in pod.requests.items():  # node.free, inlined: the fast modes' hottest loop
            if amount and amount > allocatable.get(resource, 0) - requested.get(resource, 0):
                return f"Insufficient {resource}"
        return ""

    def score(self, pod: ModelPod, node: ModelNode) -> int:
        total = 0
        if self.fit_weight:
            total += self.fit_weight * self._fit_score(pod, node)
        if self.balanced_weight:
            total += self.balanced_weight * _balanced(pod, node)
        return total

    def _fit_score(self, pod: ModelPod, node: ModelNode) -> int:
        """NodeResourcesFit's score (`least_allocated.go`, `most_allocated.go`, `resource_allocation.go`)."""
        score_sum = weight_sum = 0
        for resource, weight in self.fit_resources:
            request = pod.requests.get(resource, 0)
            if request == 0 and resource not in ("cpu", "memory"):
                continue  # an extended resource the pod does not ask is not scored
            capacity = node.allocatable.get(resource, 0)
            if capacity == 0:
                continue
            requested = node.requested.get(resource, 0) + request
            if self.fit_strategy == "MostAllocated":
                score = min(requested, capacity) * MAX_NODE_SCORE // capacity
            else:
                score = 0 if requested > capacity else (capacity - requested) * MAX_NODE_SCORE // capacity
            score_sum += score * weight
            weight_sum += weight
        return score_sum // weight_sum if weight_sum else 0

    def assume(self, pod: ModelPod, node: ModelNode) -> None:
        node.pods += 1
        for resource, amount in pod.requests.items():
            node.requested[resource] = node.requested.get(resource, 0) + amount

    def forget(self, pod: ModelPod, node: ModelNode) -> None:
        node.pods -= 1
        for resource, amount in pod.requests.items():
            node.requested[resource] = node.requested.get(resource, 0) - amount


def _balanced(pod: ModelPod, node: ModelNode) -> int:
    """NodeResourcesBalancedAllocation on cpu and memory (`balanced_allocation.go`): 100 x (1 - |f_cpu - f_mem| / 2)."""
    fractions = []
    for resource in ("cpu", "memory"):
        capacity = node.allocatable.get(resource, 0)
        if capacity:
            fractions.append(min((node.requested.get(resource, 0) + pod.requests.get(resource, 0)) / capacity, 1.0))
    deviation = abs(fractions[0] - fractions[1]) / 2 if len(fractions) == 2 else 0.0
    return int((1 - deviation) * MAX_NODE_SCORE)
