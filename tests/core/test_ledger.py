"""Reservations: atomic check-and-record, release on failure, expiry after the TTL; never over capacity."""

from __future__ import annotations

from extender.core.holds import Allocation
from tests.builders import FakeClock, bound_pod, make_cluster, make_ledger, make_node


def allocation(uid: str, node: str = "n1", indexes: tuple[int, ...] = (0,), each: int = 10) -> Allocation:
    return Allocation.uniform(uid, f"default/{uid}", node, indexes, each)


def test_a_reservation_takes_memory_at_once() -> None:
    cluster = make_cluster(make_node("n1"))
    ledger = make_ledger(cluster)
    assert ledger.reserve(allocation("a")) is None
    assert cluster.nodes["n1"].used == [10, 0]
    assert not cluster.overcommitted()


def test_a_second_reservation_that_would_overcommit_is_refused() -> None:
    cluster = make_cluster(make_node("n1", gpus=2, mem=16))
    ledger = make_ledger(cluster)
    assert ledger.reserve(allocation("a")) is None
    assert ledger.reserve(allocation("b")) == "GPU 0 on n1 has 6 free, needs 10"  # 16 - 10
    assert cluster.nodes["n1"].used == [10, 0]
    assert not cluster.overcommitted()


def test_reserving_again_for_the_same_pod_does_not_count_it_twice() -> None:
    cluster = make_cluster(make_node("n1", gpus=1, mem=16))
    ledger = make_ledger(cluster)
    assert ledger.reserve(allocation("a", each=10)) is None
    assert ledger.reserve(allocation("a", each=12)) is None  # 16 - 10 + 10 own >= 12
    assert cluster.nodes["n1"].used == [12]


def test_reservations_on_unknown_nodes_or_devices_are_refused() -> None:
    cluster = make_cluster(make_node("n1", gpus=1))
    ledger = make_ledger(cluster)
    assert "not in the extender's cache" in ledger.reserve(allocation("a", node="ghost"))
    assert ledger.reserve(allocation("b", indexes=(5,))) == "node n1 has no GPU 5"
    assert cluster.nodes["n1"].used == [0]


def test_release_undoes_a_reservation_but_never_an_observed_pod() -> None:
    pod = bound_pod("seen", "n1", (1,), 4)
    cluster = make_cluster(make_node("n1"), pods=(pod,))
    ledger = make_ledger(cluster)
    ledger.reserve(allocation("a"))
    assert ledger.release("a") is not None
    assert ledger.release(pod["metadata"]["uid"]) is None
    assert cluster.nodes["n1"].used == [0, 4]


def test_reservations_expire_after_the_ttl_and_only_then() -> None:
    clock = FakeClock()
    cluster = make_cluster(make_node("n1"))
    ledger = make_ledger(cluster, ttl=60, clock=clock)
    ledger.reserve(allocation("a"))
    clock.advance(59)
    assert ledger.expire() == []
    clock.advance(2)
    assert [hold.allocation.pod_uid for hold in ledger.expire()] == ["a"]
    assert cluster.nodes["n1"].used == [0, 0]


def test_a_reservation_whose_bind_is_running_does_not_expire() -> None:
    clock = FakeClock()
    cluster = make_cluster(make_node("n1"))
    ledger = make_ledger(cluster, ttl=1, clock=clock)
    ledger.reserve(allocation("a"))
    clock.advance(5)
    with ledger.in_flight("a", "n1"):
        assert ledger.expire() == []
    assert len(ledger.expire()) == 1


def test_a_bound_reservation_is_kept_while_the_watch_is_failing() -> None:
    clock = FakeClock()
    cluster = make_cluster(make_node("n1"))
    ledger = make_ledger(cluster, ttl=1, clock=clock)
    ledger.reserve(allocation("bound"))
    ledger.mark_bound("bound")
    ledger.reserve(allocation("unbound", indexes=(1,)))
    clock.advance(5)
    assert [hold.allocation.pod_uid for hold in ledger.expire(include_bound=False)] == ["unbound"]
    assert [hold.allocation.pod_uid for hold in ledger.expire(include_bound=True)] == ["bound"]


def test_an_uncertain_reservation_is_kept_while_the_watch_is_failing() -> None:
    """A bind whose outcome is unknown may have landed: while the watch fails, nothing can say it did not, so its
    GPU is not given to another pod (which the watch, once back, would show beside it: 21 of 16 units)."""
    clock = FakeClock()
    cluster = make_cluster(make_node("n1", gpus=1, mem=16))
    ledger = make_ledger(cluster, ttl=1, clock=clock)
    ledger.reserve(allocation("maybe", each=5))
    ledger.mark_uncertain("maybe")
    clock.advance(5)
    assert ledger.expire(include_bound=False) == []
    assert ledger.reserve(allocation("filler", each=16)) is not None, "the uncertain pod's memory was given away"
    assert [hold.allocation.pod_uid for hold in ledger.expire(include_bound=True)] == ["maybe"]


def test_an_observed_pod_is_never_expired() -> None:
    clock = FakeClock()
    pod = bound_pod("seen", "n1", (0,), 4, assume_time=clock.now - 3600)
    cluster = make_cluster(make_node("n1"), pods=(pod,))
    assert make_ledger(cluster, ttl=60, clock=clock).expire() == []
    assert cluster.nodes["n1"].used == [4, 0]


def test_a_reservation_recovered_from_annotations_expires_from_its_assume_time() -> None:
    from tests.builders import make_pod

    clock = FakeClock()
    pod = make_pod("crashed", gpu_mem=8, node="n1", indexes=(0,), bound=False, assume_time=clock.now - 30)
    cluster = make_cluster(make_node("n1"), pods=(pod,))
    ledger = make_ledger(cluster, ttl=60, clock=clock)
    assert ledger.expire() == []
    clock.advance(31)
    assert len(ledger.expire()) == 1
    assert cluster.nodes["n1"].used == [0, 0]


def test_an_expired_reservation_does_not_come_back_when_its_pod_is_seen_again() -> None:
    from tests.builders import make_pod

    clock = FakeClock()
    pod = make_pod("crashed", gpu_mem=8, node="n1", indexes=(0,), bound=False, assume_time=clock.now - 120)
    cluster = make_cluster(make_node("n1"), pods=(pod,))
    make_ledger(cluster, ttl=60, clock=clock).expire()
    cluster.apply_pod(pod)  # a later MODIFIED event of the same, still unbound pod
    assert cluster.nodes["n1"].used == [0, 0]
    cluster.apply_pod({**pod, "spec": {**pod["spec"], "nodeName": "n1"}})  # bound after all: counted again
    assert cluster.nodes["n1"].used == [8, 0]
