"""Binding through the API server, and Events on pods whose bind failed.

**One call, not two.** The allocation's annotations travel in the `Binding` object itself
(`metadata.annotations`): kube-apiserver copies a Binding's annotations onto the pod in the same update that
sets `spec.nodeName` (`BindingREST.setPodNodeAndMetadata`, since long before the oldest release we support).
So a pod is either bound *with* its annotations or not bound and not annotated: there is no window, as with
gpushare's "patch the annotations, then bind", where a crash leaves a pod annotated but unbound. (Pods that
another extender left in that state are still read back as reservations: `core/cache.py`.) The Binding carries
the pod's UID, so a pod deleted and recreated under the same name is never bound by mistake.

What a failure means:
- 409 Conflict: the pod is already bound (or being deleted, or recreated). We read the pod: bound to the same
  node is success (an earlier attempt of ours landed); anything else fails.
- 404: the pod is gone.
- A timeout, a dropped connection or a 5xx: the binding may have landed, or may still land (the API server
  can finish a request its client gave up on). We read the pod: bound to the node is success; otherwise the
  failure is `uncertain` and the reservation is kept until the watch or the TTL decides (a retry to the same
  node writes the same GPUs; to another node it waits for `ledger.UNCERTAIN_WINDOW`).

The device plugin's node lock (HAMi) is released after a failure only when the binding surely did not land.
After an uncertain one, or a binding cut off under way (the leadership guard, a shutdown), it is kept: the
plugin finds the pod it allocates by that lock, so a lock released under a binding that lands lets the next
pod's bind lock the node first, and the plugin allocate for the wrong pod (seen in the e2e tier: "kubelet on
e2e-hami-0 admitted default/burst-27 but the plugin found default/burst-19 by search"). A lock kept for a
binding that never landed is reused by the pod's own next bind to that node (where the ledger sends it back
while the binding may still land), and taken over once the pod is gone or the lock is stale (`nodelock.py`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING
from urllib.parse import quote

from extender.core import objects
from extender.core.binding import BindError, BindRequest, may_still_write
from extender.core.objects import Raw, rfc3339
from extender.sources.kube.client import ApiError, Conflict, KubeClient, KubeError, NotFound, ServerError, pod_path

if TYPE_CHECKING:
    from extender.sources.kube.nodelock import NodeLocker

log = logging.getLogger(__name__)

COMPONENT = "gpu-extender"


class KubeBinder:
    """Implements `binding.Binder` against the API server."""

    def __init__(
        self, client: KubeClient, observe: Callable[[Raw], None] | None = None, locker: NodeLocker | None = None
    ) -> None:
        self.client = client
        self.observe = observe
        """Given the pod as read back after a conflict, so the cache holds what the API holds at once (an
        earlier binding of ours may carry other GPUs than this attempt's). A read that the pod's deletion
        overtook is ignored there: the cache remembers pods the watch showed gone (`Cache._gone`)."""
        self.locker = locker
        """The device plugin's node lock (HAMi), taken before a binding that allocates GPUs and released when it
        fails; None where the plugin has none."""

    async def bind(self, pod: Raw, node: str, annotations: dict[str, str]) -> None:
        namespace, name = objects.namespace(pod), objects.name(pod)
        if self.locker is None or not annotations:
            await self._bind(namespace, name, objects.uid(pod), node, annotations)
            return
        await self.locker.acquire(node, namespace, name)
        try:
            await self._bind(namespace, name, objects.uid(pod), node, annotations)
        except BindError as error:
            if not error.uncertain:
                await self.locker.release(node, namespace, name)
            else:
                log.info("lock on %s kept for %s/%s: its binding may still land", node, namespace, name)
            raise

    async def _bind(self, namespace: str, name: str, uid: str, node: str, annotations: dict[str, str]) -> None:
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name, "namespace": namespace, "uid": uid, "annotations": annotations},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        may_still_write(f"binding {namespace}/{name} to {node}")  # after the node's lock, which may have waited
        try:
            await self.client.create(pod_path(namespace, name) + "/binding", binding)
        except NotFound:
            raise BindError(f"pod {namespace}/{name} no longer exists") from None
        except Conflict as error:
            await self._settle(namespace, name, uid, node, f"the API refused the binding: {error.message}")
        except ServerError as error:
            await self._settle(namespace, name, uid, node, f"the API failed: {error.message}", ambiguous=True)
        except ApiError as error:
            raise BindError(f"the API refused the binding: {error.message}") from None
        except KubeError as error:
            await self._settle(namespace, name, uid, node, str(error), ambiguous=True)

    async def _settle(
        self, namespace: str, name: str, uid: str, node: str, failure: str, ambiguous: bool = False
    ) -> None:
        """After a failed binding, read the pod: return if it is bound to `node` (the binding, or an earlier one
        of ours, landed), else raise BindError saying why."""
        try:
            current = await self.client.get(pod_path(namespace, name))
        except NotFound:
            raise BindError(f"pod {namespace}/{name} no longer exists") from None
        except KubeError as error:
            raise BindError(f"{failure}; reading the pod back failed too: {error}", uncertain=ambiguous) from None
        found = objects.uid(current)
        if found != uid:
            raise BindError(f"pod {namespace}/{name} was recreated (uid {found}, not {uid})")
        bound_to = (current.get("spec") or {}).get("nodeName") or ""
        if bound_to == node:
            log.info("binding %s/%s to %s: %s, but the pod is bound there: success", namespace, name, node, failure)
            if self.observe is not None:
                self.observe(current)
            return
        if bound_to:
            raise BindError(f"pod {namespace}/{name} is already bound to {bound_to}")
        # Not bound yet; after a timeout or a 5xx the API server may still be writing it.
        raise BindError(failure, uncertain=ambiguous)


class EventRecorder:
    """Posts a Warning Event on a pod whose bind failed, in the background: the bind's reply never waits for
    it, and a failure to record is logged, never raised. `close()` waits for the ones under way."""

    def __init__(self, client: KubeClient, instance: str, limit: int = 64) -> None:
        self.client = client
        self.instance = instance
        self.limit = limit
        """At most this many Events under way; more are dropped (and logged) rather than queued without end."""
        self._pending: set[asyncio.Task[None]] = set()
        self.recorded = 0

    def failed_bind(self, request: BindRequest, message: str) -> None:
        if len(self._pending) >= self.limit:
            log.warning("event for %s dropped: %d events already under way", request.key, len(self._pending))
            return
        task = asyncio.ensure_future(self._post(request, message))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _post(self, request: BindRequest, message: str) -> None:
        now = rfc3339(time.time())
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{request.name}.", "namespace": request.namespace},
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": request.name,
                "namespace": request.namespace,
                "uid": request.uid,
            },
            "reason": "FailedBinding",
            "message": f"binding to {request.node} failed: {message}"[:1024],
            "type": "Warning",
            "source": {"component": COMPONENT},
            "reportingComponent": COMPONENT,
            "reportingInstance": self.instance,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            await self.client.create(f"/api/v1/namespaces/{quote(request.namespace, safe='')}/events", event)
            self.recorded += 1
        except KubeError as error:
            log.warning("recording the failed bind of %s as an Event failed: %s", request.key, error)

    async def close(self) -> None:
        if self._pending:
            await asyncio.wait(self._pending, timeout=5.0)
        for task in self._pending:
            task.cancel()
