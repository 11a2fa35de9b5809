"""The live-cluster source: informers that fill the cache, the API binder, Events, and leader election, and the
readiness and health they add up to.

Ready means: the first full list of both Nodes and Pods is in the cache and, with leader election on, this
replica leads *and* has relisted pods since it took the lease. The relist matters: the previous leader's last
binds may still be on their way through our watch, and a new leader that binds before it sees them could give
the same memory twice. A list is a consistent read of everything written before it.

Healthy means: every loop (the two informers, the elector) is still running. They retry every API failure
themselves, so a stopped loop is a bug, and the liveness probe should restart the process.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field

from extender.cluster import Cluster
from extender.metrics import Sample
from extender.sources.kube.binder import EventRecorder, KubeBinder
from extender.sources.kube.client import KubeClient
from extender.sources.kube.informer import NODES, Informer, WatchOptions, pods_kind
from extender.sources.kube.leader import LeaderElector, LeaseTimings

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class KubeOptions:
    identity: str
    """This replica's name in the Lease and in Events (hostname and a random suffix by default)."""
    watch: WatchOptions = field(default_factory=WatchOptions)
    leader_elect: bool = True
    lease_namespace: str = "default"
    lease_name: str = "gpu-extender"
    timings: LeaseTimings = field(default_factory=LeaseTimings)


class KubeSource:
    """Mutable: its loops run from `start()` to `stop()`."""

    def __init__(self, client: KubeClient, cluster: Cluster, options: KubeOptions) -> None:
        self.client = client
        self.options = options
        self.nodes = Informer(client, NODES, cluster.apply_node, cluster.replace_nodes, options.watch)
        self.pods = Informer(
            client, pods_kind(cluster.profile), cluster.apply_record, cluster.replace_records, options.watch
        )
        self.binder = KubeBinder(client, observe=cluster.apply_pod)
        self.events = EventRecorder(client, options.identity)
        self.elector = (
            LeaderElector(
                client,
                options.lease_namespace,
                options.lease_name,
                options.identity,
                options.timings,
                on_change=self._leadership,
            )
            if options.leader_elect
            else None
        )
        self._relisted_at = 0
        """The pods informer's `lists` count that a new leader waits for."""
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def _leadership(self, leading: bool) -> None:
        if leading:
            self._relisted_at = self.pods.request_relist()

    def why_not_ready(self) -> str:
        """Why this replica is not ready ("" when it is), for /readyz and refused verbs."""
        if not (self.nodes.synced.is_set() and self.pods.synced.is_set()):
            return "extender is not ready: its cache has not been filled yet (waiting for the first lists)"
        elector = self.elector
        if elector is not None:
            if not elector.leading:
                holder = elector.holder or "no one yet"
                return f"extender is not the leader: lease {elector.namespace}/{elector.name} is held by {holder}"
            if self.pods.last_list_started < self._relisted_at:
                return "extender is the new leader and is relisting pods before it binds"
        return ""

    def binding_time_left(self) -> float | None:
        """Seconds this replica surely stays leader (None without leader election)."""
        return self.elector.time_left() if self.elector is not None else None

    def cache_current(self) -> bool:
        """The pods informer follows the API (its last list or watch worked)."""
        return self.pods.current

    def ready(self) -> bool:
        return not self.why_not_ready()

    def samples(self) -> Iterator[Sample]:
        """Its counters, for /metrics."""
        for informer in (self.nodes, self.pods):
            kind = {"kind": informer.kind.name}
            yield Sample(
                "extender_watch_events_total", "Watch events applied to the cache.", "counter", informer.events, kind
            )
            yield Sample(
                "extender_lists_total",
                "Full lists applied (the first, then each relist).",
                "counter",
                informer.lists,
                kind,
            )
            yield Sample(
                "extender_api_failures_total",
                "List or watch failures, each retried after a backoff.",
                "counter",
                informer.failures,
                kind,
            )
            yield Sample(
                "extender_cache_synced",
                "1 once the first list is in the cache.",
                "gauge",
                float(informer.synced.is_set()),
                kind,
            )
        if self.elector is not None:
            yield Sample(
                "extender_leader", "1 while this replica holds the lease.", "gauge", float(self.elector.leading)
            )
        yield Sample(
            "extender_bind_failure_events_total",
            "Warning Events recorded for failed binds.",
            "counter",
            self.events.recorded,
        )

    def problem(self) -> str:
        """Which loop stopped and why ("" while every loop runs)."""
        for name, task in self._tasks.items():
            if task.done():
                error = None if task.cancelled() else task.exception()
                return f"the {name} loop stopped" + (f": {type(error).__name__}: {error}" if error else "")
        return ""

    async def start(self) -> None:
        loops = {"nodes informer": self.nodes.run(), "pods informer": self.pods.run()}
        if self.elector is not None:
            loops["leader election"] = self.elector.run()
        for name, loop in loops.items():
            self._tasks[name] = asyncio.create_task(loop, name=name)
            self._tasks[name].add_done_callback(self._stopped)

    def _stopped(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("the %s loop stopped", task.get_name(), exc_info=task.exception())

    async def synced(self) -> None:
        """Wait until the first lists of nodes and pods are in the cache."""
        await asyncio.gather(self.nodes.synced.wait(), self.pods.synced.wait())

    async def stop(self) -> None:
        """Give the lease up first (a standby takes over at once), then stop the informers."""
        order = ["leader election", "nodes informer", "pods informer"]
        for name in order:
            task = self._tasks.get(name)
            if task is not None and not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        self._tasks.clear()
        await self.events.close()
