"""HAMi's node lock through the API (the double): taken before a binding, refused while another pod holds it,
taken over when stale or its pod is gone, released when the binding surely failed, and only while it is ours. The rules
are hami-scheduler's (pkg/util/nodelock/nodelock.go at v2.10.0, NOTES.md §5)."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest

from extender.core.binding import REPLY_MARGIN, BindContext, BindError, BindRequest, Guard, Outcome, RecentPods, bind
from extender.core.devices import NodeLock
from extender.core.ledger import Ledger
from extender.core.protocols.hami import LOCK
from extender.sources.kube.binder import KubeBinder
from extender.sources.kube.client import KubeClient
from extender.sources.kube.nodelock import NodeLocker
from tests.apidouble import ApiDouble
from tests.builders import FakeClock, make_hami_cluster, make_hami_node, make_hami_pod, placer_for

NOW = 1_787_306_400.0  # 2026-08-21T10:00:00Z
STAMP = "2026-08-21T10:00:00Z"


def locker(kube: KubeClient, changes: list[tuple[str, NodeLock | None]] | None = None) -> NodeLocker:
    record = changes.append if changes is not None else None
    return NodeLocker(  # waits 0.3 s for a lock held for another pod (2 s in production: nodelock.WAIT)
        kube,
        LOCK,
        300.0,
        on_change=lambda node, lock, version: record((node, lock)) if record else None,
        clock=lambda: NOW,
        wait=0.3,
    )


def lock_on(api: ApiDouble, node: str = "gpu-1") -> str | None:
    found = api.node(node)
    assert found is not None
    return (found["metadata"].get("annotations") or {}).get(LOCK)


async def test_a_free_node_is_locked_for_the_pod_in_hamis_format(api: ApiDouble, kube: KubeClient) -> None:
    api.add_node(make_hami_node())
    changes: list[tuple[str, NodeLock | None]] = []
    await locker(kube, changes).acquire("gpu-1", "default", "p")
    assert lock_on(api) == f"{STAMP},default,p"
    assert changes == [("gpu-1", NodeLock(NOW, "default/p"))], "the cache hears of it before the watch"


async def test_a_lock_held_for_another_existing_pod_is_contention(api: ApiDouble, kube: KubeClient) -> None:
    api.add_node(make_hami_node(**{LOCK: "2026-08-21T09:59:00Z,default,other"}))
    api.add_pod(make_hami_pod("other", mem=1000))
    with pytest.raises(BindError, match="locked for pod default/other until HAMi's device plugin has allocated it"):
        await locker(kube).acquire("gpu-1", "default", "p")
    assert lock_on(api) == "2026-08-21T09:59:00Z,default,other", "nothing written"


async def test_a_lock_released_while_the_bind_waits_is_taken(api: ApiDouble, kube: KubeClient) -> None:
    """kube-scheduler filters the next pod before the previous bind's lock exists: the bind waits for the device
    plugin to release the lock (about a second) instead of failing into the scheduler's error backoff."""
    api.add_node(make_hami_node(**{LOCK: "2026-08-21T09:59:59Z,default,other"}))
    api.add_pod(make_hami_pod("other", mem=1000))
    waiting = asyncio.create_task(locker(kube).acquire("gpu-1", "default", "p"))
    await asyncio.sleep(0.15)
    assert not waiting.done()
    release_as_the_plugin(api, "gpu-1")
    await waiting
    assert lock_on(api) == f"{STAMP},default,p"


@pytest.mark.parametrize(
    "held",
    [
        "2026-08-21T09:54:00Z,default,other",  # 6 minutes: past --node-lock-timeout (5 m)
        "2026-08-21T09:59:00Z,default,gone",  # its pod no longer exists
        "garbage",  # unreadable: abandoned (HAMi refuses every bind there until a person removes it)
    ],
)
async def test_a_stale_lock_or_one_whose_pod_is_gone_is_taken_over(api: ApiDouble, kube: KubeClient, held: str) -> None:
    api.add_node(make_hami_node(**{LOCK: held}))
    api.add_pod(make_hami_pod("other", mem=1000))
    await locker(kube).acquire("gpu-1", "default", "p")
    assert lock_on(api) == f"{STAMP},default,p"


async def test_the_pods_own_lock_is_kept(api: ApiDouble, kube: KubeClient) -> None:
    api.add_node(make_hami_node(**{LOCK: "2026-08-21T09:59:00Z,default,p"}))
    await locker(kube).acquire("gpu-1", "default", "p")
    assert lock_on(api) == "2026-08-21T09:59:00Z,default,p"


async def test_a_node_changed_between_read_and_write_is_read_again(api: ApiDouble, kube: KubeClient) -> None:
    """The write carries the resourceVersion read: a 409 means another writer came first (lock/:159-160)."""
    api.add_node(make_hami_node())
    api.fail("PATCH", "/api/v1/nodes/gpu-1", status=409)
    await locker(kube).acquire("gpu-1", "default", "p")
    assert lock_on(api) == f"{STAMP},default,p"


async def test_release_removes_only_a_lock_that_is_ours(api: ApiDouble, kube: KubeClient) -> None:
    api.add_node(make_hami_node(**{LOCK: "2026-08-21T09:59:00Z,default,other"}))
    await locker(kube).release("gpu-1", "default", "p")
    assert lock_on(api) == "2026-08-21T09:59:00Z,default,other"
    changes: list[tuple[str, NodeLock | None]] = []
    await locker(kube, changes).release("gpu-1", "default", "other")
    assert lock_on(api) is None and changes == [("gpu-1", None)]


async def test_the_cache_counts_the_lock_it_took_before_the_watch_shows_it(api: ApiDouble, kube: KubeClient) -> None:
    api.add_node(make_hami_node())
    cache = make_hami_cluster(*api.nodes(), clock=lambda: NOW)  # a lock stamped NOW is fresh
    await NodeLocker(kube, LOCK, 300.0, on_change=cache.take_lock, clock=lambda: NOW).acquire("gpu-1", "default", "p")
    assert cache.nodes["gpu-1"].lock == NodeLock(NOW, "default/p"), "the next filter refuses the node at once"
    cache.apply_node(copy.deepcopy(api.node("gpu-1") or {}))  # then the watch shows the write: the same lock
    assert cache.nodes["gpu-1"].lock == NodeLock(NOW, "default/p")


async def test_a_lock_removed_by_another_writer_before_the_reply_is_read_is_not_brought_back(
    api: ApiDouble, kube: KubeClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lock's write lands, someone else removes it (a person; in the e2e tier, a test's cleanup after the bind's
    pod was deleted), and the watch shows both before the extender reads the write's reply (a busy event loop). The
    reply must not bring the lock back into the cache: nothing would correct it until the lock's timeout, and every
    filter would refuse the node for five minutes (found by reading the code after an e2e run saw a node still
    locked 30 s after its pods and locks were gone, 2026-11-27). The release after the binding failed then finds
    no lock in the API, and the cache agrees."""
    api.add_node(make_hami_node())
    cache = make_hami_cluster(*api.nodes(), clock=lambda: NOW)  # a lock stamped NOW is fresh
    patch = kube.merge_patch

    async def raced(path: str, body: Any) -> Any:
        written = await patch(path, body)
        cache.apply_node(copy.deepcopy(written))  # the watch's MODIFIED for the write...
        release_as_the_plugin(api, "gpu-1")  # ...and for another writer's removal, both before the reply is read
        cache.apply_node(copy.deepcopy(api.node("gpu-1") or {}))
        return written

    monkeypatch.setattr(kube, "merge_patch", raced)
    node_locker = NodeLocker(kube, LOCK, 300.0, on_change=cache.take_lock, clock=lambda: NOW)
    await node_locker.acquire("gpu-1", "default", "p")
    assert lock_on(api) is None
    assert cache.nodes["gpu-1"].lock is None, "the reply of a write the watch has gone past changes nothing"
    await node_locker.release("gpu-1", "default", "p")  # the binding then failed: nothing of ours to remove
    assert lock_on(api) is None and cache.nodes["gpu-1"].lock is None


async def test_a_release_that_finds_the_lock_gone_tells_the_cache_before_the_watch(
    api: ApiDouble, kube: KubeClient
) -> None:
    """The lock was taken (the cache counts it), then removed by someone else while the watch lags: the release
    after a failed binding reads the node, finds nothing of ours, and the cache counts what it read."""
    api.add_node(make_hami_node())
    cache = make_hami_cluster(*api.nodes(), clock=lambda: NOW)  # a lock stamped NOW is fresh
    node_locker = NodeLocker(kube, LOCK, 300.0, on_change=cache.take_lock, clock=lambda: NOW)
    await node_locker.acquire("gpu-1", "default", "p")
    assert cache.nodes["gpu-1"].lock == NodeLock(NOW, "default/p")
    release_as_the_plugin(api, "gpu-1")  # the watch has not shown it yet
    await node_locker.release("gpu-1", "default", "p")
    assert lock_on(api) is None and cache.nodes["gpu-1"].lock is None


async def test_a_bind_takes_the_lock_then_binds_and_a_failed_binding_releases_it(
    api: ApiDouble, kube: KubeClient
) -> None:
    api.add_node(make_hami_node())
    pod = api.add_pod(make_hami_pod("p", mem=4000, cores=30))
    cache = make_hami_cluster(*api.nodes(), pods=tuple(api.pods()))
    binder = KubeBinder(kube, observe=cache.apply_pod, locker=locker(kube, []))
    context = BindContext(cache, Ledger(cache, 60, FakeClock()), placer_for(cache), binder, RecentPods())
    outcome = await bind(BindRequest("p", "default", pod["metadata"]["uid"], "gpu-1"), context)
    assert outcome.ok, outcome.error
    bound = api.pod("default", "p")
    assert bound is not None and bound["spec"]["nodeName"] == "gpu-1"
    annotations = bound["metadata"]["annotations"]
    assert annotations["hami.io/bind-phase"] == "allocating" and annotations["hami.io/vgpu-node"] == "gpu-1"
    assert annotations["hami.io/vgpu-devices-to-allocate"] == "GPU-gpu-1-0,NVIDIA,4000,30:;"
    assert lock_on(api) == f"{STAMP},default,p", "held until the device plugin has allocated the pod"

    release_as_the_plugin(api, "gpu-1")
    api.add_pod(make_hami_pod("q", mem=4000))
    api.fail("POST", "/api/v1/namespaces/default/pods/q/binding", status=403)
    cache.replace(api.nodes(), api.pods())
    q = api.pod("default", "q")
    assert q is not None
    failed = await bind(BindRequest("q", "default", q["metadata"]["uid"], "gpu-1"), context)
    assert not failed.ok and "refused the binding" in failed.error
    assert not lock_on(api), "released after the failed binding"


async def test_a_binding_that_may_still_land_keeps_the_lock(api: ApiDouble, kube: KubeClient) -> None:
    """The plugin finds the pod it allocates by the lock: released under a binding that then lands, the next pod's
    bind could lock the node first and the plugin allocate for the wrong pod (issue 19, in the e2e tier)."""
    api.add_node(make_hami_node())
    pod = api.add_pod(make_hami_pod("p", mem=4000))
    cache = make_hami_cluster(*api.nodes(), pods=tuple(api.pods()))
    binder = KubeBinder(kube, observe=cache.apply_pod, locker=locker(kube, []))
    context = BindContext(cache, Ledger(cache, 60, FakeClock()), placer_for(cache), binder, RecentPods())
    api.fail("POST", "/api/v1/namespaces/default/pods/p/binding", status=500)
    outcome = await bind(BindRequest("p", "default", pod["metadata"]["uid"], "gpu-1"), context)
    assert outcome.outcome is Outcome.UNCERTAIN, outcome.error
    assert lock_on(api) == f"{STAMP},default,p"
    retried = await bind(BindRequest("p", "default", pod["metadata"]["uid"], "gpu-1"), context)
    assert retried.ok, retried.error  # the pod's own next bind to the node takes its lock as its own
    assert lock_on(api) == f"{STAMP},default,p"


def release_as_the_plugin(api: ApiDouble, name: str) -> None:
    """What HAMi's device plugin does once it has allocated the pod (plug/util.go:392-405)."""
    node = api.node(name)
    assert node is not None
    node["metadata"]["annotations"].pop(LOCK, None)
    api.update_node(node)


def bind_context(api: ApiDouble, kube: KubeClient, reply_in: float) -> BindContext:
    """A bind as the verb makes it: kube-scheduler stops waiting for it `reply_in` seconds from now."""
    cache = make_hami_cluster(*api.nodes(), pods=tuple(api.pods()))
    binder = KubeBinder(kube, observe=cache.apply_pod, locker=locker(kube, []))
    guard = Guard(reply_by=asyncio.get_running_loop().time() + reply_in)
    return BindContext(cache, Ledger(cache, 60, FakeClock()), placer_for(cache), binder, RecentPods(), guard)


async def test_a_bind_writes_no_binding_kube_scheduler_would_no_longer_wait_for(
    api: ApiDouble, kube: KubeClient
) -> None:
    """kube-scheduler gives up on a bind after its httpTimeout, forgets the pod's room on the node and may place
    other pods in it: a Binding landing later puts more on the node than it has (seen in the churn replay, a bind
    queued behind the node's lock). Here the lock's write takes 0.4 s of the 0.3 s left to write in: the bind
    releases the lock it took and writes no binding; the reservation goes too."""
    api.add_node(make_hami_node())
    pod = api.add_pod(make_hami_pod("p", mem=4000))
    api.fail("PATCH", "/api/v1/nodes/gpu-1", mode="slow", delay=0.4)
    context = bind_context(api, kube, REPLY_MARGIN + 0.3)
    outcome = await bind(BindRequest("p", "default", pod["metadata"]["uid"], "gpu-1"), context)
    assert not outcome.ok and "kube-scheduler stops waiting for this bind" in outcome.error, outcome.error
    assert ("POST", "/api/v1/namespaces/default/pods/p/binding") not in api.requests
    assert not lock_on(api), "the lock it took, released"
    assert context.cache.hold_of(pod["metadata"]["uid"]) is None, "the reservation released"


async def test_a_bind_waits_for_a_held_lock_only_while_kube_scheduler_waits(api: ApiDouble, kube: KubeClient) -> None:
    """The lock is waited for (0.3 s here), but not past the time left to write: refused, nothing written."""
    api.add_node(make_hami_node(**{LOCK: "2026-08-21T09:59:59Z,default,other"}))
    api.add_pod(make_hami_pod("other", mem=1000))
    pod = api.add_pod(make_hami_pod("p", mem=4000))
    context = bind_context(api, kube, REPLY_MARGIN + 0.05)
    outcome = await bind(BindRequest("p", "default", pod["metadata"]["uid"], "gpu-1"), context)
    assert not outcome.ok and "locked for pod default/other" in outcome.error, outcome.error
    reads = [request for request in api.requests if request == ("GET", "/api/v1/nodes/gpu-1")]
    assert len(reads) == 1, "refused at the first read: not polled for the lock's 0.3 s"
    assert lock_on(api) == "2026-08-21T09:59:59Z,default,other"
    late = bind_context(api, kube, REPLY_MARGIN - 0.1)
    refused = await bind(BindRequest("p", "default", pod["metadata"]["uid"], "gpu-1"), late)
    assert not refused.ok and "kube-scheduler stops waiting" in refused.error, "not started at all"
