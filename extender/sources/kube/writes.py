"""The writes a replica makes on its own pod: the leader label, and the request to kube-scheduler to retry.

Both are merge patches of this replica's pod (from `--pod-name`, in the lease's namespace), reconciled in
loops of their own so a failing API server never holds up a verb. The decision to ask for a retry is
`core/requeue.py`'s; this module only writes it down.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from extender.core.objects import rfc3339
from extender.core.requeue import PERIOD, REQUEUE_ANNOTATION
from extender.sources.kube.client import ConnectionFailed, KubeClient, KubeError, ServerError, Throttled, pod_path

log = logging.getLogger(__name__)

LABEL_PERIOD = 0.5
"""Seconds between checks of the leader label (a check that finds nothing to change costs no API call)."""

LABEL_REMOVAL_FLOOR = 1.0
"""Seconds a stopping replica gives, at least, to removing its label (else twice the lease's retry period): short
enough for a rolling update, long enough for one patch on a busy API server."""

LEADER_LABEL = "gpu-extender.io/leader"
"""On the leader's own pod (value "true"): what the Service selects, so kube-scheduler reaches the leader."""


class LeaderLabel:
    """Keeps `LEADER_LABEL` on this replica's pod equal to whether it may bind (leading, and relisted since).

    Why not readiness alone: if only the leader were Ready, a Deployment of two would never be fully available
    (rollouts would stall, a PodDisruptionBudget would forbid evicting the leader). With this label every
    replica whose cache is full is Ready (`/synced`), and the Service selects the label. Reconciled every
    `period` seconds and at once on a change of leadership; a failed patch is retried at the next round.
    """

    def __init__(self, client: KubeClient, namespace: str, pod: str, wanted: Callable[[], bool], period: float) -> None:
        self.client = client
        self.path = pod_path(namespace, pod)
        self.wanted = wanted
        self.period = period
        self.labelled: bool | None = None
        """What the pod carries as far as we know; None until the first patch (a restarted container may find
        the label of its previous life)."""
        self.wake = asyncio.Event()

    async def run(self) -> None:
        while True:
            await self.reconcile()
            self.wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.period):
                    await self.wake.wait()

    async def reconcile(self, wanted: bool | None = None) -> None:
        wanted = self.wanted() if wanted is None else wanted
        if wanted == self.labelled:
            return
        patch = {"metadata": {"labels": {LEADER_LABEL: "true" if wanted else None}}}
        self.labelled = None  # unknown while the patch is out: cancelled (stop), it may still have been applied
        try:
            await self.client.merge_patch(self.path, patch)
        except KubeError as error:
            log.warning("%s the leader label on %s: %s", "setting" if wanted else "removing", self.path, error)
            return
        self.labelled = wanted
        log.info("%s label %s on this replica's pod", "set" if wanted else "removed", LEADER_LABEL)


class Requeuer:
    """Writes `REQUEUE_ANNOTATION` (the time, RFC 3339 with microseconds) on this replica's pod when asked,
    at most once per `period` seconds: an update of an assigned pod, on which kube-scheduler retries every pod
    an extender rejected (`core/requeue.py`). A request during the pause is carried out at its end; a failed write
    is logged and retried at the next request."""

    def __init__(self, client: KubeClient, namespace: str, pod: str, period: float = PERIOD) -> None:
        self.client = client
        self.path = pod_path(namespace, pod)
        self.period = period
        self.reason = ""
        self.wake = asyncio.Event()
        self.written = 0

    def request(self, reason: str) -> None:
        self.reason = reason
        self.wake.set()

    async def run(self) -> None:
        while True:
            await self.wake.wait()
            self.wake.clear()
            stamp = rfc3339(time.time(), micro=True)
            patch = {"metadata": {"annotations": {REQUEUE_ANNOTATION: stamp}}}
            try:
                await self.client.merge_patch(self.path, patch)
            except KubeError as error:
                log.warning("asking kube-scheduler to retry rejected pods (annotating %s): %s", self.path, error)
                if isinstance(error, ServerError | Throttled | ConnectionFailed):
                    self.wake.set()  # passing: again after the pause (a missing pod or a refusal is for people)
            else:
                self.written += 1
                log.info("asked kube-scheduler to retry the pods it could not place: %s", self.reason)
            await asyncio.sleep(self.period)
