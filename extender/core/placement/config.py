"""How placement is configured (`PolicyConfig`: which policy, how the filter narrows, the fill strategies and
weights) and what a pod asks of a node (`Ask`: its GPU demand, and the cpu and memory kube-scheduler counts).

Values only: the settings build one `PolicyConfig` (`Settings.policy`), every filter builds the pod's `Ask`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from extender.core.devices import Demand, Strategy
from extender.core.objects import Raw
from extender.core.resources import pod_request


class Policy(enum.StrEnum):
    """How nodes and GPUs are chosen: each value names one module of this package (`placer.POLICIES`)."""

    FRAGMENTATION = "fragmentation"
    """Where the GPU capacity left unusable for the pods the cluster runs grows least (`fragmentation.py`)."""
    FILL = "fill"
    """By fill, as `node_strategy` and `device_strategy` say (binpack or spread: `fill.py`)."""


class Narrowing(enum.StrEnum):
    """What the filter passes of the nodes that fit, under the fragmentation policy."""

    BEST = "best"
    """The one best node (ties broken by fill, then name): kube-scheduler then binds there without scoring."""
    TIES = "ties"
    """Every node as good as the best: kube-scheduler's own scores choose among them."""
    OFF = "off"
    """Every node that fits: the choice is left to the scores (ours 0-10 via prioritize, and kube-scheduler's)."""


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    """How to choose among nodes and devices that fit."""

    node_strategy: Strategy = Strategy.BINPACK
    device_strategy: Strategy = Strategy.BINPACK
    node_weight: int = 1
    """Weight of the node-level fill in a node's score."""
    device_weight: int = 1
    """Weight of the chosen devices' fill in a node's score."""
    policy: Policy = Policy.FRAGMENTATION
    narrowing: Narrowing = Narrowing.BEST
    tolerance: float = 0.0
    """GPUs of added fragmentation within which nodes count as good as the best (`narrowing` and scores)."""
    memo_key: str = field(init=False, compare=False, repr=False)
    """Names this configuration in the nodes' memos of scores (a str: its hash is computed once)."""

    def __post_init__(self) -> None:
        key = f"{self.node_strategy}:{self.device_strategy}:{self.node_weight}:{self.device_weight}:{self.policy}"
        object.__setattr__(self, "memo_key", key)

    def own_strategy(self, demand: Demand) -> bool:
        """Whether the pod asks its own strategy (HAMi's `hami.io/gpu-scheduler-policy` and
        `node-scheduler-policy`): it is then placed by fill, that way, whatever the policy."""
        return demand.node_strategy is not None or demand.device_strategy is not None

    def by_fragmentation(self, demand: Demand) -> bool:
        """Whether this demand is placed by fragmentation (a pod that asks its own strategy keeps it)."""
        return self.policy is Policy.FRAGMENTATION and not self.own_strategy(demand)


@dataclass(frozen=True, slots=True)
class Ask:
    """What a pod asks of a node: its GPU demand, and the cpu and memory kube-scheduler counts for it."""

    demand: Demand
    cpu: int = 0
    """Millicores."""
    memory: int = 0
    """Bytes."""

    @property
    def key(self) -> str:
        return f"{self.demand.key}:{self.cpu}:{self.memory}"


def ask_of(pod: Raw, demand: Demand) -> Ask:
    """The pod's ask, from its object (the request's, or the one remembered from its filter)."""
    return Ask(demand, pod_request(pod, "cpu", scale=3), pod_request(pod, "memory"))
