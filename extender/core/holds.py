"""What a pod holds on a node, and the one state machine of a hold (DESIGN §3).

    RESERVED ──binding accepted──▶ BOUND ──watch shows the pod──▶ OBSERVED
        │  └──binding failed, may have landed──▶ UNCERTAIN ──watch shows the pod──▶ OBSERVED
        └──failed, expired (TTL) or pod gone: released (the hold is removed)

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
from dataclasses import dataclass, replace


@dataclass(frozen=True, slots=True)
class Allocation:
    """Device memory given to one pod on one node: `per_device` on each of `indexes`."""

    pod_uid: str
    pod: str
    """`namespace/name`, for people."""
    node: str
    indexes: tuple[int, ...]
    per_device: int

    @property
    def memory(self) -> int:
        return self.per_device * len(self.indexes)


class HoldState(enum.Enum):
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

    @property
    def observed(self) -> bool:
        return self.state is HoldState.OBSERVED

    def entering(self, state: HoldState, at: float | None = None) -> Hold:
        """The same allocation in another state."""
        return replace(self, state=state, state_since=at)
