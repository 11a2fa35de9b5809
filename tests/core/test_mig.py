"""MIG geometry and the choice of an instance (`core/mig.py`), from HAMi v2.10.0's own tests and rules.

HAMi paths at tag v2.10.0 (commit 4707fb02): `nv/` = pkg/device/nvidia/. Where a case is HAMi's own test, its
file and line are given and the expected value is the one HAMi's test asserts.
"""

from __future__ import annotations

import pytest

from extender.core import mig
from extender.core.mig import MigInstance, MigProfile

ONE = MigProfile("1g.5gb", 5120, 14, 1, tuple((start, 1) for start in range(7)))
TWO = MigProfile("2g.10gb", 10240, 28, 2, ((0, 2), (2, 2), (4, 2)))
THREE = MigProfile("3g.20gb", 20480, 42, 3, ((0, 4), (4, 4)))
A100 = (ONE, TWO, THREE)
"""`a100MigProfiles` (nv/mig_capability_test.go:27-33)."""


def test_overlap_is_hamis_half_open_interval_test() -> None:
    """`migPlacementsOverlap` (nv/mig_topology.go:82-84): touching placements do not overlap."""
    assert mig.overlaps(0, 2, [(1, 1)])
    assert not mig.overlaps(0, 2, [(2, 2)])
    assert mig.overlaps(4, 4, [(6, 1)])
    assert not mig.overlaps(3, 1, [(4, 4), (0, 2)])


def test_hamis_placement_order_tries_1g_and_3g_from_the_top() -> None:
    """`orderedMigPlacements` (nv/mig_topology.go:26-40): 1g.* and 3g.* highest start first, others lowest."""
    assert mig.hami_order(ONE)[:3] == ((6, 1), (5, 1), (4, 1))
    assert mig.hami_order(THREE) == ((4, 4), (0, 4))
    assert mig.hami_order(TWO) == ((0, 2), (2, 2), (4, 2))


def test_hamis_balanced_packing_sequence() -> None:
    """`TestSelectMigPlacementUsesBalancedPacking` (nv/mig_topology_test.go:46-68): 3g at 4, 2g at 0, then 1g at
    3 and at 2."""
    occupied: list[tuple[int, int]] = []
    for profile, start in ((THREE, 4), (TWO, 0), (ONE, 3), (ONE, 2)):
        placement = mig.hami_placement(profile, occupied)
        assert placement is not None and placement[0] == start
        occupied.append(placement)


def test_a_request_gets_the_smallest_profile_that_holds_it_recorded_as_the_profile() -> None:
    """`TestAddResourceUsageUsesReportedProfileAndPlacement` (nv/mig_capability_test.go:35-50): 10,000 MiB gets
    2g.10gb at (0, 2), and HAMi records 10,240 MiB and 28 % compute; ours chooses the same here."""
    for greedy in (True, False):
        profile, instance = mig.choose(A100, [], 10000, greedy=greedy)
        assert (profile.memory, profile.cores) == (10240, 28)
        assert instance == MigInstance("2g.10gb", 0, 2)


def test_three_2g_instances_leave_room_for_a_1g_and_nothing_larger() -> None:
    """`TestCustomFilterUsesReportedPlacementCapacity` (nv/mig_capability_test.go:52-69); and the 25 % request of
    `TestFitUsesEffectivePercentageMemoryForMigPlacement` (:91-113) is 10,240 MiB of 40,960: no fit."""
    occupied = [(0, 2), (2, 2), (4, 2)]
    assert mig.placeable(A100, occupied, 10000) is None
    assert mig.placeable(A100, occupied, 10240) is None
    assert mig.placeable(A100, occupied, 5000) == ONE
    assert mig.largest_placeable(A100, occupied) == 5120


def test_a_larger_profile_is_taken_when_the_smallest_has_no_placement_left() -> None:
    """`selectMigCandidate` (nv/device.go:621-639) goes on to the next profile by memory."""
    occupied = [(start, 1) for start in (0, 2, 4, 6)]  # every 2g placement cut, the 3g ones too
    assert mig.placeable(A100, occupied, 100) == ONE
    full = [(start, 1) for start in range(7)]
    assert mig.placeable(A100, full, 100) is None and mig.largest_placeable(A100, full) == 0


def test_our_placement_keeps_a_3g_placeable_where_hamis_first_fit_cuts_both() -> None:
    """A 2g, then a 1g, then a 3g on one A100: HAMi puts the 1g at slice 6 (its first free, top down), which cuts
    the 3g's upper placement while the 2g holds the lower one, so the 3g no longer fits (the waste HAMi's users
    report, issues #2830/#2831). Ours puts the 1g where every profile keeps the most placements (slice 3,
    HAMi's order breaking the tie with slice 2), and the 3g still fits."""
    hami: list[tuple[int, int]] = []
    ours: list[tuple[int, int]] = []
    for memory in (10000, 5000):
        _, taken = mig.choose(A100, hami, memory, greedy=True)
        hami.append((taken.start, taken.size))
        _, taken = mig.choose(A100, ours, memory)
        ours.append((taken.start, taken.size))
    assert hami == [(0, 2), (6, 1)] and ours == [(0, 2), (3, 1)]
    assert mig.placeable(A100, hami, 20000) is None
    assert mig.placeable(A100, ours, 20000) == THREE


def test_room_left_counts_free_placements_largest_profile_first() -> None:
    assert mig.room_left(A100, []) == (2, 3, 7)
    assert mig.room_left(A100, [(6, 1)]) == (1, 3, 6)


def test_choose_says_why_when_nothing_fits() -> None:
    with pytest.raises(ValueError, match="no MIG profile of at least 1 MiB has a placement free"):
        mig.choose(A100, [(0, 4), (4, 4)], 1)
