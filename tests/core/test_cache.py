"""The cache's accounting: observed pods and reservations are holds keyed by pod UID, summaries follow."""

from __future__ import annotations

from extender.core.cache import GONE_KEPT, Cache
from extender.core.holds import Allocation, Hold, HoldState
from extender.core.pods import pod_record
from tests.builders import (
    HAMI,
    PROFILE,
    FakeClock,
    bound_pod,
    make_cluster,
    make_hami_node,
    make_hami_pod,
    make_node,
    make_pod,
)


def test_a_bound_annotated_pod_holds_memory_on_its_device() -> None:
    cluster = make_cluster(make_node("n1", gpus=2, mem=16), pods=(bound_pod("a", "n1", (1,), 10),))
    state = cluster.nodes["n1"]
    assert state.used == [0, 10]
    assert state.free == [16, 6]
    assert (state.largest_free, state.largest_free_index) == (16, 0)
    assert state.free_desc == (16, 6)
    assert cluster.hold_of(next(iter(cluster.pods))).observed  # type: ignore[union-attr]


def test_largest_free_ties_name_the_lowest_index() -> None:
    cluster = make_cluster(make_node("n1", gpus=3, mem=16), pods=(bound_pod("a", "n1", (0,), 4),))
    assert (cluster.nodes["n1"].largest_free, cluster.nodes["n1"].largest_free_index) == (16, 1)


def test_deleting_a_pod_frees_its_memory() -> None:
    pod = bound_pod("a", "n1", (0,), 10)
    cluster = make_cluster(make_node("n1"), pods=(pod,))
    cluster.apply_pod(pod, deleted=True)
    assert cluster.nodes["n1"].used == [0, 0]
    assert not cluster.pods


def test_a_read_that_crossed_the_pods_deletion_does_not_bring_it_back() -> None:
    """A bind answered 409 or 5xx reads the pod back and hands it to the cache (`sources/kube/binder.py`); the API
    can answer that read just before the pod is deleted, and the watch's DELETED be handled before the reply is.
    The late read must not put the pod back: no event would ever remove its hold again."""
    pod = bound_pod("a", "n1", (0,), 10)
    cluster = make_cluster(make_node("n1"), pods=(pod,))
    cluster.apply_pod(pod, deleted=True)
    cluster.apply_pod(pod)  # the read-back, answered before the deletion, handled after it
    assert not cluster.pods and cluster.nodes["n1"].used == [0, 0]
    cluster.apply_pod(bound_pod("b", "n1", (0,), 10))
    assert cluster.nodes["n1"].used == [10, 0], "another pod (another UID) still counts"


def test_a_pod_found_gone_by_a_direct_read_stays_gone_when_a_late_event_shows_it() -> None:
    pod = bound_pod("a", "n1", (0,), 10)
    cluster = make_cluster(make_node("n1"), pods=(pod,))
    cluster.forget_pod(pod["metadata"]["uid"])
    cluster.apply_pod(pod)  # a MODIFIED the watch sent before the deletion, read after the recheck
    assert not cluster.pods and cluster.nodes["n1"].used == [0, 0]


def test_pods_remembered_as_gone_are_bounded() -> None:
    cluster = make_cluster(make_node("n1"))
    first = bound_pod("p0", "n1", (0,), 1)
    for number in range(GONE_KEPT + 1):
        cluster.apply_pod(first if number == 0 else bound_pod(f"p{number}", "n1", (0,), 1), deleted=True)
    assert len(cluster._gone) == GONE_KEPT
    cluster.apply_pod(first)  # forgotten as gone: the oldest goes first (a UID is never reused in a real cluster)
    assert first["metadata"]["uid"] in cluster.pods


def test_a_listing_that_lacks_a_pod_does_not_take_it_as_gone_for_good() -> None:
    """A relist may be older than a pod the cache got from a bind's read-back: the watch's later news of it counts."""
    pod = bound_pod("a", "n1", (0,), 10)
    cluster = make_cluster(make_node("n1"), pods=(pod,))
    cluster.replace_pods([])
    cluster.apply_pod(pod)
    assert cluster.nodes["n1"].used == [10, 0]


def test_a_finished_pod_frees_its_memory() -> None:
    pod = bound_pod("a", "n1", (0,), 10)
    cluster = make_cluster(make_node("n1"), pods=(pod,))
    cluster.apply_pod({**pod, "status": {"phase": "Succeeded"}})
    assert cluster.nodes["n1"].used == [0, 0]


def test_a_terminating_pod_still_holds_its_memory() -> None:
    pod = bound_pod("a", "n1", (0,), 10)
    pod["metadata"]["deletionTimestamp"] = "2026-11-21T00:00:00Z"
    cluster = make_cluster(make_node("n1"), pods=(pod,))
    assert cluster.nodes["n1"].used == [10, 0]


def test_observing_a_reserved_pod_replaces_the_reservation_without_double_counting() -> None:
    pod = bound_pod("a", "n1", (0,), 10)
    cluster = make_cluster(make_node("n1"))
    uid = pod["metadata"]["uid"]
    cluster.hold(Hold(Allocation.uniform(uid, "default/a", "n1", (0,), 10), HoldState.RESERVED, since=1.0))
    assert cluster.nodes["n1"].used == [10, 0]
    cluster.apply_pod(pod)
    assert cluster.nodes["n1"].used == [10, 0]
    assert uid not in cluster.reserved
    assert cluster.hold_of(uid).observed  # type: ignore[union-attr]


def test_an_annotated_but_unbound_pod_is_a_reservation_from_its_assume_time() -> None:
    pod = make_pod("a", gpu_mem=8, node="n1", indexes=(1,), bound=False, assume_time=1234.5)
    cluster = make_cluster(make_node("n1"), pods=(pod,))
    hold = cluster.reserved[pod["metadata"]["uid"]]
    assert (hold.observed, hold.since, hold.allocation.indexes) == (False, 1234.5, (1,))
    assert cluster.nodes["n1"].used == [0, 8]


def test_a_node_deleted_under_running_pods_keeps_their_holds_until_it_returns() -> None:
    node = make_node("n1")
    cluster = make_cluster(node, pods=(bound_pod("a", "n1", (0,), 10),))
    cluster.apply_node(node, deleted=True)
    assert not cluster.nodes["n1"].known
    assert cluster.nodes["n1"].devices == ()
    cluster.apply_node(node)
    assert cluster.nodes["n1"].used == [10, 0]


def test_a_deleted_node_without_pods_is_forgotten() -> None:
    node = make_node("n1")
    cluster = make_cluster(node)
    cluster.apply_node(node, deleted=True)
    assert "n1" not in cluster.nodes


def test_replace_drops_pods_and_nodes_absent_from_the_listing_but_keeps_reservations() -> None:
    gone = bound_pod("gone", "n1", (0,), 4)
    cluster = make_cluster(make_node("n1"), make_node("n2"), pods=(gone,))
    cluster.hold(Hold(Allocation.uniform("fresh", "default/fresh", "n1", (1,), 6), HoldState.RESERVED, since=1.0))
    cluster.replace([make_node("n1")], [])
    assert "n2" not in cluster.nodes
    assert cluster.nodes["n1"].used == [0, 6]
    assert not cluster.pods


def test_describe_builds_an_unknown_node_from_the_object_the_scheduler_sent() -> None:
    cluster = make_cluster()
    view = cluster.node_view(make_node("elsewhere", gpus=4, mem=24))
    assert [device.capacity for device in view.devices] == [24, 24, 24, 24]
    assert "elsewhere" not in cluster.nodes


def test_annotations_round_trip_through_a_pod_record() -> None:
    pod = bound_pod("multi", "n1", (0, 1), 20, gpus=2)
    record = pod_record(pod, PROFILE)
    assert record.allocation == Allocation.uniform(record.uid, "default/multi", "n1", (0, 1), 10)
    assert PROFILE.index_annotation not in pod["metadata"]["annotations"]  # the plugin cannot read lists


def test_an_unreadable_pod_request_is_recorded_as_a_problem_not_raised() -> None:
    record = pod_record(make_pod("bad", gpu_mem="-1"), PROFILE)
    assert record.demand is None
    assert "negative" in record.unreadable


def test_memory_on_a_vanished_device_index_is_stray_not_lost() -> None:
    cluster = make_cluster(make_node("n1", gpus=1), pods=(bound_pod("a", "n1", (3,), 4),))
    assert (cluster.nodes["n1"].used, cluster.nodes["n1"].stray) == ([0], 4)


def test_a_node_locked_by_hamis_plugin_takes_no_pod_until_the_lock_is_released_or_stale() -> None:
    """HAMi's device plugin holds hami.io/mutex.lock until it has allocated the pod (NOTES.md §5): the node's
    summary says it takes no pod meanwhile, and a lock older than the timeout stops counting."""
    clock = FakeClock()
    node = make_hami_node("gpu-1", **{"hami.io/mutex.lock": "2026-08-21T10:00:00Z,default,p"})
    cache = Cache(HAMI, lock_timeout=300.0, clock=clock)
    clock.now = 1_787_306_400.0 + 10
    cache.replace([node], [])
    state = cache.nodes["gpu-1"]
    assert state.lock is not None and state.fit_free == -1 and cache.expire_locks() == []
    clock.advance(300)
    assert cache.expire_locks() == ["gpu-1"] and state.lock is None and state.fit_free == 40960


def test_a_lock_whose_pod_was_deleted_holds_its_node_no_more() -> None:
    """A pod deleted after its bind locked the node but before kubelet admitted it is never allocated, so HAMi's
    plugin never releases its lock; HAMi's bind takes such a lock over at once (its pod no longer exists), and the
    filter, which refuses locked nodes, must not keep refusing the node for the lock's 5 minutes. A pod that only
    finished (a DELETED from the watch's selector, phase Failed) still exists, so its lock still holds."""
    clock = FakeClock()
    clock.now = 1_787_306_400.0 + 10
    locked = make_hami_node("gpu-1", **{"hami.io/mutex.lock": "2026-08-21T10:00:00Z,default,p"})
    cache = Cache(HAMI, lock_timeout=300.0, clock=clock)
    p, q = make_hami_pod("p", mem=1000), make_hami_pod("q", mem=1000)
    cache.replace([locked, make_hami_node("gpu-2", **{"hami.io/mutex.lock": "2026-08-21T10:00:00Z,default,q"})], [p, q])
    gpu1, gpu2 = cache.nodes["gpu-1"], cache.nodes["gpu-2"]
    assert gpu1.lock is not None and gpu2.lock is not None
    cache.apply_pod({**q, "status": {**q["status"], "phase": "Failed"}}, deleted=True)
    assert gpu2.lock is not None, "finished, not deleted: its lock stands until its plugin or the timeout"
    cache.apply_pod(p, deleted=True)
    assert gpu1.lock is None and gpu1.fit_free == 40960, "the node takes pods again"
    cache.apply_node(locked)
    assert gpu1.lock is None, "the same lock shown again by the node's next news still holds nothing"
    cache.apply_node(make_hami_node("gpu-1", **{"hami.io/mutex.lock": "2026-08-21T10:00:05Z,default,p"}))
    assert gpu1.lock is not None, "a new lock (a pod of the same name made again) holds the node"


def test_a_deletion_seen_first_by_a_recheck_still_frees_the_lock_when_the_watch_shows_it() -> None:
    """The recheck (a direct read) can find the pod gone before the watch's DELETED arrives; the pod is then
    remembered as gone, and the DELETED must still do what a DELETED does to the lock it held."""
    clock = FakeClock()
    clock.now = 1_787_306_400.0 + 10
    cache = Cache(HAMI, lock_timeout=300.0, clock=clock)
    p = make_hami_pod("p", mem=1000)
    cache.replace([make_hami_node("gpu-1", **{"hami.io/mutex.lock": "2026-08-21T10:00:00Z,default,p"})], [p])
    cache.forget_pod(p["metadata"]["uid"])
    assert cache.nodes["gpu-1"].lock is not None
    cache.apply_pod(p, deleted=True)
    assert cache.nodes["gpu-1"].lock is None
