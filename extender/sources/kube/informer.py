"""Informers: keep the cache equal to the API's Nodes and Pods by list, then watch, then relist when told to.

One `Informer` per kind, the shape of client-go's reflector:
- **List** in pages (`limit`/`continue`), all pages one consistent snapshot; each page is reduced at once to
  the fields the cache reads (`slim`), so a 100,000-pod list never sits in memory whole. The snapshot then
  *replaces* the kind in the cache, so whatever was deleted while we were not watching is gone.
- **Watch** from the list's resourceVersion with `allowWatchBookmarks`, tracking the latest resourceVersion
  (bookmarks move it without a change). The server ends a watch after `timeoutSeconds` (jittered, as
  client-go does, so replicas do not renew in step); we watch again from where we were.
- **A quiet watch** (no byte for `WatchOptions.inactivity`) is ended by us and opened again at once from the
  same resourceVersion, logged at debug: the routine end of a watch, as the server's timeout is, not a
  failure. Silence is normal there: kube-apiserver sends a bookmark only with a resourceVersion newer than
  the one the watch began at (k8s.io/apiserver v0.34.1, pkg/storage/cacher/cache_watcher.go:535-540), and a
  resource that has not changed since has none, so nodes or ConfigMaps that nobody touches get no byte, not
  even before the timeout (measured on the e2e tier's v1.34.1, while Leases changed every 2 s; a watch whose
  resource changed once got a bookmark every 61 s, `defaultBookmarkFrequency`, cacher.go:75). Its watch cache
  moves on only when etcd reports progress: by itself every 10 minutes (etcd's
  --experimental-watch-progress-notify-interval; the cacher asks for it, cacher/lister_watcher.go:87), or on
  request for a consistent read, which needs etcd 3.4.31 or 3.5.13 (storage/feature/
  feature_support_checker.go:36-38). Opening the watch again proves the connection: a server that is gone
  fails that request, which is logged as a failure below. (client-go's reflector, on HTTP/2 with pings,
  waits for the server's timeout and logs its end at V(4), tools/cache/reflector.go:979.)
- **410 Gone** (an in-stream `ERROR` event or a 410 response, a list's expired `continue` token included):
  our resourceVersion is older than the server keeps, so events were lost: relist at once.
- **404 Not Found, for a kind the API may not serve** (a CRD's: PodGroups, `sources/kube/podgroups.py`; an
  informer given `absent`): the CRD is not installed. Not a failure: `absent()` tells the cache so, the informer
  counts as synced (the cache holds what the API has: no such objects), and it lists again every
  `WatchOptions.unserved_relist` seconds (30 by default, jittered down to half), so a CRD installed later is read
  within that. A 404 costs the API server no storage read. A CRD removed while watched ends the watch; the watch
  opened again answers 404, and so does the list after it.
- **Any other failure** (connection, 5xx, 429): logged as a warning and retried after a capped exponential
  backoff with jitter; a watch failure keeps the resourceVersion, a list failure starts the list again.

The informer never decides anything: it calls `apply(object, deleted)` per event, `replace(objects)` per full
list (the cache's methods) and `absent()` per 404 where it may, and counts what it did. It does not import the
cache.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import orjson

from extender.core.objects import Raw, resource_version
from extender.core.pods import PodRecord, pod_record
from extender.core.protocols import DeviceProtocol
from extender.sources.kube.client import Gone, KubeClient, KubeError, NotFound, WatchStalled, api_error

log = logging.getLogger(__name__)

Slim = TypeVar("Slim")

NOT_TERMINATED = "status.phase!=Succeeded,status.phase!=Failed"
"""Pods that hold no device any more are of no interest; the server tells us (DELETED) when one finishes."""


def slim_node(node: Raw) -> Raw:
    """The parts of a Node the cache reads: name, labels (the GPU model's), annotations, capacity/allocatable,
    conditions."""
    meta = node.get("metadata") or {}
    status = node.get("status") or {}
    return {
        "metadata": {
            "name": meta.get("name"),
            "labels": meta.get("labels") or {},
            "annotations": meta.get("annotations") or {},
        },
        "status": {
            "capacity": status.get("capacity") or {},
            "allocatable": status.get("allocatable") or {},
            "conditions": [
                condition
                for condition in status.get("conditions") or ()
                if isinstance(condition, dict) and condition.get("type") == "Ready"
            ],
        },
    }


@dataclass(frozen=True, slots=True)
class Kind(Generic[Slim]):
    """What to list and watch, and what one object is reduced to as soon as it is decoded."""

    name: str
    path: str
    slim: Callable[[Raw], Slim]
    field_selector: str = ""


NODES: Kind[Raw] = Kind("nodes", "/api/v1/nodes", slim_node)


def pods_kind(protocol: DeviceProtocol) -> Kind[PodRecord]:
    """Pods become `PodRecord`s as soon as a page is decoded: the cache keeps nothing else of a pod, and a
    list of 100,000 pods never sits in memory as dicts (measured in `bench/cache_build.py`)."""
    return Kind("pods", "/api/v1/pods", functools.partial(pod_record, protocol=protocol), NOT_TERMINATED)


@dataclass(slots=True)
class Backoff:
    """Capped exponential backoff with jitter: the n-th wait is uniform in [c/2, c], c = min(cap, base * 2**n),
    so replicas that failed together do not retry together."""

    base: float = 0.5
    cap: float = 30.0
    rng: random.Random = field(default_factory=random.Random)
    failures: int = 0

    def next(self) -> float:
        ceiling = min(self.cap, self.base * 2 ** min(self.failures, 30))
        self.failures += 1
        return self.rng.uniform(ceiling / 2, ceiling)

    def reset(self) -> None:
        self.failures = 0


@dataclass(frozen=True, slots=True)
class WatchOptions:
    page_size: int = 500
    """Objects per list page (`limit`)."""
    timeout: float = 300.0
    """A watch request lasts between this and twice this (`timeoutSeconds`), then is renewed."""
    inactivity: float = 120.0
    """A watch that sends no byte for this long is ended and opened again from where it was, quietly: the API
    sends nothing at all on a resource unchanged since the watch began (no bookmark either; see the module's
    docstring), and a new request shows whether the server is still there."""
    unserved_relist: float = 30.0
    """Seconds between lists of a kind the API does not serve (a CRD not installed: 404), each wait drawn between
    half this and this so replicas do not list in step: how soon a CRD installed later is read. A list answered
    404 is cheap for the API server (no storage is read)."""


class Relist(Exception):
    """Internal: start over with a full list."""


class Informer(Generic[Slim]):
    """List and watch one kind into the cache. Mutable: its resourceVersion and counters change as it runs."""

    def __init__(
        self,
        client: KubeClient,
        kind: Kind[Slim],
        apply: Callable[[Slim, bool], None],
        replace: Callable[[list[Slim]], None],
        options: WatchOptions = WatchOptions(),
        backoff: Backoff | None = None,
        rng: random.Random | None = None,
        absent: Callable[[], None] | None = None,
    ) -> None:
        self.client = client
        self.kind = kind
        self.apply = apply
        self.replace = replace
        self.absent = absent
        """Told when the API answers 404 for the kind (a CRD not installed); None: a 404 is a failure as any other."""
        self.served: bool | None = None
        """Whether the API serves the kind: None before its first answer, False while it answers 404 (`absent`)."""
        self.options = options
        self.backoff = backoff or Backoff()
        self.rng = rng or random.Random()
        self.resource_version = ""
        self.lists = 0
        """Full lists applied so far; the first one makes the informer synced."""
        self.events = 0
        self.failures = 0
        self.synced = asyncio.Event()
        self.last_error = ""
        self.current = False
        """True while the cache follows the API: the last list or watch worked. False from a failure until the
        next success; the ledger does not expire bound reservations meanwhile (the watch may just be late)."""
        self.lists_started = 0
        self.last_list_started = 0
        """Which list (by `lists_started`) the cache now reflects."""
        self.heard_at = 0.0
        """Unix time of the last list, event or bookmark from the API."""
        self.gap_began: float | None = None
        """`heard_at` when the latest failure began a gap (None before any): what happened after it reaches the
        cache late, in the events replayed or the relist that ends the gap."""
        self.resumed_at = 0.0
        """Unix time the latest gap ended (a list or a watch event came through again)."""
        self._in_gap = False
        self._relist_requested = False
        self._wake = asyncio.Event()

    def request_relist(self) -> int:
        """Ask for a fresh full list (a new leader does, to see everything its predecessor bound). Returns the
        number of the list that will answer it: done once `last_list_started` reaches it. A list already under
        way does not count: it may have read the API before the request."""
        self._relist_requested = True
        self._wake.set()
        return self.lists_started + 1

    @property
    def relists(self) -> int:
        """Lists after the first: each one a 410 or a requested resync."""
        return max(0, self.lists - 1)

    async def run(self) -> None:
        """List and watch until cancelled. Never returns otherwise; failures are logged and retried."""
        need_list = True
        while True:
            try:
                if need_list or self._relist_requested:
                    need_list = True  # until a list succeeds: a failed one must not drop a requested relist
                    self._relist_requested = False
                    await self._list()
                    need_list = False
                opened = time.monotonic()
                events = self.events
                await self._watch()
                self.current = True
                if self.events == events and time.monotonic() - opened < 1.0:
                    # Ended at once with nothing in it (a proxy closing streams, say): not a reason to spin.
                    await self._sleep(self.backoff.next())
                else:
                    self.backoff.reset()
            except Relist:
                need_list = True
            except WatchStalled as quiet:
                log.debug(
                    "%s: %s; watching again from resourceVersion %s", self.kind.name, quiet, self.resource_version
                )
            except Gone as error:
                log.info("%s: resourceVersion %s expired (%s): relisting", self.kind.name, self.resource_version, error)
                self._gap()
                need_list = True
            except KubeError as error:
                if isinstance(error, NotFound) and self.absent is not None:
                    need_list = True
                    await self._not_served(self.absent, error)
                    continue
                self.failures += 1
                self.current = False
                self._gap()
                self.last_error = str(error)
                delay = self.backoff.next()
                log.warning("%s: %s; retrying in %.1f s", self.kind.name, error, delay)
                await self._sleep(delay)

    async def _not_served(self, absent: Callable[[], None], error: NotFound) -> None:
        """The API does not serve the kind: the cache is told, the informer is synced (there is nothing to list),
        and the list is tried again after `WatchOptions.unserved_relist` (jittered)."""
        period = self.options.unserved_relist
        if self.served is not False:
            name = self.kind.name
            log.info(
                "%s: not served by the API (%s): taken as not installed; listed again every %g s", name, error, period
            )
        self.served = False
        absent()
        self.resource_version = ""
        self.current = True
        self._heard()
        self.synced.set()
        self.backoff.reset()
        await self._sleep(self.rng.uniform(period / 2, period))

    def _gap(self) -> None:
        if not self._in_gap:
            self._in_gap = True
            self.gap_began = self.heard_at

    def _heard(self) -> None:
        self.heard_at = time.time()
        if self._in_gap:
            self._in_gap = False
            self.resumed_at = self.heard_at

    def late_since(self, now: float, recovery: float) -> float | None:
        """When the cache may have stopped following the API, if it resumed less than `recovery` seconds before
        `now` (what it applies now may be what it missed since then); else None."""
        if self.gap_began is not None and (self._in_gap or now - self.resumed_at < recovery):
            return self.gap_began
        return None

    async def _sleep(self, delay: float) -> None:
        self._wake.clear()
        if self._relist_requested:
            return
        try:
            async with asyncio.timeout(delay):
                await self._wake.wait()
        except TimeoutError:
            pass

    async def _list(self) -> None:
        started = time.perf_counter()
        self.lists_started += 1
        number = self.lists_started
        objects: list[Slim] = []
        params = {"limit": str(self.options.page_size)}
        if self.kind.field_selector:
            params["fieldSelector"] = self.kind.field_selector
        slim = self.kind.slim
        while True:
            page = await self.client.get(self.kind.path, params)
            objects.extend(slim(item) for item in page.get("items") or ())
            meta = page.get("metadata") or {}
            del page
            # What each page leaves (records) lives as long as the cache: out of the collector's scans with
            # it, or every full collection rescans all of them. Measured on 100,000 pods: decoding the pages
            # took 10 s instead of 3.4 s without this, nearly all of it in the collector.
            gc.freeze()
            token = meta.get("continue")
            if not token:
                break
            params = {**params, "continue": str(token)}
        version = str(meta.get("resourceVersion") or "")
        self._heard()
        if self.served is False:
            log.info("%s: served by the API again", self.kind.name)
        self.served = True
        self.replace(objects)
        self.lists += 1
        self.last_list_started = number
        self.current = True
        self.resource_version = version
        self.synced.set()
        log.info(
            "%s: listed %d at resourceVersion %s in %.2f s",
            self.kind.name,
            len(objects),
            version,
            time.perf_counter() - started,
        )

    async def _watch(self) -> None:
        timeout = self.options.timeout * (1 + self.rng.random())
        params = {
            "resourceVersion": self.resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(int(timeout)),
        }
        if self.kind.field_selector:
            params["fieldSelector"] = self.kind.field_selector
        self._wake.clear()
        if self._relist_requested:
            raise Relist
        watching = asyncio.ensure_future(self._consume(params))
        woken = asyncio.ensure_future(self._wake.wait())
        try:
            await asyncio.wait((watching, woken), return_when=asyncio.FIRST_COMPLETED)
        finally:
            woken.cancel()
            if not watching.done():
                watching.cancel()
                await asyncio.gather(watching, return_exceptions=True)
        if watching.cancelled() and self._relist_requested:
            raise Relist
        watching.result()

    async def _consume(self, params: dict[str, str]) -> None:
        stream = self.client.watch(self.kind.path, params, inactivity=self.options.inactivity)
        try:
            async for event in stream:
                self._handle(event)
        finally:
            await stream.aclose()

    def _handle(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        obj = event.get("object") or {}
        if kind == "ERROR":
            raise api_error(int(obj.get("code") or 500), orjson.dumps(obj), "WATCH", self.kind.path)
        version = resource_version(obj)
        self._heard()
        if kind in ("ADDED", "MODIFIED", "DELETED"):
            self.apply(self.kind.slim(obj), kind == "DELETED")
            self.events += 1
        elif kind != "BOOKMARK":
            log.warning("%s: unknown watch event type %r ignored", self.kind.name, kind)
            return
        if version:
            self.resource_version = version
        self.current = True
        self.backoff.reset()
