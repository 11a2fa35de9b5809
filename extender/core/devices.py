"""The model every device protocol translates into: GPUs a node offers, and what a pod asks of them.

A GPU (`Device`) has memory, and where its device plugin enforces them, compute (`cores`, 100 = the whole
card) and a number of pods it may run at once (`slots`); 0 means the plugin does not limit that dimension
(the gpushare plugin limits memory only). A pod's `Demand` is one `Request` per container that asks for GPUs
(or one for the whole pod, for gpushare): how many distinct GPUs, how much memory on each (or a percentage of
each GPU's memory), how much compute on each. `Selectors` narrow which GPUs may serve it, and a pod may ask
for its own placement strategies.

The placement policy (`placement/`), the ledger and the reasons work in these terms alone: no annotation key, no
resource name. Protocols (`protocols/`) build them from the objects.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from extender.core.mig import MODE as MIG_MODE
from extender.core.mig import MigProfile

WHOLE_GPU = 100
"""Compute of a whole card (HAMi's devcore without core scaling)."""


def ceil_div(amount: int, parts: int) -> int:
    """`amount / parts` rounded up, in integers (a float would overflow on a huge quantity)."""
    return -(-amount // parts)


@dataclass(frozen=True, slots=True)
class Device:
    """One GPU: its index as the device plugin numbers it, its memory, and what else its plugin tracks."""

    index: int
    capacity: int
    """Memory, in the protocol's unit."""
    healthy: bool = True
    cores: int = 0
    """Compute, 100 for the whole card (HAMi's devcore); 0: not tracked."""
    slots: int = 0
    """Most pods (container uses) at once (HAMi's split count); 0: no limit."""
    model: str = ""
    uuid: str = ""
    numa: int = 0
    mode: str = ""
    """How its plugin shares it (HAMi: `hami-core`, `mig`, `mps`)."""
    cordoned: bool = False
    """An operator keeps new pods off it; those running stay."""
    profiles: tuple[MigProfile, ...] = ()
    """In MIG mode: the profiles an instance may be made of, with their placements (`core/mig.py`)."""
    links: tuple[tuple[str, int], ...] = ()
    """How well it is linked to each other GPU of the node, by UUID (HAMi's pair scores: 100 an NVLink)."""

    def link(self, other: Device) -> int:
        """Its pair score to `other` (0: not measured)."""
        for uuid, score in self.links:
            if uuid == other.uuid:
                return score
        return 0

    @property
    def mig(self) -> bool:
        """Cut into MIG instances: each container gets an instance of a profile, not a share (`core/mig.py`)."""
        return self.mode == MIG_MODE

    @property
    def usable(self) -> bool:
        """May take new pods at all (healthy, not cordoned)."""
        return self.healthy and not self.cordoned


@dataclass(frozen=True, slots=True)
class NodeDevices:
    """The devices of a node, and why there are none when there are none."""

    devices: tuple[Device, ...]
    unreadable: str = ""
    """Non-empty when the node advertises GPUs we could not read: shown in /inspect and in filter reasons."""
    lock: NodeLock | None = None
    """The device plugin's lock on the node, for protocols that have one (HAMi)."""


@dataclass(frozen=True, slots=True)
class NodeLock:
    """A node held for one pod until its device plugin has allocated it (HAMi's `hami.io/mutex.lock`)."""

    since: float
    """Unix seconds."""
    pod: str
    """`namespace/name` of the pod it is held for ("" for a lock that names none)."""


class Strategy(enum.StrEnum):
    BINPACK = "binpack"
    """Fill the fullest device (or node) that still fits: keeps whole GPUs free for big pods."""
    SPREAD = "spread"
    """Use the emptiest: spreads load and memory pressure."""


@dataclass(frozen=True, slots=True)
class Selectors:
    """Which GPUs may serve a pod (HAMi's pod annotations); the default lets every GPU."""

    use_models: tuple[str, ...] = ()
    """Upper-cased substrings, one of which the GPU's model must contain (empty: any)."""
    avoid_models: tuple[str, ...] = ()
    use_uuids: tuple[str, ...] = ()
    """Exact UUIDs, one of which the GPU must have (empty: any)."""
    avoid_uuids: tuple[str, ...] = ()
    modes: str | None = None
    """The GPU's sharing mode must be a substring of this (HAMi's `nvidia.com/vgpu-mode`; None: any). An empty one
    admits only GPUs registered without a mode, as HAMi's `strings.Contains` does."""
    numa_bind: bool = False
    """All GPUs of one container on one NUMA node."""
    exclusive: bool = False
    """Only GPUs no pod uses (HAMi's `mutex` GPU policy)."""
    topology: bool = False
    """Several GPUs: the best-linked set; one: the GPU least linked to the others (HAMi's `topology-aware`)."""
    order: tuple[str, ...] = ()
    """The GPUs' order as a chain of keys, `binpack`, `spread`, `numa` (HAMi's comma list); empty: the
    strategy's."""
    weights: tuple[int, int, int] = (1, 1, 1)
    """How much slots, compute and memory count in a GPU's fill, by which binpack and spread order GPUs."""

    def admits(self, device: Device) -> bool:
        model = device.model.upper()
        if self.use_models and not any(wanted in model for wanted in self.use_models):
            return False
        if any(avoided in model for avoided in self.avoid_models):
            return False
        if self.use_uuids and device.uuid not in self.use_uuids:
            return False
        if self.modes is not None and device.mode not in self.modes:
            return False
        return device.uuid not in self.avoid_uuids

    @property
    def any(self) -> bool:
        return self == ANY_GPU


ANY_GPU = Selectors()


@dataclass(frozen=True, slots=True)
class Request:
    """What one container (or, for gpushare, the whole pod) asks: `devices` distinct GPUs with `memory` on each
    (or, when `percent` is set, that share of each GPU's memory) and `cores` on each."""

    devices: int
    memory: int = 0
    percent: int = 0
    """% of each chosen GPU's memory, used when `memory` is 0 (HAMi's gpumem-percentage)."""
    cores: int = 0
    """Compute on each GPU, at most 100 (the protocols clamp it where they build the request)."""
    init: bool = False
    """An init container: it runs before the others, so it counts at its peak, not added to them."""

    def memory_on(self, device: Device) -> int:
        """The memory this request takes on `device`."""
        if self.memory or not self.percent:
            return self.memory
        return device.capacity * min(self.percent, 100) // 100


@dataclass(frozen=True, slots=True)
class Demand:
    """What a pod asks of one node.

    `Demand(memory, devices)` is gpushare's: `devices` GPUs with `per_device` memory on each. A protocol that
    knows more (compute, percentages, several containers, selectors) fills the other fields; such a demand
    is judged by the general fit (`placement/fit.py`), a plain one by the node summaries alone.
    """

    memory: int
    """Total GPU memory, as the device plugin and kubelet account it (for `containers`: their sum)."""
    devices: int = 1
    cores: int = 0
    """Compute on each GPU (single request)."""
    percent: int = 0
    """% of each GPU's memory (single request; `memory` is then 0)."""
    containers: tuple[Request, ...] = ()
    """One request per GPU container, init containers first; empty: the single request above."""
    selectors: Selectors = ANY_GPU
    node_strategy: Strategy | None = None
    """The pod's own choice of node ordering (None: the configured one)."""
    device_strategy: Strategy | None = None
    per_device: int = field(init=False, compare=False, repr=False)
    """Memory needed on each device; rounded up so a split never gives less than asked. Stored, not a
    property: the filter reads it once per request and the policy's caches key on it."""
    plain: bool = field(init=False, compare=False, repr=False)
    """One request of memory alone, any GPU, no choices of its own: the node summaries answer it."""
    key: str = field(init=False, compare=False, repr=False)
    """Names the demand in memos of answers (everything an answer depends on)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "per_device", ceil_div(self.memory, self.devices) if self.devices else 0)
        plain = (
            not self.cores
            and not self.percent
            and not self.containers
            and self.selectors.any
            and self.node_strategy is None
            and self.device_strategy is None
        )
        object.__setattr__(self, "plain", plain)
        key = f"{self.per_device}:{self.devices}" if plain else repr(self)
        object.__setattr__(self, "key", key)

    @property
    def is_zero(self) -> bool:
        return self.memory == 0 and not self.percent and not self.cores and not self.containers

    @property
    def requests(self) -> tuple[Request, ...]:
        """One request per GPU container, init containers first."""
        if self.containers:
            return self.containers
        return (Request(self.devices, self.per_device, self.percent, self.cores),)


NO_DEMAND = Demand(memory=0, devices=1)
