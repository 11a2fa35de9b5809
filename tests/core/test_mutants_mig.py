"""MIG choices that `make mutation` found unguarded (`core/mig.py`): the edges of HAMi's rules that the A100-40GB
table of tests/core/test_mig.py never reaches (a request of exactly a profile's memory, a profile whose
placements NVML lists out of order, two profiles of equal slices, a profile with no placement left)."""

from __future__ import annotations

from extender.core import mig
from extender.core.mig import MigProfile
from tests.core.test_mig import A100, ONE, THREE, TWO


def test_a_request_of_exactly_a_profiles_memory_gets_that_profile() -> None:
    """`selectMigCandidate` (nv/device.go:602-624) takes a profile whose memory is at least the request."""
    assert mig.placeable(A100, [], 10240) == TWO
    assert mig.placeable(A100, [], 5120) == ONE


def test_hamis_order_sorts_by_start_whatever_order_the_placements_are_listed_in() -> None:
    """`orderedMigPlacements` (nv/mig_topology.go:26-40) sorts by start, so the order NVML lists them in does not
    count: lowest first for 2g, highest first for 1g."""
    shuffled_two = MigProfile("2g.10gb", 10240, 28, 2, ((4, 2), (0, 2), (2, 2)))
    assert mig.hami_order(shuffled_two) == ((0, 2), (2, 2), (4, 2))
    shuffled_one = MigProfile("1g.5gb", 5120, 14, 1, ((3, 1), (6, 1), (0, 1)))
    assert mig.hami_order(shuffled_one) == ((6, 1), (3, 1), (0, 1))


def test_no_placement_is_chosen_for_a_profile_with_none_free() -> None:
    """Both the first fit and ours answer None, not a placement, when every placement is cut."""
    occupied = [(0, 4), (4, 4)]
    assert mig.hami_placement(TWO, occupied) is None
    assert mig.least_cut(A100, TWO, occupied) is None
    assert mig.hami_placement(THREE, [(0, 2)]) == (4, 4)


def test_room_left_orders_profiles_of_equal_slices_by_memory_largest_first() -> None:
    """Of two profiles of two slices, the one with more memory is counted first, so keeping it placeable weighs
    more than keeping the other's placements."""
    larger = MigProfile("2g.20gb", 20480, 28, 2, ((0, 2),))
    smaller = MigProfile("2g.10gb", 10240, 28, 2, ((2, 2), (4, 2)))
    assert mig.room_left((smaller, larger), []) == (1, 2)
    # A 1g at slice 0 cuts the 2g.20gb's only placement and keeps both of the 2g.10gb's; at slice 2 it keeps the
    # 2g.20gb's and cuts one of the 2g.10gb's: ours takes slice 2.
    one = MigProfile("1g.5gb", 5120, 14, 1, ((0, 1), (2, 1)))
    assert mig.least_cut((one, smaller, larger), one, []) == (2, 1)
