"""Leader election with a `coordination.k8s.io/v1` Lease: client-go's algorithm, so exactly one replica binds.

The rules, as `k8s.io/client-go/tools/leaderelection` has them:
- A candidate reads the Lease every `retry_period` (jittered). It may take it when the Lease is absent, has no
  holder, or its record has not changed for `lease_duration` *as measured on the candidate's own clock* (the
  time it last saw the record change, never the holder's timestamps: clocks of two machines disagree).
- Every write is an update with the resourceVersion read, so of two replicas racing for the Lease only one
  wins (the other gets 409 Conflict and tries again later).
- The leader renews every `retry_period`. If it has not renewed successfully for `renew_deadline`, or it finds
  another holder, it stops leading *at once*. `renew_deadline < lease_duration`, so the old leader stops
  before any standby may take over.
- The leader renews by writing over the Lease it last wrote, one request; only when that fails (someone else
  wrote it) does it read the Lease first (client-go's fast path, leaderelection.go:429-442 at v0.34.1).
- On a clean stop the leader gives the Lease up (holder cleared), so a standby takes over without waiting.

Where the renew deadline counts from: the moment *before* the successful attempt sent its write. A standby
counts `lease_duration` from when it sees the record change, which is after the write reached the API server,
so a leader that counts `renew_deadline` from before it sent stays inside the standby's count however long the
attempt took. (Counted from the answer, as client-go's observedTime is, an attempt whose answer took more than
`lease_duration - renew_deadline`, 5 s by default, would lead past the moment a standby may take over.)

`time_left()` is what binds are guarded by (`core/binding.Guard`): no write starts once it is 0, and one under
way is cut off then. Run the elector where nothing can delay its renewals: `leader_thread.py`.

Unlike client-go's users (kube-scheduler exits when it loses the lease), a replica that loses it goes back to
being a candidate: its cache stays warm. Leading is a flag others read (`leading`) and a callback; this module
never touches the cache.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

from extender.core.objects import rfc3339
from extender.settings import JITTER, LeaseTimings
from extender.sources.kube.client import Conflict, KubeClient, KubeError, NotFound

log = logging.getLogger(__name__)


def _record(spec: dict[str, Any]) -> tuple[Any, ...]:
    """What a candidate watches for change in a Lease (client-go's observedRecord)."""
    return (spec.get("holderIdentity"), spec.get("renewTime"), spec.get("leaseDurationSeconds"))


class LeaderElector:
    """Mutable: whether this replica leads, and what it last saw of the Lease."""

    def __init__(
        self,
        client: KubeClient,
        namespace: str,
        name: str,
        identity: str,
        timings: LeaseTimings,
        on_change: Callable[[bool], None] | None = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self.client = client
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.timings = timings
        self.on_change = on_change
        self.clock = clock
        self.monotonic = monotonic
        self.rng = rng or random.Random()
        self.leading = False
        self.holder = ""
        """The holder as last read ("" when none or unknown)."""
        self.term = 0
        """How many times this replica has taken the lease: a leadership seen elsewhere is known by its term."""
        self._observed: tuple[Any, ...] | None = None
        self._observed_at = 0.0
        self._renewed_at = 0.0
        """Monotonic time the last successful attempt began (see the module's docstring)."""
        self._lease: dict[str, Any] | None = None
        """The Lease as our last write returned it: what the next renewal writes over."""
        self.path = f"/apis/coordination.k8s.io/v1/namespaces/{quote(namespace, safe='')}/leases/{quote(name, safe='')}"

    def time_left(self) -> float:
        """Seconds this replica is sure to stay leader (until its renew deadline), 0 when not leading."""
        if not self.leading:
            return 0.0
        return max(0.0, self._renewed_at + self.timings.renew_deadline - self.monotonic())

    async def run(self) -> None:
        """Campaign, lead, and campaign again after losing, until cancelled; a cancelled leader releases."""
        try:
            while True:
                await self._acquire()
                await self._renew()
        finally:
            if self.leading:
                self._set_leading(False, stopping=True)
                await asyncio.shield(self._release())

    def _set_leading(self, leading: bool, stopping: bool = False) -> None:
        """Lead or not; logged at info, but as a warning when leadership is lost while this replica runs (what an
        operator should look into: the warning before it says why)."""
        if leading == self.leading:
            return
        self.leading = leading
        if leading:
            self.term += 1
            log.info("acquired leadership of lease %s/%s", self.namespace, self.name)
        else:
            self._lease = None
            if stopping:
                log.info("stopped leading lease %s/%s: stopping", self.namespace, self.name)
            else:
                log.warning("lost leadership of lease %s/%s", self.namespace, self.name)
        if self.on_change is not None:
            self.on_change(leading)

    async def _wait(self) -> None:
        await asyncio.sleep(self.timings.retry_period * (1 + self.rng.random() * JITTER))

    async def _acquire(self) -> None:
        while True:
            started = self.monotonic()
            if await self._try_acquire_or_renew():
                break
            await self._wait()
        self._renewed_at = started
        self._set_leading(True)

    async def _renew(self) -> None:
        """Renew every retry period; return (no longer leading) when renewal has failed for renew_deadline or
        another replica holds the lease."""
        while True:
            await asyncio.sleep(self.timings.retry_period)
            started = self.monotonic()
            # An attempt may not outlast the deadline (client-go cancels it there too): a slow API must not
            # keep us leading past the point where a standby may take the lease.
            try:
                async with asyncio.timeout(max(0.0, self.time_left())):
                    renewed = await self._try_acquire_or_renew()
            except TimeoutError:
                renewed = False
            if renewed:
                self._renewed_at = started
                continue
            if self.holder and self.holder != self.identity:
                log.warning("lease %s/%s is held by %s now", self.namespace, self.name, self.holder)
                break
            if self.monotonic() - self._renewed_at >= self.timings.renew_deadline:
                log.warning(
                    "could not renew lease %s/%s for %.1f s", self.namespace, self.name, self.timings.renew_deadline
                )
                break
        self._set_leading(False)

    async def _try_acquire_or_renew(self) -> bool:
        now = self.clock()
        if self.leading and self._lease is not None and await self._update(self._claimed(self._lease, now)):
            return True
        try:
            lease = await self.client.get(self.path)
        except NotFound:
            return await self._create(now)
        except KubeError as error:
            log.info("reading lease %s/%s: %s", self.namespace, self.name, error)
            return False
        spec = lease.get("spec") or {}
        record = _record(spec)
        if record != self._observed:
            self._observed, self._observed_at = record, self.monotonic()
        holder = str(spec.get("holderIdentity") or "")
        self.holder = holder
        duration = float(spec.get("leaseDurationSeconds") or self.timings.lease_duration)
        if holder and holder != self.identity and self.monotonic() < self._observed_at + duration:
            return False
        return await self._update(self._claimed(lease, now))

    def _claimed(self, lease: dict[str, Any], now: float) -> dict[str, Any]:
        """The Lease with this replica as its holder, renewed at `now` (acquired now, unless it held it already)."""
        spec = lease.get("spec") or {}
        if spec.get("holderIdentity") == self.identity:
            acquired = spec.get("acquireTime") or rfc3339(now, micro=True)
            transitions = int(spec.get("leaseTransitions") or 0)
        else:
            acquired, transitions = rfc3339(now, micro=True), int(spec.get("leaseTransitions") or 0) + 1
        spec = {
            **spec,
            "holderIdentity": self.identity,
            "leaseDurationSeconds": math.ceil(self.timings.lease_duration),
            "acquireTime": acquired,
            "renewTime": rfc3339(now, micro=True),
            "leaseTransitions": transitions,
        }
        return {**lease, "spec": spec}

    async def _update(self, lease: dict[str, Any]) -> bool:
        """Write the Lease (with the resourceVersion it was read at); False when it changed since, or failed."""
        try:
            updated = await self.client.replace(self.path, lease)
        except Conflict:
            log.info("lease %s/%s changed under us; trying again", self.namespace, self.name)
            return False
        except KubeError as error:
            log.info("updating lease %s/%s: %s", self.namespace, self.name, error)
            return False
        self._note(updated)
        return True

    async def _create(self, now: float) -> bool:
        lease = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": math.ceil(self.timings.lease_duration),
                "acquireTime": rfc3339(now, micro=True),
                "renewTime": rfc3339(now, micro=True),
                "leaseTransitions": 0,
            },
        }
        base = self.path.rsplit("/", 1)[0]
        try:
            created = await self.client.create(base, lease)
        except KubeError as error:  # Conflict: another replica created it first
            log.info("creating lease %s/%s: %s", self.namespace, self.name, error)
            return False
        self._note(created)
        return True

    def _note(self, lease: dict[str, Any]) -> None:
        spec = lease.get("spec") or {}
        self._observed = _record(spec)
        self._observed_at = self.monotonic()
        self.holder = self.identity
        self._lease = lease

    async def _release(self) -> None:
        """Give the lease up, so a standby need not wait for it to expire. Best effort, bounded in time."""
        try:
            async with asyncio.timeout(self.timings.retry_period * 2):
                lease = await self.client.get(self.path)
                spec = lease.get("spec") or {}
                if spec.get("holderIdentity") != self.identity:
                    return
                now = rfc3339(self.clock(), micro=True)
                lease["spec"] = {**spec, "holderIdentity": None, "leaseDurationSeconds": 1, "renewTime": now}
                await self.client.replace(self.path, lease)
                log.info("released lease %s/%s", self.namespace, self.name)
        except (KubeError, TimeoutError) as error:
            log.warning("releasing lease %s/%s: %s", self.namespace, self.name, error)
