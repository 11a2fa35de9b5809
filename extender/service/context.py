"""What the HTTP handlers share: the `Service`, and the `Source` protocol through which they see the world.

A `Source` is whatever feeds the cache and carries binds out: a file of objects (`sources/file.py`) or the
API server (`sources/kube/source.py`). The handlers ask it whether this replica may answer at all (synced,
leading), whether the loops that feed the cache still run, and hand it the binds; they never know which one
it is. Built once by `app.py` (or a test) and passed in.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

from extender.core.binding import Binder, BindRequest, RecentPods
from extender.core.cache import Cache
from extender.core.ledger import Ledger
from extender.core.placement.placer import Placer
from extender.core.quota.book import Quotas
from extender.core.recheck import Preemptions, Recheck
from extender.core.requeue import Requeue
from extender.service.limits import Limits
from extender.service.metrics import Count, Metrics
from extender.settings import HEALTH_MAX_CONNECTIONS


class Source(Protocol):
    """What the service needs of the source that feeds its cache."""

    @property
    def binder(self) -> Binder:
        """Writes a bind (the allocation's annotations and the binding) where the pod lives."""

    @property
    def recheck(self) -> Recheck | None:
        """Reads pods from the API before a preemptor is refused a node it may have freed (`core/recheck.py`);
        None where the cache is the only truth."""

    def is_synced(self) -> bool:
        """The cache holds a full listing: this replica could serve (/synced)."""

    def why_not_ready(self) -> str | None:
        """Why this replica may not answer the verbs now (not synced, not the leader); None when it may."""

    def stopped_loop(self) -> str | None:
        """Which of the loops feeding the cache stopped, and why; None while all run (/healthz)."""

    def cache_current(self) -> bool:
        """False while the watch is failing: bound reservations are then not expired (`Ledger.expire`)."""

    def binding_time_left(self) -> float | None:
        """Seconds this replica surely may still bind (its lease's renew deadline); None: no limit."""

    def bind_failed(self, request: BindRequest, error: str) -> None:
        """Told of every bind that failed (the API source records an Event on the pod)."""

    def counts(self) -> Iterable[Count]:
        """What it counts (watch events, lists, API failures, leadership), read at every scrape of /metrics."""


@dataclass(slots=True)
class Service:
    """Everything the handlers share; built once by the caller (`app.py`, tests) and passed in."""

    cache: Cache
    ledger: Ledger
    placer: Placer
    """Decides where pods go and on which GPUs (`core/placement/`)."""
    quotas: Quotas
    """The ResourceQuotas' GPU limits and what each namespace holds (`core/quota/`)."""
    source: Source
    requeue: Requeue
    """Decides when to ask kube-scheduler to retry the pods the filter refused (`core/requeue.py`)."""
    metrics: Metrics = field(default_factory=Metrics)
    recent: RecentPods = field(default_factory=RecentPods)
    preemptions: Preemptions = field(default_factory=Preemptions)
    expiry_interval: float = 5.0
    http_timeout: float = 5.0
    """Seconds kube-scheduler waits for a reply: a bind starts no write it could not finish in them (`Guard`)."""
    max_body_bytes: int = 32 * 1024 * 1024
    limits: Limits = field(default_factory=Limits)
    """Deadlines and caps of the verbs' listener (`limits.py`)."""
    health_limits: Limits = field(default_factory=lambda: Limits(max_connections=HEALTH_MAX_CONNECTIONS))
    """Those of the plain-HTTP health listener: fewer connections (probes and Prometheus need a few)."""

    def __post_init__(self) -> None:
        self.metrics.add_source(self.source.counts)

    def ready(self) -> bool:
        return not self.source.why_not_ready()
