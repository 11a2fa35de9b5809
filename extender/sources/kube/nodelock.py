"""A device plugin's node lock, taken before a binding and released when the binding fails (HAMi's protocol).

HAMi's device plugin, asked by kubelet to allocate GPUs to a container, finds the pod named by the node's lock
annotation (`hami.io/mutex.lock: <RFC3339>,<namespace>,<name>`) and releases the lock once the pod's GPUs are
allocated. So a bind to a HAMi node takes the lock first, as hami-scheduler does (`pkg/util/nodelock`,
NOTES.md §5): read the node; a lock held for another pod that still exists, and younger than `timeout`, is
waited for (`WAIT` seconds at most: the plugin releases it within about a second), then contention (the bind
is refused, saying so; the scheduler tries another node or again later: the filter already refuses nodes the
cache sees locked); a lock of this pod is kept; a stale one, or one whose pod is
gone, is taken over; the write is a merge patch that carries the node's resourceVersion, so of two writers
only one wins (a 409 reads the node again). If the binding then surely failed, the lock is released, but only
while it is still ours (`binder.py` says why not after a binding that may still land).

The cache is told of every lock taken or released here (`on_change`), so the next filter refuses the node
before the watch shows the annotation; with the node's resourceVersion the write made, so that a reply read
after the watch has shown a later state of the node (the lock removed by someone else meanwhile) does not bring
the lock back into the cache (`Cache.take_lock`). A release that finds the lock no longer ours tells the cache
what it read, for the same reason.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from urllib.parse import quote

from extender.core import objects
from extender.core.binding import BindError, may_still_write, reply_left
from extender.core.devices import NodeLock
from extender.core.protocols.hami import lock_value, read_lock
from extender.sources.kube.client import Conflict, KubeClient, KubeError, NotFound, pod_path

log = logging.getLogger(__name__)

ATTEMPTS = 5
"""Writes of the lock before giving up on a node that keeps changing (hami's DefaultStrategy: 5)."""
WAIT = 2.0
"""Seconds a bind waits for a lock held for another pod to be released before it is refused. The plugin
releases it at kubelet's admission, usually within a second; kube-scheduler filters the next pods before the
lock exists, so without a wait they pass a node, their binds fail, and each waits out the scheduler's error
backoff (1 s doubling to 10 s: measured in tests/e2e/test_hami.py). Two seconds leave room for the API calls
within kube-scheduler's 5 s httpTimeout."""
POLL = 0.1
"""Seconds between two reads of a locked node while waiting (hami-scheduler's PodGroup retry: 100 ms)."""
MARGIN = 0.5
"""Seconds of leadership kept in hand for writing the lock and the Binding after a wait."""


def node_path(name: str) -> str:
    return f"/api/v1/nodes/{quote(name, safe='')}"


class NodeLocker:
    """Takes and releases one node annotation as a lock, for one pod at a time. Stateless between calls."""

    def __init__(
        self,
        client: KubeClient,
        key: str,
        timeout: float,
        on_change: Callable[[str, NodeLock | None, str], None],
        clock: Callable[[], float] = time.time,
        wait: float = WAIT,
        time_left: Callable[[], float | None] = lambda: None,
    ) -> None:
        self.wait = wait
        self.time_left = time_left
        """Seconds this replica surely may still bind (its lease's renew deadline; None: no limit), read at every
        poll: a wait for the lock ends, refused, once less than `MARGIN` would be left after the next poll,
        rather than be cut off by the leadership guard as if the binding might have landed."""
        self.client = client
        self.key = key
        self.timeout = timeout
        """Seconds after which a lock counts as abandoned (HAMi's --node-lock-timeout, 5 minutes)."""
        self.on_change = on_change
        self.clock = clock

    async def acquire(self, node: str, namespace: str, name: str) -> None:
        """Hold the node's lock for the pod, or raise BindError saying who holds it (nothing is written then).
        A lock held for another pod is waited for, `WAIT` seconds at most."""
        holder = objects.key(namespace, name)
        loop = asyncio.get_running_loop()
        started, writes = loop.time(), 0
        while writes < ATTEMPTS:
            current = await self._read(node)
            lock = read_lock(objects.annotations_of(current).get(self.key))
            if lock is not None:
                if lock.pod == holder:
                    return
                if not await self._abandoned(lock):
                    if not self._may_wait(loop.time() - started):
                        raise self._contention(node, lock)
                    await asyncio.sleep(POLL)
                    continue
            may_still_write(f"locking node {node}")
            now = self.clock()
            writes += 1
            try:
                version = await self._write(node, current, lock_value(now, namespace, name))
            except KubeError as error:
                raise BindError(f"locking node {node} for its device plugin: {error}") from None
            if version is None:
                continue  # the node changed since we read it (another writer may have locked it): read again
            if lock is not None:
                log.info("took over the lock on node %s from pod %s (stale or gone)", node, lock.pod or "unknown")
            self.on_change(node, NodeLock(now, holder), version)
            return
        raise BindError(f"locking node {node} for its device plugin: the node kept changing; try again")

    def _may_wait(self, waited: float) -> bool:
        """Whether to wait one more poll: within `wait` in all (counted by the clock: the reads of the node take
        time too, seconds on a busy API server), with `MARGIN` of leadership left after it, and with time left
        to write before kube-scheduler stops waiting (`reply_left`). Asked at every poll: the lease is renewed
        meanwhile, so its time left is read, not fixed at the start."""
        left, reply = self.time_left(), reply_left()
        return (
            waited + POLL <= self.wait
            and (left is None or left - POLL >= MARGIN)
            and (reply is None or reply - POLL > 0)
        )

    async def release(self, node: str, namespace: str, name: str) -> None:
        """Release the lock if it is still this pod's (after a failed binding). Failures are logged: a lock left
        behind is taken over once it is stale."""
        holder = objects.key(namespace, name)
        for _ in range(ATTEMPTS):
            try:
                current = await self._read(node)
            except BindError as error:
                log.warning("releasing the lock on node %s: %s", node, error)
                return
            lock = read_lock(objects.annotations_of(current).get(self.key))
            if lock is None or (lock.pod and lock.pod != holder):
                # Not ours to release; the cache may still count the lock we took (told after the watch had
                # shown it removed): tell it what the API shows.
                self.on_change(node, lock, objects.resource_version(current))
                return
            try:
                version = await self._write(node, current, None)
            except KubeError as error:
                log.warning("releasing the lock on node %s: %s", node, error)
                return
            if version is None:
                continue
            self.on_change(node, None, version)
            return
        log.warning("releasing the lock on node %s: the node kept changing; left to its timeout", node)

    async def _write(self, node: str, current: dict[str, object], value: str | None) -> str | None:
        """Set the lock annotation to `value` (None: remove it) if the node is still as `current` read it, and
        return the node's resourceVersion after it ("" if the reply has none); None when it changed since (409
        Conflict). Other API failures are raised."""
        patch = {"metadata": {"annotations": {self.key: value}, "resourceVersion": objects.resource_version(current)}}
        try:
            written = await self.client.merge_patch(node_path(node), patch)
        except Conflict:
            return None
        return objects.resource_version(written) if isinstance(written, dict) else ""

    async def _read(self, node: str) -> dict[str, object]:
        try:
            current = await self.client.get(node_path(node))
        except NotFound:
            raise BindError(f"node {node} no longer exists") from None
        except KubeError as error:
            raise BindError(f"reading node {node} for its device plugin's lock: {error}") from None
        if not isinstance(current, dict):
            raise BindError(f"reading node {node}: the API answered no object")
        return current

    async def _abandoned(self, lock: NodeLock) -> bool:
        """Whether the lock may be taken over: older than the timeout, or its pod is gone."""
        if self.clock() - lock.since > self.timeout:
            return True
        if not lock.pod:
            return False
        namespace, _, name = lock.pod.partition("/")
        try:
            await self.client.get(pod_path(namespace, name))
        except NotFound:
            return True
        except KubeError:
            pass  # cannot tell: the lock stands
        return False

    def _contention(self, node: str, lock: NodeLock) -> BindError:
        holder = f" for pod {lock.pod}" if lock.pod else ""
        age = self.clock() - lock.since
        return BindError(
            f"node {node} is locked{holder} until HAMi's device plugin has allocated it ({age:.0f} s so far); "
            "try again soon",
            refused=True,
        )
