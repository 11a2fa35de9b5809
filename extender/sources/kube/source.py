"""The live-cluster source: informers that fill the cache, the API binder, Events, and leader election, and the
readiness and health they add up to.

Ready means: the first full list of Nodes, Pods, (unless quotas are off) ResourceQuotas and the PodGroups of
each CRD the cluster serves is in the cache and, with leader election on, this replica leads *and* has relisted
pods since it took the lease. Without the quotas' list a burst could be placed past a quota, and without a
PodGroup's a member of its job could be placed as any pod, part of a job: a replica that may not list them says
so and is not ready. A PodGroup CRD that is not installed answers its list with 404, which is an answer: it holds
nothing back (`podgroups.py`). The relist matters: the previous leader's last
binds may still be on their way through our watch, and a new leader that binds before it sees them could give
the same memory twice. A list is a consistent read of everything written before it.

Healthy means: every loop (the informers, the elector) is still running. They retry every API failure
themselves, so a stopped loop is a bug, and the liveness probe should restart the process.

The elector runs on a thread and event loop of its own (`leader_thread.py`), so a renewal never waits behind
the handlers; everything else here runs on the serving loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from extender.core import objects
from extender.core.binding import BindRequest
from extender.core.cache import Cache
from extender.core.groups import API_VERSIONS, GroupKey, Scheme
from extender.core.objects import Raw, as_object
from extender.core.pods import TERMINAL_PHASES, PodRecord
from extender.core.protocols import DeviceProtocol
from extender.core.quota.book import Quotas
from extender.core.quota.limits import Quota
from extender.core.recheck import TIMEOUT, Answer
from extender.core.requeue import RECOVERY, WATCH_LAG
from extender.settings import LeaseTimings
from extender.sources.kube.binder import EventRecorder, KubeBinder
from extender.sources.kube.client import KubeClient, KubeError, NotFound, pod_path
from extender.sources.kube.informer import NODES, Informer, Kind, WatchOptions, pods_kind
from extender.sources.kube.leader_thread import LeaderThread
from extender.sources.kube.nodelock import NodeLocker
from extender.sources.kube.podgroups import PodGroupFeed, podgroups_kind, waiting
from extender.sources.kube.writes import LABEL_PERIOD, LABEL_REMOVAL_FLOOR, LeaderLabel, Requeuer

log = logging.getLogger(__name__)

Count = tuple[str, dict[str, str], float]
"""One figure for /metrics: which (a key of `service.metrics.SOURCE_FAMILIES`), its labels, its value."""


@dataclass(frozen=True, slots=True)
class KubeOptions:
    identity: str
    """This replica's name in the Lease and in Events (hostname and a random suffix by default)."""
    watch: WatchOptions = field(default_factory=WatchOptions)
    leader_elect: bool = True
    lease_namespace: str = "default"
    lease_name: str = "gpu-extender"
    timings: LeaseTimings = field(default_factory=LeaseTimings)
    pod_name: str = ""
    """This replica's pod (in `lease_namespace`), labelled `LEADER_LABEL` while it leads; "" for none."""
    resource_quotas: bool = True
    pod_groups: bool = True
    """Watch both PodGroup CRDs (`podgroups.py`); False: none, and pods naming a PodGroup are placed as any pod."""
    """Watch ResourceQuotas and hold pods to their GPU keys (`core/quota/`)."""


Unhealthy = tuple[str, frozenset[int]] | None
"""What one ConfigMap says: the node it names and the GPU indexes it lists; None for other ConfigMaps."""


def configmaps_kind(namespace: str, protocol: DeviceProtocol) -> Kind[Unhealthy]:
    """The ConfigMaps of one namespace, each reduced, as soon as it is decoded, to the unhealthy GPUs it lists."""
    return Kind("configmaps", f"/api/v1/namespaces/{namespace}/configmaps", protocol.unhealthy_gpus)


def quotas_kind(quotas: Quotas) -> Kind[Quota]:
    """Every namespace's ResourceQuotas, each reduced, as soon as it is decoded, to its GPU keys."""
    return Kind("resourcequotas", "/api/v1/resourcequotas", quotas.read)


class KubeSource:
    """Mutable: its loops run from `start()` to `stop()`."""

    def __init__(self, client: KubeClient, cluster: Cache, quotas: Quotas, options: KubeOptions) -> None:
        self.client = client
        self.cluster = cluster
        self.book = quotas
        """The quota book the ResourceQuotas' watch feeds."""
        self.options = options
        self.recheck_timeout = TIMEOUT
        self.nodes = Informer(client, NODES, self._apply_node, self._replace_nodes, options.watch)
        self.pods = Informer(client, pods_kind(cluster.protocol), self._apply_pod, self._replace_pods, options.watch)
        namespace = cluster.protocol.unhealthy_namespace
        self.unhealthy = (
            Informer(
                client,
                configmaps_kind(namespace, cluster.protocol),
                self._apply_unhealthy,
                self._replace_unhealthy,
                options.watch,
            )
            if namespace
            else None
        )
        """Operators' lists of unhealthy GPUs (gpushare's ConfigMaps). Not waited for by readiness: where the
        list is refused (RBAC) or slow, pods are still placed, and its failures are counted and logged."""
        self.quotas = (
            Informer(client, quotas_kind(quotas), self._apply_quota, self._replace_quotas, options.watch)
            if options.resource_quotas
            else None
        )
        """ResourceQuotas' GPU keys. Waited for by readiness: without them a burst could pass a quota."""
        self.podgroups: dict[Scheme, Informer[Raw]] = {}
        """The PodGroups of each CRD (`podgroups.py`). Waited for by readiness where the CRD is installed: a member
        filtered before its PodGroup is known would be placed as any pod."""
        for scheme in API_VERSIONS if options.pod_groups else ():
            feed = PodGroupFeed(cluster, scheme, self._podgroups_changed)
            kind = podgroups_kind(scheme)
            informer = Informer(client, kind, feed.apply, feed.replace, options.watch, absent=feed.absent)
            self.podgroups[scheme] = informer
        self.on_quotas: Callable[[str], None] | None = None
        """Told when a namespace's quota limits changed (kube-scheduler is not): the namespace."""
        self.on_freed: Callable[[list[str], float], None] | None = None
        """Told when the API's news frees room on nodes (a pod deleted or finished; a node added or changed): the
        nodes, and since when a refusal there may have been the cache's lag (Unix time; see `core/requeue.py`)."""
        lock = cluster.protocol.node_lock
        locker = (
            NodeLocker(
                client, lock, cluster.lock_timeout, on_change=cluster.take_lock, time_left=self.binding_time_left
            )
            if lock
            else None
        )
        self.binder = KubeBinder(client, observe=cluster.apply_pod, locker=locker)
        self.events = EventRecorder(client, options.identity)
        self.elector = (
            LeaderThread(
                client.twin,
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
        """The pods list (by `Informer.lists_started`) a new leader waits for before it is ready."""
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self.label = (
            LeaderLabel(client, options.lease_namespace, options.pod_name, self.ready, LABEL_PERIOD)
            if options.pod_name and self.elector is not None
            else None
        )
        self.requeuer = Requeuer(client, options.lease_namespace, options.pod_name) if options.pod_name else None

    # -- what the informers apply, and the room it frees (`core/requeue.py`)

    def _late_since(self, informer: Informer[Any]) -> float:
        """Since when what the informer applies now may have been news to kube-scheduler already: `WATCH_LAG`
        before now, or before the start of a gap in the watch it is still catching up on."""
        now = time.time()
        began = informer.late_since(now, RECOVERY)
        return min(now, began if began is not None else now) - WATCH_LAG

    def _freed(self, nodes: list[str], informer: Informer[Any]) -> None:
        if self.on_freed is not None and nodes:
            self.on_freed(nodes, self._late_since(informer))

    def _apply_pod(self, record: PodRecord, deleted: bool) -> None:
        held = self.cluster.hold_of(record.uid) if deleted or record.finished else None
        self.cluster.apply_record(record, deleted)
        if held is not None:
            self._freed([held.allocation.node], self.pods)

    def _replace_pods(self, records: list[PodRecord]) -> None:
        used = {name: state.used_total for name, state in self.cluster.nodes.items()}
        self.cluster.replace_records(records)
        freed = [name for name, state in self.cluster.nodes.items() if state.used_total < used.get(name, 0)]
        self._freed(freed, self.pods)

    def _apply_unhealthy(self, found: Unhealthy, deleted: bool) -> None:
        if found is None:
            return
        node, indexes = found
        self.cluster.apply_unhealthy(node, None if deleted else indexes)
        if self.unhealthy is not None:  # always: only the unhealthy informer calls this
            self._freed([node], self.unhealthy)

    def _replace_unhealthy(self, listed: list[Unhealthy]) -> None:
        self.cluster.replace_unhealthy(dict(found for found in listed if found is not None))

    def _apply_quota(self, quota: Quota, deleted: bool) -> None:
        if self.book.apply(quota, deleted) and self.on_quotas is not None:
            self.on_quotas(quota.namespace)

    def _replace_quotas(self, quotas: list[Quota]) -> None:
        for namespace in self.book.replace(quotas):
            if self.on_quotas is not None:
                self.on_quotas(namespace)

    def _podgroups_changed(self, keys: list[GroupKey]) -> None:
        """PodGroups appeared, went or changed their minimum: members we refused may be placed now, and
        kube-scheduler, which watches no PodGroup, is asked to retry them (when the cache knows one not bound)."""
        key = waiting(self.cluster, keys)
        if key is not None:
            self.requeue(f"{key.scheme} {key} changed while members of it wait")

    def _apply_node(self, node: Raw, deleted: bool) -> None:
        self.cluster.apply_node(node, deleted)
        if not deleted:
            self._freed([objects.name(node)], self.nodes)

    def _replace_nodes(self, nodes: list[Raw]) -> None:
        self.cluster.replace_nodes(nodes)
        self._freed([objects.name(node) for node in nodes], self.nodes)

    def requeue(self, reason: str) -> None:
        """Ask kube-scheduler to retry the pods an extender rejected (needs `pod_name`; see `Requeuer`)."""
        if self.requeuer is not None:
            self.requeuer.request(reason)

    def _leadership(self, leading: bool) -> None:
        if leading:
            self._relisted_at = self.pods.request_relist()
        if self.label is not None:
            self.label.wake.set()

    def _listed(self) -> tuple[Informer[Any], ...]:
        """The informers whose first list (or, for a PodGroup CRD, its 404) readiness waits for."""
        return (self.nodes, self.pods, *((self.quotas,) if self.quotas is not None else ()), *self.podgroups.values())

    def is_synced(self) -> bool:
        """The first lists of nodes, pods, quotas and PodGroups are in the cache: this replica could take over
        (/synced)."""
        return all(informer.synced.is_set() for informer in self._listed())

    def why_not_ready(self) -> str | None:
        """Why this replica is not ready (None when it is), for /readyz and refused verbs."""
        if not self.is_synced():
            quotas = self.quotas
            if quotas is not None and not quotas.synced.is_set() and quotas.failures:
                return (
                    f"extender is not ready: it cannot list ResourceQuotas ({quotas.last_error}); grant it "
                    "resourcequotas list and watch (manifests/base/rbac.yaml), or set resource_quotas to false"
                )
            for scheme, informer in self.podgroups.items():
                if not informer.synced.is_set() and informer.failures:
                    group = API_VERSIONS[scheme].split("/")[0]
                    return (
                        f"extender is not ready: it cannot list {scheme}s ({informer.last_error}); grant it podgroups "
                        f"list and watch in API group {group} (manifests/base/rbac.yaml), or set pod_groups to false"
                    )
            return "extender is not ready: its cache has not been filled yet (waiting for the first lists)"
        elector = self.elector
        if elector is not None:
            if not elector.leading:
                holder = elector.holder or "no one yet"
                return f"extender is not the leader: lease {elector.namespace}/{elector.name} is held by {holder}"
            if self.pods.last_list_started < self._relisted_at:
                return "extender is the new leader and is relisting pods before it binds"
        return None

    def binding_time_left(self) -> float | None:
        """Seconds this replica surely stays leader (None without leader election)."""
        return self.elector.time_left() if self.elector is not None else None

    def cache_current(self) -> bool:
        """The pods informer follows the API (its last list or watch worked)."""
        return self.pods.current

    def ready(self) -> bool:
        return not self.why_not_ready()

    def bind_failed(self, request: BindRequest, error: str) -> None:
        """A bind failed: a Warning Event on the pod says why."""
        self.events.failed_bind(request, error)

    async def recheck(self, pods: list[PodRecord]) -> Answer:
        """Read each pod from the API (concurrently, `recheck_timeout` seconds in all); forget in the cache those
        the API no longer has, has under another UID (deleted and created again), or shows finished. The watch
        brings the same news a little later; until then the cache would count memory that is free
        (`core/recheck.py`)."""

        async def gone(record: PodRecord) -> bool | None:
            """True: gone; False: still there; None: no answer (logged)."""
            try:
                pod = await self.client.get(pod_path(record.namespace, record.name))
            except NotFound:
                return True
            except KubeError as error:
                log.info("rechecking pod %s: %s", record.key, error)
                return None
            except Exception:  # a bug; the filter still gets the cache's answer rather than a 500
                log.warning("rechecking pod %s failed unexpectedly", record.key, exc_info=True)
                return None
            if not isinstance(pod, dict):
                log.info("rechecking pod %s: the API answered %r, not a pod", record.key, type(pod).__name__)
                return None
            return objects.uid(pod) != record.uid or as_object(pod.get("status")).get("phase") in TERMINAL_PHASES

        reads = [asyncio.ensure_future(gone(record)) for record in pods]
        try:
            done, late = await asyncio.wait(reads, timeout=self.recheck_timeout) if reads else (set(), set())
        finally:
            for read in reads:
                read.cancel()
            await asyncio.gather(*reads, return_exceptions=True)
        found, unanswered = 0, len(late)
        for record, read in zip(pods, reads, strict=True):
            if read not in done:
                continue
            answer = read.result()
            if answer is None:
                unanswered += 1
            elif answer:
                self.cluster.forget_pod(record.uid)
                self._freed([record.node_name], self.pods)
                found += 1
        return Answer(found, unanswered)

    def counts(self) -> Iterator[Count]:
        """Its counters and state, for /metrics (`service/metrics.py` names and describes each)."""
        optional = (self.unhealthy, self.quotas)
        informers = (self.nodes, self.pods, *(informer for informer in optional if informer is not None))
        for informer in (*informers, *self.podgroups.values()):
            kind = {"kind": informer.kind.name}
            yield "watch_events", kind, informer.events
            yield "lists", kind, informer.lists
            yield "api_failures", kind, informer.failures
            yield "cache_synced", kind, float(informer.synced.is_set())
        if self.elector is not None:
            yield "leader", {}, float(self.elector.leading)
        if self.requeuer is not None:
            yield "requeue_requests", {}, self.requeuer.written
        yield "bind_failure_events", {}, self.events.recorded

    def stopped_loop(self) -> str | None:
        """Which loop stopped and why (None while every loop runs)."""
        for name, task in self._tasks.items():
            if task.done():
                error = None if task.cancelled() else task.exception()
                return f"the {name} loop stopped" + (f": {type(error).__name__}: {error}" if error else "")
        return None

    async def start(self) -> None:
        loops = {"nodes informer": self.nodes.run(), "pods informer": self.pods.run()}
        if self.unhealthy is not None:
            loops["unhealthy GPUs informer"] = self.unhealthy.run()
        if self.quotas is not None:
            loops["quotas informer"] = self.quotas.run()
        for scheme, informer in self.podgroups.items():
            loops[f"{scheme}s informer"] = informer.run()
        if self.elector is not None:
            loops["leader election"] = self.elector.run()
        if self.label is not None:
            loops["leader label"] = self.label.run()
        if self.requeuer is not None:
            loops["requeue"] = self.requeuer.run()
        for name, loop in loops.items():
            self._tasks[name] = asyncio.create_task(loop, name=name)
            self._tasks[name].add_done_callback(self._stopped)

    def _stopped(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("the %s loop stopped", task.get_name(), exc_info=task.exception())

    async def synced(self) -> None:
        """Wait until the first lists of nodes, pods, quotas and PodGroups are in the cache."""
        await asyncio.gather(*(informer.synced.wait() for informer in self._listed()))

    async def stop(self) -> None:
        """Give the lease up first (a standby takes over at once), then stop the informers."""
        order = [
            "leader label",
            "requeue",
            "leader election",
            "nodes informer",
            "pods informer",
            "unhealthy GPUs informer",
            "quotas informer",
            *(f"{scheme}s informer" for scheme in self.podgroups),
        ]
        for name in order:
            task = self._tasks.get(name)
            if task is not None and not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        self._tasks.clear()
        if self.label is not None:  # no longer leading: the Service must stop sending kube-scheduler here
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(self.options.timings.retry_period * 2, LABEL_REMOVAL_FLOOR)):
                    await self.label.reconcile(False)
        await self.events.close()
