"""What a pod holds on a node, and the one state machine of a hold (DESIGN §3).

    ASSUMED ──its bind comes to that node, where it still fits: taken as decided──▶ RESERVED
        ├──its bind comes otherwise: released, and decided again──▶ RESERVED
        └──no bind within ASSUMED_TTL, the pod filtered again, or gone: released
    GROUPED ──its bind comes to the node planned for it: taken as decided──▶ RESERVED
        └──its job's hold expires, a member's bind fails or a member is gone: released with the job's others
    RESERVED ──binding accepted──▶ BOUND ──watch shows the pod──▶ OBSERVED
        │  └──binding failed, may have landed──▶ UNCERTAIN ──watch shows the pod──▶ OBSERVED
        └──failed, expired (TTL) or pod gone: released (the hold is removed)

A hold is ASSUMED when a filter passed its pod one node alone (`assume.py`): kube-scheduler will bind it there,
and until it does the next filters must judge that node as taken, or every pod of a burst is sent to the same
best node before the first bind lands (kube-scheduler tells an extender nothing of what it assumed). Nothing is
written for it; it only counts.

A hold is GROUPED when the pod is a member of a job that starts whole (`core/jobs.py`): its filter, or another
member's, planned every member at once and the ledger holds all their GPUs together (`Ledger.reserve_group`).
Nothing is written for it either; it counts as a reservation does, so no other pod can take those GPUs.

A hold is RESERVED from the moment the ledger records a decision until its binding is answered; BOUND once
the API accepted the binding (only its confirmation by the watch is missing); UNCERTAIN when the binding
failed in a way that may have landed all the same (a timeout, a dropped connection), kept until the watch or
the TTL decides; OBSERVED once the API shows the pod bound with its allocation: from then on the API is the
record and only the pod's deletion or end frees it. A pod found annotated but not bound (a decision made
before a restart) is RESERVED again, counted from its assume time.

The ledger (`ledger.py`) makes every transition out of RESERVED; the cache (`cache.py`) makes a hold OBSERVED
or removes it when the API says so. Everything else (metrics, /inspect, the bind procedure) reads `state`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace

from extender.core.mig import MigInstance


@dataclass(frozen=True, slots=True)
class Grant:
    """One GPU given to one container: its index, and the memory and compute taken on it."""

    index: int
    memory: int
    cores: int = 0
    uuid: str = ""
    """The GPU's UUID where the protocol names GPUs by it (HAMi); `index` is then -1 until the cache resolves it
    against the node's devices."""
    instance: MigInstance | None = None
    """On a MIG GPU: the instance the container gets (`memory` and `cores` are then its profile's)."""


@dataclass(frozen=True, slots=True)
class Use:
    """All an allocation takes of one GPU: memory, compute, and slots (container uses, for split limits)."""

    index: int
    memory: int
    cores: int = 0
    slots: int = 1
    uuid: str = ""
    instances: tuple[MigInstance, ...] = ()
    """The MIG instances it holds on the GPU (every container's: each instance lives as long as the pod)."""


@dataclass(frozen=True, slots=True)
class Allocation:
    """The GPUs given to one pod on one node: per GPU container, its grants (init containers first).

    `uses` is what the pod takes of each GPU, the way its device plugin accounts it: an init container runs
    before the others, so on each GPU the init containers count at their peak and the app containers add up,
    and the pod takes the larger of the two, field by field (HAMi's `CollapseInitContainerUsage`, by container
    rather than by position). Everything that counts memory (the cache's summaries, the ledger, preemption)
    reads `uses`. A MIG instance an app container (or a later init container) takes as an init container took
    it, the same profile at the same placement, is one instance, held once: HAMi's device plugin makes it once
    and gives it to both (`EnsureAllocation`, plugin/migmgr.go:339-343 at v2.10.0), the init container having
    ended when the next runs.
    """

    pod_uid: str
    pod: str
    """`namespace/name`, for people."""
    node: str
    containers: tuple[tuple[Grant, ...], ...]
    init_containers: int = 0
    """How many of `containers` (the first ones) are init containers."""
    uses: tuple[Use, ...] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "uses", _collapse(self.containers, self.init_containers))

    @classmethod
    def uniform(cls, pod_uid: str, pod: str, node: str, indexes: tuple[int, ...], per_device: int) -> Allocation:
        """One container's worth: `per_device` memory on each of `indexes` (gpushare's only form)."""
        return cls(pod_uid, pod, node, (tuple(Grant(index, per_device) for index in indexes),))

    @property
    def indexes(self) -> tuple[int, ...]:
        """Every GPU it holds memory on, by index."""
        return tuple(use.index for use in self.uses)

    @property
    def resolved(self) -> bool:
        """Every GPU known by index (a HAMi allocation read back names GPUs by UUID until resolved)."""
        return all(use.index >= 0 for use in self.uses)

    def resolve(self, index_of: dict[str, int]) -> Allocation:
        """The same allocation with GPUs named by UUID given their index on the node, where known."""
        if self.resolved:
            return self
        containers = tuple(
            tuple(replace(grant, index=index_of.get(grant.uuid, -1)) if grant.index < 0 else grant for grant in grants)
            for grants in self.containers
        )
        return replace(self, containers=containers)

    @property
    def memory(self) -> int:
        return sum(use.memory for use in self.uses)

    def use_of(self, index: int) -> Use | None:
        for use in self.uses:
            if use.index == index:
                return use
        return None


def _collapse(containers: tuple[tuple[Grant, ...], ...], init_containers: int) -> tuple[Use, ...]:
    if (
        len(containers) == 1
        and not init_containers
        and len({grant.index for grant in containers[0]}) == len(containers[0])
    ):  # nearly always: one container, each GPU once
        return tuple(
            Use(grant.index, grant.memory, grant.cores, 1, grant.uuid, (grant.instance,) if grant.instance else ())
            for grant in containers[0]
        )
    peak: dict[tuple[int, str], list[int]] = {}
    total: dict[tuple[int, str], list[int]] = {}
    instances: dict[tuple[int, str], list[MigInstance]] = {}
    initial: dict[tuple[int, str], list[MigInstance]] = {}
    """The instances init containers took, each while no app container has taken it too."""
    for number, grants in enumerate(containers):
        for grant in grants:
            key = (grant.index, grant.uuid if grant.index < 0 else "")
            if grant.instance is not None:
                shared = initial.setdefault(key, [])
                if grant.instance not in shared:
                    instances.setdefault(key, []).append(grant.instance)
                    if number < init_containers:
                        shared.append(grant.instance)
                elif number >= init_containers:
                    shared.remove(grant.instance)
            if number < init_containers:
                memory, cores, _ = peak.get(key, [0, 0, 0])
                peak[key] = [max(memory, grant.memory), max(cores, grant.cores), 1]
            else:
                entry = total.setdefault(key, [0, 0, 0])
                entry[0] += grant.memory
                entry[1] += grant.cores
                entry[2] += 1
    uuids = {grant.index: grant.uuid for grants in containers for grant in grants}
    uses = []
    for key in sorted(peak.keys() | total.keys()):
        first, second = peak.get(key, [0, 0, 0]), total.get(key, [0, 0, 0])
        uuid = key[1] or uuids.get(key[0], "")
        memory, cores, slots = max(first[0], second[0]), max(first[1], second[1]), max(first[2], second[2], 1)
        uses.append(Use(key[0], memory, cores, slots, uuid, tuple(instances.get(key, ()))))
    return tuple(uses)


class HoldState(enum.Enum):
    ASSUMED = "assumed"
    """A filter passed the pod this node alone; no bind has come yet (nothing written)."""
    GROUPED = "grouped"
    """Held for a member of a job placed whole, with the other members' holds; no bind has come yet (nothing
    written)."""
    RESERVED = "reserved"
    """Decided by this extender; the binding is not answered yet."""
    BOUND = "bound"
    """The API accepted the binding; the watch has not shown it yet."""
    UNCERTAIN = "uncertain"
    """The binding failed in a way that may have landed all the same."""
    OBSERVED = "observed"
    """The API shows the pod bound with this allocation."""


@dataclass(frozen=True, slots=True)
class Hold:
    """An allocation as the cache counts it, and where it stands."""

    allocation: Allocation
    state: HoldState
    since: float
    """Unix seconds: the assume time (when the decision was made)."""
    state_since: float | None = None
    """When it entered its state, by the ledger's clock, where that matters (UNCERTAIN: the binding may land
    within `ledger.UNCERTAIN_WINDOW` of it)."""
    chosen_by: int | None = None
    """ASSUMED only: the build of the typical shapes it was chosen by (`Ledger.assume`, `Ledger.take_assumed`)."""

    @property
    def observed(self) -> bool:
        return self.state is HoldState.OBSERVED

    def entering(self, state: HoldState, at: float | None = None) -> Hold:
        """The same allocation in another state."""
        return replace(self, state=state, state_since=at)
