"""The ledger's rules that `make mutation` found unguarded (`core/ledger.py`): HAMi's compute and slots at their
bounds, the pod's own hold given back on every axis, MIG instances within one allocation, the exact refusals,
the uncertain window, and the expiry's edges."""

from __future__ import annotations

from extender.core.holds import Allocation, Grant, HoldState
from extender.core.ledger import ASSUMED_TTL, UNCERTAIN_WINDOW
from extender.core.mig import MigInstance
from tests.builders import (
    FakeClock,
    make_cluster,
    make_hami_cluster,
    make_hami_node,
    make_ledger,
    make_mig_node,
    make_node,
    running_hami_pod,
)


def hami(uid: str, memory: int = 1000, cores: int = 0, node: str = "gpu-1") -> Allocation:
    return Allocation(uid, f"default/{uid}", node, ((Grant(0, memory, cores),),))


def mig(uid: str, *starts: int, node: str = "mig-1") -> Allocation:
    """One container per start, each a 1g.5gb instance on GPU 0 (A100-40GB)."""
    containers = tuple((Grant(0, 5120, 14, instance=MigInstance("1g.5gb", start, 1)),) for start in starts)
    return Allocation(uid, f"default/{uid}", node, containers)


def gpushare(uid: str, each: int = 10) -> Allocation:
    return Allocation.uniform(uid, f"default/{uid}", "n1", (0,), each)


def test_compute_fits_to_the_last_percent_and_not_one_past() -> None:
    cluster = make_hami_cluster(make_hami_node(gpus=1), pods=(running_hami_pod("busy", "gpu-1", 0, 1000, 60),))
    ledger = make_ledger(cluster)
    assert ledger.reserve(hami("over", cores=41)) == "GPU 0 on gpu-1 has 40 % compute free, needs 41"
    assert ledger.reserve(hami("exact", cores=40)) is None
    assert ledger.reserve(hami("none-left", cores=1)) == "GPU 0 on gpu-1 has 0 % compute free, needs 1"


def test_the_pods_own_compute_and_slot_are_given_back_when_it_reserves_again() -> None:
    cluster = make_hami_cluster(make_hami_node(gpus=1, split=1))
    ledger = make_ledger(cluster)
    assert ledger.reserve(hami("a", cores=60)) is None
    assert ledger.reserve(hami("a", cores=70)) is None  # 100 - 60 + 60 own >= 70; its one slot is its own
    assert cluster.nodes["gpu-1"].used_cores == [70]


def test_a_gpu_running_its_most_pods_refuses_another() -> None:
    cluster = make_hami_cluster(make_hami_node(gpus=1, split=1), pods=(running_hami_pod("busy", "gpu-1", 0, 10, 0),))
    assert make_ledger(cluster).reserve(hami("b")) == "GPU 0 on gpu-1 runs its most pods (1)"


def test_a_full_gpu_says_it_has_nothing_free() -> None:
    cluster = make_cluster(make_node("n1", gpus=1, mem=16))
    ledger = make_ledger(cluster)
    assert ledger.reserve(gpushare("a", 16)) is None
    assert ledger.reserve(gpushare("b", 1)) == "GPU 0 on n1 has 0 free, needs 1"


def test_a_mig_instance_on_a_gpu_in_another_mode_is_refused() -> None:
    cluster = make_hami_cluster(make_hami_node(gpus=1))
    refusal = make_ledger(cluster).reserve(mig("a", 6, node="gpu-1"))
    assert refusal == "GPU 0 on gpu-1: not in MIG mode, yet the allocation reserves a MIG instance there"


def test_a_mig_gpu_refuses_an_allocation_without_an_instance() -> None:
    cluster = make_hami_cluster(make_mig_node())
    refusal = make_ledger(cluster).reserve(hami("a", node="mig-1"))
    assert refusal == "GPU 0 on mig-1: in MIG mode, yet the allocation reserves no MIG instance there"


def test_two_containers_of_one_allocation_may_not_overlap_on_one_gpu() -> None:
    cluster = make_hami_cluster(make_mig_node())
    ledger = make_ledger(cluster)
    assert ledger.reserve(mig("apart", 5, 6)) is None
    assert ledger.reserve(mig("together", 3, 3)) == "GPU 0 on mig-1: MIG instance 1g.5gb at slice 3 overlaps one held"


def test_the_pods_own_mig_instance_is_given_back_when_it_reserves_again() -> None:
    cluster = make_hami_cluster(make_mig_node())
    ledger = make_ledger(cluster)
    assert ledger.reserve(mig("a", 6)) is None
    assert ledger.reserve(mig("a", 6)) is None
    assert ledger.reserve(mig("b", 6)) == "GPU 0 on mig-1: MIG instance 1g.5gb at slice 6 overlaps one held"
    assert cluster.nodes["mig-1"].occupied == [((6, 1),)]


def test_a_reservation_is_held_as_reserved() -> None:
    cluster = make_cluster(make_node("n1"))
    make_ledger(cluster).reserve(gpushare("a"))
    assert cluster.reserved["a"].state is HoldState.RESERVED


def test_a_pod_that_holds_anything_is_not_assumed_again() -> None:
    cluster = make_cluster(make_node("n1"))
    ledger = make_ledger(cluster)
    assert ledger.assume(gpushare("a", 4), build=1)
    assert not ledger.assume(gpushare("a", 4), build=1)
    assert ledger.reserve(gpushare("b", 4)) is None
    assert not ledger.assume(gpushare("b", 4), build=1)
    assert cluster.reserved["b"].state is HoldState.RESERVED


def test_only_an_assumption_is_taken_by_a_bind() -> None:
    """A hold that left ASSUMED (here marked uncertain) keeps the build it was chosen by, yet is no assumption."""
    cluster = make_cluster(make_node("n1"))
    ledger = make_ledger(cluster)
    assert ledger.assume(gpushare("a"), build=3)
    ledger.mark_uncertain("a")
    assert ledger.take_assumed("a", "n1", build=3) is None
    assert cluster.reserved["a"].state is HoldState.UNCERTAIN


def test_unassume_says_whether_there_was_an_assumption() -> None:
    cluster = make_cluster(make_node("n1"))
    ledger = make_ledger(cluster)
    assert ledger.assume(gpushare("a"), build=1)
    assert ledger.unassume("a")
    assert not ledger.unassume("a")
    assert "a" not in cluster.reserved


def test_an_uncertain_bind_may_land_within_the_window_and_not_at_its_end() -> None:
    clock = FakeClock()
    cluster = make_cluster(make_node("n1"))
    ledger = make_ledger(cluster, ttl=600, clock=clock)
    ledger.reserve(gpushare("a"))
    assert not ledger.still_uncertain("a")  # reserved, not uncertain
    assert not ledger.still_uncertain("ghost")
    clock.advance(30)
    ledger.mark_uncertain("a")
    assert cluster.reserved["a"].state_since == clock()
    clock.advance(UNCERTAIN_WINDOW - 1)
    assert ledger.still_uncertain("a")
    clock.advance(1)
    assert not ledger.still_uncertain("a")


def test_a_reservation_of_exactly_the_ttl_is_kept_and_a_bound_one_expires_by_default() -> None:
    clock = FakeClock()
    cluster = make_cluster(make_node("n1"))
    ledger = make_ledger(cluster, ttl=60, clock=clock)
    ledger.reserve(gpushare("a"))
    ledger.mark_bound("a")
    clock.advance(60)
    assert ledger.expire() == []
    clock.advance(0.5)
    assert [hold.allocation.pod_uid for hold in ledger.expire()] == ["a"]


def test_an_assumption_of_exactly_its_ttl_is_kept() -> None:
    clock = FakeClock()
    cluster = make_cluster(make_node("n1"))
    ledger = make_ledger(cluster, clock=clock)
    assert ledger.assume(gpushare("a"), build=1)
    clock.advance(ASSUMED_TTL)
    ledger.expire()
    assert cluster.reserved["a"].state is HoldState.ASSUMED
    clock.advance(0.5)
    ledger.expire()
    assert "a" not in cluster.reserved
